// tessera/kernels/attention/host_detail.hpp — host helpers of the attention
// launch template (launch.cuh), defined in src/kernels/attention_host.cpp;
// not part of the stable API.
#pragma once

#include <cuda.h>

#include "tessera/kernels/attention.hpp"

namespace tessera::kernels::detail {
/// validate(a) + the instantiation matches a (dtype, head_dim).
void attn_check_instantiation(const AttentionArgs& a, DType t, int head_dim);
/// TMA descriptors of Q (box 64 x bm), K and V (box 64 x bn): 4-D maps
/// {head_dim, seq, heads, batch}, 128-byte swizzle, zero fill.
void attn_make_tma(const AttentionArgs& a, int bm, int bn, CUtensorMap* q, CUtensorMap* k, CUtensorMap* v);
}  // namespace tessera::kernels::detail
