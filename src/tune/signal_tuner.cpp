#include "tessera/tune/signal_tuner.hpp"

#include <fmt/format.h>

#include <cmath>

#include "tessera/runtime/error.hpp"
#include "tessera/signal/group_plan.hpp"

namespace tessera::tune {

SignalTuner::SignalTuner(MachineProfile profile, Cache& plans, double min_gain)
    : profile_(std::move(profile)), plans_(plans), min_gain_(min_gain) {
  profile_.validate();
  TESSERA_CHECK(plans_.version() == kCacheVersion, "SignalTuner: plan cache {} has version {}, expected {}",
                plans_.file().string(), plans_.version(), kCacheVersion);
}

std::string SignalTuner::prefix(const SignalQuery& q) const {
  return key_prefix(profile_.machine, profile_.dtype,
                    fmt::format("signal.{}.t{}x{}s{}", collective_name(q.op), q.tile_m, q.tile_n, q.swizzle));
}

std::string SignalTuner::key_of(const SignalQuery& q) const { return make_key(prefix(q), {q.m, q.n, q.k}); }

signal::WaveModel SignalTuner::overlapped_model(const SignalQuery& q) const {
  return signal::WaveModel(signal::GemmTiling{q.m, q.n, q.tile_m, q.tile_n}, profile_.gemm_sms(), q.swizzle, q.raster);
}

signal::OverlapCost signal_overlap_cost(const MachineProfile& profile, const SignalQuery& q, const GemmTiming& g) {
  TESSERA_CHECK(q.op != Collective::AllGather, "SignalTuner: all-gather follows no GEMM here; use AR, RS or A2A");
  TESSERA_CHECK(q.send_fraction > 0 && q.send_fraction <= double(profile.machine.world),
                "SignalTuner: send fraction {} outside (0, world]", q.send_fraction);
  TESSERA_CHECK(g.sms == profile.gemm_sms(), "SignalTuner: GEMM {}x{}x{} was timed with {} CTAs, overlap leaves {}",
                q.m, q.n, q.k, g.sms, profile.gemm_sms());
  const signal::WaveModel wm(signal::GemmTiling{q.m, q.n, q.tile_m, q.tile_n}, profile.gemm_sms(), q.swizzle, q.raster);
  const BandwidthCurve& curve = profile.curve(q.op);
  const BandwidthCurve& no_overlap = profile.no_overlap_curve(q.op);
  const double elem = dtype_size(profile.dtype) * q.send_fraction;
  signal::OverlapCost c = signal::OverlapCost::from_tiles(
      wm, signal::WaveTimes::uniform(wm.waves(), g.per_wave), g.full_gpu, double(q.tile_m) * q.tile_n * elem,
      [curve](double b) { return curve.time(b); }, profile.per_group_overhead, profile.gemm_penalty_per_group);
  // "No overlap" sends the M x N output (no tile padding) on the default
  // communicator: the cuBLASLt GEMM, then one collective.
  c.comm_all = no_overlap.time(double(q.m) * double(q.n) * elem);
  c.comm_slowdown_beside_gemm = profile.comm_slowdown_beside_gemm;
  return c;
}

signal::OverlapCost SignalTuner::cost(const SignalQuery& q) const {
  const GemmTiming* g = profile_.find_gemm(q.m, q.n, q.k, q.tile_m, q.tile_n);
  TESSERA_CHECK(g, "SignalTuner: GEMM {}x{}x{} (tile {}x{}) was never timed on {}", q.m, q.n, q.k, q.tile_m, q.tile_n,
                profile_.machine.str());
  return signal_overlap_cost(profile_, q, *g);
}

namespace {

// A cached choice, checked: every integer in range, every time finite and
// positive. Throws tessera::Error naming the field for a malformed entry.
SignalChoice choice_from_json(const nlohmann::json& j, std::string source) {
  SignalChoice c;
  try {
    TESSERA_CHECK(j.is_object(), "not an object");
    const auto& w = j.at("waves_per_group");
    TESSERA_CHECK(w.is_array() && !w.empty() && w.size() <= 4096, "waves_per_group must be a non-empty array");
    for (const auto& v : w) c.waves_per_group.push_back(static_cast<int>(json_int(v, "waves_per_group", 1, 1 << 20)));
    c.overlap = j.at("overlap").get<bool>();
    c.predicted = j.at("predicted").get<double>();
    TESSERA_CHECK(std::isfinite(c.predicted) && c.predicted >= 0, "predicted {} is not finite and >= 0", c.predicted);
    c.predicted_overlap = j.value("predicted_overlap", c.overlap);
    c.verified = j.value("verified", false);
    if (c.verified) {
      const auto& m = j.at("measured");
      c.measured_overlapped = m.at("overlapped_s").get<double>();
      c.measured_sequential = m.at("sequential_s").get<double>();
      for (double t : {c.measured_overlapped, c.measured_sequential})
        TESSERA_CHECK(std::isfinite(t) && t > 0, "measured time {} s is not finite and positive", t);
      c.measured_candidates = m.contains("candidates") ? static_cast<int>(m.at("candidates").size()) : 1;
    }
  } catch (const nlohmann::json::exception& e) {
    TESSERA_FAIL("SignalTuner: malformed cache entry ({}): {}", source, e.what());
  } catch (const Error& e) {
    TESSERA_FAIL("SignalTuner: malformed cache entry ({}): {}", source, e.what());
  }
  c.source = std::move(source);
  return c;
}

}  // namespace

bool keep_overlap(double overlapped_s, double sequential_s, double margin) {
  TESSERA_CHECK(std::isfinite(overlapped_s) && overlapped_s > 0,
                "SignalTuner verdict: measured overlapped time {} s is not finite and positive", overlapped_s);
  TESSERA_CHECK(std::isfinite(sequential_s) && sequential_s > 0,
                "SignalTuner verdict: measured non-overlapped time {} s is not finite and positive", sequential_s);
  TESSERA_CHECK(std::isfinite(margin) && margin >= 0 && margin < 1, "SignalTuner verdict: margin {} outside [0, 1)",
                margin);
  return overlapped_s < sequential_s * (1 - margin);
}

std::optional<SignalChoice> SignalTuner::choose(const SignalQuery& q) {
  const std::string key = key_of(q);
  if (auto hit = plans_.get(key)) {
    try {
      const bool verified = hit->is_object() && hit->value("verified", false) == true;
      SignalChoice c = choice_from_json(*hit, verified ? "verified" : "cache");
      (void)signal::GroupPlan(overlapped_model(q), c.waves_per_group);  // a partition of this shape's waves
      return c;
    } catch (const std::exception& e) {  // a bad entry is ignored and searched again
      fmt::print(stderr, "tessera: warning: ignoring tuning cache entry {}: {}\n", key, e.what());
    }
  }
  if (profile_.find_gemm(q.m, q.n, q.k, q.tile_m, q.tile_n)) {
    const signal::Prediction p = signal::PredictiveSearch(cost(q), min_gain_).best();
    SignalChoice c{p.waves_per_group, p.overlap, p.latency, "search"};
    c.predicted_overlap = p.overlap;
    plans_.put(key, {{"shape", {q.m, q.n, q.k}},
                     {"waves_per_group", c.waves_per_group},
                     {"overlap", c.overlap},
                     {"predicted", c.predicted},
                     {"predicted_overlap", c.predicted_overlap},
                     {"verified", false}});
    return c;
  }
  auto nb = nearest(plans_, prefix(q), {q.m, q.n, q.k});
  if (!nb) return std::nullopt;
  // The neighbour's verdict as stored (measured there, or predicted there);
  // this shape itself is not verified.
  SignalChoice c;
  std::int64_t their_m = 0, their_n = 0;
  try {
    const bool measured_there = nb->value.value("verified", false) == true;
    c = choice_from_json(nb->value,
                         fmt::format("neighbour {} ({})", nb->key, measured_there ? "verified" : "predicted"));
    const auto& s = nb->value.at("shape");
    their_m = json_int(s.at(0), "shape", 1, std::int64_t{1} << 40);
    their_n = json_int(s.at(1), "shape", 1, std::int64_t{1} << 40);
  } catch (const std::exception& e) {  // a bad neighbour is no neighbour
    fmt::print(stderr, "tessera: warning: ignoring tuning cache entry {}: {}\n", nb->key, e.what());
    return std::nullopt;
  }
  c.verified = false;
  c.measured_overlapped = c.measured_sequential = 0;
  // Rescale the neighbour's partition to this shape's wave count.
  const signal::WaveModel theirs(signal::GemmTiling{their_m, their_n, q.tile_m, q.tile_n}, profile_.gemm_sms(),
                                 q.swizzle, q.raster);
  const signal::WaveModel ours = overlapped_model(q);
  try {
    c.waves_per_group = signal::GroupPlan(theirs, c.waves_per_group).rescaled(ours).waves_per_group();
  } catch (const Error& e) {  // the stored partition does not fit its own shape
    fmt::print(stderr, "tessera: warning: ignoring tuning cache entry {}: {}\n", nb->key, e.what());
    return std::nullopt;
  }
  if (!c.overlap) c.waves_per_group = {ours.waves()};
  return c;
}

SignalChoice SignalTuner::record_measured(const SignalQuery& q, const std::vector<int>& waves_per_group,
                                          double overlapped_s, double sequential_s, double margin) {
  return record_measured_candidates(q, {{waves_per_group, overlapped_s}}, sequential_s, margin);
}

std::vector<signal::Prediction> SignalTuner::candidates(const SignalQuery& q, int k) const {
  return signal::PredictiveSearch(cost(q), min_gain_).top_overlapped(k);
}

SignalChoice SignalTuner::record_measured_candidates(const SignalQuery& q,
                                                     const std::vector<MeasuredPartition>& measured,
                                                     double sequential_s, double margin) {
  const signal::WaveModel wm = overlapped_model(q);
  TESSERA_CHECK(!measured.empty(), "SignalTuner::record_measured: no measured partition for {}", key_of(q));
  // Everything is checked before anything is stored.
  std::size_t fastest = 0;
  for (std::size_t i = 0; i < measured.size(); ++i) {
    const MeasuredPartition& m = measured[i];
    const signal::GroupPlan plan(wm, m.waves_per_group);  // throws on anything but a partition of q's waves
    TESSERA_CHECK(plan.groups() >= 1, "SignalTuner::record_measured: empty partition for {}", key_of(q));
    for (std::size_t j = 0; j < i; ++j)
      TESSERA_CHECK(measured[j].waves_per_group != m.waves_per_group,
                    "SignalTuner::record_measured: partition {} measured twice for {}", plan.str(), key_of(q));
    keep_overlap(m.overlapped_s, sequential_s, margin);                // throws on a bad time or margin
    if (m.overlapped_s < measured[fastest].overlapped_s) fastest = i;  // ties: the earlier (better predicted)
  }
  const std::vector<int>& waves_per_group = measured[fastest].waves_per_group;
  const double overlapped_s = measured[fastest].overlapped_s;
  const bool keep = keep_overlap(overlapped_s, sequential_s, margin);
  const std::string key = key_of(q);
  nlohmann::json e;
  if (auto old = plans_.get(key);
      old && old->is_object() && (!old->contains("overlap") || (*old)["overlap"].is_boolean())) {
    e = *old;
  } else if (profile_.find_gemm(q.m, q.n, q.k, q.tile_m, q.tile_n)) {
    const signal::Prediction p = signal::PredictiveSearch(cost(q), min_gain_).best();
    e = {{"predicted", p.latency}, {"predicted_overlap", p.overlap}};
  } else {
    e = {{"predicted", 0.0}, {"predicted_overlap", false}};  // never predicted
  }
  if (!e.contains("predicted_overlap")) e["predicted_overlap"] = e.value("overlap", false);
  e["shape"] = {q.m, q.n, q.k};
  e["overlap"] = keep;
  e["waves_per_group"] = keep ? waves_per_group : std::vector<int>{wm.waves()};
  e["verified"] = true;
  nlohmann::json all = nlohmann::json::array();
  for (const MeasuredPartition& m : measured)
    all.push_back({{"waves_per_group", m.waves_per_group}, {"overlapped_s", m.overlapped_s}});
  e["measured"] = {{"overlapped_s", overlapped_s},
                   {"sequential_s", sequential_s},
                   {"margin", margin},
                   {"waves_per_group", waves_per_group},
                   {"candidates", all}};
  plans_.put(key, e);
  return choice_from_json(e, "verified");
}

}  // namespace tessera::tune
