// tessera/signal/predictive_search.hpp — choose the wave-group partition
// (seed §4) from a latency prediction instead of online profiling.
//
// Model (seed Alg. 1): the GEMM, running on the SMs NCCL leaves free, has
// finished k waves at time C(k) (measured WaveTimes). Group g (waves
// [a, b), g = 0, 1, ...) starts communicating at max(C(b) + g * penalty,
// end of group g-1) and takes overhead + comm(a, b) * (1 + slowdown) for
// b < W (the GEMM still runs beside it), overhead + comm(a, b) for the last. `penalty`
// (OverlapCost::gemm_penalty_per_group) is what each collective launched
// while the GEMM runs costs the GEMM: bench signal measured the GEMM 0.18 ms
// slower inside a 9-group run on MLP-1 AR (docs/design/signal.md), ~10–20
// µs per group, while the model without it took the GEMM at its standalone
// speed. The first group's collective starts after C(b) of a GEMM that no
// collective has slowed yet, hence g * penalty. where comm comes from the measured bandwidth curve
// at the group's byte count (for All-to-All: the max over ranks). The
// predicted latency is the end of the last group. "No overlap" is the
// sequential GEMM on all SMs followed by one collective on the whole output.
//
// Searches:
//  - best(): exact optimum of the model for any W, by dynamic programming
//    over (wave boundary, groups so far) in O(W^3) (O(W^2) when the penalty
//    is 0): the end of group g is non-decreasing in the end of group g-1, so
//    only the earliest end at each (boundary, group count) matters.
//  - pruned(a, b): the seed's enumeration with first group <= a waves and last
//    group <= b waves. Provable bound (monotone comm): pruned <= optimum +
//    comm(first a waves) + comm(last b waves) + 2 * overhead (split the
//    optimum's first and last groups; each split delays every later group by
//    at most the split-off piece's comm plus one overhead, plus one GEMM
//    penalty when the penalty is not 0). Exponential: W <= 26.
//  - exhaustive(): all 2^(W-1) partitions, for checking. W <= 24.
//  - top_overlapped(k): the k best overlapped partitions (distinct, sorted by
//    prediction), by the same DP keeping the k earliest ends per state:
//    since a group's end is non-decreasing in the previous group's end, a
//    prefix outside the k earliest of its state has k distinct prefixes
//    there that extend at least as well, so the k-best values are exact
//    (O(W^3 k log k); ties among equal predictions are broken by the DP's
//    order, which for k = 1 is best_overlapped()'s: same partition). Used
//    for a measured top-k refinement (tune::SignalTuner::candidates): with
//    a ~3 % model error, the predicted best is often not the measured best
//    when several partitions are predicted within a few percent.
// Each returns the overlap partition or, when the sequential prediction is
// lower, overlap == false with a single group.
#pragma once

#include <functional>
#include <vector>

#include "tessera/signal/wave_model.hpp"

namespace tessera::signal {

struct OverlapCost {
  WaveTimes overlapped;           ///< GEMM with NCCL's SMs taken: C(k)
  double sequential_gemm = 0;     ///< GEMM alone on all SMs (s)
  double comm_all = 0;            ///< one collective on the whole output (s)
  double per_group_overhead = 0;  ///< wait + launch cost of one group (s)
  /// Delay of the GEMM's remaining waves per group collective launched
  /// before them (s): group g's data is ready at C(b) + g * this.
  double gemm_penalty_per_group = 0;
  /// Relative slowdown of a group's collective while the GEMM still runs
  /// (every group but the last, which runs after the GEMM's last wave): its
  /// time is group_comm * (1 + this). Fitted offline on bench signal logs
  /// (docs/design/signal.md, "The cost model"): 0.15-0.35 on H200 x2,
  /// NCCL on 16 CTAs beside the persistent GEMM. 0 = the curve as measured.
  double comm_slowdown_beside_gemm = 0;
  /// Communication time of the group made of waves [first, end) (s).
  std::function<double(int first, int end)> group_comm;

  /// The model's time for that group: group_comm, slowed when end < waves().
  double group_time(int first, int end) const {
    return group_comm(first, end) * (end < waves() ? 1 + comm_slowdown_beside_gemm : 1.0);
  }

  int waves() const { return overlapped.waves(); }

  /// The usual construction: bytes of a group = its tiles (per `model`,
  /// the overlapped model) x bytes_per_tile; comm_time(bytes) from a curve.
  static OverlapCost from_tiles(const WaveModel& model, WaveTimes overlapped, double sequential_gemm,
                                double bytes_per_tile, std::function<double(double bytes)> comm_time,
                                double per_group_overhead, double gemm_penalty_per_group = 0);
};

struct Prediction {
  std::vector<int> waves_per_group;  ///< the partition (one group when !overlap)
  double latency = 0;                ///< predicted seconds
  bool overlap = true;               ///< false: run GEMM then the collective
  long long candidates = 0;          ///< partitions evaluated
};

class PredictiveSearch {
 public:
  /// `min_gain` (in [0, 1)): best(), pruned() and exhaustive() choose an
  /// overlapped partition only when its prediction beats "no overlap" by at
  /// least this fraction — a margin for the model's error, so that a
  /// predicted 1–2 % win, inside that error, does not turn into a measured
  /// loss (the tuner must never be slower than not overlapping).
  explicit PredictiveSearch(OverlapCost cost, double min_gain = 0);

  /// Predicted latency of one overlapped partition.
  double predict(const std::vector<int>& waves_per_group) const;
  double predict_sequential() const { return cost_.sequential_gemm + cost_.comm_all; }

  Prediction best() const;
  /// best() before the comparison with "no overlap": the model's optimal
  /// overlapped partition (overlap == true even when sequential is faster).
  Prediction best_overlapped() const;
  /// The k (>= 1) best overlapped partitions by prediction, best first,
  /// distinct; fewer when the shape has fewer than k partitions (2^(W-1)).
  /// Every entry has overlap == true (no comparison with "no overlap": a
  /// caller that measures them measures no overlap beside them); element 0
  /// is best_overlapped()'s partition. `candidates` counts the DP's steps.
  std::vector<Prediction> top_overlapped(int k) const;
  Prediction pruned(int max_first, int max_last) const;
  Prediction exhaustive() const;

  const OverlapCost& cost() const { return cost_; }

 private:
  Prediction finish(Prediction p) const;  // compare with "no overlap"
  double min_gain_ = 0;
  OverlapCost cost_;
};

}  // namespace tessera::signal
