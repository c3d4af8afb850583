// scripts/attention_variants.cu — kernel configurations other than the
// library's default, for A/B timing in scripts/bench_attention.py
// (--variants; bf16; head dim 64 has its own variants 1 and 3). Variant 0 is
// the library's attention(); n > 0 the AttnConfig below; 9 the KV-hook kernel
// (KvFlagWait, every flag already set: the cost of the per-block waits); 10
// the hook's configuration without a hook.
#include <cuda_bf16.h>

#include "tessera/kernels/attention/launch.cuh"

namespace tessera::kernels::detail {

void attention_variant(int variant, const AttentionArgs& a, cudaStream_t s) {
  using T = __nv_bfloat16;
  using H = attn::NoKvWait;
  const H h{};
  if (a.head_dim == 64) {
    switch (variant) {  // head dim 64: block width and slots
      case 1:           // 128-key blocks, four slots
        return attention_launch<T, 64, H, attn::AttnConfig<64, 128, 4, false, false>>(a, h, s);
      case 3:
        return attention_launch<T, 64, H, attn::AttnConfig<64, 128, 2, false, false>>(a, h, s);
      default:
        return attention_with<T, 64>(a, h, s);
    }
  }
  switch (variant) {
    //                                                       D   BN  slots ping-pong hook [smem epilogue]
    case 1:
      return attention_launch<T, 128, H, attn::AttnConfig<128, 128, 2, true, false>>(a, h, s);
    case 2:
      return attention_launch<T, 128, H, attn::AttnConfig<128, 128, 2, false, false>>(a, h, s);
    case 3:
      return attention_launch<T, 128, H, attn::AttnConfig<128, 176, 2, true, false>>(a, h, s);
    case 4:
      return attention_launch<T, 128, H, attn::AttnConfig<128, 192, 2, true, false>>(a, h, s);
    case 5:
      return attention_launch<T, 128, H, attn::AttnConfig<128, 128, 3, false, false>>(a, h, s);
    case 6:
      return attention_launch<T, 128, H, attn::AttnConfig<128, 176, 2, false, false>>(a, h, s);
    // 7, 8: register epilogue (4-byte stores straight from the accumulators)
    case 7:
      return attention_launch<T, 128, H, attn::AttnConfig<128, 176, 2, false, false, false>>(a, h, s);
    case 8:
      return attention_launch<T, 128, H, attn::AttnConfig<128, 128, 2, false, false, false>>(a, h, s);
    // 10: the hooked kernel's register split (producer 40, consumers 232)
    // and BN, without a hook: what the split costs apart from the waits.
    case 10:
      return attention_launch<T, 128, H, attn::AttnConfig<128, 176, 2, false, true>>(a, h, s);
    case 9: {
      static uint32_t* flags = [] {
        void* p = nullptr;
        cuda_check(cudaMalloc(&p, 1 << 20), "variant 9 flags");
        cuda_check(cudaMemset(p, 1, 1 << 20), "variant 9 flags");  // every flag 0x01010101 >= 1
        return static_cast<uint32_t*>(p);
      }();
      attn::KvFlagWait<uint32_t, false> w{};
      w.flags.flags = flags;
      w.flags.expected = 1;
      w.flags.rows_per_flag = 256;
      return attention_with<T, 128>(a, w, s);
    }
    default:
      return attention_with<T, 128>(a, h, s);
  }
}

}  // namespace tessera::kernels::detail
