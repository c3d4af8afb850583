// tessera/kernels/gemm/kernel_stream_k.cuh — the stream-K schedule of the
// GEMM kernel (plain gemm() only): whole waves of tiles data-parallel, then
// every CTA an equal share of the last one to two waves' K blocks
// (StreamKScheduler, scheduler.cuh), so no SM idles in a last partial wave
// and a problem with fewer tiles than SMs still fills the GPU. Whole
// tiles are stored into D by the CTA that ran them; a tile split between
// CTAs is stored as f32 partial tiles into a workspace, and stream_k_fixup
// (launched after the kernel, as its programmatic dependent) sums each
// split tile's partials in CTA order into D: deterministic, no atomics, no
// flags between CTAs. Cooperative consumers (both warpgroups on every
// segment); no clusters, no prologue, no notify.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "tessera/kernels/gemm/kernel_common.cuh"

namespace tessera::kernels::engine {

/// Where a stream-K kernel's segments go: whole tiles into D (OutT, row
/// stride ldd), partial ones into ws, BM x BN f32 slots (row stride BN) at
/// ws + (2 * cta + slot) * BM * BN (slot: StreamKScheduler::slot_of). Only
/// the in-problem part of a slot is written, and read back by the fixup.
template <class OutT>
struct StreamKEpilogue {
  static constexpr bool kNotify = false;
  static constexpr bool kSysScope = false;
  OutT* d = nullptr;
  int64_t ldd = 0;
  float* ws = nullptr;

