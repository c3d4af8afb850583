// GEMM+RS fused_sm: the engine GEMM's epilogue stores each row into its
// owner's receive slab and counts the tile. When the shards fall on tile
// rows and OpOptions::rs_reduce is epilogue, the owner adds the peers'
// partials in its own tiles' epilogue (counters per tile; the GEMM keeps
// every SM); otherwise the owner's reduce kernel on comm_ctas SMs sums the
// slabs tile row by tile row as they complete.
#include "gemm_rs.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops::rs {

namespace {

void run(TpContext::Impl& c, const GemmRsArgs& a, const OpOptions& o) {
  const auto [R, rank, st, es] = env(c, a);
  const RsPlan plan = tile_plan(c, a);
  const std::size_t slab_bytes = static_cast<std::size_t>(plan.shards.per_rank * plan.ld_recv * es);
  const bool owner_epi = o.rs_reduce == RsReduce::epilogue && plan.shards_on_tile_rows();
  c.ensure_rs(slab_bytes * R, owner_epi ? plan.tiles_m * plan.tiles_n : plan.tiles_m);
  const std::uint64_t e = ++c.rs_epoch;
  // Peers' previous reductions must be done before we store.
  if (e > 1)
    for (int p = 0; p < R; ++p)
      if (p != rank) link::rank_wait(st, *c.control, p, kRsFree, e - 1);
  TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_ready, st));
  const runtime::SignalView cv = c.rs_counters->view();
  if (owner_epi) {
    // No reduce kernel: the GEMM keeps every SM and nothing runs on the
    // comm stream.
    detail::GemmRsArguments g = fused_launch(c, a, plan, detail::RsEpilogueKind::owner_add, 0);
    for (int r = 0; r < R; ++r) g.rs.shards.counters[r] = r == rank ? cv.counter(0) : cv.peer_counter(r, 0);
    detail::launch_gemm_rs(g, st);
    notify_free(c, e);
    return;
  }
  detail::GemmRsArguments g = fused_launch(c, a, plan, detail::RsEpilogueKind::slabs, c.pg.sm_count() - o.comm_ctas);
  for (int r = 0; r < R; ++r) g.rs.shards.counters[r] = cv.peer_counter(r, 0);
  // GEMM first, then the reducer (which spins on the GEMMs' counters): a
  // lazily loaded reducer module then waits for nothing that waits for it.
  detail::launch_gemm_rs(g, st);
  cudaStream_t cs = c.comm();
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, c.ev_ready, 0));
  detail::ReduceLaunch red = reduce_launch(c, a, plan);
  red.counters = cv.counter(0);
  red.expected = plan.expected_per_tile_row();
  detail::launch_reduce(red, o.comm_ctas, cs);
  join(c, cs);
  notify_free(c, e);
}

}  // namespace

const TpStrategy<GemmRsArgs> fused_sm{.strategy = Strategy::fused_sm, .needs = {.lsa = true}, .launch = &run};

}  // namespace tessera::ops::rs
