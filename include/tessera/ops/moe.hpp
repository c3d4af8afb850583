// tessera/ops/moe.hpp — the tensor-parallel Mixture-of-Experts layer
// (TileLink's MoE workload): tokens sequence-sharded over R ranks, each
// expert's intermediate dimension I sharded over the same ranks.
//
//   ops::MoeContext ctx(pg);
//   ops::moe_tp(ctx, args);   // out_shard = RS(combine(down(SwiGLU(gate_up(gather(AG(x)))))))
//
// The layer, per call, on pg.stream():
//   1. all-gather the token shards x and their routing (expert ids and gate
//      weights of the rank's own tokens, from kernels::moe::topk_gating or
//      the caller);
//   2. sort the routed (token, slot) entries by expert on the GPU
//      (kernels::moe::permute: counts and offsets stay on the device);
//   3. gather the rows per expert, grouped GEMM with the gate/up weights and
//      SiLU(gate)·up fused in the epilogue, grouped GEMM with the down
//      weights (kernels::grouped_gemm);
//   4. top-k weighted combine into the layer's partial output, then
//      reduce-scatter it to the token shards.
// The host never learns the routing counts: nothing synchronizes inside a
// call. check_status() reports, after the stream has reached it, an invalid
// expert id or a routing table the grouped GEMM refused.
//
// Strategies (ops::Strategy codes from the strategy table, OpKind::moe_tp;
// docs/design/moe_tp.md):
//   sequential: the steps above in order on pg.stream(), NCCL collectives
//     on the group's communicator, every GEMM on all SMs.
//   pipelined: the routed entries ordered by (source shard, expert): shard
//     s's entries fill the sorted rows [s·T_l·k, (s+1)·T_l·k) (a size the
//     host knows), expert-major, so each shard's grouped GEMMs start as soon
//     as that shard has arrived. Transfers run on pg.comm_stream(0),
//     either as copy-engine pushes into the peer's symmetric buffers, each
//     followed by a flag the receiving stream waits on
//     (MoeTransport::copy_engine, the default where every rank is
//     load/store reachable), or as NCCL send/recv through a split
//     communicator of comm_ctas CTAs (signal::OverlapComm), an event per
//     step (MoeTransport::nccl; inside a CUDA-graph capture):
//       part 1: step d = 1..R-1 sends the own tokens and their routing to
//         r+d and receives shard r-d's; gate/up runs own
//         shard first (beside the transfers), then r-1, r-2, ...;
//       part 2: down + combine per shard in owner order r+1, r+2, ..., own
//         last, in column chunks of hidden (rs_chunks); each chunk of shard
//         r+d's partial is sent to r+d (step d) as soon as it is combined,
//         while the next chunk computes; the own shard's combine adds the
//         R-1 received partials (f32), chunk by chunk as they arrive, and
//         writes out_shard.
//     With NCCL, GEMMs that run beside a transfer leave comm_ctas SMs free.
//   automatic: the ops tuner's choice (tuner.hpp) between sequential and
//     pipelined for the shape: measured on first use (both strategies run,
//     max over ranks; pipelined must win by the tuner's margin), cached on
//     disk; sequential at R = 1 and inside a CUDA-graph capture.
// The tuner times the routing of the call that tunes; the choice is then
// kept for the shape (the host never sees the routing of later calls).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "tessera/ops/args.hpp"
#include "tessera/ops/tuner.hpp"
#include "tessera/runtime/dtype.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::ops {

