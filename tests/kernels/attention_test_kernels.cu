// Test-only instantiations of the attention kernel with a KV hook.
#include "attention_test_kernels.hpp"
#include "tessera/kernels/attention/launch.cuh"

namespace tessera::kernels::testk {

void attention_kv_flags(const AttentionArgs& a, const uint32_t* flags, uint32_t expected, int rows_per_flag,
                        cudaStream_t stream) {
  attn::KvFlagWait<uint32_t, false> hook{};
  hook.flags.flags = flags;
  hook.flags.expected = expected;
  hook.flags.rows_per_flag = rows_per_flag;
  attention_with<__nv_bfloat16, 128>(a, hook, stream);
}

namespace {
struct RotatedOrder {
  static constexpr bool kActive = false;
  __device__ void wait(const attn::KvBlockInfo&) const {}
  __device__ int kv_block(int i, int n) const { return (i + n / 2) % n; }
};
}  // namespace

void attention_rotated_kv_order(const AttentionArgs& a, cudaStream_t stream) {
  attention_with<__nv_bfloat16, 128>(a, RotatedOrder{}, stream);
}

void attention_kv_flags_geometry(const AttentionArgs& a, cudaStream_t stream) {
  using Hooked = AttnCfgOf<128, true>;
  using Cfg = attn::AttnConfig<128, Hooked::BN, Hooked::kStages, Hooked::kPingPong, false, Hooked::kSmemEpilogue>;
  attention_launch<__nv_bfloat16, 128, attn::NoKvWait, Cfg>(a, attn::NoKvWait{}, stream);
}

}  // namespace tessera::kernels::testk
