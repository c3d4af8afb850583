// tessera/kernels/gemm/splitk.cuh — split-K for the plain GEMM: the persistent
// kernel runs tiles x splits work units (SplitKScheduler, scheduler.cuh), each
// unit stores its f32 partial tile into a workspace slab [split][M][ldw]
// (SplitKEpilogue), and splitk_reduce sums the slabs into D in the output
// type. Used where M x N gives fewer tiles than the GPU has SMs (small M,
// small N, long K): the units then fill the machine.
//
// Hooks: the split kernel has no prologue and no notify; the policy entry
// point (gemm_with, launch.cuh) never splits, so the fused operators keep
// their per-tile waits and notifies on whole tiles.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "tessera/kernels/gemm/epilogue.cuh"
#include "tessera/kernels/gemm/fast_divmod.cuh"
#include "tessera/kernels/gemm/tile.cuh"

namespace tessera::kernels::engine {

/// D[col + e, row] = v[e] for the first `valid` of 8 values at d (row stride
/// ld): the store of a swapped-operand kernel (GemmOptions::swap_ab), whose
/// tile row is D's column. For one e the 8 lanes of a row group write 8
/// consecutive columns of D (16 bytes of a 16-bit D, 32 of an f32 slab).
template <class T>
__device__ __forceinline__ void store_transposed8(T* d, int64_t ld, int row, int col, const float (&v)[8], int valid) {
  T* p = d + static_cast<int64_t>(col) * ld + row;
#pragma unroll
  for (int e = 0; e < 8; ++e)
    if (e < valid) p[e * ld] = OutConv<T>::one(v[e]);
}

/// Stores unit pos's accumulators into slab split = pos / tiles of the f32
/// workspace: ws + split * split_stride + row * ldw + col. ldw is a multiple
/// of 8 (32-byte rows), ws 256-byte aligned. kTransposed (swapped operands:
/// the kernel's rows are D's columns): the slab keeps D's layout, the kernel's
/// (row, col) lands at col * ldw + row, so splitk_reduce is the same.
template <bool kTransposed>
struct SplitKEpilogueOf {
  static constexpr bool kNotify = false;
  static constexpr bool kSysScope = false;
  float* ws = nullptr;
  int64_t ldw = 0;
  int64_t split_stride = 0;
  FastDivmod tiles_div;  ///< by the kernel's tiles_m * tiles_n

  struct Bound {
    float* base;
    int64_t ldw;
    __device__ __forceinline__ void store8(int row, int col, const float (&v)[8], int valid) const {
      if constexpr (kTransposed)
        store_transposed8(base, ldw, row, col, v, valid);
      else
        store_first8(base + static_cast<int64_t>(row) * ldw + col, v, valid);
    }
  };
  __device__ __forceinline__ Bound bind(const TileInfo& t) const {
    const int64_t split = tiles_div.div(static_cast<uint32_t>(t.pos));
    return Bound{ws + split * split_stride, ldw};
  }
  __device__ __forceinline__ void tile_done(const TileInfo&) const {}
};
using SplitKEpilogue = SplitKEpilogueOf<false>;
using SplitKTransposedEpilogue = SplitKEpilogueOf<true>;

/// D[row, col..col+7] = sum over splits of the workspace, converted to OutT;
/// one thread per 8 outputs, grid-stride. Columns past N are not written.
/// Launched as a programmatic dependent of the split kernel (its launch and
/// block setup overlap the split kernel's tail); it waits for that kernel's
/// completion before reading the workspace.
template <class OutT>
__global__ void splitk_reduce(const float* __restrict__ ws, int splits, int64_t split_stride, int64_t ldw, int M, int N,
                              OutT* __restrict__ d, int64_t ldd) {
  ptx::grid_dependents_launch();  // plain: the next GEMM's set-up may overlap this one
  ptx::grid_dependency_wait();
  const int groups = (N + 7) / 8;
  const int64_t total = static_cast<int64_t>(M) * groups;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int row = static_cast<int>(i / groups);
    const int col = static_cast<int>(i - static_cast<int64_t>(row) * groups) * 8;
    const float* p = ws + static_cast<int64_t>(row) * ldw + col;
    float v[8];
    OutConv<float>::load8(p, v);
    for (int s = 1; s < splits; ++s) {
      float w[8];
      OutConv<float>::load8(p + s * split_stride, w);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] += w[j];
    }
    store_first8(d + static_cast<int64_t>(row) * ldd + col, v, min(8, N - col));
  }
}

}  // namespace tessera::kernels::engine
