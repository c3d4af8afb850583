// `tessera plan` — CommIR schedule search for one operator (or a chain) on a
// device mesh: top schedules with predicted time and per-rank memory, the
// Pareto front of time against memory, and the lowered plan of the winner.
// Runs without GPUs.
#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "command.hpp"
#include "tessera/commir/schedules.hpp"
#include "tessera/commir/text.hpp"
#include "tessera/commir/transforms.hpp"
#include "tessera/commir/tuner.hpp"
#include "tessera/runtime/error.hpp"

namespace {

using namespace tessera::commir;

struct PlanArgs {
  std::string mesh = "2x4";
  std::string machine = "h100";
  std::string profile;
  std::string schedule;
  std::string layout;
  int top = 8;
  double memory_gb = 0;
  int plan_steps = 12;
};

void add_common(CLI::App& c, PlanArgs& a) {
  c.add_option("--mesh", a.mesh, "device mesh, outer level first, e.g. 2x4 (2 nodes x 4 GPUs)");
  c.add_option("--machine", a.machine, "built-in profile: h200x2, h100, a100, l4");
  c.add_option("--profile", a.profile, "machine profile JSON file (overrides --machine)");
  c.add_option("--schedule", a.schedule, "lower this named schedule instead of searching");
  c.add_option("--layout", a.layout, "fixed input/output layout: that of a named schedule (e.g. ring)");
  c.add_option("--top", a.top, "schedules to list");
  c.add_option("--memory-gb", a.memory_gb, "per-GPU memory limit (default: the profile's)");
  c.add_option("--plan-steps", a.plan_steps, "steps per rank to print of the winner's plan");
}

MachineProfile profile_of(const PlanArgs& a) {
  return a.profile.empty() ? builtin_profile(a.machine) : load_profile(a.profile);
}

std::string mib(std::int64_t b) { return fmt::format("{:.1f}", static_cast<double>(b) / (1 << 20)); }

void report(const Grid& op, const PlanArgs& a) {
  const MachineProfile prof = profile_of(a);
  fmt::print("operator {} on mesh {} ({}), machine {}\n", op.name, mesh_string(op.mesh), op.world(), prof.name);
  if (!a.schedule.empty()) {
    Grid g = op;
    if (a.schedule.find('(') != std::string::npos) apply(g, a.schedule);
    else g = scheduled(op, a.schedule);
    const Plan p = lower(g);
    const Estimate e = estimate(p, prof);
    fmt::print("schedule {}: predicted {:.1f} us (compute {:.1f}, comm {:.1f}), peak {} MiB per rank\n", a.schedule,
               e.time_us, e.compute_us, e.comm_us, mib(e.peak_bytes));
    fmt::print("{}\n{}", print(g), describe(p, a.plan_steps));
    return;
  }
  Layout contract;
  TuneOptions opt;
  opt.memory_limit_gb = a.memory_gb;
  if (!a.layout.empty()) {
    contract = layout_of(lower(scheduled(op, a.layout)));
    opt.contract = &contract;
  }
  const TuneResult r = tune(op, prof, opt);
  fmt::print("searched {} candidates: {} invalid, {} over the memory limit, {} feasible\n", r.enumerated, r.invalid,
             r.pruned_memory, r.ranked.size());
  TESSERA_CHECK(!r.ranked.empty(), "plan: no feasible schedule (memory limit {} GB?)", a.memory_gb);
  auto row = [&](int i, const Candidate& c) {
    std::string lv;
    for (double b : c.est.bytes_per_level) lv += fmt::format(" {:.1f}", b / (1 << 20));
    fmt::print("{:>3} {:>10.1f} {:>9.1f} {:>9.1f} {:>10} {:>18}  {}\n", i, c.est.time_us, c.est.comm_us, c.est.reshard_us,
               mib(c.est.peak_bytes), lv, c.script);
  };
  fmt::print("\n  # {:>10} {:>9} {:>9} {:>10} {:>18}  schedule\n", "time[us]", "comm[us]", "resh[us]", "mem[MiB]",
             "MiB moved/level");
  for (int i = 0; i < a.top && i < static_cast<int>(r.ranked.size()); ++i) row(i, r.ranked[i]);
  fmt::print("\nPareto front (time vs per-rank memory):\n");
  for (std::size_t i = 0; i < r.pareto.size(); ++i) row(static_cast<int>(i), r.pareto[i]);
  const Plan best = lower(r.ranked.front().grid);
  fmt::print("\nwinner:\n{}\n{}", print(r.ranked.front().grid), describe(best, a.plan_steps));
}

}  // namespace

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto& plan = tessera::tools::subcommand(root, "plan", "CommIR schedule search (Mercury) for an operator on a mesh");

  static PlanArgs ga;
  static std::int64_t m = 8192, n = 8192, k = 8192;
  auto* gemm = plan.add_subcommand("gemm", "C[m,n] += A[m,k] * B[k,n]");
  gemm->add_option("-m", m, "rows")->check(CLI::PositiveNumber);
  gemm->add_option("-n", n, "columns")->check(CLI::PositiveNumber);
  gemm->add_option("-k", k, "reduction length")->check(CLI::PositiveNumber);
  add_common(*gemm, ga);
  gemm->callback([] { report(make_gemm(m, n, k, parse_mesh(ga.mesh)), ga); });

  static PlanArgs aa;
  static std::int64_t batch = 1, heads = 32, kv_heads = 32, seq = 32768, kv_len = 0, head_dim = 128;
  auto* att = plan.add_subcommand("attention", "O = softmax(Q K^T / sqrt(d)) V (MHA or GQA)");
  att->add_option("--batch", batch)->check(CLI::PositiveNumber);
  att->add_option("--heads", heads)->check(CLI::PositiveNumber);
  att->add_option("--kv-heads", kv_heads, "GQA: heads of K and V")->check(CLI::PositiveNumber);
  att->add_option("--seq", seq, "query length")->check(CLI::PositiveNumber);
  att->add_option("--kv-len", kv_len, "context length (default: --seq)");
  att->add_option("--head-dim", head_dim)->check(CLI::PositiveNumber);
  add_common(*att, aa);
  att->callback([] {
    report(make_attention(batch, heads, kv_heads, seq, kv_len > 0 ? kv_len : seq, head_dim, parse_mesh(aa.mesh)), aa);
  });

  static PlanArgs fa;
  static std::string file;
  auto* fc = plan.add_subcommand("file", "an operator in CommIR text form (see commir/text.hpp)");
  fc->add_option("path", file, "grid file")->required();
  add_common(*fc, fa);
  fc->callback([] {
    std::ifstream in(file);
    TESSERA_CHECK(in.good(), "plan: cannot open '{}'", file);
    std::stringstream ss;
    ss << in.rdbuf();
    Grid g = parse(ss.str());
    if (g.mesh.empty() || fa.mesh != "2x4") g.mesh = parse_mesh(fa.mesh);
    if (!g.loops.empty() && fa.schedule.empty()) {  // already scheduled: lower and estimate it
      const Plan p = lower(g);
      const Estimate e = estimate(p, profile_of(fa));
      fmt::print("predicted {:.1f} us, peak {} MiB per rank\n{}", e.time_us, mib(e.peak_bytes), describe(p, fa.plan_steps));
      return;
    }
    report(g, fa);
  });

  static PlanArgs la;
  static std::int64_t tokens = 4096, hidden = 4096, inter = 14336;
  auto* layer = plan.add_subcommand("mlp", "graph-level search (Alg. 1) over GEMM1 -> GEMM2 of an MLP with resharding");
  layer->add_option("--tokens", tokens)->check(CLI::PositiveNumber);
  layer->add_option("--hidden", hidden)->check(CLI::PositiveNumber);
  layer->add_option("--intermediate", inter)->check(CLI::PositiveNumber);
  add_common(*layer, la);
  layer->callback([] {
    const MachineProfile prof = profile_of(la);
    const auto mesh = parse_mesh(la.mesh);
    TuneOptions opt;
    opt.memory_limit_gb = la.memory_gb;
    std::vector<std::vector<Candidate>> cands;
    for (auto [mm, nn, kk] : {std::tuple{tokens, inter, hidden}, std::tuple{tokens, hidden, inter}}) {
      auto r = tune(make_gemm(mm, nn, kk, mesh), prof, opt);
      TESSERA_CHECK(!r.ranked.empty(), "plan mlp: no feasible schedule for a GEMM");
      r.ranked.resize(std::min<std::size_t>(r.ranked.size(), static_cast<std::size_t>(la.top)));
      cands.push_back(r.ranked);
    }
    const auto res = graph_search(cands, {GraphEdge{0, 1, "C", "A"}}, prof);
    fmt::print("MLP {}x{}x{} on mesh {}, machine {}: {} combinations of the top {} schedules per GEMM\n", tokens, hidden,
               inter, la.mesh, prof.name, res.combinations, la.top);
    fmt::print("best total {:.1f} us (isolated best GEMMs: {:.1f} + {:.1f} us)\n", res.total_us, cands[0][0].est.time_us,
               cands[1][0].est.time_us);
    for (int i = 0; i < 2; ++i)
      fmt::print("  GEMM{}: {:.1f} us + reshard {:.1f} us  {}\n", i + 1, res.exec_us[i], res.reshard_us[i],
                 cands[i][res.pick[i]].script);
  });

  auto* prof = plan.add_subcommand("profiles", "print the built-in machine profiles as JSON");
  prof->callback([] {
    for (const auto& n : builtin_profile_names()) fmt::print("{}\n", profile_json(builtin_profile(n)));
  });
});
