// tessera/ops/tuner.hpp — per-shape strategy choice, cached on disk.
//
// On first use of a shape the operator measures every candidate strategy
// (repetition by repetition, all candidates back to back; reduced over ranks
// so all ranks decide alike) and never keeps one slower than sequential: a
// candidate replaces sequential only if it won at least 8 of the 11
// repetitions and its median ratio to sequential is below 1 − `margin`
// (default 1 %; paired_evidence below), and of those candidates the one with
// the smallest median time is kept. The choice is
// stored in tune::Cache "ops" under key_prefix(machine, dtype, "ops.<op>")
// + "|MxNxK" with the measured times, and reused by later processes. Ranks
// that disagree about a cached choice (different cache files) re-measure.
//
// A shape never measured reuses the choice of the nearest measured shape of
// the same operator, flags and machine (FlashOverlap's idea: a choice holds
// over a neighbourhood of shapes), when OpOptions::tune_on_miss is off, or
// sequential when there is none within kNeighbourMaxDistance; so a training
// or serving step never stops for a collective tuning pass unless asked to.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/ops/args.hpp"
#include "tessera/tune/key.hpp"

namespace tessera::ops {

/// One candidate against the baseline when every repetition times each
/// candidate back to back: the ratio t_candidate[i] / t_baseline[i] of one
/// repetition cancels the clock and load drift both calls share, which the
/// ratio of two medians does not. A candidate a few percent ahead in the
/// medians by one lucky sample wins few repetitions.
struct PairedEvidence {
  double median_ratio = 1.0;  ///< median over repetitions of t_candidate / t_baseline
  double win_fraction = 0.0;  ///< share of repetitions in which the candidate was faster
};

/// Per-call timing of the tuner's candidates (filled when it measured).
struct TuneReport {
  std::map<Strategy, double> times_ms;
  /// Each candidate but the baseline against it, repetition by repetition
  /// (the largest median ratio and the smallest win share over ranks).
  std::map<Strategy, PairedEvidence> evidence;
  Strategy chosen = Strategy::sequential;
  bool from_cache = false;
  /// Median time of the tuner's load GEMMs before each sample (sixteen 4096³
  /// bf16 GEMMs, 2.2 TFLOP; max over ranks): the clock state the candidates ran in.
  double load_ms = 0;
};

/// Chooses from measured times (ms per strategy; must contain `baseline`,
/// normally sequential). Throws tessera::Error if the baseline is missing or
/// a time is not finite and positive. Fastest wins; another winner must be
/// faster than baseline·(1 − margin), else the baseline.
Strategy choose_strategy(const std::map<Strategy, double>& times_ms, double margin = 0.01,
                         Strategy baseline = Strategy::sequential);

/// The evidence for every candidate but `baseline` from per-repetition times
/// (ms; entry i of every vector is repetition i). Throws tessera::Error if the
/// baseline is missing, the vectors are empty or differ in length, or a time
/// is not finite and positive.
std::map<Strategy, PairedEvidence> paired_evidence(const std::map<Strategy, std::vector<double>>& samples_ms,
                                                   Strategy baseline = Strategy::sequential);

/// "x0.874, wins 91 %": the evidence as the tuner's reports print it.
std::string evidence_text(const PairedEvidence& e);

/// Fewest repetitions, as a share, a candidate must win to replace the
/// baseline: 8 of the tuner's 11 (equal strategies do so on one rank with
/// probability 0.11, on every rank of a pair ~0.01).
inline constexpr double kMinWinFraction = 0.7;

/// choose_strategy by paired evidence: a candidate other than the baseline
/// qualifies if it won at least `min_win_fraction` of the repetitions and its
/// median paired ratio is below 1 − margin; the qualifying candidate with the
/// smallest median time wins (ties: the smaller ratio), else the baseline.
/// The pairs alone decide whether to leave the baseline (two medians can tie
/// where every repetition favours one candidate); the medians rank what may
/// replace it. A candidate without evidence does not qualify. Throws as choose_strategy
/// does, and if min_win_fraction is outside [0, 1] or a ratio is not finite
/// and positive.
Strategy choose_strategy(const std::map<Strategy, double>& times_ms, const std::map<Strategy, PairedEvidence>& evidence,
                         double margin = 0.01, double min_win_fraction = kMinWinFraction,
                         Strategy baseline = Strategy::sequential);

/// The cache entry for a choice: {"strategy": name, "times_ms": {...}, "shape": [...]}.
nlohmann::json choice_to_json(Strategy s, const std::map<Strategy, double>& times_ms,
                              const std::vector<std::int64_t>& shape);
/// Reads a cached choice; nullopt if the entry is malformed (never throws):
/// not a known strategy, or its "times_ms" (when present) lacks the choice or
/// holds a time that is not finite and positive.
std::optional<Strategy> choice_from_json(const nlohmann::json& j);
/// The same, and nullopt unless the choice is one of the operator's
/// `candidates` (a stale or forged entry is ignored and the operator re-tuned).
std::optional<Strategy> choice_from_json(const nlohmann::json& j, const std::vector<Strategy>& candidates);

/// Largest Σ log²(ratio) over the sized dimensions for a neighbour's choice
/// to be reused: every dimension within a factor 2 of the shape (or one
/// within a factor 4 and the others equal).
inline constexpr double kNeighbourMaxDistance = 3 * 0.4804530139182014;  // 3·ln²2

/// The choice cached for the shape nearest to `shape` among `entries` (an
/// object key → choice entry, as tune::Cache holds them) whose key starts
/// with `prefix` + "|": entries with a shape of the same length, equal to
/// `shape` in every dimension from `sized` on (flags such as swiglu), and
/// positive in the first `sized`, at distance Σ log²(ratio) ≤ max_distance.
/// Only choices among `candidates` count. nullopt when none does.
std::optional<Strategy> nearest_choice(const nlohmann::json& entries, const std::string& prefix,
                                       const std::vector<std::int64_t>& shape, std::size_t sized,
                                       const std::vector<Strategy>& candidates,
                                       double max_distance = kNeighbourMaxDistance);

/// AG+GEMM strategies the tuner measures: sequential, decomposition,
/// fused_ce and fused_sm; only sequential (NCCL) when the ranks are not
/// load/store reachable (`lsa` false: the others push into peers'
/// memory).
std::vector<Strategy> ag_gemm_candidates(int world, bool lsa = true);

/// GEMM+RS strategies the tuner measures at world size R: sequential,
/// decomposition, fused_sm, fused_ce when every shard boundary falls on a
/// tile row (`tile_row_shards`, RsPlan::shards_on_tile_rows), and ring only
/// for R > 2 (at R = 2 the ring is the direct push that fused_sm already does).
/// Without load/store reach (`lsa` false): sequential only.
std::vector<Strategy> gemm_rs_candidates(int world, bool tile_row_shards = true, bool lsa = true);

/// GEMM+AR strategies: sequential, and fused_ce when R > 1, every shard
/// boundary falls on a tile row and the ranks are load/store reachable.
std::vector<Strategy> gemm_ar_candidates(int world, bool tile_row_shards = true, bool lsa = true);

/// sp_attention strategies: sequential alone at R = 1 (nothing moves) or
/// without load/store reach; otherwise also fused_ce, ring, ulysses when
/// `heads_divide` (heads_q and heads_kv multiples of R), and two_level when
/// `two_level` (its Ulysses degree u has 1 < u < R, so R >= 4: at u = 1 or
/// u = R it is the ring or Ulysses).
std::vector<Strategy> sp_attention_candidates(int world, bool lsa = true, bool heads_divide = true,
                                              bool two_level = false);

/// The MLP layer check's candidates (mlp()): the halves' pair first — the
/// baseline, what a call that may not tune keeps — named by its first
/// overlapped half, then sequential (both halves sequential). Throws
/// tessera::Error unless a half is overlapped and neither is automatic.
std::vector<Strategy> mlp_layer_candidates(Strategy ag, Strategy rs);
/// The flags entry of the layer check's key: the pair (ag · 16 + rs), so
/// choices made for different pairs never share a key.
std::int64_t mlp_layer_key_flags(Strategy ag, Strategy rs);

/// True for the strategies that need every rank load/store reachable
/// (symmetric memory, peer stores): all but sequential (and automatic, which
/// resolves to a candidate).
bool needs_lsa(Strategy s);

/// The topology part of the tuner's cache key (tune::MachineId::topology):
/// TESSERA_TOPOLOGY as given (`given`), else "lsa" / "net"; a given name gets
/// "/net" appended when the ranks are not load/store reachable, so choices
/// made with and without reach never share a key.
std::string topology_key(const std::optional<std::string>& given, bool lsa);

/// Key of an operator's choice.
std::string choice_key(const tune::MachineId& m, DType dtype, const std::string& op,
                       const std::vector<std::int64_t>& shape);

}  // namespace tessera::ops
