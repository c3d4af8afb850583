// GEMM + ReduceScatter: the registry of its strategies (src/ops/gemm_rs/,
// one file each: sequential, decomposition, fused_sm, fused_ce, ring) and the
// steps they share.
#include "gemm_rs/gemm_rs.hpp"

#include <cuda_runtime_api.h>

#include "tessera/kernels/gemm.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops {

const TpRegistry<GemmRsArgs>& gemm_rs_registry() {
  static const TpRegistry<GemmRsArgs> r(OpKind::gemm_rs, "gemm_rs",
                                        {&rs::sequential, &rs::decomposition, &rs::fused_sm, &rs::fused_ce, &rs::ring});
  return r;
}

void run_gemm_rs(TpContext::Impl& c, const GemmRsArgs& a, Strategy s, const OpOptions& o) {
  const TpStrategy<GemmRsArgs>& entry = gemm_rs_registry().find(s);
  TESSERA_CHECK(!o.diag_kernel_only || entry.diag_kernel_only,
                "gemm_rs: diag_kernel_only needs strategy fused_ce, not {}", strategy_name(s));
  TESSERA_CHECK(o.diag_skip == 0 || o.diag_kernel_only, "gemm_rs: diag_skip = {:#x} needs diag_kernel_only",
                o.diag_skip);
  TESSERA_CHECK((o.diag_skip & ~(kDiagSkipOwnerAdd | kDiagSkipBandWait | kDiagSkipNotify)) == 0,
                "gemm_rs: diag_skip = {:#x} has unknown bits", o.diag_skip);
  c.begin_call();
  entry.launch(c, a, o);
}

// cuBLASLt D[rows, N] = A[row0 : row0 + rows, K] · Bᵀ (b_kn: · B; see gemm_rs/gemm_rs.hpp).
void row_parallel_gemm(const GemmRsArgs& a, std::int64_t row0, std::int64_t rows, void* d, std::int64_t ldd,
                       cudaStream_t s) {
  if (rows <= 0) return;
  const std::int64_t lda = a.lda ? a.lda : a.k;
  kernels::GemmArgs g{};
  g.a = static_cast<const unsigned char*>(a.a) + row0 * lda * static_cast<std::int64_t>(dtype_size(a.dtype));
  g.b = a.b;
  g.d = d;
  g.m = rows;
  g.n = a.n;
  g.k = a.k;
  g.lda = lda;
  g.ldb = rs::b_ld(a);
  g.ldd = ldd;
  g.in = a.dtype;
  g.out = a.dtype;
  g.b_layout = rs::b_layout(a);
  kernels::cublaslt_gemm(g, s);
}

namespace rs {

kernels::BLayout b_layout(const GemmRsArgs& a) { return a.b_kn ? kernels::BLayout::KN : kernels::BLayout::NK; }

std::int64_t b_ld(const GemmRsArgs& a) { return a.ldb ? a.ldb : (a.b_kn ? a.n : a.k); }

Env env(const TpContext::Impl& c, const GemmRsArgs& a) {
  return {c.pg.world(), c.pg.rank(), c.pg.stream(), static_cast<std::int64_t>(dtype_size(a.dtype))};
}

RsPlan tile_plan(const TpContext::Impl& c, const GemmRsArgs& a) {
  return plan_rs(a.m, a.n, c.pg.world(), c.pg.rank(), detail::kRsTileM, detail::kRsTileN);
}

detail::GemmRsArguments fused_launch(TpContext::Impl& c, const GemmRsArgs& a, const RsPlan& plan,
                                     detail::RsEpilogueKind kind, int max_ctas) {
  detail::GemmRsArguments g;
  g.problem.a = a.a;
  g.problem.b = a.b;
  g.problem.d = c.rs_recv.peer(c.pg.rank());  // unused by the epilogues; keeps validation meaningful
  g.problem.m = a.m;
  g.problem.n = a.n;
  g.problem.k = a.k;
  g.problem.lda = a.lda ? a.lda : a.k;
  g.problem.ldb = b_ld(a);
  g.problem.ldd = plan.ld_recv;
  g.problem.in = g.problem.out = a.dtype;
  g.problem.b_layout = b_layout(a);
  // Remotely-owned tiles first: start at shard (rank + 1) mod R.
  g.options = detail::fused_options(detail::kRsTile, plan.rotate_m, max_ctas);
  g.kind = kind;
  detail::RsShardArguments& sh = g.rs.shards;
  for (int r = 0; r < c.pg.world(); ++r) sh.recv[r] = c.rs_recv.peer(r);
  sh.per_rank = plan.shards.per_rank;
  sh.ld_recv = plan.ld_recv;
  sh.rank = c.pg.rank();
  sh.world = c.pg.world();
  if (kind != detail::RsEpilogueKind::slabs) {
    // The owner-adding epilogues: per-tile shards, the raster band of
    // owner_raster_group tile rows, this rank's output rows.
    g.options.raster_group = plan.owner_raster_group();
    sh.d = a.d;
    sh.ldd = a.ldd ? a.ldd : a.n;
  }
  return g;
}

detail::ReduceLaunch reduce_launch(const TpContext::Impl& c, const GemmRsArgs& a, const RsPlan& plan) {
  detail::ReduceLaunch red;
  red.slabs = c.rs_recv.local();
  red.per_rank = plan.shards.per_rank;
  red.ld_recv = plan.ld_recv;
  red.rows = a.m_local;
  red.n = a.n;
  red.row0 = plan.shards.lo(c.pg.rank());
  red.world = c.pg.world();
  red.out = a.d;
  red.ldo = a.ldd ? a.ldd : a.n;
  red.dtype = a.dtype;
  red.tile_m = plan.tile_m;
  red.sv = c.control->view();
  return red;
}

void join(TpContext::Impl& c, cudaStream_t cs) {
  TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_comm_done, cs));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(c.pg.stream(), c.ev_comm_done, 0));
}

void notify_free(TpContext::Impl& c, std::uint64_t e) {
  for (int p = 0; p < c.pg.world(); ++p)
    if (p != c.pg.rank()) link::rank_notify(c.pg.stream(), *c.control, p, kRsFree, e);
}

}  // namespace rs
}  // namespace tessera::ops
