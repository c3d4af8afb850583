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
#include "tp_launchers.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops {

namespace {

// gemm_ar's operands as the row-parallel GEMM's (gemm_rs): the shared GEMM
// helper and fused_ce's kernel take them in that form. d / m_local: this
// rank's rows of D.
GemmRsArgs as_row_parallel(const GemmArArgs& a, const RsPlan& plan, int rank) {
  const std::int64_t ldd = a.ldd ? a.ldd : a.n;
  GemmRsArgs rs;
  rs.a = a.a;
  rs.b = a.b;
  rs.d = static_cast<unsigned char*>(a.d) + plan.shards.lo(rank) * ldd * static_cast<std::int64_t>(dtype_size(a.dtype));
  rs.m = a.m;
  rs.m_local = plan.shards.rows(a.m, rank);
  rs.n = a.n;
  rs.k = a.k;
  rs.lda = a.lda;
  rs.ldb = a.ldb;
  rs.ldd = ldd;
  rs.dtype = a.dtype;
  return rs;
}

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

}  // namespace

// Validation, options and agreement are checked by the caller (check_gemm_ar
// in context.cpp).
void run_gemm_ar(TpContext::Impl& c, const GemmArArgs& a, Strategy s, const OpOptions&) {
  TESSERA_CHECK(s == Strategy::sequential || s == Strategy::fused_ce,
                "gemm_ar: strategy {} is not implemented for GEMM+AllReduce (sequential, fused_ce or automatic)",
                strategy_name(s));
  const int R = c.pg.world(), rank = c.pg.rank();
  const RsPlan plan = plan_rs(a.m, a.n, R, rank, detail::kRsTileM, detail::kRsTileN);
  const GemmRsArgs rs = as_row_parallel(a, plan, rank);
  if (s == Strategy::sequential || R == 1) return run_sequential(c, a, rs);
  TESSERA_CHECK(plan.shards_on_tile_rows(),
                "gemm_ar: fused_ce needs each rank's {} rows (ceil(M/R), M = {}) to be a multiple of the {}-row tile; "
                "use sequential or automatic",
                plan.shards.per_rank, a.m, plan.tile_m);
  const ArTail tail{a.d, rs.ldd};
  run_fused_ce(c, rs, plan, false, 0, &tail);
}

}  // namespace tessera::ops
