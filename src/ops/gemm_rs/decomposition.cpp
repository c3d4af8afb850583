// GEMM+RS decomposition: per-owner cuBLASLt GEMMs (remote owners first, mine
// last, straight into my own slab), each partial pushed to its owner on the
// copy engine from the comm stream; the owner then reduces its slabs with
// the reduce kernel on every SM.
#include <algorithm>

#include "gemm_rs.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops::rs {

namespace {

void run(TpContext::Impl& c, const GemmRsArgs& a, const OpOptions&) {
  const auto [R, rank, st, es] = env(c, a);
  const RsPlan plan = tile_plan(c, a);
  const std::int64_t ldr = plan.ld_recv;
  const std::size_t slab_bytes = static_cast<std::size_t>(plan.shards.per_rank * ldr * es);
  c.ensure_rs(slab_bytes * R, plan.tiles_m);
  const std::uint64_t e = ++c.rs_epoch;
  unsigned char* recv_local = c.rs_recv.local();
  void* stage = c.staging.ensure(slab_bytes * R, st);
  cudaStream_t cs = c.comm();
  TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_ready, st));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, c.ev_ready, 0));
  for (int j = 0; j < R; ++j) {
    const int owner = (rank + 1 + j) % R;  // remote owners first, mine last
    const std::int64_t rows = plan.shards.rows(a.m, owner), row0 = plan.shards.lo(owner);
    if (owner == rank) {
      row_parallel_gemm(a, row0, rows, recv_local + rank * slab_bytes, ldr, st);
      continue;
    }
    unsigned char* part = static_cast<unsigned char*>(stage) + owner * slab_bytes;
    row_parallel_gemm(a, row0, rows, part, ldr, st);
    TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_ready, st));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, c.ev_ready, 0));
    if (e > 1) link::rank_wait(cs, *c.control, owner, kRsFree, e - 1);
    link::rank_copy_data(cs, static_cast<unsigned char*>(c.rs_recv.peer(owner)) + rank * slab_bytes, part,
                         static_cast<std::size_t>(rows * ldr * es));
    link::rank_notify(cs, *c.control, owner, kRsData, e);
  }
  join(c, cs);
  for (int p = 0; p < R; ++p)
    if (p != rank) link::rank_wait(st, *c.control, p, kRsData, e);
  detail::launch_reduce(reduce_launch(c, a, plan), std::max(1, c.pg.sm_count()), st);
  notify_free(c, e);
}

}  // namespace

const TpStrategy<GemmRsArgs> decomposition{.strategy = Strategy::decomposition, .needs = {.lsa = true}, .launch = &run};

}  // namespace tessera::ops::rs
