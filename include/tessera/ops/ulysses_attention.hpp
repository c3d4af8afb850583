// tessera/ops/ulysses_attention.hpp — Ulysses (head-parallel) attention over
// the zig-zag sequence shards of sp_attention.hpp.
//
// An all-to-all turns the sequence shard [B, 2C, H, D] of every rank (all
// heads, its two chunks r and 2R-1-r) into a head shard [B, S, H/R, D] (all
// S tokens in global order, heads [r·H/R, (r+1)·H/R)); K and V likewise with
// Hkv/R heads, so GQA keeps its head mapping. The kernel runs on the whole
// sequence (causal with q_offset 0), and a second all-to-all brings O and
// LSE back to the sequence shards. Each all-to-all is pack copies
// (cudaMemcpy2DAsync: a peer's heads out of the rows), one NCCL group of
// sends and receives, and unpack copies (every peer's two chunks to their
// global rows).
//
// Strategies:
//   sequential: one head group, all on the compute stream.
//   pipelined: the local heads in G groups (G divides Hkv/R); on the
//     communication stream the all-to-all in of group g+1 and the all-to-all
//     out of group g-1 run while the compute stream attends group g (events
//     between the streams; the staging buffers are per group, reused in
//     stream order).
// Requires heads_q % R == 0 and heads_kv % R == 0, checked before launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "tessera/ops/sp_attention.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::ops {

using UlyssesAttnArgs = SpAttnArgs;

enum class UlyssesStrategy { sequential, pipelined };

/// Per process group: the head-shard tensors, the staging buffers, events.
class UlyssesAttnContext {
 public:
  explicit UlyssesAttnContext(runtime::ProcessGroup& pg);
  ~UlyssesAttnContext();
  UlyssesAttnContext(const UlyssesAttnContext&) = delete;
  UlyssesAttnContext& operator=(const UlyssesAttnContext&) = delete;
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

/// The head groups a call uses: `requested` if it divides heads_kv / world
/// (error otherwise), 0 = the largest divisor of heads_kv / world up to 4;
/// sequential always 1. Throws on heads not divisible by world.
int ulysses_head_groups(const UlyssesAttnArgs& a, int world, UlyssesStrategy s, int requested = 0);

/// Device memory a call needs per rank beyond its inputs and outputs (bytes).
std::size_t ulysses_attention_workspace_bytes(const UlyssesAttnArgs& a, int world, int groups);

/// Ulysses attention. Collective, stream-ordered on pg.stream(). Bad input
/// (seq, heads not divisible by the world, dtype, head_dim, head_groups,
/// shapes that differ between ranks) throws tessera::Error before launch;
/// so does a call inside a CUDA-graph capture (not supported yet).
void ulysses_attention(UlyssesAttnContext& ctx, const UlyssesAttnArgs& a,
                       UlyssesStrategy s = UlyssesStrategy::pipelined, int head_groups = 0);

}  // namespace tessera::ops
