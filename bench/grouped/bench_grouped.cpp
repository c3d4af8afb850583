// `tessera bench grouped` — the grouped GEMM on the MoE-1..6 expert GEMMs
// (../shared/WORKLOADS.md) against, in the same loop: a per-expert cuBLASLt
// loop, one dense GEMM of the same FLOPs (cuBLASLt and the engine's gemm()),
// and torch._grouped_mm timed by scripts/bench_grouped_torch.py on the same
// shapes and routing (--torch-json: its output, merged per problem).
//
// Problems: gate/up (N = 2 I / TP, K = H) and down (N = H, K = I / TP) at
// each TP, rows = S * topk, with uniform routing or skewed routing (one
// expert takes half of the routed rows, capped at S since a token picks an
// expert once; every 4th other expert takes none; the rest share evenly).
// The row counts are uploaded once per problem; the grouped GEMM reads them
// on the device (max_rows = S * topk). Timing: CUDA events per call, all
// variants interleaved run by run (InterleavedTimer), medians. ours is also
// checked against the per-expert cuBLASLt loop (relative error over sampled
// rows) and its status words.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "command.hpp"
#include "common/device_buffer.hpp"
#include "common/timing.hpp"
#include "gemm/bench_gemm_kernels.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/grouped_gemm.hpp"
#include "tessera/kernels/moe_routing.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::bench::grouped {
namespace {

using kernels::GroupedTile;

struct Moe {
  const char* name;
  int64_t S, H, I, E, topk;
};
constexpr Moe kMoe[] = {{"MoE-1", 8192, 2048, 1536, 8, 2},  {"MoE-2", 8192, 2048, 1536, 32, 2},
                        {"MoE-3", 8192, 2048, 1536, 32, 5}, {"MoE-4", 8192, 4096, 2048, 8, 2},
                        {"MoE-5", 8192, 4096, 2048, 32, 2}, {"MoE-6", 8192, 4096, 2048, 32, 5}};

struct Options {
  std::vector<int> tp = {1, 2, 4};
  std::vector<std::string> shapes;  // empty: all
  std::vector<std::string> routing = {"uniform", "skewed"};
  int reps = 20, warmup = 5;
  bool tiles = false;           // also time every configuration
  bool gather = false;          // gate/up: the gathering GEMM against a gather kernel + GEMM
  std::vector<int> bands = {};  // also time these raster bands (auto tile)
  std::string torch_json, json, commit, device_kind, command_line;
};

std::vector<int> routing(int64_t S, int64_t E, int64_t topk, bool skewed) {
  const int64_t T = S * topk;
  std::vector<int> r(E, 0);
  if (!skewed) {
    for (int64_t e = 0; e < E; ++e) r[e] = static_cast<int>(T / E + (e < T % E ? 1 : 0));
    return r;
  }
  r[0] = static_cast<int>(std::min(T / 2, S));
  std::vector<int64_t> live;
  for (int64_t e = 1; e < E; ++e)
    if (e % 4 != 0) live.push_back(e);
  const int64_t rest = T - r[0], nl = static_cast<int64_t>(live.size());
  for (int64_t i = 0; i < nl; ++i) r[live[i]] = static_cast<int>(rest / nl + (i < rest % nl ? 1 : 0));
  return r;
}

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) { TESSERA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

float bf16_to_float(uint16_t v) {
  const uint32_t x = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

/// Relative error (Frobenius) of `out` against `ref` over ~256 sampled rows
/// of a [rows, n] bf16 matrix (every group's first and last row included);
/// infinity if either holds a NaN (D is poisoned before the call).
double sampled_rel_err(const void* out, const void* ref, int64_t rows, int64_t n, const std::vector<int>& counts) {
  std::vector<int64_t> pick;
  for (int64_t r = 0; r < rows; r += std::max<int64_t>(1, rows / 256)) pick.push_back(r);
  int64_t off = 0;
  for (int c : counts) {
    if (c > 0) {
      pick.push_back(off);
      pick.push_back(off + c - 1);
    }
    off += c;
  }
  std::vector<uint16_t> a(n), b(n);
  double e2 = 0, r2 = 0;
  for (int64_t r : pick) {
    TESSERA_CUDA_CHECK(cudaMemcpy(a.data(), static_cast<const uint16_t*>(out) + r * n, n * 2, cudaMemcpyDeviceToHost));
    TESSERA_CUDA_CHECK(cudaMemcpy(b.data(), static_cast<const uint16_t*>(ref) + r * n, n * 2, cudaMemcpyDeviceToHost));
    for (int64_t j = 0; j < n; ++j) {
      const double x = bf16_to_float(a[j]), y = bf16_to_float(b[j]);
      if (std::isnan(x) || std::isnan(y)) return INFINITY;  // unwritten (poison) or bad
      e2 += (x - y) * (x - y);
      r2 += y * y;
    }
  }
  return r2 > 0 ? std::sqrt(e2 / r2) : std::sqrt(e2);
}

std::string key(const std::string& shape, int tp, const std::string& gemm, const std::string& routing) {
  return fmt::format("{}/{}/{}/{}", shape, tp, gemm, routing);
}

double geomean(const std::vector<double>& v) {
  if (v.empty()) return NAN;
  double s = 0;
  for (double x : v) s += std::log(x);
  return std::exp(s / static_cast<double>(v.size()));
}

/// Rows of a --torch-json file (scripts/bench_grouped_torch.py), by problem key.
std::map<std::string, nlohmann::json> read_torch(const Options& o) {
  std::map<std::string, nlohmann::json> torch;
  if (o.torch_json.empty()) return torch;
  std::ifstream in(o.torch_json);
  TESSERA_CHECK(in.good(), "bench grouped: cannot read --torch-json {}", o.torch_json);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '{') continue;
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("shape") || !j.contains("torch_ms")) continue;
    torch[key(j["shape"], j["tp"], j["gemm"], j["routing"])] = j;
  }
  return torch;
}

