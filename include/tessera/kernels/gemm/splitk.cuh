// tessera/kernels/gemm/splitk.cuh — split-K for the plain GEMM: the persistent
// kernel runs tiles x splits work units (SplitKScheduler, scheduler.cuh), each
// unit stores its f32 partial tile into a workspace slab [split][M][ldw]
// (SplitKEpilogue), and the last unit of each tile to finish sums the slabs
// into D in the output type (splitk_finish): one launch, deterministic. Used where M x N gives fewer tiles than the GPU has SMs (small M,
// small N, long K): the units then fill the machine.
//
// Hooks: the split kernel has no prologue and no notify; the policy entry
// points (gemm_with_layout / gemm_with_tile) never split, so the fused
// operators keep their per-tile waits and notifies on whole tiles.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "tessera/kernels/gemm/epilogue.cuh"
#include "tessera/kernels/gemm/fast_divmod.cuh"
#include "tessera/kernels/gemm/ptx.cuh"
#include "tessera/kernels/gemm/tile.cuh"

namespace tessera::kernels::engine {

/// Named barrier of the split-K finish (+ consumer in the ping-pong kernel);
/// 2..7 are the notify and order barriers (barriers.cuh).
constexpr int kSplitBarrier = 8;

/// Stores unit pos's accumulators into slab split = pos / tiles of the f32
/// workspace (ws + split * split_stride + row * ldw + col; ldw a multiple of
/// 8, ws 256-byte aligned). After a unit's stores, splitk_finish counts the
/// tile's arrivals; the unit that arrives last sums every split's slab, in
/// split order (deterministic whichever unit is last), into D and resets
/// the tile's counter to zero for the next launch. counters: one per tile,
/// zero at launch.
template <class OutT>
struct SplitKEpilogue {
  static constexpr bool kNotify = false;
  static constexpr bool kSysScope = false;
  float* ws = nullptr;
  int64_t ldw = 0;
  int64_t split_stride = 0;
  FastDivmod tiles_div;  ///< by tiles_m * tiles_n
  int splits = 1;
  unsigned* counters = nullptr;
  OutT* d = nullptr;
  int64_t ldd = 0;

  struct Bound {
    float* base;
    int64_t ldw;
    __device__ __forceinline__ void store8(int row, int col, const float (&v)[8], int valid) const {
      store_first8(base + static_cast<int64_t>(row) * ldw + col, v, valid);
    }
  };
  __device__ __forceinline__ Bound bind(const TileInfo& t) const {
    const int64_t split = tiles_div.div(static_cast<uint32_t>(t.pos));
    return Bound{ws + split * split_stride, ldw};
  }
  __device__ __forceinline__ void tile_done(const TileInfo&) const {}
};

/// Called by every thread that stored unit `info` (threads of them, on named
/// barrier `barrier`), right after its stores. Release: each thread fences
/// its partial stores (gpu scope) before the barrier, one thread then counts
/// the arrival (the threadfence-reduction pattern). The last unit's threads
/// read the slabs through L2 (ld.cg) and store D for the rows and columns
/// they stored themselves (same mapping as the kernel's store loop).
template <class Cfg, class Params>
__device__ __forceinline__ void splitk_finish(const Params& p, const TileInfo& info, int consumer, int warp, int lane,
                                              int threads, int barrier) {
  const auto& e = p.epilogue;
  __shared__ int last_flag[2];
  const int slot = Cfg::kPingPong ? consumer : 0;
  __threadfence();
  ptx::named_barrier_sync(barrier, threads);
  if ((threadIdx.x % 128) == 0 && (Cfg::kPingPong || consumer == 0)) {
    const int tile = info.m * info.tiles_n + info.n;
    const unsigned prev = atomicAdd(e.counters + tile, 1u);
    const int last = prev == static_cast<unsigned>(e.splits - 1);
    if (last) e.counters[tile] = 0u;  // every split has arrived: ready for the next launch
    last_flag[slot] = last;
  }
  ptx::named_barrier_sync(barrier, threads);
  if (!last_flag[slot]) return;
  __threadfence();
  const int q = lane & 3;
#pragma unroll 1
  for (int a = 0; a < Cfg::kMAtoms; ++a) {
    const int row_base =
        info.row0 + (Cfg::kPingPong ? 0 : consumer * Cfg::kRowsPerConsumer) + a * 64 + warp * 16 + lane / 4;
#pragma unroll 1
    for (int h = 0; h < 2; ++h) {
      const int row = row_base + 8 * h;
      if (row >= p.M) continue;
#pragma unroll 4
      for (int g = 0; g < Cfg::BN / 32; ++g) {
        const int col = info.col0 + 8 * (4 * g + q);
        if (col >= p.N) continue;
        const float* src = e.ws + static_cast<int64_t>(row) * e.ldw + col;
        float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int s = 0; s < e.splits; ++s) {
          const float4 x = __ldcg(reinterpret_cast<const float4*>(src + s * e.split_stride));
          const float4 y = __ldcg(reinterpret_cast<const float4*>(src + s * e.split_stride) + 1);
          v[0] += x.x; v[1] += x.y; v[2] += x.z; v[3] += x.w;
          v[4] += y.x; v[5] += y.y; v[6] += y.z; v[7] += y.w;
        }
        store_first8(e.d + static_cast<int64_t>(row) * e.ldd + col, v, min(8, p.N - col));
      }
    }
  }
}

}  // namespace tessera::kernels::engine
