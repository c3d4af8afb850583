// GEMM+AR fused_ce: GEMM+RS's fused_ce (remote bands staged and copied to
// their owners on the copy engine, owners adding them in the epilogue)
// followed, band by band as the owner's tiles complete, by copy-engine sends
// of the reduced rows to every peer (run_fused_ce with an ArTail). The
// all-gather half overlaps the owner's own tiles, which the schedule computes
// last, so both halves of the all-reduce's traffic run under the GEMM.
#include "gemm_ar.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops::ar {

namespace {

void run(TpContext::Impl& c, const GemmArArgs& a, const OpOptions&) {
  const RowParallel k = row_parallel(c, a);
  if (c.pg.world() == 1) return run_sequential(c, a, k.rs);
  TESSERA_CHECK(k.plan.shards_on_tile_rows(),
                "gemm_ar: fused_ce needs each rank's {} rows (ceil(M/R), M = {}) to be a multiple of the {}-row tile; "
                "use sequential or automatic",
                k.plan.shards.per_rank, a.m, k.plan.tile_m);
  const ArTail tail{a.d, k.rs.ldd};
  run_fused_ce(c, k.rs, k.plan, false, 0, &tail);
}

}  // namespace

const TpStrategy<GemmArArgs> fused_ce{
    .strategy = Strategy::fused_ce, .needs = {.min_world = 2, .lsa = true, .tile_row_shards = true}, .launch = &run};

}  // namespace tessera::ops::ar
