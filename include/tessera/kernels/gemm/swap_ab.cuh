// tessera/kernels/gemm/swap_ab.cuh — the whole-K epilogue of the
// swapped-operand plain GEMM (GemmOptions::swap_ab): the kernel runs
// D^T = B A^T, so its tile row r and columns c..c+7 are D's column r and
// rows c..c+7. A 16-bit D takes the tile's columns (store_column8: the store
// loop transposes in registers, and each store is 16 bytes of one row of D);
// store8 (store_transposed8, splitk.cuh) is the element-wise form, which the
// split path's f32 partials use (SplitKTransposedEpilogue there).
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
    /// 16-bit D: the store loop hands over columns (HasColumnStore), and
    /// each call writes 16 contiguous bytes of one row of D.
    static constexpr bool kStoresColumns = sizeof(OutT) == 2;
    using OutType = OutT;
    OutT* d;
    int64_t ldd;
    __device__ __forceinline__ void store8(int row, int col, const float (&v)[8], int valid) const {
      store_transposed8(d, ldd, row, col, v, valid);
    }
    /// D[col, row .. row + 7] = packed (row a multiple of 8: 16-byte aligned
    /// when D's rows are, which gemm() ensures by staging).
    __device__ __forceinline__ void store_column8(int row, int col, const uint4& packed, int valid) const {
      OutT* p = d + static_cast<int64_t>(col) * ldd + row;
      if (valid == 8) {
        *reinterpret_cast<uint4*>(p) = packed;
      } else {
        const uint32_t w[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          if (k < valid) {
            const uint16_t h = static_cast<uint16_t>(w[k / 2] >> (16 * (k % 2)));
            p[k] = *reinterpret_cast<const OutT*>(&h);
          }
        }
      }
    }
  };
  __device__ __forceinline__ Bound bind(const TileInfo&) const { return Bound{d, ldd}; }
  __device__ __forceinline__ void tile_done(const TileInfo&) const {}
};

}  // namespace tessera::kernels::engine
