// Host-side tests of the GEMM engine: validation (no GPU needed: bad input is
// rejected before the device is touched), the tile heuristic, and the tile
// schedulers' permutation property.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/gemm/scheduler.cuh"
#include "tessera/runtime/error.hpp"

namespace tk = tessera::kernels;
using tessera::DType;

namespace {
tk::GemmArgs good() {
  tk::GemmArgs a;
  a.a = reinterpret_cast<const void*>(0x10000);
  a.b = reinterpret_cast<const void*>(0x20000);
  a.d = reinterpret_cast<void*>(0x30000);
  a.m = 256;
  a.n = 512;
  a.k = 128;
  return a;
}

std::string error_of(const tk::GemmArgs& a) {
  try {
    tk::validate(a);
  } catch (const tessera::Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(GemmValidate, RejectsBadInputWithAClearMessage) {
  auto a = good();
  a.k = 100;
  EXPECT_NE(error_of(a).find("K = 100"), std::string::npos) << error_of(a);
  a = good();
  a.k = 0;
  EXPECT_NE(error_of(a).find("K = 0"), std::string::npos);
  a = good();
  a.m = 0;
  EXPECT_NE(error_of(a).find("M = 0"), std::string::npos);
  a = good();
  a.a = reinterpret_cast<const void*>(0x10002);
  EXPECT_NE(error_of(a).find("A = "), std::string::npos);
  a = good();
  a.lda = 130;
  EXPECT_NE(error_of(a).find("lda = 130"), std::string::npos);
  a = good();
  a.ldb = 64;
  EXPECT_NE(error_of(a).find("ldb = 64"), std::string::npos);
  a = good();
  a.b_layout = tk::BLayout::KN;
  a.ldb = 256;  // < N
  EXPECT_NE(error_of(a).find("ldb = 256"), std::string::npos);
  a = good();
  a.in = DType::f32;
  EXPECT_NE(error_of(a).find("input dtype f32"), std::string::npos);
  a = good();
  a.b = nullptr;
  EXPECT_NE(error_of(a).find("B is null"), std::string::npos);
}

TEST(GemmHeuristic, PrefersLargeTilesAndFillsWaves) {
  tk::GemmArgs a = good();
  a.m = 8192;
  a.n = 8192;
  a.k = 8192;
  EXPECT_EQ(tk::choose_tile(a, 132), tk::GemmTile::T128x256);
  // Few tiles: 128x128 gives more CTAs work.
  a.m = 512;
  a.n = 1024;
  EXPECT_EQ(tk::choose_tile(a, 132), tk::GemmTile::T128x128);
  for (auto t : {tk::GemmTile::T128x256, tk::GemmTile::T256x128, tk::GemmTile::T128x128})
    EXPECT_GT(tk::tile_shape(t).bm * tk::tile_shape(t).bn, 0);
  EXPECT_THROW(tk::tile_shape(tk::GemmTile::Auto), tessera::Error);
}

TEST(GemmScheduler, RasterOrdersArePermutations) {
  for (int tiles_m : {1, 5, 64})
    for (int tiles_n : {1, 7, 22})
      for (int group : {1, 3, 8})
        for (bool along_m : {false, true})
          for (int rot : {0, 2}) {
            tk::engine::RasterScheduler s{group, along_m, rot % tiles_m};
            std::set<int> seen;
            for (int pos = 0; pos < tiles_m * tiles_n; ++pos) {
              const auto t = s.tile(pos, tiles_m, tiles_n);
              ASSERT_TRUE(t.m >= 0 && t.m < tiles_m && t.n >= 0 && t.n < tiles_n);
              seen.insert(t.m * tiles_n + t.n);
            }
            EXPECT_EQ(static_cast<int>(seen.size()), tiles_m * tiles_n)
                << tiles_m << "x" << tiles_n << " group " << group << " along_m " << along_m;
          }
}
