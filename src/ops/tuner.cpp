// Strategy choice from measurements, and its cache entries.
#include "tessera/ops/tuner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "context_impl.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops {

namespace {

/// The checks both choose_strategy forms make of their times; returns the
/// baseline's entry.
std::map<Strategy, double>::const_iterator check_times(const std::map<Strategy, double>& times_ms, double margin,
                                                       Strategy baseline) {
  const auto seq = times_ms.find(baseline);
  TESSERA_CHECK(seq != times_ms.end(), "choose_strategy: no {} time among {} candidates", strategy_name(baseline),
                times_ms.size());
  TESSERA_CHECK(margin >= 0 && margin < 1, "choose_strategy: margin {} outside [0, 1)", margin);
  for (const auto& [s, t] : times_ms) {
    TESSERA_CHECK(s != Strategy::automatic, "choose_strategy: 'auto' is not a candidate");
    TESSERA_CHECK(std::isfinite(t) && t > 0, "choose_strategy: time of {} is {} ms (must be finite and > 0)",
                  strategy_name(s), t);
  }
  return seq;
}

}  // namespace

Strategy choose_strategy(const std::map<Strategy, double>& times_ms, double margin, Strategy baseline) {
  const auto seq = check_times(times_ms, margin, baseline);
  Strategy best = baseline;
  double best_t = seq->second;
  for (const auto& [s, t] : times_ms) {
    if (s == baseline) continue;
    if (t < seq->second * (1.0 - margin) && t < best_t) {
      best = s;
      best_t = t;
    }
  }
  return best;
}

std::map<Strategy, PairedEvidence> paired_evidence(const std::map<Strategy, std::vector<double>>& samples_ms,
                                                   Strategy baseline) {
  const auto base = samples_ms.find(baseline);
  TESSERA_CHECK(base != samples_ms.end(), "paired_evidence: no {} samples among {} candidates", strategy_name(baseline),
                samples_ms.size());
  const std::size_t reps = base->second.size();
  TESSERA_CHECK(reps > 0, "paired_evidence: no repetitions");
  for (const auto& [s, v] : samples_ms) {
    TESSERA_CHECK(v.size() == reps, "paired_evidence: {} has {} repetitions, {} has {}", strategy_name(s), v.size(),
                  strategy_name(baseline), reps);
    for (double t : v)
      TESSERA_CHECK(std::isfinite(t) && t > 0, "paired_evidence: a time of {} is {} ms (must be finite and > 0)",
                    strategy_name(s), t);
  }
  std::map<Strategy, PairedEvidence> out;
  for (const auto& [s, v] : samples_ms) {
    if (s == baseline) continue;
    std::vector<double> ratio(reps);
    std::size_t wins = 0;
    for (std::size_t i = 0; i < reps; ++i) {
      ratio[i] = v[i] / base->second[i];
      wins += v[i] < base->second[i] ? 1 : 0;
    }
    std::sort(ratio.begin(), ratio.end());
    const double median = reps % 2 ? ratio[reps / 2] : 0.5 * (ratio[reps / 2 - 1] + ratio[reps / 2]);
    out[s] = PairedEvidence{median, static_cast<double>(wins) / static_cast<double>(reps)};
  }
  return out;
}

std::string evidence_text(const PairedEvidence& e) {
  return fmt::format("x{:.3f}, wins {:.0f} %", e.median_ratio, 100 * e.win_fraction);
}

Strategy choose_strategy(const std::map<Strategy, double>& times_ms, const std::map<Strategy, PairedEvidence>& evidence,
                         double margin, double min_win_fraction, Strategy baseline) {
  TESSERA_CHECK(min_win_fraction >= 0 && min_win_fraction <= 1, "choose_strategy: min_win_fraction {} outside [0, 1]",
                min_win_fraction);
  check_times(times_ms, margin, baseline);
  // The pairs decide whether to leave the baseline; the medians rank the
  // candidates that may replace it (a ratio against the baseline carries the
  // baseline's noise too, so it ranks two near-equal candidates worse).
  Strategy best = baseline;
  double best_t = 0, best_ratio = 0;
  for (const auto& [s, t] : times_ms) {
    if (s == baseline) continue;
    const auto e = evidence.find(s);
    if (e == evidence.end()) continue;
    TESSERA_CHECK(std::isfinite(e->second.median_ratio) && e->second.median_ratio > 0,
                  "choose_strategy: median ratio of {} is {}", strategy_name(s), e->second.median_ratio);
    if (e->second.win_fraction < min_win_fraction || e->second.median_ratio >= 1.0 - margin) continue;
    if (best == baseline || t < best_t || (t == best_t && e->second.median_ratio < best_ratio)) {
      best = s;
      best_t = t;
      best_ratio = e->second.median_ratio;
    }
  }
  return best;
}

nlohmann::json choice_to_json(Strategy s, const std::map<Strategy, double>& times_ms,
                              const std::vector<std::int64_t>& shape) {
  nlohmann::json t = nlohmann::json::object();
  for (const auto& [k, v] : times_ms) t[std::string(strategy_name(k))] = v;
  return {{"strategy", std::string(strategy_name(s))}, {"times_ms", t}, {"shape", shape}};
}

