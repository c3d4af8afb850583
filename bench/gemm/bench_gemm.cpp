// `tessera bench gemm` — Tessera's GEMM engine against cuBLASLt, side by side
// in one process: CUDA events, warm-up, median of --reps, inputs rotated over
// several buffer sets so L2 never holds them, fresh random data (never zeros).
// Prints per shape: both times, TFLOP/s, ours/cuBLASLt, the relative error of
// ours vs cuBLASLt, (--hooks) the time with idle hooks compiled in, and
// (--overlap) the ping-pong kernels (GemmOptions::ping_pong, tiles
// 128x128 and 64x256) against cuBLASLt, with a bitwise check against ours.
#include <cuda_runtime_api.h>
#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "command.hpp"
#include "common/device_buffer.hpp"
#include "common/timing.hpp"
#include "gemm/bench_gemm_kernels.hpp"
#include "gemm/bench_gemm_random.hpp"
#include "gemm/bench_rs_epilogue.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::bench::gemm {

// Times several variants interleaved (v0, v1, ..., v0, v1, ...), each run
// bracketed by its own events, so clock and thermal drift affect all alike.
// gap_ms = 0: back to back, the GPU at its power cap (what a training loop
// sees); gap_ms > 0: each run starts after a drain and that much idle time,
// at boost clocks (how one-off measurements, e.g. MACHINES.md's, are taken).
std::vector<Stats> time_interleaved(cudaStream_t stream, const std::vector<std::function<void()>>& variants, int warmup,
                                    int reps, double gap_ms) {
  for (int i = 0; i < warmup; ++i)
    for (const auto& v : variants) v();
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const size_t nv = variants.size();
  std::vector<cudaEvent_t> ev(2 * nv * reps);
  for (auto& e : ev) TESSERA_CUDA_CHECK(cudaEventCreate(&e));
  for (int r = 0; r < reps; ++r)
    for (size_t v = 0; v < nv; ++v) {
      if (gap_ms > 0) {
        TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(gap_ms));
      }
      TESSERA_CUDA_CHECK(cudaEventRecord(ev[2 * (r * nv + v)], stream));
      variants[v]();
      TESSERA_CUDA_CHECK(cudaEventRecord(ev[2 * (r * nv + v) + 1], stream));
    }
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<Stats> out;
  for (size_t v = 0; v < nv; ++v) {
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      float ms = 0;
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * (r * nv + v)], ev[2 * (r * nv + v) + 1]));
      t.push_back(ms);
    }
    out.push_back(summarize(std::move(t)));
  }
  for (auto& e : ev) TESSERA_CUDA_CHECK(cudaEventDestroy(e));
  return out;
}

namespace {

struct Options {
  int64_t m = 8192;
  // N x K of the per-rank MLP GEMMs at TP=2 and 8192^3.
  std::vector<std::string> shapes = {"5504x4096",  "4096x5504",  "7168x4096",  "4096x7168",  "7168x3584",
                                     "3584x7168",  "18432x4608", "4608x18432", "14336x8192", "8192x14336",
                                     "14784x8192", "8192x14784", "8192x8192"};
  int reps = 30;
  double gap_ms = 0;  // idle time before every timed run (0: back to back)
  int warmup = 5;
  int sets = 3;
  std::string dtype = "bf16";
  std::string layout = "nk";
  std::string tile = "auto";
  int cluster = 0;
  bool hooks = true;
  bool overlap = true;
  bool rs_epilogue = false;
  std::string results_md;
  std::string commit = "unknown";
  std::string device_kind = "unknown";
  std::string command_line;
};

kernels::GemmTile parse_tile(const std::string& s) {
  if (s == "auto") return kernels::GemmTile::Auto;
  if (s == "128x256") return kernels::GemmTile::T128x256;
  if (s == "256x128") return kernels::GemmTile::T256x128;
  if (s == "128x128") return kernels::GemmTile::T128x128;
  TESSERA_FAIL("bench gemm: unknown --tile '{}' (auto, 128x256, 256x128, 128x128)", s);
}

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) { TESSERA_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

double rel_err_device(const void* out, const void* ref, int64_t n) {
  std::vector<uint16_t> a(n), b(n);
  TESSERA_CUDA_CHECK(cudaMemcpy(a.data(), out, n * 2, cudaMemcpyDeviceToHost));
  TESSERA_CUDA_CHECK(cudaMemcpy(b.data(), ref, n * 2, cudaMemcpyDeviceToHost));
  auto f = [](uint16_t v) {  // bf16 -> float
    uint32_t u = static_cast<uint32_t>(v) << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return static_cast<double>(x);
  };
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = f(a[i]), y = f(b[i]);
    if (!std::isfinite(x) || !std::isfinite(y)) return INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : INFINITY;
}

void replace_section(const std::string& path, const std::string& heading, const std::string& body) {
  std::string text;
  {
    std::ifstream in(path);
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      text = ss.str();
    }
  }
  if (text.empty())
    text = "# Tessera benchmark results\n\nEvery figure a claim rests on: device kind, date, commit, command.\n";
  const std::string h = "## " + heading + "\n";
  const size_t start = text.find(h);
  if (start == std::string::npos) {
    if (!text.empty() && text.back() != '\n') text += '\n';
    text += "\n" + h + body;
  } else {
    size_t end = text.find("\n## ", start + h.size());
    end = end == std::string::npos ? text.size() : end + 1;
    text.replace(start, end - start, h + body);
  }
  std::ofstream out(path);
  TESSERA_CHECK(out.good(), "bench gemm: cannot write {}", path);
  out << text;
}

