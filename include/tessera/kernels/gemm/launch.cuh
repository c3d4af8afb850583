// tessera/kernels/gemm/launch.cuh — templated host entry point of the GEMM
// engine, for callers that plug in their own policies (ops::, signal::).
//
//   gemm_with<InT>(args, options, prologue, epilogue, scheduler, stream)
//   gemm_with_tile<GemmTile::T128x256, InT, BLayout::NK>(...)   // one kernel only
//   gemm_with_tile_ping_pong<GemmTile::T128x128, InT, BLayout::NK>(...)  // ping-pong
//   gemm_with_layout_ping_pong<InT, BLayout::NK>(tile, ...)      // both ping-pong tiles
//
// Ping-pong (GemmOptions::ping_pong) kernels are compiled only where a
// caller asks for them through the *_overlap entry points, so existing callers
// compile no extra kernels; the other entry points reject ping_pong.
//
// InT is __nv_bfloat16 or __half and must match args.in. The epilogue owns
// the output (args.d / args.out are ignored here; StdEpilogue carries d, ldd);
// its output must be sized for the chosen tile when it reorders (query
// resolve_tile()/tile_shape() first). Validation of A, B, M, N, K happens
// before launch (tessera::Error); the epilogue's and prologue's pointers are
// the caller's responsibility.
//
// This header does not include tessera/runtime/error.hpp: fmt 9's headers do
// not compile under nvcc 13 (constexpr errors), so every check lives in host
// .cpp code reached through detail:: functions (which throw tessera::Error).
//
// Every instantiation compiles one kernel per (tile, layout) it can reach:
// gemm_with reaches 6, gemm_with_tile exactly 1 — prefer it in ops code that
// knows its tile.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <type_traits>

#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/gemm/host_detail.hpp"
#include "tessera/kernels/gemm/kernel.cuh"

