// tessera/kernels/moe_routing.hpp — Mixture-of-Experts routing on the GPU:
// top-k gating, the expert-sorted permutation that feeds a grouped GEMM, the
// row gather, the expert-parallel dispatch layout (fixed per-rank slabs),
// and the top-k weighted combine.
//
// Every size that depends on the routing stays on the device: the host
// passes T (tokens), E (experts) and k, and the kernels write the per-expert
// row counts and offsets (the grouped GEMM's problem table) to device
// memory. Nothing here synchronizes with the host.
//
// Layout. A routed entry is (token t, slot s), s < k, numbered t * k + s.
// The permutation sorts entries by expert, stably (by entry number within an
// expert), so the same routing always gives the same order:
//   expert_offsets[e] .. expert_offsets[e + 1]  the rows of expert e,
//   sorted_entry[p]                             the entry at sorted row p,
//   entry_row[t * k + s]                        the sorted row of entry (t, s).
// A grouped GEMM over the sorted rows computes expert e's rows from
// gathered[p] = x[sorted_entry[p] / k]; combine() sums each token's k rows
// back with their gate weights.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/runtime/dtype.hpp"

namespace tessera::kernels::moe {

/// Limits the kernels are compiled for.
inline constexpr int kMaxExperts = 1024;
inline constexpr int kMaxTopK = 16;

/// Top-k gating of router logits [T, E] (row stride ld_logits, f32, bf16 or
/// f16): softmax over the E experts in f32, then the k largest (ties to the
/// lower expert id), written as expert_ids [T, k] (int32) and weights
/// [T, k] (f32), slots in descending weight. With `renormalize` the k
/// weights of a token are divided by their sum (Mixtral, Qwen-MoE);
/// otherwise they are the softmax probabilities (DeepSeek-V2 style, scaled
/// by the caller if needed).
struct TopKArgs {
  const void* logits = nullptr;
  DType logits_dtype = DType::f32;
  std::int64_t ld_logits = 0;  ///< 0 = E
  std::int64_t tokens = 0;
  int experts = 0;
  int k = 0;
  bool renormalize = true;
  std::int32_t* expert_ids = nullptr;  ///< [T, k]
  float* weights = nullptr;            ///< [T, k]
};
void topk_gating(const TopKArgs& a, cudaStream_t stream);

/// Device workspace of permute(): block_counts (experts x blocks) int32.
/// permute() needs permute_workspace_bytes(tokens * k, experts) bytes.
std::size_t permute_workspace_bytes(std::int64_t entries, int experts);

/// Sorts the T * k routed entries by expert (see the header comment).
/// expert_ids are read as given (from topk_gating or the caller); an id
/// outside [0, E) is counted in *invalid (device int32, may be null) and
/// the entry is dropped from the sort (its entry_row is -1), so the counts
/// stay consistent and the host learns of it by reading *invalid after the
/// call. With capacity > 0, an expert given more than `capacity` rows sets
/// *overflow (device int32, may be null) to the largest such count; the
/// rows are still all placed (the caller decides what to do), never
/// silently dropped.
struct PermuteArgs {
  const std::int32_t* expert_ids = nullptr;  ///< [T, k]
  std::int64_t tokens = 0;
  int experts = 0;
  int k = 0;
  std::int32_t* expert_offsets = nullptr;  ///< [E + 1] out: rows of expert e are [off[e], off[e+1])
  std::int32_t* expert_counts = nullptr;   ///< [E] out, optional: rows per expert (grouped_gemm's group_rows)
  std::int32_t* sorted_entry = nullptr;    ///< [T * k] out: entry t * k + s at each sorted row
  std::int32_t* entry_row = nullptr;       ///< [T * k] out: sorted row of each entry (-1: invalid id)
  std::int64_t capacity = 0;               ///< rows per expert before *overflow is set; 0 = unbounded
  std::int32_t* overflow = nullptr;        ///< device scalar: max count above capacity, else untouched
  std::int32_t* invalid = nullptr;         ///< device scalar: incremented per invalid id
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};
void permute(const PermuteArgs& a, cudaStream_t stream);

/// gathered[p, :] = x[sorted_entry[p] / k, :] for the sorted rows p <
/// expert_offsets[E] (the device-side total; rows beyond it, up to
/// max_rows, are left untouched). bf16 or f16, row strides in elements,
/// multiples of 8, pointers 16-byte aligned.
struct GatherArgs {
  const void* x = nullptr;
  std::int64_t ldx = 0;
  void* gathered = nullptr;
  std::int64_t ldg = 0;
  std::int64_t cols = 0;
  const std::int32_t* sorted_entry = nullptr;
  const std::int32_t* expert_offsets = nullptr;  ///< [E + 1]
  int experts = 0;
  int k = 0;
  std::int64_t max_rows = 0;  ///< upper bound of the sorted rows (T * k)
  DType dtype = DType::bf16;
};
void gather_rows(const GatherArgs& a, cudaStream_t stream);

/// Expert-parallel dispatch layout. The E experts form `blocks` consecutive
/// ranges of G = E / blocks experts (block b: the experts rank b owns), so
/// after permute() block b's entries are the sorted rows [off[b·G],
/// off[(b+1)·G]), expert-major. Each block travels as a fixed slab of
/// `capacity` rows (a size the host knows without the counts): the entry at
/// position p of block b gets slot b·capacity + p when p < capacity, else -1
/// (as do invalid ids). block_counts[e] is the number of expert e's rows that
/// fit (the grouped GEMM's table on the receiving rank); a block's rows
/// beyond capacity are the highest-sorted ones (its last experts'), left out
/// and reported in overflow: [0] += rows left out, [1] = max(itself, the
/// block's row count). Nothing synchronizes with the host.
struct BlockLayoutArgs {
  const std::int32_t* expert_ids = nullptr;      ///< [T, k]
  const std::int32_t* expert_offsets = nullptr;  ///< [E + 1] from permute()
  const std::int32_t* entry_row = nullptr;       ///< [T * k] from permute()
  std::int64_t tokens = 0;
  int experts = 0;
  int k = 0;
  int blocks = 0;                        ///< divides experts
  std::int64_t capacity = 0;             ///< rows per block's slab; blocks * capacity < 2^31
  std::int32_t* block_counts = nullptr;  ///< [E] out
  std::int32_t* entry_slot = nullptr;    ///< [T * k] out: slab row of each entry, -1 if none
  std::int32_t* overflow = nullptr;      ///< device int32[2], optional (see above)
};
void block_layout(const BlockLayoutArgs& a, cudaStream_t stream);

/// dst[entry_slot[i], :] = x[i / k, :] for every entry i < entries with a
/// slot >= 0 (the dispatch's send slabs; other rows are left untouched).
/// bf16 or f16, row strides in elements, multiples of 8, pointers 16-byte
/// aligned.
struct ScatterArgs {
  const void* x = nullptr;
  std::int64_t ldx = 0;
  void* dst = nullptr;
  std::int64_t ldd = 0;
  std::int64_t cols = 0;
  const std::int32_t* entry_slot = nullptr;  ///< [entries]
  std::int64_t entries = 0;                  ///< T * k
  int k = 0;
  DType dtype = DType::bf16;
};
void scatter_rows(const ScatterArgs& a, cudaStream_t stream);

/// out[t, :] = sum over s < k of weights[t, s] * y[entry_row[t * k + s], :]
/// in f32 (in slot order), rounded to dtype; entries with entry_row -1
/// contribute nothing. y rows are the grouped GEMM's sorted output.
/// With addends > 0, the rows addend[j * addend_stride + t * ld_add, :] for
/// j = 0 .. addends - 1 are added (in f32, in j order, after the slots)
/// before the rounding: the peers' partials of a reduce-scatter.
struct CombineArgs {
  const void* y = nullptr;
  std::int64_t ldy = 0;
  const std::int32_t* entry_row = nullptr;  ///< [T * k]
  const float* weights = nullptr;           ///< [T, k]
  void* out = nullptr;
  std::int64_t ldo = 0;
  std::int64_t tokens = 0;
  std::int64_t cols = 0;
  int k = 0;
  DType dtype = DType::bf16;
  const void* addend = nullptr;    ///< optional: [addends] blocks of [tokens, cols] rows, dtype
  int addends = 0;                 ///< blocks to add (0: none)
  std::int64_t ld_add = 0;         ///< row stride of an addend block (elements, multiple of 8)
  std::int64_t addend_stride = 0;  ///< elements between addend blocks (multiple of 8)
};
void combine(const CombineArgs& a, cudaStream_t stream);

}  // namespace tessera::kernels::moe
