// `tessera bench sp-attention` — ops::sp_attention (AllGather-KV + attention
// over zig-zag sequence shards) at the launched world size R, run under
// `tessera run -n R`. Per case (bf16, head dim 128, batch 1; --seqs global
// tokens), one interleaved timing loop (CUDA events, warm-up, median; ranks
// started together by barrier + align_streams; the slowest rank's median):
//   sequential  NCCL all-gather of the K/V shards, then the kernel
//   fused_ce    copy-engine pushes, the kernel waiting per KV block
//   automatic   the ops tuner's pick (tuned afresh before the loop, no cache)
//   attention   the plain kernel over the same parts on an already-gathered KV
//   all-gather  the K/V all-gather alone (NCCL, as sequential runs it)
// and with --diag fused_ce's hooked kernel alone over the KV it gathered
// (sp_attention_diag_fused_kernel: as run, in descending block order,
// reading the own chunks from the workspace) and the plain kernel over that
// workspace, right after each fused call; with --wait-ab fused_ce with the
// chunk walk too (TESSERA_SP_TABLE_WAIT=0 and TESSERA_SP_SHARD_LAYOUT=0
// around its calls: the wait A/B in one loop),
// and from them ideal = max(attention, all-gather), fused's % of ideal, its
// speed-up over sequential, and TileLink's overlap ratio
// (attention + all-gather − fused) / all-gather. scripts/bench_sp_attention_torch.py
// times the PyTorch baselines on the same cases; --torch-json reads its JSON
// lines and prints them side by side. --json writes a bench/results record
// file (bench/results/README.md).
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "command.hpp"
#include "common/device_buffer.hpp"
#include "common/results.hpp"
#include "common/timing.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/ops/sp_attention.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::bench::sp_attention {
namespace {

struct Case {
  const char* name;   ///< --cases id (also the key of the PyTorch script's lines)
  const char* label;  ///< printed
  std::int64_t hq, hkv;
  bool causal;
};
const Case kCases[] = {{"32h-causal", "32h causal", 32, 32, true},     {"32h", "32h", 32, 32, false},
                       {"64h-causal", "64h causal", 64, 64, true},     {"64h", "64h", 64, 64, false},
                       {"gqa-causal", "GQA 32/8 causal", 32, 8, true}, {"gqa", "GQA 32/8", 32, 8, false}};
constexpr std::int64_t kHeadDim = 128;

struct Options {
  std::vector<std::int64_t> seqs{16384, 32768, 65536};
  std::vector<std::string> cases;  // empty: all
  std::int64_t batch = 1;
  int warmup = 2, reps = 10;
  bool diag = false;
  bool wait_ab = false;
  std::string torch_json, json, device;
};

struct TorchFigures {
  double seq_ms = 0;  ///< all-gather + cuDNN SDPA; 0: none
  double cp_ms = 0;   ///< context_parallel ring attention; 0: none
  std::string cp_note;
};

/// scripts/bench_sp_attention_torch.py's JSON lines, by "case/seq".
std::map<std::string, TorchFigures> read_torch(const std::string& path, int world) {
  std::map<std::string, TorchFigures> out;
  if (path.empty()) return out;
  std::ifstream f(path);
  TESSERA_CHECK(f.good(), "bench sp-attention: cannot read --torch-json {}", path);
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] != '{') continue;  // torchrun's own lines
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("case") || !j.contains("seq")) continue;
    if (j.value("world", world) != world) continue;
    TorchFigures t;
    if (j.contains("torch_seq_ms") && j["torch_seq_ms"].is_number()) t.seq_ms = j["torch_seq_ms"].get<double>();
    if (j.contains("torch_cp_ms") && j["torch_cp_ms"].is_number()) t.cp_ms = j["torch_cp_ms"].get<double>();
    if (j.contains("torch_cp_note") && j["torch_cp_note"].is_string()) t.cp_note = j["torch_cp_note"];
    out[fmt::format("{}/{}", j["case"].get<std::string>(), j["seq"].get<std::int64_t>())] = t;
  }
  return out;
}

std::string command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::replace(all.begin(), all.end(), '\0', ' ');
  while (!all.empty() && all.back() == ' ') all.pop_back();
  return all;
}

std::string ms(double v) { return fmt::format("{:.3f}", v); }

