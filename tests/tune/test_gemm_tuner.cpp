// CPU tests of the GEMM measured override's cache side: bucket keys, plan
// JSON and cache round trips, invalid entries rejected, nearest-bucket reuse.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "support/temp_dir.hpp"
#include "tessera/kernels/gemm_plan.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/tune/gemm_tuner.hpp"

namespace fs = std::filesystem;
namespace tk = tessera::kernels;
using namespace tessera::tune;
using tessera::DType;

namespace {

using tessera::testing::TempDir;

tk::GemmArgs problem(int64_t m, int64_t n, int64_t k) {
  tk::GemmArgs a;
  a.a = reinterpret_cast<const void*>(0x100000);
  a.b = reinterpret_cast<const void*>(0x200000);
  a.d = reinterpret_cast<void*>(0x300000);
  a.m = m, a.n = n, a.k = k;
  return a;
}

tk::GemmPlan plan(tk::GemmTile t, bool pp, int c, int s) { return tk::GemmPlan{t, pp, c, s}; }

nlohmann::json entry(const tk::GemmPlan& p, int64_t m, int64_t n, int64_t k) {
  return {{"plan", gemm_plan_to_json(p)}, {"shape", {m, n, k}}, {"us", 10.0}};
}

const MachineId kH200 = gemm_machine("NVIDIA H200", 132);

}  // namespace

TEST(GemmTuneKey, BucketsAreQuarterOctavesAndTheKeyNamesWhatChangesAPlan) {
  const tk::GemmArgs a = problem(1000, 4096, 4100);
  const std::array<int, 3> b = gemm_bucket(a);
  EXPECT_EQ(b[0], std::lround(4 * std::log2(1000.0)));  // 40
  EXPECT_EQ(b[1], 48);
  EXPECT_EQ(b[2], 48);
  // Within ~9 %: the same bucket; a quarter octave apart: the next.
  EXPECT_EQ(gemm_bucket_key(kH200, problem(1040, 4096, 4100)), gemm_bucket_key(kH200, a));
  EXPECT_NE(gemm_bucket_key(kH200, problem(1200, 4096, 4100)), gemm_bucket_key(kH200, a));
  const std::string key = gemm_bucket_key(kH200, a);
  EXPECT_EQ(key, "NVIDIA H200|sm132|w1|bf16|gemm.plan|out:bf16|nk|row8|b40_48_48");  // K = 4100: 8-byte rows
  // Alignment class, layout, dtypes and the SM count each change the key.
  tk::GemmArgs x = a;
  x.k = 4096;
  EXPECT_NE(gemm_bucket_key(kH200, x), gemm_bucket_key(kH200, a));  // row128, same bucket numbers
  EXPECT_NE(gemm_key_prefix(kH200, x), gemm_key_prefix(kH200, a));
  x = a;
  x.b_layout = tk::BLayout::KN;
  EXPECT_NE(gemm_bucket_key(kH200, x), key);
  x = a;
  x.out = DType::f32;
  EXPECT_NE(gemm_bucket_key(kH200, x), key);
  x = a;
  x.in = x.out = DType::f16;
  EXPECT_NE(gemm_bucket_key(kH200, x), key);
  EXPECT_NE(gemm_bucket_key(gemm_machine("NVIDIA H200", 100), a), key);
  EXPECT_NE(gemm_bucket_key(gemm_machine("NVIDIA H100 80GB HBM3", 132), a), key);
  EXPECT_THROW(gemm_machine("NVIDIA H200", 0), tessera::Error);
}

