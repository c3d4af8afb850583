// The attention kernel with KV hooks that never wait (bench attention
// --hook-ab): what the hook machinery costs by itself beside the plain
// kernel, part by part — the hooked configuration with no hook, the waiter
// ring handing every block over with nothing to acquire, and the engine's
// flag wait on flags that are already set.
#include <cuda_bf16.h>

#include <cstdint>

#include "hook_ab.hpp"
#include "tessera/kernels/attention/launch.cuh"
#include "tessera/link/memory_order.cuh"

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

}  // namespace

void launch_hook_variant(HookVariant v, const kernels::AttentionArgs& a, const std::uint32_t* set_flags,
                         cudaStream_t s) {
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
