// `tessera bench gemm --random N --seed S` (issue 19.3): the engine against
// cuBLASLt on N shapes drawn at random, side by side in one process (CUDA
// events, interleaved runs, warm-up, medians; inputs rotated over --sets
// buffer sets). Every shape is first checked against cuBLASLt on a poisoned
// output (relative error; an unwritten element reads NaN and fails the check).
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
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "common/device_buffer.hpp"
#include "gemm/bench_gemm_kernels.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/runtime/error.hpp"

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
};

double geomean(const std::vector<double>& r) {
  if (r.empty()) return NAN;
  double s = 0;
  for (double x : r) s += std::log(x);
  return std::exp(s / r.size());
}

struct Summary {
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

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o + "\"";
}

std::string json_num(double x) { return std::isfinite(x) ? fmt::format("{:.6g}", x) : "null"; }

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
std::vector<std::pair<std::string, kernels::GemmOptions>> diag_kernels(const RandomOptions& o) {
  using namespace kernels;
  std::vector<std::pair<std::string, GemmOptions>> kernels_diag;
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
    // 64x64 ping-pong (whole K and split), for every M.
    for (int k : {1, 2, 4, 8}) {
      GemmOptions g;
      g.tile = GemmTile::T64x64;
      g.k_splits = k;
      kernels_diag.push_back({"64x64/pp" + (k > 1 ? "/k" + std::to_string(k) : std::string()), g});
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
  const GemmOptions opt{};
  const GemmPlan plan = plan_gemm(args(0, d.p, false), opt);
  TESSERA_CUDA_CHECK(cudaMemsetAsync(d.p, 0xFF, dbytes, stream));
  TESSERA_CUDA_CHECK(cudaMemsetAsync(ref.p, 0xFF, dbytes, stream));
  kernels::gemm(args(0, d.p, false), opt, stream);
  kernels::cublaslt_gemm(args(0, ref.p, false), stream);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const double err = rel_err(d.p, ref.p, m, n, in);

  int i_ours = 0, i_ref = 0;
  std::vector<std::function<void()>> variants = {
      [&] { kernels::gemm(args(i_ours++ % o.sets, d.p, false), opt, stream); },
      [&] { kernels::cublaslt_gemm(args(i_ref++ % o.sets, ref.p, false), stream); }};
  std::vector<std::string> diag_names;
  std::vector<int> diag_i(kernels_diag.size() + 2, 0);
  for (size_t v = 0; v < kernels_diag.size(); ++v) {
    diag_names.push_back(kernels_diag[v].first);
    variants.push_back(
        [&, v] { kernels::gemm(args(diag_i[v]++ % o.sets, d.p, false), kernels_diag[v].second, stream); });
  }
  if (o.diag && ktail) {
    const size_t v0 = kernels_diag.size();
    diag_names.push_back("ours ld64");
    variants.push_back([&, v0] { kernels::gemm(args(diag_i[v0]++ % o.sets, d.p, true), opt, stream); });
    diag_names.push_back("cuBLASLt ld64");
    variants.push_back([&, v0] { kernels::cublaslt_gemm(args(diag_i[v0 + 1]++ % o.sets, ref.p, true), stream); });
  }
  const std::vector<Stats> st = time_interleaved(stream, variants, o.warmup, o.reps, 0);
  // --diag: host time per call (enqueue only), ours and cuBLASLt: on small
  // problems the GPU waits for it.
  double host_ours = NAN, host_ref = NAN;
  if (o.diag) {
    host_ours = host_us(variants[0], stream);
    host_ref = host_us(variants[1], stream);
  }
  Record r{m, n, k, plan_name(plan), st[0].median_ms, st[1].median_ms, st[0].median_ms / st[1].median_ms, err, {}};
  for (size_t v = 0; v < diag_names.size(); ++v) r.diag.push_back({diag_names[v], st[2 + v].median_ms});
  if (o.diag) {
    r.diag.push_back({"host ours", host_ours * 1e-3});
    r.diag.push_back({"host cuBLASLt", host_ref * 1e-3});
  }
  const double flops = 2.0 * m * n * k;
  std::string line = fmt::format(
      "{:>5} {:>5} {:>5} {:<16} ours {:8.4f} ms {:4.0f} TF/s  cuBLASLt {:8.4f} ms {:4.0f} TF/s  "
      "ratio {:.3f}  err {:.1e}",
      m, n, k, r.plan, r.ours_ms, flops / r.ours_ms * 1e-9, r.ref_ms, flops / r.ref_ms * 1e-9, r.ratio, err);
  for (const auto& [name, ms] : r.diag) line += fmt::format("  {} {:.3f}", name, ms / r.ref_ms);
  fmt::print("{}{}\n", line, err > 1e-2 || !std::isfinite(err) ? "  ERROR" : "");
  std::fflush(stdout);
  return r;
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
  for (const Pattern& p : patterns) {
    std::vector<double> rs;
    for (const Record& r : recs)
      if (p.in(r)) rs.push_back(r.ratio);
    sums.push_back(summarize_ratios(p.name, rs));
  }
  max_err = 0;
  for (const Record& r : recs) max_err = std::max(max_err, std::isfinite(r.err) ? r.err : INFINITY);
  fmt::print("\n");
  for (const Summary& s : sums)
    fmt::print("{:<40} n={:3}  geomean {:.3f}  worst {:.3f}  >1.10: {}\n", s.name, s.count, s.geomean, s.worst,
               s.above_110);
  fmt::print("max rel err vs cuBLASLt: {:.2e}{}\n", max_err, max_err > 1e-2 ? "  ERROR" : "");
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
    fmt::print("{:<40} n={:3}  geomean {:.3f}  worst {:.3f}  >1.10: {}\n", s.name, s.count, s.geomean, s.worst,
               s.above_110);
  }

  return sums;
}