struct MoeTpArgs {
  const void* x_shard = nullptr;             ///< [tokens_local, hidden], packed
  const std::int32_t* expert_ids = nullptr;  ///< [tokens_local, topk]: routing of this rank's tokens
  const float* weights = nullptr;            ///< [tokens_local, topk]: their gate weights
  /// [experts, 2 * inter_local, hidden] (nn.Linear layout per expert): row
  /// 2j is gate column j of this rank's shard, row 2j + 1 the matching up.
  const void* w_gate_up = nullptr;
  const void* w_down = nullptr;  ///< [experts, hidden, inter_local]
  void* out_shard = nullptr;     ///< [tokens_local, hidden], packed
  std::int64_t tokens_local = 0;
  std::int64_t hidden = 0;
  std::int64_t inter_local = 0;  ///< I / R
  int experts = 0;
  int topk = 0;
  DType dtype = DType::bf16;  ///< bf16 (the grouped GEMM's plain entry point)
};

/// Throws tessera::Error naming the argument unless `a` is a call the layer
/// accepts on `world` ranks (checked on the host, before any launch).
void validate(const MoeTpArgs& a, int world);

/// How the pipelined TP MoE layer moves tokens and partials between ranks.
enum class MoeTransport {
  automatic,    ///< copy_engine where every rank is load/store reachable and no graph is captured, else nccl
  nccl,         ///< NCCL send/recv on a split communicator of comm_ctas CTAs (capturable)
  copy_engine,  ///< copy-engine pushes into symmetric buffers, stream flags per step and chunk (no SM taken)
};

struct MoeTpOptions {
  /// automatic, sequential or pipelined (accepts(OpKind::moe_tp, s)).
  Strategy strategy = Strategy::automatic;
  /// pipelined: CTAs of the split communicator's kernels, and the SMs the
  /// GEMMs beside them leave free. Part of the cross-rank check.
  int comm_ctas = 16;
  /// pipelined: column chunks of part 2 (down GEMM, combine and partial
  /// send per chunk of hidden, so a chunk's send runs beside the next
  /// chunk's GEMM). 0 = moe_rs_chunks' choice for the transport; else it must
  /// divide hidden into multiples of 8 columns. Part of the cross-rank check.
  int rs_chunks = 0;
  /// pipelined: the transport (resolved per call; part of the cross-rank
  /// check). copy_engine needs lsa_reachable() and no stream capture.
  MoeTransport transport = MoeTransport::automatic;
  /// Every strategy: the gate/up GEMM reads each routed row straight from
  /// the tokens (its loads gather through the sort's entry table); false: a
  /// gather kernel writes the sorted rows first. Local to each rank.
  bool fused_gather = true;
  bool use_cache = true;     ///< automatic: read/write the on-disk choice cache
  bool tune_on_miss = true;  ///< automatic: measure an unseen shape (else a neighbour's choice or sequential)
};

/// Throws tessera::Error unless `o` is valid for a group of `world` ranks
/// with `sms` SMs (strategy taken by moe_tp, comm_ctas in [1, min(64, sms - 1)]).
void validate(const MoeTpOptions& o, int sms);

class MoeContext {
 public:
  explicit MoeContext(runtime::ProcessGroup& pg);
  ~MoeContext();
  MoeContext(const MoeContext&) = delete;
  MoeContext& operator=(const MoeContext&) = delete;

  runtime::ProcessGroup& group() const { return *pg_; }

  /// Synchronizes pg.stream() and throws tessera::Error if the last call
  /// met an expert id outside [0, experts) (those entries were left out) or
  /// a routing table the grouped GEMM refused (nothing was computed then).
  void check_status();

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  runtime::ProcessGroup* pg_;
  std::unique_ptr<Impl> impl_;
};

/// The TP MoE layer (see the header comment). Collective: every rank calls
/// it with the same shapes and options; stream-ordered on the group's stream.
void moe_tp(MoeContext& ctx, const MoeTpArgs& a, const MoeTpOptions& o = {});

/// The strategy moe_tp runs for `a` under `o` (automatic: tunes on a miss,
/// which runs the layer and synchronizes; collective). `report` (optional)
/// receives the tuner's times.
Strategy resolve_moe_tp(MoeContext& ctx, const MoeTpArgs& a, const MoeTpOptions& o = {}, TuneReport* report = nullptr);

}  // namespace tessera::ops
