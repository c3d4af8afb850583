// `tessera bench gemm --random N --seed S`: the engine against
// cuBLASLt on N shapes drawn at random, side by side in one process. GPU time
// only: each variant's calls are captured into a CUDA graph between two
// event-record nodes (tune/graph_timing.hpp), so neither library's enqueue
// cost is counted however short the problem; the graphs run interleaved
// round by round after warm-up rounds, medians per call; inputs rotate over
// --sets buffer sets within each graph. Every shape is first checked against
// cuBLASLt on a poisoned output (relative error; an unwritten element reads
// NaN and fails the check). --tuned measures each shape's plans first
// (tune::gemm_tune) and adds "ours (tuned)" (kernels::gemm with plan_source
// Tuned), checked the same way.
// Prints per shape ours/cuBLASLt and the plan gemm() ran, then the geometric
// mean, the worst, the count above 1.10, the largest error, and the same per
// pattern (K tail, small M, small N, the target subset). --diag adds every
// compiled kernel timed explicitly and, for a K tail, both libraries with
// leading dimensions padded to 64 elements (128-byte rows), to tell a slow
// kernel choice from a slow memory layout.
#include "gemm/bench_gemm_random.hpp"

#include <cuda_runtime_api.h>
#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "common/device_buffer.hpp"
#include "common/results.hpp"
#include "gemm/bench_gemm_kernels.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/gemm_plan.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/tune/gemm_tuner.hpp"
#include "tessera/tune/graph_timing.hpp"

