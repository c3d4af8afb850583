// Private to the MoE operators (moe_tp/, moe_ep/): their grow-only
// device buffers (scratch.hpp), the checks their validation shares, and
// the communicator their pipelined strategies send and receive on.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "scratch.hpp"
#include "tessera/ops/moe.hpp"
#include "tessera/runtime/dtype.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"
#include "tessera/signal/overlap_comm.hpp"

namespace tessera::ops::detail {

/// Dimensions the MoE kernels index with int32 or pass to the grouped GEMM.
constexpr std::int64_t kMoeMaxDim = std::int64_t{1} << 31;

/// The checks both MoE layers make of their common sizes; `op` names the
/// layer and `inter_name` its intermediate size's argument in messages.
inline void validate_moe_sizes(const char* op, int world, DType dtype, std::int64_t tokens_local, std::int64_t hidden,
                               const char* inter_name, std::int64_t inter, int experts, int max_experts, int topk,
                               int max_topk) {
  TESSERA_CHECK(world >= 1, "{}: world = {} must be >= 1", op, world);
  TESSERA_CHECK(dtype == DType::bf16, "{}: dtype {} not supported (bf16)", op, dtype_name(dtype));
  TESSERA_CHECK(tokens_local >= 0 && tokens_local < kMoeMaxDim, "{}: tokens_local = {} out of range [0, 2^31)", op,
                tokens_local);
  TESSERA_CHECK(hidden >= 8 && hidden < kMoeMaxDim && hidden % 8 == 0,
                "{}: hidden = {} must be a positive multiple of 8 below 2^31", op, hidden);
  TESSERA_CHECK(inter >= 8 && inter < kMoeMaxDim && inter % 8 == 0,
                "{}: {} = {} must be a positive multiple of 8 below 2^31", op, inter_name, inter);
  TESSERA_CHECK(experts >= 1 && experts <= max_experts, "{}: experts = {} out of range [1, {}]", op, experts,
                max_experts);
  TESSERA_CHECK(topk >= 1 && topk <= max_topk && topk <= experts,
                "{}: topk = {} out of range [1, min({}, experts = {})]", op, topk, max_topk, experts);
}

/// The pointer checks both MoE layers need, each naming its argument: the
/// matrices non-null and 16-byte aligned (the grouped GEMM's TMA and the
/// row kernels' vector loads), the routing non-null and aligned to its
/// 4-byte elements.
inline void validate_moe_pointers(const char* op, const void* x_shard, const std::int32_t* expert_ids,
                                  const float* weights, const void* w_gate_up, const void* w_down,
                                  const void* out_shard) {
  const auto addr = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  for (const auto& [name, p] : {std::pair{"x_shard", x_shard}, std::pair{"w_gate_up", w_gate_up},
                                std::pair{"w_down", w_down}, std::pair{"out_shard", out_shard}}) {
    TESSERA_CHECK(p != nullptr, "{}: {} is null", op, name);
    TESSERA_CHECK(addr(p) % 16 == 0, "{}: {} = {} is not 16-byte aligned", op, name, p);
  }
  TESSERA_CHECK(expert_ids != nullptr, "{}: expert_ids is null", op);
  TESSERA_CHECK(addr(expert_ids) % alignof(std::int32_t) == 0, "{}: expert_ids = {} is not 4-byte aligned", op,
                static_cast<const void*>(expert_ids));
  TESSERA_CHECK(weights != nullptr, "{}: weights is null", op);
  TESSERA_CHECK(addr(weights) % alignof(float) == 0, "{}: weights = {} is not 4-byte aligned", op,
                static_cast<const void*>(weights));
}

/// A transport value MoeTransport defines (a C++ caller's cast of another
/// value would otherwise run as NCCL in one place and the copy engine in
/// another).
inline void validate_moe_transport(const char* op, MoeTransport t) {
  TESSERA_CHECK(t == MoeTransport::automatic || t == MoeTransport::nccl || t == MoeTransport::copy_engine,
                "{}: transport code {} (automatic 0, nccl 1 or copy_engine 2)", op, static_cast<int>(t));
}

/// The MoE layers' scratch: growth waits for pg.stream() (both layers join
/// their communication stream into it before returning).
class Scratch : public ScratchBuffer {
 public:
  Scratch() : ScratchBuffer("moe: workspace growth") {}
};

/// The pipelined MoE strategies' communicator: a split of the group's with
/// at most `ctas` CTAs per NCCL kernel (signal::OverlapComm), so the grouped
/// GEMMs beside a transfer keep the other SMs. ensure() is collective (every
/// rank's first pipelined call, or a new ctas): it splits, then connects every
/// peer both ways once, so no connection is set up inside a timed call.
struct PipelineComm {
  std::unique_ptr<signal::OverlapComm> comm;
  int ctas = 0;
  Scratch warm;  ///< the warm-up exchange's four int32

  bool ready(int want_ctas) const { return comm && ctas == want_ctas; }
  ncclComm_t get() const { return comm->get(); }

  void ensure(runtime::ProcessGroup& pg, int want_ctas, const char* op) {
    if (ready(want_ctas)) return;
    pg.synchronize_all(op);  // nothing of ours in flight on the old one
    comm.reset();
    signal::OverlapCommConfig cfg;
    cfg.max_ctas = want_ctas;
    comm = std::make_unique<signal::OverlapComm>(pg.nccl(), cfg);
    ctas = want_ctas;
    const int R = pg.world();
    std::int32_t* w = warm.get<std::int32_t>(4, pg);
    const cudaStream_t cs = pg.comm_stream(0);
    for (int d = 1; d < R; ++d) {
      const int to = (pg.rank() + d) % R, from = (pg.rank() - d + R) % R;
      TESSERA_NCCL_CHECK(ncclGroupStart());
      TESSERA_NCCL_CHECK(ncclSend(w, 1, ncclInt32, to, comm->get(), cs));
      TESSERA_NCCL_CHECK(ncclRecv(w + 1, 1, ncclInt32, from, comm->get(), cs));
      TESSERA_NCCL_CHECK(ncclSend(w + 2, 1, ncclInt32, from, comm->get(), cs));
      TESSERA_NCCL_CHECK(ncclRecv(w + 3, 1, ncclInt32, to, comm->get(), cs));
      TESSERA_NCCL_CHECK(ncclGroupEnd());
    }
    pg.synchronize(cs, op);
  }
};

}  // namespace tessera::ops::detail
