// CPU tests of the grouped GEMM's tile order (grouped_raster.hpp, the code
// the kernel runs): for every band (row-major and banded, partial last band)
// the order is a bijection of [0, tiles_m * tiles_n) onto the group's tiles,
// equal to the same order computed with plain divisions; and the host-side
// tile bound (grid sizing) covers every table the bound admits.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "tessera/kernels/gemm/grouped_raster.hpp"
#include "tessera/kernels/grouped_gemm.hpp"

namespace te = tessera::kernels::engine;
namespace tk = tessera::kernels;

TEST(GroupedGemmHost, RasterIsABijectionForEveryBand) {
  for (int tiles_n = 1; tiles_n <= 19; ++tiles_n)
    for (int band = 0; band <= 9; ++band) {
      const te::GroupedRaster r = te::GroupedRaster::make(tiles_n, band);
      for (int tiles_m = 1; tiles_m <= 41; ++tiles_m) {
        std::vector<int> seen(static_cast<size_t>(tiles_m * tiles_n), 0);
        for (int local = 0; local < tiles_m * tiles_n; ++local) {
          int tm = -1, tn = -1;
          r.at(local, tiles_m, tm, tn);
          ASSERT_TRUE(tm >= 0 && tm < tiles_m && tn >= 0 && tn < tiles_n)
              << "band " << band << " tiles " << tiles_m << "x" << tiles_n << " local " << local;
          ++seen[static_cast<size_t>(tm * tiles_n + tn)];
          // Reference with plain divisions.
          int want_m, want_n;
          if (band == 0) {
            want_m = local / tiles_n;
            want_n = local % tiles_n;
          } else {
            const int b = local / (band * tiles_n), first = b * band, in = local - b * band * tiles_n;
            const int width = std::min(band, tiles_m - first);
            want_n = in / width;
            want_m = first + in % width;
          }
          ASSERT_EQ(tm, want_m) << "band " << band << " local " << local;
          ASSERT_EQ(tn, want_n) << "band " << band << " local " << local;
        }
        ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }))
            << "band " << band << " tiles " << tiles_m << "x" << tiles_n;
      }
    }
}

// The launch sizes the grid from grouped_max_tiles(); any table whose rows
// sum to at most max_rows has at most that many tiles.
TEST(GroupedGemmHost, TileBoundCoversEveryAdmissibleTable) {
  const tk::TileShape shapes[] = {{128, 256}, {128, 128}, {64, 256}};
  for (const auto s : shapes) {
    tk::GroupedGemmArgs a;
    a.n = 1000;
    a.groups = 5;
    a.max_rows = 1000;
    const int64_t bound = tk::grouped_max_tiles(a, s);
    const int64_t tiles_n = (a.n + s.bn - 1) / s.bn;
    // Worst cases: every group one row past a tile boundary, or one row each.
    const std::vector<std::vector<int64_t>> tables = {
        {s.bm + 1, s.bm + 1, s.bm + 1, s.bm + 1, 1000 - 4 * (s.bm + 1)}, {1, 1, 1, 1, 996}, {1000, 0, 0, 0, 0}};
    for (const auto& t : tables) {
      int64_t tiles = 0;
      for (int64_t r : t) tiles += (r + s.bm - 1) / s.bm * tiles_n;
      EXPECT_LE(tiles, bound) << s.bm << "x" << s.bn;
    }
  }
}
