// GEMM + ReduceScatter: sequential (cuBLASLt + ncclReduceScatter),
// fused_ce (engine GEMM, remote bands copied by the copy engine, owner adds
// in the epilogue: run_fused_ce),
// decomposition (per-owner cuBLASLt GEMMs, copy-engine pushes of each
// partial to its owner, owner reduces), fused_sm (the GEMM epilogue stores
// each row into its owner's receive slab and counts the tile; the owner's
// reduce kernel on comm_ctas SMs sums slabs tile row by tile row as they
// complete), ring (TileLink Fig. 4, see run_ring and RingRsPlan). Reduction
// order is always rank 0..R-1 (fused, decomposition), the ring's
// (s-1, s-2, ..., s for shard s) or NCCL's (sequential).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <nccl.h>

#include "context_impl.hpp"
#include "tp_launchers.hpp"
#include "tessera/kernels/elementwise.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops {

static_assert(detail::kRsTileM == kRsFusedTileRows, "the fused GEMM+RS tile and the public constant must agree");

// cuBLASLt D[rows, N] = A[row0 : row0 + rows, K] · Bᵀ (see context_impl.hpp).
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
  g.ldb = a.ldb ? a.ldb : a.k;
  g.ldd = ldd;
  g.in = a.dtype;
  g.out = a.dtype;
  g.b_layout = kernels::BLayout::NK;
  kernels::cublaslt_gemm(g, s);
}

namespace {

// Ring reduce-scatter (Strategy::ring). Compute stream: the R per-shard
// cuBLASLt GEMMs in ring order into local staging (no waits: the GEMMs
// never stall on communication). Comm stream (Impl::ring_stream, highest
// priority), per step j and channel c:
// wait for the GEMM of step j (event), wait for chunk c of the running sum
// from rank r+1 (kRingData >= flag_value), add it to the own partial on
// comm_ctas SMs writing straight into rank r-1's slab j+1 (or D at the last
// step), notify rank r-1. Step 0 has nothing to add: the copy engine pushes
// the partial. All waits are stream waits (cuStreamWaitValue): no spinning
// kernel, so no SM-starvation deadlock; a lost notify is caught by
// link::synchronize's timeout.
void run_ring(TpContext::Impl& c, const GemmRsArgs& a, const OpOptions& o) {
  const int R = c.pg.world(), rank = c.pg.rank();
  cudaStream_t st = c.pg.stream();
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(a.dtype));
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
  TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_comm_done, cs));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(st, c.ev_comm_done, 0));
  // Every peer is told (not only r+1, who writes here): the other strategies
  // wait for kRsFree of every peer.
  for (int p = 0; p < R; ++p)
    if (p != rank) link::rank_notify(st, *c.control, p, kRsFree, e);
}

// The fused GEMM+RS launch's fields common to fused_sm and fused_ce:
// operands, every rank's receive slab, the shard geometry and the schedule
// (remote shards first: RasterScheduler rotate_m).
detail::GemmRsLaunch fused_launch(TpContext::Impl& c, const GemmRsArgs& a, const RsPlan& plan) {
  detail::GemmRsLaunch g;
  g.a = a.a;
  g.b = a.b;
  g.m = a.m;
  g.n = a.n;
  g.k = a.k;
  g.lda = a.lda ? a.lda : a.k;
  g.ldb = a.ldb ? a.ldb : a.k;
  g.dtype = a.dtype;
  for (int r = 0; r < c.pg.world(); ++r) g.recv[r] = c.rs_recv.peer(r);
  g.per_rank = plan.shards.per_rank;
  g.ld_recv = plan.ld_recv;
  g.rank = c.pg.rank();
  g.world = c.pg.world();
  g.rotate_m = plan.rotate_m;
  return g;
}