/// What every shape shares: options, stream, dtype, layout and the table.
struct Setup {
  const Options& o;
  cudaStream_t stream;
  DType in;
  kernels::BLayout layout;
  bool hooks;   ///< idle-hook columns (bf16, B [N, K])
  bool rs_epi;  ///< --rs-epilogue columns
  std::vector<kernels::GemmTile> pp_tiles;
};

std::vector<std::string> table_columns(const Setup& su) {
  std::vector<std::string> columns = {"M",
                                      "N",
                                      "K",
                                      "tile",
                                      "ours ms",
                                      "cuBLASLt ms",
                                      "ours TF/s",
                                      "cuBLASLt TF/s",
                                      "ours/cuBLASLt",
                                      "idle wait",
                                      "idle notify",
                                      "idle both",
                                      "idle wait/tile",
                                      "rel err"};
  for (kernels::GemmTile t : su.pp_tiles) {
    columns.push_back("overlap " + tile_name(t) + " ms");
    columns.push_back("overlap " + tile_name(t) + "/cuBLASLt");
  }
  if (!su.pp_tiles.empty()) columns.push_back("overlap == ours");
  columns.push_back("cooperative/cuBLASLt");
  if (su.rs_epi) {
    for (const char* c : {"RS kernel", "RS - owner add", "RS - all three", "plain rotated", "plain (this launch)"})
      columns.push_back(c);
    columns.push_back("RS == ours");
  }
  return columns;
}

/// One shape's rotated inputs and outputs.
struct ShapeBuffers {
  int64_t m, n, k;
  DType in;
  kernels::BLayout layout;
  std::vector<std::unique_ptr<Dev>> as, bs;
  Dev d, ref;

  ShapeBuffers(const Setup& su, int64_t m_, int64_t n_, int64_t k_)
      : m(m_), n(n_), k(k_), in(su.in), layout(su.layout), d(m * n * 2), ref(m * n * 2) {
    for (int s = 0; s < su.o.sets; ++s) {
      as.push_back(std::make_unique<Dev>(m * k * 2));
      bs.push_back(std::make_unique<Dev>(n * k * 2));
      fill_random(as.back()->p, m * k, in, 1000 + 2 * s, su.stream);
      fill_random(bs.back()->p, n * k, in, 1001 + 2 * s, su.stream);
    }
  }
  kernels::GemmArgs args_for(int s, void* out) const {
    return kernels::GemmArgs{as[s]->p, bs[s]->p, out, m, n, k, 0, 0, 0, in, in, layout};
  }
  /// D (poisoned first) from `gemm` on input set 0, copied to the host.
  template <class F>
  std::vector<uint8_t> output_of(F&& gemm, cudaStream_t stream) {
    std::vector<uint8_t> out(m * n * 2);
    TESSERA_CUDA_CHECK(cudaMemsetAsync(d.p, 0xFF, m * n * 2, stream));
    gemm(args_for(0, d.p));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    TESSERA_CUDA_CHECK(cudaMemcpy(out.data(), d.p, out.size(), cudaMemcpyDeviceToHost));
    return out;
  }
};

