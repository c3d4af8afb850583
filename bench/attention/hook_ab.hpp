// bench attention --hook-ab: the kernel with hooks that never wait
// (hook_ab.cu), callable from the bench's host code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/kernels/attention.hpp"

namespace tessera::bench::attention {

enum class HookVariant {
  config_only,        ///< the hooked configuration (waiter ring barriers) with no hook
  hand_over,          ///< an active hook that acquires nothing: the ring's hand-over per block
  acquire_gpu,        ///< one ld.acquire.gpu of a set flag per CTA, no proxy fence
  acquire_sys,        ///< one ld.acquire.sys of a set flag per CTA, no proxy fence
  acquire_sys_fence,  ///< one ld.acquire.sys per CTA, then the proxy fence (sp_attention's per owner)
  fence_first,        ///< the proxy fence once per CTA, no load
  fence_every,        ///< the proxy fence at every block, no load
  params_padded,      ///< hand_over with two more tensor maps in the hook (parameter size)
  timed_acquire,      ///< the engine's timed wait (timeout, trap path) on one set sys flag per CTA
  polled_acquire,     ///< one acquire spin per CTA bounded by a poll count (no timer read)
  sp_like,            ///< sp_attention's per-block chunk walk and timed acquire (R = 2, rank 0)
  sp_slim,            ///< the slim candidate: flag per block from a table, abort-word spin (R = 2, rank 0)
  sp_slim_full,       ///< sp_slim with sp_attention's arrival order and in-place own chunks
  flags_set,          ///< the engine's flag wait (KvFlagWait) on flags already set
  sp_shard,           ///< sp_attention's shard-layout wait (ops::SpKvTableWait), its table at R = 2, rank 0
};

/// Key rows per flag of the flags_set variant. The caller's flag array holds
/// max(ceil(seqlen_k / kHookAbRowsPerFlag), 4) 64-bit words, every byte 0x01
/// (each u32 and u64 value >= 1).
inline constexpr int kHookAbRowsPerFlag = 4096;

/// Key rows per KV block of the hooked head-dim-128 kernel (sp_slim's table).
int hook_ab_block_rows();

/// One launch of the head-dim-128 bf16 kernel under hook variant v.
/// sp_slim reads `slim_flags` (abort word 0, then owner flags >= 1) and
/// `owner_table` (per KV block: 0, or the flag index to acquire);
/// sp_slim_full also `order_table` (ops::kv_arrival_order's, R = 2, rank 0);
/// sp_shard reads `set_flags` through `shard_table` (ops::sp_kv_flag_table's, shard layout).
void launch_hook_variant(HookVariant v, const kernels::AttentionArgs& a, const std::uint32_t* set_flags,
                         const std::uint64_t* slim_flags, const std::int32_t* owner_table,
                         const std::int32_t* order_table, const std::int32_t* shard_table, cudaStream_t s);

}  // namespace tessera::bench::attention
