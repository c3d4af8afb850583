// tessera/tune/signal_tuner.hpp — online stage of the wave-group tuning
// (seed §4.2.2): picks the partition for one GEMM + collective from a
// MachineProfile, remembers it in a tune::Cache ("signal_plans") and reuses
// the nearest tuned shape (rescaled to the new wave count) for shapes whose
// GEMM was never timed.
//
// choose(): 1. a cached choice for exactly this shape; 2. a predictive
// search when the profile has this GEMM's timing (stored in the cache);
// 3. the nearest cached shape for the same machine/dtype/collective/tile;
// 4. nullopt (the caller falls back to no overlap, or profiles the shape).
//
// Measured verdict (the contract: never slower than non-overlap): the model
// errs by 5-15 % on small shapes, so a predicted win can be a measured loss.
// record_measured() takes the measured time of an overlapped partition and
// of no overlap (same shape, ideally timed interleaved) and stores the
// verdict: overlap only when it measured faster than no overlap by at least
// `margin` (default 1 %, as the ops tuner's "never slower than sequential"),
// else no overlap. It applies in both directions: a partition the model
// rejected is kept if it measured faster by the margin. choose() returns the
// verified verdict for that shape from then on (source "verified").
// Measured top-k refinement: with a model error of ~3 %, the predicted-best
// partition is often not the measured best when several partitions are
// predicted within a few percent of one another. candidates(q, k) returns
// the k best overlapped partitions by prediction (exact, signal::
// PredictiveSearch::top_overlapped); a caller measures them and no overlap
// and passes every measurement to record_measured_candidates(q, measured,
// sequential):
// the fastest measured partition (ties: the earlier in the list, i.e. the
// better predicted) is the candidate, kept only by the same verdict rule.
// Contract for the caller: time every candidate and no overlap the same way
// (same repetitions, one interleaved loop, so drift hits all alike) and pass
// the same numbers on every rank. The minimum of k noisy medians is biased
// low (a winner's curse that grows with k); the verdict margin must cover
// it, so keep k small (the bench default is 3) or re-time the winner.
// Nearest-neighbour reuse carries a neighbour's verdict as stored: a shape
// near one measured to lose gets "no overlap", near one measured to win the
// rescaled partition; the choice says verified = false (this shape was not
// measured) and names the neighbour's status in `source`.
//
// The model (signal_overlap_cost(), the same function bench signal predicts
// with, so the two agree for the same profile): the overlapped groups' comm
// from profile.curve(op) (the split communicator), every group but the last
// slowed by profile.comm_slowdown_beside_gemm, the GEMM delayed by
// gemm_penalty_per_group per group; "no overlap" = the GEMM alone on all SMs
// + the whole output's collective from profile.no_overlap_curve(op) (the
// default communicator; falls back to the split curve for format-1
// profiles). Plans cached before a profile changed keep their old
// prediction; erase the signal_plans entries to re-search.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tessera/signal/predictive_search.hpp"
#include "tessera/signal/wave_model.hpp"
#include "tessera/tune/cache.hpp"
#include "tessera/tune/machine_profile.hpp"

