// The measured autotuner (measured_tuner.hpp): host logic only; the GPU
// runner is in plan_timer.cpp.
#include "tessera/commir/measured_tuner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "tessera/commir/schedules.hpp"
#include "tessera/commir/transforms.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/tune/cache.hpp"

namespace tessera::commir {
namespace {

// Search candidates beyond this many (model order) are not re-estimated with
// the calibrated profile: each needs a lowering, and the tail of the model's
// ranking is far from the top.
constexpr std::size_t kMaxSearchCandidates = 32;
constexpr int kCacheVersion = 1;

struct Entry {
  MeasuredPlan mp;
  Plan plan;
};

// estimate() plus, under a contract, the resharding from and to it.
Estimate estimate_with_contract(const Plan& p, const MachineProfile& prof, const Layout* contract) {
  Estimate e = estimate(p, prof);
  if (contract) {
    e.reshard_us = contract_reshard_time(*contract, p, prof);
    e.time_us += e.reshard_us;
  }
  return e;
}

bool same_grid_as_any(const std::vector<Entry>& v, const Grid& g) {
  return std::any_of(v.begin(), v.end(), [&](const Entry& e) { return e.mp.grid == g; });
}

std::vector<Entry> candidates(const Grid& op, const MachineProfile& prof, const MeasureOptions& opt) {
  const double limit_gb = opt.search.memory_limit_gb > 0 ? opt.search.memory_limit_gb : prof.memory_gb;
  const auto limit_bytes = static_cast<std::int64_t>(limit_gb * 1e9);
  const TuneResult r = tune(op, prof, opt.search);  // first: it checks the search options
  std::vector<Entry> v;
  auto add = [&](std::string label, std::string script, Grid g) {
    if (same_grid_as_any(v, g)) return;
    Plan p = lower(g);
    const Estimate e = estimate_with_contract(p, prof, opt.search.contract);
    if (e.peak_bytes > limit_bytes) return;
    v.push_back({MeasuredPlan{std::move(label), std::move(script), std::move(g), e, e, -1, {}}, std::move(p)});
  };
  if (opt.named_schedules && (op.body.kind == BodyKind::attend || op.body.kind == BodyKind::contract)) {
    const std::string kind = op.body.kind == BodyKind::attend ? "attention" : "gemm";
    for (const std::string& name : schedule_names(kind, static_cast<int>(op.mesh.size()))) {
      try {
        const std::string script = schedule_script(name, op.mesh);
        Grid g = op;
        commir::apply(g, script);
        validate(g, "tune_measured");
        add(name, script, std::move(g));
      } catch (const Error&) {
        // The schedule does not apply to this shape or mesh (e.g. heads not divisible).
      }
    }
  }
  for (std::size_t i = 0; i < r.ranked.size() && i < kMaxSearchCandidates; ++i)
    add(fmt::format("search #{}", i), r.ranked[i].script, r.ranked[i].grid);
  TESSERA_CHECK(!v.empty(), "tune_measured: no schedule of {} on mesh {} fits {} GB per GPU", op.name,
                mesh_string(op.mesh), limit_gb);
  return v;
}

// Indices of v sorted by an estimate's time (stable: ties keep candidate order).
template <class Key>
std::vector<int> order_by(const std::vector<Entry>& v, Key key) {
  std::vector<int> idx(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) idx[i] = static_cast<int>(i);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return key(v[a]) < key(v[b]); });
  return idx;
}

// Runs the first k of `order` not run yet (a failure is recorded and counts).
void measure_round(std::vector<Entry>& v, const std::vector<int>& order, int k, const PlanRunner& run) {
  int tried = 0;
  for (int i : order) {
    if (tried == k) break;
    Entry& e = v[i];
    if (e.mp.measured_us > 0 || !e.mp.error.empty()) continue;
    ++tried;
    try {
      const double us = run(e.plan, e.mp.label);
      TESSERA_CHECK(std::isfinite(us) && us > 0, "runner returned {} us", us);
      e.mp.measured_us = us;
    } catch (const Error& err) {
      e.mp.error = err.what();
    }
  }
}

