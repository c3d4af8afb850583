// tessera/ops/sp_attention.hpp — sequence-parallel attention: the zig-zag
// sharding and the KV all-gather schedule (pure host logic, CPU-tested).
//
// The global sequence of S tokens is cut into 2R chunks of C = S / (2R)
// tokens. Rank r holds chunks r and 2R-1-r of Q, K and V (its shard: local
// rows [0, C) = chunk r, [C, 2C) = chunk 2R-1-r), so under a causal mask
// every rank has the same number of admitted (query, key) pairs
// (C²·(2R-1) + C·(C+1)): the load balance of zig-zag ring / context-parallel
// attention.
//
// K and V are all-gathered in GLOBAL order into each rank's workspace
// [B, S, Hkv, D]: at step j = 1..R-1 rank r pushes its two chunks to rank
// (r - j) mod R (so it receives, at step j, the chunks of rank (r + j) mod R),
// each chunk followed by a flag (its owner's slot 0 or 1, value = epoch).
// The attention kernel visits KV blocks in arrival order (its own chunks
// first) and its producer waits per block for the flags of the chunks the
// block covers (attention/kv_wait.cuh).
//
// Causal: the two local Q chunks are two attention calls, each against the
// gathered-KV prefix it needs: chunk c has q_offset = c·C (its first global
// position) and kv_len = (c+1)·C keys. Non-causal: one call, all 2C rows
// against all S keys.
//
// Status: the plan and the kernel features it needs (q_offset, a KV-prefix
// length, LSE strides, the block order and per-block waits) exist and are
// tested on one GPU (ranks emulated); the multi-GPU operator that pushes the
// chunks (link::rank_copy_data / rank_notify) is not written yet.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera::ops {

struct SpAttnPlan {
  int rank = 0, world = 1;
  std::int64_t seq = 0;    ///< global tokens S
  std::int64_t chunk = 0;  ///< C = S / (2R)
  bool causal = false;
  int chunks[2] = {0, 0};  ///< this rank's global chunks: local rows [0, C), [C, 2C)

  /// One attention call over local Q rows [local_row0, local_row0 + rows)
  /// against the first kv_len keys of the gathered KV (global order).
  struct Part {
    std::int64_t local_row0 = 0, rows = 0;
    std::int64_t q_offset = 0;  ///< causal: the rows' first global position
    std::int64_t kv_len = 0;
  };
  std::vector<Part> parts;

  std::vector<int> push_to;    ///< push_to[j-1]: destination at step j
  std::vector<int> recv_from;  ///< recv_from[j]: whose chunks arrive at step j (j = 0: own)

  /// Owner rank of global chunk c, and which of its two chunks it is (the
  /// flag slot its owner notifies): c < R ? (c, 0) : (2R-1-c, 1).
  static int owner(int c, int world) { return c < world ? c : 2 * world - 1 - c; }
  static int slot(int c, int world) { return c < world ? 0 : 1; }
  /// Global row of local shard row i.
  std::int64_t global_row(std::int64_t i) const { return chunks[i / chunk] * chunk + i % chunk; }
  /// The step at which chunk c is on this rank (0: own).
  int arrival_step(int c) const { return (owner(c, world) - rank + world) % world; }
  /// Admitted (query, key) pairs of this rank's parts.
  std::int64_t pairs() const;
};

/// Throws tessera::Error unless world >= 1, 0 <= rank < world, seq >= 2·world
/// and seq % (2·world) == 0.
SpAttnPlan plan_sp_attention(std::int64_t seq, int world, int rank, bool causal);

}  // namespace tessera::ops
