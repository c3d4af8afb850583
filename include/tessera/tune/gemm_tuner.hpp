// tessera/tune/gemm_tuner.hpp — the plain GEMM's measured override: the cost
// model proposes, the GPU decides, the tune cache remembers per shape bucket.
//
// gemm_tune(a) times the model's top_k plans for the problem (the cheapest
// of kernels::gemm_plan_candidates under kernels::model_gemm_us) plus
// plan_gemm()'s own pick, GPU time only (tune/graph_timing.hpp: interleaved
// CUDA graphs, warm-up, median), keeps the fastest — the model's pick unless
// another plan measured faster by more than kGemmTuneMargin — and stores it
// in the tune::Cache "gemm" under gemm_bucket_key(). kernels::gemm() with
// GemmOptions::plan_source Tuned (and every kernels::gemm() with
// TESSERA_GEMM_TUNED=1) reads it back through install_gemm_tuned_plans();
// nothing measures inside a GEMM call.
//
// Key = key_prefix({gpu name, "sm<SMs>", 1}, in dtype, "gemm.plan") +
//       "|out:<dtype>|<nk|kn>|row<align>" + "|b<bm>_<bn>_<bk>"
// where align is kernels::row_alignment() (16 ... 128 bytes: the TMA rate
// class) and b* = round(4 log2 x) of M, N, K (quarter-octave buckets: sizes
// within ~9 % share a plan). The SM count is the one the plans ran on
// (GemmOptions::max_ctas caps it). Entries hold {"plan": {...}, "shape":
// [M, N, K] as tuned, "us", "model_plan", "model_us", "times_us"}.
//
// Lookup (lookup_gemm_plan): the problem's own bucket, else the nearest tuned
// shape with the same prefix (machine, dtypes, layout, alignment) within
// kGemmNeighbourMaxDistance. A plan is used only if, with its split count
// re-derived for this K (kernels::canonical_k_splits), it is one of
// kernels::gemm_plan_candidates() for this problem — the plans plan_gemm()
// itself chooses among — so a stale, forged or foreign entry can never run a
// kernel the problem does not support. An invalid entry of the problem's
// own bucket (or a malformed one) is ignored with a warning (once per key);
// a neighbour whose plan does not fit the problem is skipped.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/gemm_plan.hpp"
#include "tessera/tune/cache.hpp"
#include "tessera/tune/key.hpp"

namespace tessera::tune {

inline constexpr const char* kGemmCacheName = "gemm";
inline constexpr int kGemmCacheVersion = 1;
/// Largest Σ ln²(ratio) over M, N, K for a neighbour's plan to be reused:
/// ln²2 — one dimension within a factor 2 and the others equal, or all
/// three within a factor 2^(1/√3) ≈ 1.49. Tighter than the ops tuner's
/// (tile counts against the SM count decide GEMM plans).
inline constexpr double kGemmNeighbourMaxDistance = 0.4804530139182014;
/// A measured plan replaces plan_gemm()'s only when faster by this fraction.
inline constexpr double kGemmTuneMargin = 0.01;

/// The machine part of a GEMM key: the GPU's name and the SMs planned for.
MachineId gemm_machine(const std::string& gpu_name, int num_sms);
/// The same for the current device.
MachineId current_gemm_machine(int num_sms);

/// round(4 log2 x) of M, N, K.
std::array<int, 3> gemm_bucket(const kernels::GemmArgs& a);
/// Everything of the key but the bucket (see the header comment).
std::string gemm_key_prefix(const MachineId& m, const kernels::GemmArgs& a);
/// The problem's bucket key.
std::string gemm_bucket_key(const MachineId& m, const kernels::GemmArgs& a);

/// {"tile": "128x256", "ping_pong": bool, "cluster_m": c, "k_splits": s, "stream_k": bool,
/// "swap_ab": bool, "name": plan_name} ("stream_k" and "swap_ab" may be absent: false).
nlohmann::json gemm_plan_to_json(const kernels::GemmPlan& p);
/// The plan of gemm_plan_to_json's form; nullopt if malformed (never throws).
std::optional<kernels::GemmPlan> gemm_plan_from_json(const nlohmann::json& j);

struct GemmLookup {
  kernels::GemmPlan plan;  ///< valid for the problem looked up
  std::string key;         ///< the entry it came from
  bool exact = false;      ///< the problem's own bucket
  double distance = 0;     ///< Σ ln²(ratio) to the entry's tuned shape
};

/// The plan cached for `a` on machine `m` (see the header comment). Host only.
std::optional<GemmLookup> lookup_gemm_plan(const Cache& cache, const MachineId& m, const kernels::GemmArgs& a,
                                           double max_distance = kGemmNeighbourMaxDistance);

struct GemmTuneOptions {
  int top_k = 5;           ///< the model's cheapest plans timed (plus plan_gemm()'s pick)
  int warmup = 3;          ///< untimed interleaved rounds
  int reps = 9;            ///< timed rounds (median)
  double target_us = 100;  ///< GPU time per timed interval: calls per graph = target / model estimate (1..16)
  int max_ctas = 0;        ///< GemmOptions::max_ctas the plans run (and are keyed) under
  bool refresh = false;    ///< measure even when the bucket holds a plan
  bool use_cache = true;   ///< read and write the on-disk cache
  std::string cache_dir;   ///< "" = cache_dir()
};

struct GemmTuneResult {
  kernels::GemmPlan plan;        ///< the pick: fastest measured, or the cached plan
  kernels::GemmPlan model_plan;  ///< plan_gemm()'s choice
  /// Median µs per call of every plan timed (model order; empty from cache).
  std::vector<std::pair<kernels::GemmPlan, double>> times_us;
  std::vector<std::string> errors;  ///< plans that could not run, with the reason
  bool from_cache = false;
  std::string key;
};

/// Measures and caches the plan of `a`'s bucket (skipped when the bucket
/// holds a valid plan and !refresh). Writes D (a.d) many times: D is scratch.
/// Synchronizes `stream` first and leaves the work done on return. With
/// use_cache, installs the tuned-plan source (install_gemm_tuned_plans) over
/// the same directory, so gemm() under plan_source Tuned runs the pick from
/// then on.
GemmTuneResult gemm_tune(const kernels::GemmArgs& a, cudaStream_t stream = nullptr, const GemmTuneOptions& o = {});

/// Installs the source kernels::gemm() reads under plan_source Tuned
/// (kernels/gemm_plan.hpp):
/// lookup_gemm_plan over the cache "gemm" in `cache_dir` ("" = cache_dir()),
/// read once and memoized per problem (gemm_tune's writes refresh it).
void install_gemm_tuned_plans(const std::string& cache_dir = "");

}  // namespace tessera::tune