// GEMM+AR's all-gather half, queued after fused_ce's reduce-scatter copies.
// Send (comm stream, in stream order after the remote bands): per own band,
// wait until the kernel counted all its tiles (count_own: the epilogue has
// stored the reduced rows into D), copy the band from D into every peer's
// ar_recv slab [rank] on the copy engine and store the epoch into the peer's
// flag slot bands + band. Receive (ring_stream): per band, per peer, wait for
// that flag and copy the slab rows into D's rows of that peer's shard (a
// local copy: the peers cannot address our D). Slab reuse: a peer sends only
// after this rank's kRsFree of the previous call (the remote-band loop above
// waited for it on the same stream), which run_fused_ce stores after the
// receive stream joined. Every rank ends with the owners' bf16/f16 values,
// so D is bitwise equal on all ranks.
void send_reduced_bands(TpContext::Impl& c, const GemmRsArgs& a, const RsPlan& plan, const ArTail& ar, std::uint64_t e,
                        int bands) {
  const int R = c.pg.world(), rank = c.pg.rank();
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(a.dtype));
  const std::int64_t per_rank = plan.shards.per_rank, ldr = plan.ld_recv;
  const int G = plan.owner_raster_group();
  const std::uint64_t band_tiles = static_cast<std::uint64_t>(G) * plan.tiles_n;
  const std::int64_t band_rows = static_cast<std::int64_t>(G) * plan.tile_m;
  const std::size_t row_bytes = static_cast<std::size_t>(a.n * es);
  auto* d = static_cast<unsigned char*>(ar.d);
  cudaStream_t cs = c.comm(), rx = c.ring_stream;
  const std::int64_t lo = plan.shards.lo(rank), rows = plan.shards.rows(a.m, rank);
  for (std::int64_t r0 = 0; r0 < rows; r0 += band_rows) {
    const int b = static_cast<int>((lo + r0) / band_rows);
    const std::int64_t nr = std::min(band_rows, rows - r0);
    c.rs_band_total[b] += band_tiles;
    link::rank_wait(cs, *c.rs_bands, rank, b, c.rs_band_total[b]);
    for (int j = 1; j < R; ++j) {
      const int p = (rank + j) % R;
      unsigned char* dst = static_cast<unsigned char*>(c.ar_recv.peer(p)) + (rank * per_rank + r0) * ldr * es;
      TESSERA_CUDA_CHECK(cudaMemcpy2DAsync(dst, ldr * es, d + (lo + r0) * ar.ldd * es, ar.ldd * es, row_bytes,
                                           static_cast<std::size_t>(nr), cudaMemcpyDeviceToDevice, cs));
      link::rank_notify(cs, *c.rs_bands, p, bands + b, e);
    }
  }
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(rx, c.ev_ready, 0));
  // Peers finish their bands at about the same time: receive band by band
  // across peers, not peer by peer.
  for (std::int64_t r0 = 0; r0 < per_rank; r0 += band_rows)
    for (int j = 1; j < R; ++j) {
      const int p = (rank + j) % R;
      const std::int64_t plo = plan.shards.lo(p), prows = plan.shards.rows(a.m, p);
      if (r0 >= prows) continue;
      const int b = static_cast<int>((plo + r0) / band_rows);
      const std::int64_t nr = std::min(band_rows, prows - r0);
      link::rank_wait(rx, *c.rs_bands, p, bands + b, e);
      const unsigned char* src = c.ar_recv.local() + (p * per_rank + r0) * ldr * es;
      TESSERA_CUDA_CHECK(cudaMemcpy2DAsync(d + (plo + r0) * ar.ldd * es, ar.ldd * es, src, ldr * es, row_bytes,
                                           static_cast<std::size_t>(nr), cudaMemcpyDeviceToDevice, rx));
    }
  TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_rx_done, rx));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(c.pg.stream(), c.ev_rx_done, 0));
}

}  // namespace

// fused_ce (RsStageEpilogue): the engine GEMM writes remotely-owned rows to
// local staging and counts each finished tile on its band's counter; the
// comm stream, per remote band in schedule order, waits for the band's
// tiles (stream memop), copies the band into its owner's receive slab on
// the copy engine and stores the epoch into the owner's band flag. Own
// tiles (computed last) wait for the peers' band flags and add the slabs in
// the epilogue. No SM does communication; NVLink carries only copy-engine
// traffic. With `ar` (GEMM+AR), see send_reduced_bands.