namespace tessera::tune {

struct SignalQuery {
  Collective op = Collective::AllReduce;
  std::int64_t m = 0, n = 0, k = 0;
  int tile_m = 128, tile_n = 128, swizzle = 1;
  signal::Raster raster = signal::Raster::AlongN;
  /// All-to-All only: max over ranks of (bytes a rank sends / its tile
  /// bytes), e.g. routing imbalance. 1 for AR/RS.
  double send_fraction = 1.0;
};

struct SignalChoice {
  std::vector<int> waves_per_group;  ///< partition of the overlapped GEMM's waves
  bool overlap = false;              ///< false: run GEMM, then the collective
  double predicted = 0;              ///< seconds (of the searched shape)
  /// "cache", "search", "verified" or "neighbour <key> (verified|predicted)"
  std::string source;
  /// True when this shape's verdict comes from measurement (record_measured).
  bool verified = false;
  /// What the predictive search chose for this shape (before any verdict).
  bool predicted_overlap = false;
  /// Measured seconds, when verified: the partition's overlapped run and no overlap.
  double measured_overlapped = 0, measured_sequential = 0;
  /// When verified: how many overlapped partitions were measured (top-k).
  int measured_candidates = 0;
};

/// One overlapped partition and its measured time (s), for the top-k verdict.
struct MeasuredPartition {
  std::vector<int> waves_per_group;
  double overlapped_s = 0;
};

/// The verdict rule: keep the overlapped partition only when it measured
/// faster than no overlap by at least `margin` (a fraction in [0, 1)):
/// overlapped < sequential * (1 - margin). Throws tessera::Error on a time
/// that is not finite and positive (NaN never passes) or a bad margin.
bool keep_overlap(double overlapped_s, double sequential_s, double margin);

/// The predictor's inputs for query q whose GEMM was timed as g (g.sms must
/// be profile.gemm_sms()), per the model in the file comment. Throws on an
/// all-gather, a bad send fraction or a missing curve. Used by SignalTuner::
/// cost() and by bench signal (one definition of the model).
signal::OverlapCost signal_overlap_cost(const MachineProfile& profile, const SignalQuery& q, const GemmTiming& g);

class SignalTuner {
 public:
  /// 2: entries carry "verified", "predicted_overlap" and "measured" (v1
  /// files are ignored with a warning and replaced: their choices were
  /// predictions only).
  static constexpr int kCacheVersion = 2;
  static constexpr double kDefaultVerdictMargin = 0.01;
  /// `min_gain`: overlap only when predicted at least this fraction faster
  /// than no overlap (signal::PredictiveSearch; default 3 %, about a third of
  /// the model's measured mean error).
  SignalTuner(MachineProfile profile, Cache& plans, double min_gain = 0.03);

  std::optional<SignalChoice> choose(const SignalQuery& q);
  /// Stores the measured verdict for q (see the file comment) and returns
  /// the verified choice. `waves_per_group`: the overlapped partition that
  /// was measured (a partition of overlapped_model(q).waves(); usually the
  /// searched one). The predicted fields of an existing entry are kept; the
  /// GEMM need not be in the profile. All ranks must pass the same times
  /// (e.g. the max over ranks) so they decide alike.
  SignalChoice record_measured(const SignalQuery& q, const std::vector<int>& waves_per_group, double overlapped_s,
                               double sequential_s, double margin = kDefaultVerdictMargin);
  /// Top-k verdict (see the file comment): `measured` are distinct
  /// partitions of q's waves (usually candidates(q, k), measured), at least
  /// one; the fastest is recorded as record_measured() would record it alone
  /// (which is this with a list of one),
  /// and the entry's "measured" lists every candidate. Nothing is stored
  /// when any partition or time is invalid.
  SignalChoice record_measured_candidates(const SignalQuery& q, const std::vector<MeasuredPartition>& measured,
                                          double sequential_s, double margin = kDefaultVerdictMargin);
  /// The k (>= 1) best overlapped partitions predicted for q, best first
  /// (throws if q's GEMM was not timed). Element 0 is the partition choose()
  /// would search; whether to overlap at all is for the measurement (or
  /// choose()'s min_gain) to decide.
  std::vector<signal::Prediction> candidates(const SignalQuery& q, int k) const;
  /// The predictor's inputs for a timed GEMM (throws if it was not timed).
  signal::OverlapCost cost(const SignalQuery& q) const;
  /// The overlapped wave model of a query (SMs minus NCCL's).
  signal::WaveModel overlapped_model(const SignalQuery& q) const;
  std::string key_of(const SignalQuery& q) const;

 private:
  std::string prefix(const SignalQuery& q) const;
  MachineProfile profile_;
  Cache& plans_;
  double min_gain_;
};

}  // namespace tessera::tune
