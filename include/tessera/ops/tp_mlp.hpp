// tessera/ops/tp_mlp.hpp — overlapped tensor-parallel MLP operators.
//
//   ops::TpContext ctx(pg);                 // per process group; owns workspaces
//   ops::ag_gemm(ctx, ag_args);             // AllGather(A) · Bᵀ   (column parallel)
//   ops::gemm_rs(ctx, rs_args);             // ReduceScatter(A · Bᵀ) (row parallel)
//   ops::gemm_ar(ctx, ar_args);             // AllReduce(A · Bᵀ)     (row parallel, no SP)
//   ops::mlp(ctx, mlp_args);                // both, with SiLU(gate)·up between
//
// Every call is collective (all ranks, same shapes, same order) and
// stream-ordered on pg.stream(): inputs must be ready on that stream, outputs
// are ready on it when the call returns to the host (no host sync inside,
// except the first call of a new shape: validation across ranks, workspace
// growth and, with Strategy::automatic, the tuner's measurements).
//
// Back-to-back calls need no reset: flags carry epochs, reduce counters are
// consumed by the owner, and a rank pushes into a peer's workspace only after
// that peer announced (kAgFree / kRsFree, one flag per call) that it is done
// with the previous call's data.
//
// Limits: world <= 16; Hopper (sm_90a) for the fused strategies; waits on
// device time out after TESSERA_WAIT_TIMEOUT_MS and trap (the next
// synchronize reports it). Every strategy but sequential needs all ranks
// load/store reachable (NVLink/P2P). When they are not (other nodes, no
// peer access, or TESSERA_NO_LSA=1 / TESSERA_TOPOLOGY=net), the context
// allocates no symmetric memory, sequential (NCCL) runs, automatic resolves
// to it without measuring, and any other strategy is refused with an Error.
// Host waits inside (workspace growth, tuning, teardown) are bounded: a dead
// or stopped peer gives an Error naming the rank and the operation, and the
// process group is aborted (ncclCommAbort); the context is then unusable.
// Callers wait for the operators' results with pg.synchronize(pg.stream(),
// what) — bounded the same way — rather than cudaStreamSynchronize, which
// would wait forever for a peer that died inside a collective.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "tessera/ops/args.hpp"
#include "tessera/ops/diag.hpp"
#include "tessera/ops/plan.hpp"
#include "tessera/ops/tuner.hpp"
#include "tessera/runtime/process_group.hpp"
#include "tessera/runtime/signals.hpp"
#include "tessera/runtime/symmetric_heap.hpp"
#include "tessera/tune/key.hpp"

namespace tessera::ops {

/// Where fused GEMM+RS adds the peers' partials into this rank's rows.
///  epilogue — in the epilogue of its own tiles (computed last, after the
///             peers computed and stored this rank's rows first): the
///             producer waits per tile for R−1 peer notifications, the
///             consumers add the peers' slabs to the f32 accumulator in rank
///             order and store the result; no reduce kernel, the GEMM keeps
///             every SM. Needs shard boundaries on tile rows
///             (ceil(M/R) % kRsFusedTileRows == 0); otherwise `kernel` is used.
///  kernel   — every partial (own included) goes to the owner's slabs; a
///             reduce kernel on comm_ctas SMs sums them as tile rows complete.
enum class RsReduce : int { epilogue = 0, kernel = 1 };
std::string_view rs_reduce_name(RsReduce r);

struct OpOptions {
  Strategy strategy = Strategy::automatic;
  int channels = 4;       ///< AG: channels (flags) per shard
  int comm_ctas = 16;     ///< fused_sm: CTAs that push; fused RS (kernel): CTAs that reduce
  bool use_cache = true;  ///< automatic: read/write the on-disk choice cache
  /// automatic, for a shape never measured: true measures the candidates now
  /// (collective: every rank runs each several times); false reuses the
  /// nearest measured shape's choice, or sequential (ops/tuner.hpp).
  bool tune_on_miss = true;
  RsReduce rs_reduce = RsReduce::epilogue;  ///< fused GEMM+RS only
  /// Diagnostics only (bench mlp's cost breakdown), fused_ce only: launch the
  /// fused kernel with no communication — no copies, no flags, and the
  /// previous call's epoch, whose waits are already satisfied — so its time
  /// is the kernel's own cost. The output is NOT the operator's result (it
  /// uses the previous call's remote data). Collective like any call; needs
  /// one normal fused_ce call of the same operator before it.
  bool diag_kernel_only = false;
  /// Diagnostics only, with diag_kernel_only on gemm_rs fused_ce: leave parts
  /// of the kernel's work out, so bench mlp can time each by difference
  /// (DiagSkip bits, ops/diag.hpp). With kDiagSkipOwnerAdd the output is wrong (the own
  /// tiles store only this rank's partial); the others change no data, since
  /// the replayed epoch's flags are already set. Later normal calls are
  /// unaffected.
  unsigned diag_skip = 0;
};

class TpContext {
 public:
  explicit TpContext(runtime::ProcessGroup& pg);
  ~TpContext();
  TpContext(const TpContext&) = delete;
  TpContext& operator=(const TpContext&) = delete;

  runtime::ProcessGroup& group() const { return *pg_; }
  tune::MachineId machine() const;

  /// The strategy `automatic` resolves to for this call (tuning if needed).
  /// Collective. `report` (optional) receives the measurements.
  Strategy resolve(const AgGemmArgs& a, const OpOptions& o, TuneReport* report = nullptr);
  Strategy resolve(const GemmRsArgs& a, const OpOptions& o, TuneReport* report = nullptr);
  Strategy resolve(const GemmArArgs& a, const OpOptions& o, TuneReport* report = nullptr);
  /// The halves' strategies mlp() runs for this call: each half's own
  /// choice, or both sequential where the layer check says so (see mlp()).
  /// Collective; may launch the layer (tuning).
  std::pair<Strategy, Strategy> resolve(const MlpArgs& a, const OpOptions& ag, const OpOptions& rs);

  // ---- internals used by the operator implementations ----------------------
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  runtime::ProcessGroup* pg_;
  std::unique_ptr<Impl> impl_;
};

/// AllGather + GEMM. See AgGemmArgs.
void ag_gemm(TpContext& ctx, const AgGemmArgs& a, const OpOptions& o = {});
/// GEMM + ReduceScatter. See GemmRsArgs.
void gemm_rs(TpContext& ctx, const GemmRsArgs& a, const OpOptions& o = {});
/// GEMM + AllReduce. See GemmArArgs. Strategies: sequential, fused_ce
/// (needs ceil(M/R) a multiple of kRsFusedTileRows), automatic (the tuner
/// measures both; ragged shards get sequential).
void gemm_ar(TpContext& ctx, const GemmArArgs& a, const OpOptions& o = {});
/// Whole MLP: ag_gemm (fused gate/up, SiLU·up epilogue) then gemm_rs.
/// `ag` / `rs` choose the halves' strategies. With both automatic, the
/// halves' choices (each measured alone) give way to both halves
/// sequential where the whole layer measured faster that way (once per
/// shape and pair, by the tuner's paired rule, cached under
/// "ops.mlp_layer"; without tuning, a measured neighbour's verdict or the
/// halves' choices).
void mlp(TpContext& ctx, const MlpArgs& a, const OpOptions& ag = {}, const OpOptions& rs = {});

}  // namespace tessera::ops