/// The --diag series of sp_attention_diag_fused_kernel's variant.
std::string diag_label(unsigned variant) {
  if (variant & ops::kSpDiagPlainKernel) return "plain kernel over fused_ce's workspace";
  std::string s = "fused_ce kernel alone (KV landed";
  if (variant & ops::kSpDiagDescending) s += ", descending order";
  if (variant & ops::kSpDiagOwnFromWorkspace) s += ", own chunks from the workspace";
  return s + ")";
}

std::vector<const Case*> selected_cases(const Options& o, int R) {
  std::vector<const Case*> cases;
  for (const Case& c : kCases)
    if (o.cases.empty() || std::find(o.cases.begin(), o.cases.end(), c.name) != o.cases.end()) cases.push_back(&c);
  for (const std::string& n : o.cases)
    TESSERA_CHECK(std::any_of(std::begin(kCases), std::end(kCases), [&](const Case& c) { return n == c.name; }),
                  "bench sp-attention: case '{}' (32h-causal, 32h, 64h-causal, 64h, gqa-causal, gqa)", n);
  for (std::int64_t S : o.seqs)
    TESSERA_CHECK(S >= 2 * R && S % (2 * R) == 0, "bench sp-attention: --seqs {} is not a multiple of 2 x world = {}",
                  S, 2 * R);
  TESSERA_CHECK(o.batch >= 1, "bench sp-attention: --batch {} must be >= 1", o.batch);
  return cases;
}

/// One case at one sequence length: this rank's shards, the gathered K/V
/// (for the attention alone) and the all-gather's staging.
struct CaseBuffers {
  std::int64_t B, S, L;
  std::size_t nq, nkv, shard_bytes, gathered;
  DeviceBuffer q, k, v, out, lse, gk, gv, stg;
  CaseBuffers(const Case& c, std::int64_t batch, std::int64_t seq, int R, std::mt19937_64& rng)
      : B(batch),
        S(seq),
        L(seq / R),
        nq(B * L * c.hq * kHeadDim),
        nkv(B * L * c.hkv * kHeadDim),
        shard_bytes(nkv * 2),
        gathered(static_cast<std::size_t>(B * S * c.hkv * kHeadDim)),
        q(nq * 2),
        k(shard_bytes),
        v(shard_bytes),
        out(nq * 2),
        lse(B * c.hq * L * 4),
        gk(gathered * 2),
        gv(gathered * 2),
        stg(2 * R * shard_bytes) {
    fill_random_16bit(q.p, nq, rng);
    fill_random_16bit(k.p, nkv, rng);
    fill_random_16bit(v.p, nkv, rng);
    fill_random_16bit(gk.p, gathered, rng);
    fill_random_16bit(gv.p, gathered, rng);
  }
  ops::SpAttnArgs args(const Case& c) const {
    ops::SpAttnArgs a;
    a.q = q.p;
    a.k = k.p;
    a.v = v.p;
    a.o = out.p;
    a.lse = static_cast<float*>(lse.p);
    a.batch = B;
    a.seq = S;
    a.heads_q = c.hq;
    a.heads_kv = c.hkv;
    a.head_dim = kHeadDim;
    a.causal = c.causal;
    return a;
  }
};

/// The attention alone: the plain kernel over this rank's parts, KV already
/// gathered in global order (what sequential runs after NCCL).
std::vector<kernels::AttentionArgs> attention_parts(const ops::SpAttnPlan& plan, const Case& c, const CaseBuffers& b) {
  const std::int64_t D = kHeadDim, L = b.L;
  std::vector<kernels::AttentionArgs> parts;
  for (const ops::SpAttnPlan::Part& p : plan.parts) {
    kernels::AttentionArgs k2;
    const std::int64_t q_row = c.hq * D;
    k2.q = static_cast<const std::uint16_t*>(b.q.p) + p.local_row0 * q_row;
    k2.o = static_cast<std::uint16_t*>(b.out.p) + p.local_row0 * q_row;
    k2.k = b.gk.p;
    k2.v = b.gv.p;
    k2.batch = b.B;
    k2.seqlen_q = p.rows;
    k2.seqlen_k = p.kv_len;
    k2.heads_q = c.hq;
    k2.heads_kv = c.hkv;
    k2.head_dim = D;
    k2.q_stride = k2.o_stride = {L * q_row, q_row, D};
    k2.k_stride = k2.v_stride = {b.S * c.hkv * D, c.hkv * D, D};
    k2.causal = c.causal;
    k2.q_offset = p.q_offset;
    k2.lse = static_cast<float*>(b.lse.p) + p.local_row0;
    k2.lse_batch_stride = c.hq * L;
    k2.lse_head_stride = L;
    kernels::validate(k2, "bench sp-attention");
    parts.push_back(k2);
  }
  return parts;
}

