// tessera/kernels/gemm/tile.cuh — what the GEMM kernel tells its policies
// about the tile in hand.
#pragma once

namespace tessera::kernels::engine {

struct TileInfo {
  int m, n;        ///< tile coordinates (tile row, tile column)
  int pos;         ///< position in the schedule (0 .. tiles - 1)
  int row0, col0;  ///< first row / column of D the tile covers
  int bm, bn;      ///< tile shape
  int tiles_m, tiles_n;
  int M, N;  ///< problem size (rows / columns of the GEMM's D)
  __host__ __device__ int linear() const { return m * tiles_n + n; }
};

}  // namespace tessera::kernels::engine
