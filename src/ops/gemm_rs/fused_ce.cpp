// GEMM+RS fused_ce: the engine GEMM, remote bands copied to their owners
// by the copy engine, owners adding them in their own tiles' epilogue
// (needs ceil(M/R) a multiple of the 64-row tile). GEMM+AR's fused_ce runs
// the same with an ArTail (send_reduced_bands).
#include <algorithm>

#include "gemm_rs.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops {

namespace {

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
  const auto [R, rank, st, es] = rs::env(c, a);
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
  detail::GemmRsArguments g = rs::fused_launch(c, a, plan, detail::RsEpilogueKind::stage_ce, 0);
  g.rs.stage = stage;
  g.rs.band_count = bv.flag_from(rank, 0);
  g.rs.band_flags = {bv.flag_from(0, 0), bv.slots, e};
  g.rs.diag_skip = diag_skip;
  g.rs.count_own = ar != nullptr;
  detail::launch_gemm_rs(g, st);

  const std::uint64_t band_tiles = static_cast<std::uint64_t>(G) * plan.tiles_n;
  const std::int64_t band_rows = static_cast<std::int64_t>(G) * plan.tile_m;
  const std::size_t chunk_target =
      static_cast<std::size_t>(env::find_int("TESSERA_RS_COPY_CHUNK_KB", 0, std::int64_t{1} << 30)
                                   .value_or(static_cast<std::int64_t>(kRsCopyChunkBytes >> 10)))
      << 10;
  cudaStream_t cs = c.comm();
  if (!kernel_only) TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, c.ev_ready, 0));
  for (int j = 1; j < R; ++j) {  // the schedule's order: owners rank+1, rank+2, ...
    const int owner = (rank + j) % R;
    const std::int64_t lo = plan.shards.lo(owner), rows = plan.shards.rows(a.m, owner);
    // The owner must be done with the previous call's slabs before we write them.
    if (e > 1 && !kernel_only) link::rank_wait(cs, *c.control, owner, kRsFree, e - 1);
    // Consecutive bands go in one copy (rs_copy_chunk_bands): wait for each
    // band's tiles, copy them together, then store each band's flag.
    const int owner_bands = static_cast<int>((rows + band_rows - 1) / band_rows);
    const std::int64_t chunk_rows =
        band_rows * rs_copy_chunk_bands(static_cast<std::size_t>(band_rows * ldr * es), owner_bands, chunk_target);
    for (std::int64_t c0 = 0; c0 < rows; c0 += chunk_rows) {
      const std::int64_t c1 = std::min(rows, c0 + chunk_rows);
      for (std::int64_t r0 = c0; r0 < c1; r0 += band_rows) {
        const int b = static_cast<int>((lo + r0) / band_rows);
        // The kernel counts this band's tiles in every call (kernel_only too,
        // unless told not to): the running total is what the copy wait
        // compares against.
        if (!(diag_skip & kDiagSkipNotify)) c.rs_band_total[b] += band_tiles;
        if (!kernel_only) link::rank_wait(cs, *c.rs_bands, rank, b, c.rs_band_total[b]);
      }
      if (kernel_only) continue;
      const std::size_t off = static_cast<std::size_t>((static_cast<std::int64_t>(rank) * per_rank + c0) * ldr * es);
      link::rank_copy_data(
          cs, static_cast<unsigned char*>(c.rs_recv.peer(owner)) + off,
          stage + static_cast<std::size_t>((static_cast<std::int64_t>(owner) * per_rank + c0) * ldr * es),
          static_cast<std::size_t>((c1 - c0) * ldr * es));
      for (std::int64_t r0 = c0; r0 < c1; r0 += band_rows)
        link::rank_notify(cs, *c.rs_bands, owner, static_cast<int>((lo + r0) / band_rows), e);
    }
  }
  if (kernel_only) return;
  if (ar) send_reduced_bands(c, a, plan, *ar, e, bands);
  rs::join(c, cs);
  rs::notify_free(c, e);
}

namespace rs {
namespace {

void run(TpContext::Impl& c, const GemmRsArgs& a, const OpOptions& o) {
  const RsPlan plan = tile_plan(c, a);
  TESSERA_CHECK(plan.shards_on_tile_rows(),
                "gemm_rs: fused_ce needs each rank's {} rows (ceil(M/R), M = {}) to be a multiple of the {}-row "
                "tile; use fused_sm or automatic",
                plan.shards.per_rank, a.m, plan.tile_m);
  run_fused_ce(c, a, plan, o.diag_kernel_only, o.diag_skip);
}

}  // namespace

const TpStrategy<GemmRsArgs> fused_ce{.strategy = Strategy::fused_ce,
                                      .needs = {.min_world = 2, .lsa = true, .tile_row_shards = true},
                                      .launch = &run,
                                      .diag_kernel_only = true};

}  // namespace rs
}  // namespace tessera::ops