/// One case's figures (ms, max over ranks) and what they give.
struct CaseFigures {
  double seq = 0, fused = 0, automatic = 0, attn = 0, ag = 0;
  double fused_walk = 0;  ///< --wait-ab: fused_ce with the chunk walk (0: not timed)
  /// --diag: the hooked kernel alone, per sp_attention_diag_fused_kernel variant.
  std::vector<std::pair<unsigned, double>> kernel_alone;
  std::string pick;
  TorchFigures torch;
  double ideal() const { return std::max(attn, ag); }
  double pct_ideal() const { return 100.0 * ideal() / fused; }
  double speedup() const { return seq / fused; }
  double overlap() const { return (attn + ag - fused) / ag; }
};

void add_records(nlohmann::json& records, const Case& c, std::int64_t S, int R, const CaseFigures& f) {
  const std::string cs = fmt::format("{} S={}k R={}", c.label, S / 1024, R);
  auto rec = [&](const std::string& metric, double value, const char* unit) {
    nlohmann::json r{{"case", cs}, {"metric", metric}, {"value", value}, {"unit", unit}};
    records.push_back(r);
    return &records.back();
  };
  auto timed = [&](const std::string& what, double value) {
    auto* r = rec("time_ms " + what, value, "ms");
    (*r)["size"] = S;
    (*r)["series"] = fmt::format("{} {}", what, c.label);
    return r;
  };
  const TorchFigures& tt = f.torch;
  timed("sp_attention sequential", f.seq);
  timed("sp_attention fused_ce", f.fused);
  (*timed("sp_attention automatic", f.automatic))["strategy"] = f.pick;
  timed("attention alone (gathered KV)", f.attn);
  timed("K/V all-gather alone (NCCL)", f.ag);
  for (const auto& [variant, t] : f.kernel_alone) (*timed(diag_label(variant), t))["diag"] = true;
  if (f.fused_walk > 0) {
    timed("sp_attention fused_ce (chunk walk)", f.fused_walk);
    (*rec("fused_ce table wait / chunk walk", f.fused / f.fused_walk, "ratio"))["baseline"] =
        "fused_ce with TESSERA_SP_TABLE_WAIT=0 TESSERA_SP_SHARD_LAYOUT=0, same loop";
  }
  (*rec("fused_ce % of ideal", f.pct_ideal(), "%"))["target"] = {
      {"op", ">="}, {"value", 95.0}, {"text", ">= 95 % of max(attention alone, all-gather alone)"}};
  auto* sp = rec("speed-up fused_ce / sequential", f.speedup(), "ratio");
  (*sp)["baseline"] = "sp_attention sequential (NCCL all-gather + kernel)";
  (*sp)["target"] = {{"op", ">"}, {"value", 1.0}, {"text", "faster than sequential"}};
  (*rec("overlap ratio fused_ce", f.overlap(), "ratio"))["baseline"] =
      "(attention alone + all-gather alone - fused) / all-gather alone";
  if (tt.seq_ms > 0) {
    timed("PyTorch all-gather + cuDNN SDPA", tt.seq_ms);
    (*rec("speed-up fused_ce / PyTorch sequential", tt.seq_ms / f.fused, "ratio"))["baseline"] =
        "dist.all_gather_into_tensor + SDPA cuDNN";
  }
  if (tt.cp_ms > 0) {
    timed("PyTorch context_parallel", tt.cp_ms);
    auto* r = rec("speed-up fused_ce / PyTorch context_parallel", tt.cp_ms / f.fused, "ratio");
    (*r)["baseline"] = "torch.distributed.tensor.experimental.context_parallel (ring)";
    if (c.causal && S == 32768 && R == 2)
      (*r)["target"] = {{"op", ">="}, {"value", 1.15}, {"text", ">= 1.15x context_parallel, causal 32k, TP = 2"}};
  }
}

