// tessera/kernels/gemm/launch.cuh — templated host entry point of the GEMM
// engine, for callers that plug in their own policies (ops::, signal::).
//
//   gemm_with<InT>(args, options, prologue, epilogue, scheduler, stream)
//   gemm_with_tile<GemmTile::T128x256, InT, BLayout::NK>(...)   // one kernel only
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

#include <type_traits>

#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/gemm/host_detail.hpp"
#include "tessera/kernels/gemm/kernel.cuh"

namespace tessera::kernels {


template <GemmTile T>
struct TileCfgOf;
template <>
struct TileCfgOf<GemmTile::T128x256> {
  using type = engine::TileConfig<128, 256, 4>;
};
template <>
struct TileCfgOf<GemmTile::T256x128> {
  using type = engine::TileConfig<256, 128, 4>;
};
template <>
struct TileCfgOf<GemmTile::T128x128> {
  using type = engine::TileConfig<128, 128, 6>;
};

template <GemmTile Tile, class InT, BLayout Layout, class Pro, class Epi, class Sched>
void gemm_with_tile(const GemmArgs& a, const GemmOptions& o, const Pro& pro, const Epi& epi, const Sched& sched,
                    cudaStream_t stream) {
  static_assert(std::is_same_v<InT, __nv_bfloat16> || std::is_same_v<InT, __half>, "InT: bf16 or f16");
  using Cfg = typename TileCfgOf<Tile>::type;
  constexpr bool kTransB = Layout == BLayout::KN;
  detail::check_instantiation(a, Layout, std::is_same_v<InT, __half> ? DType::f16 : DType::bf16, o.max_ctas);

  CUtensorMap tma_a, tma_b;
  detail::make_tma_a(a, Cfg::BM, &tma_a);
  detail::make_tma_b(a, Cfg::BN, &tma_b);

  engine::KernelParams<Pro, Epi, Sched> p{};
  p.M = static_cast<int>(a.m);
  p.N = static_cast<int>(a.n);
  p.K = static_cast<int>(a.k);
  p.tiles_m = static_cast<int>((a.m + Cfg::BM - 1) / Cfg::BM);
  p.tiles_n = static_cast<int>((a.n + Cfg::BN - 1) / Cfg::BN);
  p.prologue = pro;
  p.epilogue = epi;
  p.scheduler = sched;

  const int sms = detail::sm_count();
  const int cap = o.max_ctas > 0 ? std::min(o.max_ctas, sms) : sms;
  const int grid = std::min(cap, p.tiles_m * p.tiles_n);

  auto kernel = engine::gemm_kernel<Cfg, InT, kTransB, Pro, Epi, Sched>;
  constexpr int smem = engine::SmemLayout<Cfg, InT>::kLaunchBytes;
  // Cheap, and per device: set it every launch rather than cache it wrongly.
  detail::cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                     "cudaFuncSetAttribute(gemm kernel, max dynamic smem)");
  kernel<<<grid, Cfg::kThreads, smem, stream>>>(tma_a, tma_b, p);
  detail::check_launch("gemm kernel launch");
}

/// Dispatches over the tile shape `t` for one B layout.
template <class InT, BLayout L, class Pro, class Epi, class Sched>
void gemm_with_layout(GemmTile t, const GemmArgs& a, const GemmOptions& o, const Pro& pro, const Epi& epi,
                      const Sched& sched, cudaStream_t stream) {
  switch (t) {
    case GemmTile::T128x256: return gemm_with_tile<GemmTile::T128x256, InT, L>(a, o, pro, epi, sched, stream);
    case GemmTile::T256x128: return gemm_with_tile<GemmTile::T256x128, InT, L>(a, o, pro, epi, sched, stream);
    case GemmTile::T128x128: return gemm_with_tile<GemmTile::T128x128, InT, L>(a, o, pro, epi, sched, stream);
    default: detail::fail("gemm: unresolved tile " + tile_name(t));
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
