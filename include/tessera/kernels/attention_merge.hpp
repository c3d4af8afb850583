// tessera/kernels/attention_merge.hpp — merges partial attention results
// through their log-sum-exp (ring attention's per-step combine).
//
// Two softmax-normalized partial outputs over disjoint key sets, (O_a, LSE_a)
// and (O_b, LSE_b), combine exactly into the output over the union:
//   m   = max(LSE_a, LSE_b)
//   w_a = e^{LSE_a − m}, w_b = e^{LSE_b − m}
//   O   = (w_a·O_a + w_b·O_b) / (w_a + w_b),   LSE = m + log(w_a + w_b)
// (a row that admitted no key has LSE −inf and O 0, and stays so).
//
// The running result lives in float32 (o_acc, lse_acc) so that R merges
// round once, when the output is written in the attention dtype.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/runtime/dtype.hpp"

namespace tessera::kernels {

/// Layouts (all packed, the attention kernel's BSHD and LSE layouts):
///   O tensors [batch, seq, heads, head_dim], LSE tensors [batch, heads, seq].
/// The merge touches rows [row0, row0 + rows) of the seq dimension only.
struct AttentionMergeArgs {
  float* o_acc = nullptr;           ///< running O, float32 (read unless init; written if write_acc)
  float* lse_acc = nullptr;         ///< running LSE, float32 (same)
  const void* o_part = nullptr;     ///< partial O in `dtype`, or null: no partial (finalize only)
  const float* lse_part = nullptr;  ///< partial LSE (null iff o_part is null)
  bool init = false;                ///< the accumulator holds nothing yet (treated as LSE −inf)
  bool write_acc = true;            ///< store the merged result back into o_acc / lse_acc
  void* o_out = nullptr;            ///< optional: the merged O rounded to `dtype`
  float* lse_out = nullptr;         ///< optional: the merged LSE
  std::int64_t batch = 1, seq = 0, heads = 0, head_dim = 0;
  std::int64_t row0 = 0, rows = 0;
  DType dtype = DType::bf16;  ///< of o_part and o_out
};

/// Throws tessera::Error naming the argument on a bad shape, range, dtype or
/// a missing pointer; launches nothing for rows == 0.
void validate(const AttentionMergeArgs& a);

/// The merge on `stream` (validates first).
void attention_merge(const AttentionMergeArgs& a, cudaStream_t stream);

}  // namespace tessera::kernels
