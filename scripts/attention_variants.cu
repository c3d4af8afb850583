// scripts/attention_variants.cu — kernel configurations other than the
// library's default, for A/B timing in scripts/bench_attention.py
// (--variants; bf16, head dim 128 only, 64 runs the default). Variant 0 is
// the library's attention(); n > 0 the AttnConfig below.
#include <cuda_bf16.h>

#include "tessera/kernels/attention/launch.cuh"

namespace tessera::kernels::detail {

void attention_variant(int variant, const AttentionArgs& a, cudaStream_t s) {
  using T = __nv_bfloat16;
  using H = attn::NoKvWait;
  const H h{};
  if (a.head_dim != 128) return attention_with<T, 64>(a, h, s);
  switch (variant) {
    //                                                       D   BN  slots ping-pong hook [smem epilogue]
    case 1: return attention_launch<T, 128, H, attn::AttnConfig<128, 128, 2, true, false>>(a, h, s);
    case 2: return attention_launch<T, 128, H, attn::AttnConfig<128, 128, 2, false, false>>(a, h, s);
    case 3: return attention_launch<T, 128, H, attn::AttnConfig<128, 176, 2, true, false>>(a, h, s);
    case 4: return attention_launch<T, 128, H, attn::AttnConfig<128, 192, 2, true, false>>(a, h, s);
    case 5: return attention_launch<T, 128, H, attn::AttnConfig<128, 128, 3, false, false>>(a, h, s);
    case 6: return attention_launch<T, 128, H, attn::AttnConfig<128, 176, 2, false, false>>(a, h, s);
    // 7, 8: register epilogue (4-byte stores straight from the accumulators)
    case 7: return attention_launch<T, 128, H, attn::AttnConfig<128, 176, 2, false, false, false>>(a, h, s);
    case 8: return attention_launch<T, 128, H, attn::AttnConfig<128, 128, 2, false, false, false>>(a, h, s);
    default: return attention_with<T, 128>(a, h, s);
  }
}

}  // namespace tessera::kernels::detail