namespace tessera::bench::gemm {
namespace {

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t bytes) { TESSERA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

double half_to_double(uint16_t v, bool bf16) {
  if (bf16) {
    const uint32_t u = static_cast<uint32_t>(v) << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return x;
  }
  const uint32_t s = (v >> 15) & 1, e = (v >> 10) & 31, m = v & 1023;
  double x;
  if (e == 0)
    x = std::ldexp(static_cast<double>(m), -24);
  else if (e == 31)
    x = m ? NAN : INFINITY;
  else
    x = std::ldexp(1.0 + m / 1024.0, static_cast<int>(e) - 15);
  return s ? -x : x;
}

// ||out - ref|| / ||ref|| over the M x N outputs (row stride n); infinite if
// either holds a non-finite value (the poison).
double rel_err(const void* out, const void* ref, int64_t m, int64_t n, DType t) {
  const size_t es = dtype_size(t);
  std::vector<uint8_t> a(m * n * es), b(m * n * es);
  TESSERA_CUDA_CHECK(cudaMemcpy(a.data(), out, a.size(), cudaMemcpyDeviceToHost));
  TESSERA_CUDA_CHECK(cudaMemcpy(b.data(), ref, b.size(), cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    double x, y;
    if (t == DType::f32) {
      float fx, fy;
      std::memcpy(&fx, &a[i * 4], 4);
      std::memcpy(&fy, &b[i * 4], 4);
      x = fx;
      y = fy;
    } else {
      uint16_t ux, uy;
      std::memcpy(&ux, &a[i * 2], 2);
      std::memcpy(&uy, &b[i * 2], 2);
      x = half_to_double(ux, t == DType::bf16);
      y = half_to_double(uy, t == DType::bf16);
    }
    if (!std::isfinite(x) || !std::isfinite(y)) return INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : INFINITY;
}

struct Record {
  int64_t m, n, k;
  std::string plan;
  double ours_ms, ref_ms, ratio, err;
  std::vector<std::pair<std::string, double>> diag;  // name -> ms
  // --tuned: the plan gemm() ran under plan_source Tuned, its time, ratio and error.
  std::string tuned_plan;
  double tuned_ms = NAN, tuned_ratio = NAN, tuned_err = NAN;
  int calls = 1;         // calls per timed graph
  bool gpu_only = true;  // false: graph capture failed, host-recorded events
};

double geomean(const std::vector<double>& r) {
  if (r.empty()) return NAN;
  double s = 0;
  for (double x : r) s += std::log(x);
  return std::exp(s / r.size());
}

struct Summary {
  std::string variant = "ours";  // or "ours (tuned)"
  std::string name;
  int count = 0;
  double geomean = NAN, worst = NAN;
  int above_110 = 0;
};

Summary summarize_ratios(const std::string& name, const std::vector<double>& r) {
  Summary s;
  s.name = name;
  s.count = static_cast<int>(r.size());
  s.geomean = geomean(r);
  s.worst = r.empty() ? NAN : *std::max_element(r.begin(), r.end());
  s.above_110 = static_cast<int>(std::count_if(r.begin(), r.end(), [](double x) { return x > 1.10; }));
  return s;
}

}  // namespace

std::vector<std::array<int64_t, 3>> draw_shapes(int count, uint64_t seed) {
  std::mt19937_64 g(seed);
  // Inverse-CDF on 53-bit uniforms (portable, unlike std::*_distribution).
  auto uni = [&] { return static_cast<double>(g() >> 11) * (1.0 / 9007199254740992.0); };
  auto logu = [&](double lo, double hi) { return std::exp(std::log(lo) + uni() * (std::log(hi) - std::log(lo))); };
  std::vector<std::array<int64_t, 3>> out;
  for (int i = 0; i < count; ++i) {
    const int64_t m = std::clamp<int64_t>(std::llround(logu(16, 16384)), 16, 16384);
    const int64_t n = std::clamp<int64_t>(std::llround(logu(512, 16384) / 8) * 8, 512, 16384);
    const int64_t k = std::clamp<int64_t>(std::llround(logu(512, 16384) / 8) * 8, 512, 16384);
    out.push_back({m, n, k});
  }
  return out;
}

namespace {

// The shapes: --mnk's list, or --random draws.
std::vector<std::array<int64_t, 3>> shapes_of(const RandomOptions& o) {
  std::vector<std::array<int64_t, 3>> shapes;
  if (!o.mnk.empty()) {
    for (const std::string& s : o.mnk) {
      int64_t m = 0, n = 0, k = 0;
      TESSERA_CHECK(std::sscanf(s.c_str(), "%ldx%ldx%ld", &m, &n, &k) == 3, "bench gemm: --mnk '{}' is not MxNxK", s);
      shapes.push_back({m, n, k});
    }
  } else {
    TESSERA_CHECK(o.count > 0, "bench gemm: --random {} must be positive", o.count);
    shapes = draw_shapes(o.count, o.seed);
  }
  return shapes;
}

// Explicit kernels timed under --diag: (name, options).
/// The --pdl-ab variant's name among the diag timings.
constexpr const char* kNoPdl = "ours (no PDL)";

std::vector<std::pair<std::string, kernels::GemmOptions>> diag_kernels(const RandomOptions& o) {
  using namespace kernels;
  std::vector<std::pair<std::string, GemmOptions>> kernels_diag;
  if (o.pdl_ab) {
    GemmOptions g;
    g.plan_source = GemmPlanSource::Model;  // the plan "ours" runs
    g.dependent_launch = false;
    kernels_diag.push_back({kNoPdl, g});
  }
  if (o.diag) {
    for (GemmTile t : {GemmTile::T128x256, GemmTile::T256x128, GemmTile::T128x128})
      for (int c : {1, 2}) {
        if (t == GemmTile::T128x128 && c == 2) continue;
        GemmOptions g;
        g.tile = t;
        g.cluster_m = c;
        g.k_splits = 1;
        kernels_diag.push_back({tile_name(t) + "/c" + std::to_string(c), g});
      }
    {
      GemmOptions g;
      g.tile = GemmTile::T128x192;
      kernels_diag.push_back({"128x192/c1", g});
    }
    // The plain-only cluster kernels (cluster_kernel_compiled).
    for (GemmTile t : {GemmTile::T128x128, GemmTile::T128x256, GemmTile::T128x192})
      for (int cm : {1, 2})
        for (int cn : {1, 2})
          if (kernels::cluster_kernel_compiled(t, cm, cn)) {
            GemmOptions g;
            g.tile = t;
            g.cluster_m = cm;
            g.cluster_n = cn;
            kernels_diag.push_back({tile_name(t) + "/c" + std::to_string(cm) + (cn > 1 ? "x2" : ""), g});
          }
    for (int k : {2, 4, 8}) {
      GemmOptions g;
      g.k_splits = k;
      kernels_diag.push_back({"128x128/c1/k" + std::to_string(k), g});
      g.ping_pong = true;
      g.tile = GemmTile::T64x256;
      kernels_diag.push_back({"64x256/pp/k" + std::to_string(k), g});
    }
    for (GemmTile t : {GemmTile::T128x128, GemmTile::T64x256}) {
      GemmOptions g;
      g.tile = t;
      g.ping_pong = true;
      kernels_diag.push_back({tile_name(t) + "/pp", g});
    }
    for (GemmTile t : {GemmTile::T128x256, GemmTile::T128x128}) {
      GemmOptions g;
      g.tile = t;
      g.stream_k = true;
      kernels_diag.push_back({tile_name(t) + "/c1/sk", g});
    }
    // 64x64 ping-pong (whole K and split), for every M.
    for (int k : {1, 2, 4, 8}) {
      GemmOptions g;
      g.tile = GemmTile::T64x64;
      g.k_splits = k;
      kernels_diag.push_back({"64x64/pp" + (k > 1 ? "/k" + std::to_string(k) : std::string()), g});
    }
    // Swapped operands (B [N,K], M <= kSwapMaxM; measure_shape skips them
    // elsewhere), whole K and split.
    for (GemmTile t : {GemmTile::T128x32, GemmTile::T128x64, GemmTile::T128x96})
      for (int k : {1, 2, 4}) {
        GemmOptions g;
        g.tile = t;
        g.swap_ab = true;
        g.k_splits = k;
        kernels_diag.push_back({tile_name(t) + "/swap" + (k > 1 ? "/k" + std::to_string(k) : std::string()), g});
      }
  }

  return kernels_diag;
}

// Host time per call (enqueue only) of `f`, in microseconds.
double host_us(const std::function<void()>& f, cudaStream_t stream) {
  constexpr int kCalls = 50;
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) f();
  const auto t1 = std::chrono::steady_clock::now();
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / kCalls;
}

// One shape: correctness against cuBLASLt, then ours, cuBLASLt and the
// --diag kernels timed in one interleaved loop; prints its line.
Record measure_shape(const RandomOptions& o, DType in, kernels::BLayout layout,
                     const std::vector<std::pair<std::string, kernels::GemmOptions>>& kernels_diag,
                     const std::array<int64_t, 3>& sh, cudaStream_t stream) {
  using namespace kernels;
  const int64_t m = sh[0], n = sh[1], k = sh[2];
  const bool nk = layout == BLayout::NK;
  // Storage leading dimensions: packed, or (diag, K tail) rows padded to 64
  // elements so the padded views below can share the buffers.
  const bool ktail = k % 64 != 0;
  const int64_t kpad = (k + 63) / 64 * 64;
  const int64_t lda_store = o.diag && ktail ? kpad : k;
  const int64_t ldb_store = nk ? lda_store : n;
  const int64_t b_rows = nk ? n : k;
  std::vector<std::unique_ptr<Buf>> as, bs;
  for (int s = 0; s < o.sets; ++s) {
    as.push_back(std::make_unique<Buf>(m * lda_store * 2));
    bs.push_back(std::make_unique<Buf>(b_rows * ldb_store * 2));
    fill_random(as.back()->p, m * lda_store, in, o.seed * 7919 + 1000 + 2 * s, stream);
    fill_random(bs.back()->p, b_rows * ldb_store, in, o.seed * 7919 + 1001 + 2 * s, stream);
  }
  const size_t dbytes = static_cast<size_t>(m * n) * dtype_size(in);
  Buf d(dbytes), ref(dbytes);
  // Packed view (what the sweep measures): lda = K; the rows of the
  // storage are then simply reinterpreted (the data is noise either way).
  auto args = [&](int s, void* out, bool padded) {
    GemmArgs a{as[s]->p, bs[s]->p, out, m, n, k, 0, 0, 0, in, in, layout};
    if (padded) {
      a.lda = kpad;
      if (nk) a.ldb = kpad;
    }
    return a;
  };
  // "ours" is the model's plan, named by plan_gemm (TESSERA_GEMM_TUNED
  // would otherwise switch the default to the tuned plan under that name).
  GemmOptions opt;
  opt.plan_source = kernels::GemmPlanSource::Model;
  GemmOptions tuned_opt;
  tuned_opt.plan_source = kernels::GemmPlanSource::Tuned;
  const GemmPlan plan = plan_gemm(args(0, d.p, false), opt);
  TESSERA_CUDA_CHECK(cudaMemsetAsync(d.p, 0xFF, dbytes, stream));
  TESSERA_CUDA_CHECK(cudaMemsetAsync(ref.p, 0xFF, dbytes, stream));
  kernels::gemm(args(0, d.p, false), opt, stream);
  kernels::cublaslt_gemm(args(0, ref.p, false), stream);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const double err = rel_err(d.p, ref.p, m, n, in);
  // The error of gemm() under `g` against the cuBLASLt result above, into a
  // poisoned D.
  auto err_of = [&](const GemmOptions& g) {
    TESSERA_CUDA_CHECK(cudaMemsetAsync(d.p, 0xFF, dbytes, stream));
    kernels::gemm(args(0, d.p, false), g, stream);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    return rel_err(d.p, ref.p, m, n, in);
  };

  // --tuned: measure this shape's plans (cached in its bucket), then check
  // what gemm() runs under plan_source Tuned like the default plan.
  std::string tuned_plan;
  double tuned_err = NAN;
  if (o.tuned) {
    tune::GemmTuneOptions to;
    to.top_k = o.tune_top_k;
    to.refresh = true;
    const tune::GemmTuneResult tr = tune::gemm_tune(args(0, d.p, false), stream, to);
    for (const std::string& e : tr.errors) fmt::print("  tune: {}\n", e);
    const GemmOptions used = kernels::resolve_options(args(0, d.p, false), tuned_opt);
    tuned_plan = plan_name(plan_gemm(args(0, d.p, false), used));
    tuned_err = err_of(tuned_opt);
  }

  // Every variant's body takes the call's index within its graph and uses
  // input set (call % sets): consecutive calls never reuse a set.
  std::vector<std::function<void(int)>> variants = {
      [&](int i) { kernels::gemm(args(i % o.sets, d.p, false), opt, stream); },
      [&](int i) { kernels::cublaslt_gemm(args(i % o.sets, ref.p, false), stream); }};
  if (o.tuned) variants.push_back([&](int i) { kernels::gemm(args(i % o.sets, d.p, false), tuned_opt, stream); });
  const size_t first_diag = variants.size();
  std::vector<std::string> diag_names;
  double diag_err = 0;  // the largest error of the swapped variants (checked: they are new)
  for (size_t v = 0; v < kernels_diag.size(); ++v) {
    const GemmOptions& dopt = kernels_diag[v].second;
    if (dopt.swap_ab) {
      if (!nk || m > kernels::kSwapMaxM) continue;
      const double e = err_of(dopt);
      diag_err = std::isfinite(e) ? std::max(diag_err, e) : INFINITY;
    }
    diag_names.push_back(kernels_diag[v].first);
    variants.push_back([&, v](int i) { kernels::gemm(args(i % o.sets, d.p, false), kernels_diag[v].second, stream); });
  }
  if (o.diag && ktail) {
    diag_names.push_back("ours ld64");
    variants.push_back([&](int i) { kernels::gemm(args(i % o.sets, d.p, true), opt, stream); });
    diag_names.push_back("cuBLASLt ld64");
    variants.push_back([&](int i) { kernels::cublaslt_gemm(args(i % o.sets, ref.p, true), stream); });
  }
  // Calls per graph: every input set at least once, and about 100 us of GPU
  // work per timed interval by the model's estimate (at most 16 calls).
  tune::GraphTimingOptions g;
  g.warmup = o.warmup;
  g.reps = o.reps;
  const double est_us = std::max(1.0, model_gemm_us(args(0, d.p, false), plan_sm_count(opt), plan));
  g.calls = std::max(o.sets, static_cast<int>(std::min(16.0, std::ceil(100.0 / est_us))));
  const tune::GraphTimes timed = tune::time_graphs_interleaved(stream, variants, g, "bench gemm");
  if (!timed.gpu_only) fmt::print("  timed by host-recorded events (no graph: {})\n", timed.why);
  auto med_ms = [&](size_t v) { return 1e-3 * tune::median_of(timed.us[v]); };
  // --diag: host time per call (enqueue only), ours and cuBLASLt: on small
  // problems the GPU waits for it when calls are issued one by one.
  double host_ours = NAN, host_ref = NAN;
  if (o.diag) {
    int i_ours = 0, i_ref = 0;
    host_ours = host_us([&] { variants[0](i_ours++); }, stream);
    host_ref = host_us([&] { variants[1](i_ref++); }, stream);
  }
  Record r{m, n, k, plan_name(plan), med_ms(0), med_ms(1), med_ms(0) / med_ms(1), err, {}};
  r.calls = g.calls;
  r.gpu_only = timed.gpu_only;
  if (o.tuned) {
    r.tuned_plan = tuned_plan;
    r.tuned_ms = med_ms(2);
    r.tuned_ratio = r.tuned_ms / r.ref_ms;
    r.tuned_err = tuned_err;
  }
  for (size_t v = 0; v < diag_names.size(); ++v) r.diag.push_back({diag_names[v], med_ms(first_diag + v)});
  if (o.diag) {
    r.diag.push_back({"host ours", host_ours * 1e-3});
    r.diag.push_back({"host cuBLASLt", host_ref * 1e-3});
  }
  const double flops = 2.0 * m * n * k;
  std::string line = fmt::format(
      "{:>5} {:>5} {:>5} {:<16} ours {:8.4f} ms {:4.0f} TF/s  cuBLASLt {:8.4f} ms {:4.0f} TF/s  "
      "ratio {:.3f}  err {:.1e}",
      m, n, k, r.plan, r.ours_ms, flops / r.ours_ms * 1e-9, r.ref_ms, flops / r.ref_ms * 1e-9, r.ratio, err);
  if (o.tuned)
    line += fmt::format("  tuned {} {:8.4f} ms ratio {:.3f} err {:.1e}", r.tuned_plan, r.tuned_ms, r.tuned_ratio,
                        r.tuned_err);
  for (const auto& [name, ms] : r.diag) line += fmt::format("  {} {:.3f}", name, ms / r.ref_ms);
  if (diag_err > 0) line += fmt::format("  swap err {:.1e}", diag_err);
  const bool bad = err > 1e-2 || !std::isfinite(err) ||
                   (o.tuned && (r.tuned_err > 1e-2 || !std::isfinite(r.tuned_err))) || !(diag_err <= 1e-2);
  fmt::print("{}{}\n", line, bad ? "  ERROR" : "");
  std::fflush(stdout);
  return r;
}

/// --pdl-ab: geometric mean over the shapes of ours / the variant `what`.
double variant_geomean(const std::vector<Record>& recs, const char* what) {
  std::vector<double> r;
  for (const Record& x : recs)
    for (const auto& [name, ms] : x.diag)
      if (name == what) r.push_back(x.ours_ms / ms);
  return geomean(r);
}

// Summaries: all shapes, then per pattern; prints them and the largest error.
std::vector<Summary> summaries(const RandomOptions& o, const std::vector<Record>& recs, double& max_err) {
  struct Pattern {
    std::string name;
    std::function<bool(const Record&)> in;
  };
  const std::vector<Pattern> patterns = {
      {"all", [](const Record&) { return true; }},
      {"M>=1024 & N,K%64==0 (target <= 1.00)",
       [](const Record& r) { return r.m >= 1024 && r.n % 64 == 0 && r.k % 64 == 0; }},
      {"K%64 != 0", [](const Record& r) { return r.k % 64 != 0; }},
      {"K%64 == 0", [](const Record& r) { return r.k % 64 == 0; }},
      {"M < 256", [](const Record& r) { return r.m < 256; }},
      {"256 <= M < 1024", [](const Record& r) { return r.m >= 256 && r.m < 1024; }},
      {"M >= 1024", [](const Record& r) { return r.m >= 1024; }},
      {"N < 1024", [](const Record& r) { return r.n < 1024; }},
      {"N >= 1024", [](const Record& r) { return r.n >= 1024; }},
  };
  std::vector<Summary> sums;
  for (bool tuned : {false, true}) {
    if (tuned && !o.tuned) continue;
    for (const Pattern& p : patterns) {
      std::vector<double> rs;
      for (const Record& r : recs)
        if (p.in(r)) rs.push_back(tuned ? r.tuned_ratio : r.ratio);
      sums.push_back(summarize_ratios(p.name, rs));
      if (tuned) sums.back().variant = "ours (tuned)";
    }
  }
  max_err = 0;
  for (const Record& r : recs) {
    max_err = std::max(max_err, std::isfinite(r.err) ? r.err : INFINITY);
    if (o.tuned) max_err = std::max(max_err, std::isfinite(r.tuned_err) ? r.tuned_err : INFINITY);
  }
  fmt::print("\n");
  for (const Summary& s : sums)
    fmt::print("{:<14}{:<40} n={:3}  geomean {:.3f}  worst {:.3f}  >1.10: {}\n", s.variant, s.name, s.count, s.geomean,
               s.worst, s.above_110);
  fmt::print("max rel err vs cuBLASLt: {:.2e}{}\n", max_err, max_err > 1e-2 ? "  ERROR" : "");
  if (o.pdl_ab) fmt::print("geomean ours / {}: {:.3f}\n", kNoPdl, variant_geomean(recs, kNoPdl));
  if (o.diag) {
    // Best explicit kernel per shape (what a perfect choice among them would give).
    std::vector<double> best;
    for (const Record& r : recs) {
      double b = r.ours_ms;
      for (const auto& [name, ms] : r.diag)
        if (name.find('/') != std::string::npos) b = std::min(b, ms);  // the explicit kernels
      best.push_back(b / r.ref_ms);
    }
    const Summary s = summarize_ratios("best compiled kernel", best);
    fmt::print("{:<14}{:<40} n={:3}  geomean {:.3f}  worst {:.3f}  >1.10: {}\n", "", s.name, s.count, s.geomean,
               s.worst, s.above_110);
  }

  return sums;
}

nlohmann::json num(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

// bench/results format (bench/results/README.md): provenance + records,
// written by write_results.
void write_json(const RandomOptions& o, const cudaDeviceProp& prop, const std::vector<Summary>& sums, double max_err,
                const std::vector<Record>& recs) {
  const std::string draw = o.mnk.empty() ? fmt::format("random {} seed {}", o.count, o.seed) : std::string("mnk list");
  const nlohmann::json provenance = {
      {"device", o.device_kind},
      {"gpu", prop.name},
      {"sms", prop.multiProcessorCount},
      {"date", results_date()},
      {"commit", results_commit(o.commit == "unknown" ? std::string() : o.commit)},
      {"command", o.command_line},
      {"topic", "gemm"},
      {"issue", 19},
      {"dtype", o.dtype},
      {"layout", o.layout},
      {"reps", o.reps},
      {"warmup", o.warmup},
      {"sets", o.sets},
      {"timing", "GPU time: CUDA graphs of calls_per_graph calls between event-record nodes, interleaved"}};
  nlohmann::json records = nlohmann::json::array();
  for (const Summary& s : sums) {
    if (s.count == 0) continue;
    const std::string c = draw + ": " + s.name;
    const std::string what = s.variant + "/cuBLASLt";
    nlohmann::json g = {{"metric", "geomean " + what}, {"case", c},       {"value", num(s.geomean)}, {"unit", "ratio"},
                        {"baseline", "cuBLASLt"},      {"count", s.count}};
    nlohmann::json w = {
        {"metric", "worst " + what}, {"case", c}, {"value", num(s.worst)}, {"unit", "ratio"}, {"baseline", "cuBLASLt"}};
    if (s.name == "all") {
      g["target"] = {{"op", "<="}, {"value", 1.02}, {"text", "geomean <= 1.02"}};
      w["target"] = {{"op", "<="}, {"value", 1.20}, {"text", "worst <= 1.20"}};
    } else if (s.name.rfind("M>=1024", 0) == 0) {
      g["target"] = {{"op", "<="}, {"value", 1.00}, {"text", "geomean <= 1.00"}};
    }
    records.push_back(g);
    records.push_back(w);
    records.push_back({{"metric", "count " + what + " > 1.10"}, {"case", c}, {"value", s.above_110}});
  }
  records.push_back(
      {{"metric", "max rel err vs cuBLASLt"}, {"case", draw}, {"value", std::isfinite(max_err) ? max_err : 1e9}});
  if (o.pdl_ab) {
    records.push_back({{"metric", std::string("geomean ours/") + kNoPdl},
                       {"case", draw + ": all"},
                       {"value", num(variant_geomean(recs, kNoPdl))},
                       {"unit", "ratio"},
                       {"baseline", kNoPdl},
                       {"count", static_cast<int>(recs.size())}});
  }
  for (const Record& r : recs) {
    nlohmann::json j = {{"metric", "ours/cuBLASLt"},
                        {"case", fmt::format("M={} N={} K={}", r.m, r.n, r.k)},
                        {"value", num(r.ratio)},
                        {"unit", "ratio"},
                        {"baseline", "cuBLASLt"},
                        {"series", draw},
                        {"plan", r.plan},
                        {"ours_ms", num(r.ours_ms)},
                        {"cublaslt_ms", num(r.ref_ms)},
                        {"rel_err", num(r.err)},
                        {"calls_per_graph", r.calls},
                        {"gpu_time_only", r.gpu_only}};
    if (o.tuned) {
      j["tuned_plan"] = r.tuned_plan;
      j["tuned_ms"] = num(r.tuned_ms);
      j["tuned_ratio"] = num(r.tuned_ratio);
      j["tuned_rel_err"] = num(r.tuned_err);
    }
    if (!r.diag.empty()) {
      nlohmann::json dg = nlohmann::json::object();
      for (const auto& [name, ms] : r.diag) dg[name] = num(ms);
      j["diag_ms"] = dg;
    }
    records.push_back(j);
  }
  write_results(o.json, provenance, records, "bench gemm");
  fmt::print("wrote {}\n", o.json);
}

}  // namespace

void run_random(const RandomOptions& o) {
  using namespace kernels;
  TESSERA_CHECK(o.dtype == "bf16" || o.dtype == "f16", "bench gemm: --dtype {} (bf16 or f16)", o.dtype);
  TESSERA_CHECK(o.layout == "nk" || o.layout == "kn", "bench gemm: --layout {} (nk or kn)", o.layout);
  const DType in = o.dtype == "f16" ? DType::f16 : DType::bf16;
  const BLayout layout = o.layout == "nk" ? BLayout::NK : BLayout::KN;
  const std::vector<std::array<int64_t, 3>> shapes = shapes_of(o);
  const cudaDeviceProp prop = current_device_properties();
  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  fmt::print("bench gemm {} on {} ({} SMs), {} in/out, B {}, median of {} after {} warm-up, {} input sets\n",
             o.mnk.empty() ? fmt::format("--random {} --seed {}", o.count, o.seed) : std::string("--mnk"), prop.name,
             prop.multiProcessorCount, o.dtype, layout == BLayout::NK ? "[N,K]" : "[K,N]", o.reps, o.warmup, o.sets);
  fmt::print("GPU time per call: each variant's calls in one CUDA graph between event-record nodes, interleaved\n");
  if (o.tuned) {
    TESSERA_CHECK(o.tune_top_k >= 1 && o.tune_top_k <= 64, "bench gemm: --tune-top-k {} outside [1, 64]", o.tune_top_k);
    fmt::print("--tuned: each shape's plans measured first (top {} of the model + its pick), cache {}\n", o.tune_top_k,
               (tune::cache_dir() / (std::string(tune::kGemmCacheName) + ".json")).string());
  }

  const std::vector<std::pair<std::string, GemmOptions>> kernels_diag = diag_kernels(o);
  std::vector<Record> recs;
  for (const auto& sh : shapes) recs.push_back(measure_shape(o, in, layout, kernels_diag, sh, stream));
  double max_err = 0;
  const std::vector<Summary> sums = summaries(o, recs, max_err);
  if (!o.json.empty()) write_json(o, prop, sums, max_err, recs);
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace tessera::bench::gemm