double log_error(const MachineProfile& p, const std::vector<const Plan*>& plans, const std::vector<double>& us) {
  double s = 0;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    if (!(us[i] > 0)) continue;
    const double d = std::log(us[i]) - std::log(std::max(estimate(*plans[i], p).time_us, 1e-9));
    s += d * d;
  }
  return s;
}

std::optional<MeasuredPlan> cached_pick(const Grid& op, const MachineProfile& prof, const Layout* contract,
                                        const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("script") || !j["script"].is_string()) return std::nullopt;
  try {
    Grid g = op;
    commir::apply(g, j["script"].get<std::string>());
    validate(g, "tune_measured (cached)");
    const Estimate e = estimate_with_contract(lower(g), prof, contract);
    MeasuredPlan mp{
        j.value("label", std::string("cached")), j["script"].get<std::string>(), std::move(g), e, e, -1, {}};
    if (j.contains("measured_us") && j["measured_us"].is_number()) mp.measured_us = j["measured_us"].get<double>();
    return mp;
  } catch (const Error&) {
    return std::nullopt;  // a script this version cannot apply: measure again
  }
}

}  // namespace

MachineProfile scaled_profile(const MachineProfile& p, double compute_scale, double comm_scale) {
  MachineProfile s = p;
  s.gemm_tflops *= compute_scale;
  s.attention_tflops *= compute_scale;
  s.kernel_overhead_us /= compute_scale;
  for (LinkLevel* l : {&s.intra, &s.inter}) {
    l->p2p_gbps *= comm_scale;
    l->coll_gbps *= comm_scale;
    l->latency_us /= comm_scale;
  }
  return s;
}

Calibration calibrate(const MachineProfile& prof, const std::vector<const Plan*>& plans,
                      const std::vector<double>& measured_us) {
  TESSERA_CHECK(plans.size() == measured_us.size(), "calibrate: {} plans but {} times", plans.size(),
                measured_us.size());
  Calibration c;
  for (double us : measured_us) c.points += us > 0 ? 1 : 0;
  if (c.points == 0) return c;
  // Grid search over log2 scales in [-4, 4], coarse then fine around the
  // best. A small pull towards scale 1 decides the directions the
  // measurements do not constrain: the link scale when no measured plan
  // communicates, the compute scale when every one is bound by its links.
  constexpr double kPull = 1e-4;
  double best_x = 0, best_y = 0, best_f = std::numeric_limits<double>::infinity();
  auto search = [&](double cx, double cy, double half, double step) {
    for (double x = cx - half; x <= cx + half + 1e-12; x += step)
      for (double y = cy - half; y <= cy + half + 1e-12; y += step) {
        const double f =
            log_error(scaled_profile(prof, std::exp2(x), std::exp2(y)), plans, measured_us) + kPull * (x * x + y * y);
        if (f < best_f) best_f = f, best_x = x, best_y = y;
      }
  };
  search(0, 0, 4, 0.25);
  search(best_x, best_y, 0.25, 1.0 / 32);
  c.compute_scale = std::exp2(best_x);
  c.comm_scale = std::exp2(best_y);
  c.rms_log_error =
      std::sqrt(log_error(scaled_profile(prof, c.compute_scale, c.comm_scale), plans, measured_us) / c.points);
  return c;
}

namespace {

// The contract's layout with every range as a fraction of its buffer
// dimension (in 1/1024ths), so that shapes of one bucket under the same
// sharding share it; FNV-1a of that text, in hex.
std::string contract_signature(const Layout& c, const Grid& op) {
  std::string text;
  for (const auto* side : {&c.inputs, &c.outputs}) {
    for (const auto& [name, per_rank] : *side) {
      const Buffer& b = op.buffer(name, "shape_bucket_key");
      text += name + ":";
      for (const Region& reg : per_rank) {
        for (const Box& box : reg)
          for (std::size_t d = 0; d < box.r.size() && d < b.dims.size(); ++d) {
            const double ext = static_cast<double>(op.axis(b.dims[d].axis).extent / b.dims[d].group);
            text += fmt::format("{},{};", std::lround(1024 * box.r[d].lo / ext), std::lround(1024 * box.r[d].hi / ext));
          }
        text += "|";
      }
    }
    text += "/";
  }
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  return fmt::format("{:016x}", h);
}

}  // namespace

