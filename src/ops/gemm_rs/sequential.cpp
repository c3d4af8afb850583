// GEMM+RS sequential: one cuBLASLt GEMM into a partial [R·ceil(M/R), ldr]
// (rows past M are never read back), then ncclReduceScatter.
#include <nccl.h>

#include "gemm_rs.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops::rs {

namespace {

void run(TpContext::Impl& c, const GemmRsArgs& a, const OpOptions&) {
  const auto [R, rank, st, es] = env(c, a);
  const RsPlan plan = tile_plan(c, a);
  const std::int64_t per_rank = plan.shards.per_rank, ldr = plan.ld_recv;
  const std::int64_t ldd = a.ldd ? a.ldd : a.n;
  const std::size_t slab_bytes = static_cast<std::size_t>(per_rank * ldr * es);
  void* part = c.staging.ensure(slab_bytes * R, st);
  row_parallel_gemm(a, 0, a.m, part, ldr, st);
  // The output lands in D directly when D's rows are the slab's rows.
  const bool direct = ldd == ldr && a.m_local == per_rank;
  void* out = direct ? a.d : c.rs_out.ensure(slab_bytes, st);
  TESSERA_NCCL_CHECK(ncclReduceScatter(part, out, static_cast<std::size_t>(per_rank * ldr),
                                       runtime::nccl_dtype(a.dtype), ncclSum, c.pg.nccl(), st));
  if (!direct)
    TESSERA_CUDA_CHECK(
        cudaMemcpy2DAsync(a.d, ldd * es, out, ldr * es, a.n * es, a.m_local, cudaMemcpyDeviceToDevice, st));
}

}  // namespace

const TpStrategy<GemmRsArgs> sequential{.strategy = Strategy::sequential, .needs = {}, .launch = &run};

}  // namespace tessera::ops::rs
