// tessera/kernels/gemm/kernel_ping_pong.cuh — the ping-pong schedule of the
// GEMM kernel (Cfg::kPingPong, GemmOptions::ping_pong): the two consumer
// warpgroups take alternate tiles of the CTA's walk, so one's epilogue runs
// while the other's wgmma main loop runs; named barriers order their main
// loops. Set-up, warp roles and the producer warpgroup: kernel_common.cuh.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "tessera/kernels/gemm/kernel_common.cuh"

namespace tessera::kernels::engine {

/// Epilogue of one consumer warpgroup: binds the tile once (epilogue.cuh) and
/// runs the store loop; an EitherBound gets one loop per alternative, chosen
/// per tile.
template <class Cfg, class Params>
__device__ __forceinline__ void store_tile(const Params& p, const TileInfo& info,
                                           const float (&acc)[Cfg::kMAtoms][Cfg::BN / 2], int consumer, int warp,
                                           int lane) {
  const auto epi = bind_tile(p.epilogue, info);
  if constexpr (IsEitherBound<std::remove_cv_t<decltype(epi)>>::value) {
    if (epi.use_b)
      store_tile_with<Cfg>(p, info, acc, consumer, warp, lane, epi.b);
    else
      store_tile_with<Cfg>(p, info, acc, consumer, warp, lane, epi.a);
  } else {
    store_tile_with<Cfg>(p, info, acc, consumer, warp, lane, epi);
  }
}

/// Consumer warpgroup `consumer` of the ping-pong kernel takes the CTA's
/// tiles iter = consumer, consumer + 2, ... The producer fills the ring in
/// schedule order, so tile iter occupies ring indices [iter * k_blocks,
/// (iter + 1) * k_blocks) and the consumer starts it at
/// PipelineState::at(iter * k_blocks).
///
/// Why the parity waits stay exact: a consumer starts tile iter only
/// after the other consumer passed every full-wait of tile iter - 1
/// (order barrier below), so every ring index below iter * k_blocks has
/// been filled; the refill of index i + kStages needs index i released,
/// which this consumer does only after waiting on i. Hence, when it waits
/// on index i, slot i % kStages has completed exactly i / kStages or
/// i / kStages + 1 phases, and the parity of i / kStages tells them apart.
///
/// Order barriers (bar.arrive by the 128 threads that finished issuing,
/// bar.sync by the 128 that start): kOrderBarrier + c releases consumer c.
/// Each barrier alternates strictly between one arrive set and one sync
/// set: consumer c syncs before tile iter (iter >= 1) and the other
/// consumer arrives after tile iter - 1 exactly when tile iter exists.
template <class Cfg, class InT, bool kTransB, class Params, class Cta>
__device__ __forceinline__ void run_ping_pong_consumer(const Params& p, const Cta& cta, int consumer) {
  using Epilogue = decltype(p.epilogue);
  const auto& walk = cta.walk;
  const int warp = (threadIdx.x % 128) / 32;
  const int lane = threadIdx.x % 32;
  float acc[Cfg::kMAtoms][Cfg::BN / 2];
  for (int pos = walk.first + consumer * walk.stride, iter = consumer; pos < walk.count;
       pos += 2 * walk.stride, iter += 2) {
    const TileCoord t = walk.at(p.scheduler, pos);
    auto pipe = PipelineState<Cfg::kStages>::at(static_cast<int64_t>(iter) * cta.k_blocks);
    if (iter > 0) ptx::named_barrier_sync(kOrderBarrier + consumer, 256);
    const bool next_exists = pos + walk.stride < walk.count;
    consume_tile<Cfg, InT, kTransB>(cta.sm, consumer, cta.k_blocks, acc, pipe, walk.rank, [&] {
      if (next_exists) ptx::named_barrier_arrive(kOrderBarrier + (consumer ^ 1), 256);
    });
    const TileInfo info = tile_info<Cfg>(p, t, pos);
    if constexpr (kStoresThroughSmem<Cfg, InT, Epilogue>) {
      if (p.epilogue.through_smem)
        store_tile_tma<Cfg>(p, info, acc, consumer, warp, lane, cta.sm.staging(consumer));
      else
        store_tile<Cfg>(p, info, acc, consumer, warp, lane);
    } else {
      store_tile<Cfg>(p, info, acc, consumer, warp, lane);
    }
    // iter & 1 == consumer: each consumer has its own notify barrier, and
    // its own notify-free barrier (its previous tile iter - 2 used both).
    if constexpr (Epilogue::kNotify) {
      if (NotifyHandshake::store_waits_free(iter))
        ptx::named_barrier_sync(kNotifyFreeBarrier + (iter & 1), Cfg::kStoreThreads + 32);
      ptx::named_barrier_arrive(kNotifyBarrier + (iter & 1), Cfg::kStoreThreads + 32);
    }
  }
  if constexpr (kStoresThroughSmem<Cfg, InT, Epilogue>) tma_store_drain();
}

/// The ping-pong kernel.
template <class Cfg, class InT, bool kTransB, class Prologue, class Epilogue, class Scheduler>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    gemm_kernel_ping_pong(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                          const __grid_constant__ KernelParams<Prologue, Epilogue, Scheduler> p) {
  static_assert(Cfg::kPingPong && Cfg::kConsumers == 2 && Cfg::kClusterM == 1, "the ping-pong schedule");
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  const auto cta = gemm_cta_setup<Cfg, InT, Prologue>(p);
  if (warpgroup_role(cta.warpgroup) == WarpGroupRole::kProducer) {
    run_producer_warpgroup<Cfg, InT, kTransB>(tma_a, tma_b, p, cta);
  } else {
    ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
    run_ping_pong_consumer<Cfg, InT, kTransB>(p, cta, consumer_of(cta.warpgroup));
  }
#endif
}

}  // namespace tessera::kernels::engine