std::string shape_bucket_key(const std::string& prefix, const Grid& op, const Layout* contract) {
  std::string k = prefix + "|" + op.name + "|b";
  // Quarter-octave buckets: extents within ~9 % share a decision.
  for (const Axis& a : op.axes)
    k += fmt::format("_{}{}", a.name,
                     std::lround(4 * std::log2(static_cast<double>(std::max<std::int64_t>(a.extent, 1)))));
  k += "|mesh" + mesh_string(op.mesh);
  return contract ? k + "|contract" + contract_signature(*contract, op) : k;
}

MeasureResult tune_measured(const Grid& op, const MachineProfile& prof, const MeasureOptions& opt,
                            const PlanRunner& run) {
  TESSERA_CHECK(opt.top_k >= 1 && opt.top_k <= 64, "tune_measured: top_k {} outside [1, 64]", opt.top_k);
  TESSERA_CHECK(static_cast<bool>(run), "tune_measured: no runner");
  validate(op, "tune_measured");
  MeasureResult res;
  res.calibrated = prof;
  std::optional<tune::Cache> cache;
  if (!opt.cache_name.empty()) {
    cache.emplace(opt.cache_name, kCacheVersion,
                  opt.cache_dir.empty() ? tune::cache_dir() : std::filesystem::path(opt.cache_dir));
    res.cache_key = shape_bucket_key(opt.cache_prefix, op, opt.search.contract);
    if (!opt.refresh)
      if (auto j = cache->get(res.cache_key))
        if (auto mp = cached_pick(op, prof, opt.search.contract, *j)) {
          res.plans.push_back(std::move(*mp));
          res.pick = res.model_pick = 0;
          res.from_cache = true;
          return res;
        }
  }

  std::vector<Entry> v = candidates(op, prof, opt);
  const std::vector<int> model_order = order_by(v, [](const Entry& e) { return e.mp.model.time_us; });
  measure_round(v, model_order, opt.top_k, run);

  std::vector<const Plan*> plans;
  std::vector<double> us;
  for (const Entry& e : v) {
    plans.push_back(&e.plan);
    us.push_back(e.mp.measured_us);
  }
  res.calibration = calibrate(prof, plans, us);
  res.calibrated = scaled_profile(prof, res.calibration.compute_scale, res.calibration.comm_scale);
  for (Entry& e : v) e.mp.calibrated = estimate_with_contract(e.plan, res.calibrated, opt.search.contract);
  const std::vector<int> cal_order = order_by(v, [](const Entry& e) { return e.mp.calibrated.time_us; });
  // The next k in the calibrated order, not only newcomers to its top k: two
  // scale factors cannot express a plan's own inefficiency (e.g. a ring's R
  // short kernel calls and merges against one long call), so the model's
  // favourites may all be measured while a plan it ranks just below them is
  // faster.
  measure_round(v, cal_order, opt.top_k, run);

  for (int i : cal_order) res.plans.push_back(v[i].mp);
  for (std::size_t i = 0; i < res.plans.size(); ++i) {
    const MeasuredPlan& p = res.plans[i];
    if (cal_order[i] == model_order.front()) res.model_pick = static_cast<int>(i);
    if (p.measured_us > 0 && (res.pick < 0 || p.total_us() < res.plans[res.pick].total_us()))
      res.pick = static_cast<int>(i);
  }
  if (res.pick < 0) {
    std::string why;
    for (const MeasuredPlan& p : res.plans)
      if (!p.error.empty()) why += fmt::format("\n  {}: {}", p.label, p.error);
    TESSERA_FAIL("tune_measured: none of the plans tried for {} on mesh {} could run:{}", op.name, mesh_string(op.mesh),
                 why);
  }
  if (cache) {
    std::vector<std::int64_t> shape;
    for (const Axis& a : op.axes) shape.push_back(a.extent);
    const MeasuredPlan& p = res.plans[res.pick];
    cache->put(res.cache_key,
               {{"script", p.script}, {"label", p.label}, {"measured_us", p.measured_us}, {"shape", shape}});
  }
  return res;
}

}  // namespace tessera::commir
