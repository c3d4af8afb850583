// Policy-free GEMM kernels for bf16 inputs, B layout KN (see gemm_plain.cuh).
#include "gemm_plain.cuh"

namespace tessera::kernels::detail {
void gemm_plain_bf16_kn(const GemmArgs& a, const GemmOptions& o, cudaStream_t s) {
  gemm_plain<__nv_bfloat16, BLayout::KN>(a, o, s);
}
}  // namespace tessera::kernels::detail