std::optional<Strategy> choice_from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("strategy") || !j["strategy"].is_string()) return std::nullopt;
  const std::string name = j["strategy"].get<std::string>();
  // The entry's own measurements, when present, must be sane and include the choice.
  if (j.contains("times_ms")) {
    const auto& t = j["times_ms"];
    if (!t.is_object() || !t.contains(name)) return std::nullopt;
    for (auto it = t.begin(); it != t.end(); ++it)
      if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() <= 0) return std::nullopt;
  }
  for (const StrategyInfo& i : strategy_table())
    if (i.strategy != Strategy::automatic && name == i.name) return i.strategy;
  return std::nullopt;
}

std::optional<Strategy> choice_from_json(const nlohmann::json& j, const std::vector<Strategy>& candidates) {
  const auto s = choice_from_json(j);
  if (!s || std::find(candidates.begin(), candidates.end(), *s) == candidates.end()) return std::nullopt;
  return s;
}

std::optional<Strategy> nearest_choice(const nlohmann::json& entries, const std::string& prefix,
                                       const std::vector<std::int64_t>& shape, std::size_t sized,
                                       const std::vector<Strategy>& candidates, double max_distance) {
  TESSERA_CHECK(sized <= shape.size(), "nearest_choice: sized = {} > shape rank {}", sized, shape.size());
  for (std::size_t i = 0; i < sized; ++i)
    TESSERA_CHECK(shape[i] > 0, "nearest_choice: dimension {} is {} (must be > 0)", i, shape[i]);
  if (!entries.is_object()) return std::nullopt;
  const std::string p = prefix + "|";
  std::optional<Strategy> best;
  double best_d = max_distance;
  for (auto it = entries.begin(); it != entries.end(); ++it) {
    if (it.key().rfind(p, 0) != 0 || !it->is_object() || !it->contains("shape")) continue;
    const auto& s = (*it)["shape"];
    if (!s.is_array() || s.size() != shape.size()) continue;
    bool ok = true;
    double d = 0;
    for (std::size_t i = 0; i < shape.size() && ok; ++i) {
      if (!s[i].is_number_integer()) {
        ok = false;
      } else if (i >= sized) {
        ok = s[i].get<std::int64_t>() == shape[i];
      } else if (s[i].get<std::int64_t>() <= 0) {
        ok = false;
      } else {
        const double l = std::log(static_cast<double>(s[i].get<std::int64_t>()) / static_cast<double>(shape[i]));
        d += l * l;
      }
    }
    if (!ok || d > best_d) continue;
    if (const auto c = choice_from_json(*it, candidates); c && (!best || d < best_d)) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

// The TP operators' candidates are their registries' (context_impl.hpp):
// each strategy states when it is measured (StrategyNeeds). sp_attention's
// come from its registry too (sp_attention.cpp).
std::vector<Strategy> ag_gemm_candidates(int world, bool lsa) {
  return ag_gemm_registry().candidates({.world = world, .lsa = lsa});
}

std::vector<Strategy> gemm_rs_candidates(int world, bool tile_row_shards, bool lsa) {
  return gemm_rs_registry().candidates({.world = world, .lsa = lsa, .tile_row_shards = tile_row_shards});
}

std::vector<Strategy> gemm_ar_candidates(int world, bool tile_row_shards, bool lsa) {
  return gemm_ar_registry().candidates({.world = world, .lsa = lsa, .tile_row_shards = tile_row_shards});
}

std::vector<Strategy> mlp_layer_candidates(Strategy ag, Strategy rs) {
  TESSERA_CHECK(ag != Strategy::automatic && rs != Strategy::automatic,
                "mlp_layer_candidates: the halves' resolved strategies (got {} + {})", strategy_name(ag),
                strategy_name(rs));
  TESSERA_CHECK(ag != Strategy::sequential || rs != Strategy::sequential,
                "mlp_layer_candidates: both halves sequential, nothing to check");
  return {ag != Strategy::sequential ? ag : rs, Strategy::sequential};
}

std::int64_t mlp_layer_key_flags(Strategy ag, Strategy rs) {
  static_assert(kStrategyCount <= 16, "mlp_layer_key_flags packs two strategy codes in 4 bits each");
  return static_cast<std::int64_t>(ag) * 16 + static_cast<std::int64_t>(rs);
}

bool needs_lsa(Strategy s) { return s != Strategy::sequential && s != Strategy::automatic; }

std::string topology_key(const std::optional<std::string>& given, bool lsa) {
  if (!given || given->empty()) return lsa ? "lsa" : "net";
  if (!lsa && *given != "net") return *given + "/net";
  return *given;
}

std::string choice_key(const tune::MachineId& m, DType dtype, const std::string& op,
                       const std::vector<std::int64_t>& shape) {
  return tune::make_key(tune::key_prefix(m, dtype, "ops." + op), shape);
}

}  // namespace tessera::ops