/// The ping-pong kernels' options; each must reproduce `want` (ours) bit for bit.
std::vector<kernels::GemmOptions> ping_pong_options(const Setup& su, ShapeBuffers& sb, const kernels::GemmOptions& opt,
                                                    const std::vector<uint8_t>& want, bool& identical) {
  std::vector<kernels::GemmOptions> pp_opts;
  identical = true;
  for (kernels::GemmTile t : su.pp_tiles) {
    kernels::GemmOptions po = opt;
    po.tile = t;
    po.cluster_m = 0;
    po.ping_pong = true;
    pp_opts.push_back(po);
    const std::vector<uint8_t> got =
        sb.output_of([&](const kernels::GemmArgs& a) { kernels::gemm(a, po, su.stream); }, su.stream);
    if (got != want) {
      identical = false;
      fmt::print("WARNING {}x{}x{}: overlap {} differs from ours (rel err vs cuBLASLt {:.1e})\n", sb.m, sb.n, sb.k,
                 tile_name(t), su.in == DType::bf16 ? rel_err_device(sb.d.p, sb.ref.p, sb.m * sb.n) : NAN);
    }
  }
  return pp_opts;
}

/// GEMM+RS fused_ce's kernel at a pretend world of 2 (rank 0), flags set:
/// remote rows land in stage rows M/2.., own rows in rs_d after adding the
/// peer slab of rs_recv, which is zero, so both halves must equal ours.
struct RsKernelCheck {
  static constexpr RsEpi kKinds[] = {RsEpi::Current, RsEpi::NoOwnerAdd, RsEpi::SkipAll, RsEpi::PlainRotated,
                                     RsEpi::PlainHere};
  int64_t m, n, ld8;
  Dev stage, recv, d, flags, count;
  RsEpilogueBuffers rsb;
  std::string same = "-";

  explicit RsKernelCheck(const ShapeBuffers& sb)
      : m(sb.m),
        n(sb.n),
        ld8((sb.n + 7) / 8 * 8),
        stage(m * ld8 * 2),
        recv(m * ld8 * 2),
        d(m / 2 * n * 2),
        flags(2 * (m / 512 + 1) * 8),
        count((m / 512 + 1) * 8) {
    TESSERA_CUDA_CHECK(cudaMemset(recv.p, 0, m * ld8 * 2));
    TESSERA_CUDA_CHECK(cudaMemset(flags.p, 0xFF, 2 * (m / 512 + 1) * 8));  // >= epoch 1
    TESSERA_CUDA_CHECK(cudaMemset(count.p, 0, (m / 512 + 1) * 8));
    rsb = {stage.p, recv.p, d.p, static_cast<const uint64_t*>(flags.p), static_cast<uint64_t*>(count.p)};
  }

  /// Every kind's output against ours (`want`); sets `same`.
  void verify(ShapeBuffers& sb, const std::vector<uint8_t>& want, cudaStream_t stream) {
    bool ok = true;
    for (RsEpi which : kKinds) {
      if (which >= RsEpi::PlainRotated) {  // the plain epilogue into d
        const std::vector<uint8_t> got =
            sb.output_of([&](const kernels::GemmArgs& a) { gemm_rs_epilogue(which, a, rsb, stream); }, stream);
        ok = ok && got == want;
        continue;
      }
      TESSERA_CUDA_CHECK(cudaMemsetAsync(stage.p, 0xFF, m * ld8 * 2, stream));
      TESSERA_CUDA_CHECK(cudaMemsetAsync(d.p, 0xFF, m / 2 * n * 2, stream));
      gemm_rs_epilogue(which, sb.args_for(0, sb.d.p), rsb, stream);
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<uint8_t> own(m / 2 * n * 2), remote(m / 2 * n * 2);
      TESSERA_CUDA_CHECK(cudaMemcpy(own.data(), d.p, own.size(), cudaMemcpyDeviceToHost));
      TESSERA_CUDA_CHECK(cudaMemcpy2D(remote.data(), n * 2, static_cast<uint8_t*>(stage.p) + m / 2 * ld8 * 2, ld8 * 2,
                                      n * 2, m / 2, cudaMemcpyDeviceToHost));
      ok = ok && std::equal(own.begin(), own.end(), want.begin()) &&
           std::equal(remote.begin(), remote.end(), want.begin() + m / 2 * n * 2);
    }
    same = ok ? "yes" : "NO";
    if (!ok) fmt::print("WARNING {}x{}x{}: the RS kernel's output differs from ours\n", m, n, sb.k);
  }
};

