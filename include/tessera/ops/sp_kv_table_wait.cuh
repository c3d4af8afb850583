// tessera/ops/sp_kv_table_wait.cuh — the table wait, fused sp_attention's
// KV hook where its chunks are at least a KV block (sp_attention.hpp; both
// layouts): the attention kernel's producer waits, before each KV block,
// for the flags a host-made table (sp_kv_flag_table) names for that
// (KV head, block).
//
// The hook is slim because its code changes how ptxas schedules the
// consumer warpgroups (docs/design/waits.md): under the producer's
// 24-register budget, a timer, a WaitRecord, a division, a memo or a block
// order in the waiter reschedules the consumers' wgmma and softmax code and
// costs the kernel 1.5-3.5 %. So the waiter only loads its table entry and
// spins: no timer, no record, no state (the stateless form: a proxy fence
// per block). The host owns the timeout: the call notes every flag it waits
// for as a host wait (runtime::Signals::note_host_wait), and a bounded
// synchronize that times out stores the expected values, so the kernel
// drains, and names the flags that were short. A poll budget traps as a last
// resort for a caller that never synchronizes through Tessera.
#pragma once

#include <cstdint>

#include "tessera/kernels/attention/kv_wait.cuh"
#include "tessera/link/memory_order.cuh"

namespace tessera::ops {

/// Nanoseconds a table wait sleeps between polls: a landed chunk is seen
/// within about a microsecond, and the poll budget counts in these units.
inline constexpr unsigned kSpKvPollSleepNs = 1024;

struct SpKvTableWait {
  static constexpr bool kActive = true;
  /// This rank's per-source flag rows (runtime::SignalView::flag_from(0, 0)).
  const std::uint64_t* flags;
  /// [heads_kv][n_blocks] pairs of flag indices + 1 (0: none), from
  /// sp_kv_flag_table: a block covers at most two chunks (or shards).
  const int2* flags_of_block;
  int n_blocks;         ///< entries per KV head: blocks of the whole sequence (any launch reads a prefix)
  unsigned polls;       ///< polls per flag before the trap (>= 1)
  std::uint32_t epoch;  ///< the call's epoch, low 32 bits

  /// Whether flag `index` is short of the epoch. Its low word against a
  /// 32-bit epoch, wrap-safe (a flag never lags 2^31 calls): a 64-bit
  /// epoch held across the spin costs the producer two registers, which
  /// reschedules the consumers as much as a timer does.
  __device__ __forceinline__ bool short_of_epoch(int index) const {
    const auto* low = reinterpret_cast<const std::uint32_t*>(flags + index);  // little-endian
    return static_cast<std::int32_t>(link::mo::ld_acquire_sys(low) - epoch) < 0;
  }
  __device__ __forceinline__ void spin(int index) const {
    unsigned left = polls;
    while (short_of_epoch(index)) {
      if (--left == 0) __trap();
      __nanosleep(kSpKvPollSleepNs);
    }
  }
  __device__ __forceinline__ void wait(const kernels::attn::KvBlockInfo& b) const {
    const int2 f = flags_of_block[b.head_kv * n_blocks + b.block];
    if (f.x != 0) spin(f.x - 1);
    if (f.y != 0) spin(f.y - 1);
  }
};

}  // namespace tessera::ops
