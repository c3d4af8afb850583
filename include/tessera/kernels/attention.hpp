// tessera/kernels/attention.hpp — host entry point of Tessera's Hopper
// flash-attention forward kernel.
//
//   O[b, i, h, :] = softmax_j(scale · Q[b, i, h, :] · K[b, j, h / G, :]ᵀ) · V[b, j, h / G, :]
//   LSE[b, h, i]  = log Σ_j exp(scale · Q[b, i, h, :] · K[b, j, h / G, :]ᵀ)   (natural log)
//
// over the keys j the mask admits, with G = heads_q / heads_kv (GQA / MQA;
// G = 1 is plain multi-head attention).
//
// Layout: every tensor is [batch, seq, heads, head_dim] (BSHD, the layout
// PyTorch SDPA users keep before their transpose) with head_dim contiguous
// and arbitrary element strides for batch, seq and head (AttnStrides; zeros
// mean packed BSHD). A [batch, heads, seq, head_dim] tensor is the same thing
// with other strides. O has the same layout (own strides); LSE is float32
// [batch, heads_q, seqlen_q], natural log, -inf for a query row with no
// admitted key (its O row is 0), contiguous unless lse_stride says otherwise
// (e.g. the rows of one Q chunk inside a longer shard's LSE). LSE may be null.
//
// Causal masking: query i (0-based row of this Q) attends key j iff
// j <= i + q_offset. The default q_offset is seqlen_k - seqlen_q: the causal
// diagonal is aligned to the END of the KV (a Q that holds the last seqlen_q
// positions of the sequence), as FlashAttention-2/3 and PyTorch's
// bottom-right mask do. Pass q_offset explicitly to place a Q shard anywhere
// in the global sequence (sequence parallelism: the shard's first global
// position, with K/V holding positions 0 .. seqlen_k-1). A Q made of two
// segments of the sequence (a zig-zag shard) runs in one launch: rows i >=
// q_split (a multiple of 128) attend keys j <= i + q_offset_split.
//
// Limits (validate() throws tessera::Error naming the argument before any
// launch): dtype bf16 or f16; head_dim 64 or 128; batch, seqlens, heads >= 1
// and < 2^31 (seqlen_q, seqlen_k < 2^31 - 256); heads_q a multiple of
// heads_kv; pointers non-null and 16-byte aligned; strides multiples of 8
// elements (16 bytes, TMA) ; the device sm_90 (Hopper).
//
// The kernel (tessera/kernels/attention/kernel.cuh) is warp-specialized in
// the GEMM engine's style: a producer warp loads Q once and K/V tiles by TMA
// into an mbarrier-guarded shared-memory ring; two consumer warpgroups (64
// query rows each) compute S = Q·Kᵀ and O += P·V with wgmma (P from
// registers), with the online softmax of one KV block overlapping the
// tensor-core work of the next (FlashAttention-3's intra-warpgroup overlap)
// and the two consumers' wgmma issue ordered ping-pong. Its KV loop takes a
// wait policy (attention/kv_wait.cuh): with NoKvWait it is this plain
// attention; attention_with() (attention/launch.cuh) plugs in others.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "tessera/runtime/dtype.hpp"

namespace tessera::kernels {

/// Element strides of a BSHD tensor (head_dim is contiguous). All zero:
/// packed [batch, seq, heads, head_dim].
struct AttnStrides {
  int64_t batch = 0, seq = 0, head = 0;
  bool packed() const { return batch == 0 && seq == 0 && head == 0; }
};

struct AttentionArgs {
  const void* q = nullptr;  ///< [batch, seqlen_q, heads_q, head_dim]
  const void* k = nullptr;  ///< [batch, seqlen_k, heads_kv, head_dim]
  const void* v = nullptr;  ///< [batch, seqlen_k, heads_kv, head_dim]
  void* o = nullptr;        ///< [batch, seqlen_q, heads_q, head_dim], dtype
  float* lse = nullptr;     ///< [batch, heads_q, seqlen_q] float32, or null
  /// LSE element strides of batch and head (query rows are contiguous);
  /// 0, 0 = packed [batch, heads_q, seqlen_q].
  int64_t lse_batch_stride = 0, lse_head_stride = 0;
  int64_t batch = 1, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  AttnStrides q_stride, k_stride, v_stride, o_stride;
  DType dtype = DType::bf16;  ///< of Q, K, V and O
  bool causal = false;
  std::optional<int64_t> q_offset;  ///< causal only; default seqlen_k - seqlen_q
  /// Causal only: rows >= q_split use q_offset_split (0: one segment).
  int64_t q_split = 0;
  int64_t q_offset_split = 0;
  float softmax_scale = 0.f;  ///< 0: 1 / sqrt(head_dim)

  /// Strides with packed defaults filled in.
  AttnStrides q_strides() const { return fill(q_stride, seqlen_q, heads_q); }
  AttnStrides k_strides() const { return fill(k_stride, seqlen_k, heads_kv); }
  AttnStrides v_strides() const { return fill(v_stride, seqlen_k, heads_kv); }
  AttnStrides o_strides() const { return fill(o_stride, seqlen_q, heads_q); }
  int64_t causal_offset() const { return q_offset.value_or(seqlen_k - seqlen_q); }
  /// The causal offset of query row i.
  int64_t causal_offset(int64_t i) const { return q_split > 0 && i >= q_split ? q_offset_split : causal_offset(); }
  float scale() const;

 private:
  AttnStrides fill(const AttnStrides& s, int64_t seq, int64_t heads) const {
    if (!s.packed()) return s;
    return AttnStrides{seq * heads * head_dim, heads * head_dim, head_dim};
  }
};

/// Throws tessera::Error naming `op` and the offending argument unless the
/// kernel accepts `a` (see the header comment for the limits).
void validate(const AttentionArgs& a, const char* op = "attention");

/// O (and LSE) of `a` on `stream`. Validates first.
void attention(const AttentionArgs& a, cudaStream_t stream = nullptr);

/// Floating-point operations of the problem as FlashAttention counts them
/// (4 · batch · heads_q · head_dim · admitted (query, key) pairs), for
/// TFLOP/s figures; causal counts the admitted pairs exactly.
double attention_flops(const AttentionArgs& a);

}  // namespace tessera::kernels
