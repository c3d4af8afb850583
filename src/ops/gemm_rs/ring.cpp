// GEMM+RS ring: TileLink's ring reduce-scatter (Fig. 4; RingRsPlan), for
// R > 2 (at R = 2 it is the direct push).
#include "gemm_rs.hpp"
#include "tessera/kernels/elementwise.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops::rs {

namespace {

// Compute stream: the R per-shard cuBLASLt GEMMs in ring order into local
// staging (no waits: the GEMMs never stall on communication). Comm stream
// (Impl::ring_stream, highest priority), per step j and channel c: wait for
// the GEMM of step j (event), wait for chunk c of the running sum
// from rank r+1 (kRingData >= flag_value), add it to the own partial on
// comm_ctas SMs writing straight into rank r-1's slab j+1 (or D at the last
// step), notify rank r-1. Step 0 has nothing to add: the copy engine pushes
// the partial. All waits are stream waits (cuStreamWaitValue): no spinning
// kernel, so no SM-starvation deadlock; a lost notify is caught by
// link::synchronize's timeout.
void run(TpContext::Impl& c, const GemmRsArgs& a, const OpOptions& o) {
  const auto [R, rank, st, es] = env(c, a);
  const std::int64_t ldd = a.ldd ? a.ldd : a.n;
  if (R == 1) {
    row_parallel_gemm(a, 0, a.m, a.d, ldd, st);
    return;
  }
  const RingRsPlan plan = plan_ring_rs(a.m, a.n, R, rank, o.channels);
  const std::int64_t per_rank = plan.shards.per_rank, ldr = plan.ld_recv;
  const std::size_t slab_bytes = static_cast<std::size_t>(per_rank * ldr * es);
  c.ensure_rs(slab_bytes * R, 1);  // slabs 1..R-1 receive; slab 0 unused
  unsigned char* part = static_cast<unsigned char*>(c.staging.ensure(slab_bytes * R, st));
  const std::uint64_t e = ++c.rs_epoch;
  unsigned char* recv_local = c.rs_recv.local();
  unsigned char* recv_next = static_cast<unsigned char*>(c.rs_recv.peer(plan.send_to));
  cudaStream_t cs = c.ring_stream;                      // high priority (see Impl::ring_stream)
  TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_ready, st));  // inputs ready
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, c.ev_ready, 0));
  // rank r-1 must be done with the previous call's slabs before we write them.
  if (e > 1) link::rank_wait(cs, *c.control, plan.send_to, kRsFree, e - 1);
  for (int j = 0; j < R; ++j) {
    const RingRsStep& step = plan.steps[j];
    const std::int64_t rows = plan.shards.rows(a.m, step.shard);
    unsigned char* pj = part + j * slab_bytes;
    row_parallel_gemm(a, plan.shards.lo(step.shard), rows, pj, ldr, st);
    TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_ready, st));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, c.ev_ready, 0));
    for (int ch = 0; ch < plan.channels; ++ch) {
      const std::int64_t r0 = plan.chunk_lo(step.shard, ch), nr = plan.chunk_rows(step.shard, ch);
      if (nr > 0) {
        if (step.receives) link::rank_wait(cs, *c.control, plan.recv_from, kRingData, RingRsPlan::flag_value(e, j, ch));
        if (!step.receives) {
          link::rank_copy_data(cs, recv_next + (j + 1) * slab_bytes + r0 * ldr * es, pj + r0 * ldr * es,
                               static_cast<std::size_t>(nr * ldr * es));
        } else {
          kernels::Add2dArgs add;  // x + y in that order: the received running sum, then the own partial
          add.x = recv_local + j * slab_bytes + r0 * ldr * es;
          add.ldx = ldr;
          add.y = pj + r0 * ldr * es;
          add.ldy = ldr;
          add.out = step.sends ? static_cast<void*>(recv_next + (j + 1) * slab_bytes + r0 * ldr * es)
                               : static_cast<void*>(static_cast<unsigned char*>(a.d) + r0 * ldd * es);
          add.ldo = step.sends ? ldr : ldd;
          add.rows = nr;
          add.n = a.n;
          add.dtype = a.dtype;
          kernels::add_2d(add, o.comm_ctas, cs);
        }
      }
      // Empty chunks are notified too: the receiver's values stay a fixed sequence.
      if (step.sends) link::rank_notify(cs, *c.control, plan.send_to, kRingData, RingRsPlan::flag_value(e, j + 1, ch));
    }
  }
  join(c, cs);
  // Every peer is told (not only r+1, who writes here): the other strategies
  // wait for kRsFree of every peer.
  notify_free(c, e);
}

}  // namespace

// At R = 2 the ring is the direct push (one step of one send): no new candidate.
const TpStrategy<GemmRsArgs> ring{.strategy = Strategy::ring, .needs = {.min_world = 3, .lsa = true}, .launch = &run};

}  // namespace tessera::ops::rs
