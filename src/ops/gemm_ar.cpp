// GEMM + AllReduce: the registry of its strategies (src/ops/gemm_ar/, one
// file each: sequential, fused_ce) and the operand view they share.
// Validation, options and agreement are checked by the caller
// (check_gemm_ar in context.cpp).
#include "gemm_ar/gemm_ar.hpp"

namespace tessera::ops {

const TpRegistry<GemmArArgs>& gemm_ar_registry() {
  static const TpRegistry<GemmArArgs> r(OpKind::gemm_ar, "gemm_ar", {&ar::sequential, &ar::fused_ce});
  return r;
}

void run_gemm_ar(TpContext::Impl& c, const GemmArArgs& a, Strategy s, const OpOptions& o) {
  const TpStrategy<GemmArArgs>& entry = gemm_ar_registry().find(s);
  c.begin_call();
  entry.launch(c, a, o);
}

namespace ar {

RowParallel row_parallel(const TpContext::Impl& c, const GemmArArgs& a) {
  const int rank = c.pg.rank();
  const RsPlan plan = plan_rs(a.m, a.n, c.pg.world(), rank, detail::kRsTileM, detail::kRsTileN);
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
  return {plan, rs};
}

}  // namespace ar
}  // namespace tessera::ops
