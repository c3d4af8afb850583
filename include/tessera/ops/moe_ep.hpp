// tessera/ops/moe_ep.hpp — the expert-parallel Mixture-of-Experts layer:
// E experts distributed over R ranks (rank r owns experts [r·E/R,
// (r+1)·E/R), each with its full intermediate size I), tokens sharded over
// the ranks, each rank holding its own tokens' routing.
//
//   ops::MoeEpContext ctx(pg);
//   ops::moe_ep(ctx, args);   // out_shard = combine(A2A⁻¹(experts(A2A(x))))
//   ctx.check_status();       // invalid ids, capacity overflow (syncs)
//
// Per call, on pg.stream():
//   1. routing on the GPU: the rank's (token, slot) entries sorted by expert
//      (kernels::moe::permute), which is also by destination rank; the slab
//      layout (kernels::moe::block_layout) and the rows copied into one send
//      slab per destination (kernels::moe::scatter_rows). Counts stay on
//      the device.
//   2. dispatch: per peer, NCCL send/recv of the per-expert row counts (E/R
//      int32) and of a slab of `capacity` rows. NCCL needs sizes on the
//      host, and the host never learns the counts, so every slab travels
//      whole: a rank sends ·capacity rows whatever the routing. The
//      trade-off is the caller's: capacity = tokens_local·topk (the default)
//      can never overflow but moves R times the average rows; a smaller
//      capacity (e.g. 1.25·tokens_local·topk / R) moves less, and rows
//      beyond it are left out of the output and reported by check_status()
//      (never silently).
//   3. experts: per source rank's slab, the grouped GEMMs over its E/R
//      groups (gate/up with SiLU·up fused, then down; kernels::grouped_gemm
//      reading the received counts from device memory). The slabs are not
//      regrouped: each is already expert-major. The rank's own slab is used
//      in place (never sent).
//   4. combine: the outputs go back per peer as slabs (NCCL send/recv), then
//      the top-k weighted combine (kernels::moe::combine) into out_shard.
//
// Strategies:
//   sequential: the steps in order on pg.stream(), NCCL on the group's
//     communicator, every GEMM on all SMs.
//   pipelined: the sends and receives run on pg.comm_stream(0) through a
//     split communicator limited to comm_ctas CTAs (signal::OverlapComm),
//     one NCCL group per step d = 1..R-1 (send to r+d, receive from r-d), an
//     event after each. What overlaps: the own slab's gate/up GEMM with the
//     dispatch; slab d's GEMMs with the dispatch of slabs > d and the return
//     of slabs < d; the own slab's down GEMM (issued last) with the return
//     of the last slab. GEMMs that run beside communication leave comm_ctas
//     SMs free (at R = 2 the remote slab's GEMMs run alone, on all SMs).
//   automatic: pipelined when R > 1, else sequential (a rule, not measured:
//     at R = 1 there is no communication to hide).
//
// Collective: every rank calls with the same experts, topk, hidden, inter,
// capacity, dtype and strategy (checked before any launch); tokens_local may
// differ between ranks when capacity is given.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "tessera/ops/moe.hpp"
#include "tessera/runtime/dtype.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::ops {

struct MoeEpArgs {
  const void* x_shard = nullptr;             ///< [tokens_local, hidden], packed
  const std::int32_t* expert_ids = nullptr;  ///< [tokens_local, topk]: global expert ids in [0, experts)
  const float* weights = nullptr;            ///< [tokens_local, topk]: their gate weights
  /// [experts / R, 2 * inter, hidden]: this rank's experts (nn.Linear layout
  /// per expert); row 2j is gate column j, row 2j + 1 the matching up.
  const void* w_gate_up = nullptr;
  const void* w_down = nullptr;  ///< [experts / R, hidden, inter]
  void* out_shard = nullptr;     ///< [tokens_local, hidden], packed
  std::int64_t tokens_local = 0;
  std::int64_t hidden = 0;
  std::int64_t inter = 0;  ///< each expert's full intermediate size I
  int experts = 0;         ///< E, a multiple of the world size
  int topk = 0;
  /// Rows a rank may send to each rank (itself included) per call: the slab
  /// size of the dispatch and the return. 0 = tokens_local * topk (no
  /// overflow possible; needs the same tokens_local on every rank).
  std::int64_t capacity = 0;
  DType dtype = DType::bf16;  ///< bf16 (the grouped GEMM's plain entry point)
};

/// moe_ep's strategies are the strategy table's (args.hpp) that it accepts:
/// automatic, sequential, pipelined (accepts(OpKind::moe_ep, s)).
using MoeEpStrategy = Strategy;
/// strategy_name(s).
std::string_view moe_ep_strategy_name(MoeEpStrategy s);
/// parse_strategy(name), which moe_ep must accept; throws tessera::Error.
MoeEpStrategy parse_moe_ep_strategy(std::string_view name);

struct MoeEpOptions {
  MoeEpStrategy strategy = MoeEpStrategy::automatic;
  /// pipelined: CTAs of the split communicator's kernels, and the SMs the
  /// GEMMs beside them leave free. Part of the cross-rank check.
  int comm_ctas = 16;
  /// pipelined: how slabs travel (MoeTransport, as moe_tp's): copy-engine
  /// pushes into the peers' symmetric slabs with a flag per step, or NCCL
  /// send/recv on the split communicator. automatic: copy_engine where every
  /// rank is load/store reachable and no graph is captured. Part of the
  /// cross-rank check.
  MoeTransport transport = MoeTransport::automatic;
};

/// The capacity a call uses: a.capacity, or tokens_local * topk when 0.
std::int64_t moe_ep_capacity(const MoeEpArgs& a);

/// Throws tessera::Error naming the argument unless `a` is a call the layer
/// accepts on `world` ranks (checked on the host, before any launch).
void validate(const MoeEpArgs& a, int world);

class MoeEpContext {
 public:
  explicit MoeEpContext(runtime::ProcessGroup& pg);
  ~MoeEpContext();
  MoeEpContext(const MoeEpContext&) = delete;
  MoeEpContext& operator=(const MoeEpContext&) = delete;

  runtime::ProcessGroup& group() const { return *pg_; }

  /// Synchronizes pg.stream() (bounded) and throws tessera::Error if the
  /// last call met an expert id outside [0, experts) or routed more rows to
  /// a rank than the capacity (both left out of the output, and counted in
  /// the message), or if a grouped GEMM refused its row table.
  void check_status();

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  runtime::ProcessGroup* pg_;
  std::unique_ptr<Impl> impl_;
};

/// The EP MoE layer (see the header comment). Collective, stream-ordered on
/// the group's stream; nothing synchronizes with the host inside a call.
void moe_ep(MoeEpContext& ctx, const MoeEpArgs& a, const MoeEpOptions& o = {});

}  // namespace tessera::ops
