// The attention kernel with KV hooks that never wait (bench attention
// --hook-ab): what the hook machinery costs by itself beside the plain
// kernel, part by part — the hooked configuration with no hook, the waiter
// ring handing every block over with nothing to acquire, acquires and proxy
// fences, the engine's flag wait on flags that are already set, replicas of
// sp_attention's hook logic, and the slim candidate for that hook. Each
// variant's consumer schedule in SASS: scripts/sass/schedule.py --object on
// this file's object (docs/design/waits.md).
#include <cuda_bf16.h>

#include <cstdint>

#include "hook_ab.hpp"
#include "slim_hook.cuh"
#include "tessera/kernels/attention/launch.cuh"
#include "tessera/kernels/gemm/prologue.cuh"
#include "tessera/link/memory_order.cuh"
#include "tessera/ops/sp_kv_table_wait.cuh"

namespace tessera::bench::attention {
namespace {

/// Active and stateful, acquires nothing: the waiter and the TMA thread
/// still hand over every block through the ring.
struct HandOverOnly {
  static constexpr bool kActive = true;
  struct State {};
  __device__ __forceinline__ bool wait(const kernels::attn::KvBlockInfo&, State&) const { return false; }
};

/// Once per CTA, at its first block: an acquire load of a set flag at
/// scope kSys (sys or gpu), then (kFence) the kernel's proxy fence.
template <bool kSys, bool kFence>
struct AcquireOnce {
  static constexpr bool kActive = true;
  struct State {
    bool done = false;
  };
  const std::uint32_t* flag;
  __device__ __forceinline__ bool wait(const kernels::attn::KvBlockInfo&, State& s) const {
    if (s.done) return false;
    s.done = true;
    if constexpr (kSys)
      (void)link::mo::ld_acquire_sys(flag);
    else
      (void)link::mo::ld_acquire_gpu(flag);
    return kFence;
  }
};

/// No load: the kernel's proxy fence at the first block only, or at every block.
template <bool kEveryBlock>
struct ProxyFence {
  static constexpr bool kActive = true;
  struct State {
    bool done = false;
  };
  __device__ __forceinline__ bool wait(const kernels::attn::KvBlockInfo&, State& s) const {
    const bool fence = kEveryBlock || !s.done;
    s.done = true;
    return fence;
  }
};

/// The hand-over hook with two more tensor maps in its parameters
/// (sp_attention's hook carries its own chunks' maps).
struct HandOverPadded : HandOverOnly {
  CUtensorMap pad_k, pad_v;
};

/// Once per CTA, through the engine's timed wait (timeout, diagnostic,
/// trap path) on a set 64-bit flag at sys scope, as sp_attention's hook
/// acquires each owner's flag; then the proxy fence.
struct TimedAcquireOnce {
  static constexpr bool kActive = true;
  using State = kernels::engine::FlagMemo;
  kernels::engine::FlagWait<std::uint64_t, true> w;
  __device__ __forceinline__ bool wait(const kernels::attn::KvBlockInfo& b, State& memo) const {
    if (memo.has(0)) return false;
    const kernels::engine::TileInfo t{b.block, 0, b.block, b.row0, 0, b.rows, 1, 1, 1, b.seqlen_k, 1};
    w.wait_one(t, 0);
    memo.mark(0);
    return true;
  }
};

/// Once per CTA, an acquire spin on a set 64-bit sys flag whose only bound
/// is a poll count (trap past it): no timer read anywhere in the kernel.
/// A timer read (globaltimer or clock64) in the waiter makes ptxas schedule
/// the consumers' softmax loop differently from the plain kernel's (SASS),
/// the suspected cost of the timed waits.
struct PolledAcquireOnce {
  static constexpr bool kActive = true;
  struct State {
    bool done = false;
  };
  const std::uint64_t* flag;
  __device__ __forceinline__ bool wait(const kernels::attn::KvBlockInfo&, State& s) const {
    if (s.done) return false;
    s.done = true;
    unsigned polls = 0;
    while (link::mo::ld_acquire_sys(flag) < 1)
      if (++polls > (1u << 30)) __trap();
    return true;
  }
};

/// sp_attention's per-block logic at R = 2, rank 0 (chunks of seqlen_k / 4,
/// owners 0 1 1 0): every block walks the chunks it covers and acquires a
/// peer owner's flag once, through the timed wait.
struct SpLikeWait {
  static constexpr bool kActive = true;
  using State = kernels::engine::FlagMemo;
  kernels::engine::FlagWait<std::uint64_t, true> w;
  int chunk, world, rank;
  __device__ __forceinline__ bool wait(const kernels::attn::KvBlockInfo& b, State& memo) const {
    const int last = min(b.row0 + b.rows, b.seqlen_k) - 1;
    const kernels::engine::TileInfo t{b.block, 0, b.block, b.row0, 0, b.rows, 1, 1, 1, b.seqlen_k, 1};
    bool acquired = false;
    for (int c = b.row0 / chunk; c <= last / chunk; ++c) {
      const int owner = c < world ? c : 2 * world - 1 - c;
      if (owner == rank || memo.has(owner)) continue;
      w.wait_one(t, owner);
      memo.mark(owner);
      acquired = true;
    }
    return acquired;
  }
};

}  // namespace

int hook_ab_block_rows() { return kernels::AttnCfgOf<128, true>::BN; }

void launch_hook_variant(HookVariant v, const kernels::AttentionArgs& a, const std::uint32_t* set_flags,
                         const std::uint64_t* slim_flags, const std::int32_t* owner_table,
                         const std::int32_t* order_table, const std::int32_t* shard_table, cudaStream_t s) {
  using T = __nv_bfloat16;
  switch (v) {
    case HookVariant::config_only:
      kernels::attention_launch<T, 128, kernels::attn::NoKvWait, kernels::AttnCfgOf<128, true>>(
          a, kernels::attn::NoKvWait{}, s);
      return;
    case HookVariant::hand_over:
      kernels::attention_with<T, 128>(a, HandOverOnly{}, s);
      return;
    case HookVariant::acquire_gpu:
      kernels::attention_with<T, 128>(a, AcquireOnce<false, false>{set_flags}, s);
      return;
    case HookVariant::acquire_sys:
      kernels::attention_with<T, 128>(a, AcquireOnce<true, false>{set_flags}, s);
      return;
    case HookVariant::acquire_sys_fence:
      kernels::attention_with<T, 128>(a, AcquireOnce<true, true>{set_flags}, s);
      return;
    case HookVariant::fence_first:
      kernels::attention_with<T, 128>(a, ProxyFence<false>{}, s);
      return;
    case HookVariant::fence_every:
      kernels::attention_with<T, 128>(a, ProxyFence<true>{}, s);
      return;
    case HookVariant::params_padded:
      kernels::attention_with<T, 128>(a, HandOverPadded{}, s);
      return;
    case HookVariant::timed_acquire: {
      TimedAcquireOnce h{};
      h.w.flags = reinterpret_cast<const std::uint64_t*>(set_flags);
      h.w.expected = 1;
      kernels::attention_with<T, 128>(a, h, s);
      return;
    }
    case HookVariant::polled_acquire:
      kernels::attention_with<T, 128>(a, PolledAcquireOnce{reinterpret_cast<const std::uint64_t*>(set_flags)}, s);
      return;
    case HookVariant::sp_slim:
      kernels::attention_with<T, 128>(a, SlimFlagWait{slim_flags, owner_table}, s);
      return;
    case HookVariant::sp_slim_full: {
      SlimHook h{};
      h.flags = slim_flags;
      h.flag_of_block = owner_table;
      h.order = order_table;
      h.chunk = static_cast<int>((a.seqlen_k + 3) / 4);
      h.own_start[0] = 0;
      h.own_start[1] = 3 * h.chunk;
      CUtensorMap q_unused;
      kernels::detail::attn_make_tma(a, 128, kernels::AttnCfgOf<128, true>::BN, &q_unused, &h.own_k, &h.own_v);
      kernels::attention_with<T, 128>(a, h, s);
      return;
    }
    case HookVariant::sp_like: {
      SpLikeWait h{};
      h.w.flags = reinterpret_cast<const std::uint64_t*>(set_flags);
      h.w.expected = 1;
      h.chunk = static_cast<int>((a.seqlen_k + 3) / 4);
      h.world = 2;
      h.rank = 0;
      kernels::attention_with<T, 128>(a, h, s);
      return;
    }
    case HookVariant::sp_shard: {
      ops::SpKvTableWait h{};
      h.flags = reinterpret_cast<const std::uint64_t*>(set_flags);
      h.flags_of_block = reinterpret_cast<const int2*>(shard_table);
      h.n_blocks = static_cast<int>((a.seqlen_k + hook_ab_block_rows() - 1) / hook_ab_block_rows());
      h.polls = 1u << 30;
      h.epoch = 1;
      kernels::attention_with<T, 128>(a, h, s);
      return;
    }
    case HookVariant::flags_set: {
      kernels::attn::KvFlagWait<std::uint32_t, false> h;
      h.flags.flags = set_flags;
      h.flags.expected = 1;
      h.flags.rows_per_flag = kHookAbRowsPerFlag;
      kernels::attention_with<T, 128>(a, h, s);
      return;
    }
  }
}

}  // namespace tessera::bench::attention