// bench/results format (bench/results/README.md): provenance + records.
void write_json(const RandomOptions& o, const cudaDeviceProp& prop, const std::vector<Summary>& sums, double max_err,
                const std::vector<Record>& recs) {
  const auto now = std::chrono::system_clock::now();
  const std::string draw = o.mnk.empty() ? fmt::format("random {} seed {}", o.count, o.seed) : std::string("mnk list");
  std::string j = "{\n  \"provenance\": {";
  j += fmt::format(
      "\"device\": {}, \"gpu\": {}, \"sms\": {}, \"date\": \"{:%Y-%m-%d}\", \"commit\": {}, "
      "\"command\": {}, \"topic\": \"gemm\", \"issue\": 19, \"dtype\": {}, \"layout\": {}, "
      "\"reps\": {}, \"warmup\": {}, \"sets\": {}",
      json_str(o.device_kind), json_str(prop.name), prop.multiProcessorCount,
      fmt::localtime(std::chrono::system_clock::to_time_t(now)), json_str(o.commit), json_str(o.command_line),
      json_str(o.dtype), json_str(o.layout), o.reps, o.warmup, o.sets);
  j += "},\n  \"records\": [\n";
  std::vector<std::string> rs;
  for (const Summary& s : sums) {
    if (s.count == 0) continue;
    std::string tg, tw;
    if (s.name == "all") {
      tg = ", \"target\": {\"op\": \"<=\", \"value\": 1.02, \"text\": \"geomean <= 1.02\"}";
      tw = ", \"target\": {\"op\": \"<=\", \"value\": 1.20, \"text\": \"worst <= 1.20\"}";
    } else if (s.name.rfind("M>=1024", 0) == 0) {
      tg = ", \"target\": {\"op\": \"<=\", \"value\": 1.00, \"text\": \"geomean <= 1.00\"}";
    }
    const std::string c = json_str(draw + ": " + s.name);
    rs.push_back(
        fmt::format("    {{\"metric\": \"geomean ours/cuBLASLt\", \"case\": {}, \"value\": {}, \"unit\": "
                    "\"ratio\", \"baseline\": \"cuBLASLt\", \"count\": {}{}}}",
                    c, json_num(s.geomean), s.count, tg));
    rs.push_back(
        fmt::format("    {{\"metric\": \"worst ours/cuBLASLt\", \"case\": {}, \"value\": {}, \"unit\": "
                    "\"ratio\", \"baseline\": \"cuBLASLt\"{}}}",
                    c, json_num(s.worst), tw));
    rs.push_back(
        fmt::format("    {{\"metric\": \"count ours/cuBLASLt > 1.10\", \"case\": {}, \"value\": {}}}", c, s.above_110));
  }
  rs.push_back(fmt::format("    {{\"metric\": \"max rel err vs cuBLASLt\", \"case\": {}, \"value\": {}}}",
                           json_str(draw), std::isfinite(max_err) ? fmt::format("{:.3e}", max_err) : "1e9"));
  for (const Record& r : recs) {
    std::string dg;
    for (const auto& [name, ms] : r.diag)
      dg += fmt::format("{}{}: {}", dg.empty() ? "" : ", ", json_str(name), json_num(ms));
    rs.push_back(fmt::format(
        "    {{\"metric\": \"ours/cuBLASLt\", \"case\": \"M={} N={} K={}\", \"value\": {}, \"unit\": \"ratio\", "
        "\"baseline\": \"cuBLASLt\", \"series\": {}, \"plan\": {}, \"ours_ms\": {}, \"cublaslt_ms\": {}, "
        "\"rel_err\": {}{}}}",
        r.m, r.n, r.k, json_num(r.ratio), json_str(draw), json_str(r.plan), json_num(r.ours_ms), json_num(r.ref_ms),
        json_num(r.err), dg.empty() ? "" : ", \"diag_ms\": {" + dg + "}"));
  }
  for (size_t i = 0; i < rs.size(); ++i) j += rs[i] + (i + 1 < rs.size() ? ",\n" : "\n");
  j += "  ]\n}\n";
  std::ofstream f(o.json);
  TESSERA_CHECK(f.good(), "bench gemm: cannot write --json {}", o.json);
  f << j;
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

  const std::vector<std::pair<std::string, GemmOptions>> kernels_diag = diag_kernels(o);
  std::vector<Record> recs;
  for (const auto& sh : shapes) recs.push_back(measure_shape(o, in, layout, kernels_diag, sh, stream));
  double max_err = 0;
  const std::vector<Summary> sums = summaries(o, recs, max_err);
  if (!o.json.empty()) write_json(o, prop, sums, max_err, recs);
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace tessera::bench::gemm
