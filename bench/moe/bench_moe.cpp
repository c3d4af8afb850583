// `tessera bench moe` — the TP MoE layer (ops::moe_tp) on MoE-1..6 of
// ../shared/WORKLOADS.md at the launched world size (tokens and each
// expert's I sharded over the ranks), with uniform and skewed routing:
//   seq / pipe  the whole call (all-gather, routing sort, gather, grouped
//            GEMMs, combine, reduce-scatter), strategy sequential and
//            pipelined (per-shard GEMMs overlapped with the transfers);
//   auto     what automatic chose (the tuner, measured here, no disk cache);
//   experts  the two grouped GEMMs alone on the same routing (one launch
//            each over all R·T_l·k rows);
//   comm     the all-gather and reduce-scatter alone;
//   ideal    max(experts, comm); "% ideal" = ideal / time of each strategy;
//   host us  the host's enqueue time of one call (median, slowest rank).
// Each rank times the same bodies interleaved run by run (events, warm-up,
// median, max over ranks). Each run starts after a host barrier and a
// one-element all-reduce, so by default the GPU starts the call idle while
// the host is still enqueueing it; --queued-us N queues it behind an N-us
// GPU sleep instead, so the GPU runs the call as it would inside a model's
// step, fully enqueued (the ops tuner times its candidates that way). The
// PyTorch sequential layer on the same shapes and routing is
// scripts/bench_moe_torch.py; --torch-json FILE reads its output and adds
// the ratio column.
// --ep: the expert-parallel layer (ops::moe_ep; experts split over the
// ranks, each with its full I; tokens sharded):
//   sequential / pipelined  the whole call per strategy;
//   experts  this rank's grouped GEMMs alone on the rows it receives;
//   comm     the dispatch and return slabs alone (NCCL send/recv);
//   ideal    max(experts, comm); torch: scripts/bench_moe_torch.py --ep.
// The capacity (rows per rank pair) is max(the busiest pair's rows,
// ceil(capacity_factor * tokens_local * k / R)) rounded up to 8; it is
// printed, since every slab moves whole.
// Routing (the same rule as the script; no RNG so both agree): token t's
// slot s picks expert (t + s * stride) % E' with stride = E' / k, E' = E
// (uniform) or E - E/4 (skewed: the last quarter of the experts get no
// token, and slot 0 of every even token goes to expert 0, so it receives
// about half the tokens); a repeat within a token moves to the next expert.
#include <cuda_bf16.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "command.hpp"
#include "common/gpu_sleep.hpp"
#include "common/timing.hpp"
#include "tessera/kernels/grouped_gemm.hpp"
#include "tessera/kernels/moe_routing.hpp"
#include "tessera/ops/moe.hpp"
#include "tessera/ops/moe_ep.hpp"
#include "tessera/ops/plan.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::bench::moe {
namespace {

struct Shape {
  const char* name;
  std::int64_t S, H, I;
  int E, k;
};
const Shape kShapes[] = {{"MoE-1", 8192, 2048, 1536, 8, 2},  {"MoE-2", 8192, 2048, 1536, 32, 2},
                         {"MoE-3", 8192, 2048, 1536, 32, 5}, {"MoE-4", 8192, 4096, 2048, 8, 2},
                         {"MoE-5", 8192, 4096, 2048, 32, 2}, {"MoE-6", 8192, 4096, 2048, 32, 5}};

struct Options {
  std::vector<int> shapes{1, 2, 3, 4, 5, 6};
  std::vector<std::string> routings{"uniform", "skewed"};
  int warmup = 5, reps = 20;
  std::string torch_json, json;
  bool ep = false;
  double capacity_factor = 1.0;
  double queued_us = 0;  ///< > 0: each timed call queued behind a GPU sleep of this long
};

/// The table title's note on --queued-us.
std::string queued_note(const Options& o) {
  return o.queued_us > 0 ? fmt::format("; each call queued behind a {:g} us GPU sleep", o.queued_us) : std::string();
}

/// Expert ids of tokens [t0, t0 + n) (see the header comment).
std::vector<std::int32_t> route(std::int64_t t0, std::int64_t n, int E, int k, bool skewed) {
  const int live = skewed ? E - E / 4 : E;
  const int stride = live / k > 0 ? live / k : 1;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n) * k);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t t = t0 + i;
    for (int s = 0; s < k; ++s) {
      int e = static_cast<int>((t + static_cast<std::int64_t>(s) * stride) % live);
      if (skewed && s == 0 && t % 2 == 0) e = 0;
      for (int q = 0; q < s; ++q)
        if (ids[i * k + q] == e) e = (e + 1) % live, q = -1;
      ids[i * k + s] = e;
    }
  }
  return ids;
}

