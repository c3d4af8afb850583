// tessera/kernels/gemm/grouped_launch.cuh — templated host entry point of
// the grouped GEMM, for callers that plug in their own policies (the MoE
// operators: a per-expert-tile wait, a per-expert notify).
//
//   grouped_gemm_with_tile<GroupedTile::Coop128x256, InT, BLayout::NK>(
//       args, options, prologue, epilogue, stream)
//
// The epilogue owns the output (args.d / args.out are not used here; a
// StdEpilogue or GroupedEpilogue carries d and ldd). Validation of A, B,
// the table and the shape happens before launch (tessera::Error); the
// policies' own pointers are the caller's. Like launch.cuh, this header does
// not include error.hpp (fmt under nvcc): checks live in grouped_gemm.cpp.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <type_traits>

#include "tessera/kernels/gemm/grouped_kernel.cuh"
#include "tessera/kernels/gemm/host_detail.hpp"
#include "tessera/kernels/grouped_gemm.hpp"

namespace tessera::kernels {

template <GroupedTile T>
struct GroupedCfgOf;
template <>
struct GroupedCfgOf<GroupedTile::Coop128x256> {
  using type = engine::TileConfig<128, 256, 4>;
};
template <>
struct GroupedCfgOf<GroupedTile::Coop128x128> {
  using type = engine::TileConfig<128, 128, 6>;
};
/// Ping-pong: 6 stages (not the engine's 7) leave room for the group table.
template <>
struct GroupedCfgOf<GroupedTile::PingPong128x128> {
  using type = engine::TileConfig<128, 128, 6, 1, 2, true>;
};
template <>
struct GroupedCfgOf<GroupedTile::PingPong64x256> {
  using type = engine::TileConfig<64, 256, 5, 1, 2, true>;
};

namespace detail {
/// validate()'s input checks (A, B, table, shape; not D) + the instantiation
/// matches (layout, input type, row gather or not) + max_ctas >= 0.
void grouped_check_instantiation(const GroupedGemmArgs& a, BLayout layout, DType in, int max_ctas, bool gather);
/// A: 2-D [max(max_rows, 1), K] (gathering: the source, [a_rows, K], which
/// the kernel reads by cp.async, not through the map), box 64 x bm. B: 3-D
/// (group outermost), box 64 x bn x 1 (NK) or 64 x 64 x 1 (KN). 128-byte
/// swizzle, zero fill.
void grouped_make_tma_a(const GroupedGemmArgs& a, int bm, CUtensorMap* out);
void grouped_make_tma_b(const GroupedGemmArgs& a, int bn, CUtensorMap* out);
}  // namespace detail

/// Launches configuration Cfg. kGatherA: A's rows through args.a_gather
/// (the caller checked that it is set; see GroupedGemmArgs).
template <class Cfg, class InT, BLayout Layout, bool kGatherA = false, class Pro, class Epi>
void grouped_launch_config(const GroupedGemmArgs& a, const GroupedGemmOptions& o, const Pro& pro, const Epi& epi,
                           cudaStream_t stream) {
  static_assert(std::is_same_v<InT, __nv_bfloat16> || std::is_same_v<InT, __half>, "InT: bf16 or f16");
  constexpr bool kTransB = Layout == BLayout::KN;
  detail::grouped_check_instantiation(a, Layout, std::is_same_v<InT, __half> ? DType::f16 : DType::bf16, o.max_ctas,
                                      kGatherA);

  CUtensorMap tma_a, tma_b;
  detail::grouped_make_tma_a(a, Cfg::BM, &tma_a);
  detail::grouped_make_tma_b(a, Cfg::BN, &tma_b);

  engine::GroupedParams<Pro, Epi> p{};
  p.N = static_cast<int>(a.n);
  p.K = static_cast<int>(a.k);
  p.groups = static_cast<int>(a.groups);
  p.max_rows = static_cast<int>(a.max_rows);
  p.tiles_n = static_cast<int>((a.n + Cfg::BN - 1) / Cfg::BN);
  p.raster = engine::GroupedRaster::make(p.tiles_n, o.raster_band >= 0 ? o.raster_band : (Cfg::BM == 64 ? 8 : 0));
  p.group_rows = a.group_rows;
  p.status = a.status;
  p.prologue = pro;
  p.epilogue = epi;
  if constexpr (kGatherA) {
    p.gather.a = a.a;
    p.gather.index = a.a_gather;
    p.gather.lda = a.lda_or_packed();
    p.gather.rows = static_cast<int>(a.a_rows);
    p.gather.div = engine::FastDivmod::make(static_cast<uint32_t>(a.a_gather_div));
  }

  const int sms = detail::sm_count();
  const int cap = o.max_ctas > 0 ? std::min(o.max_ctas, sms) : sms;
  const int64_t bound = grouped_max_tiles(a, TileShape{Cfg::BM, Cfg::BN});
  // At least one CTA: it writes the status words even when nothing fits.
  const int grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(cap, bound)));
  auto kernel = engine::grouped_gemm_kernel<Cfg, InT, kTransB, Pro, Epi, kGatherA>;
  using Smem = engine::SmemLayout<Cfg, InT>;
  constexpr int smem =
      engine::kGroupedStoresThroughSmem<Cfg, InT, Epi, kGatherA>
          ? Smem::launch_bytes_with_staging(engine::GroupedTable::kBytes)
          : Smem::kLaunchBytes + engine::GroupedTable::kBytes + (kGatherA ? engine::kGroupedGatherBytes<Cfg> : 0);
  static_assert(smem <= 227 * 1024, "grouped GEMM: stages + group table exceed shared memory");
  detail::set_max_dynamic_smem_once(reinterpret_cast<const void*>(kernel), smem,
                                    "cudaFuncSetAttribute(grouped gemm kernel, max dynamic smem)");
  kernel<<<grid, Cfg::kThreads, smem, stream>>>(tma_a, tma_b, p);
  detail::check_launch("grouped gemm kernel launch");
}

template <GroupedTile Tile, class InT, BLayout Layout, bool kGatherA = false, class Pro, class Epi>
void grouped_gemm_with_tile(const GroupedGemmArgs& a, const GroupedGemmOptions& o, const Pro& pro, const Epi& epi,
                            cudaStream_t stream) {
  grouped_launch_config<typename GroupedCfgOf<Tile>::type, InT, Layout, kGatherA>(a, o, pro, epi, stream);
}

}  // namespace tessera::kernels
