// tessera/kernels/gemm_plan.hpp — the plain GEMM's plans as values: the set
// plan_gemm() chooses from, the options that run a given plan, and the
// measured override (a plan per shape bucket, measured ahead of time and
// cached by the tune layer: tessera/tune/gemm_tuner.hpp,
// docs/design/gemm.md "Measured override").
//
// The override is opt-in and never measures inside a call:
//   - gemm(a, o, stream) with o.plan_source = GemmPlanSource::Tuned runs the
//     installed source's plan for a's shape bucket when there is one, else
//     the model's plan;
//   - TESSERA_GEMM_TUNED=1 (read once per process) makes every plain gemm()
//     call whose plan_source is Default do the same.
// Either way only when o names no plan itself (tile Auto, ping_pong off,
// cluster_m 0, k_splits 0): explicit options run what they name. The kernels
// layer sits below the tune cache, so the source is installed from above
// (tune::install_gemm_tuned_plans, or tune::gemm_tune, which installs it).
#pragma once

#include <optional>
#include <vector>

#include "tessera/kernels/gemm.hpp"

namespace tessera::kernels {

inline bool operator==(const GemmPlan& x, const GemmPlan& y) {
  return x.tile == y.tile && x.ping_pong == y.ping_pong && x.cluster_m == y.cluster_m && x.cluster_n == y.cluster_n &&
         x.k_splits == y.k_splits && x.stream_k == y.stream_k && x.swap_ab == y.swap_ab;
}

/// Every plan plan_gemm()'s model search considers for this problem with
/// default options: each compiled kernel the problem may run (a cluster of
/// 2 along M only with at least two tile rows, along N with two tile
/// rows and two tile columns; the plain-only cluster kernels of cluster_kernel_compiled; output
/// type != input type only 128x256 and the split kernels) and, on the splittable kernels (128x128 cooperative,
/// 64x256 and 64x64 ping-pong), each split count in [2, min(32, K blocks /
/// 4)] written as the count that runs (canonical_k_splits); with B [N,K]
/// and M <= kSwapMaxM, the swapped tiles 128x32, 128x64 and 128x96 (whole
/// K for output type == input type, and split likewise); for output type ==
/// input type, stream-K on 128x256 and 128x128 (docs/design/gemm.md,
/// "Stream-K"). Host only (no device query). A measured plan must be one
/// of these to run.
std::vector<GemmPlan> gemm_plan_candidates(const GemmArgs& a);

/// plan_gemm()'s model search on `num_sms` SMs (no device query): the
/// first of gemm_plan_candidates(a) (without splits unless allow_split)
/// that model_gemm_us() finds cheapest, cached per problem, B layout
/// included.
GemmPlan model_plan(const GemmArgs& a, int num_sms, bool allow_split);

/// The plan plan_gemm() runs when the options name none, on `num_sms` SMs
/// (no device query): the rule measured on the 13 benchmark shapes where
/// legacy_rule_applies(), else model_plan(a, num_sms, allow_split).
/// allow_split is false for GemmOptions::k_splits = 1.
GemmPlan default_plan(const GemmArgs& a, int num_sms, bool allow_split);

/// Whether default_plan() takes the benchmark shapes' rule: rows 128-byte
/// aligned (row_alignment), M and N >= 2048 and at least two waves of
/// 128x256 tiles on num_sms SMs.
bool legacy_rule_applies(const GemmArgs& a, int num_sms);

/// A candidate plan and its model estimate.
struct GemmPlanEstimate {
  GemmPlan plan;
  double us = 0;  ///< model_gemm_us on the SM count asked for
};

/// Every plan of gemm_plan_candidates(a) with its model_gemm_us() on
/// `num_sms` SMs, cheapest first (equal estimates in the candidates'
/// order, as the search breaks ties). Host only.
std::vector<GemmPlanEstimate> gemm_plan_estimates(const GemmArgs& a, int num_sms);

/// True when `p` is one of gemm_plan_candidates(a).
bool gemm_plan_valid(const GemmArgs& a, const GemmPlan& p);

/// The split count that runs when `splits` are asked for a's K blocks (kb):
/// ceil(kb / ceil(kb / splits)), splits clamped to [1, kb].
int canonical_k_splits(const GemmArgs& a, int splits);

/// `base` with tile, ping_pong, cluster_m, k_splits, stream_k and swap_ab set so that
/// plan_gemm(a, result) == p for every p in gemm_plan_candidates(a).
GemmOptions plan_options(const GemmPlan& p, GemmOptions base = {});

/// The SM count plan_gemm() plans for under `o` (max_ctas caps the device's).
int plan_sm_count(const GemmOptions& o);

/// The largest M for which the model search considers the swapped tiles
/// (D^T = B A^T, GemmOptions::swap_ab): up to three 96-row tiles of M.
inline constexpr int64_t kSwapMaxM = 288;
/// At M <= kTinyM with B as [N, K], model_plan() chooses among the 64x64
/// ping-pong and the swapped plans only (a 128-row tile computes >= 4x its
/// rows in padding; on 33 such shapes timed with every kernel it was never
/// the fastest), and model_gemm_us() lets the 64x64 tile stream B at 0.7
/// of the DRAM rate, unsplit, and split where N >= 1536
/// (docs/design/gemm.md, "Small M: swapped operands").
inline constexpr int64_t kTinyM = 32;
/// Whether `a` is such a problem.
bool tiny_m_problem(const GemmArgs& a);

/// Stream-K runs with at least this many K blocks per CTA where the problem
/// has fewer tiles than SMs (then fewer CTAs than SMs): a shorter range
/// balances less than its partial tile costs to write and sum.
inline constexpr int kStreamKMinBlocks = 8;

/// Whether stream-K can run `tiles` tiles of `k_blocks` K blocks: its
/// schedule indexes K blocks in int ((tiles + 1) x k_blocks < 2^31).
constexpr bool stream_k_fits(int64_t tiles, int64_t k_blocks) { return (tiles + 1) * k_blocks < (int64_t{1} << 31); }

/// Problems the model puts under this many microseconds run as programmatic
/// dependents; longer ones measured slower so (docs/design/gemm.md,
/// "Programmatic dependent launch").
inline constexpr double kDependentLaunchMaxUs = 10.0;

/// Whether the plain gemm() launches plan p for `a` as a programmatic
/// dependent: asked for (o.dependent_launch) and modelled on num_sms SMs
/// under kDependentLaunchMaxUs.
bool plain_dependent_launch(const GemmArgs& a, const GemmOptions& o, const GemmPlan& p, int num_sms);

/// A source of measured plans: for the problem and plan_sm_count(), a plan
/// or nullopt (then plan_gemm() decides). A plan it returns that is not
/// gemm_plan_valid for the problem is ignored.
using GemmPlanLookup = std::optional<GemmPlan> (*)(const GemmArgs& a, int num_sms);
/// Installs the source (nullptr uninstalls); thread-safe.
void set_gemm_plan_lookup(GemmPlanLookup lookup);
GemmPlanLookup gemm_plan_lookup();

/// The options gemm(a, o) runs its kernel under: o.plan_source resolved.
/// Under Tuned (or Default with TESSERA_GEMM_TUNED=1), when o names no plan
/// and the source holds one for a: o with that plan's fields
/// (plan_options); o otherwise. plan_gemm(a, resolve_options(a, o)) is the
/// plan gemm(a, o) runs. The result's plan_source is Model (resolved). A
/// tessera::Error when Tuned applies and no source is installed.
GemmOptions resolve_options(const GemmArgs& a, const GemmOptions& o);

}  // namespace tessera::kernels