/// Summary of the ratios: median and worst.
struct Ratios {
  std::vector<double> ours;
  std::vector<std::vector<double>> pp;
};

/// One shape: correctness first, then every variant timed in one interleaved
/// loop, then its table row.
void run_shape(const Setup& su, const std::string& shape, Table& table, Ratios& ratios) {
  using namespace kernels;
  const Options& o = su.o;
  cudaStream_t stream = su.stream;
  int64_t n = 0, k = 0;
  TESSERA_CHECK(std::sscanf(shape.c_str(), "%ldx%ld", &n, &k) == 2, "bench gemm: shape '{}' is not NxK", shape);
  const int64_t m = o.m;
  GemmOptions opt;
  opt.tile = parse_tile(o.tile);
  opt.cluster_m = o.cluster;
  ShapeBuffers sb(su, m, n, k);
  Dev& d = sb.d;
  // One counter per tile of the smallest tile (64 rows, 128 columns) covers every kernel.
  const int64_t counter_bytes = ((m + 63) / 64) * ((n + 127) / 128) * 4;
  Dev flags(((m + 127) / 128) * 4), counters(counter_bytes);
  TESSERA_CUDA_CHECK(cudaMemset(flags.p, 0xFF, ((m + 127) / 128) * 4));  // always ready (>= any epoch)
  TESSERA_CUDA_CHECK(cudaMemset(counters.p, 0, counter_bytes));
  const auto args_for = [&](int s, void* out) { return sb.args_for(s, out); };
  // Correctness of this very configuration first.
  TESSERA_CUDA_CHECK(cudaMemsetAsync(d.p, 0xFF, m * n * 2, stream));
  kernels::gemm(args_for(0, d.p), opt, stream);
  kernels::cublaslt_gemm(args_for(0, sb.ref.p), stream);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const double err = su.in == DType::bf16 ? rel_err_device(d.p, sb.ref.p, m * n) : NAN;
  std::vector<GemmOptions> pp_opts;
  bool pp_identical = true;
  if (!su.pp_tiles.empty()) {
    std::vector<uint8_t> want(m * n * 2);
    TESSERA_CUDA_CHECK(cudaMemcpy(want.data(), d.p, want.size(), cudaMemcpyDeviceToHost));
    pp_opts = ping_pong_options(su, sb, opt, want, pp_identical);
  }

  // The cooperative kernel the tile heuristic picks (the default before the
  // ping-pong one), for comparison when the default is ping-pong.
  GemmArgs probe = args_for(0, d.p);
  const bool default_pp = plain_uses_ping_pong(probe, opt);
  GemmOptions coop = opt;
  coop.tile = resolve_tile(probe, opt);
  int i_ours = 0, i_ref = 0, i_wait = 0, i_notify = 0, i_both = 0, i_tile = 0, i_coop = 0;
  std::vector<std::function<void()>> variants = {
      [&] { kernels::gemm(args_for(i_ours++ % o.sets, d.p), opt, stream); },
      [&] { kernels::cublaslt_gemm(args_for(i_ref++ % o.sets, sb.ref.p), stream); }};
  auto hooked = [&](Hooks which, int& i) {
    return [&, which] {
      gemm_idle_hooks(which, args_for(i++ % o.sets, d.p), opt, static_cast<const uint32_t*>(flags.p), 1,
                      static_cast<uint32_t*>(counters.p), stream);
    };
  };
  if (su.hooks) {
    variants.push_back(hooked(Hooks::WaitOnly, i_wait));
    variants.push_back(hooked(Hooks::NotifyOnly, i_notify));
    variants.push_back(hooked(Hooks::Both, i_both));
    variants.push_back(hooked(Hooks::WaitPerTile, i_tile));
  }
  const size_t i_coop_v = variants.size();
  if (default_pp) variants.push_back([&] { kernels::gemm(args_for(i_coop++ % o.sets, d.p), coop, stream); });
  std::unique_ptr<RsKernelCheck> rs;
  size_t i_rs_v = 0;
  std::vector<int> i_rs(std::size(RsKernelCheck::kKinds), 0);
  if (su.rs_epi) {
    rs = std::make_unique<RsKernelCheck>(sb);
    const std::vector<uint8_t> want = sb.output_of([&](const GemmArgs& a) { kernels::gemm(a, opt, stream); }, stream);
    rs->verify(sb, want, stream);
    i_rs_v = variants.size();
    for (size_t v = 0; v < i_rs.size(); ++v)
      variants.push_back(
          [&, v] { gemm_rs_epilogue(RsKernelCheck::kKinds[v], args_for(i_rs[v]++ % o.sets, d.p), rs->rsb, stream); });
  }
  const size_t first_pp = variants.size();
  std::vector<int> i_pp(pp_opts.size(), 0);
  for (size_t v = 0; v < pp_opts.size(); ++v)
    variants.push_back([&, v] { kernels::gemm(args_for(i_pp[v]++ % o.sets, d.p), pp_opts[v], stream); });
  const std::vector<Stats> st = time_interleaved(stream, variants, o.warmup, o.reps, o.gap_ms);

  const Stats& ours = st[0];
  const Stats& base = st[1];
  auto cost = [&](size_t v) -> std::string {
    if (!su.hooks) return "-";
    return fmt::format("{:+.1f}%", (st[v].median_ms / ours.median_ms - 1) * 100);
  };
  const double flops = 2.0 * m * n * k;
  const double ratio = ours.median_ms / base.median_ms;
  ratios.ours.push_back(ratio);
  std::vector<std::string> row = {fmt::format("{}", m),
                                  fmt::format("{}", n),
                                  fmt::format("{}", k),
                                  default_pp
                                      ? std::string("64x256/pp")
                                      : tile_name(resolve_tile(probe, opt)) + "/c" +
                                            std::to_string(resolve_cluster(probe, opt, resolve_tile(probe, opt))),
                                  fmt::format("{:.3f}", ours.median_ms),
                                  fmt::format("{:.3f}", base.median_ms),
                                  fmt::format("{:.0f}", flops / ours.median_ms * 1e-9),
                                  fmt::format("{:.0f}", flops / base.median_ms * 1e-9),
                                  fmt::format("{:.3f}", ratio),
                                  cost(2),
                                  cost(3),
                                  cost(4),
                                  cost(5),
                                  fmt::format("{:.1e}", err)};
  for (size_t v = 0; v < pp_opts.size(); ++v) {
    const double r = st[first_pp + v].median_ms / base.median_ms;
    ratios.pp[v].push_back(r);
    row.push_back(fmt::format("{:.3f}", st[first_pp + v].median_ms));
    row.push_back(fmt::format("{:.3f}", r));
  }
  if (!pp_opts.empty()) row.push_back(pp_identical ? "yes" : "NO");
  row.push_back(default_pp ? fmt::format("{:.3f}", st[i_coop_v].median_ms / base.median_ms) : "-");
  if (su.rs_epi) {
    // Against the plain ping-pong kernel: ours when it is the default.
    const double pp_ms = default_pp ? ours.median_ms : NAN;
    for (size_t v = 0; v < i_rs.size(); ++v)
      row.push_back(fmt::format("{:+.1f}%", (st[i_rs_v + v].median_ms / pp_ms - 1) * 100));
    row.push_back(rs->same);
  }
  table.add(row);
  fmt::print("{}x{}x{}: ours {:.3f} ms, cuBLASLt {:.3f} ms, ratio {:.3f}\n", m, n, k, ours.median_ms, base.median_ms,
             ratio);
  std::fflush(stdout);
}

