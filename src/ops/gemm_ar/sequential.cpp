// GEMM+AR sequential: one cuBLASLt GEMM, then an in-place ncclAllReduce.
#include <nccl.h>

#include "gemm_ar.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops::ar {

void run_sequential(TpContext::Impl& c, const GemmArArgs& a, const GemmRsArgs& rs) {
  cudaStream_t st = c.pg.stream();
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(a.dtype));
  const std::int64_t ldd = rs.ldd;
  // NCCL reduces a contiguous buffer: D itself when packed, else staging
  // with rows padded to 8 elements (cuBLASLt's 16-byte rows; the padding is
  // reduced too and never read) and a strided copy back.
  const bool packed = ldd == a.n;
  const std::int64_t lds = packed ? ldd : (a.n + 7) / 8 * 8;
  void* out = packed ? a.d : c.staging.ensure(static_cast<std::size_t>(a.m * lds * es), st);
  row_parallel_gemm(rs, 0, a.m, out, lds, st);
  TESSERA_NCCL_CHECK(ncclAllReduce(out, out, static_cast<std::size_t>(a.m * lds), runtime::nccl_dtype(a.dtype), ncclSum,
                                   c.pg.nccl(), st));
  if (!packed)
    TESSERA_CUDA_CHECK(cudaMemcpy2DAsync(a.d, ldd * es, out, lds * es, a.n * es, a.m, cudaMemcpyDeviceToDevice, st));
}

namespace {

void run(TpContext::Impl& c, const GemmArArgs& a, const OpOptions&) { run_sequential(c, a, row_parallel(c, a).rs); }

}  // namespace

const TpStrategy<GemmArArgs> sequential{.strategy = Strategy::sequential, .needs = {}, .launch = &run};

}  // namespace tessera::ops::ar
