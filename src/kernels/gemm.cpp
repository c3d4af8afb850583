// tessera::kernels::gemm — dispatch of the policy-free GEMM to the kernels
// compiled per input type and B layout.
#include "tessera/kernels/gemm.hpp"

#include <cuda_runtime_api.h>

#include "tessera/kernels/gemm/host_detail.hpp"

#include "tessera/runtime/error.hpp"

namespace tessera::kernels {
namespace detail {
void gemm_plain_bf16_nk(const GemmArgs&, const GemmOptions&, cudaStream_t);
void gemm_plain_bf16_kn(const GemmArgs&, const GemmOptions&, cudaStream_t);
void gemm_plain_f16_nk(const GemmArgs&, const GemmOptions&, cudaStream_t);
void gemm_plain_f16_kn(const GemmArgs&, const GemmOptions&, cudaStream_t);
}  // namespace detail

void gemm(const GemmArgs& args, const GemmOptions& o, cudaStream_t stream) {
  validate(args, "gemm");
  GemmArgs a = args;
  void* staged = nullptr;
  if (!d_rows_aligned(args)) {
    // D rows that are not 16-byte multiples: compute into an aligned buffer,
    // then one 2-D copy (cuBLASLt runs these; the kernels store 16 bytes).
    a.ldd = (a.n + 7) / 8 * 8;
    staged = detail::acquire_workspace(static_cast<size_t>(a.m * a.ldd) * dtype_size(a.out), stream);
    a.d = staged;
  }
  const bool nk = a.b_layout == BLayout::NK;
  if (a.in == DType::bf16)
    nk ? detail::gemm_plain_bf16_nk(a, o, stream) : detail::gemm_plain_bf16_kn(a, o, stream);
  else
    nk ? detail::gemm_plain_f16_nk(a, o, stream) : detail::gemm_plain_f16_kn(a, o, stream);
  if (staged) {
    const size_t es = dtype_size(a.out);
    TESSERA_CUDA_CHECK(cudaMemcpy2DAsync(args.d, args.ldd_or_packed() * es, staged, a.ldd * es, a.n * es, a.m,
                                         cudaMemcpyDeviceToDevice, stream));
    detail::release_workspace(staged, stream);
  }
}

}  // namespace tessera::kernels
