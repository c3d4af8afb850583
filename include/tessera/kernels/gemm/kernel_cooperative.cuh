// tessera/kernels/gemm/kernel_cooperative.cuh — the cooperative schedule of
// the GEMM kernel (the default): both consumer warpgroups work on every tile,
// consumer c on its kRowsPerConsumer rows, and both store the tile together.
// Set-up, warp roles and the producer warpgroup: kernel_common.cuh.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "tessera/kernels/gemm/kernel_common.cuh"

namespace tessera::kernels::engine {

/// The cooperative kernel. The consumer loop is written out here, in the
/// kernel function itself: moved into a function of its own, the loop
/// compiles to different SASS (the SwiGLU epilogue's stores and the quad
/// transpose's selects are scheduled differently), and this path is kept as
/// measured.
template <class Cfg, class InT, bool kTransB, class Prologue, class Epilogue, class Scheduler>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    gemm_kernel_cooperative(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                            const __grid_constant__ KernelParams<Prologue, Epilogue, Scheduler> p) {
  static_assert(!Cfg::kPingPong, "the cooperative schedule");
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  const auto cta = gemm_cta_setup<Cfg, InT, Prologue>(p);
  PipelineState<Cfg::kStages> pipe;  // the consumer's ring position
  if (warpgroup_role(cta.warpgroup) == WarpGroupRole::kProducer) {
    run_producer_warpgroup<Cfg, InT, kTransB>(tma_a, tma_b, p, cta);
    return;
  }
  // Consumer warpgroup `consumer`: every tile of the CTA's walk, its rows
  // consumer * kRowsPerConsumer ..; the store threads of both consumers
  // arrive together on the tile's notify barrier.
  ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
  const int consumer = consumer_of(cta.warpgroup);
  const auto& walk = cta.walk;
  const int warp = (threadIdx.x % 128) / 32;
  const int lane = threadIdx.x % 32;
  float acc[Cfg::kMAtoms][Cfg::BN / 2];
  int iter = 0;
  for (int pos = walk.first; pos < walk.count; pos += walk.stride, ++iter) {
    const TileCoord t = walk.at(p.scheduler, pos);
    consume_tile<Cfg, InT, kTransB>(cta.sm, consumer, cta.k_blocks, acc, pipe, walk.rank);
    const TileInfo info = tile_info<Cfg>(p, t, pos);
    // Per-tile work once (epilogue.cuh), then the store loop. A tile of a
    // cluster tile past the problem's columns is not bound (its index would
    // be out of an epilogue's tables); one past its rows is masked, as before.
    const auto store_registers = [&] {
      if constexpr (Cfg::kClusterN > 1) {
        if (tile_exists<Cfg>(p, t))
          store_tile_with<Cfg, false>(p, info, acc, consumer, warp, lane, bind_tile(p.epilogue, info));
      } else {
        store_tile_with<Cfg, false>(p, info, acc, consumer, warp, lane, bind_tile(p.epilogue, info));
      }
    };
    if constexpr (kStoresThroughSmem<Cfg, InT, Epilogue>) {
      if (!p.epilogue.through_smem)
        store_registers();
      else if (tile_exists<Cfg>(p, t))
        store_tile_tma<Cfg>(p, info, acc, consumer, warp, lane, cta.sm.staging(consumer));
    } else {
      store_registers();
    }
    if constexpr (Epilogue::kNotify) {
      // Wait until the notifier consumed tile iter - 2's arrival on this
      // barrier (barriers.cuh: an early arrival would complete its phase).
      if (NotifyHandshake::store_waits_free(iter))
        ptx::named_barrier_sync(kNotifyFreeBarrier + (iter & 1), Cfg::kConsumers * 128 + 32);
      ptx::named_barrier_arrive(kNotifyBarrier + (iter & 1), Cfg::kConsumers * 128 + 32);
    }
  }
  if constexpr (kStoresThroughSmem<Cfg, InT, Epilogue>) tma_store_drain();
#endif
}

}  // namespace tessera::kernels::engine
