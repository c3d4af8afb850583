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

/// The store loop of one consumer warpgroup's tile through one bound
/// epilogue `epi` (NotBound when the Epilogue has no bind()): hands the
/// accumulators to store8, 8 consecutive columns per call, masked to the
/// problem.
template <class Cfg, class Params, class Bound>
__device__ __forceinline__ void store_tile_with(const Params& p, const TileInfo& info,
                                                const float (&acc)[Cfg::kMAtoms][Cfg::BN / 2], int consumer, int warp,
                                                int lane, const Bound& epi) {
  const int q = lane & 3;  // position in the lane quad that shares a row (see quad_transpose8)
#pragma unroll
  for (int a = 0; a < Cfg::kMAtoms; ++a) {
    const int row_base =
        info.row0 + (Cfg::kPingPong ? 0 : consumer * Cfg::kRowsPerConsumer) + a * 64 + warp * 16 + lane / 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row_base + 8 * h;
      if constexpr (HasLoadAhead<Bound>::value) {
        // Load-ahead (epilogue.cuh): the loads of kLoadAhead column blocks
        // are issued before their stores, so they overlap instead of each
        // waiting behind the previous store (possible aliasing).
        constexpr int kAhead = Bound::kLoadAhead;
        static_assert((Cfg::BN / 32) % kAhead == 0, "load-ahead batches must divide the column blocks");
#pragma unroll
        for (int g0 = 0; g0 < Cfg::BN / 32; g0 += kAhead) {
          typename Bound::Loaded ld[kAhead];
#pragma unroll
          for (int j = 0; j < kAhead; ++j) {
            const int col = info.col0 + 8 * (4 * (g0 + j) + q);
            if (row < p.M && col < p.N) ld[j] = epi.load(row, col);
          }
#pragma unroll
          for (int j = 0; j < kAhead; ++j) {
            float v[8];
            quad_transpose8(acc[a], g0 + j, h, lane, v);
            const int col = info.col0 + 8 * (4 * (g0 + j) + q);
            if (row < p.M && col < p.N) epi.store8(row, col, v, min(8, p.N - col), ld[j]);
          }
        }
      } else {
#pragma unroll
        for (int g = 0; g < Cfg::BN / 32; ++g) {
          float v[8];
          quad_transpose8(acc[a], g, h, lane, v);
          const int col = info.col0 + 8 * (4 * g + q);
          if (row < p.M && col < p.N) epi_store8(p.epilogue, epi, info, row, col, v, min(8, p.N - col));
        }
      }
    }
  }
}

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
    store_tile<Cfg>(p, tile_info<Cfg>(p, t, pos), acc, consumer, warp, lane);
    // iter & 1 == consumer: each consumer has its own notify barrier, and
    // its own notify-free barrier (its previous tile iter - 2 used both).
    if constexpr (Epilogue::kNotify) {
      if (NotifyHandshake::store_waits_free(iter))
        ptx::named_barrier_sync(kNotifyFreeBarrier + (iter & 1), Cfg::kStoreThreads + 32);
      ptx::named_barrier_arrive(kNotifyBarrier + (iter & 1), Cfg::kStoreThreads + 32);
    }
  }
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
