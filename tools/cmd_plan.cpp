// `tessera plan` — CommIR schedule search for one operator (or a chain) on a
// device mesh: top schedules with predicted time and per-rank memory, the
// Pareto front of time against memory, and the lowered plan of the winner.
// Runs without GPUs. The contract on bad input is in plan_command.hpp.
#include <fmt/format.h>

#include <cmath>
#include <memory>

#include "command.hpp"
#include "plan_command.hpp"
#include "tessera/commir/schedules.hpp"
#include "tessera/commir/text.hpp"
#include "tessera/commir/transforms.hpp"
#include "tessera/commir/tuner.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/tune/cache.hpp"

namespace tessera::tools {
namespace {

using namespace tessera::commir;

constexpr std::size_t kMaxInputBytes = std::size_t{1} << 20;

struct PlanArgs {
  std::string mesh = "2x4";
  CLI::Option* mesh_opt = nullptr;
  std::string machine = "h100";
  std::string profile;
  std::string schedule;
  std::string layout;
  int top = 8;
  double memory_gb = 0;
  int plan_steps = 12;
  double budget_s = kDefaultPlanBudgetS;
};

struct State {
  std::FILE* out = stdout;
  PlanArgs ga, aa, fa, la;
  std::int64_t m = 8192, n = 8192, k = 8192;
  std::int64_t batch = 1, heads = 32, kv_heads = 32, seq = 32768, kv_len = 0, head_dim = 128;
  std::string file;
  std::int64_t tokens = 4096, hidden = 4096, inter = 14336;
};

void add_common(CLI::App& c, PlanArgs& a) {
  a.mesh_opt = c.add_option("--mesh", a.mesh, "device mesh, outer level first, e.g. 2x4 (2 nodes x 4 GPUs)");
  c.add_option("--machine", a.machine, "built-in profile: h200x2, h100, a100, l4");
  c.add_option("--profile", a.profile, "machine profile JSON file (overrides --machine)");
  c.add_option("--schedule", a.schedule, "lower this named schedule instead of searching");
  c.add_option("--layout", a.layout, "fixed input/output layout: that of a named schedule (e.g. ring)");
  c.add_option("--top", a.top, "schedules to list")->check(CLI::Range(1, 1000));
  c.add_option("--memory-gb", a.memory_gb, "per-GPU memory limit (default: the profile's)")
      ->check(CLI::Range(0.0, 1e6));
  c.add_option("--plan-steps", a.plan_steps, "steps per rank to print of the winner's plan")
      ->check(CLI::Range(0, 100000));
  c.add_option("--budget-s", a.budget_s, "search time budget in seconds; the best plan so far when it runs out")
      ->check(CLI::Range(1e-3, 86400.0));
}

// Values CLI11's Range lets through (NaN compares false both ways).
void check_numbers(const PlanArgs& a) {
  TESSERA_CHECK(std::isfinite(a.memory_gb) && a.memory_gb >= 0, "plan: --memory-gb {} must be finite and >= 0",
                a.memory_gb);
  TESSERA_CHECK(std::isfinite(a.budget_s) && a.budget_s > 0, "plan: --budget-s {} must be finite and > 0", a.budget_s);
}

void check_link(const LinkLevel& l, const std::string& what) {
  for (double v : {l.p2p_gbps, l.coll_gbps})
    TESSERA_CHECK(std::isfinite(v) && v >= 1e-6 && v <= 1e6, "{}: link bandwidth {} GB/s outside [1e-6, 1e6]", what, v);
  TESSERA_CHECK(std::isfinite(l.latency_us) && l.latency_us >= 0 && l.latency_us <= 1e9,
                "{}: latency {} us outside [0, 1e9]", what, l.latency_us);
}

MachineProfile profile_of(const PlanArgs& a) {
  if (a.profile.empty()) return builtin_profile(a.machine);
  const std::string what = fmt::format("plan: --profile '{}'", a.profile);
  // Bounded, non-blocking read, then the integer fields range-checked before
  // load_profile converts them (2^32 + 8 GPUs per node must not read as 8).
  const auto j = ::tessera::tune::parse_json(::tessera::tune::read_file_limited(a.profile, kMaxInputBytes, what), what);
  TESSERA_CHECK(j.is_object(), "{}: not a JSON object", what);
  if (j.contains("gpus_per_node")) ::tessera::tune::json_int(j["gpus_per_node"], what + ": gpus_per_node", 1, 1 << 16);
  MachineProfile p = load_profile(a.profile);
  for (double v : {p.memory_gb, p.gemm_tflops, p.attention_tflops})
    TESSERA_CHECK(std::isfinite(v) && v > 0 && v <= 1e9, "{}: memory and rates must be in (0, 1e9], got {}", what, v);
  TESSERA_CHECK(std::isfinite(p.kernel_overhead_us) && p.kernel_overhead_us >= 0 && p.kernel_overhead_us <= 1e9,
                "{}: kernel_overhead_us {} outside [0, 1e9]", what, p.kernel_overhead_us);
  check_link(p.intra, what + ": intra");
  check_link(p.inter, what + ": inter");
  return p;
}

std::string mib(std::int64_t b) { return fmt::format("{:.1f}", static_cast<double>(b) / (1 << 20)); }

void report(std::FILE* out, const Grid& op, const PlanArgs& a) {
  check_numbers(a);
  validate(op, "plan");
  const MachineProfile prof = profile_of(a);
  fmt::print(out, "operator {} on mesh {} ({}), machine {}\n", op.name, mesh_string(op.mesh), op.world(), prof.name);
  if (!a.schedule.empty()) {
    Grid g = op;
    if (a.schedule.find('(') != std::string::npos)
      apply(g, a.schedule);
    else
      g = scheduled(op, a.schedule);
    validate(g, "plan --schedule");
    const Plan p = lower(g);
    const Estimate e = estimate(p, prof);
    fmt::print(out, "schedule {}: predicted {:.1f} us (compute {:.1f}, comm {:.1f}), peak {} MiB per rank\n",
               a.schedule, e.time_us, e.compute_us, e.comm_us, mib(e.peak_bytes));
    fmt::print(out, "{}\n{}", print(g), describe(p, a.plan_steps));
    return;
  }
  Layout contract;
  TuneOptions opt;
  opt.memory_limit_gb = a.memory_gb;
  opt.budget_s = a.budget_s;
  if (!a.layout.empty()) {
    contract = layout_of(lower(scheduled(op, a.layout)));
    opt.contract = &contract;
  }
  const TuneResult r = commir::tune(op, prof, opt);
  fmt::print(out, "searched {} candidates: {} invalid, {} over the memory limit, {} feasible{}\n", r.enumerated,
             r.invalid, r.pruned_memory, r.ranked.size(),
             r.out_of_time ? fmt::format(" (stopped at the --budget-s of {} s: best so far)", a.budget_s) : "");
  TESSERA_CHECK(!r.ranked.empty(), "plan: no feasible schedule{}",
                r.out_of_time ? fmt::format(" within --budget-s {}", a.budget_s)
                              : fmt::format(" within the per-GPU memory limit of {} GB (--memory-gb)",
                                            a.memory_gb > 0 ? a.memory_gb : prof.memory_gb));
  auto row = [&](int i, const Candidate& c) {
    std::string lv;
    for (double b : c.est.bytes_per_level) lv += fmt::format(" {:.1f}", b / (1 << 20));
    fmt::print(out, "{:>3} {:>10.1f} {:>9.1f} {:>9.1f} {:>10} {:>18}  {}\n", i, c.est.time_us, c.est.comm_us,
               c.est.reshard_us, mib(c.est.peak_bytes), lv, c.script);
  };
  fmt::print(out, "\n  # {:>10} {:>9} {:>9} {:>10} {:>18}  schedule\n", "time[us]", "comm[us]", "resh[us]", "mem[MiB]",
             "MiB moved/level");
  for (int i = 0; i < a.top && i < static_cast<int>(r.ranked.size()); ++i) row(i, r.ranked[i]);
  fmt::print(out, "\nPareto front (time vs per-rank memory):\n");
  for (std::size_t i = 0; i < r.pareto.size(); ++i) row(static_cast<int>(i), r.pareto[i]);
  const Plan best = lower(r.ranked.front().grid);
  fmt::print(out, "\nwinner:\n{}\n{}", print(r.ranked.front().grid), describe(best, a.plan_steps));
}

void run_file(State& s) {
  const PlanArgs& fa = s.fa;
  check_numbers(fa);
  Grid g = parse(::tessera::tune::read_file_limited(s.file, kMaxTextBytes, fmt::format("plan file '{}'", s.file)));
  if (g.mesh.empty() || fa.mesh_opt->count() > 0) g.mesh = parse_mesh(fa.mesh);
  validate(g, fmt::format("plan file '{}'", s.file).c_str());
  if (!g.loops.empty() && fa.schedule.empty()) {  // already scheduled: lower and estimate it
    const Plan p = lower(g);
    const Estimate e = estimate(p, profile_of(fa));
    fmt::print(s.out, "predicted {:.1f} us, peak {} MiB per rank\n{}", e.time_us, mib(e.peak_bytes),
               describe(p, fa.plan_steps));
    return;
  }
  report(s.out, g, fa);
}

void run_mlp(State& s) {
  const PlanArgs& la = s.la;
  check_numbers(la);
  const MachineProfile prof = profile_of(la);
  const auto mesh = parse_mesh(la.mesh);
  TuneOptions opt;
  opt.memory_limit_gb = la.memory_gb;
  opt.budget_s = la.budget_s / 2;  // two searches share the budget
  std::vector<std::vector<Candidate>> cands;
  for (auto [mm, nn, kk] : {std::tuple{s.tokens, s.inter, s.hidden}, std::tuple{s.tokens, s.hidden, s.inter}}) {
    auto r = commir::tune(make_gemm(mm, nn, kk, mesh), prof, opt);
    TESSERA_CHECK(!r.ranked.empty(), "plan mlp: no feasible schedule for a GEMM");
    r.ranked.resize(std::min<std::size_t>(r.ranked.size(), static_cast<std::size_t>(la.top)));
    cands.push_back(r.ranked);
  }
  const auto res = graph_search(cands, {GraphEdge{0, 1, "C", "A"}}, prof);
  fmt::print(s.out, "MLP {}x{}x{} on mesh {}, machine {}: {} combinations of the top {} schedules per GEMM\n", s.tokens,
             s.hidden, s.inter, la.mesh, prof.name, res.combinations, la.top);
  fmt::print(s.out, "best total {:.1f} us (isolated best GEMMs: {:.1f} + {:.1f} us)\n", res.total_us,
             cands[0][0].est.time_us, cands[1][0].est.time_us);
  for (int i = 0; i < 2; ++i)
    fmt::print(s.out, "  GEMM{}: {:.1f} us + reshard {:.1f} us  {}\n", i + 1, res.exec_us[i], res.reshard_us[i],
               cands[i][res.pick[i]].script);
}

}  // namespace

void add_plan_command(CLI::App& root, std::FILE* out) {
  auto st = std::make_shared<State>();
  st->out = out;
  CLI::App* plan = nullptr;
  for (CLI::App* c : root.get_subcommands({}))
    if (c->get_name() == "plan") plan = c;
  if (!plan) {
    plan = root.add_subcommand("plan", "CommIR schedule search (Mercury) for an operator on a mesh");
    plan->require_subcommand(1);
  }
  const auto extent = CLI::Range(std::int64_t{1}, kMaxExtent);

  auto* gemm = plan->add_subcommand("gemm", "C[m,n] += A[m,k] * B[k,n]");
  gemm->add_option("-m", st->m, "rows")->check(extent);
  gemm->add_option("-n", st->n, "columns")->check(extent);
  gemm->add_option("-k", st->k, "reduction length")->check(extent);
  add_common(*gemm, st->ga);
  gemm->callback([st] { report(st->out, make_gemm(st->m, st->n, st->k, parse_mesh(st->ga.mesh)), st->ga); });

  auto* att = plan->add_subcommand("attention", "O = softmax(Q K^T / sqrt(d)) V (MHA or GQA)");
  att->add_option("--batch", st->batch)->check(extent);
  att->add_option("--heads", st->heads)->check(extent);
  att->add_option("--kv-heads", st->kv_heads, "GQA: heads of K and V")->check(extent);
  att->add_option("--seq", st->seq, "query length")->check(extent);
  att->add_option("--kv-len", st->kv_len, "context length (default: --seq)")
      ->check(CLI::Range(std::int64_t{0}, kMaxExtent));
  att->add_option("--head-dim", st->head_dim)->check(CLI::Range(std::int64_t{1}, kMaxElem));
  add_common(*att, st->aa);
  att->callback([st] {
    report(st->out,
           make_attention(st->batch, st->heads, st->kv_heads, st->seq, st->kv_len > 0 ? st->kv_len : st->seq,
                          st->head_dim, parse_mesh(st->aa.mesh)),
           st->aa);
  });

  auto* fc = plan->add_subcommand("file", "an operator in CommIR text form (see commir/text.hpp)");
  fc->add_option("path", st->file, "grid file")->required();
  add_common(*fc, st->fa);
  fc->callback([st] { run_file(*st); });

  auto* layer =
      plan->add_subcommand("mlp", "graph-level search (Alg. 1) over GEMM1 -> GEMM2 of an MLP with resharding");
  layer->add_option("--tokens", st->tokens)->check(extent);
  layer->add_option("--hidden", st->hidden)->check(extent);
  layer->add_option("--intermediate", st->inter)->check(extent);
  add_common(*layer, st->la);
  layer->callback([st] { run_mlp(*st); });

  auto* prof = plan->add_subcommand("profiles", "print the built-in machine profiles as JSON");
  prof->callback([st] {
    for (const auto& n : builtin_profile_names()) fmt::print(st->out, "{}\n", profile_json(builtin_profile(n)));
  });
}

void run_plan(const std::vector<std::string>& args, std::FILE* out) {
  CLI::App app{"tessera"};
  app.require_subcommand(1);
  add_plan_command(app, out);
  std::vector<std::string> argv{"plan"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::reverse(argv.begin(), argv.end());  // CLI11 takes the arguments reversed
  try {
    app.parse(argv);
  } catch (const CLI::Success&) {  // --help and friends
  } catch (const CLI::ParseError& e) {
    TESSERA_FAIL("plan: {}", e.what());
  }
}

}  // namespace tessera::tools

#ifndef TESSERA_PLAN_NO_REGISTER
TESSERA_REGISTER_COMMAND([](CLI::App& root) { tessera::tools::add_plan_command(root); });
#endif
