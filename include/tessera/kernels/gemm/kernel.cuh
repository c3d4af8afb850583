// tessera/kernels/gemm/kernel.cuh — the persistent warp-specialized GEMM
// kernel: mainloop, Scheduler, Prologue and Epilogue tied together by one of
// three schedules, one kernel each, chosen by the tile configuration and the
// scheduler:
//   cooperative (kernel_cooperative.cuh, gemm_kernel_cooperative): both
//     consumer warpgroups on every tile (128x256, 256x128, 128x128, 128x192);
//   ping-pong (kernel_ping_pong.cuh, gemm_kernel_ping_pong; Cfg::kPingPong):
//     the consumers take alternate tiles, one's epilogue under the other's
//     main loop (64x256, 128x128, 64x64);
//   stream-K (kernel_stream_k.cuh, gemm_kernel_stream_k; a StreamKScheduler):
//     every CTA an equal share of the last waves' K blocks, each split tile
//     reduced by its last CTA (plain gemm() only).
// What they share (parameters, set-up, warp roles, the producer warpgroup):
// kernel_common.cuh.
#pragma once

#include "tessera/kernels/gemm/kernel_common.cuh"
#include "tessera/kernels/gemm/kernel_cooperative.cuh"
#include "tessera/kernels/gemm/kernel_ping_pong.cuh"
#include "tessera/kernels/gemm/kernel_stream_k.cuh"

namespace tessera::kernels::engine {

/// The kernel of configuration Cfg (its schedule's): what launch_config
/// launches and what callers query attributes of.
template <class Cfg, class InT, bool kTransB, class Prologue, class Epilogue, class Scheduler>
constexpr auto gemm_kernel() {
  if constexpr (IsStreamK<Scheduler>::value)
    return &gemm_kernel_stream_k<Cfg, InT, kTransB, Prologue, Epilogue, Scheduler>;
  else if constexpr (Cfg::kPingPong)
    return &gemm_kernel_ping_pong<Cfg, InT, kTransB, Prologue, Epilogue, Scheduler>;
  else
    return &gemm_kernel_cooperative<Cfg, InT, kTransB, Prologue, Epilogue, Scheduler>;
}

}  // namespace tessera::kernels::engine
