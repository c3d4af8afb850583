// Grouped GEMM kernels: bf16, B layout NK, swiglu epilogue, A rows gathered
// (see grouped_gemm_kernels.cuh).
#include "grouped_gemm_kernels.cuh"

namespace tessera::kernels::detail {
void grouped_gemm_bf16_nk_swiglu_gather(GroupedTile t, const GroupedGemmArgs& a, const GroupedGemmOptions& o,
                                        cudaStream_t s) {
  grouped_gemm_plain<BLayout::NK, engine::kEpiSwiGLU, true>(t, a, o, s);
}
}  // namespace tessera::kernels::detail
