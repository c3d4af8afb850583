// tessera/kernels/gemm/kernel.cuh — the persistent warp-specialized GEMM
// kernel template that ties mainloop, Scheduler, Prologue and Epilogue.
//
// Block = 1 producer warpgroup + Cfg::kConsumers consumer warpgroups.
//  * producer (warpgroup 0): drops to kProducerRegs registers; one thread walks
//    the schedule, calls Prologue::wait (if active) before each tile and
//    streams the tile's K blocks into the smem ring with TMA.
//  * consumers: raise to kConsumerRegs registers; walk the same schedule,
//    multiply with wgmma, then hand each accumulator pair to the Epilogue and,
//    if it notifies, fence + barrier + tile_done (see epilogue.cuh).
// Producer and consumers never exchange tile indices: both evaluate the same
// Scheduler on the same positions (blockIdx.x + i * gridDim.x).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "tessera/kernels/gemm/epilogue.cuh"
#include "tessera/kernels/gemm/mainloop.cuh"
#include "tessera/kernels/gemm/prologue.cuh"
#include "tessera/kernels/gemm/scheduler.cuh"
#include "tessera/kernels/gemm/tile.cuh"

namespace tessera::kernels::engine {

template <class Prologue, class Epilogue, class Scheduler>
struct KernelParams {
  int M, N, K;
  int tiles_m, tiles_n;
  Prologue prologue;
  Epilogue epilogue;
  Scheduler scheduler;
};

template <class Cfg, class InT, bool kTransB, class Prologue, class Epilogue, class Scheduler>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    gemm_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                const __grid_constant__ KernelParams<Prologue, Epilogue, Scheduler> p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using L = SmemLayout<Cfg, InT>;
  extern __shared__ uint8_t smem_raw[];
  const L sm{reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023))};

  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      ptx::mbar_init(sm.full(s), 1);                      // the producer's arrive.expect_tx
      ptx::mbar_init(sm.empty(s), Cfg::kConsumers * 4);  // one arrive per consumer warp
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();

  const int num_tiles = p.tiles_m * p.tiles_n;
  const int k_blocks = (p.K + Cfg::BK - 1) / Cfg::BK;
  int stage = 0;
  uint32_t phase = 0;

  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x == 0) {
      ptx::tma_prefetch_desc(&tma_a);
      ptx::tma_prefetch_desc(&tma_b);
      for (int pos = blockIdx.x; pos < num_tiles; pos += gridDim.x) {
        const TileCoord t = p.scheduler.tile(pos, p.tiles_m, p.tiles_n);
        if constexpr (Prologue::kActive) {
          const TileInfo info{t.m, t.n, pos, t.m * Cfg::BM, t.n * Cfg::BN, Cfg::BM, Cfg::BN,
                              p.tiles_m, p.tiles_n, p.M, p.N};
          p.prologue.wait(info);
          ptx::fence_proxy_async_global();  // acquire (generic proxy) before TMA reads (async proxy)
        }
        produce_tile<Cfg, InT, kTransB>(sm, &tma_a, &tma_b, t.m * Cfg::BM, t.n * Cfg::BN, k_blocks, stage, phase);
      }
    }
  } else {
    ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
    const int consumer = warpgroup - 1;
    const int warp = (threadIdx.x % 128) / 32;
    const int lane = threadIdx.x % 32;
    float acc[Cfg::kMAtoms][Cfg::BN / 2];
    for (int pos = blockIdx.x; pos < num_tiles; pos += gridDim.x) {
      const TileCoord t = p.scheduler.tile(pos, p.tiles_m, p.tiles_n);
      consume_tile<Cfg, InT, kTransB>(sm, consumer, k_blocks, acc, stage, phase);

      const TileInfo info{t.m, t.n, pos, t.m * Cfg::BM, t.n * Cfg::BN, Cfg::BM, Cfg::BN,
                          p.tiles_m, p.tiles_n, p.M, p.N};
      // wgmma accumulator layout (m64nN, f32): register i of thread (warp w,
      // lane l) holds row 16w + l/4 + 8*((i/2)%2), column 8*(i/4) + 2*(l%4) + i%2.
#pragma unroll
      for (int a = 0; a < Cfg::kMAtoms; ++a) {
        const int row_base = info.row0 + consumer * Cfg::kRowsPerConsumer + a * 64 + warp * 16 + lane / 4;
#pragma unroll
        for (int j = 0; j < Cfg::BN / 8; ++j) {
          const int col = info.col0 + j * 8 + (lane % 4) * 2;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = row_base + 8 * h;
            if (row < p.M && col < p.N)
              p.epilogue.store_pair(info, row, col, acc[a][4 * j + 2 * h], acc[a][4 * j + 2 * h + 1], col + 1 < p.N);
          }
        }
      }
      if constexpr (Epilogue::kNotify) {
        if constexpr (Epilogue::kSysScope)
          ptx::fence_acq_rel_sys();
        else
          ptx::fence_acq_rel_gpu();
        ptx::named_barrier_sync(1, Cfg::kConsumers * 128);
        if (threadIdx.x == 128) p.epilogue.tile_done(info);
      }
    }
  }
#endif
}

}  // namespace tessera::kernels::engine
