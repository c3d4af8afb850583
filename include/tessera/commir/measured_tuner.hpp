// tessera/commir/measured_tuner.hpp — Mercury's autotuner on the hardware:
// the cost model proposes, measurements decide.
//
//   1. Candidates: the schedule search's ranking (tune()) plus every named
//      schedule of schedules.hpp that applies to the mesh, deduplicated by
//      grid, over the memory limit dropped.
//   2. The model's top_k are run (a PlanRunner: on GPUs, time_plan_on_gpus).
//   3. Calibration: the profile's kernel rates and link bandwidths are
//      scaled by two factors fitted to the measurements (least squares on
//      log time, grid search), and every candidate is re-estimated with the
//      calibrated profile.
//   4. The next top_k of the calibrated ranking not yet run are run; the
//      fastest measured plan is the pick (2·top_k plans run in all).
//   With a layout contract (MeasureOptions::search.contract, e.g. Mercury's
//   sequence-sharded attention), a plan's execution is measured and the
//   resharding from and to the contract is charged by the (calibrated)
//   model: the runner executes plans on their own input layout.
//   5. The pick is cached per shape bucket (axis extents rounded to quarter
//      octaves, the mesh and the contract) under a caller-given key prefix; a later call
//      in the same bucket re-applies the cached script without measuring.
//
// Every rank must call tune_measured with the same arguments: the runner is
// collective and returns the same value on every rank (time_plan_on_gpus
// reports the slowest rank), so the ranks take the same decisions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/commir/machine.hpp"
#include "tessera/commir/plan.hpp"
#include "tessera/commir/tuner.hpp"

namespace tessera::runtime {
class ProcessGroup;
}

namespace tessera::commir {

/// Runs one lowered plan and returns its time in µs (the same value on every
/// rank). Throws tessera::Error, on every rank alike, when the plan cannot run.
using PlanRunner = std::function<double(const Plan& plan, const std::string& label)>;

struct MeasureOptions {
  int top_k = 3;                ///< plans run per round (two rounds)
  TuneOptions search;           ///< the model's search (memory limit, budget, contract)
  bool named_schedules = true;  ///< add schedules.hpp's schedules to the search's candidates
  std::string cache_name;       ///< tune::Cache file name ("" = no cache)
  std::string cache_dir;        ///< "" = tune::cache_dir() ($TESSERA_CACHE_DIR or ~/.cache/tessera)
  std::string cache_prefix;     ///< key prefix (tune::key_prefix: machine, dtype, what)
  bool refresh = false;         ///< measure even when the bucket has a cached pick
};

struct MeasuredPlan {
  std::string label;   ///< named schedule or "search #i"
  std::string script;  ///< schedule script (apply() reproduces the grid)
  Grid grid;
  Estimate model;           ///< with the given profile (time_us includes reshard_us)
  Estimate calibrated;      ///< with the calibrated profile (likewise)
  double measured_us = -1;  ///< the plan's execution on the hardware; < 0: not run
  std::string error;        ///< why it could not run (when it was tried)
  /// Measured execution plus the calibrated model's resharding from and to
  /// the contract layout (0 without a contract): what the pick minimizes.
  double total_us() const { return measured_us + calibrated.reshard_us; }
};

struct Calibration {
  double compute_scale = 1;  ///< multiplies the kernel rates
  double comm_scale = 1;     ///< multiplies the link bandwidths
  double rms_log_error = 0;  ///< of the fitted model over the measured plans
  int points = 0;
};

struct MeasureResult {
  std::vector<MeasuredPlan> plans;  ///< candidates, calibrated ranking order
  int pick = -1;                    ///< index into plans of the fastest measured (or cached) plan
  int model_pick = -1;              ///< index of the uncalibrated model's first choice
  Calibration calibration;
  MachineProfile calibrated;
  bool from_cache = false;
  std::string cache_key;
};

/// The profile with kernel rates x compute_scale and link bandwidths x comm_scale.
MachineProfile scaled_profile(const MachineProfile& p, double compute_scale, double comm_scale);

/// Fits compute_scale and comm_scale to (plan, measured µs) pairs (plans
/// with measured_us > 0): minimizes the squared log error of estimate().
Calibration calibrate(const MachineProfile& prof, const std::vector<const Plan*>& plans,
                      const std::vector<double>& measured_us);

/// The cache key of `op`'s shape bucket under `prefix`; a layout contract
/// (its sharding, as fractions of each dimension) is part of the key, since
/// it changes what the plans cost.
std::string shape_bucket_key(const std::string& prefix, const Grid& op, const Layout* contract = nullptr);

/// Steps 1-5 above for the unscheduled operator `op`. Throws tessera::Error
/// when no candidate fits or none of those tried could run.
MeasureResult tune_measured(const Grid& op, const MachineProfile& prof, const MeasureOptions& opt,
                            const PlanRunner& run);

struct PlanTimingOptions {
  int warmup = 2;
  int reps = 5;
  std::uint64_t seed = 1;  ///< inputs: uniform [-1, 1) from this seed
};

/// A PlanRunner on GPUs (collective over `pg`): builds a GpuExecutor for the
/// plan on pg's streams, uploads random inputs, runs it warmup + reps times
/// and returns the slowest rank's median µs. A construction refused on any
/// rank (kernels::validate, memory) is agreed on before anything runs and
/// thrown on every rank.
double time_plan_on_gpus(runtime::ProcessGroup& pg, const Plan& plan, const std::string& label,
                         const PlanTimingOptions& opt = {});

}  // namespace tessera::commir
