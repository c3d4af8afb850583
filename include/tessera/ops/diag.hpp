// tessera/ops/diag.hpp — the bits of OpOptions::diag_skip (tp_mlp.hpp), in a
// header without dependencies so the fused kernels' device code
// (tessera/ops/fused_policies.cuh) names the same constants the host checks.
#pragma once

namespace tessera::ops {

/// Bits of OpOptions::diag_skip (diagnostics of gemm_rs fused_ce's kernel).
enum DiagSkip : unsigned {
  kDiagSkipOwnerAdd = 1u << 0,  ///< own tiles: no peer-slab loads (no add)
  kDiagSkipBandWait = 1u << 1,  ///< own tiles: no band-flag acquire, no proxy fence
  kDiagSkipNotify = 1u << 2,    ///< remote tiles: no band-counter add (the notifier still fences)
};

}  // namespace tessera::ops
