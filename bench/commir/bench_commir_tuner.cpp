// tessera bench commir-tuner — the measured CommIR autotuner
// (commir/measured_tuner.hpp) on attention, on the GPUs:
//
//   tessera run -n 2 -- tessera bench commir-tuner [--seq 16384,32768] [--mesh 2]
//
// Per sequence length: the model's top-k plans run, the model is calibrated
// to them, the calibrated top-k run, and the fastest is the pick. Then up to
// --exhaustive more candidates (calibrated order) run, so that the pick can
// be compared with the best plan measured at all (the target: the pick is
// >= 95 % of the best). Each plan is timed alone (random inputs, warm-up,
// median of --reps, slowest rank); resharding from and to the --layout
// contract (default: sequence-sharded, as the hand-built operators take their
// inputs) is charged by the calibrated model. Non-causal: the IR has no
// causal body.
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/results.hpp"
#include "common/timing.hpp"
#include "command.hpp"
#include "tessera/commir/measured_tuner.hpp"
#include "tessera/commir/schedules.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::bench {
namespace {

struct TunerBenchOptions {
  std::vector<std::int64_t> seqs{16384, 32768};
  std::int64_t batch = 1, heads = 32, kv_heads = 8, head_dim = 128;
  std::string mesh;  // "" = one level of the world size
  std::string machine = "h200x2";
  std::string layout = "ring";  // the contract: inputs arrive, outputs leave in this schedule's layout ("none")
  double memory_gb = 0;
  int top_k = 3;
  int exhaustive = 12;
  int reps = 5, warmup = 2;
  std::string json, device_kind, commit;
};

struct CaseResult {
  std::int64_t seq = 0;
  commir::MeasureResult tuned;
  double best_us = 0;
  std::string best_label;
  int runs_by_tuner = 0;
};

CaseResult run_case(runtime::ProcessGroup& pg, const TunerBenchOptions& o, std::int64_t seq,
                    const commir::MachineProfile& prof, const std::vector<int>& mesh) {
  CaseResult c;
  c.seq = seq;
  const commir::Grid op = commir::make_attention(o.batch, o.heads, o.kv_heads, seq, seq, o.head_dim, mesh);
  commir::PlanTimingOptions to;
  to.reps = o.reps;
  to.warmup = o.warmup;
  auto runner = [&](const commir::Plan& p, const std::string& label) {
    ++c.runs_by_tuner;
    return commir::time_plan_on_gpus(pg, p, label, to);
  };
  commir::MeasureOptions mo;
  mo.top_k = o.top_k;
  mo.search.memory_limit_gb = o.memory_gb;
  commir::Layout contract;
  if (o.layout != "none") {
    contract = commir::layout_of(commir::lower(commir::scheduled(op, o.layout)));
    mo.search.contract = &contract;
  }
  c.tuned = commir::tune_measured(op, prof, mo, runner);
  // The reference: more candidates measured, in the calibrated order.
  int extra = 0;
  for (auto& p : c.tuned.plans) {
    if (extra == o.exhaustive) break;
    if (p.measured_us > 0 || !p.error.empty()) continue;
    ++extra;
    try {
      p.measured_us = commir::time_plan_on_gpus(pg, commir::lower(p.grid), p.label, to);
    } catch (const Error& e) {
      p.error = e.what();
    }
  }
  for (const auto& p : c.tuned.plans)
    if (p.measured_us > 0 && (c.best_us == 0 || p.total_us() < c.best_us))
      c.best_us = p.total_us(), c.best_label = p.label;
  return c;
}

nlohmann::json records_of(const CaseResult& c, const std::string& shape) {
  const auto& t = c.tuned;
  const auto& pick = t.plans[t.pick];
  const auto& model = t.plans[t.model_pick];
  auto rec = [&](std::string metric, double value, std::string unit) {
    return nlohmann::json{{"case", shape}, {"metric", std::move(metric)}, {"value", value}, {"unit", std::move(unit)}};
  };
  nlohmann::json r = nlohmann::json::array();
  auto ratio = rec("measured tuner pick / best measured plan (speed)", c.best_us / pick.total_us(), "ratio");
  ratio["target"] = {{"op", ">="}, {"value", 0.95}, {"text", "the autotuner's pick is >= 95 % of the best"}};
  ratio["source"] = fmt::format("pick {}, best {}", pick.label, c.best_label);
  r.push_back(ratio);
  if (model.measured_us > 0) {
    auto m = rec("model's first choice / best measured plan (speed)", c.best_us / model.total_us(), "ratio");
    m["source"] = fmt::format("model's choice {}", model.label);
    r.push_back(m);
  }
  r.push_back(rec("calibrated compute scale", t.calibration.compute_scale, "ratio"));
  r.push_back(rec("calibrated link scale", t.calibration.comm_scale, "ratio"));
  r.push_back(rec("plans run by the tuner", c.runs_by_tuner, "count"));
  for (const auto& p : t.plans)
    if (p.measured_us > 0) {
      auto x = rec("plan time", p.total_us() / 1e3, "ms");
      x["series"] = p.label;
      x["source"] =
          fmt::format("measured {:.3f} ms + calibrated resharding {:.3f} ms; model {:.3f} ms, calibrated {:.3f} ms; {}",
                      p.measured_us / 1e3, p.calibrated.reshard_us / 1e3, p.model.time_us / 1e3,
                      p.calibrated.time_us / 1e3, p.script);
      r.push_back(x);
    }
  return r;
}

void print_case(const CaseResult& c, const std::string& shape) {
  const auto& t = c.tuned;
  Table table({"plan", "model ms", "calibrated ms", "measured ms", "+ reshard ms", "MiB/rank (model)", ""});
  for (std::size_t i = 0; i < t.plans.size(); ++i) {
    const auto& p = t.plans[i];
    if (p.measured_us <= 0 && p.error.empty()) continue;
    std::string mark = static_cast<int>(i) == t.pick ? "pick" : "";
    if (static_cast<int>(i) == t.model_pick) mark += mark.empty() ? "model" : ", model";
    if (!p.error.empty()) mark = "cannot run: " + p.error.substr(0, 60);
    table.add({p.label, fmt::format("{:.3f}", p.model.time_us / 1e3), fmt::format("{:.3f}", p.calibrated.time_us / 1e3),
               p.measured_us > 0 ? fmt::format("{:.3f}", p.measured_us / 1e3) : "-",
               fmt::format("{:.3f}", p.calibrated.reshard_us / 1e3),
               fmt::format("{:.0f}", p.model.peak_bytes / 1048576.0), mark});
  }
  fmt::print(
      "{}: compute x{:.2f}, links x{:.2f} (rms log error {:.2f}); {} plans run by the tuner; pick {} = {:.3f} "
      "of the best measured ({})\n{}",
      shape, t.calibration.compute_scale, t.calibration.comm_scale, t.calibration.rms_log_error, c.runs_by_tuner,
      t.plans[t.pick].label, c.best_us / t.plans[t.pick].total_us(), c.best_label, table.str());
}

void run_tuner_bench(const TunerBenchOptions& o) {
  auto pg = runtime::ProcessGroup::from_environment();
  const int R = pg->world();
  TESSERA_CHECK(R >= 2, "bench commir-tuner needs at least 2 ranks (tessera run -n 2 -- ...)");
  const std::vector<int> mesh = o.mesh.empty() ? std::vector<int>{R} : commir::parse_mesh(o.mesh);
  int world = 1;
  for (int m : mesh) world *= m;
  TESSERA_CHECK(world == R, "bench commir-tuner: --mesh {} has {} devices but {} ranks run", o.mesh, world, R);
  const commir::MachineProfile prof = commir::builtin_profile(o.machine);
  nlohmann::json records = nlohmann::json::array();
  for (std::int64_t seq : o.seqs) {
    const std::string shape = fmt::format("b{} S={} h{}/{} d{} mesh {}", o.batch, seq, o.heads, o.kv_heads, o.head_dim,
                                          commir::mesh_string(mesh));
    const CaseResult c = run_case(*pg, o, seq, prof, mesh);
    if (pg->rank() != 0) continue;
    print_case(c, shape);
    for (auto& r : records_of(c, shape)) records.push_back(std::move(r));
  }
  if (pg->rank() != 0 || o.json.empty()) return;
  write_results(o.json,
                {{"topic", "commir-tuner"},
                 {"issue", 21},
                 {"device", o.device_kind.empty() ? machine_kind(pg->device_properties().name, R) : o.device_kind},
                 {"gpu", pg->device_properties().name},
                 {"date", results_date()},
                 {"commit", results_commit(o.commit)},
                 {"command", fmt::format("tessera run -n {} -- tessera bench commir-tuner --top-k {} --exhaustive {}",
                                         R, o.top_k, o.exhaustive)},
                 {"model_profile", o.machine},
                 {"reps", o.reps}},
                records, "bench commir-tuner");
}

}  // namespace

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto& bench = tools::subcommand(root, "bench", "Benchmarks (run multi-GPU ones under `tessera run -n N --`)");
  auto o = std::make_shared<TunerBenchOptions>();
  auto* cmd = bench.add_subcommand("commir-tuner",
                                   "the measured CommIR autotuner on attention: model top-k, calibration, pick");
  cmd->add_option("--seq", o->seqs, "global tokens (query = context length)")->delimiter(',');
  cmd->add_option("--batch", o->batch)->check(CLI::Range(1, 64));
  cmd->add_option("--heads", o->heads)->check(CLI::Range(1, 1024));
  cmd->add_option("--kv-heads", o->kv_heads, "K/V heads (divides --heads)")->check(CLI::Range(1, 1024));
  cmd->add_option("--head-dim", o->head_dim)->check(CLI::IsMember({64, 128}));
  cmd->add_option("--mesh", o->mesh, "device mesh, outer level first (default: one level of all ranks)");
  cmd->add_option("--machine", o->machine, "the model's built-in profile before calibration");
  cmd->add_option("--layout", o->layout,
                  "contract: inputs and outputs in this schedule's layout (default ring: sequence-sharded), or none");
  cmd->add_option("--memory-gb", o->memory_gb, "per-GPU memory limit of the search (0: the profile's)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--top-k", o->top_k, "plans run per tuner round")->check(CLI::Range(1, 64));
  cmd->add_option("--exhaustive", o->exhaustive, "more candidates run for the reference best")
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--reps", o->reps, "timed repetitions per plan")->check(CLI::Range(1, 1000));
  cmd->add_option("--warmup", o->warmup)->check(CLI::Range(0, 1000));
  cmd->add_option("--json", o->json, "write the figures here (rank 0, bench/results format)");
  cmd->add_option("--device-kind", o->device_kind, "device kind recorded in --json");
  cmd->add_option("--commit", o->commit, "commit recorded in --json (default: $TESSERA_COMMIT)");
  cmd->callback([o] { run_tuner_bench(*o); });
});

}  // namespace tessera::bench
