// Policy-free GEMM kernels for f16 inputs, B layout NK (see gemm_plain.cuh).
#include "gemm_plain.cuh"

namespace tessera::kernels::detail {
void gemm_plain_f16_nk(const GemmArgs& a, const GemmOptions& o, cudaStream_t s) {
  gemm_plain<__half, BLayout::NK>(a, o, s);
}
}  // namespace tessera::kernels::detail