void run_fused_ce(TpContext::Impl& c, const GemmRsArgs& a, const RsPlan& plan, bool kernel_only, unsigned diag_skip,
                  const ArTail* ar) {
  const int R = c.pg.world(), rank = c.pg.rank();
  cudaStream_t st = c.pg.stream();
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(a.dtype));
  const std::int64_t per_rank = plan.shards.per_rank, ldr = plan.ld_recv;
  const std::size_t slab_bytes = static_cast<std::size_t>(per_rank * ldr * es);
  const int G = plan.owner_raster_group();
  const int bands = plan.tiles_m / G;
  TESSERA_CHECK(!(ar && kernel_only), "gemm_ar: diag_kernel_only is a gemm_rs diagnostic");
  c.ensure_rs(slab_bytes * R, 1);
  // GEMM+AR: slots [bands, 2·bands) of the flag rows say "src's reduced band landed".
  c.ensure_rs_bands(ar ? 2 * bands : bands);
  if (ar) c.ensure_ar(slab_bytes * R);
  // diag_kernel_only: the last fused_ce epoch, whose band flags every peer
  // already stored (tp_mlp.hpp), and no copies, flags or kRsFree.
  TESSERA_CHECK(!kernel_only || c.rs_ce_epoch > 0,
                "gemm_rs: diag_kernel_only needs a normal fused_ce call of this shape before it");
  const std::uint64_t e = kernel_only ? c.rs_ce_epoch : ++c.rs_epoch;
  if (!kernel_only) c.rs_ce_epoch = e;
  unsigned char* stage = static_cast<unsigned char*>(c.staging.ensure(slab_bytes * R, st));
  const runtime::SignalView bv = c.rs_bands->view();

  TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_ready, st));  // inputs ready; staging free (stream order)
  detail::GemmRsLaunch g = fused_launch(c, a, plan);
  g.raster_group = G;
  g.d = a.d;
  g.ldd = a.ldd ? a.ldd : a.n;
  g.max_ctas = 0;
  g.stage_ce = true;
  g.stage = stage;
  g.band_count = bv.flag_from(rank, 0);
  g.band_flags = bv.flag_from(0, 0);
  g.flag_stride = bv.slots;
  g.epoch = e;
  g.diag_skip = diag_skip;
  g.count_own = ar != nullptr;
  detail::launch_gemm_rs(g, st);

  const std::uint64_t band_tiles = static_cast<std::uint64_t>(G) * plan.tiles_n;
  const std::int64_t band_rows = static_cast<std::int64_t>(G) * plan.tile_m;
  cudaStream_t cs = c.comm();
  if (!kernel_only) TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, c.ev_ready, 0));
  for (int j = 1; j < R; ++j) {  // the schedule's order: owners rank+1, rank+2, ...
    const int owner = (rank + j) % R;
    const std::int64_t lo = plan.shards.lo(owner), rows = plan.shards.rows(a.m, owner);
    // The owner must be done with the previous call's slabs before we write them.
    if (e > 1 && !kernel_only) link::rank_wait(cs, *c.control, owner, kRsFree, e - 1);
    for (std::int64_t r0 = 0; r0 < rows; r0 += band_rows) {
      const int b = static_cast<int>((lo + r0) / band_rows);
      const std::int64_t nr = std::min(band_rows, rows - r0);
      // The kernel counts this band's tiles in every call (kernel_only too,
      // unless told not to): the running total is what the next copy wait
      // compares against.
      if (!(diag_skip & kDiagSkipNotify)) c.rs_band_total[b] += band_tiles;
      if (kernel_only) continue;
      link::rank_wait(cs, *c.rs_bands, rank, b, c.rs_band_total[b]);
      const std::size_t off = static_cast<std::size_t>((static_cast<std::int64_t>(rank) * per_rank + r0) * ldr * es);
      link::rank_copy_data(
          cs, static_cast<unsigned char*>(c.rs_recv.peer(owner)) + off,
          stage + static_cast<std::size_t>((static_cast<std::int64_t>(owner) * per_rank + r0) * ldr * es),
          static_cast<std::size_t>(nr * ldr * es));
      link::rank_notify(cs, *c.rs_bands, owner, b, e);
    }
  }
  if (kernel_only) return;
  if (ar) send_reduced_bands(c, a, plan, *ar, e, bands);
  TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_comm_done, cs));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(st, c.ev_comm_done, 0));
  for (int p = 0; p < R; ++p)
    if (p != rank) link::rank_notify(st, *c.control, p, kRsFree, e);
}