TEST(GemmTuneCache, PlanJsonAndCacheRoundTrip) {
  const tk::GemmArgs a = problem(19, 1728, 12048);
  // The second problem's candidates hold the cluster kernels along N.
  int along_n = 0;
  for (const tk::GemmArgs& x : {a, problem(600, 2000, 1000)})
    for (const tk::GemmPlan& p : tk::gemm_plan_candidates(x)) {
      const auto back = gemm_plan_from_json(gemm_plan_to_json(p));
      ASSERT_TRUE(back.has_value()) << tk::plan_name(p);
      EXPECT_TRUE(*back == p) << tk::plan_name(p);
      along_n += p.cluster_n > 1;
    }
  EXPECT_EQ(along_n, 4);  // 128x128 1x2 and 2x2, 128x256 2x2, 128x192 1x2
  EXPECT_FALSE(gemm_plan_from_json(nlohmann::json::parse(R"({"tile": "128x128", "ping_pong": false, "cluster_m": 1,
    "cluster_n": 3, "k_splits": 1})")));
  EXPECT_FALSE(gemm_plan_from_json(nlohmann::json::parse(R"({"tile": "96x96", "ping_pong": false, "cluster_m": 1,
    "k_splits": 1})")));
  EXPECT_FALSE(gemm_plan_from_json(nlohmann::json::parse(R"({"tile": "128x256", "ping_pong": 1, "cluster_m": 1,
    "k_splits": 1})")));
  EXPECT_FALSE(gemm_plan_from_json(nlohmann::json::parse(R"({"tile": "128x256", "ping_pong": false, "cluster_m": 4,
    "k_splits": 1})")));
  EXPECT_FALSE(gemm_plan_from_json(nlohmann::json::parse(R"({"tile": "128x256", "ping_pong": false,
    "cluster_m": 1, "k_splits": 0})")));
  EXPECT_FALSE(gemm_plan_from_json(nlohmann::json::parse(R"([1, 2])")));

  TempDir dir("tessera_gemm_tuner_test");
  const tk::GemmPlan p = plan(tk::GemmTile::T64x256, true, 1, 16);
  ASSERT_TRUE(tk::gemm_plan_valid(a, p));
  {
    Cache c(kGemmCacheName, kGemmCacheVersion, dir.path());
    c.put(gemm_bucket_key(kH200, a), entry(p, a.m, a.n, a.k));
  }
  Cache c(kGemmCacheName, kGemmCacheVersion, dir.path());  // a later process
  const auto got = lookup_gemm_plan(c, kH200, a);
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(got->exact);
  EXPECT_TRUE(got->plan == p);
  EXPECT_EQ(got->key, gemm_bucket_key(kH200, a));
  // Another machine (or SM count) never sees it.
  EXPECT_FALSE(lookup_gemm_plan(c, gemm_machine("NVIDIA H100 80GB HBM3", 132), a));
  EXPECT_FALSE(lookup_gemm_plan(c, gemm_machine("NVIDIA H200", 114), a));
}

TEST(GemmTuneCache, InvalidEntriesAreIgnored) {
  TempDir dir("tessera_gemm_tuner_test");
  Cache c(kGemmCacheName, kGemmCacheVersion, dir.path());
  const tk::GemmArgs a = problem(100, 600, 256);  // one 128-row tile row, 4 K blocks
  const std::string key = gemm_bucket_key(kH200, a);
  // Plans this problem cannot run: cluster 2 with one tile row, a split of
  // 4 K blocks, a tile with no such schedule; then malformed entries.
  for (const nlohmann::json& bad : {entry(plan(tk::GemmTile::T128x256, false, 2, 1), 100, 600, 256),
                                    entry(plan(tk::GemmTile::T128x128, false, 1, 2), 100, 600, 256),
                                    entry(plan(tk::GemmTile::T128x192, true, 1, 1), 100, 600, 256),
                                    nlohmann::json{{"plan", {{"tile", "128x256"}}}, {"shape", {100, 600, 256}}},
                                    nlohmann::json("128x256/c1"), nlohmann::json{{"shape", {100, 600, 256}}}}) {
    c.put(key, bad);
    EXPECT_FALSE(lookup_gemm_plan(c, kH200, a)) << bad.dump();
  }
  // Whole-K 64x64 stores the input type only: valid for bf16 -> bf16, not for f32 output.
  tk::GemmArgs f = a;
  f.out = DType::f32;
  c.put(key, entry(plan(tk::GemmTile::T64x64, true, 1, 1), 100, 600, 256));
  EXPECT_TRUE(lookup_gemm_plan(c, kH200, a));
  c.put(gemm_bucket_key(kH200, f), entry(plan(tk::GemmTile::T64x64, true, 1, 1), 100, 600, 256));
  EXPECT_FALSE(lookup_gemm_plan(c, kH200, f));
  // An invalid entry of the problem's own bucket is not replaced by a neighbour's.
  c.put(key, entry(plan(tk::GemmTile::T128x256, false, 2, 1), 100, 600, 256));
  c.put(gemm_bucket_key(kH200, problem(120, 600, 256)), entry(plan(tk::GemmTile::T64x64, true, 1, 1), 120, 600, 256));
  ASSERT_NE(gemm_bucket_key(kH200, problem(120, 600, 256)), key);
  EXPECT_FALSE(lookup_gemm_plan(c, kH200, a));
}

TEST(GemmTuneCache, NearestBucketReuse) {
  TempDir dir("tessera_gemm_tuner_test");
  Cache c(kGemmCacheName, kGemmCacheVersion, dir.path());
  const tk::GemmPlan split = plan(tk::GemmTile::T64x256, true, 1, 8);
  // Tuned at 32 x 4096 x 8192 (128 K blocks, 8 splits of 16).
  c.put(gemm_bucket_key(kH200, problem(32, 4096, 8192)), entry(split, 32, 4096, 8192));
  // 40 x 4096 x 8192: another bucket, distance ln²(1.25) ≈ 0.05: reused.
  auto got = lookup_gemm_plan(c, kH200, problem(40, 4096, 8192));
  ASSERT_TRUE(got.has_value());
  EXPECT_FALSE(got->exact);
  EXPECT_NEAR(got->distance, std::pow(std::log(1.25), 2), 1e-9);
  EXPECT_TRUE(got->plan == split);
  // K = 6016 (94 K blocks, 128-byte rows): 8 splits of 12 blocks, reused.
  got = lookup_gemm_plan(c, kH200, problem(32, 4096, 6000 + 8));
  EXPECT_FALSE(got) << "K = 6008: 16-byte rows, another alignment class";
  got = lookup_gemm_plan(c, kH200, problem(32, 4096, 6016));
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->plan.k_splits, tk::canonical_k_splits(problem(32, 4096, 6016), 8));
  // Beyond kGemmNeighbourMaxDistance (M 2.5x away): not reused.
  EXPECT_FALSE(lookup_gemm_plan(c, kH200, problem(80, 4096, 8192)));
  // A neighbour whose plan does not fit is skipped: 3 splits of K = 768
  // (12 K blocks) cannot run on K = 640 (10 K blocks: 2 splits at most).
  c.put(gemm_bucket_key(kH200, problem(32, 4096, 768)),
        entry(plan(tk::GemmTile::T128x128, false, 1, 3), 32, 4096, 768));
  EXPECT_FALSE(lookup_gemm_plan(c, kH200, problem(32, 4096, 640)));  // 10 K blocks: at most 2 splits
  // The nearest fitting entry wins over a farther one.
  c.put(gemm_bucket_key(kH200, problem(48, 4096, 8192)), entry(plan(tk::GemmTile::T64x64, true, 1, 1), 48, 4096, 8192));
  got = lookup_gemm_plan(c, kH200, problem(44, 4096, 8192));
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(got->plan == plan(tk::GemmTile::T64x64, true, 1, 1));
  // Another alignment class, layout or output type never borrows.
  tk::GemmArgs kn = problem(40, 4096, 8192);
  kn.b_layout = tk::BLayout::KN;
  EXPECT_FALSE(lookup_gemm_plan(c, kH200, kn));
  // max_distance 0: own bucket only.
  EXPECT_FALSE(lookup_gemm_plan(c, kH200, problem(40, 4096, 8192), 0.0));
}
