// `tessera bench ring-attention` — sequence-parallel attention schedules on
// the zig-zag shards, run under `tessera run -n R`: ring (sequential,
// overlapped), Ulysses (sequential, pipelined), two-level (sp_attention's
// two_level: Ulysses inside groups of u, ring across R / u groups, one
// variant per factorisation with 1 < u < R the heads allow; at R = 2 and 3
// there is none, u = 1 and u = R being the ring and Ulysses) and, for
// reference, part 1's
// all-gather KV (sp_attention: sequential, fused_ce) per case, in one
// interleaved timing loop (every repetition runs each variant once, after a
// barrier and pg.align_streams; the slowest rank's median is reported).
// TFLOP/s as FlashAttention counts them (4·B·Hq·D·admitted pairs of the
// whole sequence), per GPU (divided by R). Memory: what each variant needs
// per rank beyond its input and output shards (workspace), and the shards.
// "automatic" is sp_attention's tuner choosing among all of them
// (sp_attention_candidates), measured afresh on its first call (no cache);
// its time over the best variant's is the tuner's record per case.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "command.hpp"
#include "common/device_buffer.hpp"
#include "common/results.hpp"
#include "common/timing.hpp"
#include "tessera/ops/ring_attention.hpp"
#include "tessera/ops/sp_attention.hpp"
#include "tessera/ops/two_level_attention.hpp"
#include "tessera/ops/ulysses_attention.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::bench::ring_attention {
namespace {

struct Case {
  std::string name;
  std::int64_t seq, hq, hkv;
  bool causal;
};

// bf16, head dim 128, batch 1: MHA 32 heads and GQA 32/8, causal and not,
// 16k and 32k tokens (0-7); then 64 heads at 16k, and 64k / 128k causal (8-12).
std::vector<Case> all_cases() {
  std::vector<Case> v;
  auto name = [](std::int64_t seq, std::int64_t hq, std::int64_t hkv, bool causal) {
    const std::string heads = hq == hkv ? fmt::format("{}h", hq) : fmt::format("GQA {}/{}", hq, hkv);
    return fmt::format("{} {}k{}", heads, seq / 1024, causal ? " causal" : "");
  };
  for (std::int64_t seq : {16384, 32768})
    for (auto [hq, hkv] : {std::pair<std::int64_t, std::int64_t>{32, 32}, {32, 8}})
      for (bool causal : {true, false}) v.push_back({name(seq, hq, hkv, causal), seq, hq, hkv, causal});
  v.push_back({name(16384, 64, 64, true), 16384, 64, 64, true});
  v.push_back({name(65536, 32, 32, true), 65536, 32, 32, true});
  v.push_back({name(65536, 32, 8, true), 65536, 32, 8, true});
  v.push_back({name(131072, 32, 32, true), 131072, 32, 32, true});
  v.push_back({name(131072, 32, 8, true), 131072, 32, 8, true});
  return v;
}

struct Options {
  std::vector<int> cases;  // indices into all_cases(); empty = all
  int batch = 1;
  int head_groups = 0;
  bool agkv = true;
  int reps = 10;
  int warmup = 2;
  double memory_gb = 0;  ///< automatic's workspace limit per rank (0: none)
  std::string json, device_kind, commit;
};

/// A figure as the results file records it: six significant digits, null
/// when not finite.
nlohmann::json json_num(double x) {
  if (!std::isfinite(x)) return nullptr;
  return std::stod(fmt::format("{:.6g}", x));
}

/// The operators' contexts, shared by every case.
struct Contexts {
  ops::RingAttnContext ring;
  ops::UlyssesAttnContext uly;
  std::unique_ptr<ops::SpAttnContext> sp;  ///< AG-KV, two-level and automatic (with load/store reach)
  Contexts(runtime::ProcessGroup& pg, const Options& o) : ring(pg), uly(pg) {
    if (o.agkv && (pg.world() == 1 || pg.lsa_reachable())) sp = std::make_unique<ops::SpAttnContext>(pg);
  }
};

struct Variant {
  std::string name;
  std::function<void()> body;
  std::size_t workspace;
  double ms = 0;
};

/// automatic's options: fresh tuning, the --memory-gb workspace limit.
ops::SpAttnOptions automatic_options(const Options& o) {
  ops::SpAttnOptions autom;
  autom.use_cache = false;
  autom.workspace_limit_bytes = static_cast<std::size_t>(o.memory_gb * (1u << 30));
  return autom;
}

/// Every schedule the shape allows, with its workspace per rank; `a` and
/// `ctx` must outlive the bodies.
std::vector<Variant> make_variants(const Options& o, runtime::ProcessGroup& pg, Contexts& ctx, const ops::SpAttnArgs& a,
                                   const Case& c, std::size_t nk) {
  const int R = pg.world();
  const std::int64_t D = a.head_dim, B = a.batch;
  ops::SpAttnContext* sp = ctx.sp.get();
  std::vector<Variant> vs;
  vs.push_back({"ring sequential", [&] { ops::ring_attention(ctx.ring, a, ops::RingStrategy::sequential); },
                ops::ring_attention_workspace_bytes(a, R)});
  vs.push_back({"ring overlapped", [&] { ops::ring_attention(ctx.ring, a, ops::RingStrategy::overlapped); },
                ops::ring_attention_workspace_bytes(a, R)});
  if (sp) {  // part 1's all-gather KV (sp_attention), for reference
    const std::size_t kv_all = static_cast<std::size_t>(2 * B * c.seq * c.hkv * D) * 2;  // gathered K and V
    vs.push_back({"ag-kv sequential", [sp, &a] { ops::sp_attention(*sp, a, ops::SpStrategy::sequential); },
                  kv_all + static_cast<std::size_t>(R) * nk * 2 * 2});  // + NCCL staging of K and V shards
    vs.push_back({"ag-kv fused_ce", [sp, &a] { ops::sp_attention(*sp, a, ops::SpStrategy::fused_ce); }, kv_all});
  }
  if (c.hq % R == 0 && c.hkv % R == 0) {
    const int g = ops::ulysses_head_groups(a, R, ops::UlyssesStrategy::pipelined, o.head_groups);
    vs.push_back({"ulysses sequential", [&] { ops::ulysses_attention(ctx.uly, a, ops::UlyssesStrategy::sequential); },
                  ops::ulysses_attention_workspace_bytes(a, R, 1)});
    vs.push_back({fmt::format("ulysses pipelined G={}", g),
                  [&, g] { ops::ulysses_attention(ctx.uly, a, ops::UlyssesStrategy::pipelined, g); },
                  ops::ulysses_attention_workspace_bytes(a, R, g)});
  } else if (pg.rank() == 0) {
    fmt::print("{}: ulysses skipped (heads {}/{} not multiples of world {})\n", c.name, c.hq, c.hkv, R);
  }
  if (sp)  // two-level at every proper factorisation u x r the heads allow
    for (int u : ops::two_level_inner_degrees(a, R)) {
      if (u == 1 || u == R) continue;
      ops::SpAttnOptions tl;
      tl.strategy = ops::SpStrategy::two_level;
      tl.two_level_inner = u;
      vs.push_back({fmt::format("two-level {}x{}", u, R / u), [sp, &a, tl] { ops::sp_attention(*sp, a, tl); },
                    ops::two_level_attention_workspace_bytes(a, R, u)});
    }
  if (sp && R > 1) {  // the tuner's pick, tuned afresh on its first call
    const ops::SpAttnOptions autom = automatic_options(o);
    vs.push_back({"automatic", [sp, &a, autom] { ops::sp_attention(*sp, a, autom); }, 0});
  }
  return vs;
}

/// automatic (the last variant): its pick, and its time against the best
/// variant's that fits the workspace limit.
nlohmann::json automatic_record(const Options& o, ops::SpAttnContext& sp, const ops::SpAttnArgs& a, const Case& c,
                                int R, std::vector<Variant>& vs) {
  const ops::SpAttnOptions autom = automatic_options(o);
  const ops::SpStrategy pick = ops::resolve_sp_attention(sp, a, autom);  // memoized: no new tuning
  Variant& au = vs.back();
  au.workspace = ops::sp_attention_workspace_bytes(a, R, pick, autom.two_level_inner);
  double best = au.ms;
  std::string best_name = au.name;
  const std::size_t limit = autom.workspace_limit_bytes;
  for (const Variant& x : vs)  // the best among the variants that fit the limit
    if (&x != &au && x.ms < best && (limit == 0 || x.workspace <= limit)) best = x.ms, best_name = x.name;
  au.name = fmt::format("automatic ({})", ops::sp_strategy_name(pick));
  return {{"metric", "best / automatic"},
          {"case", fmt::format("{} R={}{}", c.name, R,
                               limit ? fmt::format(", workspace <= {:g} GiB", o.memory_gb) : std::string())},
          {"value", json_num(best / au.ms)},
          {"unit", "ratio"},
          {"baseline", best_name},
          {"target", {{"op", ">="}, {"value", 0.95}, {"text", "tuner's pick >= 95 % of the best measured schedule"}}}};
}

/// One case: its shards, every variant in one interleaved loop, its rows and records.
void run_case(const Options& o, runtime::ProcessGroup& pg, Contexts& ctx, const Case& c, std::mt19937_64& rng,
              Table& table, nlohmann::json& records) {
  const int R = pg.world();
  const cudaStream_t s = pg.stream();
  const std::int64_t D = 128, B = o.batch;
  const std::int64_t L = c.seq / R;
  const std::size_t nq = static_cast<std::size_t>(B * L * c.hq * D), nk = static_cast<std::size_t>(B * L * c.hkv * D);
  DeviceBuffer q(nq * 2), k(nk * 2), v(nk * 2), out(nq * 2), lse(static_cast<std::size_t>(B * c.hq * L) * 4);
  fill_random_16bit(q.p, nq, rng);
  fill_random_16bit(k.p, nk, rng);
  fill_random_16bit(v.p, nk, rng);
  ops::SpAttnArgs a;
  a.q = q.p;
  a.k = k.p;
  a.v = v.p;
  a.o = out.p;
  a.lse = static_cast<float*>(lse.p);
  a.batch = B;
  a.seq = c.seq;
  a.heads_q = c.hq;
  a.heads_kv = c.hkv;
  a.head_dim = D;
  a.causal = c.causal;
  const double pairs = c.causal ? static_cast<double>(c.seq) * (c.seq + 1) / 2 : static_cast<double>(c.seq) * c.seq;
  const double flops = 4.0 * B * c.hq * D * pairs;
  const double shards_gib = static_cast<double>((2 * nq + 2 * nk) * 2 + B * c.hq * L * 4) / (1u << 30);
  std::vector<Variant> vs = make_variants(o, pg, ctx, a, c, nk);
  for (Variant& x : vs) x.body();  // sizes the workspaces, checks shapes across ranks
  pg.synchronize(s, "bench ring-attention: first calls");
  InterleavedTimer timer(s, o.warmup, o.reps, [&] {
    pg.barrier();
    pg.align_streams(s);
  });
  for (Variant& x : vs) timer.add(&x.ms, x.body);
  timer.run([&](double t) { return pg.allreduce_max(t); });
  pg.synchronize(s, "bench ring-attention: timed calls");
  if (ctx.sp && R > 1) records.push_back(automatic_record(o, *ctx.sp, a, c, R, vs));
  for (const Variant& x : vs) {
    const double tflops = flops / R / (x.ms * 1e-3) / 1e12;
    const double ws_gib = static_cast<double>(x.workspace) / (1u << 30);
    table.add({c.name, x.name, fmt::format("{:.3f}", x.ms), fmt::format("{:.0f}", tflops),
               fmt::format("{:.3f}", ws_gib), fmt::format("{:.3f}", shards_gib)});
    const std::string cs = fmt::format("{} R={}: {}", c.name, R, x.name);
    records.push_back({{"metric", "time_ms"},
                       {"case", cs},
                       {"value", json_num(x.ms)},
                       {"unit", "ms"},
                       {"series", x.name},
                       {"size", c.seq}});
    records.push_back({{"metric", "TFLOP/s per GPU"}, {"case", cs}, {"value", json_num(tflops)}, {"unit", "TFLOP/s"}});
    records.push_back(
        {{"metric", "workspace GiB per rank"}, {"case", cs}, {"value", json_num(ws_gib)}, {"unit", "GiB"}});
  }
}

/// bench/results format (bench/results/README.md): provenance + records.
void write_json(const Options& o, runtime::ProcessGroup& pg, const nlohmann::json& records) {
  const int R = pg.world();
  write_results(o.json,
                {{"device", o.device_kind.empty() ? machine_kind(pg.device_properties().name, R) : o.device_kind},
                 {"gpu", pg.device_properties().name},
                 {"date", results_date()},
                 {"commit", results_commit(o.commit)},
                 {"command", fmt::format("tessera run -n {} -- tessera bench ring-attention", R)},
                 {"topic", "attention"},
                 {"issue", 21},
                 {"world", R},
                 {"dtype", "bf16"},
                 {"head_dim", 128},
                 {"batch", o.batch},
                 {"reps", o.reps},
                 {"warmup", o.warmup}},
                records, "bench ring-attention");
}

void run(const Options& o) {
  auto pg = runtime::ProcessGroup::from_environment();
  std::mt19937_64 rng(1234 + pg->rank());
  Contexts ctx(*pg, o);
  const std::vector<Case> cases = all_cases();
  std::vector<int> idx = o.cases;
  if (idx.empty())
    for (int i = 0; i < static_cast<int>(cases.size()); ++i) idx.push_back(i);
  Table table({"case", "variant", "ms", "TFLOP/s/GPU", "workspace GiB/rank", "shards GiB/rank"});
  nlohmann::json records = nlohmann::json::array();
  for (int ci : idx) {
    TESSERA_CHECK(ci >= 0 && ci < static_cast<int>(cases.size()), "bench ring-attention: case {} out of range [0, {})",
                  ci, cases.size());
    run_case(o, *pg, ctx, cases[ci], rng, table, records);
  }
  if (pg->rank() != 0) return;
  fmt::print("tessera bench ring-attention: R={} on {} (bf16, head dim 128, batch {}; median of {}, slowest rank)\n{}",
             pg->world(), pg->device_properties().name, o.batch, o.reps, table.str());
  if (!o.json.empty()) write_json(o, *pg, records);
}

}  // namespace

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto& bench = tools::subcommand(root, "bench", "Benchmarks");
  auto opts = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("ring-attention",
                                   "sequence-parallel attention: ring, Ulysses and two-level strategies on zig-zag "
                                   "shards");
  cmd->add_option("--cases", opts->cases,
                  "case indices (default all): 0 32h 16k causal, 1 32h 16k, 2 GQA 32/8 16k causal, 3 GQA 32/8 16k, "
                  "4-7 the same at 32k, 8 64h 16k causal, 9 32h 64k causal, 10 GQA 32/8 64k causal, 11 32h 128k "
                  "causal, 12 GQA 32/8 128k causal")
      ->delimiter(',');
  cmd->add_option("--batch", opts->batch, "batch size")->check(CLI::Range(1, 64));
  cmd->add_option("--head-groups", opts->head_groups, "Ulysses pipelined head groups (0: automatic)")
      ->check(CLI::Range(0, 64));
  cmd->add_flag("!--no-agkv", opts->agkv, "leave out part 1's all-gather-KV operator (sp_attention)");
  cmd->add_option("--memory-gb", opts->memory_gb,
                  "workspace limit per rank (GiB) for the automatic variant; its pick is compared with the best "
                  "variant within it (0: none)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--reps", opts->reps, "timed repetitions (median)")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", opts->warmup, "warm-up repetitions")->check(CLI::Range(0, 100000));
  cmd->add_option("--json", opts->json, "write the figures here (rank 0, bench/results format)");
  cmd->add_option("--device-kind", opts->device_kind,
                  "device kind recorded in --json (default: from the GPU name and R, e.g. nvidia-h200-x2)");
  cmd->add_option("--commit", opts->commit, "commit recorded in --json (default: $TESSERA_COMMIT)");
  cmd->callback([opts] { run(*opts); });
});

}  // namespace tessera::bench::ring_attention
