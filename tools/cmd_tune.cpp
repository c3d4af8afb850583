// `tessera tune` — fills the ops tuner's cache ahead of time, so that
// `automatic` finds its choice made (or a near one: ops/tuner.hpp) and a
// training or serving step never stops for a tuning pass:
//
//   tessera run -n 2 -- tessera tune --op ag_gemm --shape 8192x14336x4096 --swiglu
//   tessera run -n 2 -- tessera tune --op gemm_rs --shape 8192x4096x7168 --shape 4096x4096x7168
//
// Shapes are M x N x K as the operators take them: ag_gemm gathers A
// [M/R, K] and multiplies by B [N, K]; gemm_rs and gemm_ar take A [M, K]
// (this rank's K shard) and B [N, K]. `--layout kn` tunes ag_gemm / gemm_rs
// with B as [K, N] (b_kn: the backward's dX GEMMs, a key of its own).
// Collective: every rank runs the same
// command. Prints one line per shape with the choice and the measured times.
//
// `--op gemm` fills the plain GEMM's measured override instead (one GPU, no
// `tessera run`; tune/gemm_tuner.hpp): the model's --top-k plans and its own
// pick timed per shape, the fastest cached for the shape's bucket, which
// kernels::gemm() with plan_source Tuned (or any gemm() under
// TESSERA_GEMM_TUNED=1) then runs:
//
//   tessera tune --op gemm --shape 24x992x536 --shape 3812x1104x2184 --layout nk --out bf16
//
// `--model-only` measures nothing: it prints the plan gemm() runs by default
// and the model's --top-k cheapest plans with their estimates, for the SM
// count --sms (then no GPU is needed):
//
//   tessera tune --op gemm --model-only --sms 132 --shape 448x2816x10752 --top-k 8
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "command.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/gemm_plan.hpp"
#include "tessera/ops/tp_mlp.hpp"
#include "tessera/tune/gemm_tuner.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::tools {
namespace {

struct TuneOptions {
  std::string op = "ag_gemm";
  std::vector<std::string> shapes;
  std::string dtype = "bf16";
  bool swiglu = false;
  bool no_cache = false;
  // --op gemm
  std::string layout = "nk";
  std::string out;  ///< output dtype; "" = the input's
  int top_k = 5;
  bool refresh = false;
  bool model_only = false;  ///< print the model's ranking, measure nothing
  int sms = 0;              ///< SM count planned for with --model-only; 0 = this GPU's
};

struct Shape {
  std::int64_t m = 0, n = 0, k = 0;
};

Shape parse_shape(const std::string& s) {
  Shape r;
  char x1 = 0, x2 = 0;
  long long m = 0, n = 0, k = 0;
  int used = 0;
  const int got = std::sscanf(s.c_str(), "%lld%c%lld%c%lld%n", &m, &x1, &n, &x2, &k, &used);
  TESSERA_CHECK(got == 5 && x1 == 'x' && x2 == 'x' && used == static_cast<int>(s.size()),
                "tune: --shape '{}' is not MxNxK (e.g. 8192x14336x4096)", s);
  constexpr long long kMax = 1LL << 24;
  TESSERA_CHECK(m >= 1 && n >= 1 && k >= 1 && m <= kMax && n <= kMax && k <= kMax,
                "tune: --shape '{}': every dimension must be in [1, 2^24]", s);
  r.m = m, r.n = n, r.k = k;
  return r;
}

/// A device buffer of `elems` 16-bit values, filled with small random numbers
/// (tuning on zeros would time the candidates at unrealistically low power).
struct RandomBuffer {
  void* p = nullptr;
  RandomBuffer(std::int64_t elems, std::uint64_t seed) {
    TESSERA_CUDA_CHECK(cudaMalloc(&p, static_cast<std::size_t>(elems) * 2));
    std::vector<__nv_bfloat16> h(static_cast<std::size_t>(std::min<std::int64_t>(elems, 1 << 20)));
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.f, 0.05f);
    for (auto& v : h) v = __float2bfloat16(nd(rng));
    for (std::int64_t off = 0; off < elems; off += static_cast<std::int64_t>(h.size())) {
      const std::int64_t n = std::min<std::int64_t>(static_cast<std::int64_t>(h.size()), elems - off);
      TESSERA_CUDA_CHECK(cudaMemcpy(static_cast<char*>(p) + off * 2, h.data(), static_cast<std::size_t>(n) * 2,
                                    cudaMemcpyHostToDevice));
    }
  }
  ~RandomBuffer() {
    if (p) (void)cudaFree(p);
  }
  RandomBuffer(const RandomBuffer&) = delete;
  RandomBuffer& operator=(const RandomBuffer&) = delete;
};

