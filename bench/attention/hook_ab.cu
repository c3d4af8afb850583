// The attention kernel with KV hooks that never wait (bench attention
// --hook-ab): what the hook machinery costs by itself beside the plain
// kernel, part by part — the hooked configuration with no hook, the waiter
// ring handing every block over with nothing to acquire, and the engine's
// flag wait on flags that are already set.
#include <cuda_bf16.h>

#include <cstdint>

#include "hook_ab.hpp"
#include "tessera/kernels/attention/launch.cuh"

namespace tessera::bench::attention {
namespace {

/// Active and stateful, acquires nothing: the waiter and the TMA thread
/// still hand over every block through the ring.
struct HandOverOnly {
  static constexpr bool kActive = true;
  struct State {};
  __device__ __forceinline__ bool wait(const kernels::attn::KvBlockInfo&, State&) const { return false; }
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
