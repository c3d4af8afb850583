// Fused TP GEMMs, bf16 instantiations.
#include "fused_gemm.cuh"

namespace tessera::ops::detail {
void ag_gemm_bf16(const AgGemmArguments& p, cudaStream_t s) { ag_gemm_typed<__nv_bfloat16>(p, s); }
void gemm_rs_bf16(const GemmRsArguments& p, cudaStream_t s) { gemm_rs_typed<__nv_bfloat16>(p, s); }
void preload_bf16() { preload_typed<__nv_bfloat16>(); }
}  // namespace tessera::ops::detail