std::int64_t shard_rows(std::int64_t m, int world, int rank) {
  const std::int64_t per = (m + world - 1) / world;
  return std::max<std::int64_t>(0, std::min(m, (rank + 1) * per) - rank * per);
}

std::string times_text(const ops::TuneReport& r) {
  if (r.times_ms.empty()) return r.from_cache ? "(cached)" : "(one candidate)";
  std::string t;
  for (const auto& [s, ms] : r.times_ms) {
    t += fmt::format("{}{} {:.3f} ms", t.empty() ? "" : ", ", strategy_name(s), ms);
    // Against the baseline, repetition by repetition (what the choice rests on).
    if (const auto e = r.evidence.find(s); e != r.evidence.end())
      t += fmt::format(" ({})", ops::evidence_text(e->second));
  }
  return t;
}

// Row strides of a packed problem as a caller pads them: rows must be
// 16-byte multiples (kernels::validate).
std::int64_t padded_ld(std::int64_t elems) { return (elems + 7) / 8 * 8; }

// --op gemm --model-only: what gemm() runs by default and the model's
// ranking, on --sms SMs or this GPU's; no memory, no launch.
void print_gemm_model(const TuneOptions& opt, DType in, DType out, kernels::BLayout layout) {
  namespace k = tessera::kernels;
  int sms = opt.sms;
  if (sms == 0) {
    int dev = 0;
    const cudaError_t e = cudaGetDevice(&dev);
    TESSERA_CHECK(e == cudaSuccess, "tune: --model-only without --sms needs a GPU ({}); give --sms N",
                  cudaGetErrorString(e));
    TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  }
  // The model reads only shapes, strides and the bases' alignment: any
  // 256-byte aligned address stands for the caller's buffers.
  void* base = reinterpret_cast<void*>(std::uintptr_t{1} << 20);
  for (const std::string& text : opt.shapes) {
    const Shape s = parse_shape(text);
    const std::int64_t lda = padded_ld(s.k), ldb = layout == k::BLayout::NK ? lda : padded_ld(s.n);
    const k::GemmArgs g{base, base, base, s.m, s.n, s.k, lda, ldb, 0, in, out, layout};
    const bool rule = k::legacy_rule_applies(g, sms);
    fmt::print("gemm {}x{}x{} {} -> {} {}, {} SMs, rows {}-byte aligned: runs {} ({})\n", s.m, s.n, s.k, dtype_name(in),
               dtype_name(out), opt.layout, sms, k::row_alignment(g), k::plan_name(k::default_plan(g, sms, true)),
               rule ? "the benchmark shapes' rule" : "the model's cheapest");
    const std::vector<k::GemmPlanEstimate> ranked = k::gemm_plan_estimates(g, sms);
    for (size_t i = 0; i < ranked.size() && static_cast<int>(i) < opt.top_k; ++i)
      fmt::print("  {:>9.2f} us  {}\n", ranked[i].us, k::plan_name(ranked[i].plan));
  }
}

