// The expert-parallel MoE layer (tessera/ops/moe_ep.hpp): validation, the
// agreement across ranks and the registry of its strategies
// (src/ops/moe_ep/, one file each: sequential, pipelined) over fixed
// per-rank slabs. Design: docs/design/moe_ep.md.
#include "tessera/ops/moe_ep.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <string>

#include "moe_ep/moe_ep.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops {

const moeep::Registry& moe_ep_registry() {
  static const moeep::Registry r(OpKind::moe_ep, "moe_ep", {&moeep::sequential, &moeep::pipelined});
  return r;
}

namespace {

using moeep::status_index;

constexpr std::int64_t kMaxDim = detail::kMoeMaxDim;

/// Compared byte for byte across ranks: all 64-bit, so no padding.
struct EpShape {
  std::int64_t hidden, inter, capacity, experts, topk, dtype, strategy, comm_ctas, transport;
};

/// The transport a pipelined call of `o` uses (the same on every rank).
MoeTransport resolve_ep_transport(runtime::ProcessGroup& pg, const MoeEpOptions& o) {
  if (o.transport != MoeTransport::automatic) return o.transport;
  return pg.lsa_reachable() && !runtime::stream_capturing(pg.stream()) ? MoeTransport::copy_engine : MoeTransport::nccl;
}

}  // namespace

MoeEpContext::MoeEpContext(runtime::ProcessGroup& pg) : pg_(&pg), impl_(std::make_unique<Impl>()) {}
MoeEpContext::~MoeEpContext() {
  // After a peer failure the group is aborted; finalizing the split
  // communicator collectively would then wait for the dead peer.
  if (impl_->pipe.comm && pg_->aborted()) impl_->pipe.comm->abort();
}

std::string_view moe_ep_strategy_name(MoeEpStrategy s) { return strategy_name(s); }

MoeEpStrategy parse_moe_ep_strategy(std::string_view name) {
  const Strategy s = parse_strategy(name);
  TESSERA_CHECK(accepts(OpKind::moe_ep, s),
                "moe_ep: strategy '{}' is not an EP MoE strategy (automatic, sequential, pipelined)", name);
  return s;
}

std::int64_t moe_ep_capacity(const MoeEpArgs& a) { return a.capacity > 0 ? a.capacity : a.tokens_local * a.topk; }

void validate(const MoeEpArgs& a, int world) {
  detail::validate_moe_sizes("moe_ep", world, a.dtype, a.tokens_local, a.hidden, "inter", a.inter, a.experts,
                             kernels::moe::kMaxExperts, a.topk, kernels::moe::kMaxTopK);
  TESSERA_CHECK(a.experts % world == 0, "moe_ep: experts = {} is not a multiple of the world size {}", a.experts,
                world);
  TESSERA_CHECK(a.tokens_local * a.topk < kMaxDim, "moe_ep: tokens_local ({}) * topk ({}) must stay below 2^31",
                a.tokens_local, a.topk);
  TESSERA_CHECK(a.capacity >= 0, "moe_ep: capacity = {} must be >= 0 (0: tokens_local * topk)", a.capacity);
  const std::int64_t cap = moe_ep_capacity(a);
  TESSERA_CHECK(cap < kMaxDim / world, "moe_ep: capacity ({}) * world ({}) must stay below 2^31", cap, world);
  TESSERA_CHECK(cap * world <= (std::int64_t{1} << 60) / (2 * a.hidden + 2 * a.inter),
                "moe_ep: the slabs of {} rows x (2 x hidden {} + 2 x inter {}) overflow 64-bit sizes", cap * world,
                a.hidden, a.inter);
  detail::validate_moe_pointers("moe_ep", a.x_shard, a.expert_ids, a.weights, a.w_gate_up, a.w_down, a.out_shard);
}

void moe_ep(MoeEpContext& ctx, const MoeEpArgs& a, const MoeEpOptions& o) {
  runtime::ProcessGroup& pg = ctx.group();
  const int R = pg.world();
  validate(a, R);
  detail::validate_moe_transport("moe_ep", o.transport);
  TESSERA_CHECK(o.comm_ctas >= 1 && o.comm_ctas <= 64 && o.comm_ctas < pg.sm_count(),
                "moe_ep: comm_ctas = {} out of range [1, min(64, SMs - 1 = {})]", o.comm_ctas, pg.sm_count() - 1);
  TESSERA_CHECK(accepts(OpKind::moe_ep, o.strategy),
                "moe_ep: strategy {} is not an EP MoE strategy (automatic, sequential, pipelined)",
                strategy_name(o.strategy));
  Strategy strategy = o.strategy;
  if (strategy == Strategy::automatic) strategy = R > 1 ? Strategy::pipelined : Strategy::sequential;
  const std::int64_t cap = moe_ep_capacity(a);
  const MoeTransport transport = resolve_ep_transport(pg, o);
  const EpShape shape{a.hidden,
                      a.inter,
                      cap,
                      a.experts,
                      a.topk,
                      static_cast<std::int64_t>(a.dtype),
                      static_cast<std::int64_t>(strategy),
                      o.comm_ctas,
                      static_cast<std::int64_t>(transport)};
  pg.check_same_on_all_ranks(
      fmt::format("moe_ep: shape (hidden {}, inter {}, capacity {}, experts {}, topk {}, strategy {}, comm_ctas {}, "
                  "transport {})",
                  a.hidden, a.inter, cap, a.experts, a.topk, moe_ep_strategy_name(strategy), o.comm_ctas,
                  transport == MoeTransport::copy_engine ? "copy_engine" : "nccl"),
      shape);

  moe_ep_registry().find(strategy).launch(ctx, a, o, transport);
  MoeEpContext::Impl& m = ctx.impl();
  m.last_world = R;
  m.last_gemms = cap > 0;
  m.last_capacity = cap;
}

void MoeEpContext::check_status() {
  Impl& m = *impl_;
  if (m.flags_ptr == nullptr) return;
  const cudaStream_t s = pg_->stream();
  std::int32_t f[3] = {0, 0, 0};
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(f, m.flags_ptr, sizeof(f), cudaMemcpyDeviceToHost, s));
  pg_->synchronize(s, "moe_ep: check_status");
  std::string problems;
  if (f[0] != 0)
    problems += fmt::format("; {} routed entries had an expert id outside [0, experts) and were left out", f[0]);
  if (f[1] != 0)
    problems += fmt::format(
        "; capacity overflow: {} routed rows did not fit the capacity of {} rows per destination rank (the largest "
        "destination got {}) and were left out of the output; pass capacity >= {}",
        f[1], m.last_capacity, f[2], f[2]);
  TESSERA_CHECK(problems.empty(), "moe_ep: rank {}{}", pg_->rank(), problems);
  if (m.last_gemms) {
    for (int q = 0; q < m.last_world; ++q) {
      const std::string what = fmt::format("moe_ep: slab {} ", q);
      kernels::check_grouped_gemm_status(m.flags_ptr + status_index(q, false), s, (what + "gate/up GEMM").c_str());
      kernels::check_grouped_gemm_status(m.flags_ptr + status_index(q, true), s, (what + "down GEMM").c_str());
    }
  }
}

}  // namespace tessera::ops
