// src/kernels/attention_plain.hpp — the hook-free attention kernels, one
// translation unit per input type (attention_bf16.cu, attention_f16.cu) so
// they compile in parallel; attention() in attention_host.cpp dispatches.
#pragma once

#include <cuda_runtime_api.h>

#include "tessera/kernels/attention.hpp"

namespace tessera::kernels::detail {
void attention_plain_bf16(const AttentionArgs& a, cudaStream_t stream);
void attention_plain_f16(const AttentionArgs& a, cudaStream_t stream);
}  // namespace tessera::kernels::detail