void run_gemm_rs(TpContext::Impl& c, const GemmRsArgs& a, Strategy s, const OpOptions& o) {
  TESSERA_CHECK(s == Strategy::sequential || s == Strategy::decomposition || s == Strategy::fused_sm ||
                    s == Strategy::fused_ce || s == Strategy::ring,
                "gemm_rs: strategy {} cannot run here", strategy_name(s));
  TESSERA_CHECK(!o.diag_kernel_only || s == Strategy::fused_ce,
                "gemm_rs: diag_kernel_only needs strategy fused_ce, not {}", strategy_name(s));
  TESSERA_CHECK(o.diag_skip == 0 || o.diag_kernel_only, "gemm_rs: diag_skip = {:#x} needs diag_kernel_only",
                o.diag_skip);
  TESSERA_CHECK((o.diag_skip & ~(kDiagSkipOwnerAdd | kDiagSkipBandWait | kDiagSkipNotify)) == 0,
                "gemm_rs: diag_skip = {:#x} has unknown bits", o.diag_skip);
  if (s == Strategy::ring) return run_ring(c, a, o);
  const int R = c.pg.world(), rank = c.pg.rank();
  cudaStream_t st = c.pg.stream();
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(a.dtype));
  const RsPlan plan = plan_rs(a.m, a.n, R, rank, detail::kRsTileM, detail::kRsTileN);
  const std::int64_t per_rank = plan.shards.per_rank, ldr = plan.ld_recv;
  const std::int64_t ldd = a.ldd ? a.ldd : a.n;
  const std::size_t slab_bytes = static_cast<std::size_t>(per_rank * ldr * es);

  if (s == Strategy::fused_ce) {
    TESSERA_CHECK(plan.shards_on_tile_rows(),
                  "gemm_rs: fused_ce needs each rank's {} rows (ceil(M/R), M = {}) to be a multiple of the {}-row "
                  "tile; use fused_sm or automatic",
                  per_rank, a.m, plan.tile_m);
    return run_fused_ce(c, a, plan, o.diag_kernel_only, o.diag_skip);
  }
  if (s == Strategy::sequential) {
    // Partial [R·per_rank, ldr] (rows past M are never read back), then NCCL.
    void* part = c.staging.ensure(slab_bytes * R, st);
    row_parallel_gemm(a, 0, a.m, part, ldr, st);
    const bool direct = ldd == ldr && a.m_local == per_rank;
    void* out = direct ? a.d : c.rs_out.ensure(slab_bytes, st);
    TESSERA_NCCL_CHECK(ncclReduceScatter(part, out, static_cast<std::size_t>(per_rank * ldr),
                                         runtime::nccl_dtype(a.dtype), ncclSum, c.pg.nccl(), st));
    if (!direct)
      TESSERA_CUDA_CHECK(
          cudaMemcpy2DAsync(a.d, ldd * es, out, ldr * es, a.n * es, a.m_local, cudaMemcpyDeviceToDevice, st));
    return;
  }

  // fused_sm adds the peers' partials in its own tiles' epilogue when the
  // shards fall on tile rows (OpOptions::rs_reduce); counters are then per tile.
  const bool owner_epi = s == Strategy::fused_sm && o.rs_reduce == RsReduce::epilogue && plan.shards_on_tile_rows();
  c.ensure_rs(slab_bytes * R, owner_epi ? plan.tiles_m * plan.tiles_n : plan.tiles_m);
  const std::uint64_t e = ++c.rs_epoch;
  unsigned char* recv_local = c.rs_recv.local();
  detail::ReduceLaunch red;
  red.slabs = recv_local;
  red.per_rank = per_rank;
  red.ld_recv = ldr;
  red.rows = a.m_local;
  red.n = a.n;
  red.row0 = plan.shards.lo(rank);
  red.world = R;
  red.out = a.d;
  red.ldo = ldd;
  red.dtype = a.dtype;
  red.tile_m = plan.tile_m;
  red.sv = c.control->view();

  if (s == Strategy::decomposition) {
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
    TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_comm_done, cs));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(st, c.ev_comm_done, 0));
    for (int p = 0; p < R; ++p)
      if (p != rank) link::rank_wait(st, *c.control, p, kRsData, e);
    red.counters = nullptr;
    detail::launch_reduce(red, std::max(1, c.pg.sm_count()), st);
  } else {
    // fused_sm: peers' previous reductions must be done before we store.
    if (e > 1)
      for (int p = 0; p < R; ++p)
        if (p != rank) link::rank_wait(st, *c.control, p, kRsFree, e - 1);
    TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_ready, st));
    detail::GemmRsLaunch g = fused_launch(c, a, plan);
    const runtime::SignalView cv = c.rs_counters->view();
    for (int r = 0; r < R; ++r) g.counters[r] = cv.peer_counter(r, 0);
    if (owner_epi) {
      // No reduce kernel: the GEMM keeps every SM and nothing runs on the
      // comm stream.
      g.owner_epilogue = true;
      g.raster_group = plan.owner_raster_group();
      g.d = a.d;
      g.ldd = ldd;
      g.counters[rank] = cv.counter(0);
      g.max_ctas = 0;
      detail::launch_gemm_rs(g, st);
      for (int p = 0; p < R; ++p)
        if (p != rank) link::rank_notify(st, *c.control, p, kRsFree, e);
      return;
    }
    g.max_ctas = c.pg.sm_count() - o.comm_ctas;
    // GEMM first, then the reducer (which spins on the GEMMs' counters): a
    // lazily loaded reducer module then waits for nothing that waits for it.
    detail::launch_gemm_rs(g, st);
    cudaStream_t cs = c.comm();
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, c.ev_ready, 0));
    red.counters = cv.counter(0);
    red.expected = plan.expected_per_tile_row();
    detail::launch_reduce(red, o.comm_ctas, cs);
    TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_comm_done, cs));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(st, c.ev_comm_done, 0));
  }
  for (int p = 0; p < R; ++p)
    if (p != rank) link::rank_notify(st, *c.control, p, kRsFree, e);
}

}  // namespace tessera::ops