namespace tessera::kernels {

/// The kernel configuration of cooperative tile T: its shape is
/// tile_shape(T); the specializations state the smem stages.
template <GemmTile T, int kStages, int kClusterM>
using CoopCfg = engine::TileConfig<tile_shape(T).bm, tile_shape(T).bn, kStages, kClusterM>;
template <GemmTile T, int kClusterM>
struct TileCfgOf;
template <int C>
struct TileCfgOf<GemmTile::T128x256, C> {
  using type = CoopCfg<GemmTile::T128x256, 4, C>;
};
template <int C>
struct TileCfgOf<GemmTile::T256x128, C> {
  using type = CoopCfg<GemmTile::T256x128, 4, C>;
};
template <int C>
struct TileCfgOf<GemmTile::T128x128, C> {
  using type = CoopCfg<GemmTile::T128x128, 6, C>;
};
/// 128x192 (plain gemm() only): 5 x 40 KiB stages; no clusters (a 96-column
/// half of B is not a whole number of 64-column chunks).
template <>
struct TileCfgOf<GemmTile::T128x192, 1> {
  using type = CoopCfg<GemmTile::T128x192, 5, 1>;
};

/// Ping-pong configs: each consumer warpgroup owns a whole tile (kMAtoms =
/// BM/64 atoms, 128 accumulator registers per thread in both). Stages fill the
/// 227 KiB of shared memory: 7 x 32 KiB, 5 x 40 KiB.
template <GemmTile T, int kStages>
using PingPongCfg = engine::TileConfig<tile_shape(T).bm, tile_shape(T).bn, kStages, 1, 2, true>;
template <GemmTile T>
struct PingPongCfgOf;
template <>
struct PingPongCfgOf<GemmTile::T128x128> {
  using type = PingPongCfg<GemmTile::T128x128, 7>;
};
template <>
struct PingPongCfgOf<GemmTile::T64x256> {
  using type = PingPongCfg<GemmTile::T64x256, 5>;
};
/// 64x64 (plain gemm() for M <= 64, and its split-K): 13 x 16 KiB stages.
template <>
struct PingPongCfgOf<GemmTile::T64x64> {
  using type = PingPongCfg<GemmTile::T64x64, 13>;
};

/// The kernel's parameters for configuration Cfg, made once per launch: the
/// problem in tiles and the policies, with a RasterScheduler's divisions
/// prepared (scheduler.cuh) for the grid the kernel walks: tile pairs with a
/// cluster (TileWalk, kernel_common.cuh).
template <class Cfg, class Pro, class Epi, class Sched>
engine::KernelParams<Pro, Epi, Sched> make_kernel_params(const GemmArgs& a, const Pro& pro, const Epi& epi,
                                                         const Sched& sched) {
  engine::KernelParams<Pro, Epi, Sched> p{};
  p.M = static_cast<int>(a.m);
  p.N = static_cast<int>(a.n);
  p.K = static_cast<int>(a.k);
  p.tiles_m = static_cast<int>((a.m + Cfg::BM - 1) / Cfg::BM);
  p.tiles_n = static_cast<int>((a.n + Cfg::BN - 1) / Cfg::BN);
  p.prologue = pro;
  p.epilogue = epi;
  p.scheduler = sched;
  if constexpr (std::is_same_v<Sched, engine::RasterScheduler>)
    p.scheduler.prepare(Cfg::kClusterM == 1 ? p.tiles_m : (p.tiles_m + 1) / 2, p.tiles_n);
  return p;
}

/// Launches the kernel of configuration Cfg (shared by the entry points below).
template <class Cfg, class InT, BLayout Layout, class Pro, class Epi, class Sched>
void launch_config(const GemmArgs& a, const GemmOptions& o, const Pro& pro, const Epi& epi, const Sched& sched,
                   cudaStream_t stream) {
  static_assert(std::is_same_v<InT, __nv_bfloat16> || std::is_same_v<InT, __half>, "InT: bf16 or f16");
  constexpr int kClusterM = Cfg::kClusterM;
  constexpr bool kTransB = Layout == BLayout::KN;
  detail::check_instantiation(a, Layout, std::is_same_v<InT, __half> ? DType::f16 : DType::bf16, o.max_ctas);

  CUtensorMap tma_a, tma_b;
  detail::make_tma_a(a, Cfg::BM, &tma_a);
  detail::make_tma_b(a, Cfg::BN / kClusterM, &tma_b);  // each CTA of a cluster loads its share of B

  const engine::KernelParams<Pro, Epi, Sched> p = make_kernel_params<Cfg>(a, pro, epi, sched);

  const int sms = detail::sm_count();
  const int cap = o.max_ctas > 0 ? std::min(o.max_ctas, sms) : sms;
  const auto kernel = engine::gemm_kernel<Cfg, InT, kTransB, Pro, Epi, Sched>();
  constexpr int smem = engine::SmemLayout<Cfg, InT>::kLaunchBytes;
  // Per kernel and device, once (a driver call per launch is host time the
  // GPU waits for on small problems); one bit per device.
  static std::atomic<uint64_t> smem_set{0};
  int smem_dev = 0;
  detail::cuda_check(cudaGetDevice(&smem_dev), "cudaGetDevice");
  if (smem_dev >= 64 || !((smem_set.load(std::memory_order_relaxed) >> smem_dev) & 1u)) {
    detail::cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                       "cudaFuncSetAttribute(gemm kernel, max dynamic smem)");
    if (smem_dev < 64) smem_set.fetch_or(uint64_t{1} << smem_dev, std::memory_order_relaxed);
  }
  if constexpr (kClusterM == 1) {
    const int grid = std::min(cap, engine::sched_units(p.scheduler, p.tiles_m, p.tiles_n));
    kernel<<<grid, Cfg::kThreads, smem, stream>>>(tma_a, tma_b, p);
  } else {
    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kClusterM;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(Cfg::kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    // Persistent grid: no more clusters than can be resident at once (not
    // every GPC has an even number of free SMs), nor than there are pairs.
    static int resident_clusters[64] = {};
    int dev = 0;
    detail::cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    if (dev < 64 && resident_clusters[dev] == 0) {
      cfg.gridDim = dim3(sms / kClusterM * kClusterM);
      int n = 0;
      detail::cuda_check(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg), "cudaOccupancyMaxActiveClusters");
      if (n <= 0) detail::fail("gemm: no 2-CTA cluster of this kernel fits on the device");
      resident_clusters[dev] = n;
    }
    const int pairs = ((p.tiles_m + 1) / 2) * p.tiles_n;
    const int clusters = std::max(1, std::min({cap / kClusterM, resident_clusters[dev < 64 ? dev : 0], pairs}));
    cfg.gridDim = dim3(clusters * kClusterM);
    detail::cuda_check(cudaLaunchKernelEx(&cfg, kernel, tma_a, tma_b, p), "cudaLaunchKernelEx(gemm kernel, cluster)");
  }
  detail::check_launch("gemm kernel launch");
}

/// One kernel: tile shape, input type, B layout and cluster size fixed.
/// kClusterM = 2 runs 2-CTA clusters along M with B multicast; the Scheduler
/// then orders tile pairs (see TileWalk in kernel_common.cuh).
template <GemmTile Tile, class InT, BLayout Layout, int kClusterM = 1, class Pro, class Epi, class Sched>
void gemm_with_tile(const GemmArgs& a, const GemmOptions& o, const Pro& pro, const Epi& epi, const Sched& sched,
                    cudaStream_t stream) {
  if (o.ping_pong)
    detail::fail("gemm: ping_pong needs the ping-pong kernels (gemm_with_tile_ping_pong); tile " + tile_name(Tile) +
                 " is the cooperative kernel");
  launch_config<typename TileCfgOf<Tile, kClusterM>::type, InT, Layout>(a, o, pro, epi, sched, stream);
}