void write_results_md(const Setup& su, const cudaDeviceProp& prop, const Table& table, double median_ratio,
                      double worst, const std::string& pp_summary) {
  const Options& o = su.o;
  const auto now = std::chrono::system_clock::now();
  const std::string body = fmt::format(
      "Device kind: {} ({}, {} SMs). Date: {:%Y-%m-%d}. Commit: {}.\n"
      "Command: `{}`\n\n"
      "bf16 inputs unless stated, f32 accumulation, B as {}; time = median of {} CUDA-event-timed runs after {} "
      "warm-ups (all variants interleaved run by run), inputs rotated over {} buffer sets. ours/cuBLASLt < 1 means "
      "ours is faster. \"idle wait / notify / "
      "both\" = extra time of the same GEMM (same kernel as \"ours\") with a FlagWait prologue whose flags are "
      "already "
      "set (memoized; waited for by the producer's waiter warp ahead of the TMA thread), a per-tile notify epilogue, "
      "or both, compiled in; \"idle wait/tile\" = the same "
      "flags acquired on every tile with a proxy fence per tile (the FlagWait before the memo; same waiter). Tile "
      "\"64x256/pp\" = the ping-pong kernel the plain "
      "gemm() picks by default; \"cooperative\" = the cooperative kernel the tile heuristic picks (the default "
      "before).\n\n"
      "{}\nMedian ours/cuBLASLt = {:.3f}; worst = {:.3f}.\n{}",
      o.device_kind, prop.name, prop.multiProcessorCount, fmt::localtime(std::chrono::system_clock::to_time_t(now)),
      o.commit, o.command_line, su.layout == kernels::BLayout::NK ? "[N, K]" : "[K, N]", o.reps, o.warmup, o.sets,
      table.markdown(), median_ratio, worst, pp_summary);
  replace_section(o.results_md, "GEMM engine", body);
  fmt::print("wrote section \"GEMM engine\" of {}\n", o.results_md);
}

