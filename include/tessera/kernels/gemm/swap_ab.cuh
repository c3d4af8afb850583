// tessera/kernels/gemm/swap_ab.cuh — the whole-K epilogue of the
// swapped-operand plain GEMM (GemmOptions::swap_ab): the kernel runs
// D^T = B A^T, so its tile row r and columns c..c+7 are D's column r and
// rows c..c+7 (store_transposed8, splitk.cuh; the split path stores its
// partials with SplitKTransposedEpilogue there).
#pragma once

#include <cstdint>

#include "tessera/kernels/gemm/epilogue.cuh"
#include "tessera/kernels/gemm/splitk.cuh"
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
      store_transposed8(d, ldd, row, col, v, valid);
    }
  };
  __device__ __forceinline__ Bound bind(const TileInfo&) const { return Bound{d, ldd}; }
  __device__ __forceinline__ void tile_done(const TileInfo&) const {}
};

}  // namespace tessera::kernels::engine
