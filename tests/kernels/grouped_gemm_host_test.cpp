// CPU tests of the grouped GEMM's tile order (grouped_raster.hpp, the code
// the kernel runs): for every band (row-major and banded, partial last band)
// the order is a bijection of [0, tiles_m * tiles_n) onto the group's tiles,
// equal to the same order computed with plain divisions; and the host-side
// tile bound (grid sizing) covers every table the bound admits; and every
// bad argument is rejected by validate() on the host, named, before any
// device work (misaligned pointers, dtype mismatch, negative or overflowing
// sizes, more groups than the table holds).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/kernels/gemm/grouped_raster.hpp"
#include "tessera/kernels/grouped_gemm.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::kernels::detail {
// Declared in tessera/kernels/gemm/grouped_launch.cuh (a CUDA header): the
// templated entry point's checks of its arguments against the instantiation.
void grouped_check_instantiation(const GroupedGemmArgs& a, BLayout layout, DType in, int max_ctas, bool gather);
}  // namespace tessera::kernels::detail

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

namespace {

tk::GroupedGemmArgs good_grouped() {
  tk::GroupedGemmArgs a;
  a.a = reinterpret_cast<const void*>(0x10000);
  a.b = reinterpret_cast<const void*>(0x20000);
  a.d = reinterpret_cast<void*>(0x30000);
  a.group_rows = reinterpret_cast<const int*>(0x40000);
  a.status = reinterpret_cast<int*>(0x50000);
  a.groups = 8;
  a.n = 256;
  a.k = 64;
  a.max_rows = 1000;
  return a;
}

std::string grouped_error(const tk::GroupedGemmArgs& a, const tk::GroupedGemmOptions& o = {}) {
  try {
    tk::validate(a, o);
  } catch (const tessera::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(GroupedGemmValidate, AcceptsAGoodProblemWithoutADevice) {
  EXPECT_EQ(grouped_error(good_grouped()), "");
  auto a = good_grouped();
  a.max_rows = 0;  // no rows at all: a valid (empty) call
  EXPECT_EQ(grouped_error(a), "");
  a = good_grouped();
  a.groups = tk::kGroupedMaxGroups;  // exactly the table
  EXPECT_EQ(grouped_error(a), "");
}

TEST(GroupedGemmValidate, RejectsEachBadArgumentByName) {
  using A = tk::GroupedGemmArgs;
  const std::pair<std::function<void(A&)>, std::string> bad[] = {
      // More groups than the kernel's shared-memory table holds, or none.
      {[](A& a) { a.groups = tk::kGroupedMaxGroups + 1; },
       "groups = 1025 out of range [1, 1024] (the kernel's shared-memory group table holds 1024)"},
      {[](A& a) { a.groups = 0; }, "groups = 0 out of range"},
      {[](A& a) { a.groups = -3; }, "groups = -3 out of range"},
      // Negative or overflowing sizes.
      {[](A& a) { a.max_rows = -1; }, "max_rows = -1 out of range [0, 2^31)"},
      {[](A& a) { a.max_rows = std::int64_t{1} << 31; }, "max_rows = 2147483648 out of range"},
      {[](A& a) { a.n = -5; }, "N = -5 out of range [1, 2^31)"},
      {[](A& a) { a.n = std::int64_t{1} << 31; }, "N = 2147483648 out of range"},
      {[](A& a) { a.k = 0; }, "K = 0 out of range [8, 2^31)"},
      {[](A& a) { a.k = 100; }, "K = 100 must be a multiple of 8"},
      {[](A& a) {
         a.max_rows = (std::int64_t{1} << 31) - 1;
         a.n = std::int64_t{1} << 30;
       },
       "up to 562950070861824 tiles (max_rows = 2147483647, G = 8, N = 1073741824) overflow the schedule's int"},
      {[](A& a) { a.lda = 60; }, "lda = 60 must be >= K = 64"},
      {[](A& a) { a.lda = 68; }, "lda = 68 must be >= K = 64, < 2^31 and a multiple of 8"},
      {[](A& a) { a.ldb = std::int64_t{1} << 31; }, "ldb = 2147483648 must be >= 64"},
      {[](A& a) { a.stride_b = 256 * 64 - 8; }, "stride_b = 16376 must be >= 16384"},
      {[](A& a) { a.stride_b = std::int64_t{1} << 40; },
       "stride_b = 1099511627776 elements exceeds TMA's 2^40-byte stride"},
      // Null and misaligned pointers.
      {[](A& a) { a.a = nullptr; }, "A is null"},
      {[](A& a) { a.b = nullptr; }, "B is null"},
      {[](A& a) { a.d = nullptr; }, "D is null"},
      {[](A& a) { a.group_rows = nullptr; }, "group_rows is null"},
      {[](A& a) { a.status = nullptr; }, "status is null"},
      {[](A& a) { a.a = reinterpret_cast<const void*>(0x10002); }, "A = 0x10002 is not 16-byte aligned"},
      {[](A& a) { a.b = reinterpret_cast<const void*>(0x20008); }, "B = 0x20008 is not 16-byte aligned"},
      {[](A& a) { a.d = reinterpret_cast<void*>(0x30004); }, "D = 0x30004 is not 16-byte aligned"},
      {[](A& a) { a.group_rows = reinterpret_cast<const int*>(0x40002); },
       "group_rows = 0x40002 is not 4-byte aligned"},
      {[](A& a) { a.status = reinterpret_cast<int*>(0x50001); }, "status = 0x50001 is not 4-byte aligned"},
      // Dtypes: unsupported, or output and input differing.
      {[](A& a) { a.in = tessera::DType::f32; }, "input dtype f32 not supported (bf16 or f16)"},
      {[](A& a) { a.out = tessera::DType::f32; }, "output dtype f32 must equal the input dtype bf16"},
      {[](A& a) {
         a.in = tessera::DType::f16;
         a.out = tessera::DType::bf16;
       },
       "output dtype bf16 must equal the input dtype f16"},
      {[](A& a) { a.in = a.out = tessera::DType::f16; }, "input dtype f16 is not compiled for grouped_gemm()"},
      {[](A& a) { a.ldd = 200; }, "ldd = 200 must be >= 256"},
  };
  for (const auto& [edit, want] : bad) {
    auto a = good_grouped();
    edit(a);
    const std::string e = grouped_error(a);
    EXPECT_NE(e.find("grouped_gemm: " + want), std::string::npos) << "want '" << want << "', got: '" << e << "'";
  }
}

TEST(GroupedGemmValidate, RejectsBadOptionsByName) {
  tk::GroupedGemmOptions o;
  o.max_ctas = -1;
  EXPECT_NE(grouped_error(good_grouped(), o).find("max_ctas = -1 must be >= 0"), std::string::npos);
  o = {};
  o.raster_band = 65;
  EXPECT_NE(grouped_error(good_grouped(), o).find("raster_band = 65 out of range [-1, 64]"), std::string::npos);
  o = {};
  o.epilogue = tk::GroupedEpilogueKind::SwiGLU;
  auto a = good_grouped();
  a.n = 255;
  EXPECT_NE(grouped_error(a, o).find("N = 255 must be even with the SwiGLU epilogue"), std::string::npos);
  a.n = 250;  // 125 output columns: not 16-byte rows
  EXPECT_NE(grouped_error(a, o).find("ldd = 125 must be >= 125 (D's columns) and a multiple of 16 bytes"),
            std::string::npos)
      << grouped_error(a, o);
}

// The row gather of A: its table, bounds and the one compiled combination.
TEST(GroupedGemmValidate, RowGatherArgumentsAreNamed) {
  tk::GroupedGemmOptions o;
  o.epilogue = tk::GroupedEpilogueKind::SwiGLU;
  auto a = good_grouped();
  a.a_gather = reinterpret_cast<const std::int32_t*>(0x60000);
  a.a_rows = 500;
  a.a_gather_div = 2;
  EXPECT_EQ(grouped_error(a, o), "");
  EXPECT_NE(grouped_error(a).find("compiled for B as NK with the SwiGLU epilogue only (got B NK ([G, N, K]), plain"),
            std::string::npos)
      << grouped_error(a);
  auto b = a;
  b.b_layout = tk::BLayout::KN;
  EXPECT_NE(grouped_error(b, o).find("got B KN ([G, K, N]), SwiGLU"), std::string::npos) << grouped_error(b, o);
  b = a;
  b.a_gather = reinterpret_cast<const std::int32_t*>(0x60002);
  EXPECT_NE(grouped_error(b, o).find("a_gather = 0x60002 is not 4-byte aligned"), std::string::npos)
      << grouped_error(b, o);
  b = a;
  b.a_rows = 0;
  EXPECT_NE(grouped_error(b, o).find("a_rows = 0 out of range [1, 2^31)"), std::string::npos);
  b = a;
  b.a_gather_div = 0;
  EXPECT_NE(grouped_error(b, o).find("a_gather_div = 0 must be >= 1"), std::string::npos);
  b = a;
  b.a_rows = int64_t{1} << 30;
  b.a_gather_div = 4;
  EXPECT_NE(grouped_error(b, o).find("a_rows x a_gather_div < 2^31"), std::string::npos);
}

// The templated entry point (grouped_launch.cuh) names a mismatch between its
// arguments and the kernel it instantiates before the device check.
TEST(GroupedGemmValidate, InstantiationMismatchIsNamed) {
  const auto rejected = [](const tk::GroupedGemmArgs& a, tk::BLayout l, tessera::DType in, int max_ctas) {
    try {
      tk::detail::grouped_check_instantiation(a, l, in, max_ctas, a.a_gather != nullptr);
    } catch (const tessera::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const auto a = good_grouped();
  EXPECT_NE(rejected(a, tk::BLayout::KN, tessera::DType::bf16, 0).find("does not match the instantiated layout"),
            std::string::npos);
  EXPECT_NE(rejected(a, tk::BLayout::NK, tessera::DType::f16, 0)
                .find("args.in = bf16 does not match the instantiated input type f16"),
            std::string::npos);
  EXPECT_NE(rejected(a, tk::BLayout::NK, tessera::DType::bf16, -2).find("max_ctas = -2 must be >= 0"),
            std::string::npos);
  auto b = a;
  b.groups = 2000;
  EXPECT_NE(rejected(b, tk::BLayout::NK, tessera::DType::bf16, 0).find("groups = 2000 out of range"),
            std::string::npos);
  b = a;
  b.a_gather = reinterpret_cast<const std::int32_t*>(0x60000);
  b.a_rows = 10;
  try {
    tk::detail::grouped_check_instantiation(b, tk::BLayout::NK, tessera::DType::bf16, 0, false);
    ADD_FAILURE() << "a gathered A accepted by a kernel without the gather";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("args.a_gather is set but the instantiated kernel does not do the row gather"),
              std::string::npos)
        << e.what();
  }
}
