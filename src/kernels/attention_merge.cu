// The LSE merge of partial attention results (tessera/kernels/attention_merge.hpp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "convert.cuh"
#include "tessera/kernels/attention_merge.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::kernels {
namespace {

using detail::from_f32;
using detail::to_f32;

struct Dims {
  std::int64_t seq, heads, head_dim, row0, rows, total;  ///< total = batch · rows · heads
};

/// One warp per (batch, row, head): the lanes stride over head_dim, the
/// weights are computed once per row from the two LSE values.
template <class T>
__global__ void merge_kernel(float* o_acc, float* lse_acc, const T* __restrict__ o_part,
                             const float* __restrict__ lse_part, bool init, bool write_acc, T* o_out, float* lse_out,
                             Dims d) {
  const int lane = threadIdx.x & 31;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t w = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32; w < d.total;
       w += warps) {
    const std::int64_t h = w % d.heads;
    const std::int64_t i = d.row0 + (w / d.heads) % d.rows;
    const std::int64_t b = w / (d.heads * d.rows);
    const std::int64_t lse_idx = (b * d.heads + h) * d.seq + i;
    const std::int64_t o_idx = ((b * d.seq + i) * d.heads + h) * d.head_dim;
    const float la = init ? -INFINITY : lse_acc[lse_idx];
    const float lb = o_part ? lse_part[lse_idx] : -INFINITY;
    const float m = fmaxf(la, lb);
    float wa = 0.f, wb = 0.f, lse = -INFINITY;
    if (m != -INFINITY) {
      wa = __expf(la - m);
      wb = __expf(lb - m);
      const float s = wa + wb;
      lse = m + __logf(s);
      wa /= s;
      wb /= s;
    }
    for (std::int64_t j = lane; j < d.head_dim; j += 32) {
      float v = 0.f;
      if (wa != 0.f) v += wa * o_acc[o_idx + j];
      if (wb != 0.f) v += wb * to_f32(o_part[o_idx + j]);
      if (write_acc) o_acc[o_idx + j] = v;
      if (o_out) o_out[o_idx + j] = from_f32<T>(v);
    }
    if (lane == 0) {
      if (write_acc) lse_acc[lse_idx] = lse;
      if (lse_out) lse_out[lse_idx] = lse;
    }
  }
}

template <class T>
void launch(const AttentionMergeArgs& a, cudaStream_t stream) {
  const Dims d{a.seq, a.heads, a.head_dim, a.row0, a.rows, a.batch * a.rows * a.heads};
  constexpr int kThreads = 256;
  const std::int64_t blocks = std::min<std::int64_t>((d.total + kThreads / 32 - 1) / (kThreads / 32), 8192);
  merge_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      a.o_acc, a.lse_acc, static_cast<const T*>(a.o_part), a.lse_part, a.init, a.write_acc, static_cast<T*>(a.o_out),
      a.lse_out, d);
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void validate(const AttentionMergeArgs& a) {
  TESSERA_CHECK(a.dtype == DType::bf16 || a.dtype == DType::f16, "attention_merge: dtype {} (bf16 or f16)",
                dtype_name(a.dtype));
  TESSERA_CHECK(a.batch >= 1 && a.seq >= 1 && a.heads >= 1 && a.head_dim >= 1,
                "attention_merge: batch {}, seq {}, heads {}, head_dim {} must all be >= 1", a.batch, a.seq, a.heads,
                a.head_dim);
  TESSERA_CHECK(a.row0 >= 0 && a.rows >= 0 && a.row0 + a.rows <= a.seq, "attention_merge: rows [{}, {}) outside seq {}",
                a.row0, a.row0 + a.rows, a.seq);
  TESSERA_CHECK((a.o_part == nullptr) == (a.lse_part == nullptr),
                "attention_merge: o_part and lse_part must be given together");
  TESSERA_CHECK(a.o_acc && a.lse_acc, "attention_merge: o_acc and lse_acc are required");
  TESSERA_CHECK(a.write_acc || a.o_out || a.lse_out, "attention_merge: nothing to write");
}

void attention_merge(const AttentionMergeArgs& a, cudaStream_t stream) {
  validate(a);
  if (a.rows == 0) return;
  if (a.dtype == DType::bf16)
    launch<__nv_bfloat16>(a, stream);
  else
    launch<__half>(a, stream);
}

}  // namespace tessera::kernels
