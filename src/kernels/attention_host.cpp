// Host side of the attention kernel: validation, TMA descriptors, dispatch.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attention_plain.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/kernels/attention/host_detail.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::kernels {

float AttentionArgs::scale() const {
  return softmax_scale != 0.f ? softmax_scale : 1.f / std::sqrt(static_cast<float>(head_dim));
}

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

void check_strides(const char* op, const char* name, const AttnStrides& s, int64_t batch, int64_t seq, int64_t heads) {
  TESSERA_CHECK(s.batch >= 0 && s.seq >= 0 && s.head >= 0, "{}: {} strides ({}, {}, {}) must be >= 0", op, name,
                s.batch, s.seq, s.head);
  if (!s.packed()) {
    TESSERA_CHECK((s.batch > 0 || batch == 1) && (s.seq > 0 || seq == 1) && (s.head > 0 || heads == 1),
                  "{}: {} strides (batch {}, seq {}, head {}): a stride may be 0 only where its extent is 1", op, name,
                  s.batch, s.seq, s.head);
  }
  TESSERA_CHECK(s.batch % 8 == 0 && s.seq % 8 == 0 && s.head % 8 == 0,
                "{}: {} strides (batch {}, seq {}, head {}) must be multiples of 8 elements (16 bytes, TMA)", op, name,
                s.batch, s.seq, s.head);
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    TESSERA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    TESSERA_CHECK(f != nullptr && q == cudaDriverEntryPointSuccess,
                  "attention: cuTensorMapEncodeTiled not found in the driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

void make_tma_4d(const char* what, const void* base, DType t, int64_t d, int64_t seq, int64_t heads, int64_t batch,
                 const AttnStrides& s, int box_rows, CUtensorMap* out) {
  const CUtensorMapDataType dt = t == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(seq), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(batch)};
  // Byte strides of dims 1..3; a stride of 0 (one batch, say) is given as the
  // dimension below it times its extent — any value works for an extent of 1.
  auto st = [](int64_t v, int64_t fallback) { return static_cast<cuuint64_t>((v ? v : fallback) * 2); };
  const cuuint64_t strides[3] = {st(s.seq, d), st(s.head, d), st(s.batch, d)};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult rc =
      encode_fn()(out, dt, 4, const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TESSERA_CHECK(rc == CUDA_SUCCESS,
                "attention: cuTensorMapEncodeTiled for {} failed (CUresult {}): dims {}x{}x{}x{}, strides {}/{}/{}",
                what, static_cast<int>(rc), d, seq, heads, batch, s.seq, s.head, s.batch);
}

}  // namespace

void validate(const AttentionArgs& a, const char* op) {
  TESSERA_CHECK(a.dtype == DType::bf16 || a.dtype == DType::f16, "{}: dtype {} not supported (bf16 or f16)", op,
                dtype_name(a.dtype));
  TESSERA_CHECK(a.head_dim == 64 || a.head_dim == 128, "{}: head_dim = {} not supported (64 or 128)", op, a.head_dim);
  constexpr int64_t kMax = (int64_t{1} << 31) - 256;
  TESSERA_CHECK(a.batch >= 1 && a.batch < kMax, "{}: batch = {} out of range [1, 2^31)", op, a.batch);
  TESSERA_CHECK(a.seqlen_q >= 1 && a.seqlen_q < kMax, "{}: seqlen_q = {} out of range [1, 2^31 - 256)", op, a.seqlen_q);
  TESSERA_CHECK(a.seqlen_k >= 1 && a.seqlen_k < kMax, "{}: seqlen_k = {} out of range [1, 2^31 - 256)", op, a.seqlen_k);
  TESSERA_CHECK(a.heads_q >= 1 && a.heads_q < kMax, "{}: heads_q = {} out of range", op, a.heads_q);
  TESSERA_CHECK(a.heads_kv >= 1 && a.heads_kv <= a.heads_q, "{}: heads_kv = {} must be in [1, heads_q = {}]", op,
                a.heads_kv, a.heads_q);
  TESSERA_CHECK(a.heads_q % a.heads_kv == 0,
                "{}: heads_q = {} is not a multiple of heads_kv = {} (GQA needs whole query groups)", op, a.heads_q,
                a.heads_kv);
  const int64_t m_blocks = (a.seqlen_q + 127) / 128;
  TESSERA_CHECK(m_blocks * a.heads_q * a.batch < (int64_t{1} << 31),
                "{}: batch {} x heads_q {} x ceil(seqlen_q / 128) {} CTAs exceed the grid limit", op, a.batch,
                a.heads_q, m_blocks);
  TESSERA_CHECK(a.q && a.k && a.v && a.o, "{}: q, k, v and o must be non-null (q {}, k {}, v {}, o {})", op, a.q, a.k,
                a.v, static_cast<const void*>(a.o));
  TESSERA_CHECK(aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && aligned16(a.o),
                "{}: q, k, v and o must be 16-byte aligned (q {}, k {}, v {}, o {})", op, a.q, a.k, a.v,
                static_cast<const void*>(a.o));
  check_strides(op, "q", a.q_stride, a.batch, a.seqlen_q, a.heads_q);
  check_strides(op, "k", a.k_stride, a.batch, a.seqlen_k, a.heads_kv);
  check_strides(op, "v", a.v_stride, a.batch, a.seqlen_k, a.heads_kv);
  check_strides(op, "o", a.o_stride, a.batch, a.seqlen_q, a.heads_q);
  TESSERA_CHECK(a.lse_batch_stride >= 0 && a.lse_head_stride >= 0, "{}: LSE strides (batch {}, head {}) must be >= 0",
                op, a.lse_batch_stride, a.lse_head_stride);
  if (a.causal && a.q_offset) {
    TESSERA_CHECK(*a.q_offset > -kMax && *a.q_offset < kMax, "{}: q_offset = {} out of range", op, *a.q_offset);
  }
  if (a.q_split != 0) {
    TESSERA_CHECK(a.causal, "{}: q_split = {} needs causal attention", op, a.q_split);
    TESSERA_CHECK(a.q_split > 0 && a.q_split < a.seqlen_q && a.q_split % 128 == 0,
                  "{}: q_split = {} must be a multiple of 128 in (0, seqlen_q = {})", op, a.q_split, a.seqlen_q);
    TESSERA_CHECK(a.q_offset_split > -kMax && a.q_offset_split < kMax, "{}: q_offset_split = {} out of range", op,
                  a.q_offset_split);
  }
  TESSERA_CHECK(!(a.softmax_scale < 0.f) && std::isfinite(a.softmax_scale),
                "{}: softmax_scale = {} must be finite and >= 0 (0: 1/sqrt(head_dim))", op, a.softmax_scale);
  int dev = 0, major = 0, minor = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  TESSERA_CHECK(major == 9 && minor == 0, "{}: device {} has compute capability {}.{}; the kernel needs sm_90 (Hopper)",
                op, dev, major, minor);
}

double attention_flops(const AttentionArgs& a) {
  double pairs = 0;
  if (!a.causal) {
    pairs = static_cast<double>(a.seqlen_q) * static_cast<double>(a.seqlen_k);
  } else {
    for (int64_t i = 0; i < a.seqlen_q; ++i) {
      const int64_t keys = std::min<int64_t>(a.seqlen_k, std::max<int64_t>(0, i + a.causal_offset(i) + 1));
      pairs += static_cast<double>(keys);
    }
  }
  return 4.0 * static_cast<double>(a.batch) * static_cast<double>(a.heads_q) * static_cast<double>(a.head_dim) * pairs;
}

void attention(const AttentionArgs& a, cudaStream_t stream) {
  validate(a, "attention");
  if (a.dtype == DType::bf16)
    detail::attention_plain_bf16(a, stream);
  else
    detail::attention_plain_f16(a, stream);
}

namespace detail {

void attn_check_instantiation(const AttentionArgs& a, DType t, int head_dim) {
  validate(a, "attention");
  TESSERA_CHECK(a.dtype == t, "attention: args.dtype = {} does not match the instantiated type {}", dtype_name(a.dtype),
                dtype_name(t));
  TESSERA_CHECK(a.head_dim == head_dim, "attention: args.head_dim = {} does not match the instantiated {}", a.head_dim,
                head_dim);
}

void attn_make_tma(const AttentionArgs& a, int bm, int bn, CUtensorMap* q, CUtensorMap* k, CUtensorMap* v) {
  make_tma_4d("Q", a.q, a.dtype, a.head_dim, a.seqlen_q, a.heads_q, a.batch, a.q_strides(), bm, q);
  make_tma_4d("K", a.k, a.dtype, a.head_dim, a.seqlen_k, a.heads_kv, a.batch, a.k_strides(), bn, k);
  make_tma_4d("V", a.v, a.dtype, a.head_dim, a.seqlen_k, a.heads_kv, a.batch, a.v_strides(), bn, v);
}

}  // namespace detail
}  // namespace tessera::kernels
