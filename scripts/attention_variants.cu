// scripts/attention_variants.cu — kernel configurations other than the
// library's default, for A/B timing in scripts/bench_attention.py
// (--variants). bf16 only. Variant 0 is the library's default (attention());
// 1: no ping-pong between the consumer warpgroups; 2: three K/V ring slots;
// 3: no ping-pong and three slots.
#include <cuda_bf16.h>

#include "tessera/kernels/attention/launch.cuh"

namespace tessera::kernels::detail {

template <int D>
void attention_variant_d(int variant, const AttentionArgs& a, cudaStream_t s) {
  const attn::NoKvWait h{};
  using T = __nv_bfloat16;
  constexpr int kS = D == 128 ? 2 : 4;
  constexpr int kS3 = D == 128 ? 3 : 6;
  switch (variant) {
    case 1: return attention_with<T, D, attn::NoKvWait, attn::AttnConfig<D, 128, kS, false, false>>(a, h, s);
    case 2: return attention_with<T, D, attn::NoKvWait, attn::AttnConfig<D, 128, kS3, true, false>>(a, h, s);
    case 3: return attention_with<T, D, attn::NoKvWait, attn::AttnConfig<D, 128, kS3, false, false>>(a, h, s);
    default: return attention_with<T, D, attn::NoKvWait>(a, h, s);
  }
}

void attention_variant(int variant, const AttentionArgs& a, cudaStream_t s) {
  if (a.head_dim == 64)
    attention_variant_d<64>(variant, a, s);
  else
    attention_variant_d<128>(variant, a, s);
}

}  // namespace tessera::kernels::detail
