// scripts/attention_ctypes.cpp — a C entry point over kernels::attention()
// for scripts/bench_attention.py (ctypes on torch tensors' data_ptr()), built
// as a small shared library without the rest of Tessera:
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//     -Xcompiler -fPIC -shared -Iinclude -Isrc/kernels -I.deps/include -DFMT_HEADER_ONLY \
//     scripts/attention_ctypes.cpp src/kernels/attention_host.cpp src/kernels/attention_bf16.cu \
//     src/kernels/attention_f16.cu src/kernels/gemm_host.cpp scripts/attention_variants.cu -o libtessera_attn.so
//
// (bench_attention.py --build runs exactly that.) tessera::Error's throw
// helpers normally live in src/runtime/error.cpp, which needs NCCL; this
// library defines the three it reaches so that it links alone.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "tessera/kernels/attention.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::detail {
int current_rank() noexcept { return -1; }
void set_current_rank(int) noexcept {}
void throw_error(std::string_view file, int line, std::string_view msg) {
  throw Error(fmt::format("[tessera] ({}:{}) {}", file, line, msg));
}
void throw_cuda_error(std::string_view file, int line, std::string_view expr, int code) {
  throw Error(
      fmt::format("[tessera] ({}:{}) {}: {}", file, line, expr, cudaGetErrorString(static_cast<cudaError_t>(code))));
}
void throw_nccl_error(std::string_view file, int line, std::string_view expr, int code) {
  throw Error(fmt::format("[tessera] ({}:{}) {}: NCCL error {}", file, line, expr, code));
}
}  // namespace tessera::detail

namespace tessera::kernels::detail {
void attention_variant(int variant, const AttentionArgs& a, cudaStream_t s);  // attention_variants.cu
}

namespace {
thread_local std::string g_err;
}

extern "C" {

const char* tessera_attention_last_error() { return g_err.c_str(); }

/// Strides in elements, [batch, seq, head] per tensor (head_dim contiguous);
/// dtype 0 = bf16, 1 = f16; variant 0 = the library's kernel, others
/// attention_variants.cu's (bf16). Returns 0, or -1 with
/// tessera_attention_last_error().
int tessera_attention_fwd(const void* q, const void* k, const void* v, void* o, float* lse, int64_t batch,
                          int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv, int64_t head_dim,
                          int dtype, int causal, int has_q_offset, int64_t q_offset, float scale,
                          const int64_t* q_strides, const int64_t* k_strides, const int64_t* v_strides,
                          const int64_t* o_strides, void* stream, int variant) {
  try {
    tessera::kernels::AttentionArgs a;
    a.q = q;
    a.k = k;
    a.v = v;
    a.o = o;
    a.lse = lse;
    a.batch = batch;
    a.seqlen_q = seqlen_q;
    a.seqlen_k = seqlen_k;
    a.heads_q = heads_q;
    a.heads_kv = heads_kv;
    a.head_dim = head_dim;
    a.dtype = dtype == 1 ? tessera::DType::f16 : tessera::DType::bf16;
    a.causal = causal != 0;
    if (has_q_offset) a.q_offset = q_offset;
    a.softmax_scale = scale;
    auto st = [](const int64_t* s) { return tessera::kernels::AttnStrides{s[0], s[1], s[2]}; };
    a.q_stride = st(q_strides);
    a.k_stride = st(k_strides);
    a.v_stride = st(v_strides);
    a.o_stride = st(o_strides);
    if (variant == 0) {
      tessera::kernels::attention(a, static_cast<cudaStream_t>(stream));
    } else {
      tessera::kernels::validate(a, "attention");
      tessera::kernels::detail::attention_variant(variant, a, static_cast<cudaStream_t>(stream));
    }
    return 0;
  } catch (const std::exception& e) {
    g_err = e.what();
    return -1;
  }
}

}  // extern "C"
