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
// Strategies: sequential (NCCL collectives around the kernels, this file).
// The fused strategy (per-chunk waits of the expert tiles through link's
// dynamic maps, reduce-scatter fused as in gemm_rs) is not built yet.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

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
/// it with the same shapes; stream-ordered on the group's stream.
void moe_tp(MoeContext& ctx, const MoeTpArgs& a);

}  // namespace tessera::ops
