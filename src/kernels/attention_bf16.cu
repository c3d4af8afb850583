// Hook-free attention kernels for bf16 inputs, head dims 64 and 128
// (see attention_plain.hpp).
#include "attention_plain.hpp"
#include "tessera/kernels/attention/launch.cuh"

namespace tessera::kernels::detail {
void attention_plain_bf16(const AttentionArgs& a, cudaStream_t s) {
  const attn::NoKvWait hook{};
  if (a.head_dim == 64)
    attention_with<__nv_bfloat16, 64>(a, hook, s);
  else
    attention_with<__nv_bfloat16, 128>(a, hook, s);
}
}  // namespace tessera::kernels::detail
