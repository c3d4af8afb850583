// tessera/kernels/gemm/launch.cuh — templated host entry point of the GEMM
// engine, for callers that plug in their own policies (ops::, signal::):
//
//   gemm_with<Kernels, InT, Layout...>(args, options, prologue, epilogue, scheduler, stream)
//
// `Kernels` is a kernel set naming the kernels the call may run, and the
// only ones it compiles: Cooperative<Tile, kClusterM> or PingPong<Tile> (one
// kernel), CooperativeTiles or PingPongTiles (the tiles of the policy entry
// point, chosen by options.tile at run time). Each listed B layout compiles
// the set once more; args.b_layout picks one at run time.
//
//   gemm_with<PingPong<GemmTile::T64x256>, InT, BLayout::NK>(...)     // one kernel
//   gemm_with<CooperativeTiles, InT, BLayout::NK, BLayout::KN>(...)   // 10 kernels
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
/// tile_shape(T), its smem stages tile_stages(T); the specializations name
/// the tiles and clusters that are compiled.
template <GemmTile T, int kStages, int kClusterM, int kClusterN = 1>
using CoopCfg = engine::TileConfig<tile_shape(T).bm, tile_shape(T).bn, kStages, kClusterM, 2, false, kClusterN>;
template <GemmTile T, int kClusterM, int kClusterN = 1>
struct TileCfgOf;
template <int C, int CN>
struct TileCfgOf<GemmTile::T128x256, C, CN> {
  using type = CoopCfg<GemmTile::T128x256, tile_stages(GemmTile::T128x256, false), C, CN>;
};
template <int C>
struct TileCfgOf<GemmTile::T256x128, C> {
  using type = CoopCfg<GemmTile::T256x128, tile_stages(GemmTile::T256x128, false), C>;
};
template <int C, int CN>
struct TileCfgOf<GemmTile::T128x128, C, CN> {
  using type = CoopCfg<GemmTile::T128x128, tile_stages(GemmTile::T128x128, false), C, CN>;
};
/// 128x192 (plain gemm() only): 5 x 40 KiB stages; no clusters (a 96-column
/// half of B is not a whole number of 64-column chunks).
template <int CN>
struct TileCfgOf<GemmTile::T128x192, 1, CN> {
  using type = CoopCfg<GemmTile::T128x192, tile_stages(GemmTile::T128x192, false), 1, CN>;
};

/// Swapped tiles (plain gemm() with swap_ab only: D^T = B A^T, 128 rows of
/// N and 32, 64 or 96 of M): 11 x 20 KiB, 9 x 24 KiB, 8 x 28 KiB stages.
template <>
struct TileCfgOf<GemmTile::T128x32, 1> {
  using type = CoopCfg<GemmTile::T128x32, tile_stages(GemmTile::T128x32, false), 1>;
};
template <>
struct TileCfgOf<GemmTile::T128x64, 1> {
  using type = CoopCfg<GemmTile::T128x64, tile_stages(GemmTile::T128x64, false), 1>;
};
template <>
struct TileCfgOf<GemmTile::T128x96, 1> {
  using type = CoopCfg<GemmTile::T128x96, tile_stages(GemmTile::T128x96, false), 1>;
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
  using type = PingPongCfg<GemmTile::T128x128, tile_stages(GemmTile::T128x128, true)>;
};
template <>
struct PingPongCfgOf<GemmTile::T64x256> {
  using type = PingPongCfg<GemmTile::T64x256, tile_stages(GemmTile::T64x256, true)>;
};
/// 64x64 (plain gemm() for M <= 64, and its split-K): 13 x 16 KiB stages.
template <>
struct PingPongCfgOf<GemmTile::T64x64> {
  using type = PingPongCfg<GemmTile::T64x64, tile_stages(GemmTile::T64x64, true)>;
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
    p.scheduler.prepare((p.tiles_m + Cfg::kClusterM - 1) / Cfg::kClusterM,
                        (p.tiles_n + Cfg::kClusterN - 1) / Cfg::kClusterN);
  return p;
}

