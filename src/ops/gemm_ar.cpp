// GEMM + AllReduce: sequential (cuBLASLt + in-place ncclAllReduce) and
// fused_ce (fused_ce's GEMM+RS — remote bands staged and copied to their
// owners on the copy engine, owners adding them in the epilogue — followed,
// band by band as the owner's tiles complete, by copy-engine sends of the
// reduced rows to every peer: run_fused_ce with an ArTail). The all-gather
// half overlaps the owner's own tiles, which the schedule computes last, so
// both halves of the all-reduce's traffic run under the GEMM.
#include <cuda_runtime_api.h>

#include <nccl.h>

#include "context_impl.hpp"
#include "device_ops.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops {

namespace {

ncclDataType_t nccl_type(DType t) { return t == DType::f16 ? ncclFloat16 : ncclBfloat16; }

void run_sequential(TpContext::Impl& c, const GemmArArgs& a) {
  cudaStream_t st = c.pg.stream();
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(a.dtype));
  const std::int64_t ldd = a.ldd ? a.ldd : a.n;
  // NCCL reduces a contiguous buffer: D itself when packed, else staging
  // with rows padded to 8 elements (cuBLASLt's 16-byte rows; the padding is
  // reduced too and never read) and a strided copy back.
  const bool packed = ldd == a.n;
  const std::int64_t lds = packed ? ldd : (a.n + 7) / 8 * 8;
  void* out = packed ? a.d : c.staging.ensure(static_cast<std::size_t>(a.m * lds * es), st);
  kernels::GemmArgs g{};
  g.a = a.a;
  g.b = a.b;
  g.d = out;
  g.m = a.m;
  g.n = a.n;
  g.k = a.k;
  g.lda = a.lda ? a.lda : a.k;
  g.ldb = a.ldb ? a.ldb : a.k;
  g.ldd = lds;
  g.in = a.dtype;
  g.out = a.dtype;
  g.b_layout = kernels::BLayout::NK;
  kernels::cublaslt_gemm(g, st);
  TESSERA_NCCL_CHECK(ncclAllReduce(out, out, static_cast<std::size_t>(a.m * lds), nccl_type(a.dtype), ncclSum,
                                   c.pg.nccl(), st));
  if (!packed)
    TESSERA_CUDA_CHECK(cudaMemcpy2DAsync(a.d, ldd * es, out, lds * es, a.n * es, a.m, cudaMemcpyDeviceToDevice, st));
}

}  // namespace

void run_gemm_ar(TpContext::Impl& c, const GemmArArgs& a, Strategy s, const OpOptions& o) {
  TESSERA_CHECK(s == Strategy::sequential || s == Strategy::fused_ce,
                "gemm_ar: strategy {} is not implemented for GEMM+AllReduce (sequential, fused_ce or automatic)",
                strategy_name(s));
  TESSERA_CHECK(!o.diag_kernel_only && o.diag_skip == 0, "gemm_ar: diag_kernel_only / diag_skip are gemm_rs diagnostics");
  const int R = c.pg.world(), rank = c.pg.rank();
  if (s == Strategy::sequential || R == 1) return run_sequential(c, a);
  const RsPlan plan = plan_rs(a.m, a.n, R, rank, detail::kRsTileM, detail::kRsTileN);
  TESSERA_CHECK(plan.shards_on_tile_rows(),
                "gemm_ar: fused_ce needs each rank's {} rows (ceil(M/R), M = {}) to be a multiple of the {}-row tile; "
                "use sequential or automatic",
                plan.shards.per_rank, a.m, plan.tile_m);
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(a.dtype));
  const std::int64_t ldd = a.ldd ? a.ldd : a.n;
  GemmRsArgs rs;
  rs.a = a.a;
  rs.b = a.b;
  rs.d = static_cast<unsigned char*>(a.d) + plan.shards.lo(rank) * ldd * es;  // this rank's reduced rows
  rs.m = a.m;
  rs.m_local = plan.shards.rows(a.m, rank);
  rs.n = a.n;
  rs.k = a.k;
  rs.lda = a.lda;
  rs.ldb = a.ldb;
  rs.ldd = ldd;
  rs.dtype = a.dtype;
  const ArTail tail{a.d, ldd};
  run_fused_ce(c, rs, plan, false, 0, &tail);
}

}  // namespace tessera::ops