/// One ping-pong kernel (Tile: T128x128 or T64x256), whatever o.ping_pong
/// says. No clusters (o.cluster_m must be 0 or 1).
template <GemmTile Tile, class InT, BLayout Layout, class Pro, class Epi, class Sched>
void gemm_with_tile_ping_pong(const GemmArgs& a, const GemmOptions& o, const Pro& pro, const Epi& epi,
                              const Sched& sched, cudaStream_t stream) {
  if (o.cluster_m > 1)
    detail::fail("gemm: cluster_m = " + std::to_string(o.cluster_m) + " with the ping-pong kernel (no clusters)");
  launch_config<typename PingPongCfgOf<Tile>::type, InT, Layout>(a, o, pro, epi, sched, stream);
}

/// Dispatches over the ping-pong tiles (t: T128x128 or T64x256, already
/// resolved, e.g. by resolve_tile with ping_pong set). T64x64 is not
/// dispatched here (the plain gemm() instantiates it itself).
template <class InT, BLayout L, class Pro, class Epi, class Sched>
void gemm_with_layout_ping_pong(GemmTile t, const GemmArgs& a, const GemmOptions& o, const Pro& pro, const Epi& epi,
                                const Sched& sched, cudaStream_t stream) {
  switch (t) {
    case GemmTile::T128x128:
      return gemm_with_tile_ping_pong<GemmTile::T128x128, InT, L>(a, o, pro, epi, sched, stream);
    case GemmTile::T64x256:
      return gemm_with_tile_ping_pong<GemmTile::T64x256, InT, L>(a, o, pro, epi, sched, stream);
    default:
      detail::fail("gemm: tile " + tile_name(t) + " has no ping-pong kernel (128x128 or 64x256)");
  }
}

/// Dispatches over the tile shape `t` and cluster size (resolve_cluster) for
/// one B layout. Clusters are used with RasterScheduler only (its rotate_m is
/// then converted to pairs; an odd rotate_m keeps cluster 1): other
/// schedulers see single tiles.
template <class InT, BLayout L, class Pro, class Epi, class Sched>
void gemm_with_layout(GemmTile t, const GemmArgs& a, const GemmOptions& o, const Pro& pro, const Epi& epi,
                      const Sched& sched, cudaStream_t stream) {
  if (o.ping_pong)
    detail::fail("gemm: ping_pong is compiled only through gemm_with_layout_ping_pong / gemm_with_tile_ping_pong");
  if (o.k_splits > 1)
    detail::fail("gemm: k_splits = " + std::to_string(o.k_splits) +
                 " is for the plain gemm() only (policies see whole tiles)");
  int cluster = 1;
  Sched s = sched;
  if constexpr (std::is_same_v<Sched, engine::RasterScheduler>) {
    cluster = resolve_cluster(a, o, t);
    if (cluster == 2 && s.rotate_m % 2 != 0) cluster = 1;
    if (cluster == 2) s.rotate_m /= 2;
  }
  switch (t) {
    case GemmTile::T128x256:
      if (cluster == 2) return gemm_with_tile<GemmTile::T128x256, InT, L, 2>(a, o, pro, epi, s, stream);
      return gemm_with_tile<GemmTile::T128x256, InT, L, 1>(a, o, pro, epi, s, stream);
    case GemmTile::T256x128:
      if (cluster == 2) return gemm_with_tile<GemmTile::T256x128, InT, L, 2>(a, o, pro, epi, s, stream);
      return gemm_with_tile<GemmTile::T256x128, InT, L, 1>(a, o, pro, epi, s, stream);
    case GemmTile::T128x128:
      return gemm_with_tile<GemmTile::T128x128, InT, L, 1>(a, o, pro, epi, s, stream);
    default:
      detail::fail("gemm: unresolved tile " + tile_name(t));
  }
}

/// Dispatches over the tile shape (options.tile, or the heuristic) and B's layout.
template <class InT, class Pro, class Epi, class Sched>
void gemm_with(const GemmArgs& a, const GemmOptions& o, const Pro& pro, const Epi& epi, const Sched& sched,
               cudaStream_t stream) {
  detail::validate_inputs(a, "gemm");
  const GemmTile t = resolve_tile(a, o);
  if (a.b_layout == BLayout::NK)
    gemm_with_layout<InT, BLayout::NK>(t, a, o, pro, epi, sched, stream);
  else
    gemm_with_layout<InT, BLayout::KN>(t, a, o, pro, epi, sched, stream);
}

/// The RasterScheduler described by the options.
inline engine::RasterScheduler raster_from(const GemmOptions& o) {
  return engine::RasterScheduler{o.raster_group, o.raster_along_m, o.rotate_m};
}

}  // namespace tessera::kernels