/// Launches the kernel of configuration Cfg (shared by the entry points below).
template <class Cfg, class InT, BLayout Layout, class Pro, class Epi, class Sched>
void launch_config(const GemmArgs& a, const GemmOptions& o, const Pro& pro, const Epi& epi, const Sched& sched,
                   cudaStream_t stream) {
  static_assert(std::is_same_v<InT, __nv_bfloat16> || std::is_same_v<InT, __half>, "InT: bf16 or f16");
  constexpr int kClusterM = Cfg::kClusterM, kClusterSize = Cfg::kClusterSize;
  constexpr bool kTransB = Layout == BLayout::KN;
  detail::check_instantiation(a, Layout, std::is_same_v<InT, __half> ? DType::f16 : DType::bf16, o.max_ctas);

  CUtensorMap tma_a, tma_b;
  // Each CTA of a cluster loads its share of the A and B tiles it shares.
  detail::make_tma_a(a, Cfg::BM / Cfg::kClusterN, &tma_a);
  detail::make_tma_b(a, Cfg::BN / kClusterM, &tma_b);

  const engine::KernelParams<Pro, Epi, Sched> p = make_kernel_params<Cfg>(a, pro, epi, sched);

  const int sms = detail::sm_count();
  const int cap = o.max_ctas > 0 ? std::min(o.max_ctas, sms) : sms;
  const auto kernel = engine::gemm_kernel<Cfg, InT, kTransB, Pro, Epi, Sched>();
  using Smem = engine::SmemLayout<Cfg, InT>;
  constexpr int smem =
      engine::kStoresThroughSmem<Cfg, InT, Epi> ? Smem::launch_bytes_with_staging() : Smem::kLaunchBytes;
  detail::set_max_dynamic_smem_once(reinterpret_cast<const void*>(kernel), smem,
                                    "cudaFuncSetAttribute(gemm kernel, max dynamic smem)");
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[2];
  cfg.blockDim = dim3(Cfg::kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 0;
  if constexpr (kClusterSize > 1) {
    attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attr[cfg.numAttrs].val.clusterDim.x = kClusterSize;
    attr[cfg.numAttrs].val.clusterDim.y = 1;
    attr[cfg.numAttrs].val.clusterDim.z = 1;
    ++cfg.numAttrs;
  }
  // Programmatic dependent launch for kernels without hooks (kernel_common.cuh,
  // kDependentLaunch): this launch and the CTAs' set-up overlap the previous
  // kernel's tail; the kernel waits for that kernel before touching memory.
  if constexpr (engine::kDependentLaunch<Pro, Epi>) {
    if (o.dependent_launch && detail::dependent_launch_enabled()) {
      attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
      ++cfg.numAttrs;
    }
  }
  if constexpr (kClusterSize == 1) {
    cfg.gridDim = dim3(std::min(cap, engine::sched_units(p.scheduler, p.tiles_m, p.tiles_n)));
    detail::cuda_check(cudaLaunchKernelEx(&cfg, kernel, tma_a, tma_b, p), "cudaLaunchKernelEx(gemm kernel)");
  } else {
    // Persistent grid: no more clusters than can be resident at once (a
    // cluster's CTAs share a GPC, whose free SMs need not be a multiple of
    // its size), nor than there are cluster tiles.
    static int resident_clusters[64] = {};
    int dev = 0;
    detail::cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    if (dev < 64 && resident_clusters[dev] == 0) {
      cfg.gridDim = dim3(sms / kClusterSize * kClusterSize);
      int n = 0;
      detail::cuda_check(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg), "cudaOccupancyMaxActiveClusters");
      if (n <= 0)
        detail::fail("gemm: no " + std::to_string(kClusterSize) + "-CTA cluster of this kernel fits on the device");
      resident_clusters[dev] = n;
    }
    const int cluster_tiles =
        ((p.tiles_m + kClusterM - 1) / kClusterM) * ((p.tiles_n + Cfg::kClusterN - 1) / Cfg::kClusterN);
    const int clusters =
        std::max(1, std::min({cap / kClusterSize, resident_clusters[dev < 64 ? dev : 0], cluster_tiles}));
    cfg.gridDim = dim3(clusters * kClusterSize);
    detail::cuda_check(cudaLaunchKernelEx(&cfg, kernel, tma_a, tma_b, p), "cudaLaunchKernelEx(gemm kernel, cluster)");
  }
  detail::check_launch("gemm kernel launch");
}

/// Kernel sets: gemm_with's compile-time argument, naming the kernels one
/// instantiation compiles (each is one kernel per policy combination and B
/// layout, so a caller names only those it runs; fused ops name ONE tile).
///
/// One cooperative kernel (o.ping_pong must be off). kClusterM = 2 runs
/// clusters of 2 CTAs along M sharing B (multicast), kClusterN = 2 along N
/// sharing A; the Scheduler then orders cluster tiles (see TileWalk in
/// kernel_common.cuh).
template <GemmTile Tile, int kClusterM = 1, int kClusterN = 1>
struct Cooperative {
  static constexpr bool kPingPong = false;
  template <class InT, BLayout L, class Pro, class Epi, class Sched>
  static void launch(const GemmArgs& a, const GemmOptions& o, const Pro& pro, const Epi& epi, const Sched& sched,
                     cudaStream_t stream) {
    if (o.ping_pong)
      detail::fail("gemm: ping_pong needs a ping-pong kernel set (PingPong, PingPongTiles); tile " + tile_name(Tile) +
                   " is the cooperative kernel");
    launch_config<typename TileCfgOf<Tile, kClusterM, kClusterN>::type, InT, L>(a, o, pro, epi, sched, stream);
  }
};

/// One ping-pong kernel (T128x128, T64x256; T64x64 for the plain gemm()),
/// whatever o.ping_pong says. No clusters (o.cluster_m must be 0 or 1).
template <GemmTile Tile>
struct PingPong {
  static constexpr bool kPingPong = true;
  template <class InT, BLayout L, class Pro, class Epi, class Sched>
  static void launch(const GemmArgs& a, const GemmOptions& o, const Pro& pro, const Epi& epi, const Sched& sched,
                     cudaStream_t stream) {
    if (o.cluster_m > 1 || o.cluster_n > 1)
      detail::fail("gemm: cluster_m = " + std::to_string(o.cluster_m) + ", cluster_n = " + std::to_string(o.cluster_n) +
                   " with the ping-pong kernel (no clusters)");
    launch_config<typename PingPongCfgOf<Tile>::type, InT, L>(a, o, pro, epi, sched, stream);
  }
};

