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
  std::string source;                ///< "cache", "search" or "neighbour <key>"
};

class SignalTuner {
 public:
  static constexpr int kCacheVersion = 1;
  /// `min_gain`: overlap only when predicted at least this fraction faster
  /// than no overlap (signal::PredictiveSearch; default 3 %, about a third of
  /// the model's mean error measured in session 3).
  SignalTuner(MachineProfile profile, Cache& plans, double min_gain = 0.03);

  std::optional<SignalChoice> choose(const SignalQuery& q);
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