void run(const Options& o) {
  using namespace kernels;
  const DType in = o.dtype == "f16" ? DType::f16 : DType::bf16;
  TESSERA_CHECK(o.dtype == "bf16" || o.dtype == "f16", "bench gemm: --dtype {} (bf16 or f16)", o.dtype);
  TESSERA_CHECK(o.layout == "nk" || o.layout == "kn", "bench gemm: --layout {} (nk or kn)", o.layout);
  const BLayout layout = o.layout == "nk" ? BLayout::NK : BLayout::KN;
  const cudaDeviceProp prop = current_device_properties();
  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  fmt::print("bench gemm on {} ({} SMs), {} in/out, B {}, M = {}, median of {} after {} warm-up, {} input sets, {}\n",
             prop.name, prop.multiProcessorCount, o.dtype, layout == BLayout::NK ? "[N,K]" : "[K,N]", o.m, o.reps,
             o.warmup, o.sets,
             o.gap_ms > 0 ? fmt::format("{} ms idle before each run", o.gap_ms) : std::string("back to back"));
  // --rs-epilogue: GEMM+RS fused_ce's kernel on this one GPU (bench_rs_epilogue.hpp).
  const bool rs_epi = o.rs_epilogue && in == DType::bf16 && layout == BLayout::NK;
  const Setup su{o,
                 stream,
                 in,
                 layout,
                 o.hooks && in == DType::bf16 && layout == BLayout::NK,
                 rs_epi,
                 o.overlap ? std::vector<GemmTile>{GemmTile::T128x128, GemmTile::T64x256} : std::vector<GemmTile>{}};
  const std::vector<std::string> columns = table_columns(su);
  TESSERA_CHECK(!o.rs_epilogue || rs_epi, "bench gemm: --rs-epilogue needs --dtype bf16 --layout nk");
  TESSERA_CHECK(!rs_epi || o.m % 128 == 0, "bench gemm: --rs-epilogue needs M (--m {}) a multiple of 128", o.m);
  Table table(columns);
  Ratios ratios;
  ratios.pp.resize(su.pp_tiles.size());
  for (const std::string& shape : o.shapes) run_shape(su, shape, table, ratios);
  std::vector<double> sorted = ratios.ours;
  std::sort(sorted.begin(), sorted.end());
  const double median_ratio = sorted.empty() ? NAN : sorted[sorted.size() / 2];
  const double worst = sorted.empty() ? NAN : sorted.back();
  fmt::print("\n{}\nmedian ours/cuBLASLt = {:.3f}, worst = {:.3f}\n", table.str(), median_ratio, worst);
  std::string pp_summary;
  for (size_t v = 0; v < su.pp_tiles.size(); ++v) {
    std::vector<double> r = ratios.pp[v];
    std::sort(r.begin(), r.end());
    if (r.empty()) continue;
    pp_summary += fmt::format("Overlap (ping-pong) {}: median /cuBLASLt = {:.3f}; worst = {:.3f}.\n",
                              tile_name(su.pp_tiles[v]), r[r.size() / 2], r.back());
  }
  fmt::print("{}", pp_summary);
  if (!o.results_md.empty()) write_results_md(su, prop, table, median_ratio, worst, pp_summary);
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto& bench = tools::subcommand(root, "bench", "Benchmarks");
  auto opts = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("gemm", "Tessera's GEMM engine vs cuBLASLt (time, TFLOP/s, ratio per shape)");
  cmd->add_option("--m", opts->m, "rows of A and D")->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--shapes", opts->shapes, "NxK list")->delimiter(',');
  cmd->add_option("--reps", opts->reps, "timed repetitions (median)")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", opts->warmup, "warm-up repetitions")->check(CLI::Range(0, 100000));
  cmd->add_option("--sets", opts->sets, "input buffer sets rotated between runs")->check(CLI::Range(1, 16));
  cmd->add_option("--gap-ms", opts->gap_ms,
                  "drain and idle this long before every timed run (0: back to back, power-capped clocks)")
      ->check(CLI::Range(0.0, 1000.0));
  cmd->add_option("--dtype", opts->dtype, "bf16 or f16 (inputs and output)");
  cmd->add_option("--layout", opts->layout, "nk (B is [N,K]) or kn (B is [K,N])");
  cmd->add_option("--tile", opts->tile, "auto, 128x256, 256x128, 128x128");
  cmd->add_option("--cluster", opts->cluster, "CTAs per cluster along M: 0 auto, 1, 2")->check(CLI::Range(0, 2));
  cmd->add_option("--hooks", opts->hooks, "also time the GEMM with idle hooks compiled in (bf16, nk)");
  cmd->add_option("--overlap", opts->overlap,
                  "also time the ping-pong kernels (ping_pong; 128x128 and 64x256), checked bitwise against ours");
  cmd->add_flag("--rs-epilogue", opts->rs_epilogue,
                "also time GEMM+RS fused_ce's kernel on this GPU (pretend world 2, flags set; bf16, nk): its cost "
                "over the plain ping-pong kernel, with parts left out (ops::DiagSkip), and the plain kernel in its "
                "rotated order");
  cmd->add_option("--results-md", opts->results_md, "replace the \"GEMM engine\" section of this Markdown file");
  cmd->add_option("--commit", opts->commit, "commit recorded in --results-md");
  cmd->add_option("--device-kind", opts->device_kind, "device kind recorded in --results-md and --json");
  auto ropts = std::make_shared<RandomOptions>();
  cmd->add_option("--random", ropts->count,
                  "time N shapes drawn at random (M log-uniform 16..16384; N, K log-uniform 512..16384, multiples "
                  "of 8) against cuBLASLt, each checked against it")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--seed", ropts->seed, "seed of --random's draw");
  cmd->add_option("--mnk", ropts->mnk, "with the --random report: these MxNxK shapes instead of a draw")
      ->delimiter(',');
  cmd->add_flag("--diag", ropts->diag,
                "with --random / --mnk: also time every compiled kernel and, for a K tail, 64-element leading "
                "dimensions");
  cmd->add_option("--json", ropts->json, "with --random / --mnk: write per-shape records and the summary here");
  cmd->add_flag(
      "--tuned", ropts->tuned,
      "with --random / --mnk: measure each shape's plans first (tune::gemm_tune, cached per shape bucket "
      "under $TESSERA_CACHE_DIR) and time \"ours (tuned)\" (gemm, plan_source Tuned) beside ours and cuBLASLt");
  cmd->add_flag("--pdl-ab", ropts->pdl_ab,
                "with --random / --mnk: also time \"ours (no PDL)\", the same plan launched without programmatic "
                "dependent launch, interleaved with the others");
  cmd->add_option("--tune-top-k", ropts->tune_top_k, "with --tuned: the model's k cheapest plans measured per shape")
      ->check(CLI::Range(1, 64));
  cmd->callback([opts, ropts, cmd] {
    Options o = *opts;
    o.command_line = "tessera bench gemm";
    for (const auto* opt : cmd->get_options())
      if (opt->count() > 0 && opt->get_name() != "--help")
        o.command_line += " " + opt->get_name() + " " + [&] {
          std::string v;
          for (const auto& r : opt->results()) v += (v.empty() ? "" : ",") + r;
          return v;
        }();
    if (ropts->count > 0 || !ropts->mnk.empty()) {
      RandomOptions r = *ropts;
      r.dtype = o.dtype;
      r.layout = o.layout;
      if (cmd->get_option("--reps")->count() > 0) r.reps = o.reps;
      if (cmd->get_option("--warmup")->count() > 0) r.warmup = o.warmup;
      if (cmd->get_option("--sets")->count() > 0) r.sets = o.sets;
      r.commit = o.commit;
      r.device_kind = o.device_kind;
      r.command_line = o.command_line;
      return run_random(r);
    }
    run(o);
  });
});

}  // namespace tessera::bench::gemm