// --op gemm: the plain GEMM's plans, measured on this process's GPU.
void run_tune_gemm(const TuneOptions& opt) {
  namespace k = tessera::kernels;
  TESSERA_CHECK(opt.layout == "nk" || opt.layout == "kn", "tune: --layout '{}' (nk or kn)", opt.layout);
  TESSERA_CHECK(opt.out.empty() || opt.out == "bf16" || opt.out == "f16" || opt.out == "f32",
                "tune: --out '{}' (bf16, f16 or f32)", opt.out);
  const DType in = opt.dtype == "f16" ? DType::f16 : DType::bf16;
  const DType out = opt.out.empty() ? in : opt.out == "f32" ? DType::f32 : opt.out == "f16" ? DType::f16 : DType::bf16;
  const k::BLayout layout = opt.layout == "kn" ? k::BLayout::KN : k::BLayout::NK;
  if (opt.model_only) return print_gemm_model(opt, in, out, layout);
  tune::GemmTuneOptions to;
  to.top_k = opt.top_k;
  to.refresh = opt.refresh;
  to.use_cache = !opt.no_cache;
  for (const std::string& text : opt.shapes) {
    const Shape s = parse_shape(text);
    // Packed rows must be 16-byte multiples (kernels::validate): round the
    // leading dimensions up as a caller would pad them.
    const std::int64_t lda = padded_ld(s.k), ldb = layout == k::BLayout::NK ? lda : padded_ld(s.n);
    RandomBuffer a(s.m * lda, 1), b((layout == k::BLayout::NK ? s.n : s.k) * ldb, 2);
    RandomBuffer d(s.m * s.n * static_cast<std::int64_t>(dtype_size(out)) / 2, 3);
    k::GemmArgs g{a.p, b.p, d.p, s.m, s.n, s.k, lda, ldb, 0, in, out, layout};
    const tune::GemmTuneResult r = tune::gemm_tune(g, nullptr, to);
    std::string times;
    for (const auto& [p, us] : r.times_us)
      times += fmt::format("{}{} {:.2f} us", times.empty() ? "" : ", ", k::plan_name(p), us);
    fmt::print("gemm {}x{}x{} {} -> {} {}: {} (model {}){}{}\n", s.m, s.n, s.k, dtype_name(in), dtype_name(out),
               opt.layout, k::plan_name(r.plan), k::plan_name(r.model_plan), r.from_cache ? " (cached)" : "",
               times.empty() ? "" : " [" + times + "]");
    for (const std::string& e : r.errors) fmt::print("  could not run {}\n", e);
  }
}

