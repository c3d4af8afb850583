// src/ops/sp_attention_kernels.hpp — the attention kernel with sp_attention's
// KV hook (sp_attention_kernels.cu), callable from host .cpp code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/kernels/attention.hpp"
#include "tessera/runtime/host_device.hpp"

namespace tessera::ops::detail {

/// Where the gathered KV chunks' flags are: this rank's peer-flag rows of a
/// Signals object (flag of source s, slot i at flags[s * slots + i]). Chunk c
/// of the zig-zag layout is owned by rank (c < R ? c : 2R-1-c); an owner
/// pushes both its chunks in head_groups pieces, and slot j /
/// heads_per_group publishes KV head j's rows of both.
struct SpKvFlags {
  const std::uint64_t* flags = nullptr;
  int slots = 2;
  int heads_per_group = 1;
  int world = 1, rank = 0;
  std::int64_t chunk = 0;  ///< tokens per chunk (C)
  std::uint64_t epoch = 0;
  /// kv_arrival_order's table on the device, or null for the kernel's
  /// default (descending) visiting order.
  const std::int32_t* order = nullptr;
  /// The rank's own chunks read in place: the caller's K and V shards
  /// [batch, 2 * chunk, heads_kv, head_dim] (element strides own_stride),
  /// holding global rows [own_start[i], own_start[i] + chunk) as their chunk
  /// i. Blocks inside one of them (sp_block_in_own_chunk) load from there;
  /// every other block from the gathered KV, which must then hold the own
  /// rows ops::sp_own_edge_rows names. Null own_k: every block from the gathered KV.
  const void* own_k = nullptr;
  const void* own_v = nullptr;
  kernels::AttnStrides own_stride;
  std::int64_t own_start[2] = {0, 0};
};

/// Whether the KV block of key rows [row0, row0 + rows) lies inside the own
/// chunk of global rows [start, start + chunk): the kernel then reads it in
/// place (SpKvFlags::own_k), host and device alike.
TESSERA_HD constexpr bool sp_block_in_own_chunk(std::int64_t row0, std::int64_t rows, std::int64_t start,
                                                std::int64_t chunk) {
  return row0 >= start && row0 + rows <= start + chunk;
}

/// The flag slot that publishes head group `group` of both the owner's
/// chunks (they land in one copy): the pushes notify it, the kernel's hook
/// waits on it.
TESSERA_HD constexpr int sp_kv_flag_slot(int group) { return group; }

/// The table wait (ops::sp_kv_flag_table, SpKvTableWait): this
/// rank's per-source flag rows, the device copy of the table for the
/// launch's seqlen_k and heads_kv, and the epoch the flags must reach.
struct SpKvTable {
  const std::uint64_t* flags = nullptr;
  const std::int32_t* table = nullptr;
  /// Entries per KV head: the blocks of the whole gathered sequence (S), not
  /// of the launch's seqlen_k (a causal launch reads a prefix).
  int blocks_per_head = 0;
  std::uint64_t epoch = 0;
};

/// kernels::attention(a) over the gathered KV (either layout) whose producer
/// waits before each KV block for the flags f.table names.
/// The waits have no timeout of their own: the caller notes each flag as a
/// host wait (Signals::note_host_wait) so that a bounded synchronize can
/// release them; a poll budget of 2-12 x TESSERA_WAIT_TIMEOUT_MS traps.
void launch_sp_attention_table(const kernels::AttentionArgs& a, const SpKvTable& f, cudaStream_t stream);

/// Rows of the fused kernel's KV blocks for head_dim (kv_arrival_order's block_rows).
int sp_attention_kv_block_rows(int head_dim);

/// kernels::attention(a) whose producer waits, before each KV block, for the
/// flags of every remote chunk the block covers (a.seqlen_k keys of the
/// gathered KV in global order).
void launch_sp_attention_part(const kernels::AttentionArgs& a, const SpKvFlags& f, cudaStream_t stream);

}  // namespace tessera::ops::detail
