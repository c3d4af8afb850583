#include "tessera/tune/signal_tuner.hpp"

#include <fmt/format.h>

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

signal::OverlapCost SignalTuner::cost(const SignalQuery& q) const {
  TESSERA_CHECK(q.op != Collective::AllGather, "SignalTuner: all-gather follows no GEMM here; use AR, RS or A2A");
  TESSERA_CHECK(q.send_fraction > 0 && q.send_fraction <= double(profile_.machine.world),
                "SignalTuner: send fraction {} outside (0, world]", q.send_fraction);
  const GemmTiming* g = profile_.find_gemm(q.m, q.n, q.k, q.tile_m, q.tile_n);
  TESSERA_CHECK(g, "SignalTuner: GEMM {}x{}x{} (tile {}x{}) was never timed on {}", q.m, q.n, q.k, q.tile_m, q.tile_n,
                profile_.machine.str());
  TESSERA_CHECK(g->sms == profile_.gemm_sms(), "SignalTuner: GEMM {}x{}x{} was timed with {} CTAs, overlap leaves {}",
                q.m, q.n, q.k, g->sms, profile_.gemm_sms());
  const signal::WaveModel wm = overlapped_model(q);
  const BandwidthCurve& curve = profile_.curve(q.op);
  const double bytes_per_tile = double(q.tile_m) * q.tile_n * dtype_size(profile_.dtype) * q.send_fraction;
  return signal::OverlapCost::from_tiles(wm, signal::WaveTimes::uniform(wm.waves(), g->per_wave), g->full_gpu,
                                         bytes_per_tile, [curve](double b) { return curve.time(b); },
                                         profile_.per_group_overhead, profile_.gemm_penalty_per_group);
}

std::optional<SignalChoice> SignalTuner::choose(const SignalQuery& q) {
  const std::string key = key_of(q);
  const auto from_json = [](const nlohmann::json& j, std::string source) {
    return SignalChoice{j.at("waves_per_group").get<std::vector<int>>(), j.at("overlap").get<bool>(),
                        j.at("predicted").get<double>(), std::move(source)};
  };
  if (auto hit = plans_.get(key)) return from_json(*hit, "cache");
  if (profile_.find_gemm(q.m, q.n, q.k, q.tile_m, q.tile_n)) {
    const signal::Prediction p = signal::PredictiveSearch(cost(q), min_gain_).best();
    SignalChoice c{p.waves_per_group, p.overlap, p.latency, "search"};
    plans_.put(key, {{"shape", {q.m, q.n, q.k}}, {"waves_per_group", c.waves_per_group}, {"overlap", c.overlap},
                     {"predicted", c.predicted}});
    return c;
  }
  auto nb = nearest(plans_, prefix(q), {q.m, q.n, q.k});
  if (!nb) return std::nullopt;
  SignalChoice c = from_json(nb->value, "neighbour " + nb->key);
  // Rescale the neighbour's partition to this shape's wave count.
  const auto& s = nb->value.at("shape");
  const signal::WaveModel theirs(signal::GemmTiling{s.at(0).get<std::int64_t>(), s.at(1).get<std::int64_t>(),
                                                    q.tile_m, q.tile_n},
                                 profile_.gemm_sms(), q.swizzle, q.raster);
  const signal::WaveModel ours = overlapped_model(q);
  c.waves_per_group = signal::GroupPlan(theirs, c.waves_per_group).rescaled(ours).waves_per_group();
  if (!c.overlap) c.waves_per_group = {ours.waves()};
  return c;
}

}  // namespace tessera::tune
