// The TP MoE layer (tessera/ops/moe.hpp): validation, the agreement across
// ranks, automatic through the ops tuner, and the registry of its strategies
// (src/ops/moe_tp/, one file each: sequential, pipelined). Design:
// docs/design/moe_tp.md.
#include "tessera/ops/moe.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "moe_tp/moe_tp.hpp"
#include "tessera/ops/plan.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/tune/key.hpp"
#include "tuning.hpp"

namespace tessera::ops {

namespace moetp {

namespace {

/// The transport a call of `o` uses (the same on every rank: reachability
/// is a property of the group, capture of the call).
MoeTransport resolve_transport(runtime::ProcessGroup& pg, const MoeTpOptions& o) {
  if (o.transport != MoeTransport::automatic) return o.transport;
  return pg.lsa_reachable() && !runtime::stream_capturing(pg.stream()) ? MoeTransport::copy_engine : MoeTransport::nccl;
}

}  // namespace

PipelineChoice resolve_pipeline(runtime::ProcessGroup& pg, const MoeTpArgs& a, const MoeTpOptions& o) {
  const MoeTransport t = resolve_transport(pg, o);
  return {t, moe_rs_chunks(a.hidden, o.rs_chunks, t == MoeTransport::copy_engine)};
}

}  // namespace moetp

const moetp::Registry& moe_tp_registry() {
  static const moetp::Registry r(OpKind::moe_tp, "moe_tp", {&moetp::sequential, &moetp::pipelined});
  return r;
}

std::vector<Strategy> moe_tp_candidates(int world) { return moe_tp_registry().candidates({.world = world}); }

namespace {

using moetp::PipelineChoice;
using moetp::resolve_pipeline;
using moetp::status_index;
using moetp::TpShape;

constexpr std::int64_t kMaxDim = detail::kMoeMaxDim;

const char* transport_name(MoeTransport t) {
  switch (t) {
    case MoeTransport::automatic:
      return "automatic";
    case MoeTransport::nccl:
      return "nccl";
    case MoeTransport::copy_engine:
      return "copy_engine";
  }
  return "?";
}

void run_moe_tp(MoeContext& ctx, const MoeTpArgs& a, Strategy strategy, const MoeTpOptions& o) {
  moe_tp_registry().find(strategy).launch(ctx, a, o);
}

}  // namespace

MoeContext::MoeContext(runtime::ProcessGroup& pg) : pg_(&pg), impl_(std::make_unique<Impl>()) {}
MoeContext::~MoeContext() {
  // After a peer failure the group is aborted; finalizing the split
  // communicator collectively would then wait for the dead peer.
  if (impl_->pipe.comm && pg_->aborted()) impl_->pipe.comm->abort();
}

void validate(const MoeTpArgs& a, int world) {
  detail::validate_moe_sizes(
      "moe_tp", world, a.dtype, a.tokens_local, a.hidden, "inter_local", a.inter_local, a.experts,
      static_cast<int>(std::min<std::int64_t>(kernels::moe::kMaxExperts, kernels::kGroupedMaxGroups)), a.topk,
      kernels::moe::kMaxTopK);
  const std::int64_t tokens = a.tokens_local * world;
  TESSERA_CHECK(tokens * a.topk < kMaxDim, "moe_tp: tokens ({}) * topk ({}) must stay below 2^31", tokens, a.topk);
  TESSERA_CHECK(tokens * a.topk <= (std::int64_t{1} << 60) / (a.hidden + 2 * a.inter_local),
                "moe_tp: the expert buffers of {} rows x (hidden {} + 2 x inter_local {}) overflow 64-bit sizes",
                tokens * a.topk, a.hidden, a.inter_local);
  detail::validate_moe_pointers("moe_tp", a.x_shard, a.expert_ids, a.weights, a.w_gate_up, a.w_down, a.out_shard);
}

void validate(const MoeTpOptions& o, int sms) {
  detail::validate_moe_transport("moe_tp", o.transport);
  TESSERA_CHECK(accepts(OpKind::moe_tp, o.strategy),
                "moe_tp: strategy {} is not a TP MoE strategy (automatic, sequential, pipelined)",
                strategy_name(o.strategy));
  TESSERA_CHECK(o.comm_ctas >= 1 && o.comm_ctas <= 64 && o.comm_ctas < sms,
                "moe_tp: comm_ctas = {} out of range [1, min(64, SMs - 1 = {})]", o.comm_ctas, sms - 1);
}

namespace {

/// Every rank calls with the same shape, dtype, requested strategy and
/// comm_ctas (before the tuner runs anything collective): one host exchange
/// per new signature, as TpContext does, so a steady-state call has none.
void check_agreement(runtime::ProcessGroup& pg, std::set<TpShape>& agreed, const MoeTpArgs& a, const MoeTpOptions& o) {
  const PipelineChoice pc = resolve_pipeline(pg, a, o);
  const TpShape shape{a.tokens_local,
                      a.hidden,
                      a.inter_local,
                      a.experts,
                      a.topk,
                      static_cast<std::int64_t>(a.dtype),
                      static_cast<std::int64_t>(o.strategy),
                      o.comm_ctas,
                      pc.chunks,
                      static_cast<std::int64_t>(pc.transport)};
  if (agreed.count(shape)) return;
  pg.check_same_on_all_ranks(
      fmt::format("moe_tp: shape (tokens_local {}, hidden {}, inter_local {}, experts {}, topk {}, strategy {}, "
                  "comm_ctas {}, rs_chunks {}, transport {})",
                  a.tokens_local, a.hidden, a.inter_local, a.experts, a.topk, strategy_name(o.strategy), o.comm_ctas,
                  shape.rs_chunks, transport_name(static_cast<MoeTransport>(shape.transport))),
      shape);
  agreed.insert(shape);
}

}  // namespace

Strategy resolve_moe_tp(MoeContext& ctx, const MoeTpArgs& a, const MoeTpOptions& o, TuneReport* report) {
  runtime::ProcessGroup& pg = ctx.group();
  const int R = pg.world();
  validate(a, R);
  validate(o, pg.sm_count());
  check_agreement(pg, ctx.impl().agreed, a, o);
  if (o.strategy != Strategy::automatic) return o.strategy;
  // Nothing to hide at R = 1; the tuner cannot run inside a capture.
  if (R == 1 || runtime::stream_capturing(pg.stream())) return Strategy::sequential;
  MoeContext::Impl& m = ctx.impl();
  const detail::TuneHooks hooks{[&](const char* what) { m.drain(pg, what); },
                                [&](Strategy s) { run_moe_tp(ctx, a, s, o); }};
  // tokens, hidden and inter are compared by ratio for a neighbour's choice;
  // experts, topk, comm_ctas, rs_chunks and the transport are flags.
  const PipelineChoice pc = resolve_pipeline(pg, a, o);
  const detail::TuneQuery q{tune::key_prefix(detail::machine_id(pg), a.dtype, "ops.moe_tp"),
                            {a.tokens_local, a.hidden, a.inter_local, a.experts, a.topk, o.comm_ctas, pc.chunks,
                             static_cast<std::int64_t>(pc.transport)},
                            3,
                            o.use_cache,
                            o.tune_on_miss};
  // Collective and agreed across ranks (the times are maxima over ranks).
  return detail::tune_choice(pg, m.tune, q, moe_tp_candidates(R), hooks, report);
}

void moe_tp(MoeContext& ctx, const MoeTpArgs& a, const MoeTpOptions& o) {
  const Strategy strategy = resolve_moe_tp(ctx, a, o);  // validates and agrees first
  run_moe_tp(ctx, a, strategy, o);
}

void MoeContext::check_status() {
  Impl& m = *impl_;
  if (m.flags_ptr == nullptr) return;
  const cudaStream_t s = pg_->stream();
  std::int32_t invalid = 0;
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(&invalid, m.flags_ptr, sizeof(invalid), cudaMemcpyDeviceToHost, s));
  pg_->synchronize(s, "moe_tp: check_status");
  TESSERA_CHECK(invalid == 0, "moe_tp: {} routed entries had an expert id outside [0, experts) and were left out",
                invalid);
  for (int q = 0; q < m.last_status_shards; ++q) {
    const std::string what = m.last_status_shards > 1 ? fmt::format("moe_tp: shard {} ", q) : std::string("moe_tp: ");
    kernels::check_grouped_gemm_status(m.flags_ptr + status_index(q, false), s,
                                       (what + "gate/up grouped GEMM").c_str());
    kernels::check_grouped_gemm_status(m.flags_ptr + status_index(q, true), s, (what + "down grouped GEMM").c_str());
  }
}

}  // namespace tessera::ops
