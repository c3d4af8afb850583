// src/ops/fused_policies.cuh — the GEMM-engine policies of the fused TP
// operators (see tessera/kernels/gemm/{prologue,epilogue}.cuh for the
// concepts). Device code here is call-free (no printf): a call anywhere in
// the GEMM kernel serializes its wgmma.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "tessera/kernels/gemm/epilogue.cuh"
#include "tessera/kernels/gemm/prologue.cuh"
#include "tessera/link/memory_order.cuh"
#include "tessera/link/tile_map.hpp"
#include "tessera/runtime/symmetric_heap.hpp"

namespace tessera::ops::detail {

/// AG+GEMM prologue: before tile t's first A load, wait until every REMOTE
/// channel its rows [row0, min(row0 + bm, M)) touch has flag >= epoch.
/// Flags: flags[src * flag_stride + c] = the value rank src last stored for
/// its channel c (rank_notify or the SM pusher: release at .sys scope);
/// read with ld.acquire.sys. Own channels are not waited for: this rank's
/// shard is copied into the workspace on the GEMM's stream before launch.
struct AgPrologue {
  static constexpr bool kActive = true;
  link::AllGatherTileMap map;
  const std::uint64_t* flags = nullptr;
  int flag_stride = 0;
  int rank = 0;
  std::uint64_t epoch = 0;
  std::uint64_t timeout_ns = 0;
  kernels::engine::WaitDiag* diag = nullptr;

  __device__ __forceinline__ void wait(const kernels::engine::TileInfo& t) const {
    const std::int64_t lo = t.row0;
    const std::int64_t hi = t.row0 + t.bm < t.M ? t.row0 + t.bm : t.M;
    if (hi <= lo) return;
    const int c0 = map.channel_of_row(lo), c1 = map.channel_of_row(hi - 1);
    for (int ch = c0; ch <= c1; ++ch) {
      const int src = ch / map.C;
      if (src == rank) continue;
      const std::uint64_t* f = flags + static_cast<std::int64_t>(src) * flag_stride + (ch - src * map.C);
      std::uint64_t seen = link::mo::ld_acquire_sys(f);
      if (seen >= epoch) continue;
      const std::uint64_t start = link::mo::globaltimer_ns();
      while ((seen = link::mo::ld_acquire_sys(f)) < epoch) {
        if (link::mo::globaltimer_ns() - start > timeout_ns) {
          kernels::engine::record_timeout(diag, t, ch, epoch, seen, timeout_ns);
          __trap();
        }
        __nanosleep(64);
      }
    }
  }
};

/// GEMM+RS epilogue: every 8-wide row segment of the partial goes to the
/// receive slab of the row's owner o, block [rank] (rows local to o); a
/// finished tile adds 1 (red.release.sys, after the kernel's notifier
/// fence.acq_rel.sys over the tile's stores) to counters[o][tile_m] on every
/// owner its rows touch.
template <class OutT>
struct RsEpilogue {
  static constexpr bool kNotify = true;
  static constexpr bool kSysScope = true;
  using Conv = kernels::engine::OutConv<OutT>;
  OutT* recv[runtime::kMaxPeers];
  std::uint64_t* counters[runtime::kMaxPeers];
  std::int64_t per_rank = 0, ld = 0;
  int rank = 0;

  __device__ __forceinline__ void store8(const kernels::engine::TileInfo&, int row, int col, const float (&acc)[8],
                                         int valid) const {
    const int o = static_cast<int>(row / per_rank);
    OutT* p = recv[o] + (static_cast<std::int64_t>(rank) * per_rank + (row - o * per_rank)) * ld + col;
    if (valid == 8) {
      Conv::store8(p, acc);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (i < valid) p[i] = Conv::one(acc[i]);
    }
  }

  __device__ __forceinline__ void tile_done(const kernels::engine::TileInfo& t) const {
    const int last_row = (t.row0 + t.bm < t.M ? t.row0 + t.bm : t.M) - 1;
    const int o0 = static_cast<int>(t.row0 / per_rank), o1 = static_cast<int>(last_row / per_rank);
    for (int o = o0; o <= o1; ++o) link::mo::red_add_release_sys(counters[o] + t.m, 1);
  }
};

}  // namespace tessera::ops::detail