void run_tune(const TuneOptions& opt) {
  TESSERA_CHECK(opt.op == "ag_gemm" || opt.op == "gemm_rs" || opt.op == "gemm_ar" || opt.op == "gemm",
                "tune: --op '{}' (ag_gemm, gemm_rs, gemm_ar or gemm)", opt.op);
  TESSERA_CHECK(opt.dtype == "bf16" || opt.dtype == "f16", "tune: --dtype '{}' (bf16 or f16)", opt.dtype);
  TESSERA_CHECK(opt.op == "gemm" || (!opt.model_only && opt.sms == 0),
                "tune: --model-only and --sms are --op gemm options");
  TESSERA_CHECK(opt.model_only || opt.sms == 0, "tune: --sms applies with --model-only");
  if (opt.op == "gemm") return run_tune_gemm(opt);
  TESSERA_CHECK(!opt.swiglu || opt.op == "ag_gemm", "tune: --swiglu is an ag_gemm option");
  const bool b_kn = opt.layout == "kn";
  TESSERA_CHECK(!b_kn || opt.op != "gemm_ar",
                "tune: --layout kn is for ag_gemm, gemm_rs and gemm (gemm_ar takes B [N, K])");
  TESSERA_CHECK(!b_kn || !opt.swiglu, "tune: --swiglu needs B as [N, K]; --layout kn is not supported with it");
  std::vector<Shape> shapes;
  for (const auto& s : opt.shapes) shapes.push_back(parse_shape(s));
  auto pg = runtime::ProcessGroup::from_environment();
  ops::TpContext ctx(*pg);
  const int R = pg->world(), rank = pg->rank();
  ops::OpOptions o;
  o.strategy = ops::Strategy::automatic;
  o.use_cache = !opt.no_cache;
  o.tune_on_miss = true;
  const DType dt = opt.dtype == "f16" ? DType::f16 : DType::bf16;
  for (const Shape& s : shapes) {
    const std::int64_t ml = shard_rows(s.m, R, rank);
    ops::TuneReport report;
    ops::Strategy chosen{};
    if (opt.op == "ag_gemm") {
      TESSERA_CHECK(!opt.swiglu || s.n % 2 == 0, "tune: --swiglu needs an even N, got {}", s.n);
      RandomBuffer a(ml * s.k, 1 + rank), b(s.n * s.k, 2), d(s.m * (opt.swiglu ? s.n / 2 : s.n), 3);
      ops::AgGemmArgs g;
      g.a = a.p, g.b = b.p, g.d = d.p, g.m = s.m, g.m_local = ml, g.n = s.n, g.k = s.k, g.dtype = dt;
      g.swiglu = opt.swiglu;
      g.b_kn = b_kn;
      chosen = ctx.resolve(g, o, &report);
    } else if (opt.op == "gemm_rs") {
      RandomBuffer a(s.m * s.k, 1 + rank), b(s.n * s.k, 2), d(ml * s.n, 3);
      ops::GemmRsArgs g;
      g.a = a.p, g.b = b.p, g.d = d.p, g.m = s.m, g.m_local = ml, g.n = s.n, g.k = s.k, g.dtype = dt;
      g.b_kn = b_kn;
      chosen = ctx.resolve(g, o, &report);
    } else {
      RandomBuffer a(s.m * s.k, 1 + rank), b(s.n * s.k, 2), d(s.m * s.n, 3);
      ops::GemmArArgs g;
      g.a = a.p, g.b = b.p, g.d = d.p, g.m = s.m, g.n = s.n, g.k = s.k, g.dtype = dt;
      chosen = ctx.resolve(g, o, &report);
    }
    pg->synchronize(pg->stream(), "tessera tune");
    if (rank == 0)
      fmt::print("{} {}x{}x{}{}{} at R = {}: {} ({})\n", opt.op, s.m, s.n, s.k, opt.swiglu ? " swiglu" : "",
                 b_kn ? " B [K, N]" : "", R, strategy_name(chosen), times_text(report));
  }
}

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto opt = std::make_shared<TuneOptions>();
  CLI::App* cmd = root.add_subcommand(
      "tune",
      "measure `automatic`'s choice for given shapes now and cache it (run under `tessera run -n R`); --op gemm: "
      "the plain GEMM's plan per shape bucket, one GPU");
  cmd->add_option("--op", opt->op, "ag_gemm, gemm_rs, gemm_ar, or gemm (the plain GEMM's plan, one GPU)")
      ->check(CLI::IsMember({"ag_gemm", "gemm_rs", "gemm_ar", "gemm"}));
  cmd->add_option("--shape", opt->shapes, "MxNxK as the operator takes it (repeatable)")->required();
  cmd->add_option("--dtype", opt->dtype, "bf16 or f16")->check(CLI::IsMember({"bf16", "f16"}));
  cmd->add_flag("--swiglu", opt->swiglu, "ag_gemm with SiLU·up fused (B holds gate/up rows interleaved)");
  cmd->add_flag("--no-cache", opt->no_cache, "measure without reading or writing the on-disk cache");
  cmd->add_option("--layout", opt->layout, "B as nk ([N, K]) or kn ([K, N]; ag_gemm, gemm_rs, gemm)")
      ->check(CLI::IsMember({"nk", "kn"}));
  cmd->add_option("--out", opt->out, "--op gemm: output dtype (bf16, f16, f32; default the input's)")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}));
  cmd->add_option("--top-k", opt->top_k, "--op gemm: the model's k cheapest plans measured per shape")
      ->check(CLI::Range(1, 64));
  cmd->add_flag("--refresh", opt->refresh, "--op gemm: measure even when the shape's bucket holds a plan");
  cmd->add_flag("--model-only", opt->model_only,
                "--op gemm: measure nothing; print the plan gemm() runs and the model's --top-k cheapest plans");
  cmd->add_option("--sms", opt->sms, "--op gemm --model-only: plan for this many SMs (default: this GPU's)")
      ->check(CLI::Range(1, 1024));
  cmd->callback([opt] { run_tune(*opt); });
});

}  // namespace
}  // namespace tessera::tools
