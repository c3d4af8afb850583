// tessera/kernels/gemm/swap_ab.cuh — the whole-K epilogue of the
// swapped-operand plain GEMM (GemmOptions::swap_ab): the kernel runs
// D^T = B A^T, so its tile row r and columns c..c+7 are D's column r and
// rows c..c+7. The store loop hands the epilogue the tile's columns
// (HasColumnStore: transposed in registers), and each store is 16 bytes of
// one row of D. The split path's f32 partials are stored element-wise by
// SplitKTransposedEpilogue (splitk.cuh).
#pragma once

#include <cstdint>

#include "tessera/kernels/gemm/epilogue.cuh"
#include "tessera/kernels/gemm/tile.cuh"

namespace tessera::kernels::engine {

/// Whole K: D[col + e, row] = acc (OutT, 16-bit), D row stride ldd.
template <class OutT>
struct TransposedEpilogue {
  static_assert(sizeof(OutT) == 2, "swapped whole-K GEMMs store the 16-bit input type");
  static constexpr bool kNotify = false;
  static constexpr bool kSysScope = false;
  OutT* d = nullptr;
  int64_t ldd = 0;

  struct Bound {
    static constexpr bool kStoresColumns = true;
    using OutType = OutT;
    OutT* d;
    int64_t ldd;
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
