// src/kernels/grouped_gemm_kernels.cuh — the policy-free grouped GEMM
// (NoWait, GroupedEpilogue plain or SwiGLU) for bf16 and one B layout,
// dispatched over the configurations; instantiated once per (layout,
// epilogue[, row gather of A]) in grouped_gemm_kernels_*.cu so the kernels
// compile in parallel.
#pragma once

#include <string>
#include <type_traits>

#include "tessera/kernels/gemm/grouped_launch.cuh"

namespace tessera::kernels::detail {

// The Auto rule's tile (64x256 ping-pong) keeps room beside its ring and
// the group table for the TMA-store staging buffers (1 KiB to spare).
static_assert(engine::kGroupedStoresThroughSmem<typename GroupedCfgOf<GroupedTile::PingPong64x256>::type, __nv_bfloat16,
                                                engine::GroupedTmaStoreEpilogue<__nv_bfloat16>, false>,
              "the grouped 64x256 ping-pong tile lost the shared memory of its TMA-store staging buffers");

template <BLayout L, unsigned kFeatures, bool kGatherA = false>
void grouped_gemm_plain(GroupedTile t, const GroupedGemmArgs& a, const GroupedGemmOptions& o, cudaStream_t stream) {
  using InT = __nv_bfloat16;
  const engine::NoWait pro{};
  // Plain stores go through shared memory (GroupedTmaStoreEpilogue).
  using Epi = std::conditional_t<kFeatures == engine::kEpiPlain && !kGatherA, engine::GroupedTmaStoreEpilogue<InT>,
                                 engine::GroupedEpilogue<InT, kFeatures>>;
  Epi epi;
  epi.store.d = static_cast<InT*>(a.d);
  epi.store.ldd = a.ldd ? a.ldd : ((kFeatures & engine::kEpiSwiGLU) ? a.n / 2 : a.n);
  if constexpr (engine::IsTmaStoreEpilogue<Epi>::value) {
    epi.through_smem = make_tma_store_map(a.d, DType::bf16, a.max_rows, a.n, epi.store.ldd, engine::kTmaStoreBoxRows,
                                          engine::kTmaStoreBoxCols, &epi.d_map);
  }
  switch (t) {
    case GroupedTile::Coop128x256:
      return grouped_gemm_with_tile<GroupedTile::Coop128x256, InT, L, kGatherA>(a, o, pro, epi, stream);
    case GroupedTile::Coop128x128:
      return grouped_gemm_with_tile<GroupedTile::Coop128x128, InT, L, kGatherA>(a, o, pro, epi, stream);
    case GroupedTile::PingPong128x128:
      return grouped_gemm_with_tile<GroupedTile::PingPong128x128, InT, L, kGatherA>(a, o, pro, epi, stream);
    case GroupedTile::PingPong64x256:
      return grouped_gemm_with_tile<GroupedTile::PingPong64x256, InT, L, kGatherA>(a, o, pro, epi, stream);
    case GroupedTile::Auto:
      break;
  }
  fail("grouped_gemm: unresolved tile " + grouped_tile_name(t));
}

}  // namespace tessera::kernels::detail
