// Host-side tests of the GEMM engine: validation (no GPU needed: bad input is
// rejected before the device is touched), the tile heuristic, and the tile
// schedulers' permutation property.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <optional>
#include <functional>
#include <random>
#include <set>
#include <type_traits>
#include <vector>
#include <string>
#include <utility>

#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/gemm_plan.hpp"
#include "tessera/kernels/gemm/barriers.cuh"
#include "tessera/kernels/gemm/host_detail.hpp"
#include "tessera/kernels/gemm/pipeline.cuh"
#include "tessera/kernels/gemm/scheduler.cuh"
#include "tessera/ops/plan.hpp"
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

// The message of plan_gemm's tessera::Error for (a, o); empty when it plans.
std::string plan_error(const tk::GemmArgs& a, const tk::GemmOptions& o) {
  try {
    tk::plan_gemm(a, o);
  } catch (const tessera::Error& e) {
    return e.what();
  }
  return "";
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

// Issue 19's bad input: negative or overflowing sizes, misaligned pointers,
// dtype mismatch and the output's own arguments are each named before the
// device is looked at (validate() checks the device last, so on a machine
// without a GPU a good problem fails only there).
TEST(GemmValidate, RejectsEachBadArgumentBeforeTheDevice) {
  const std::pair<std::function<void(tk::GemmArgs&)>, std::string> bad[] = {
      {[](tk::GemmArgs& a) { a.m = -1; }, "M = -1 out of range [1, 2^31)"},
      {[](tk::GemmArgs& a) { a.n = -8; }, "N = -8 out of range [1, 2^31)"},
      {[](tk::GemmArgs& a) { a.k = -64; }, "K = -64 out of range [1, 2^31)"},
      {[](tk::GemmArgs& a) { a.m = int64_t{1} << 31; }, "M = 2147483648 out of range"},
      {[](tk::GemmArgs& a) { a.n = int64_t{1} << 31; }, "N = 2147483648 out of range"},
      {[](tk::GemmArgs& a) { a.k = int64_t{1} << 40; }, "K = 1099511627776 out of range"},
      {[](tk::GemmArgs& a) { a.lda = int64_t{1} << 39; }, "lda = 549755813888 elements exceeds TMA's"},
      {[](tk::GemmArgs& a) { a.ldb = int64_t{1} << 40; }, "ldb = 1099511627776 elements exceeds TMA's"},
      {[](tk::GemmArgs& a) { a.lda = -128; }, "lda = -128 must be >= K"},
      {[](tk::GemmArgs& a) { a.ldb = 120; }, "ldb = 120 must be >= 128"},
      {[](tk::GemmArgs& a) { a.b = reinterpret_cast<const void*>(0x20008); }, "B = 0x20008 is not 16-byte aligned"},
      {[](tk::GemmArgs& a) { a.a = nullptr; }, "A is null"},
      {[](tk::GemmArgs& a) { a.in = DType::f32; }, "input dtype f32 not supported (bf16 or f16)"},
      {[](tk::GemmArgs& a) { a.out = static_cast<DType>(7); }, "output dtype code 7 not supported"},
      {[](tk::GemmArgs& a) { a.d = nullptr; }, "D is null"},
      {[](tk::GemmArgs& a) { a.d = reinterpret_cast<void*>(0x30001); }, "D = 0x30001 is not aligned to its 2-byte"},
      {[](tk::GemmArgs& a) {
         a.out = DType::f32;
         a.d = reinterpret_cast<void*>(0x30002);
       },
       "D = 0x30002 is not aligned to its 4-byte elements"},
      {[](tk::GemmArgs& a) { a.ldd = 500; }, "ldd = 500 must be >= N = 512"},
      {[](tk::GemmArgs& a) { a.ldd = int64_t{1} << 40; }, "ldd = 1099511627776 must be >= N = 512 and < 2^40"},
  };
  for (const auto& [edit, want] : bad) {
    auto a = good();
    edit(a);
    const std::string e = error_of(a);
    EXPECT_NE(e.find("gemm: " + want), std::string::npos) << "want '" << want << "', got: " << e;
  }
  // An f32 output of bf16 inputs and a padded D pass the argument checks:
  // whatever fails is the device check, named as such.
  auto a = good();
  a.out = DType::f32;
  a.ldd = 520;
  const std::string e = error_of(a);
  if (!e.empty()) EXPECT_EQ(e.find("gemm: D"), std::string::npos) << e;
}

// The policy entry points (launch.cuh) check that the arguments match the
// kernel they instantiate, before the device check too.
TEST(GemmValidate, InstantiationMismatchIsNamed) {
  const auto rejected = [](const tk::GemmArgs& a, tk::BLayout l, DType in, int max_ctas) -> std::string {
    try {
      tk::detail::check_instantiation(a, l, in, max_ctas);
    } catch (const tessera::Error& e) {
      return e.what();
    }
    return "";
  };
  auto a = good();
  EXPECT_NE(rejected(a, tk::BLayout::KN, DType::bf16, 0)
                .find("args.b_layout (NK) does not match the instantiated layout (KN)"),
            std::string::npos);
  EXPECT_NE(
      rejected(a, tk::BLayout::NK, DType::f16, 0).find("args.in = bf16 does not match the instantiated input type f16"),
      std::string::npos);
  EXPECT_NE(rejected(a, tk::BLayout::NK, DType::bf16, -1).find("max_ctas = -1 must be >= 0"), std::string::npos);
  a.k = 100;  // the argument checks come first
  EXPECT_NE(rejected(a, tk::BLayout::NK, DType::bf16, 0).find("K = 100"), std::string::npos);
  a = good();
  a.a = reinterpret_cast<const void*>(0x10004);
  EXPECT_NE(rejected(a, tk::BLayout::NK, DType::bf16, 0).find("A = 0x10004 is not 16-byte aligned"), std::string::npos);
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
  o.ping_pong = true;
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
  EXPECT_FALSE(tk::GemmOptions{}.ping_pong);
}

// Every plan of the model search is reachable through explicit options: what
// the measured override relies on to run a cached plan (plan_options).
TEST(GemmPlanCandidates, EachRunsThroughItsOptionsAndOnlyValidOnesAreListed) {
  for (auto [m, n, k] : {std::array<int64_t, 3>{19, 1728, 12048}, {4096, 4096, 4096}, {100, 600, 256}, {1, 64, 8}}) {
    for (DType out : {DType::bf16, DType::f32}) {
      tk::GemmArgs a = good();
      a.m = m, a.n = n, a.k = k, a.out = out;
      const std::vector<tk::GemmPlan> c = tk::gemm_plan_candidates(a);
      ASSERT_FALSE(c.empty());
      for (const tk::GemmPlan& p : c) {
        SCOPED_TRACE(tk::plan_name(p) + " " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
        EXPECT_TRUE(tk::plan_gemm(a, tk::plan_options(p)) == p);
        EXPECT_TRUE(tk::gemm_plan_valid(a, p));
        EXPECT_EQ(p.k_splits, tk::canonical_k_splits(a, p.k_splits));
        // Output type != input type: 128x256 whole K or a split kernel only.
        if (out != a.in) EXPECT_TRUE(p.k_splits > 1 || (p.tile == tk::GemmTile::T128x256 && p.cluster_m == 1));
        // A cluster of 2 along M needs two tile rows, along N two tile columns.
        if (p.cluster_m == 2) EXPECT_GE((m + tk::tile_shape(p.tile).bm - 1) / tk::tile_shape(p.tile).bm, 2);
        if (p.cluster_n == 2) {
          EXPECT_GE((n + tk::tile_shape(p.tile).bn - 1) / tk::tile_shape(p.tile).bn, 2);
          EXPECT_GE((m + tk::tile_shape(p.tile).bm - 1) / tk::tile_shape(p.tile).bm, 2);
          EXPECT_TRUE(tk::cluster_kernel_compiled(p.tile, p.cluster_m, p.cluster_n));
        }
        EXPECT_LE(p.k_splits, std::max<int64_t>(1, std::min<int64_t>(32, (k + 63) / 64 / 4)));
      }
      // No duplicates.
      for (size_t i = 0; i < c.size(); ++i)
        for (size_t j = i + 1; j < c.size(); ++j) EXPECT_FALSE(c[i] == c[j]);
    }
  }
  tk::GemmArgs a = good();
  a.m = 100, a.n = 600, a.k = 256;  // 4 K blocks: no splits; one 128-row tile row
  tk::GemmPlan p;
  p.cluster_m = 2;
  EXPECT_FALSE(tk::gemm_plan_valid(a, p));  // 128x256/c2 with one tile row
  p = {tk::GemmTile::T128x128, false, 1, 2};
  EXPECT_FALSE(tk::gemm_plan_valid(a, p));  // 4 K blocks cannot split
  p = {tk::GemmTile::T128x192, true, 1, 1};
  EXPECT_FALSE(tk::gemm_plan_valid(a, p));  // no 128x192 ping-pong kernel
  p = {tk::GemmTile::T128x128, false, 1, 1};
  p.cluster_n = 2;
  EXPECT_FALSE(tk::gemm_plan_valid(a, p));  // along N with one tile row
  a.m = 200;
  EXPECT_FALSE(tk::gemm_plan_valid(a, p));  // the plain-only cluster kernels: not on 128-byte rows
  a.k = 264;                                // 16-byte rows
  EXPECT_TRUE(tk::gemm_plan_valid(a, p));   // 128x128 1x2: two tile rows, five tile columns
  p.cluster_m = 2;
  EXPECT_TRUE(tk::gemm_plan_valid(a, p));
  a.m = 300;  // three tile rows: a cluster along M only on 16-byte rows
  EXPECT_TRUE(tk::gemm_plan_valid(a, {tk::GemmTile::T128x256, false, 2, 1}));
  a.k = 272;  // 32-byte rows
  EXPECT_FALSE(tk::gemm_plan_valid(a, {tk::GemmTile::T128x256, false, 2, 1}));
  a.m = 400;  // four
  EXPECT_TRUE(tk::gemm_plan_valid(a, {tk::GemmTile::T128x256, false, 2, 1}));
  a.m = 100;
  a.k = 256;
  p = {tk::GemmTile::T256x128, false, 1, 1};
  p.cluster_n = 2;
  EXPECT_FALSE(tk::gemm_plan_valid(a, p));  // no 256x128 cluster along N
  p = {tk::GemmTile::T64x256, false, 1, 1};
  EXPECT_FALSE(tk::gemm_plan_valid(a, p));  // 64x256 is ping-pong only
  a.out = DType::f32;
  p = {tk::GemmTile::T64x64, true, 1, 1};
  EXPECT_FALSE(tk::gemm_plan_valid(a, p));  // whole-K 64x64 stores the input type only
  a.k = 64 * 40;                            // 40 K blocks: 10 splits at most; 7 asked run as 7 (6 blocks each)
  EXPECT_EQ(tk::canonical_k_splits(a, 7), 7);
  EXPECT_EQ(tk::canonical_k_splits(a, 9), 8);  // 5 blocks each: 8 splits
  EXPECT_EQ(tk::canonical_k_splits(a, 1000), 40);
  p = {tk::GemmTile::T128x128, false, 1, 9};
  EXPECT_FALSE(tk::gemm_plan_valid(a, p));  // not a canonical count
  p.k_splits = 8;
  EXPECT_TRUE(tk::gemm_plan_valid(a, p));
}

namespace {
int g_lookups = 0;
std::optional<tk::GemmPlan> counting_lookup(const tk::GemmArgs&, int) {
  ++g_lookups;
  return tk::GemmPlan{tk::GemmTile::T128x128, false, 1, 2};
}
}  // namespace

// The plain-only cluster kernels (cluster_kernel_compiled) as explicit
// options: each compiled one plans as named, and whatever none compiles is
// rejected by plan_gemm (before launch) with a message naming the options.
TEST(GemmPlanCandidates, ClusterOptionsPlanOrFailBeforeLaunch) {
  tk::GemmArgs a = good();
  a.m = 600, a.n = 2000, a.k = 1000;
  for (tk::GemmTile t : {tk::GemmTile::T128x128, tk::GemmTile::T128x256, tk::GemmTile::T128x192, tk::GemmTile::T256x128,
                         tk::GemmTile::T64x256, tk::GemmTile::T64x64})
    for (int cm : {0, 1, 2})
      for (int cn : {0, 1, 2}) {
        if (cn < 2 && !(t == tk::GemmTile::T128x128 && cm == 2)) continue;  // the existing paths
        tk::GemmOptions o;
        o.tile = t;
        o.cluster_m = cm;
        o.cluster_n = cn;
        SCOPED_TRACE(tk::tile_name(t) + " " + std::to_string(cm) + "x" + std::to_string(cn));
        if (tk::cluster_kernel_compiled(t, std::max(1, cm), std::max(1, cn))) {
          const tk::GemmPlan p = tk::plan_gemm(a, o);
          EXPECT_EQ(p.tile, t);
          EXPECT_EQ(p.cluster_m, std::max(1, cm));
          EXPECT_EQ(p.cluster_n, std::max(1, cn));
          EXPECT_TRUE(tk::gemm_plan_valid(a, p)) << tk::plan_name(p);
          EXPECT_TRUE(tk::plan_gemm(a, tk::plan_options(p)) == p);
        } else {
          EXPECT_NE(plan_error(a, o).find("cluster kernel for tile"), std::string::npos) << plan_error(a, o);
        }
      }
  tk::GemmOptions o;
  o.tile = tk::GemmTile::T128x128;
  o.cluster_n = 2;
  auto fails = [&](const char* what, auto change) {
    tk::GemmOptions b = o;
    tk::GemmArgs x = a;
    change(b, x);
    EXPECT_NE(plan_error(x, b).find(what), std::string::npos) << what << ": " << plan_error(x, b);
  };
  fails("cluster_n = 3", [](tk::GemmOptions& b, tk::GemmArgs&) { b.cluster_n = 3; });
  fails("cluster_n = 2", [](tk::GemmOptions& b, tk::GemmArgs&) { b.k_splits = 2; });
  fails("cluster_n = 2", [](tk::GemmOptions& b, tk::GemmArgs&) { b.stream_k = true; });
  fails("cluster_n = 2", [](tk::GemmOptions& b, tk::GemmArgs&) {
    b.swap_ab = true;
    b.tile = tk::GemmTile::T128x32;
  });
  fails("ping_pong", [](tk::GemmOptions& b, tk::GemmArgs&) { b.ping_pong = true; });
  fails("output type == input type", [](tk::GemmOptions&, tk::GemmArgs& x) { x.out = DType::f32; });
  fails("no 1x2 cluster kernel for tile auto", [](tk::GemmOptions& b, tk::GemmArgs&) { b.tile = tk::GemmTile::Auto; });
}

// gemm(args, options, stream) is the one entry point: the plan source
// (Default, Model, Tuned: the measured override) applies only where the
// options name no plan, so every option combination that names one keeps
// the plan plan_gemm() names for it, whatever the source. Host only: these
// combinations plan without a device query.
TEST(GemmEntry, PlanSourceKeepsThePlansOptionsName) {
  tk::set_gemm_plan_lookup(nullptr);
  tk::GemmArgs a = good();
  a.m = a.n = a.k = 4096;
  a.lda = a.ldb = a.ldd = 0;
  struct Combo {
    DType out;
    tk::GemmTile tile;
    bool ping_pong;
    int cluster_m, k_splits, max_ctas;
    const char* plan;
    int cluster_n = 0;
  };
  const Combo combos[] = {
      {DType::bf16, tk::GemmTile::T128x256, false, 0, 0, 0, "128x256/c1"},
      {DType::bf16, tk::GemmTile::T128x256, false, 2, 0, 0, "128x256/c2"},
      {DType::bf16, tk::GemmTile::T256x128, false, 2, 0, 0, "256x128/c2"},
      {DType::bf16, tk::GemmTile::T256x128, false, 1, 0, 66, "256x128/c1"},
      {DType::bf16, tk::GemmTile::T128x128, false, 2, 0, 0, "128x128/c2"},
      {DType::bf16, tk::GemmTile::T128x128, false, 0, 0, 0, "128x128/c1x2", 2},
      {DType::bf16, tk::GemmTile::T128x256, false, 2, 0, 0, "128x256/c2x2", 2},
      {DType::bf16, tk::GemmTile::T128x192, false, 1, 0, 0, "128x192/c1x2", 2},
      {DType::bf16, tk::GemmTile::Auto, true, 0, 0, 0, "128x128/pp"},
      {DType::bf16, tk::GemmTile::T64x256, true, 1, 0, 0, "64x256/pp"},
      {DType::bf16, tk::GemmTile::T64x64, false, 0, 0, 0, "64x64/pp"},
      {DType::bf16, tk::GemmTile::T128x192, false, 0, 0, 0, "128x192/c1"},
      {DType::bf16, tk::GemmTile::T128x256, false, 0, 1, 0, "128x256/c1"},
      {DType::bf16, tk::GemmTile::Auto, false, 0, 4, 0, "128x128/c1/k4"},
      {DType::bf16, tk::GemmTile::Auto, true, 0, 4, 0, "64x256/pp/k4"},
      {DType::bf16, tk::GemmTile::T64x64, false, 0, 3, 0, "64x64/pp/k3"},
      {DType::f32, tk::GemmTile::T128x256, false, 0, 0, 0, "128x256/c1"},
      {DType::f32, tk::GemmTile::Auto, false, 0, 2, 0, "128x128/c1/k2"},
  };
  g_lookups = 0;
  for (const bool installed : {false, true}) {
    tk::set_gemm_plan_lookup(installed ? counting_lookup : nullptr);
    for (const Combo& c : combos) {
      a.out = c.out;
      tk::GemmOptions o;
      o.tile = c.tile;
      o.ping_pong = c.ping_pong;
      o.cluster_m = c.cluster_m;
      o.cluster_n = c.cluster_n;
      o.k_splits = c.k_splits;
      o.max_ctas = c.max_ctas;
      o.raster_along_m = true;
      SCOPED_TRACE(std::string(c.plan) + (installed ? " (source installed)" : ""));
      EXPECT_EQ(tk::plan_name(tk::plan_gemm(a, o)), c.plan);
      for (tk::GemmPlanSource src :
           {tk::GemmPlanSource::Default, tk::GemmPlanSource::Model, tk::GemmPlanSource::Tuned}) {
        o.plan_source = src;
        const tk::GemmOptions r = tk::resolve_options(a, o);
        EXPECT_EQ(r.plan_source, tk::GemmPlanSource::Model);
        EXPECT_EQ(r.tile, o.tile);
        EXPECT_EQ(r.ping_pong, o.ping_pong);
        EXPECT_EQ(r.cluster_m, o.cluster_m);
        EXPECT_EQ(r.cluster_n, o.cluster_n);
        EXPECT_EQ(r.k_splits, o.k_splits);
        EXPECT_EQ(r.max_ctas, o.max_ctas);
        EXPECT_TRUE(r.raster_along_m);
        EXPECT_EQ(tk::plan_name(tk::plan_gemm(a, r)), c.plan);
        EXPECT_EQ(tk::plan_name(tk::plan_gemm(a, o)), c.plan);  // plan_gemm does not read plan_source
      }
    }
  }
  EXPECT_EQ(g_lookups, 0);  // options that name a plan never ask the source

  // Naming only k_splits = 1 (whole K) names a plan too: no lookup.
  a.out = DType::bf16;
  tk::GemmOptions whole;
  whole.k_splits = 1;
  whole.plan_source = tk::GemmPlanSource::Tuned;
  EXPECT_EQ(tk::resolve_options(a, whole).tile, tk::GemmTile::Auto);
  EXPECT_EQ(tk::resolve_options(a, whole).k_splits, 1);
  EXPECT_EQ(g_lookups, 0);

  // Nothing named: Model returns the options as given, Tuned without a
  // source is an Error that says how to install one (no device touched).
  tk::set_gemm_plan_lookup(nullptr);
  tk::GemmOptions none;
  none.plan_source = tk::GemmPlanSource::Model;
  none.max_ctas = 7;
  const tk::GemmOptions r = tk::resolve_options(a, none);
  EXPECT_EQ(r.tile, tk::GemmTile::Auto);
  EXPECT_FALSE(r.ping_pong);
  EXPECT_EQ(r.cluster_m, 0);
  EXPECT_EQ(r.k_splits, 0);
  EXPECT_EQ(r.max_ctas, 7);
  none.plan_source = tk::GemmPlanSource::Tuned;
  try {
    tk::resolve_options(a, none);
    ADD_FAILURE() << "Tuned without a source must throw";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("install_gemm_tuned_plans"), std::string::npos) << e.what();
  }
  const char* env = std::getenv("TESSERA_GEMM_TUNED");
  if (!env || std::string(env) != "1") {
    none.plan_source = tk::GemmPlanSource::Default;
    EXPECT_EQ(tk::resolve_options(a, none).tile, tk::GemmTile::Auto);
  }
  none.plan_source = static_cast<tk::GemmPlanSource>(7);
  try {
    tk::resolve_options(a, none);
    ADD_FAILURE() << "an unknown plan_source must throw";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan_source"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tk::GemmOptions{}.plan_source, tk::GemmPlanSource::Default);
}

TEST(GemmHeuristic, ModelSplitsSmallMLongKAndPrefersClustersForMisalignedRows) {
  tk::GemmArgs a = good();
  a.m = 19;
  a.n = 1728;
  a.k = 12048;
  a.lda = a.ldb = 0;
  tk::GemmPlan whole, split;
  whole.tile = split.tile = tk::GemmTile::T64x256;
  whole.ping_pong = split.ping_pong = true;
  split.k_splits = 16;
  EXPECT_LT(tk::model_gemm_us(a, 132, split), 0.5 * tk::model_gemm_us(a, 132, whole));
  // K = 8200: rows 16-byte aligned only; multicast of B halves each SM's loads.
  a.m = a.n = 8192;
  a.k = 8200;
  EXPECT_EQ(tk::row_alignment(a), 16);
  tk::GemmPlan c1, c2;
  c2.cluster_m = 2;
  EXPECT_LT(tk::model_gemm_us(a, 132, c2), tk::model_gemm_us(a, 132, c1));
  a.k = 8192;
  EXPECT_EQ(tk::row_alignment(a), 128);
  EXPECT_EQ(tk::plan_name(split), "64x256/pp/k16");
}

// M <= 32 with B as [N, K]: the search takes only the 64x64 and swapped
// plans; where the 64x64 tile would stream large weights (many tiles,
// large B) the swapped 128x32 tile is chosen, split or not, where B is
// small, or N so small that the swapped tile needs many splits, the 64x64
// tile stays. Shapes from the --diag timings and the A/B in
// docs/design/gemm.md ("Small M: swapped operands"): 20 x 2800 x 2928
// moves from 64x64 k2 to 128x32 k3 as 23 x 2384 x 2984 did (0.84x the time).
TEST(GemmHeuristic, TinyMChoosesBetween64x64AndSwappedTiles) {
  tk::GemmArgs a = good();
  a.lda = a.ldb = 0;
  const struct {
    int64_t m, n, k;
    bool swap;
  } cases[] = {{22, 14928, 5040, true}, {19, 8328, 2384, true}, {23, 6536, 4640, true},  {20, 2800, 2928, true},
               {25, 1400, 1200, false}, {29, 2160, 568, false}, {18, 1168, 5568, false}, {28, 1232, 8680, false}};
  for (const auto& c : cases) {
    a.m = c.m;
    a.n = c.n;
    a.k = c.k;
    ASSERT_TRUE(tk::tiny_m_problem(a));
    const tk::GemmPlan p = tk::model_plan(a, 132, true);
    const std::string what =
        std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) + ": " + tk::plan_name(p);
    EXPECT_EQ(p.swap_ab, c.swap) << what;
    EXPECT_TRUE(p.swap_ab || p.tile == tk::GemmTile::T64x64) << what;
  }
  // No 64x64 or swapped candidate (f32 output without splits, whose
  // kernels store the input type only): the search takes every plan.
  a.m = 16;
  a.out = tessera::DType::f32;
  const tk::GemmPlan f32_whole_k = tk::model_plan(a, 132, false);
  EXPECT_TRUE(tk::gemm_plan_valid(a, f32_whole_k)) << tk::plan_name(f32_whole_k);
  EXPECT_EQ(f32_whole_k.k_splits, 1) << tk::plan_name(f32_whole_k);
  a.out = tessera::DType::bf16;
  a.m = 33;  // past kTinyM: every candidate again
  EXPECT_FALSE(tk::tiny_m_problem(a));
  a.m = 16;
  a.b_layout = tk::BLayout::KN;  // no swapped tiles for B as [K, N]
  EXPECT_FALSE(tk::tiny_m_problem(a));
}

TEST(GemmHeuristic, PlainPingPongOnlyBelowTheSizeSplit) {
  tk::GemmArgs a = good();
  a.m = 8192;
  a.n = 5504;
  a.k = 4096;  // 1.8e11 multiply-adds: ping-pong
  tk::GemmOptions o;
  EXPECT_TRUE(tk::plain_uses_ping_pong(a, o));
  a.n = 7168;  // 2.4e11
  EXPECT_TRUE(tk::plain_uses_ping_pong(a, o));
  a.n = 8192;
  a.k = 8192;  // 5.5e11: cooperative (ping-pong is 1.026x cuBLASLt there at boost clocks)
  EXPECT_FALSE(tk::plain_uses_ping_pong(a, o));
  a.n = 4608;
  a.k = 18432;  // 7.0e11
  EXPECT_FALSE(tk::plain_uses_ping_pong(a, o));
  a.n = 5504;
  a.k = 4096;
  o.tile = tk::GemmTile::T128x256;  // an explicit tile is honoured
  EXPECT_FALSE(tk::plain_uses_ping_pong(a, o));
  o.tile = tk::GemmTile::Auto;
  o.cluster_m = 2;  // clusters exist only in the cooperative kernel
  EXPECT_FALSE(tk::plain_uses_ping_pong(a, o));
  o.cluster_m = 0;
  a.out = tessera::DType::f32;  // ping-pong is compiled for out == in only
  EXPECT_FALSE(tk::plain_uses_ping_pong(a, o));
}

// 64x64 ping-pong (small M): the model prefers it to 128-column tiles where
// M <= 64 and B's loads bound the time; explicit options reach it for the
// plain gemm() only (whole K for out == in, or split-K), and the policy
// entry points (resolve_tile) reject it.
TEST(GemmHeuristic, SmallMTile64x64InModelAndOptions) {
  tk::GemmArgs a = good();
  a.m = 24;
  a.n = 992;
  a.k = 536;
  a.lda = a.ldb = 0;
  EXPECT_EQ(tk::tile_shape(tk::GemmTile::T64x64).bm, 64);
  EXPECT_EQ(tk::tile_shape(tk::GemmTile::T64x64).bn, 64);
  EXPECT_EQ(tk::tile_name(tk::GemmTile::T64x64), "64x64");
  tk::GemmPlan small, wide;
  small.tile = tk::GemmTile::T64x64;
  small.ping_pong = true;
  wide.tile = tk::GemmTile::T128x128;
  EXPECT_LT(tk::model_gemm_us(a, 132, small), tk::model_gemm_us(a, 132, wide));
  EXPECT_EQ(tk::plan_name(small), "64x64/pp");

  tk::GemmOptions o;
  o.tile = tk::GemmTile::T64x64;
  tk::GemmPlan p = tk::plan_gemm(a, o);
  EXPECT_EQ(p.tile, tk::GemmTile::T64x64);
  EXPECT_TRUE(p.ping_pong);
  EXPECT_EQ(p.k_splits, 1);
  o.k_splits = 3;
  p = tk::plan_gemm(a, o);
  EXPECT_EQ(tk::plan_name(p), "64x64/pp/k3");
  a.out = tessera::DType::f32;  // split-K stores f32 partials: any output type
  EXPECT_EQ(tk::plan_name(tk::plan_gemm(a, o)), "64x64/pp/k3");
  o.k_splits = 0;  // whole K stores the input type only
  EXPECT_THROW(tk::plan_gemm(a, o), tessera::Error);
  a.out = tessera::DType::bf16;
  o.cluster_m = 2;
  EXPECT_THROW(tk::plan_gemm(a, o), tessera::Error);
  o.cluster_m = 0;
  EXPECT_THROW(tk::resolve_tile(a, o), tessera::Error);
  o.ping_pong = true;
  EXPECT_THROW(tk::resolve_tile(a, o), tessera::Error);
}

// 128x192 cooperative: explicit options reach it for the plain gemm() only
// (whole K, no clusters, no ping-pong, output type == input type); the
// policy entry points (resolve_tile) reject it.
TEST(GemmHeuristic, Tile128x192Options) {
  tk::GemmArgs a = good();
  a.m = 4428;
  a.n = 552;
  a.k = 864;
  a.lda = a.ldb = 0;
  EXPECT_EQ(tk::tile_shape(tk::GemmTile::T128x192).bm, 128);
  EXPECT_EQ(tk::tile_shape(tk::GemmTile::T128x192).bn, 192);
  EXPECT_EQ(tk::tile_name(tk::GemmTile::T128x192), "128x192");
  tk::GemmOptions o;
  o.tile = tk::GemmTile::T128x192;
  const tk::GemmPlan p = tk::plan_gemm(a, o);
  EXPECT_EQ(p.tile, tk::GemmTile::T128x192);
  EXPECT_FALSE(p.ping_pong);
  EXPECT_EQ(p.cluster_m, 1);
  EXPECT_EQ(p.k_splits, 1);
  EXPECT_EQ(tk::plan_name(p), "128x192/c1");
  EXPECT_THROW(tk::resolve_tile(a, o), tessera::Error);
  o.k_splits = 2;
  EXPECT_THROW(tk::plan_gemm(a, o), tessera::Error);
  o.k_splits = 0;
  o.cluster_m = 2;
  EXPECT_THROW(tk::plan_gemm(a, o), tessera::Error);
  o.cluster_m = 0;
  o.ping_pong = true;
  EXPECT_THROW(tk::plan_gemm(a, o), tessera::Error);
  o.ping_pong = false;
  a.out = tessera::DType::f32;
  EXPECT_THROW(tk::plan_gemm(a, o), tessera::Error);
}

// Stream-K: a candidate of the model search for output type == input type
// only, and never when splits are off (k_splits = 1 means K in one order
// per tile); the model picks it where few, long tiles leave SMs idle in
// every data-parallel plan (513 x 7920 x 9168: 155 tiles of 128x256 on 132
// SMs, measured 0.89x the fastest other compiled kernel) and not where
// whole waves fit (4096 x 4096 x 4096 aligned), nor where its schedule's
// indices would overflow.
TEST(GemmHeuristic, StreamKCandidatesAndChoice) {
  auto has_sk = [](const std::vector<tk::GemmPlan>& c) {
    for (const tk::GemmPlan& p : c)
      if (p.stream_k) {
        EXPECT_TRUE(p.tile == tk::GemmTile::T128x256 || p.tile == tk::GemmTile::T128x128);
        EXPECT_TRUE(!p.ping_pong && p.cluster_m == 1 && p.k_splits == 1 && !p.swap_ab);
        return true;
      }
    return false;
  };
  tk::GemmArgs a = good();
  a.m = 513, a.n = 7920, a.k = 9168, a.lda = a.ldb = a.ldd = 0;
  EXPECT_TRUE(has_sk(tk::gemm_plan_candidates(a)));
  EXPECT_TRUE(tk::model_plan(a, 132, true).stream_k);
  EXPECT_FALSE(tk::model_plan(a, 132, false).stream_k);
  tk::GemmArgs f32 = a;
  f32.out = DType::f32;
  EXPECT_FALSE(has_sk(tk::gemm_plan_candidates(f32)));
  tk::GemmArgs big = a;
  big.m = big.n = big.k = 4096;
  EXPECT_FALSE(tk::model_plan(big, 132, true).stream_k);
  // Past the schedule's int indices ((tiles + 1) x K blocks >= 2^31) it is
  // no candidate (the launch would reject it).
  tk::GemmArgs huge = a;
  huge.m = huge.n = int64_t{1} << 20;
  huge.k = int64_t{1} << 16;
  EXPECT_FALSE(has_sk(tk::gemm_plan_candidates(huge)));
  EXPECT_FALSE(tk::model_plan(huge, 132, true).stream_k);
}

// The host-only planning entry points agree with each other: the ranking
// lists every candidate once, cheapest first, and its first plan is the
// model's choice; default_plan() takes the benchmark shapes' rule exactly
// where legacy_rule_applies() says so.
TEST(GemmPlanCandidates, EstimatesRankTheModelsChoiceFirst) {
  for (auto [m, n, k] : {std::array<int64_t, 3>{448, 2816, 10752},
                         {20, 5336, 3192},
                         {8192, 8192, 8192},
                         {1, 64, 8},
                         {3000, 900, 4104}}) {
    tk::GemmArgs a = good();
    a.m = m, a.n = n, a.k = k, a.lda = a.ldb = a.ldd = 0;
    SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
    const std::vector<tk::GemmPlanEstimate> r = tk::gemm_plan_estimates(a, 132);
    EXPECT_EQ(r.size(), tk::gemm_plan_candidates(a).size());
    for (size_t i = 1; i < r.size(); ++i) EXPECT_LE(r[i - 1].us, r[i].us);
    ASSERT_FALSE(r.empty());
    EXPECT_TRUE(r.front().plan == tk::model_plan(a, 132, true));
    const tk::GemmPlan d = tk::default_plan(a, 132, true);
    if (tk::legacy_rule_applies(a, 132))
      EXPECT_FALSE(d.stream_k || d.k_splits > 1 || d.swap_ab);
    else
      EXPECT_TRUE(d == tk::model_plan(a, 132, true));
  }
  tk::GemmArgs a = good();
  a.m = a.n = a.k = 8192;
  EXPECT_TRUE(tk::legacy_rule_applies(a, 132));
  a.k = 8200;  // rows 16-byte aligned: the model
  EXPECT_FALSE(tk::legacy_rule_applies(a, 132));
  EXPECT_THROW(tk::gemm_plan_estimates(a, 0), tessera::Error);
  EXPECT_THROW(tk::default_plan(a, 0, true), tessera::Error);
}

// Swapped operands: the model search lists the swapped tiles for B [N,K]
// and M <= kSwapMaxM only; explicit swap_ab resolves Auto to the narrowest
// tile holding M and rejects what the swapped kernels do not compile.
TEST(GemmHeuristic, SwapAbOptionsAndCandidates) {
  auto has_swap = [](const tk::GemmArgs& a) {
    for (const tk::GemmPlan& p : tk::gemm_plan_candidates(a))
      if (p.swap_ab) {
        EXPECT_TRUE(tk::is_swap_tile(p.tile));
        return true;
      }
    return false;
  };
  tk::GemmArgs a = good();
  a.n = 4096;
  a.k = 2048;
  a.lda = a.ldb = 0;
  a.m = tk::kSwapMaxM;
  EXPECT_TRUE(has_swap(a));
  a.m = tk::kSwapMaxM + 1;
  EXPECT_FALSE(has_swap(a));
  a.m = 40;
  a.b_layout = tk::BLayout::KN;
  EXPECT_FALSE(has_swap(a));
  a.b_layout = tk::BLayout::NK;
  tk::GemmOptions o;
  o.swap_ab = true;
  for (auto [m, t] : {std::pair<int64_t, tk::GemmTile>{1, tk::GemmTile::T128x32},
                      {32, tk::GemmTile::T128x32},
                      {33, tk::GemmTile::T128x64},
                      {64, tk::GemmTile::T128x64},
                      {65, tk::GemmTile::T128x96},
                      {1000, tk::GemmTile::T128x96}}) {
    a.m = m;
    const tk::GemmPlan p = tk::plan_gemm(a, o);
    EXPECT_EQ(p.tile, t) << m;
    EXPECT_TRUE(p.swap_ab);
    EXPECT_EQ(p.k_splits, 1);
  }
  a.m = 40;
  o.tile = tk::GemmTile::T128x96;
  o.k_splits = 3;
  EXPECT_EQ(tk::plan_name(tk::plan_gemm(a, o)), "128x96/c1/k3/swap");
  EXPECT_EQ(tk::tile_shape(tk::GemmTile::T128x32).bn, 32);
  EXPECT_THROW(tk::resolve_tile(a, o), tessera::Error);  // not a policy entry point tile
  o.tile = tk::GemmTile::T128x256;
  EXPECT_THROW(tk::plan_gemm(a, o), tessera::Error);
  o.tile = tk::GemmTile::Auto;
  o.cluster_m = 2;
  EXPECT_THROW(tk::plan_gemm(a, o), tessera::Error);
  o.cluster_m = 0;
  o.ping_pong = true;
  EXPECT_THROW(tk::plan_gemm(a, o), tessera::Error);
  o.ping_pong = false;
  o.stream_k = true;
  EXPECT_THROW(tk::plan_gemm(a, o), tessera::Error);
  o.stream_k = false;
  o.k_splits = 0;
  a.out = tessera::DType::f32;
  EXPECT_THROW(tk::plan_gemm(a, o), tessera::Error);  // whole K stores the input type only
  o.k_splits = 2;
  EXPECT_TRUE(tk::plan_gemm(a, o).swap_ab);
  a.out = a.in;
  a.b_layout = tk::BLayout::KN;
  EXPECT_THROW(tk::plan_gemm(a, o), tessera::Error);
  tk::GemmOptions unswapped;
  unswapped.tile = tk::GemmTile::T128x64;
  a.b_layout = tk::BLayout::NK;
  EXPECT_THROW(tk::plan_gemm(a, unswapped), tessera::Error);
  // The model search's cache keeps the layouts apart: a decode shape whose
  // [N,K] plan is swapped, then the same shape with B [K,N] (no swapped
  // tiles), then [N,K] again.
  a.m = 78, a.n = 9744, a.k = 2536;  // 128x96/swap in the seed 12 sweep
  const tk::GemmPlan nk = tk::model_plan(a, 132, true);
  EXPECT_TRUE(nk.swap_ab) << tk::plan_name(nk);
  a.b_layout = tk::BLayout::KN;
  EXPECT_FALSE(tk::model_plan(a, 132, true).swap_ab);
  a.b_layout = tk::BLayout::NK;
  EXPECT_TRUE(tk::model_plan(a, 132, true) == nk);
}

// The fitted model on three shapes of the --diag sweep where the measured
// best kernel is a tile the plan did not consider before: 64x64 for a small
// M above 64, 128x192 for N = 552 and for a 1.4-wave problem (data in
// bench/results/gemm-random-2026-11-26.json).
TEST(GemmHeuristic, ModelPrefersTheMeasuredBestTile) {
  auto plan = [](tk::GemmTile t, bool pp, int cluster) {
    tk::GemmPlan p;
    p.tile = t;
    p.ping_pong = pp;
    p.cluster_m = cluster;
    return p;
  };
  const tk::GemmPlan c256 = plan(tk::GemmTile::T128x256, false, 1), c128 = plan(tk::GemmTile::T128x128, false, 1),
                     pp64 = plan(tk::GemmTile::T64x64, true, 1), c192 = plan(tk::GemmTile::T128x192, false, 1);
  tk::GemmArgs a = good();
  a.lda = a.ldb = 0;
  a.m = 196, a.n = 536, a.k = 840;  // 128x128: 1.81x cuBLASLt, 64x64: 1.23x
  EXPECT_LT(tk::model_gemm_us(a, 132, pp64), tk::model_gemm_us(a, 132, c128));
  a.m = 4428, a.n = 552, a.k = 864;  // 128x256: 1.54x, 128x192: 1.12x
  EXPECT_LT(tk::model_gemm_us(a, 132, c192), tk::model_gemm_us(a, 132, c256));
  EXPECT_LT(tk::model_gemm_us(a, 132, c192), tk::model_gemm_us(a, 132, c128));
  a.m = 1793, a.n = 3216, a.k = 7776;  // 128x128: 1.27x, 128x192: 1.07x
  EXPECT_LT(tk::model_gemm_us(a, 132, c192), tk::model_gemm_us(a, 132, c128));
  EXPECT_LT(tk::model_gemm_us(a, 132, c192), tk::model_gemm_us(a, 132, c256));
  EXPECT_EQ(tk::plan_name(c192), "128x192/c1");
  // Rows aligned to 16 bytes only (bench/results/gemm-clusters-2026-11-29.json,
  // seed 18): a 2x2 cluster shares both operands, 1.17x cuBLASLt where the
  // best tile without a cluster measured 1.59x (128x192); on a large
  // 64-byte-aligned problem (seed 19) 128x256 alone stays ahead (1.03x
  // against 1.20x for 128x128 with a cluster).
  tk::GemmPlan c128x2x2 = plan(tk::GemmTile::T128x128, false, 2);
  c128x2x2.cluster_n = 2;
  a.m = 458, a.n = 3832, a.k = 4264;
  EXPECT_LT(tk::model_gemm_us(a, 132, c128x2x2), tk::model_gemm_us(a, 132, c192));
  EXPECT_LT(tk::model_gemm_us(a, 132, c128x2x2), tk::model_gemm_us(a, 132, c128));
  EXPECT_EQ(tk::plan_name(c128x2x2), "128x128/c2x2");
  a.m = 9176, a.n = 8400, a.k = 7008;
  EXPECT_LT(tk::model_gemm_us(a, 132, c256), tk::model_gemm_us(a, 132, c128x2x2));
  EXPECT_LT(tk::model_gemm_us(a, 132, c256), tk::model_gemm_us(a, 132, plan(tk::GemmTile::T128x128, false, 2)));
}

// A host model of the ping-pong ring protocol of kernel_ping_pong.cuh (producer fills
// ring indices in order; consumer c takes tiles c, c+2, ...; parity waits on
// full/empty mbarriers; order barriers between the consumers' main loops),
// run under random interleavings: every full-wait that passes must see the
// fill of exactly the ring index the consumer expects, and nothing deadlocks.
// It checks the argument in kernel_ping_pong.cuh, not the device code itself.
TEST(GemmPingPongModel, ParityWaitsSeeTheirOwnFill) {
  std::mt19937_64 rng(12345);
  for (int stages : {2, 5, 7})
    for (int k_blocks : {1, 2, 3, 4, 5, 7, 16})
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

// Stream-K: the CTAs' walks (StreamKWalk, as the kernel runs them) cover
// every K block of every tile once; the data-parallel head is whole waves
// of whole tiles and leaves one to two waves (or every tile) to stream-K;
// unit_of() names the CTA holding a stream-K iteration; a split tile's
// segment ending at its last K block is walked by last_unit() and is that
// CTA's last segment; every other partial segment (a contribution) is the
// only one of its CTA, which lies in [first_unit(), last_unit()); split()
// holds exactly for the stream-K tiles more than one CTA works on; with
// fewer tiles than CTAs each CTA runs at least min_blocks K blocks (where
// there are that many); position() permutes the stream-K tiles. The
// kernel's in-place reduction relies on each.
TEST(GemmScheduler, StreamKWalksCoverEveryBlockOnce) {
  for (int tiles_m : {1, 3, 9, 40})
    for (int tiles_n : {1, 5, 22})
      for (int kb : {1, 2, 7, 73})
        for (int units : {1, 2, 7, 131, 132, 1000})
          for (int min_blocks : {1, 8}) {
            const auto s = tk::engine::StreamKScheduler::make({}, tiles_m, tiles_n, kb, units, min_blocks);
            SCOPED_TRACE(std::to_string(tiles_m) + "x" + std::to_string(tiles_n) + " kb " + std::to_string(kb) +
                         " units " + std::to_string(units) + " min " + std::to_string(min_blocks));
            const int tiles = tiles_m * tiles_n;
            const int64_t all = int64_t{tiles} * kb;
            ASSERT_GE(s.units, 1);
            ASSERT_LE(s.units, std::min<int64_t>(units, all));
            if (tiles < units && all >= int64_t{min_blocks} * units) EXPECT_GE(all / s.units, min_blocks);
            ASSERT_EQ(s.dp_tiles % s.units, 0);
            const int sk_tiles = tiles - s.dp_tiles;
            if (tiles >= s.units) {
              EXPECT_GE(sk_tiles, s.units);
              EXPECT_LT(sk_tiles, 2 * s.units);
            } else {
              EXPECT_EQ(s.dp_tiles, 0);
            }
            ASSERT_EQ(s.iters, int64_t{sk_tiles} * kb);
            ASSERT_EQ(s.begin(0), 0);
            ASSERT_EQ(s.begin(s.units), s.iters);
            std::vector<int> covered(static_cast<size_t>(all), 0);
            std::vector<std::set<int>> ctas_of_tile(static_cast<size_t>(sk_tiles));
            for (int b = 0; b < s.units; ++b) {
              ASSERT_LT(s.begin(b), s.begin(b + 1));  // every CTA has stream-K work
              for (int64_t it = s.begin(b); it < s.begin(b + 1); ++it) ASSERT_EQ(s.unit_of(it), b);
              int contributions = 0;
              bool reduced = false;  // this CTA walked a tile's reduced end
              const tk::engine::StreamKWalk walk(s, b);
              for (int i = 0; i < walk.count; ++i) {
                const tk::engine::StreamKSegment g = walk.at(s, i);
                ASSERT_TRUE(g.tile >= 0 && g.tile < tiles && 0 <= g.k0 && g.k0 < g.k1 && g.k1 <= kb);
                EXPECT_FALSE(reduced) << "CTA " << b << ": the reduced segment is not its last";
                for (int k = g.k0; k < g.k1; ++k) ++covered[static_cast<size_t>(int64_t{g.tile} * kb + k)];
                if (g.tile < s.dp_tiles) {
                  EXPECT_TRUE(g.k0 == 0 && g.k1 == kb);
                  EXPECT_EQ(g.position, g.tile);
                  continue;
                }
                const int local = g.tile - s.dp_tiles;
                EXPECT_EQ(g.position, s.dp_tiles + s.position(local)) << "CTA " << b << " tile " << local;
                ctas_of_tile[static_cast<size_t>(local)].insert(b);
                if (g.k0 == 0 && g.k1 == kb) continue;
                if (g.k1 == kb) {
                  EXPECT_EQ(b, s.last_unit(local));
                  EXPECT_LT(s.first_unit(local), b);
                  EXPECT_EQ(g.lo, s.first_unit(local));
                  reduced = true;
                } else {
                  ++contributions;
                  EXPECT_GE(b, s.first_unit(local));
                  EXPECT_LT(b, s.last_unit(local));
                }
              }
              EXPECT_LE(contributions, 1) << "CTA " << b;
            }
            for (int c : covered) ASSERT_EQ(c, 1);
            std::vector<int> at_position(static_cast<size_t>(sk_tiles), 0);  // position(): a permutation
            for (int t = 0; t < sk_tiles; ++t) {
              const int pos = s.position(t);
              ASSERT_TRUE(pos >= 0 && pos < sk_tiles) << "tile " << t << " position " << pos;
              ++at_position[static_cast<size_t>(pos)];
            }
            for (int c : at_position) ASSERT_EQ(c, 1);
            bool any = false;
            for (int t = 0; t < sk_tiles; ++t) {
              EXPECT_EQ(s.split(t), ctas_of_tile[static_cast<size_t>(t)].size() > 1);
              any = any || s.split(t);
            }
            EXPECT_EQ(s.any_split(), any);
          }
}

// Stream-K keeps its CTAs in K step (docs/design/gemm.md: CTAs sharing a
// panel at different K offsets re-read it from DRAM). Each CTA's segments
// run back to back, one K block per step; where every CTA's range holds a
// tile start, the offset (K block - step) mod k_blocks takes at most three
// values over all CTAs and steps: 0, and k_blocks - range length for the
// deferred segment, the length varying by one between ranges. The tiles
// the CTAs start at the same step are at positions j * units + b.
TEST(GemmScheduler, StreamKCtasStreamKInStep) {
  int checked = 0;
  for (int tiles_m : {3, 9, 40})
    for (int tiles_n : {5, 22})
      for (int kb : {7, 64, 73})
        for (int units : {7, 131, 132}) {
          const auto s = tk::engine::StreamKScheduler::make({}, tiles_m, tiles_n, kb, units, 8);
          SCOPED_TRACE(std::to_string(tiles_m) + "x" + std::to_string(tiles_n) + " kb " + std::to_string(kb) +
                       " units " + std::to_string(units));
          bool every_range_starts_a_tile = true;
          for (int b = 0; b < s.units; ++b)
            every_range_starts_a_tile = every_range_starts_a_tile && tk::engine::StreamKWalk(s, b).starts > 0;
          if (!every_range_starts_a_tile) continue;
          ++checked;
          std::set<int> offsets;
          for (int b = 0; b < s.units; ++b) {
            const tk::engine::StreamKWalk walk(s, b);
            int step = 0;
            for (int i = 0; i < walk.count; ++i) {
              const tk::engine::StreamKSegment g = walk.at(s, i);
              if (g.tile >= s.dp_tiles) {
                offsets.insert(((g.k0 - step) % kb + kb) % kb);  // K block k0 + d at step step + d
                if (g.k0 == 0 && i - walk.dp_count < s.j_min)
                  EXPECT_EQ(g.position - s.dp_tiles, (i - walk.dp_count) * s.units + b);
              }
              step += g.k1 - g.k0;
            }
          }
          EXPECT_LE(offsets.size(), 3u);
        }
  EXPECT_GE(checked, 20);  // the sweep holds enough schedules with a tile start per range
}

TEST(GemmScheduler, FastDivmodMatchesDivision) {
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (uint32_t d : {4097u, 65535u, 65536u, 65537u, 1000003u, (1u << 30) - 1, 1u << 30, (1u << 31) - 1, 1u << 31})
    divisors.push_back(d);
  uint64_t state = 88172645463325252ull;  // xorshift: a fixed, wide sample of numerators
  for (uint32_t d : divisors) {
    const auto f = tk::engine::FastDivmod::make(d);
    ASSERT_NE(f.mul, 0u) << d;
    auto check = [&](uint32_t n) { ASSERT_EQ(f.div(n), n / d) << n << " / " << d; };
    for (uint32_t n = 0; n < 3 * d && n < 20000; ++n) check(n);
    for (uint32_t k : {1u, 2u, 3u, 1000u}) {  // around multiples of d
      const uint64_t base = static_cast<uint64_t>(k) * d;
      for (int e = -2; e <= 2; ++e)
        if (base + e < (1ull << 31)) check(static_cast<uint32_t>(base + e));
    }
    for (int i = 0; i < 200; ++i) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      check(static_cast<uint32_t>(state) & 0x7fffffffu);
    }
    check(0x7fffffffu);
  }
}

TEST(GemmScheduler, PreparedRasterEqualsPlainDivision) {
  // launch_config prepares the scheduler (fast divisions, rotation reduced);
  // the schedule must be the one the unprepared scheduler gives.
  for (int tiles_m : {1, 5, 64, 67, 128})
    for (int tiles_n : {1, 7, 22, 57})
      for (int group : {1, 3, 8, 16})
        for (bool along_m : {false, true})
          for (int rot : {0, 2, 63, 130}) {
            tk::engine::RasterScheduler plain{group, along_m, rot % tiles_m};
            tk::engine::RasterScheduler fast{group, along_m, rot};
            fast.prepare(tiles_m, tiles_n);
            ASSERT_EQ(fast.rotate_m, rot % tiles_m);
            for (int pos = 0; pos < tiles_m * tiles_n; ++pos) {
              const auto a = plain.tile(pos, tiles_m, tiles_n), b = fast.tile(pos, tiles_m, tiles_n);
              ASSERT_TRUE(a.m == b.m && a.n == b.n) << tiles_m << "x" << tiles_n << " group " << group << " along_m "
                                                    << along_m << " rot " << rot << " pos " << pos;
            }
          }
}

// ---------------------------------------------------------------------------
// Host model of the ping-pong CTA WITH the notifier: producer ring,
// two consumers (order barriers), store threads that arrive on the notify
// barriers 2/3, the notifier warp that bar.syncs them and calls tile_done,
// and the notify-free handshake of barriers.cuh (the kernel's own predicates).
// The prologue wait runs on the waiter (v7): it waits free[s], the gate (the
// Prologue), arrives ready[s]; the TMA thread takes each tile from ready[s]
// and arrives free[s] before loading it (WaiterRing, the kernel's parities).
// Named barriers follow the hardware: arrivals are counted per warp and a
// phase completes, and resets, as soon as the count reaches the expected
// number, whoever arrived. Several CTAs (and ranks) step together under one
// random, weighted interleaving, so a blocking prologue can depend on other
// CTAs' notifies (the owner-epilogue GEMM+RS).
namespace {
namespace eng = tessera::kernels::engine;

struct NamedBarrier {
  int expected = 0, count = 0;
  long gen = 0;
  bool over = false;  ///< an arrival set found the phase already holding one of its own kind
  /// Arrives with `warps` warps; returns the phase the last warp joined. Each
  /// barrier has two arrival sets per phase (store threads, notifier): an
  /// arrival that finds anything but nothing or the OTHER set pending is an
  /// over-arrival (it completes a phase early).
  long arrive(int warps) {
    if (count != 0 && count != expected - 32 * warps) over = true;
    long joined = gen;
    for (int w = 0; w < warps; ++w) {
      joined = gen;
      if ((count += 32) == expected) {
        ++gen;
        count = 0;
      }
    }
    return joined;
  }
};

struct CtaModel {
  // configuration
  int stages = 5, k_blocks = 1, tiles = 0;
  bool handshake = true;
  std::function<bool(int)> gate;       ///< the waiter's Prologue wait for CTA tile iter passes
  bool back_pressure = true;           ///< waiter waits on free[s] (the kernel); false: negative control
  std::function<void(int)> tile_done;  ///< notifier published CTA tile iter
  // state
  std::vector<int> full_done, empty_done;
  int produced = 0;
  int order_arrived[2] = {0, 0}, order_synced[2] = {0, 0};
  NamedBarrier notify[2], nfree[2];
  static constexpr int kSlots = eng::WaiterRing::kSlots;
  int ready_done[kSlots] = {}, free_done[kSlots] = {};  ///< completed phases of the waiter ring
  int signaled = 0;                                     ///< tiles the waiter handed over (ready arrives)
  int taken = 0;                                        ///< tiles the TMA thread took from the ring
  int max_lead = 0;                                     ///< most tiles signalled and not yet taken
  std::vector<bool> stored;                             ///< store threads of tile iter arrived on the notify barrier
  std::vector<int> notified;
  struct Cons {
    int iter, kb = 0, prev = -1;
    enum St { Order, Main, Store, Free, Arrive, Done } st;
    long wait_gen = -1;
  } cons[2];
  struct Notifier {
    int iter = 0;
    enum St { Sync, Wait, Publish, Done } st = Sync;
    long wait_gen = -1;
  } ntf;
  std::string error;

  void init() {
    full_done.assign(stages, 0);
    empty_done.assign(stages, 0);
    for (int b = 0; b < 2; ++b) notify[b].expected = nfree[b].expected = 128 + 32;
    stored.assign(tiles, false);
    notified.assign(tiles, 0);
    for (int c = 0; c < 2; ++c) {
      cons[c].iter = c;
      cons[c].st = c >= tiles ? Cons::Done : (c == 0 ? Cons::Main : Cons::Order);
    }
    ntf.st = tiles == 0 ? Notifier::Done : Notifier::Sync;
  }
  static bool parity_passes(int completed, int n) { return (completed & 1) != (n & 1); }
  bool done() const {
    return produced == tiles * k_blocks && taken == tiles && signaled == tiles && cons[0].st == Cons::Done &&
           cons[1].st == Cons::Done && ntf.st == Notifier::Done;
  }
  /// The TMA thread's next step is taking tile `iter` from the waiter ring.
  bool must_take() const { return produced % k_blocks == 0 && taken == produced / k_blocks; }
  /// Agents of this CTA that can make a step now: 0 producer (TMA thread), 1/2
  /// consumers, 3 notifier, 4 waiter.
  void runnable(std::vector<int>& out) const {
    if (produced < tiles * k_blocks) {
      const int s = produced % stages, n = produced / stages, iter = produced / k_blocks;
      if (must_take()) {
        const int r = eng::WaiterRing::slot(iter);
        if (parity_passes(ready_done[r], static_cast<int>(eng::WaiterRing::ready_parity(iter)))) out.push_back(0);
      } else if (parity_passes(empty_done[s], n ^ 1)) {
        out.push_back(0);
      }
    }
    if (signaled < tiles) {
      const int j = signaled, r = eng::WaiterRing::slot(j);
      const bool free_ok =
          !back_pressure || parity_passes(free_done[r], static_cast<int>(eng::WaiterRing::free_parity(j)));
      if (free_ok && (!gate || gate(j))) out.push_back(4);
    }
    for (int c = 0; c < 2; ++c) {
      const Cons& k = cons[c];
      switch (k.st) {
        case Cons::Order:
          if (order_arrived[c] > order_synced[c]) out.push_back(1 + c);
          break;
        case Cons::Main: {
          const int idx = k.iter * k_blocks + k.kb;
          if (parity_passes(full_done[idx % stages], idx / stages)) out.push_back(1 + c);
          break;
        }
        case Cons::Free:
          if (nfree[k.iter & 1].gen > k.wait_gen) out.push_back(1 + c);
          break;
        case Cons::Store:
        case Cons::Arrive:
          out.push_back(1 + c);
          break;
        case Cons::Done:
          break;
      }
    }
    if (ntf.st == Notifier::Sync || ntf.st == Notifier::Publish ||
        (ntf.st == Notifier::Wait && notify[ntf.iter & 1].gen > ntf.wait_gen))
      out.push_back(3);
  }
  void step(int who) {
    if (who == 4) {  // waiter: free[s] passed, Prologue wait passed, arrive ready[s]
      const int j = signaled, r = eng::WaiterRing::slot(j);
      if (back_pressure && free_done[r] != j / kSlots && error.empty())
        error = "waiter passed free of tile " + std::to_string(j) + " at phase count " + std::to_string(free_done[r]);
      if (j - taken >= kSlots && error.empty())
        error = "waiter " + std::to_string(j - taken + 1) + " tiles ahead of the TMA thread";
      ++ready_done[r];
      ++signaled;
      max_lead = std::max(max_lead, signaled - taken);
      return;
    }
    if (who == 0 && must_take()) {  // TMA thread: ready[s] passed, arrive free[s]
      const int iter = taken, r = eng::WaiterRing::slot(iter);
      if (ready_done[r] != iter / kSlots + 1 && error.empty())
        error = "TMA thread passed ready of tile " + std::to_string(iter) + " at phase count " +
                std::to_string(ready_done[r]);
      ++free_done[r];
      ++taken;
      return;
    }
    if (who == 0) {
      ++full_done[produced % stages];
      ++produced;
      return;
    }
    if (who == 3) {
      switch (ntf.st) {
        case Notifier::Sync: {
          NamedBarrier& b = notify[ntf.iter & 1];
          const long before = b.gen;
          ntf.wait_gen = b.arrive(1);
          ntf.st = b.gen > before ? Notifier::Publish : Notifier::Wait;
          if (ntf.st == Notifier::Publish) released();
          break;
        }
        case Notifier::Wait:
          ntf.st = Notifier::Publish;
          released();
          break;
        case Notifier::Publish:
          ++notified[ntf.iter];
          if (tile_done) tile_done(ntf.iter);
          ntf.st = ++ntf.iter < tiles ? Notifier::Sync : Notifier::Done;
          break;
        case Notifier::Done:
          break;
      }
      return;
    }
    const int c = who - 1;
    Cons& k = cons[c];
    switch (k.st) {
      case Cons::Order:
        ++order_synced[c];
        k.st = Cons::Main;
        break;
      case Cons::Main:
        if (k.prev >= 0) ++empty_done[k.prev % stages];
        k.prev = k.iter * k_blocks + k.kb;
        if (++k.kb == k_blocks) {
          if (k.iter + 1 < tiles) ++order_arrived[c ^ 1];  // hand the tensor cores over
          ++empty_done[k.prev % stages];
          k.prev = -1;
          k.kb = 0;
          k.st = Cons::Store;
        }
        break;
      case Cons::Store:
        if (handshake && eng::NotifyHandshake::store_waits_free(k.iter)) {
          NamedBarrier& b = nfree[k.iter & 1];
          const long before = b.gen;
          k.wait_gen = b.arrive(4);
          k.st = b.gen > before ? Cons::Arrive : Cons::Free;
        } else {
          k.st = Cons::Arrive;
        }
        break;
      case Cons::Free:
        k.st = Cons::Arrive;
        break;
      case Cons::Arrive:
        notify[k.iter & 1].arrive(4);
        stored[k.iter] = true;
        k.iter += 2;
        k.st = k.iter < tiles ? Cons::Order : Cons::Done;
        break;
      case Cons::Done:
        break;
    }
  }
  /// The notifier left its bar.sync of tile ntf.iter.
  void released() {
    if (!stored[ntf.iter] && error.empty())
      error = "notifier released for tile " + std::to_string(ntf.iter) + " before its stores";
    if (handshake && eng::NotifyHandshake::notifier_frees(ntf.iter, tiles)) nfree[ntf.iter & 1].arrive(1);
  }
  bool over_arrival() const { return notify[0].over || notify[1].over || nfree[0].over || nfree[1].over; }
};

/// Steps every CTA under one random interleaving; the notifier is picked with
/// weight `notifier_weight` (slow fences), the waiter with `waiter_weight`,
/// against 1 for every other agent.
/// Returns "" or what went wrong (deadlock, early release, double notify).
std::string run_ctas(std::vector<CtaModel>& ctas, std::mt19937_64& rng, double notifier_weight,
                     double waiter_weight = 1.0) {
  for (auto& c : ctas) c.init();
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (long steps = 0;; ++steps) {
    if (steps > 10'000'000) return "no progress";
    std::vector<std::pair<int, int>> cand;
    std::vector<double> w;
    std::vector<int> r;
    for (int i = 0; i < static_cast<int>(ctas.size()); ++i) {
      r.clear();
      ctas[i].runnable(r);
      for (int a : r) {
        cand.emplace_back(i, a);
        w.push_back(a == 3 ? notifier_weight : a == 4 ? waiter_weight : 1.0);
      }
    }
    if (cand.empty()) {
      for (auto& c : ctas)
        if (!c.done()) return "deadlock";
      break;
    }
    double total = 0;
    for (double x : w) total += x;
    double pick = u(rng) * total;
    size_t j = 0;
    while (j + 1 < cand.size() && (pick -= w[j]) > 0) ++j;
    CtaModel& c = ctas[cand[j].first];
    c.step(cand[j].second);
    if (!c.error.empty()) return c.error;
  }
  for (auto& c : ctas) {
    if (c.over_arrival()) return "over-arrival on a notify / notify-free barrier";
    for (int n : c.notified)
      if (n != 1) return "a tile notified " + std::to_string(n) + " times";
  }
  return "";
}
}  // namespace

// The protocol as it was (no notify-free handshake) breaks when the notifier
// lags: the model must find that, or it proves nothing about the fix.
TEST(GemmNotifyModel, WithoutTheHandshakeASlowNotifierBreaksTheBarrier) {
  std::mt19937_64 rng(7);
  int broken = 0, runs = 0;
  for (int tiles : {4, 5, 7})
    for (int trial = 0; trial < 200; ++trial, ++runs) {
      std::vector<CtaModel> ctas(1);
      ctas[0].tiles = tiles;
      ctas[0].k_blocks = 1;
      ctas[0].handshake = false;
      if (!run_ctas(ctas, rng, 0.02).empty() || ctas[0].over_arrival()) ++broken;
    }
  EXPECT_GT(broken, 0) << "the model never reproduced the over-arrival in " << runs << " runs";
}

// With the kernel's handshake (barriers.cuh): no over-arrival, no deadlock,
// the notifier never passes a tile before its stores, every tile notified once
// — for any notifier speed, ring depth, K blocks and tile count.
TEST(GemmNotifyModel, HandshakeKeepsNotifyBarriersInStep) {
  std::mt19937_64 rng(11);
  for (int stages : {2, 5})
    for (int k_blocks : {1, 2, 4, 5})
      for (int tiles : {1, 2, 3, 4, 5, 8})
        for (double wn : {1.0, 0.05, 0.005})
          for (int trial = 0; trial < 30; ++trial) {
            std::vector<CtaModel> ctas(1);
            ctas[0].stages = stages;
            ctas[0].k_blocks = k_blocks;
            ctas[0].tiles = tiles;
            const std::string e = run_ctas(ctas, rng, wn);
            ASSERT_EQ(e, "") << "stages " << stages << " k_blocks " << k_blocks << " tiles " << tiles
                             << " notifier weight " << wn;
          }
}

// GEMM+RS on the ping-pong 64x256 tile over R ranks x C persistent CTAs,
// with the plans the operator uses (plan_rs with 64-row tiles):
//  * owner epilogue: the producer of an own tile waits until every peer
//    notified that tile (per-tile counters), so CTAs depend on other ranks'
//    CTAs; raster group and rotation from the plan;
//  * reduce kernel: tile_done adds 1 per owner to the per-tile-row counters,
//    a reducer per rank walks its tile rows waiting for world * tiles_n.
// Everything must finish with every counter consumed, including the test
// shapes of ops_tp_gpu_test (ragged 1000 rows: 500 per rank).
TEST(GemmNotifyModel, GemmRsOnPingPongTilesFinishesOnEveryRank) {
  using tessera::ops::plan_rs;
  using tessera::ops::RsPlan;
  std::mt19937_64 rng(3);
  struct Shape {
    long m, n;
  };
  for (Shape sh : {Shape{1024, 768}, Shape{1000, 700}, Shape{2048, 4352}, Shape{640, 512}})
    for (int R : {2, 4})
      for (int ctas_per_rank : {3, 7, 48})
        for (bool owner : {true, false})
          for (int trial = 0; trial < 3; ++trial) {
            std::vector<RsPlan> plans;
            for (int r = 0; r < R; ++r) plans.push_back(plan_rs(sh.m, sh.n, R, r, 64, 256));
            const RsPlan& p0 = plans[0];
            if (owner && !p0.shards_on_tile_rows()) continue;
            const int tm = p0.tiles_m, tn = p0.tiles_n, total = tm * tn;
            // counters[owner][index]: per tile (owner epilogue) or per tile row.
            std::vector<std::vector<long>> counters(R, std::vector<long>(owner ? total : tm, 0));
            std::vector<CtaModel> ctas;
            std::vector<std::vector<eng::TileCoord>> tile_of;  // per CTA: its tiles in order
            const int grid = std::min(ctas_per_rank, total);
            for (int r = 0; r < R; ++r) {
              const eng::RasterScheduler sched{owner ? plans[r].owner_raster_group() : 8, false, plans[r].rotate_m};
              for (int b = 0; b < grid; ++b) {
                std::vector<eng::TileCoord> mine;
                for (int pos = b; pos < total; pos += grid) mine.push_back(sched.tile(pos, tm, tn));
                tile_of.push_back(mine);
              }
            }
            ctas.resize(tile_of.size());
            for (size_t i = 0; i < ctas.size(); ++i) {
              const int r = static_cast<int>(i) / grid;
              const auto* tiles = &tile_of[i];
              const RsPlan* pl = &plans[r];
              CtaModel& c = ctas[i];
              c.tiles = static_cast<int>(tiles->size());
              c.k_blocks = 1;
              if (owner) {
                c.gate = [=, &counters](int it) {
                  const auto t = (*tiles)[it];
                  if (pl->first_owner(t.m) != r) return true;
                  return counters[r][t.m * tn + t.n] >= R - 1;
                };
                c.tile_done = [=, &counters](int it) {
                  const auto t = (*tiles)[it];
                  const int o = pl->first_owner(t.m);
                  if (o != r)
                    ++counters[o][t.m * tn + t.n];
                  else
                    counters[r][t.m * tn + t.n] -= R - 1;
                };
              } else {
                c.tile_done = [=, &counters](int it) {
                  const auto t = (*tiles)[it];
                  for (int o = pl->first_owner(t.m); o <= pl->last_owner(t.m, sh.m); ++o) ++counters[o][t.m];
                };
              }
            }
            const std::string e = run_ctas(ctas, rng, trial == 0 ? 1.0 : 0.05);
            ASSERT_EQ(e, "") << "M " << sh.m << " N " << sh.n << " R " << R << " CTAs " << grid << " owner " << owner;
            // Reducers (reduce kernel): own tile rows, world * tiles_n each; the
            // GEMM never waits for them, so running them afterwards is exact.
            for (int r = 0; r < R; ++r)
              for (int t = 0; t < tm; ++t) {
                const bool own_row = !owner && t >= plans[r].own_tile_lo && t < plans[r].own_tile_hi;
                const long want = own_row ? static_cast<long>(plans[r].expected_per_tile_row()) : 0;
                if (owner) {
                  for (int n = 0; n < tn; ++n) ASSERT_EQ(counters[r][t * tn + n], 0) << "owner counter not consumed";
                } else {
                  ASSERT_EQ(counters[r][t], want) << "rank " << r << " tile row " << t << " M " << sh.m << " R " << R;
                }
              }
          }
}

// PipelineState (pipeline.cuh): advancing from the start reaches at(i) after
// i slots, for every ring depth the kernels use; the ping-pong consumers rely
// on at() to start a tile at its first ring index.
TEST(GemmPipelineState, AtMatchesAdvance) {
  auto check = [](auto tag) {
    constexpr int kStages = decltype(tag)::value;
    eng::PipelineState<kStages> s;
    for (int64_t i = 0; i < 10 * kStages + 3; ++i) {
      const auto a = eng::PipelineState<kStages>::at(i);
      ASSERT_EQ(a.stage, s.stage) << "stages " << kStages << " index " << i;
      ASSERT_EQ(a.phase, s.phase) << "stages " << kStages << " index " << i;
      ASSERT_EQ(s.stage, static_cast<int>(i % kStages));
      ASSERT_EQ(s.phase, static_cast<uint32_t>((i / kStages) & 1));
      s.advance();
    }
  };
  check(std::integral_constant<int, 4>{});
  check(std::integral_constant<int, 5>{});
  check(std::integral_constant<int, 6>{});
  check(std::integral_constant<int, 7>{});
  check(std::integral_constant<int, 13>{});
}

// The warp roles (barriers.cuh): warpgroup 0 produces, warpgroup 1 + c is
// consumer c, and the waiter ring's waiter warp is the producer's kWaiter.
TEST(GemmWarpRoles, RolesOfEveryWarp) {
  for (int warp = 0; warp < 12; ++warp) {
    const int warpgroup = warp / 4;
    if (warpgroup == 0) {
      EXPECT_EQ(eng::warpgroup_role(warpgroup), eng::WarpGroupRole::kProducer);
      EXPECT_EQ(static_cast<int>(eng::producer_warp_role(warp)), warp);
    } else {
      EXPECT_EQ(eng::warpgroup_role(warpgroup), eng::WarpGroupRole::kConsumer);
      EXPECT_EQ(eng::consumer_of(warpgroup), warpgroup - 1);
    }
  }
  EXPECT_EQ(eng::producer_warp_role(eng::WaiterRing::kWaiterWarp), eng::ProducerWarpRole::kWaiter);
  EXPECT_EQ(eng::producer_warp_role(0), eng::ProducerWarpRole::kTma);
  EXPECT_EQ(eng::producer_warp_role(1), eng::ProducerWarpRole::kNotifier);
}

// The prologue-waiter ring (barriers.cuh, WaiterRing; kernel_common.cuh): for random
// tile counts, ring depths, K blocks and waiter speeds (slow: flags set late
// or a long round trip; fast: flags already set), the TMA thread takes every
// tile exactly once, in order, only after the waiter signalled THAT tile (no
// parity aliasing: ready[s] has completed exactly tile / 2 + 1 phases), the
// waiter passes free[s] only once the TMA thread took tile j - 2, is never
// more than kSlots tiles ahead, and nothing deadlocks. Blocking Prologue
// waits that depend on other CTAs run through the same ring in
// GemmNotifyModel.GemmRsOnPingPongTilesFinishesOnEveryRank (owner epilogue).
TEST(GemmWaiterRingModel, TmaThreadTakesEveryTileOnceAfterItsWait) {
  std::mt19937_64 rng(21);
  std::uniform_int_distribution<int> tiles_dist(1, 40);
  int full_lead_runs = 0;
  for (int stages : {2, 5})
    for (int k_blocks : {1, 2, 5})
      for (double ww : {1.0, 0.05, 20.0})
        for (int trial = 0; trial < 20; ++trial) {
          std::vector<CtaModel> ctas(1);
          CtaModel& c = ctas[0];
          c.stages = stages;
          c.k_blocks = k_blocks;
          c.tiles = tiles_dist(rng);
          const std::string e = run_ctas(ctas, rng, 1.0, ww);
          ASSERT_EQ(e, "") << "stages " << stages << " k_blocks " << k_blocks << " tiles " << c.tiles
                           << " waiter weight " << ww;
          ASSERT_EQ(c.taken, c.tiles);
          ASSERT_EQ(c.signaled, c.tiles);
          ASSERT_LE(c.max_lead, eng::WaiterRing::kSlots);
          full_lead_runs += c.max_lead == eng::WaiterRing::kSlots;
        }
  // The fast-waiter runs must have reached the full lead, or the model never
  // exercised the back-pressure.
  EXPECT_GT(full_lead_runs, 0);
}

// Negative control: without the free[s] back-pressure the waiter laps the
// ring (ready[s] completes a phase the TMA thread has not consumed, so a
// parity wait aliases or blocks); the model must catch that.
TEST(GemmWaiterRingModel, WithoutBackPressureTheWaiterLapsTheRing) {
  std::mt19937_64 rng(5);
  int broken = 0, runs = 0;
  for (int tiles : {3, 5, 9})
    for (int trial = 0; trial < 100; ++trial, ++runs) {
      std::vector<CtaModel> ctas(1);
      ctas[0].tiles = tiles;
      ctas[0].k_blocks = 2;
      ctas[0].back_pressure = false;
      if (!run_ctas(ctas, rng, 1.0, 20.0).empty()) ++broken;
    }
  EXPECT_GT(broken, 0) << "the model never caught the waiter lapping the ring in " << runs << " runs";
}

// Programmatic dependent launch only where the model estimates a short
// problem (it measured faster there and slower on longer ones), and never
// when the options turn it off.
TEST(GemmPlan, DependentLaunchOnlyForShortProblems) {
  tk::GemmPlan pp64;
  pp64.tile = tk::GemmTile::T64x64;
  pp64.ping_pong = true;
  tk::GemmPlan c256;
  c256.tile = tk::GemmTile::T128x256;
  c256.cluster_m = 2;
  tk::GemmArgs a = good();
  a.lda = a.ldb = 0;
  a.m = 44, a.n = 2944, a.k = 592;  // ~4 us
  tk::GemmOptions o;
  ASSERT_LT(tk::model_gemm_us(a, 132, pp64), tk::kDependentLaunchMaxUs);
  EXPECT_TRUE(tk::plain_dependent_launch(a, o, pp64, 132));
  o.dependent_launch = false;
  EXPECT_FALSE(tk::plain_dependent_launch(a, o, pp64, 132));
  o.dependent_launch = true;
  a.m = 4833, a.n = 5048, a.k = 4408;  // ~300 us
  ASSERT_GT(tk::model_gemm_us(a, 132, c256), tk::kDependentLaunchMaxUs);
  EXPECT_FALSE(tk::plain_dependent_launch(a, o, c256, 132));
}