/// Elements of the largest A, B and D (rows = S * topk, N and K up to 4096, 32 experts).
std::array<int64_t, 3> largest_operands(const Options& o) {
  int64_t max_a = 0, max_b = 0, max_d = 0;
  for (const Moe& m : kMoe)
    for (int tp : o.tp) {
      const int64_t T = m.S * m.topk;
      for (int w = 0; w < 2; ++w) {
        const int64_t n = w == 0 ? 2 * m.I / tp : m.H, k = w == 0 ? m.H : m.I / tp;
        max_a = std::max(max_a, T * k);
        max_b = std::max(max_b, m.E * n * k);
        max_d = std::max(max_d, T * n);
      }
    }
  return {max_a, max_b, max_d};
}

/// Operands for the largest problem, shared by every problem.
struct Buffers {
  std::array<int64_t, 3> max;  ///< elements of A, B, D
  Dev a, b, d, ref, rows_buf, status;
  Buffers(const Options& o, cudaStream_t stream)
      : max(largest_operands(o)),
        a(max[0] * 2),
        b(max[1] * 2),
        d(max[2] * 2),
        ref(max[2] * 2),
        rows_buf(4096),
        status(64) {
    gemm::fill_random(a.p, max[0], DType::bf16, 71, stream);
    gemm::fill_random(b.p, max[1], DType::bf16, 72, stream);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
};

/// One grouped GEMM of one MoE shape: gate/up or down, one routing.
struct Problem {
  const Moe& m;
  int tp;
  const char* which;
  std::string rt;
  int64_t n, k, T;
  std::vector<int> counts;
  kernels::GroupedGemmArgs ga;
  kernels::GemmArgs dense;  ///< every routed row in one GEMM against expert 0's weight, into ref
};

Problem make_problem(Buffers& buf, const Moe& m, int tp, const char* which, const std::string& rt) {
  TESSERA_CHECK(rt == "uniform" || rt == "skewed", "bench grouped: routing '{}' (uniform or skewed)", rt);
  const bool gateup = std::string(which) == "gateup";
  Problem p{m,
            tp,
            which,
            rt,
            gateup ? 2 * m.I / tp : m.H,
            gateup ? m.H : m.I / tp,
            m.S * m.topk,
            routing(m.S, m.E, m.topk, rt == "skewed"),
            {},
            {}};
  TESSERA_CUDA_CHECK(cudaMemcpy(buf.rows_buf.p, p.counts.data(), p.counts.size() * 4, cudaMemcpyHostToDevice));
  p.ga.a = buf.a.p;
  p.ga.b = buf.b.p;
  p.ga.d = buf.d.p;
  p.ga.group_rows = static_cast<const int*>(buf.rows_buf.p);
  p.ga.status = static_cast<int*>(buf.status.p);
  p.ga.groups = m.E;
  p.ga.n = p.n;
  p.ga.k = p.k;
  p.ga.max_rows = p.T;
  p.dense.a = buf.a.p;
  p.dense.b = buf.b.p;
  p.dense.d = buf.ref.p;
  p.dense.m = p.T;
  p.dense.n = p.n;
  p.dense.k = p.k;
  return p;
}

/// The per-expert cuBLASLt loop into `out`.
void expert_loop(const Problem& p, const Buffers& buf, void* out, cudaStream_t stream) {
  int64_t off = 0;
  for (int64_t g = 0; g < p.m.E; ++g) {
    if (p.counts[g] == 0) continue;
    kernels::GemmArgs e;
    e.a = static_cast<const uint16_t*>(buf.a.p) + off * p.k;
    e.b = static_cast<const uint16_t*>(buf.b.p) + g * p.n * p.k;
    e.d = static_cast<uint16_t*>(out) + off * p.n;
    e.m = p.counts[g];
    e.n = p.n;
    e.k = p.k;
    kernels::cublaslt_gemm(e, stream);
    off += p.counts[g];
  }
}

struct Times {
  double ours = 0, loop = 0, dcub = 0, dours = 0;
  std::vector<double> tiles, bands;
};

/// Every variant of one problem in one interleaved loop.
Times time_problem(const Options& o, const Problem& p, const Buffers& buf, const std::vector<GroupedTile>& extra_tiles,
                   cudaStream_t stream) {
  const kernels::GroupedGemmOptions go{};
  Times t;
  t.tiles.resize(extra_tiles.size());
  t.bands.resize(o.bands.size());
  InterleavedTimer timer(stream, o.warmup, o.reps);
  timer.add(&t.ours, [&] { kernels::grouped_gemm(p.ga, go, stream); });
  timer.add(&t.loop, [&] { expert_loop(p, buf, buf.d.p, stream); });
  timer.add(&t.dcub, [&] { kernels::cublaslt_gemm(p.dense, stream); });
  timer.add(&t.dours, [&] { kernels::gemm(p.dense, {}, stream); });
  for (size_t i = 0; i < extra_tiles.size(); ++i) {
    kernels::GroupedGemmOptions to;
    to.tile = extra_tiles[i];
    timer.add(&t.tiles[i], [&, to] { kernels::grouped_gemm(p.ga, to, stream); });
  }
  for (size_t i = 0; i < o.bands.size(); ++i) {
    kernels::GroupedGemmOptions bo;
    bo.raster_band = o.bands[i];
    timer.add(&t.bands[i], [&, bo] { kernels::grouped_gemm(p.ga, bo, stream); });
  }
  timer.run();
  kernels::check_grouped_gemm_status(p.ga.status, stream, "bench grouped");
  return t;
}

/// The table, the JSON records and the ratios over every problem.
struct Results {
  Table table;
  nlohmann::json records = nlohmann::json::array();
  std::vector<double> vs_torch, vs_dense, vs_loop;
  double worst_err = 0;
};

void add_result(const Options& o, const Problem& p, const std::vector<GroupedTile>& extra_tiles, GroupedTile tile,
                const Times& t, double err, std::map<std::string, nlohmann::json>& torch, Results& res) {
  const double flop = 2.0 * static_cast<double>(p.T) * static_cast<double>(p.n) * static_cast<double>(p.k);
  const double t_dense = std::min(t.dcub, t.dours);
  const std::string k_ = key(p.m.name, p.tp, p.which, p.rt);
  const double t_torch = torch.count(k_) ? torch[k_]["torch_ms"].get<double>() : NAN;
  if (!std::isnan(t_torch)) res.vs_torch.push_back(t_torch / t.ours);
  res.vs_dense.push_back(t_dense / t.ours);
  res.vs_loop.push_back(t.loop / t.ours);
  std::vector<std::string> row = {fmt::format("{} TP{} {} {}", p.m.name, p.tp, p.which, p.rt),
                                  std::to_string(p.n),
                                  std::to_string(p.k),
                                  kernels::grouped_tile_name(tile),
                                  fmt::format("{:.4f}", t.ours),
                                  fmt::format("{:.0f}", flop / t.ours / 1e9),
                                  std::isnan(t_torch) ? "-" : fmt::format("{:.4f}", t_torch),
                                  std::isnan(t_torch) ? "-" : fmt::format("{:.3f}", t_torch / t.ours),
                                  fmt::format("{:.4f}", t.dcub),
                                  fmt::format("{:.4f}", t.dours),
                                  fmt::format("{:.3f}", t_dense / t.ours),
                                  fmt::format("{:.4f}", t.loop),
                                  fmt::format("{:.2f}", t.loop / t.ours),
                                  fmt::format("{:.1e}", err)};
  nlohmann::json rec = {{"shape", p.m.name},
                        {"tp", p.tp},
                        {"gemm", p.which},
                        {"routing", p.rt},
                        {"n", p.n},
                        {"k", p.k},
                        {"rows", p.T},
                        {"experts", p.m.E},
                        {"tile", kernels::grouped_tile_name(tile)},
                        {"ours_ms", t.ours},
                        {"ours_tflops", flop / t.ours / 1e9},
                        {"loop_ms", t.loop},
                        {"dense_cublaslt_ms", t.dcub},
                        {"dense_ours_ms", t.dours},
                        {"rel_err", err},
                        {"counts", p.counts}};
  if (!std::isnan(t_torch)) {
    rec["torch_ms"] = t_torch;
    rec["ours_over_torch_throughput"] = t_torch / t.ours;
  }
  rec["ours_over_dense_throughput"] = t_dense / t.ours;
  for (size_t i = 0; i < extra_tiles.size(); ++i) {
    row.push_back(fmt::format("{:.4f}", t.tiles[i]));
    rec["tiles_ms"][kernels::grouped_tile_name(extra_tiles[i])] = t.tiles[i];
  }
  for (size_t i = 0; i < o.bands.size(); ++i) {
    row.push_back(fmt::format("{:.4f}", t.bands[i]));
    rec["bands_ms"][std::to_string(o.bands[i])] = t.bands[i];
  }
  res.table.add(row);
  res.records.push_back(rec);
  fmt::print("{}\n", rec.dump());
  std::fflush(stdout);
}

/// --gather, gate/up problems: the row gather of A (GroupedGemmArgs::a_gather,
/// SwiGLU) against the MoE gather kernel followed by the same GEMM on TMA
/// loads, and the gathering GEMM at every tile, in one interleaved loop. The
/// routed entries are a random permutation of the S * topk entries (token =
/// entry / topk) over buf.a's first S rows; both paths' outputs are compared
/// bitwise at the same tile (the gathered rows are the same).
void run_gather_study(const Options& o, Buffers& buf, const Problem& p, Results& res, cudaStream_t stream) {
  const int64_t S = p.m.S, topk = p.m.topk, H = p.k, E = p.m.E;
  std::vector<int32_t> entries(static_cast<size_t>(p.T));
  for (int64_t i = 0; i < p.T; ++i) entries[i] = static_cast<int32_t>(i);
  std::mt19937_64 rng(73);
  std::shuffle(entries.begin(), entries.end(), rng);
  std::vector<int32_t> offsets(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + p.counts[e];
  Dev sorted(p.T * 4), offs((E + 1) * 4), gathered(p.T * H * 2), d2(p.T * p.n);
  TESSERA_CUDA_CHECK(cudaMemcpy(sorted.p, entries.data(), entries.size() * 4, cudaMemcpyHostToDevice));
  TESSERA_CUDA_CHECK(cudaMemcpy(offs.p, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));
  kernels::moe::GatherArgs gk;
  gk.x = buf.a.p;
  gk.ldx = H;
  gk.gathered = gathered.p;
  gk.ldg = H;
  gk.cols = H;
  gk.sorted_entry = static_cast<const int32_t*>(sorted.p);
  gk.expert_offsets = static_cast<const int32_t*>(offs.p);
  gk.experts = static_cast<int>(E);
  gk.k = static_cast<int>(topk);
  gk.max_rows = p.T;
  kernels::GroupedGemmArgs plain = p.ga;  // A = the gathered rows (TMA)
  plain.a = gathered.p;
  kernels::GroupedGemmArgs fused = p.ga;  // A = the tokens, gathered in the loads
  fused.a = buf.a.p;
  fused.d = d2.p;
  fused.a_gather = static_cast<const int32_t*>(sorted.p);
  fused.a_gather_div = topk;
  fused.a_rows = S;
  kernels::GroupedGemmOptions go;
  go.epilogue = kernels::GroupedEpilogueKind::SwiGLU;
  // Correctness: the same bits from both paths at the same tile.
  kernels::GroupedGemmOptions same = go;
  same.tile = kernels::resolve_grouped_tile(plain, go);
  kernels::moe::gather_rows(gk, stream);
  kernels::grouped_gemm(plain, same, stream);
  kernels::grouped_gemm(fused, same, stream);
  std::vector<uint16_t> h1(static_cast<size_t>(p.T * p.n / 2)), h2(h1.size());
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(h1.data(), plain.d, h1.size() * 2, cudaMemcpyDeviceToHost, stream));
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(h2.data(), fused.d, h2.size() * 2, cudaMemcpyDeviceToHost, stream));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  TESSERA_CHECK(h1 == h2, "bench grouped --gather: {} TP{}: the gathering GEMM differs from gather + GEMM", p.m.name,
                p.tp);
  const GroupedTile tiles[] = {GroupedTile::Coop128x256, GroupedTile::Coop128x128, GroupedTile::PingPong128x128,
                               GroupedTile::PingPong64x256};
  double t_gk = 0, t_gemm = 0, t_fused = 0;
  double t_tile[4] = {};
  InterleavedTimer timer(stream, o.warmup, o.reps);
  timer.add(&t_gk, [&] {
    kernels::moe::gather_rows(gk, stream);
    kernels::grouped_gemm(plain, go, stream);
  });
  timer.add(&t_gemm, [&] { kernels::grouped_gemm(plain, go, stream); });
  timer.add(&t_fused, [&] { kernels::grouped_gemm(fused, go, stream); });
  for (int i = 0; i < 4; ++i) {
    kernels::GroupedGemmOptions to = go;
    to.tile = tiles[i];
    timer.add(&t_tile[i], [&, to] { kernels::grouped_gemm(fused, to, stream); });
  }
  timer.run();
  nlohmann::json rec = {{"study", "gather"},
                        {"shape", p.m.name},
                        {"tp", p.tp},
                        {"routing", p.rt},
                        {"n", p.n},
                        {"k", p.k},
                        {"rows", p.T},
                        {"gather_kernel_then_gemm_ms", t_gk},
                        {"gemm_on_gathered_rows_ms", t_gemm},
                        {"gathering_gemm_ms", t_fused},
                        {"gathering_tile", kernels::grouped_tile_name(kernels::resolve_grouped_tile(fused, go))},
                        {"plain_tile", kernels::grouped_tile_name(kernels::resolve_grouped_tile(plain, go))}};
  std::string per_tile;
  for (int i = 0; i < 4; ++i) {
    rec["gathering_tiles_ms"][kernels::grouped_tile_name(tiles[i])] = t_tile[i];
    per_tile += fmt::format(" {} {:.4f}", kernels::grouped_tile_name(tiles[i]), t_tile[i]);
  }
  fmt::print(
      "gather {} TP{} {}: gather kernel + GEMM {:.4f} ms (GEMM alone {:.4f}), gathering GEMM {:.4f} ms "
      "(x{:.3f}); by tile:{}\n",
      p.m.name, p.tp, p.rt, t_gk, t_gemm, t_fused, t_gk / t_fused, per_tile);
  std::fflush(stdout);
  res.records.push_back(rec);
}