/// The ping-pong tiles of the policy entry point, by o.tile: T128x128
/// (also for Auto) or T64x256. T64x64 is not in the set (the plain gemm()
/// names it itself).
struct PingPongTiles {
  template <class InT, BLayout L, class Pro, class Epi, class Sched>
  static void launch(const GemmArgs& a, const GemmOptions& o, const Pro& pro, const Epi& epi, const Sched& sched,
                     cudaStream_t stream) {
    switch (o.tile) {
      case GemmTile::Auto:
      case GemmTile::T128x128:
        return PingPong<GemmTile::T128x128>::launch<InT, L>(a, o, pro, epi, sched, stream);
      case GemmTile::T64x256:
        return PingPong<GemmTile::T64x256>::launch<InT, L>(a, o, pro, epi, sched, stream);
      default:
        detail::fail("gemm: tile " + tile_name(o.tile) + " has no ping-pong kernel (128x128 or 64x256)");
    }
  }
};

/// The cooperative tiles of the policy entry point, by o.tile (Auto: the
/// heuristic, resolve_tile) and cluster size (resolve_cluster): 128x256 and
/// 256x128 (1- and 2-CTA clusters), 128x128. Clusters are used with
/// RasterScheduler only (its rotate_m is then converted to pairs; an odd
/// rotate_m keeps cluster 1): other schedulers see single tiles. o.ping_pong
/// and o.k_splits > 1 are rejected (policies see whole tiles).
struct CooperativeTiles {
  template <class InT, BLayout L, class Pro, class Epi, class Sched>
  static void launch(const GemmArgs& a, const GemmOptions& o, const Pro& pro, const Epi& epi, const Sched& sched,
                     cudaStream_t stream) {
    if (o.ping_pong) detail::fail("gemm: ping_pong needs a ping-pong kernel set (PingPong, PingPongTiles)");
    if (o.cluster_n > 1)
      detail::fail("gemm: cluster_n = " + std::to_string(o.cluster_n) +
                   " is for the plain gemm() only (the policy entry point's clusters run along M)");
    if (o.k_splits > 1)
      detail::fail("gemm: k_splits = " + std::to_string(o.k_splits) +
                   " is for the plain gemm() only (policies see whole tiles)");
    if (o.tile == GemmTile::Auto) detail::validate_inputs(a, "gemm");  // the heuristic reads the shape
    const GemmTile t = resolve_tile(a, o);
    int cluster = 1;
    Sched s = sched;
    if constexpr (std::is_same_v<Sched, engine::RasterScheduler>) {
      cluster = resolve_cluster(a, o, t);
      if (cluster == 2 && s.rotate_m % 2 != 0) cluster = 1;
      if (cluster == 2) s.rotate_m /= 2;
    }
    switch (t) {
      case GemmTile::T128x256:
        if (cluster == 2) return Cooperative<GemmTile::T128x256, 2>::launch<InT, L>(a, o, pro, epi, s, stream);
        return Cooperative<GemmTile::T128x256, 1>::launch<InT, L>(a, o, pro, epi, s, stream);
      case GemmTile::T256x128:
        if (cluster == 2) return Cooperative<GemmTile::T256x128, 2>::launch<InT, L>(a, o, pro, epi, s, stream);
        return Cooperative<GemmTile::T256x128, 1>::launch<InT, L>(a, o, pro, epi, s, stream);
      case GemmTile::T128x128:
        return Cooperative<GemmTile::T128x128, 1>::launch<InT, L>(a, o, pro, epi, s, stream);
      default:
        detail::fail("gemm: tile " + tile_name(t) + " is not a cooperative tile of the policy entry point");
    }
  }
};

/// The one policy entry point: runs the kernel of set `Kernels` that
/// (args, options) select, with B layout args.b_layout among `Layout,
/// More...` (each listed layout compiles the set's kernels once more).
template <class Kernels, class InT, BLayout Layout, BLayout... More, class Pro, class Epi, class Sched>
void gemm_with(const GemmArgs& a, const GemmOptions& o, const Pro& pro, const Epi& epi, const Sched& sched,
               cudaStream_t stream) {
  if constexpr (sizeof...(More) > 0) {
    if (a.b_layout == Layout) return Kernels::template launch<InT, Layout>(a, o, pro, epi, sched, stream);
    return gemm_with<Kernels, InT, More...>(a, o, pro, epi, sched, stream);
  } else {
    Kernels::template launch<InT, Layout>(a, o, pro, epi, sched, stream);
  }
}

/// The RasterScheduler described by the options.
inline engine::RasterScheduler raster_from(const GemmOptions& o) {
  return engine::RasterScheduler{o.raster_group, o.raster_along_m, o.rotate_m};
}

}  // namespace tessera::kernels
