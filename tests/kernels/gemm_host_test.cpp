// Host-side tests of the GEMM engine: validation (no GPU needed: bad input is
// rejected before the device is touched), the tile heuristic, and the tile
// schedulers' permutation property.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>
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

TEST(GemmHeuristic, EpilogueOverlapResolvesToPingPongTiles) {
  tk::GemmArgs a = good();
  tk::GemmOptions o;
  o.epilogue_overlap = true;
  EXPECT_EQ(tk::resolve_tile(a, o), tk::GemmTile::T128x128);
  o.tile = tk::GemmTile::T64x256;
  EXPECT_EQ(tk::resolve_tile(a, o), tk::GemmTile::T64x256);
  EXPECT_EQ(tk::tile_shape(tk::GemmTile::T64x256).bm, 64);
  EXPECT_EQ(tk::tile_name(tk::GemmTile::T64x256), "64x256");
  EXPECT_EQ(tk::resolve_cluster(a, o, tk::GemmTile::T64x256), 1);
  o.tile = tk::GemmTile::T128x256;
  EXPECT_THROW(tk::resolve_tile(a, o), tessera::Error);
  o.tile = tk::GemmTile::Auto;
  o.cluster_m = 2;
  EXPECT_THROW(tk::resolve_tile(a, o), tessera::Error);
  EXPECT_THROW(tk::resolve_cluster(a, o, tk::GemmTile::T128x128), tessera::Error);
  tk::GemmOptions plain;
  plain.tile = tk::GemmTile::T64x256;  // ping-pong only
  EXPECT_THROW(tk::resolve_tile(a, plain), tessera::Error);
  // The default stays the cooperative path.
  EXPECT_FALSE(tk::GemmOptions{}.epilogue_overlap);
}

// A host model of the ping-pong ring protocol of kernel.cuh (producer fills
// ring indices in order; consumer c takes tiles c, c+2, ...; parity waits on
// full/empty mbarriers; order barriers between the consumers' main loops),
// run under random interleavings: every full-wait that passes must see the
// fill of exactly the ring index the consumer expects, and nothing deadlocks.
// It checks the argument in kernel.cuh, not the device code itself.
TEST(GemmPingPongModel, ParityWaitsSeeTheirOwnFill) {
  std::mt19937_64 rng(12345);
  for (int stages : {2, 5, 7})
    for (int k_blocks : {1, 2, 3, 7, 16})
      for (int tiles : {1, 2, 3, 4, 7})
        for (int trial = 0; trial < 20; ++trial) {
          std::vector<int> full_done(stages, 0), empty_done(stages, 0), last_fill(stages, -1);
          int order_arrived[2] = {0, 0}, order_synced[2] = {0, 0};
          const int total = tiles * k_blocks;
          int produced = 0;
          struct Cons {
            int iter, kb, prev;
            bool waiting_order, done;
          } cons[2] = {{0, 0, -1, false, tiles <= 0}, {1, 0, -1, true, tiles <= 1}};
          auto parity_passes = [](int completed, int n) { return (completed & 1) != (n & 1); };
          for (int steps = 0;; ++steps) {
            ASSERT_LT(steps, 100000) << "no progress";
            std::vector<int> runnable;
            if (produced < total) {
              const int s = produced % stages, n = produced / stages;
              if (parity_passes(empty_done[s], n ^ 1)) runnable.push_back(2);  // wait empty, parity ph ^ 1
            }
            for (int c = 0; c < 2; ++c) {
              Cons& k = cons[c];
              if (k.done) continue;
              if (k.waiting_order) {
                if (order_arrived[c] > order_synced[c]) runnable.push_back(c);
                continue;
              }
              const int idx = k.iter * k_blocks + k.kb, s = idx % stages, n = idx / stages;
              if (parity_passes(full_done[s], n)) runnable.push_back(c);
            }
            if (runnable.empty()) {
              ASSERT_TRUE(produced == total && cons[0].done && cons[1].done)
                  << "deadlock: stages " << stages << " k_blocks " << k_blocks << " tiles " << tiles;
              break;
            }
            const int who = runnable[rng() % runnable.size()];
            if (who == 2) {
              const int s = produced % stages;
              ASSERT_EQ(empty_done[s], produced / stages) << "producer overwrote slot " << s << " before its release";
              last_fill[s] = produced;
              ++full_done[s];
              ++produced;
              continue;
            }
            Cons& k = cons[who];
            if (k.waiting_order) {
              ++order_synced[who];
              k.waiting_order = false;
              continue;
            }
            const int idx = k.iter * k_blocks + k.kb, s = idx % stages;
            ASSERT_EQ(last_fill[s], idx) << "consumer " << who << " read slot " << s << " at the wrong phase";
            if (k.prev >= 0) ++empty_done[k.prev % stages];  // release the previous slot
            k.prev = idx;
            if (++k.kb == k_blocks) {
              if (k.iter + 1 < tiles) {  // hook: hand over to the other consumer
                ++order_arrived[who ^ 1];
                ASSERT_LE(order_arrived[who ^ 1], order_synced[who ^ 1] + 1) << "order barrier arrived twice";
              }
              ++empty_done[k.prev % stages];
              k.prev = -1;
              k.kb = 0;
              k.iter += 2;
              k.done = k.iter >= tiles;
              k.waiting_order = !k.done;
            }
          }
        }
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