/// One problem: correctness (poisoned D against the per-expert loop), then its timings.
void run_problem(const Options& o, Buffers& buf, const Problem& p, const std::vector<GroupedTile>& extra_tiles,
                 std::map<std::string, nlohmann::json>& torch, Results& res, cudaStream_t stream) {
  const kernels::GroupedGemmOptions go{};
  const GroupedTile tile = kernels::resolve_grouped_tile(p.ga, go);
  TESSERA_CUDA_CHECK(cudaMemsetAsync(buf.d.p, 0xFF, p.T * p.n * 2, stream));
  kernels::grouped_gemm(p.ga, go, stream);
  expert_loop(p, buf, buf.ref.p, stream);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  kernels::check_grouped_gemm_status(p.ga.status, stream, "bench grouped");
  const double err = sampled_rel_err(buf.d.p, buf.ref.p, p.T, p.n, p.counts);
  res.worst_err = std::max(res.worst_err, err);
  const Times t = time_problem(o, p, buf, extra_tiles, stream);
  add_result(o, p, extra_tiles, tile, t, err, torch, res);
}

void print_and_write(const Options& o, const cudaDeviceProp& prop, const Results& res) {
  fmt::print("\n{}\n", res.table.str());
  auto mn = [](const std::vector<double>& v) { return v.empty() ? NAN : *std::min_element(v.begin(), v.end()); };
  const std::string summary = fmt::format(
      "ours/torch._grouped_mm throughput: geomean {:.3f}, min {:.3f} ({} problems); ours/dense (best of cuBLASLt "
      "and gemm()): geomean {:.3f}, min {:.3f}; ours/per-expert cuBLASLt loop: geomean {:.2f}, min {:.2f}; worst "
      "rel err {:.1e}",
      geomean(res.vs_torch), mn(res.vs_torch), res.vs_torch.size(), geomean(res.vs_dense), mn(res.vs_dense),
      geomean(res.vs_loop), mn(res.vs_loop), res.worst_err);
  fmt::print("{}\n", summary);
  if (o.json.empty()) return;
  nlohmann::json j = {{"device", fmt::format("{} ({}, {} SMs)", o.device_kind, prop.name, prop.multiProcessorCount)},
                      {"commit", o.commit},
                      {"command", o.command_line},
                      {"method",
                       "CUDA events per call, warm-up, median; variants interleaved run by run; "
                       "torch._grouped_mm timed by scripts/bench_grouped_torch.py in the same device call"},
                      {"summary",
                       {{"ours_over_torch_geomean", geomean(res.vs_torch)},
                        {"ours_over_torch_min", mn(res.vs_torch)},
                        {"ours_over_dense_geomean", geomean(res.vs_dense)},
                        {"ours_over_dense_min", mn(res.vs_dense)},
                        {"ours_over_loop_geomean", geomean(res.vs_loop)},
                        {"worst_rel_err", res.worst_err}}},
                      {"problems", res.records}};
  std::ofstream(o.json) << j.dump(1) << "\n";
  fmt::print("wrote {}\n", o.json);
}

