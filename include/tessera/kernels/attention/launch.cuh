// tessera/kernels/attention/launch.cuh — templated host entry point of the
// attention kernel, for callers that plug in a KV hook (ops::sp_attention):
//
//   attention_with<__nv_bfloat16, 128>(args, hook, stream)     // the default config
//   attention_launch<__nv_bfloat16, 128, Hook, Cfg>(args, hook, stream)  // one config
//
// T and D must match args.dtype / args.head_dim (checked). Validation happens
// in host .cpp code (attention_host.cpp) through detail:: functions that
// throw tessera::Error; this header does not include error.hpp (fmt does not
// compile under nvcc 13, see gemm/launch.cuh).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <type_traits>

#include "tessera/kernels/attention.hpp"
#include "tessera/kernels/attention/host_detail.hpp"
#include "tessera/kernels/attention/kernel.cuh"
#include "tessera/kernels/gemm/host_detail.hpp"

namespace tessera::kernels {

/// Kernel configuration: BN keys per KV block, K/V ring slots, consumer
/// ping-pong. Both head dims take 192-key blocks (fewer per-block softmax,
/// rescale and barrier costs than 128 or 176), causal and hooked too: two
/// slots at head dim 128 fill 224 KiB of shared memory, four at head dim 64
/// take 208 KiB. No ping-pong, and the shared-memory epilogue: each measured
/// faster on nvidia-h200 than the alternative (docs/design/attention.md).
/// kHookActive adds the waiter ring's barriers.
template <int D, bool kHookActive>
using AttnCfgOf = attn::AttnConfig<D, 192, D == 128 ? 2 : 4, false, kHookActive>;

/// Launches the kernel of configuration Cfg (one instantiation).
template <class T, int D, class Hook, class Cfg>
void attention_launch(const AttentionArgs& a, const Hook& hook, cudaStream_t stream) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "T: bf16 or f16");
  static_assert(Cfg::D == D, "configuration head dim");
  detail::attn_check_instantiation(a, std::is_same_v<T, __half> ? DType::f16 : DType::bf16, D);
  CUtensorMap tq, tk, tv;
  detail::attn_make_tma(a, Cfg::BM, Cfg::BN, &tq, &tk, &tv);
  attn::AttnParams<Hook> p{};
  p.batch = static_cast<int>(a.batch);
  p.seqlen_q = static_cast<int>(a.seqlen_q);
  p.seqlen_k = static_cast<int>(a.seqlen_k);
  p.heads_q = static_cast<int>(a.heads_q);
  p.group = static_cast<int>(a.heads_q / a.heads_kv);
  p.causal = a.causal ? 1 : 0;
  p.q_offset = static_cast<int>(a.causal_offset());
  p.q_split = a.causal ? static_cast<int>(a.q_split) : 0;
  p.q_offset_split = static_cast<int>(a.q_offset_split);
  p.m_blocks = static_cast<int>((a.seqlen_q + Cfg::BM - 1) / Cfg::BM);
  p.scale = a.scale();
  p.scale_log2 = p.scale * 1.4426950408889634f;
  p.o = a.o;
  const AttnStrides os = a.o_strides();
  p.o_sb = os.batch;
  p.o_ss = os.seq;
  p.o_sh = os.head;
  p.lse = a.lse;
  p.lse_sh = a.lse_head_stride ? a.lse_head_stride : a.seqlen_q;
  p.lse_sb = a.lse_batch_stride ? a.lse_batch_stride : a.heads_q * a.seqlen_q;
  p.hook = hook;
  auto kernel = attn::attention_fwd_kernel<Cfg, T, Hook>;
  constexpr int smem = Cfg::kLaunchBytes;
  detail::set_max_dynamic_smem_once(reinterpret_cast<const void*>(kernel), smem,
                                    "cudaFuncSetAttribute(attention kernel, max dynamic smem)");
  const long long grid = static_cast<long long>(p.m_blocks) * a.heads_q * a.batch;
  kernel<<<static_cast<unsigned>(grid), Cfg::kThreads, smem, stream>>>(tq, tk, tv, p);
  detail::check_launch("attention kernel");
}

/// The kernel of head dim D with KV hook `hook` (one instantiation).
template <class T, int D, class Hook>
void attention_with(const AttentionArgs& a, const Hook& hook, cudaStream_t stream) {
  attention_launch<T, D, Hook, AttnCfgOf<D, Hook::kActive>>(a, hook, stream);
}

}  // namespace tessera::kernels