/// One case at one sequence length: set-up, every variant in one
/// interleaved loop, then its table row, line and records.
CaseFigures measure_case(const Options& o, runtime::ProcessGroup& pg, ops::SpAttnContext& ctx, const Case& c,
                         std::int64_t S, std::mt19937_64& rng) {
  const int R = pg.world(), rank = pg.rank();
  const cudaStream_t s = pg.stream();
  const ops::SpAttnPlan plan = ops::plan_sp_attention(S, R, rank, c.causal);
  CaseBuffers b(c, o.batch, S, R, rng);
  const ops::SpAttnArgs a = b.args(c);
  ops::sp_attention(ctx, a, ops::SpStrategy::sequential);  // sizes the workspaces
  ops::SpAttnOptions autom;
  autom.use_cache = false;
  ops::TuneReport rep;
  const ops::SpStrategy pick = ops::resolve_sp_attention(ctx, a, autom, &rep);
  pg.synchronize(s, "bench sp-attention: set-up");
  const std::vector<kernels::AttentionArgs> parts = attention_parts(plan, c, b);
  CaseFigures f;
  f.pick = std::string(ops::sp_strategy_name(pick));
  InterleavedTimer timer(s, o.warmup, o.reps, [&] {
    pg.barrier();
    pg.align_streams(s);
  });
  timer.add(&f.seq, [&] { ops::sp_attention(ctx, a, ops::SpStrategy::sequential); });
  timer.add(&f.fused, [&] { ops::sp_attention(ctx, a, ops::SpStrategy::fused_ce); });
  // Right after fused_ce: the replays re-read its epoch's flags and KV.
  if (o.diag) {
    const unsigned variants[] = {0u, ops::kSpDiagDescending, ops::kSpDiagOwnFromWorkspace, ops::kSpDiagPlainKernel};
    f.kernel_alone.reserve(std::size(variants));
    for (unsigned v : variants) f.kernel_alone.emplace_back(v, 0.0);
    for (auto& [v, t] : f.kernel_alone)
      timer.add(&t, [&ctx, &a, v = v] { ops::sp_attention_diag_fused_kernel(ctx, a, v); });
  }
  timer.add(&f.automatic, [&] { ops::sp_attention(ctx, a, autom); });
  if (o.wait_ab)
    timer.add(&f.fused_walk, [&] {
      setenv("TESSERA_SP_SHARD_LAYOUT", "0", 1);
      setenv("TESSERA_SP_TABLE_WAIT", "0", 1);
      ops::sp_attention(ctx, a, ops::SpStrategy::fused_ce);
      unsetenv("TESSERA_SP_SHARD_LAYOUT");
      unsetenv("TESSERA_SP_TABLE_WAIT");
    });
  timer.add(&f.attn, [&] {
    for (const auto& p : parts) kernels::attention(p, s);
  });
  timer.add(&f.ag, [&] {
    auto* st = static_cast<unsigned char*>(b.stg.p);
    TESSERA_NCCL_CHECK(ncclGroupStart());
    TESSERA_NCCL_CHECK(ncclAllGather(b.k.p, st, b.shard_bytes, ncclUint8, pg.nccl(), s));
    TESSERA_NCCL_CHECK(ncclAllGather(b.v.p, st + R * b.shard_bytes, b.shard_bytes, ncclUint8, pg.nccl(), s));
    TESSERA_NCCL_CHECK(ncclGroupEnd());
  });
  timer.run([&](double x) { return pg.allreduce_max(x); });
  pg.synchronize(s, "bench sp-attention");
  return f;
}

