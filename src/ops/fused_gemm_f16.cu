// Fused TP GEMMs, f16 instantiations.
#include "fused_gemm.cuh"

namespace tessera::ops::detail {
void ag_gemm_f16(const AgGemmArguments& p, cudaStream_t s) { ag_gemm_typed<__half>(p, s); }
void gemm_rs_f16(const GemmRsArguments& p, cudaStream_t s) { gemm_rs_typed<__half>(p, s); }
void preload_f16() { preload_typed<__half>(); }
}  // namespace tessera::ops::detail
