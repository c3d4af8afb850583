// GPU tests of the GEMM measured override: graph timing returns GPU times,
// gemm_tune measures, caches and installs a plan that gemm() under
// GemmPlanSource::Tuned then runs (checked against cuBLASLt on a poisoned
// output), a second call reads the cache, and a forged entry is ignored (the
// model's plan runs, still right).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "support/temp_dir.hpp"
#include "kernels/gemm_test_util.hpp"
#include "support/test_support.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/gemm_plan.hpp"
#include "tessera/tune/gemm_tuner.hpp"
#include "tessera/tune/graph_timing.hpp"

namespace fs = std::filesystem;
namespace tk = tessera::kernels;
namespace tt = tessera::tune;
using tessera::DType;
using tessera::kernels::testk::DevBuf;

namespace {

using tessera::testing::TempDir;

tk::GemmOptions tuned(tk::GemmOptions o = {}) {
  o.plan_source = tk::GemmPlanSource::Tuned;
  return o;
}

// One problem's buffers: random A and B, D and a cuBLASLt reference.
struct Problem {
  tk::GemmArgs a;
  DevBuf A, B, D, R;
  Problem(int64_t m, int64_t n, int64_t k, DType out, std::mt19937_64& rng) {
    A = tessera::kernels::testk::random_matrix(m, k, k, DType::bf16, rng);
    B = tessera::kernels::testk::random_matrix(n, k, k, DType::bf16, rng);
    const size_t bytes = static_cast<size_t>(m * n) * tessera::dtype_size(out);
    D = DevBuf(bytes);
    R = DevBuf(bytes);
    a = tk::GemmArgs{A.p, B.p, D.p, m, n, k, 0, 0, 0, DType::bf16, out, tk::BLayout::NK};
    tk::GemmArgs r = a;
    r.d = R.p;
    tk::cublaslt_gemm(r, nullptr);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // D poisoned, `run` on it, relative error against cuBLASLt.
  template <class F>
  double error_of(F run) {
    TESSERA_CUDA_CHECK(cudaMemset(D.p, 0xFF, D.bytes));
    run();
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    return tessera::testing::relative_error(values(D), values(R));
  }
  std::vector<double> values(const DevBuf& b) const {
    const size_t n = static_cast<size_t>(a.m * a.n);
    std::vector<double> v(n);
    if (a.out == DType::f32) {
      std::vector<float> f(n);
      TESSERA_CUDA_CHECK(cudaMemcpy(f.data(), b.p, n * 4, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; ++i) v[i] = f[i];
    } else {
      std::vector<uint16_t> h(n);
      TESSERA_CUDA_CHECK(cudaMemcpy(h.data(), b.p, n * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; ++i) v[i] = tessera::kernels::testk::from_bits(h[i], a.out);
    }
    return v;
  }
};

}  // namespace

TEST(GraphTiming, TimesEveryBodyOnTheGpu) {
  TESSERA_REQUIRE_GPUS(1);
  cudaStream_t s;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  DevBuf small(1 << 10), big(64 << 20);
  tt::GraphTimingOptions o;
  o.warmup = 1;
  o.reps = 5;
  o.calls = 4;
  const tt::GraphTimes t =
      tt::time_graphs_interleaved(s,
                                  {[&](int) { TESSERA_CUDA_CHECK(cudaMemsetAsync(small.p, 0, small.bytes, s)); },
                                   [&](int) { TESSERA_CUDA_CHECK(cudaMemsetAsync(big.p, 0, big.bytes, s)); }},
                                  o, "GraphTiming test");
  EXPECT_TRUE(t.gpu_only) << t.why;
  ASSERT_EQ(t.us.size(), 2u);
  for (const auto& v : t.us) {
    ASSERT_EQ(v.size(), 5u);
    for (double x : v) EXPECT_TRUE(std::isfinite(x) && x > 0) << x;
  }
  // 64 MiB of memset takes far longer than 1 KiB on any GPU.
  EXPECT_GT(tt::median_of(t.us[1]), 2 * tt::median_of(t.us[0]));
  EXPECT_THROW(tt::time_graphs_interleaved(nullptr, {}, o, "GraphTiming test"), tessera::Error);
  TESSERA_CUDA_CHECK(cudaStreamDestroy(s));
}

TEST(GemmTuner, TunedPlanIsCachedInstalledAndCorrect) {
  TESSERA_REQUIRE_GPUS(1);
  TempDir dir("tessera_gemm_tuner_gpu");
  std::mt19937_64 rng(19);
  struct Shape {
    int64_t m, n, k;
    DType out;
  };
  for (const Shape& sh : {Shape{24, 992, 536, DType::bf16}, Shape{300, 1000, 1032, DType::bf16},
                          Shape{200, 600, 4096, DType::f32}, Shape{2048, 2048, 1024, DType::bf16}}) {
    SCOPED_TRACE(std::to_string(sh.m) + "x" + std::to_string(sh.n) + "x" + std::to_string(sh.k));
    Problem p(sh.m, sh.n, sh.k, sh.out, rng);
    tt::GemmTuneOptions o;
    o.top_k = 3;
    o.warmup = 1;
    o.reps = 3;
    o.cache_dir = dir.str();
    const tt::GemmTuneResult r = tt::gemm_tune(p.a, nullptr, o);
    EXPECT_FALSE(r.from_cache);
    EXPECT_TRUE(r.errors.empty()) << r.errors.front();
    ASSERT_GE(r.times_us.size(), 3u);
    for (const auto& [plan, us] : r.times_us) EXPECT_TRUE(std::isfinite(us) && us > 0) << tk::plan_name(plan);
    EXPECT_TRUE(tk::gemm_plan_valid(p.a, r.plan)) << tk::plan_name(r.plan);
    // gemm() under plan_source Tuned runs the pick, and it is right.
    const tk::GemmOptions used = tk::resolve_options(p.a, tuned());
    EXPECT_TRUE(tk::plan_gemm(p.a, used) == r.plan) << tk::plan_name(tk::plan_gemm(p.a, used));
    EXPECT_LT(p.error_of([&] { tk::gemm(p.a, tuned(), nullptr); }), 1e-2);
    // plan_source Model ignores the installed source.
    tk::GemmOptions model;
    model.plan_source = tk::GemmPlanSource::Model;
    EXPECT_TRUE(tk::plan_gemm(p.a, tk::resolve_options(p.a, model)) == tk::plan_gemm(p.a, {}));
    // Explicit options win over the cache.
    tk::GemmOptions split;
    split.k_splits = 1;
    EXPECT_EQ(tk::resolve_options(p.a, tuned(split)).k_splits, 1);
    EXPECT_EQ(tk::resolve_options(p.a, tuned(split)).tile, tk::GemmTile::Auto);
    // A second call finds the bucket's plan without measuring.
    const tt::GemmTuneResult again = tt::gemm_tune(p.a, nullptr, o);
    EXPECT_TRUE(again.from_cache);
    EXPECT_TRUE(again.plan == r.plan);
    EXPECT_TRUE(again.times_us.empty());
  }
}

TEST(GemmTuner, ForgedEntryIsIgnored) {
  TESSERA_REQUIRE_GPUS(1);
  TempDir dir("tessera_gemm_tuner_gpu");
  std::mt19937_64 rng(7);
  Problem p(24, 992, 536, DType::bf16, rng);
  {
    tt::Cache c(tt::kGemmCacheName, tt::kGemmCacheVersion, dir.str());
    // 128x256 with a 2-CTA cluster: needs two 128-row tile rows, M = 24 has one.
    const tk::GemmPlan forged{tk::GemmTile::T128x256, false, 2, 1};
    c.put(tt::gemm_bucket_key(tt::current_gemm_machine(tk::plan_sm_count({})), p.a),
          {{"plan", tt::gemm_plan_to_json(forged)}, {"shape", {p.a.m, p.a.n, p.a.k}}});
  }
  tt::install_gemm_tuned_plans(dir.str());
  const tk::GemmOptions used = tk::resolve_options(p.a, tuned());
  EXPECT_TRUE(tk::plan_gemm(p.a, used) == tk::plan_gemm(p.a, {}));
  EXPECT_LT(p.error_of([&] { tk::gemm(p.a, tuned(), nullptr); }), 1e-2);
}