void run(const Options& o) {
  const cudaDeviceProp prop = current_device_properties();
  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::map<std::string, nlohmann::json> torch = read_torch(o);
  Buffers buf(o, stream);
  std::vector<std::string> cols = {"problem",       "N",          "K",
                                   "tile",          "ours ms",    "ours TF/s",
                                   "torch ms",      "ours/torch", "dense cuBLASLt ms",
                                   "dense ours ms", "ours/dense", "loop ms",
                                   "ours/loop",     "rel err"};
  std::vector<GroupedTile> extra_tiles;
  if (o.tiles)
    extra_tiles = {GroupedTile::Coop128x256, GroupedTile::Coop128x128, GroupedTile::PingPong128x128,
                   GroupedTile::PingPong64x256};
  for (GroupedTile t : extra_tiles) cols.push_back(kernels::grouped_tile_name(t) + " ms");
  for (int band : o.bands) cols.push_back(fmt::format("band {} ms", band));
  Results res{Table(cols)};
  for (int tp : o.tp)
    for (const Moe& m : kMoe) {
      if (!o.shapes.empty() && std::find(o.shapes.begin(), o.shapes.end(), m.name) == o.shapes.end()) continue;
      for (const char* which : {"gateup", "down"})
        for (const std::string& rt : o.routing) {
          const Problem p = make_problem(buf, m, tp, which, rt);
          run_problem(o, buf, p, extra_tiles, torch, res, stream);
          if (o.gather && std::string(which) == "gateup") run_gather_study(o, buf, p, res, stream);
        }
    }
  print_and_write(o, prop, res);
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto& bench = tools::subcommand(root, "bench", "Benchmarks");
  auto opts = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand(
      "grouped",
      "Grouped GEMM on the MoE-1..6 expert GEMMs vs a per-expert cuBLASLt loop, one dense GEMM and "
      "torch._grouped_mm (--torch-json)");
  cmd->add_option("--tp", opts->tp, "tensor-parallel shards of I")->delimiter(',');
  cmd->add_option("--shapes", opts->shapes, "MoE-1..MoE-6 (default: all)")->delimiter(',');
  cmd->add_option("--routing", opts->routing, "uniform,skewed")->delimiter(',');
  cmd->add_option("--reps", opts->reps, "timed repetitions (median)")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", opts->warmup, "warm-up repetitions")->check(CLI::Range(0, 100000));
  cmd->add_flag("--tiles", opts->tiles, "also time every configuration");
  cmd->add_flag("--gather", opts->gather,
                "gate/up: also time the gathering GEMM (a_gather) against a gather kernel + GEMM, at every tile");
  cmd->add_option("--bands", opts->bands, "also time these raster bands (0 = row-major; auto tile)")->delimiter(',');
  cmd->add_option("--torch-json", opts->torch_json, "output of scripts/bench_grouped_torch.py on this device");
  cmd->add_option("--json", opts->json, "write the records and summary here");
  cmd->add_option("--commit", opts->commit, "commit recorded in --json");
  cmd->add_option("--device-kind", opts->device_kind, "device kind recorded in --json");
  cmd->callback([opts, cmd] {
    Options o = *opts;
    o.command_line = "tessera bench grouped";
    for (const auto* opt : cmd->get_options())
      if (opt->count() > 0 && opt->get_name() != "--help") {
        std::string v;
        for (const auto& r : opt->results()) v += (v.empty() ? "" : ",") + r;
        o.command_line += " " + opt->get_name() + (v.empty() ? "" : " " + v);
      }
    run(o);
  });
});

}  // namespace tessera::bench::grouped