struct Dev {
  void* p = nullptr;
  explicit Dev(std::size_t bytes) { TESSERA_CUDA_CHECK(cudaMalloc(&p, bytes > 16 ? bytes : 16)); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

void fill_bf16(void* p, std::int64_t n, float scale, std::uint32_t seed) {
  std::vector<__nv_bfloat16> h(static_cast<std::size_t>(n));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  for (auto& v : h) v = __float2bfloat16_rn(nd(rng));
  TESSERA_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
}

/// torch_ms per "shape/routing/mode" (mode "tp" or "ep"; "tp" when absent)
/// from scripts/bench_moe_torch.py's JSON lines.
std::map<std::string, double> read_torch(const std::string& path) {
  std::map<std::string, double> out;
  if (path.empty()) return out;
  std::ifstream f(path);
  TESSERA_CHECK(f.good(), "bench moe: cannot read --torch-json {}", path);
  std::string line;
  while (std::getline(f, line)) {
    auto field = [&](const std::string& key) -> std::string {
      const auto at = line.find("\"" + key + "\": ");
      if (at == std::string::npos) return "";
      auto v = line.substr(at + key.size() + 4);
      if (!v.empty() && v[0] == '"') return v.substr(1, v.find('"', 1) - 1);
      return v.substr(0, v.find_first_of(",}"));
    };
    const std::string shape = field("shape"), routing = field("routing"), ms = field("torch_ms");
    std::string mode = field("mode");
    if (mode.empty()) mode = "tp";
    if (!shape.empty() && !ms.empty()) out[shape + "/" + routing + "/" + mode] = std::stod(ms);
  }
  return out;
}

void run(const Options& o) {
  auto pg = runtime::ProcessGroup::from_environment();
  const int R = pg->world();
  const cudaStream_t s = pg->stream();
  const auto torch = read_torch(o.torch_json);
  Table table({"shape",       "routing",     "seq ms",       "pipe ms",    "seq gk ms",   "pipe gk ms",  "transport",
               "chunks",      "pipe 1ch ms", "pipe nccl ms", "auto",       "experts ms",  "comm ms",     "seq %ideal",
               "pipe %ideal", "seq/pipe",    "torch ms",     "torch/best", "seq host us", "pipe host us"});
  std::ostringstream js;
  js << "[";
  bool first = true;
  for (int si : o.shapes) {
    TESSERA_CHECK(si >= 1 && si <= 6, "bench moe: shape {} (MoE-1..6)", si);
    const Shape& sh = kShapes[si - 1];
    TESSERA_CHECK(sh.S % R == 0 && sh.I % R == 0, "bench moe: {} does not shard over {} ranks", sh.name, R);
    const std::int64_t Tl = sh.S / R, Il = sh.I / R, H = sh.H, k = sh.k, E = sh.E;
    Dev x(Tl * H * 2), gu(E * 2 * Il * H * 2), dn(E * H * Il * 2), out(Tl * H * 2), ids(Tl * k * 4), w(Tl * k * 4);
    fill_bf16(x.p, Tl * H, 1.f, 1 + pg->rank());
    fill_bf16(gu.p, E * 2 * Il * H, 0.02f, 2);
    fill_bf16(dn.p, E * H * Il, 0.02f, 3);
    const std::vector<float> wh(static_cast<std::size_t>(Tl * k), 1.f / static_cast<float>(k));
    TESSERA_CUDA_CHECK(cudaMemcpy(w.p, wh.data(), wh.size() * 4, cudaMemcpyHostToDevice));
    for (const std::string& routing : o.routings) {
      TESSERA_CHECK(routing == "uniform" || routing == "skewed", "bench moe: routing '{}' (uniform, skewed)", routing);
      const bool skewed = routing == "skewed";
      const auto idh = route(Tl * pg->rank(), Tl, sh.E, sh.k, skewed);
      TESSERA_CUDA_CHECK(cudaMemcpy(ids.p, idh.data(), idh.size() * 4, cudaMemcpyHostToDevice));
      ops::MoeContext ctx(*pg);
      ops::MoeTpArgs a;
      a.x_shard = x.p;
      a.expert_ids = static_cast<const std::int32_t*>(ids.p);
      a.weights = static_cast<const float*>(w.p);
      a.w_gate_up = gu.p;
      a.w_down = dn.p;
      a.out_shard = out.p;
      a.tokens_local = Tl;
      a.hidden = H;
      a.inter_local = Il;
      a.experts = sh.E;
      a.topk = sh.k;
      ops::MoeTpOptions seq, pipe, pipe1, pipe_nccl, autom;
      seq.strategy = ops::Strategy::sequential;
      pipe.strategy = ops::Strategy::pipelined;
      // With a gather kernel before the gate/up GEMM: what the gathering loads buy.
      ops::MoeTpOptions seq_gk = seq, pipe_gk = pipe;
      seq_gk.fused_gather = pipe_gk.fused_gather = false;
      // Pipelined with part 2 in one chunk: what the column chunks buy.
      pipe1.strategy = ops::Strategy::pipelined;
      pipe1.rs_chunks = 1;
      // Pipelined over NCCL send/recv: what the copy-engine transport buys.
      pipe_nccl.strategy = ops::Strategy::pipelined;
      pipe_nccl.transport = ops::MoeTransport::nccl;
      const bool ce = pg->lsa_reachable();  // automatic's transport outside a capture
      const int chunks = ops::moe_rs_chunks(H, pipe.rs_chunks, ce);
      autom.use_cache = false;  // measure here, whatever an earlier run cached
      // Sizes the workspaces, builds the pipeline communicator, checks the routing.
      ops::moe_tp(ctx, a, seq);
      ctx.check_status();
      ops::moe_tp(ctx, a, pipe);
      ctx.check_status();
      ops::moe_tp(ctx, a, pipe1);
      ctx.check_status();
      ops::moe_tp(ctx, a, seq_gk);
      ctx.check_status();
      ops::moe_tp(ctx, a, pipe_gk);
      ctx.check_status();
      ops::moe_tp(ctx, a, pipe_nccl);
      ctx.check_status();
      ops::TuneReport report;
      const ops::Strategy chosen = ops::resolve_moe_tp(ctx, a, autom, &report);
      ctx.check_status();
      // The experts alone: the same grouped GEMMs on the same counts.
      const std::int64_t rows = sh.S * k;
      const auto all_ids = route(0, sh.S, sh.E, sh.k, skewed);
      std::vector<int> counts(static_cast<std::size_t>(E), 0);
      for (int e : all_ids) ++counts[e];
      Dev dcounts(E * 4), status(64), xa(rows * H * 2), hbuf(rows * Il * 2), y(rows * H * 2), ag(sh.S * H * 2),
          part(sh.S * H * 2);
      TESSERA_CUDA_CHECK(cudaMemcpy(dcounts.p, counts.data(), counts.size() * 4, cudaMemcpyHostToDevice));
      fill_bf16(xa.p, rows * H, 1.f, 4);
      kernels::GroupedGemmArgs up;
      up.a = xa.p;
      up.b = gu.p;
      up.d = hbuf.p;
      up.group_rows = static_cast<const int*>(dcounts.p);
      up.status = static_cast<int*>(status.p);
      up.groups = E;
      up.n = 2 * Il;
      up.k = H;
      up.max_rows = rows;
      kernels::GroupedGemmOptions uo;
      uo.epilogue = kernels::GroupedEpilogueKind::SwiGLU;
      kernels::GroupedGemmArgs down = up;
      down.a = hbuf.p;
      down.b = dn.p;
      down.d = y.p;
      down.status = static_cast<int*>(status.p) + 4;
      down.n = H;
      down.k = Il;
      double t_seq = 0, t_pipe = 0, t_seq_gk = 0, t_pipe_gk = 0, t_pipe1 = 0, t_nccl = 0, experts = 0, comm = 0;
      InterleavedTimer timer(s, o.warmup, o.reps, [&] {
        pg->barrier();
        pg->align_streams(s);
        if (o.queued_us > 0) gpu_sleep(o.queued_us, s);
      });
      // The host's enqueue time of a call (median): how long a GPU that
      // starts the call idle waits for the host at most.
      std::vector<double> host_seq_us, host_pipe_us;
      auto host_timed = [](std::vector<double>& us, const auto& call) {
        const auto t0 = std::chrono::steady_clock::now();
        call();
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      };
      timer.add(&t_seq, [&] { host_timed(host_seq_us, [&] { ops::moe_tp(ctx, a, seq); }); });
      timer.add(&t_pipe, [&] { host_timed(host_pipe_us, [&] { ops::moe_tp(ctx, a, pipe); }); });
      timer.add(&t_seq_gk, [&] { ops::moe_tp(ctx, a, seq_gk); });
      timer.add(&t_pipe_gk, [&] { ops::moe_tp(ctx, a, pipe_gk); });
      if (chunks > 1) timer.add(&t_pipe1, [&] { ops::moe_tp(ctx, a, pipe1); });
      if (ce) timer.add(&t_nccl, [&] { ops::moe_tp(ctx, a, pipe_nccl); });
      timer.add(&experts, [&] {
        kernels::grouped_gemm(up, uo, s);
        kernels::grouped_gemm(down, {}, s);
      });
      timer.add(&comm, [&] {
        TESSERA_NCCL_CHECK(ncclAllGather(x.p, ag.p, static_cast<std::size_t>(Tl * H), ncclBfloat16, pg->nccl(), s));
        TESSERA_NCCL_CHECK(
            ncclReduceScatter(part.p, out.p, static_cast<std::size_t>(Tl * H), ncclBfloat16, ncclSum, pg->nccl(), s));
      });
      timer.run([&](double v) { return pg->allreduce_max(v); });
      ctx.check_status();
      kernels::check_grouped_gemm_status(up.status, s, "bench moe: gate/up");
      const double ideal = std::max(experts, comm), best = std::min(t_seq, t_pipe);
      // summarize() is unit-free: these medians are microseconds.
      const double host_seq = pg->allreduce_max(summarize(host_seq_us).median_ms);
      const double host_pipe = pg->allreduce_max(summarize(host_pipe_us).median_ms);
      const auto t = torch.find(std::string(sh.name) + "/" + routing + "/tp");
      const double torch_ms = t == torch.end() ? 0 : t->second;
      const std::string chosen_name(ops::strategy_name(chosen));
      auto tuned = [&](ops::Strategy st) {
        const auto it = report.times_ms.find(st);
        return it == report.times_ms.end() ? 0.0 : it->second;
      };
      table.add({sh.name,
                 routing,
                 fmt::format("{:.3f}", t_seq),
                 fmt::format("{:.3f}", t_pipe),
                 fmt::format("{:.3f}", t_seq_gk),
                 fmt::format("{:.3f}", t_pipe_gk),
                 ce ? "copy_engine" : "nccl",
                 std::to_string(chunks),
                 chunks > 1 ? fmt::format("{:.3f}", t_pipe1) : "-",
                 ce ? fmt::format("{:.3f}", t_nccl) : "-",
                 chosen_name,
                 fmt::format("{:.3f}", experts),
                 fmt::format("{:.3f}", comm),
                 fmt::format("{:.1f}", 100.0 * ideal / t_seq),
                 fmt::format("{:.1f}", 100.0 * ideal / t_pipe),
                 fmt::format("{:.3f}", t_seq / t_pipe),
                 torch_ms > 0 ? fmt::format("{:.3f}", torch_ms) : "-",
                 torch_ms > 0 ? fmt::format("{:.3f}", torch_ms / best) : "-",
                 fmt::format("{:.0f}", host_seq),
                 fmt::format("{:.0f}", host_pipe)});
      js << (first ? "" : ",")
         << fmt::format(
                "\n{{\"shape\": \"{}\", \"routing\": \"{}\", \"world\": {}, \"layer_ms\": {:.5f}, "
                "\"sequential_ms\": {:.5f}, \"pipelined_ms\": {:.5f}, \"sequential_gather_kernel_ms\": {:.5f}, "
                "\"pipelined_gather_kernel_ms\": {:.5f}, \"rs_chunks\": {}, "
                "\"pipelined_one_chunk_ms\": {:.5f}, \"transport\": \"{}\", \"pipelined_nccl_ms\": {:.5f}, "
                "\"auto\": \"{}\", "
                "\"tuner_sequential_ms\": {:.5f}, \"tuner_pipelined_ms\": {:.5f}, "
                "\"experts_ms\": {:.5f}, \"comm_ms\": {:.5f}, \"torch_ms\": {:.5f}, \"queued_us\": {}, "
                "\"sequential_host_us\": {:.1f}, \"pipelined_host_us\": {:.1f}}}",
                sh.name, routing, R, t_seq, t_seq, t_pipe, t_seq_gk, t_pipe_gk, chunks, chunks > 1 ? t_pipe1 : t_pipe,
                ce ? "copy_engine" : "nccl", ce ? t_nccl : t_pipe, chosen_name, tuned(ops::Strategy::sequential),
                tuned(ops::Strategy::pipelined), experts, comm, torch_ms, o.queued_us, host_seq, host_pipe);
      first = false;
    }
  }
  js << "\n]\n";
  if (pg->rank() == 0) {
    std::printf("tessera bench moe: TP=%d on %s (ms, median of %d, slowest rank; ideal = max(experts, comm)%s)\n%s", R,
                pg->device_properties().name, o.reps, queued_note(o).c_str(), table.str().c_str());
    if (!o.json.empty()) {
      std::ofstream f(o.json);
      TESSERA_CHECK(f.good(), "bench moe: cannot write {}", o.json);
      f << js.str();
    }
  }
}

/// EP routing of one shape: this rank's rows per expert, and the capacity —
/// the busiest (source, destination) pair, at least the capacity factor's
/// share, a multiple of 8.
struct EpRouting {
  std::vector<int> counts;
  std::int64_t cap = 0;
};

EpRouting ep_routing(const std::vector<std::int32_t>& all_ids, int R, int rank, std::int64_t Tl, std::int64_t k,
                     std::int64_t El, double capacity_factor) {
  EpRouting r;
  std::int64_t busiest = 0;
  r.counts.assign(static_cast<std::size_t>(El), 0);
  for (int src = 0; src < R; ++src) {
    std::vector<std::int64_t> n(static_cast<std::size_t>(R), 0);
    for (std::int64_t i = src * Tl * k; i < (src + 1) * Tl * k; ++i) {
      const int e = all_ids[i];
      ++n[e / El];
      if (e / El == rank) ++r.counts[e % El];
    }
    for (std::int64_t v : n) busiest = std::max(busiest, v);
  }
  r.cap = std::max<std::int64_t>(
      busiest, static_cast<std::int64_t>(std::ceil(capacity_factor * static_cast<double>(Tl * k) / R)));
  r.cap = (r.cap + 7) / 8 * 8;
  return r;
}

/// The EP layer's parts alone: the experts (one grouped GEMM pair over this
/// rank's received rows) and the slab exchange (dispatch, then return).
struct EpAlone {
  int R, rank;
  std::int64_t rows = 0;
  std::size_t slab;
  Dev dcounts, status, xa, hbuf, y, sbuf, rbuf;
  kernels::GroupedGemmArgs up, down;
  kernels::GroupedGemmOptions uo;

  static std::int64_t sum(const std::vector<int>& counts) {
    std::int64_t rows = 0;
    for (int c : counts) rows += c;
    return rows;
  }

  EpAlone(const std::vector<int>& counts, std::int64_t cap, void* w_gate_up, void* w_down, std::int64_t I,
          std::int64_t H, int world, int r)
      : R(world),
        rank(r),
        rows(sum(counts)),
        slab(static_cast<std::size_t>(cap * H)),
        dcounts(static_cast<std::int64_t>(counts.size()) * 4),
        status(64),
        xa(std::max<std::int64_t>(rows, 1) * H * 2),
        hbuf(std::max<std::int64_t>(rows, 1) * I * 2),
        y(std::max<std::int64_t>(rows, 1) * H * 2),
        sbuf(cap * R * H * 2),
        rbuf(cap * R * H * 2) {
    TESSERA_CUDA_CHECK(cudaMemcpy(dcounts.p, counts.data(), counts.size() * 4, cudaMemcpyHostToDevice));
    fill_bf16(xa.p, std::max<std::int64_t>(rows, 1) * H, 1.f, 4);
    up.a = xa.p;
    up.b = w_gate_up;
    up.d = hbuf.p;
    up.group_rows = static_cast<const int*>(dcounts.p);
    up.status = static_cast<int*>(status.p);
    up.groups = static_cast<int>(counts.size());
    up.n = 2 * I;
    up.k = H;
    up.max_rows = rows;
    uo.epilogue = kernels::GroupedEpilogueKind::SwiGLU;
    down = up;
    down.a = hbuf.p;
    down.b = w_down;
    down.d = y.p;
    down.status = static_cast<int*>(status.p) + 4;
    down.n = H;
    down.k = I;
  }

  void experts(cudaStream_t s) const {
    if (rows == 0) return;
    kernels::grouped_gemm(up, uo, s);
    kernels::grouped_gemm(down, {}, s);
  }

  void exchange(void* send_base, void* recv_base, ncclComm_t comm, cudaStream_t s) const {
    TESSERA_NCCL_CHECK(ncclGroupStart());
    for (int q = 0; q < R; ++q) {
      if (q == rank) continue;
      TESSERA_NCCL_CHECK(ncclSend(static_cast<__nv_bfloat16*>(send_base) + q * slab, slab, ncclBfloat16, q, comm, s));
      TESSERA_NCCL_CHECK(ncclRecv(static_cast<__nv_bfloat16*>(recv_base) + q * slab, slab, ncclBfloat16, q, comm, s));
    }
    TESSERA_NCCL_CHECK(ncclGroupEnd());
  }

  void comm(ncclComm_t c, cudaStream_t s) const {
    if (R == 1) return;
    exchange(sbuf.p, rbuf.p, c, s);  // dispatch
    exchange(rbuf.p, sbuf.p, c, s);  // return
  }
};

void run_ep(const Options& o) {
  auto pg = runtime::ProcessGroup::from_environment();
  const int R = pg->world(), rank = pg->rank();
  const cudaStream_t s = pg->stream();
  const auto torch = read_torch(o.torch_json);
  Table table({"shape", "routing", "capacity", "seq ms", "pipe ms", "experts ms", "comm ms", "pipe/ideal", "seq/pipe",
               "pipe nccl ms", "torch ms", "torch/best"});
  std::ostringstream js;
  js << "[";
  bool first = true;
  for (int si : o.shapes) {
    TESSERA_CHECK(si >= 1 && si <= 6, "bench moe: shape {} (MoE-1..6)", si);
    const Shape& sh = kShapes[si - 1];
    TESSERA_CHECK(sh.S % R == 0 && sh.E % R == 0, "bench moe --ep: {} does not shard over {} ranks", sh.name, R);
    const std::int64_t Tl = sh.S / R, I = sh.I, H = sh.H, k = sh.k, El = sh.E / R;
    Dev x(Tl * H * 2), gu(El * 2 * I * H * 2), dn(El * H * I * 2), out(Tl * H * 2), ids(Tl * k * 4), w(Tl * k * 4);
    fill_bf16(x.p, Tl * H, 1.f, 1 + rank);
    fill_bf16(gu.p, El * 2 * I * H, 0.02f, 2 + rank);
    fill_bf16(dn.p, El * H * I, 0.02f, 3 + rank);
    const std::vector<float> wh(static_cast<std::size_t>(Tl * k), 1.f / static_cast<float>(k));
    TESSERA_CUDA_CHECK(cudaMemcpy(w.p, wh.data(), wh.size() * 4, cudaMemcpyHostToDevice));
    for (const std::string& routing : o.routings) {
      TESSERA_CHECK(routing == "uniform" || routing == "skewed", "bench moe: routing '{}' (uniform, skewed)", routing);
      const bool skewed = routing == "skewed";
      const auto all_ids = route(0, sh.S, sh.E, sh.k, skewed);
      TESSERA_CUDA_CHECK(cudaMemcpy(ids.p, all_ids.data() + rank * Tl * k, static_cast<std::size_t>(Tl * k) * 4,
                                    cudaMemcpyHostToDevice));
      const EpRouting er = ep_routing(all_ids, R, rank, Tl, k, El, o.capacity_factor);
      const std::vector<int>& counts = er.counts;
      const std::int64_t cap = er.cap;
      ops::MoeEpContext ctx(*pg);
      ops::MoeEpArgs a;
      a.x_shard = x.p;
      a.expert_ids = static_cast<const std::int32_t*>(ids.p);
      a.weights = static_cast<const float*>(w.p);
      a.w_gate_up = gu.p;
      a.w_down = dn.p;
      a.out_shard = out.p;
      a.tokens_local = Tl;
      a.hidden = H;
      a.inter = I;
      a.experts = sh.E;
      a.topk = sh.k;
      a.capacity = cap;
      ops::MoeEpOptions seq, pipe, pipe_nccl;
      seq.strategy = ops::MoeEpStrategy::sequential;
      pipe.strategy = ops::MoeEpStrategy::pipelined;
      // Pipelined over NCCL send/recv: what the copy-engine transport buys.
      pipe_nccl.strategy = ops::MoeEpStrategy::pipelined;
      pipe_nccl.transport = ops::MoeTransport::nccl;
      const bool ce = pg->lsa_reachable();  // automatic's transport outside a capture
      // Sizes the workspaces, builds the pipeline communicator, checks the routing.
      ops::moe_ep(ctx, a, seq);
      ctx.check_status();
      ops::moe_ep(ctx, a, pipe);
      ctx.check_status();
      ops::moe_ep(ctx, a, pipe_nccl);
      ctx.check_status();
      EpAlone alone(counts, cap, gu.p, dn.p, I, H, R, rank);
      double t_seq = 0, t_pipe = 0, t_nccl = 0, experts = 0, comm = 0;
      InterleavedTimer timer(s, o.warmup, o.reps, [&] {
        pg->barrier();
        pg->align_streams(s);
        if (o.queued_us > 0) gpu_sleep(o.queued_us, s);
      });
      timer.add(&t_seq, [&] { ops::moe_ep(ctx, a, seq); });
      timer.add(&t_pipe, [&] { ops::moe_ep(ctx, a, pipe); });
      if (ce) timer.add(&t_nccl, [&] { ops::moe_ep(ctx, a, pipe_nccl); });
      timer.add(&experts, [&] { alone.experts(s); });
      timer.add(&comm, [&] { alone.comm(pg->nccl(), s); });
      timer.run([&](double v) { return pg->allreduce_max(v); });
      ctx.check_status();
      if (alone.rows > 0) kernels::check_grouped_gemm_status(alone.up.status, s, "bench moe --ep: gate/up");
      const double ideal = std::max(experts, comm), best = std::min(t_seq, t_pipe);
      const auto t = torch.find(std::string(sh.name) + "/" + routing + "/ep");
      const double torch_ms = t == torch.end() ? 0 : t->second;
      table.add({sh.name, routing, std::to_string(cap), fmt::format("{:.3f}", t_seq), fmt::format("{:.3f}", t_pipe),
                 fmt::format("{:.3f}", experts), fmt::format("{:.3f}", comm),
                 ideal > 0 ? fmt::format("{:.3f}", t_pipe / ideal) : "-", fmt::format("{:.3f}", t_seq / t_pipe),
                 ce ? fmt::format("{:.3f}", t_nccl) : "-", torch_ms > 0 ? fmt::format("{:.3f}", torch_ms) : "-",
                 torch_ms > 0 ? fmt::format("{:.3f}", torch_ms / best) : "-"});
      js << (first ? "" : ",")
         << fmt::format(
                "\n{{\"shape\": \"{}\", \"routing\": \"{}\", \"world\": {}, \"mode\": \"ep\", \"capacity\": {}, "
                "\"sequential_ms\": {:.5f}, \"pipelined_ms\": {:.5f}, \"transport\": \"{}\", "
                "\"pipelined_nccl_ms\": {:.5f}, \"experts_ms\": {:.5f}, \"comm_ms\": {:.5f}, \"torch_ms\": {:.5f}, "
                "\"queued_us\": {}}}",
                sh.name, routing, R, cap, t_seq, t_pipe, ce ? "copy_engine" : "nccl", ce ? t_nccl : t_pipe, experts,
                comm, torch_ms, o.queued_us);
      first = false;
    }
  }
  js << "\n]\n";
  if (rank == 0) {
    std::printf("tessera bench moe --ep: EP=%d on %s (ms, median of %d, slowest rank; capacity factor %.2f%s)\n%s", R,
                pg->device_properties().name, o.reps, o.capacity_factor, queued_note(o).c_str(), table.str().c_str());
    if (!o.json.empty()) {
      std::ofstream f(o.json);
      TESSERA_CHECK(f.good(), "bench moe: cannot write {}", o.json);
      f << js.str();
    }
  }
}
}  // namespace

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto& bench = tools::subcommand(root, "bench", "Benchmarks");
  auto opts = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand(
      "moe",
      "MoE layers on MoE-1..6: TP (ops::moe_tp: sequential, pipelined, automatic) or, with --ep, EP (ops::moe_ep); "
      "experts, comm, PyTorch");
  cmd->add_option("--shapes", opts->shapes, "MoE shapes 1..6")->delimiter(',');
  cmd->add_option("--routing", opts->routings, "uniform, skewed")->delimiter(',');
  cmd->add_option("--reps", opts->reps, "timed repetitions (median)")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", opts->warmup, "warm-up repetitions")->check(CLI::Range(0, 100000));
  cmd->add_option("--torch-json", opts->torch_json, "scripts/bench_moe_torch.py's output");
  cmd->add_option("--json", opts->json, "write the figures here (rank 0)");
  cmd->add_flag("--ep", opts->ep, "the expert-parallel layer (sequential vs pipelined)");
  cmd->add_option("--capacity-factor", opts->capacity_factor,
                  "--ep: capacity = max(busiest pair, factor * tokens_local * k / R)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--queued-us", opts->queued_us,
                  "queue each timed call behind a GPU sleep of this many us, so the host has enqueued it before "
                  "the GPU starts it (0: the call starts on an idle GPU while the host enqueues it)")
      ->check(CLI::Range(0.0, 100000.0));
  cmd->callback([opts] {
    if (opts->ep)
      run_ep(*opts);
    else
      run(*opts);
  });
});

}  // namespace tessera::bench::moe
