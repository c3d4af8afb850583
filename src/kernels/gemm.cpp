// tessera::kernels::gemm — dispatch of the policy-free GEMM to the kernels
// compiled per input type and B layout.
#include "tessera/kernels/gemm.hpp"

#include "tessera/runtime/error.hpp"

namespace tessera::kernels {
namespace detail {
void gemm_plain_bf16_nk(const GemmArgs&, const GemmOptions&, cudaStream_t);
void gemm_plain_bf16_kn(const GemmArgs&, const GemmOptions&, cudaStream_t);
void gemm_plain_f16_nk(const GemmArgs&, const GemmOptions&, cudaStream_t);
void gemm_plain_f16_kn(const GemmArgs&, const GemmOptions&, cudaStream_t);
}  // namespace detail

void gemm(const GemmArgs& a, const GemmOptions& o, cudaStream_t stream) {
  validate(a, "gemm");
  const bool nk = a.b_layout == BLayout::NK;
  if (a.in == DType::bf16)
    nk ? detail::gemm_plain_bf16_nk(a, o, stream) : detail::gemm_plain_bf16_kn(a, o, stream);
  else
    nk ? detail::gemm_plain_f16_nk(a, o, stream) : detail::gemm_plain_f16_kn(a, o, stream);
}

}  // namespace tessera::kernels
