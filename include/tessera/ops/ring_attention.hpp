// tessera/ops/ring_attention.hpp — ring (context-parallel) attention over
// the zig-zag shards of sp_attention.hpp: rank r holds global chunks r and
// 2R-1-r of Q, K, V (C = S / (2R) tokens each; local rows [0, C), [C, 2C)).
//
// Known defect: at R = 2 on GPUs its test (tests/ops/ring_attention_gpu_test)
// did not pass — rank 0 timed out in the first call, rank 1 crashed — while
// the one-GPU test with emulated ranks passes. NCCL receives now land in
// local scratch instead of the symmetric window: a suspect, not a proven
// cause (all-gathers into a window do run), and not run on GPUs yet. Do not
// rely on it before its GPU test passes.
//
// R steps. At step j rank r holds the KV shard of rank (r + j) mod R (its
// own at j = 0) and attends its two Q chunks to it; meanwhile it forwards
// that shard to rank r - 1, which needs it at step j + 1. The partial
// results (O_j, LSE_j) merge into a float32 running (O, LSE) through the
// log-sum-exp (kernels/attention_merge.hpp); the output is rounded once.
//
// Causal work per step, from the global chunk indices (a KV chunk after a Q
// chunk is skipped, an earlier one is full, the same one is the diagonal):
//   j = 0 (own shard): the shard's local order is the global order, so one
//     causal call, 2C x 2C with q_offset 0;
//   owner o < r: both Q chunks see chunk o only: 2C rows x C keys, full;
//   owner o > r: Q chunk 2R-1-r sees both KV chunks, Q chunk r none:
//     C rows x 2C keys, full.
// Every rank does the same work (2C² pairs per step after the first).
//
// Strategies (both produce the same result up to the merge order, and mix
// freely call after call):
//   sequential: per step, an NCCL send / recv of the held shard into the
//     other slot, then the step's attention and merge on the compute stream.
//     No flags: it is the correctness reference.
//   overlapped: the next shard moves while the step computes. Where every
//     rank is load/store reachable, on the copy engine: per step j < R-1, on
//     the communication stream, wait for shard j to be here (data flag),
//     wait until rank r-1 freed the slot it will receive into (control
//     flag), copy the shard into that slot of rank r-1's double-buffered
//     workspace (link::rank_copy_data), notify (link::rank_notify); the
//     compute stream waits for shard j's data flag (link::rank_wait), runs
//     the step, and after the step (and the forward of the slot) tells rank
//     r+1 that the slot is free again. Otherwise (no symmetric memory) the
//     NCCL send / recv of step j runs on the communication stream during
//     step j, ordered by events (its receive slot was read by step j-1).
// Flag values are stamps e·(R+1) + j of the call's epoch e and the step j
// (j = R: the call is over), so they only grow, across calls and steps.
// Every call on R > 1 ranks with symmetric memory ends with the stamp
// e·(R+1) + R on the compute stream, after all of its pushes: the next
// call's first two pushes into a slot wait for it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/ops/sp_attention.hpp"
#include "tessera/runtime/dtype.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::ops {

struct RingAttnPlan {
  int rank = 0, world = 1;
  std::int64_t seq = 0, chunk = 0;
  bool causal = false;
  int chunks[2] = {0, 0};  ///< this rank's global Q chunks (local rows [0, C), [C, 2C))
  int send_to = 0;         ///< rank r - 1: receives the shard held at each step
  int recv_from = 0;       ///< rank r + 1: sends the next one

  /// Step j: local Q rows [row0, row0 + rows) against KV rows [0, kv_len)
  /// of the shard of rank `owner` (its local order); causal: the diagonal
  /// (query row i of the shard attends key row <= i).
  struct Step {
    int owner = 0;
    std::int64_t row0 = 0, rows = 0, kv_len = 0;
    bool causal = false;
  };
  std::vector<Step> steps;

  /// Admitted (query, key) pairs of all steps.
  std::int64_t pairs() const;
};

/// Throws tessera::Error unless world >= 1, 0 <= rank < world and seq is a
/// positive multiple of 2·world.
RingAttnPlan plan_ring_attention(std::int64_t seq, int world, int rank, bool causal);

/// The arguments are sp_attention's (SpAttnArgs): shards [batch, 2C, heads,
/// head_dim] packed, LSE [batch, heads_q, 2C] float32 or null.
using RingAttnArgs = SpAttnArgs;

enum class RingStrategy { sequential, overlapped };

/// Per process group: the double-buffered KV workspace (symmetric where the
/// ranks are load/store reachable), the float32 accumulator, flags, epochs.
class RingAttnContext {
 public:
  explicit RingAttnContext(runtime::ProcessGroup& pg);
  ~RingAttnContext();
  RingAttnContext(const RingAttnContext&) = delete;
  RingAttnContext& operator=(const RingAttnContext&) = delete;
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

/// Device memory a call of this shape needs per rank beyond its inputs and
/// outputs (workspace slots, accumulator, partial result), in bytes.
std::size_t ring_attention_workspace_bytes(const RingAttnArgs& a, int world);

/// Ring attention over the zig-zag shards. Collective, stream-ordered on
/// pg.stream(). Bad input (seq, dtype, head_dim, GQA divisibility, shapes
/// that differ between ranks) throws tessera::Error before any launch, and
/// so does a call inside a CUDA-graph capture (the flags carry a per-call
/// epoch).
void ring_attention(RingAttnContext& ctx, const RingAttnArgs& a, RingStrategy s = RingStrategy::overlapped);

}  // namespace tessera::ops