  struct Whole {
    OutT* d;
    int64_t ldd;
    __device__ __forceinline__ void store8(int row, int col, const float (&v)[8], int valid) const {
      store_first8(d + static_cast<int64_t>(row) * ldd + col, v, valid);
    }
  };
  struct Partial {
    float* slot;  ///< the slot's element (0, 0) is D's (row0, col0)
    int row0, col0, bn;
    __device__ __forceinline__ void store8(int row, int col, const float (&v)[8], int valid) const {
      store_first8(slot + static_cast<int64_t>(row - row0) * bn + (col - col0), v, valid);
    }
  };
  __device__ __forceinline__ Whole bind(const TileInfo&) const { return Whole{d, ldd}; }
  __device__ __forceinline__ Partial bind_partial(const TileInfo& t, int cta, int slot) const {
    return Partial{ws + (2 * static_cast<int64_t>(cta) + slot) * t.bm * t.bn, t.row0, t.col0, t.bn};
  }
};

template <class Cfg, class InT, bool kTransB, class Prologue, class Epilogue, class Scheduler>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    gemm_kernel_stream_k(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                         const __grid_constant__ KernelParams<Prologue, Epilogue, Scheduler> p) {
  static_assert(!Cfg::kPingPong && Cfg::kClusterM == 1, "stream-K: cooperative consumers, no clusters");
  static_assert(!Prologue::kActive && !Epilogue::kNotify, "stream-K: plain GEMM only (no hooks)");
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  const auto cta = gemm_cta_setup<Cfg, InT, Prologue>(p);
  const StreamKScheduler& s = p.scheduler;
  const int b = blockIdx.x;
  if (warpgroup_role(cta.warpgroup) == WarpGroupRole::kProducer) {
    ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (producer_warp_role(cta.warp_idx) == ProducerWarpRole::kTma && ptx::elect_one_sync()) {
      ptx::tma_prefetch_desc(&tma_a);
      ptx::tma_prefetch_desc(&tma_b);
      PipelineState<Cfg::kStages> pipe;
      StreamKWalk walk(s, b);
      StreamKSegment g;
      while (walk.next(g)) {
        const TileCoord t = s.inner.tile(g.tile, p.tiles_m, p.tiles_n);
        produce_tile<Cfg, InT, kTransB>(cta.sm, &tma_a, &tma_b, t.m * Cfg::BM, t.n * Cfg::BN, g.k0, g.k1 - g.k0, pipe,
                                        0);
      }
      ptx::grid_dependents_launch();  // the fixup's set-up may start (it waits for this grid)
    }
    return;
  }
  ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
  const int consumer = consumer_of(cta.warpgroup);
  const int warp = (threadIdx.x % 128) / 32;
  const int lane = threadIdx.x % 32;
  float acc[Cfg::kMAtoms][Cfg::BN / 2];
  PipelineState<Cfg::kStages> pipe;
  StreamKWalk walk(s, b);
  StreamKSegment g;
  while (walk.next(g)) {
    const TileCoord t = s.inner.tile(g.tile, p.tiles_m, p.tiles_n);
    consume_tile<Cfg, InT, kTransB>(cta.sm, consumer, g.k1 - g.k0, acc, pipe, 0);
    const TileInfo info = tile_info<Cfg>(p, t, g.tile);
    if (g.k0 == 0 && g.k1 == s.k_blocks)
      store_tile_with<Cfg>(p, info, acc, consumer, warp, lane, p.epilogue.bind(info));
    else
      store_tile_with<Cfg>(p, info, acc, consumer, warp, lane,
                           p.epilogue.bind_partial(info, b, s.slot_of(b, g.tile - s.dp_tiles)));
  }
#endif
}

/// D for the split tiles of a stream-K run: block (x, y) handles the split
/// tile whose first CTA boundary is CTA y + 1 (other blocks exit), one
/// 8-column group per thread (group x * 256 + threadIdx.x, and on by
/// gridDim.x * 256): the sum over the tile's CTAs, in CTA order, of their
/// partial slots, converted to OutT. The slots are loaded kLoads at a time,
/// so a tile split over many CTAs pays a few L2 round trips, not one per
/// CTA. Waits for the stream-K kernel (programmatic dependent launch).
template <class OutT, int BM, int BN>
__global__ void __launch_bounds__(256) stream_k_fixup(StreamKScheduler s, const float* __restrict__ ws, int tiles_m,
                                                      int tiles_n, int M, int N, OutT* __restrict__ d, int64_t ldd) {
  constexpr int kLoads = 4;
  ptx::grid_dependents_launch();
  const int boundary = blockIdx.y + 1;
  const int64_t at = s.begin(boundary);
  const int local = static_cast<int>(at / s.k_blocks);
  const int64_t first = static_cast<int64_t>(local) * s.k_blocks;
  if (at == first || s.unit_of(first) + 1 != boundary) return;  // not a split tile's first boundary
  const int lo = boundary - 1, hi = s.unit_of(first + s.k_blocks - 1);
  const TileCoord t = s.inner.tile(s.dp_tiles + local, tiles_m, tiles_n);
  const int row0 = t.m * BM, col0 = t.n * BN;
  const int rows = min(BM, M - row0), cols = min(BN, N - col0);
  const int groups = (cols + 7) / 8;
  ptx::grid_dependency_wait();
  for (int i = blockIdx.x * 256 + threadIdx.x; i < rows * groups; i += gridDim.x * 256) {
    const int r = i / groups, c = (i - r * groups) * 8;
    const int64_t off = static_cast<int64_t>(r) * BN + c;
    float v[8] = {};
    for (int u0 = lo; u0 <= hi; u0 += kLoads) {
      float w[kLoads][8];
#pragma unroll
      for (int j = 0; j < kLoads; ++j)
        if (u0 + j <= hi)
          OutConv<float>::load8(ws + (2 * static_cast<int64_t>(u0 + j) + s.slot_of(u0 + j, local)) * BM * BN + off,
                                w[j]);
#pragma unroll
      for (int j = 0; j < kLoads; ++j)
        if (u0 + j <= hi)
#pragma unroll
          for (int e = 0; e < 8; ++e) v[e] += w[j][e];
    }
    store_first8(d + static_cast<int64_t>(row0 + r) * ldd + col0 + c, v, min(8, cols - c));
  }
}

}  // namespace tessera::kernels::engine
