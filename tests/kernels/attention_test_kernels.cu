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

}  // namespace tessera::kernels::testk
