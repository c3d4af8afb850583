// src/ops/fused_gemm.cuh — instantiations of the fused TP GEMMs for one
// input type (included by fused_gemm_bf16.cu / fused_gemm_f16.cu so that the
// two types compile in parallel). One tile for every fused GEMM (the
// ping-pong 64x256; see tp_launchers.hpp) keeps the kernel count, and the
// build time, small.
#pragma once

#include <string>

#include "tessera/ops/fused_policies.cuh"
#include "tp_launchers.hpp"
#include "tessera/kernels/gemm/launch.cuh"
#include "tessera/runtime/wait_diagnostics.hpp"

namespace tessera::ops::detail {

inline constexpr kernels::GemmTile kAgTile = kernels::GemmTile::T64x256;  // ping-pong
inline constexpr kernels::GemmTile kRsTile = kernels::GemmTile::T64x256;  // ping-pong
static_assert(kAgTileM == 64 && kRsTileM == 64 && kRsTileN == 256, "tiles and plan constants must agree");

/// The fields every flag-waiting prologue of the fused ops shares: its flag
/// rows, rank and epoch, and the runtime's wait timeout and diagnostics.
template <class Pro>
void set_flag_wait(Pro& pro, const std::uint64_t* flags, int flag_stride, int rank, std::uint64_t epoch) {
  pro.flags = flags;
  pro.flag_stride = flag_stride;
  pro.rank = rank;
  pro.epoch = epoch;
  pro.timeout_ns = runtime::wait_timeout_ns();
  pro.diag = runtime::process_wait_diagnostics().device_record();
}

/// The fields the owner-adding GEMM+RS epilogues share (RsStageEpilogue,
/// RsOwnerEpilogue): this rank's output rows and the shard geometry.
template <class Epi, class T>
void set_owner_rows(Epi& epi, const GemmRsLaunch& p) {
  epi.d = static_cast<T*>(p.d);
  epi.ldd = p.ldd;
  epi.per_rank = p.per_rank;
  epi.ld = p.ld_recv;
  epi.rank = p.rank;
  epi.world = p.world;
}

template <class T>
void ag_gemm_typed(const AgGemmLaunch& p, cudaStream_t s) {
  kernels::GemmArgs g{};
  g.a = p.a;
  g.b = p.b;
  g.d = p.d;
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.lda = p.k;
  g.ldb = p.ldb;
  g.ldd = p.ldd;
  g.in = p.dtype;
  g.out = p.dtype;
  g.b_layout = kernels::BLayout::NK;
  kernels::GemmOptions o{};
  o.tile = kAgTile;
  o.ping_pong = true;
  o.max_ctas = p.max_ctas;
  AgPrologue pro;
  pro.map = p.map;
  set_flag_wait(pro, p.flags, p.flag_stride, p.rank, p.epoch);
  if (p.local && p.local_rows > 0) {
    if (!ag_local_rows_on_tiles(p.local_lo, p.local_rows, p.m))
      kernels::detail::fail("ag_gemm: the own shard read in place must start on a tile row and end on one or at M");
    kernels::GemmArgs l = g;
    l.a = p.local;
    l.m = p.local_rows;
    l.lda = p.local_lda;
    kernels::detail::make_tma_a(l, kAgTileM, &pro.local_a);
    pro.local_lo = p.local_lo;
    pro.local_hi = p.local_lo + p.local_rows;
  }
  // Own shard first, then shards in arrival order (plan.hpp).
  const kernels::engine::RasterScheduler sched{8, false, p.rotate_m};
  if (p.swiglu) {
    kernels::engine::StdEpilogue<T, kernels::engine::kEpiSwiGLU> epi;
    epi.d = static_cast<T*>(p.d);
    epi.ldd = p.ldd;
    kernels::gemm_with_tile_ping_pong<kAgTile, T, kernels::BLayout::NK>(g, o, pro, epi, sched, s);
  } else {
    kernels::engine::StdEpilogue<T, kernels::engine::kEpiPlain> epi;
    epi.d = static_cast<T*>(p.d);
    epi.ldd = p.ldd;
    kernels::gemm_with_tile_ping_pong<kAgTile, T, kernels::BLayout::NK>(g, o, pro, epi, sched, s);
  }
}

// fused_ce's GEMM (RsStageEpilogue + RsBandPrologue).
template <class T>
void gemm_rs_stage(const GemmRsLaunch& p, const kernels::GemmArgs& g, const kernels::GemmOptions& o,
                   const kernels::engine::RasterScheduler& sched, cudaStream_t s) {
  // Bands are RsPlan::owner_raster_group() tile rows: a power of two (a
  // divisor of 8), so the kernel finds a tile's band with a shift.
  const int band_rows = p.raster_group;
  if (band_rows < 1 || (band_rows & (band_rows - 1)) != 0)
    kernels::detail::fail("gemm_rs fused_ce: raster band of " + std::to_string(band_rows) +
                          " tile rows is not a power of two");
  int band_shift = 0;
  while ((1 << band_shift) < band_rows) ++band_shift;
  RsStageEpilogue<T> epi;
  epi.stage = static_cast<T*>(p.stage);
  epi.recv = static_cast<const T*>(p.recv[p.rank]);
  epi.band_count = p.band_count;
  set_owner_rows<RsStageEpilogue<T>, T>(epi, p);
  epi.band_shift = band_shift;
  epi.diag_skip = p.diag_skip;
  epi.count_own = p.count_own;
  RsBandPrologue pro;
  set_flag_wait(pro, p.band_flags, p.flag_stride, p.rank, p.epoch);
  pro.per_rank = p.per_rank;
  pro.world = p.world;
  pro.band_shift = band_shift;
  pro.diag_skip = p.diag_skip;
  kernels::gemm_with_tile_ping_pong<kRsTile, T, kernels::BLayout::NK>(g, o, pro, epi, sched, s);
}

template <class T>
void gemm_rs_typed(const GemmRsLaunch& p, cudaStream_t s) {
  kernels::GemmArgs g{};
  g.a = p.a;
  g.b = p.b;
  g.d = p.recv[p.rank];  // unused by the epilogue; keeps validation meaningful
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.lda = p.lda;
  g.ldb = p.ldb;
  g.ldd = p.ld_recv;
  g.in = p.dtype;
  g.out = p.dtype;
  g.b_layout = kernels::BLayout::NK;
  kernels::GemmOptions o{};
  o.tile = kRsTile;
  o.ping_pong = true;
  o.max_ctas = p.max_ctas;
  // Remotely-owned tiles first: start at shard (rank + 1) mod R.
  const kernels::engine::RasterScheduler sched{p.raster_group, false, p.rotate_m};
  if (p.stage_ce) {
    gemm_rs_stage<T>(p, g, o, sched, s);
    return;
  }
  if (p.owner_epilogue) {
    RsOwnerEpilogue<T> epi;
    for (int r = 0; r < runtime::kMaxPeers; ++r) {
      epi.recv[r] = static_cast<T*>(p.recv[r]);
      epi.counters[r] = p.counters[r];
    }
    set_owner_rows<RsOwnerEpilogue<T>, T>(epi, p);
    RsOwnerPrologue pro;
    pro.counters = p.counters[p.rank];
    pro.per_rank = p.per_rank;
    pro.rank = p.rank;
    pro.expected = static_cast<std::uint64_t>(p.world - 1);
    pro.timeout_ns = runtime::wait_timeout_ns();
    pro.diag = runtime::process_wait_diagnostics().device_record();
    kernels::gemm_with_tile_ping_pong<kRsTile, T, kernels::BLayout::NK>(g, o, pro, epi, sched, s);
    return;
  }
  RsEpilogue<T> epi;
  for (int r = 0; r < runtime::kMaxPeers; ++r) {
    epi.recv[r] = static_cast<T*>(p.recv[r]);
    epi.counters[r] = p.counters[r];
  }
  epi.per_rank = p.per_rank;
  epi.ld = p.ld_recv;
  epi.rank = p.rank;
  kernels::gemm_with_tile_ping_pong<kRsTile, T, kernels::BLayout::NK>(g, o, kernels::engine::NoWait{}, epi, sched, s);
}

template <class T>
void preload_typed() {
  using Cfg = kernels::PingPongCfgOf<kAgTile>::type;
  using RsCfg = kernels::PingPongCfgOf<kRsTile>::type;
  using Sched = kernels::engine::RasterScheduler;
  cudaFuncAttributes attr{};
  kernels::detail::cuda_check(
      cudaFuncGetAttributes(
          &attr, kernels::engine::gemm_kernel<Cfg, T, false, AgPrologue,
                                              kernels::engine::StdEpilogue<T, kernels::engine::kEpiPlain>, Sched>()),
      "ops: preload AG GEMM");
  kernels::detail::cuda_check(
      cudaFuncGetAttributes(
          &attr, kernels::engine::gemm_kernel<Cfg, T, false, AgPrologue,
                                              kernels::engine::StdEpilogue<T, kernels::engine::kEpiSwiGLU>, Sched>()),
      "ops: preload AG GEMM (SiLU*up)");
  kernels::detail::cuda_check(
      cudaFuncGetAttributes(
          &attr, kernels::engine::gemm_kernel<RsCfg, T, false, kernels::engine::NoWait, RsEpilogue<T>, Sched>()),
      "ops: preload RS GEMM");
  kernels::detail::cuda_check(
      cudaFuncGetAttributes(
          &attr, kernels::engine::gemm_kernel<RsCfg, T, false, RsOwnerPrologue, RsOwnerEpilogue<T>, Sched>()),
      "ops: preload RS GEMM (owner epilogue)");
  kernels::detail::cuda_check(
      cudaFuncGetAttributes(&attr,
                            kernels::engine::gemm_kernel<RsCfg, T, false, RsBandPrologue, RsStageEpilogue<T>, Sched>()),
      "ops: preload RS GEMM (copy engine)");
}

}  // namespace tessera::ops::detail