void run(const Options& o) {
  auto pg = runtime::ProcessGroup::from_environment();
  const int R = pg->world(), rank = pg->rank();
  const auto torch = read_torch(o.torch_json, R);
  const std::vector<const Case*> cases = selected_cases(o, R);
  ops::SpAttnContext ctx(*pg);
  std::mt19937_64 rng(0x5A7 + rank);
  Table table({"case", "S", "seq ms", "fused ms", "auto ms (pick)", "attn ms", "AG ms", "ideal ms", "fused %ideal",
               "fused/seq", "overlap", "torch seq ms", "torch CP ms", "vs torch seq", "vs CP"});
  nlohmann::json records = nlohmann::json::array();
  for (std::int64_t S : o.seqs)
    for (const Case* c : cases) {
      CaseFigures f = measure_case(o, *pg, ctx, *c, S, rng);
      const auto tf = torch.find(fmt::format("{}/{}", c->name, S));
      f.torch = tf == torch.end() ? TorchFigures{} : tf->second;
      const TorchFigures& tt = f.torch;
      table.add({c->label, fmt::format("{}k", S / 1024), ms(f.seq), ms(f.fused),
                 fmt::format("{} ({})", ms(f.automatic), f.pick), ms(f.attn), ms(f.ag), ms(f.ideal()),
                 fmt::format("{:.1f}", f.pct_ideal()), fmt::format("{:.3f}", f.speedup()),
                 fmt::format("{:.3f}", f.overlap()), tt.seq_ms > 0 ? ms(tt.seq_ms) : "-",
                 tt.cp_ms > 0 ? ms(tt.cp_ms) : (tt.cp_note.empty() ? "-" : "n/a"),
                 tt.seq_ms > 0 ? fmt::format("{:.3f}", tt.seq_ms / f.fused) : "-",
                 tt.cp_ms > 0 ? fmt::format("{:.3f}", tt.cp_ms / f.fused) : "-"});
      if (rank == 0)
        for (const auto& [v, t] : f.kernel_alone)
          fmt::print("{} S={} R={}: {} {:.3f} ms ({:.4f} x attention alone)\n", c->label, S, R, diag_label(v), t,
                     t / f.attn);
      if (rank == 0 && f.fused_walk > 0)
        fmt::print("{} S={} R={}: fused_ce chunk walk {:.3f} ms (table wait / chunk walk {:.4f})\n", c->label, S, R,
                   f.fused_walk, f.fused / f.fused_walk);
      if (rank == 0)
        fmt::print(
            "{} S={} R={}: sequential {:.3f} ms, fused_ce {:.3f}, automatic {:.3f} ({}), attention {:.3f}, "
            "all-gather {:.3f}; {:.1f} % of ideal, overlap ratio {:.3f}\n",
            c->label, S, R, f.seq, f.fused, f.automatic, f.pick, f.attn, f.ag, f.pct_ideal(), f.overlap());
      add_records(records, *c, S, R, f);
    }
  if (rank != 0) return;
  fmt::print(
      "\ntessera bench sp-attention: R={} on {} (bf16, head dim {}, batch {}; ms, median of {}, slowest rank)\n{}", R,
      pg->device_properties().name, kHeadDim, o.batch, o.reps, table.str());
  if (o.json.empty()) return;
  write_results(o.json,
                {{"device", o.device.empty() ? machine_kind(pg->device_properties().name, R) : o.device},
                 {"date", results_date()},
                 {"commit", results_commit()},
                 {"command", command_line()},
                 {"topic", "attention"},
                 {"issue", 20}},
                records, "bench sp-attention");
}

}  // namespace

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto& bench = tools::subcommand(root, "bench", "Benchmarks");
  auto opts = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand(
      "sp-attention", "Sequence-parallel attention (ops::sp_attention): strategies, ideal, overlap ratio, PyTorch");
  cmd->add_option("--seqs", opts->seqs, "global sequence lengths (tokens)")->delimiter(',');
  cmd->add_option("--cases", opts->cases, "32h-causal, 32h, 64h-causal, 64h, gqa-causal, gqa (default all)")
      ->delimiter(',');
  cmd->add_option("--batch", opts->batch, "batch size")->check(CLI::Range(1, 64));
  cmd->add_option("--reps", opts->reps, "timed repetitions (median)")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", opts->warmup, "warm-up repetitions")->check(CLI::Range(0, 100000));
  cmd->add_option("--torch-json", opts->torch_json, "scripts/bench_sp_attention_torch.py's output");
  cmd->add_flag(
      "--diag", opts->diag,
      "also time fused_ce's hooked kernel alone over the KV it gathered (three variants) and the plain kernel there");
  cmd->add_flag(
      "--wait-ab", opts->wait_ab,
      "also time fused_ce with the chunk walk (TESSERA_SP_TABLE_WAIT=0 TESSERA_SP_SHARD_LAYOUT=0) in the loop");
  cmd->add_option("--json", opts->json, "write a bench/results record file here (rank 0)");
  cmd->add_option("--device", opts->device, "device kind for --json (default: from the GPU name and world)");
  cmd->callback([opts] { run(*opts); });
});

}  // namespace tessera::bench::sp_attention
