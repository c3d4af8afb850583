// Test-only instantiations of the attention kernel with a KV hook
// (attention_test_kernels.cu), callable from plain C++ tests.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/kernels/attention.hpp"

namespace tessera::kernels::testk {

/// attention(a) whose producer waits, before loading KV rows [r0, r0 + BN),
/// until flags[r / rows_per_flag] >= expected for every row r of the block
/// (attn::KvFlagWait, .gpu scope, 10 s timeout). bf16, head dim 128.
void attention_kv_flags(const AttentionArgs& a, const uint32_t* flags, uint32_t expected, int rows_per_flag,
                        cudaStream_t stream);

/// attention(a) without a hook but with attention_kv_flags' block geometry
/// (the hook's configuration has its own BN), so both sum in the same order
/// and agree bit for bit. bf16, head dim 128.
void attention_kv_flags_geometry(const AttentionArgs& a, cudaStream_t stream);

/// attention(a) visiting each CTA's KV blocks in a rotated order
/// (kv_block(i, n) = (i + n / 2) % n: masked blocks in the middle of the
/// walk, not first), no waits. bf16, head dim 128.
void attention_rotated_kv_order(const AttentionArgs& a, cudaStream_t stream);

}  // namespace tessera::kernels::testk
