// tessera/kernels/gemm/swap_ab.cuh — the epilogues of the swapped-operand
// plain GEMM (GemmOptions::swap_ab): the kernel runs D^T = B A^T, so its
// tile row r and columns c..c+7 are D's column r and rows c..c+7. Both
// epilogues store each of the 8 values to its own row of D: for one value
// index, the 8 lanes of a row group write 8 consecutive columns (16 bytes
// of a 16-bit D, 32 of an f32 slab), which is what makes the transposed
// store affordable for the small M these tiles serve.
#pragma once

#include <cstdint>

#include "tessera/kernels/gemm/epilogue.cuh"
#include "tessera/kernels/gemm/fast_divmod.cuh"
#include "tessera/kernels/gemm/tile.cuh"

namespace tessera::kernels::engine {

/// Whole K: D[col + e, row] = acc (OutT), D row stride ldd.
template <class OutT>
struct TransposedEpilogue {
  static constexpr bool kNotify = false;
  static constexpr bool kSysScope = false;
  OutT* d = nullptr;
  int64_t ldd = 0;

  struct Bound {
    OutT* d;
    int64_t ldd;
    __device__ __forceinline__ void store8(int row, int col, const float (&v)[8], int valid) const {
      OutT* p = d + static_cast<int64_t>(col) * ldd + row;
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (e < valid) p[e * ldd] = OutConv<OutT>::one(v[e]);
    }
  };
  __device__ __forceinline__ Bound bind(const TileInfo&) const { return Bound{d, ldd}; }
  __device__ __forceinline__ void tile_done(const TileInfo&) const {}
};

/// Split K: unit pos's partial into slab pos / tiles of the f32 workspace,
/// laid out as D ([M][ldw], the layout splitk_reduce sums):
/// ws + split * split_stride + (col + e) * ldw + row.
struct SplitKTransposedEpilogue {
  static constexpr bool kNotify = false;
  static constexpr bool kSysScope = false;
  float* ws = nullptr;
  int64_t ldw = 0;
  int64_t split_stride = 0;
  FastDivmod tiles_div;  ///< by tiles_m * tiles_n of the swapped problem

  struct Bound {
    float* base;
    int64_t ldw;
    __device__ __forceinline__ void store8(int row, int col, const float (&v)[8], int valid) const {
      float* p = base + static_cast<int64_t>(col) * ldw + row;
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (e < valid) p[e * ldw] = v[e];
    }
  };
  __device__ __forceinline__ Bound bind(const TileInfo& t) const {
    const int64_t split = tiles_div.div(static_cast<uint32_t>(t.pos));
    return Bound{ws + split * split_stride, ldw};
  }
  __device__ __forceinline__ void tile_done(const TileInfo&) const {}
};

}  // namespace tessera::kernels::engine
