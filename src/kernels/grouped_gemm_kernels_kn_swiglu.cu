// Grouped GEMM kernels: bf16, B layout KN, swiglu epilogue (see grouped_gemm_kernels.cuh).
#include "grouped_gemm_kernels.cuh"

namespace tessera::kernels::detail {
void grouped_gemm_bf16_kn_swiglu(GroupedTile t, const GroupedGemmArgs& a, const GroupedGemmOptions& o, cudaStream_t s) {
  grouped_gemm_plain<BLayout::KN, engine::kEpiSwiGLU>(t, a, o, s);
}
}  // namespace tessera::kernels::detail
