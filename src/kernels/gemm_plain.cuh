// src/kernels/gemm_plain.cuh — the policy-free GEMM (StdEpilogue, no wait,
// RasterScheduler) for one input type and B layout; instantiated once per
// (input type, layout) in gemm_plain_*.cu so the kernels compile in parallel.
// GemmOptions::epilogue_overlap selects the ping-pong kernels (128x128,
// 64x256; output type == input type only); with tile Auto and out == in the
// ping-pong 64x256 is also the default below ~4e11 multiply-adds
// (plain_uses_ping_pong).
#pragma once

#include <string>
#include <type_traits>

#include "tessera/kernels/gemm/launch.cuh"

namespace tessera::kernels::detail {

template <class InT, BLayout L, class OutT>
void gemm_plain_out(GemmTile t, const GemmArgs& a, const GemmOptions& o, cudaStream_t stream) {
  const engine::RasterScheduler sched = raster_from(o);
  const engine::NoWait pro{};
  engine::StdEpilogue<OutT> epi;
  epi.d = static_cast<OutT*>(a.d);
  epi.ldd = a.ldd_or_packed();
  if constexpr (std::is_same_v<OutT, InT>) {
    if (o.epilogue_overlap)
      gemm_with_layout_overlap<InT, L>(t, a, o, pro, epi, sched, stream);
    else
      gemm_with_layout<InT, L>(t, a, o, pro, epi, sched, stream);
  } else {
    // Ping-pong kernels are compiled for output type == input type only.
    if (o.epilogue_overlap)
      fail("gemm: epilogue_overlap is not compiled for " + std::string(dtype_name(a.in)) + " inputs with " +
           std::string(dtype_name(a.out)) + " output (output type must equal the input type)");
    // Mixed input/output types are compiled for the 128x256 tile only.
    if (o.tile != GemmTile::Auto && o.tile != GemmTile::T128x256)
      fail("gemm: tile " + tile_name(o.tile) + " is not compiled for " + std::string(dtype_name(a.in)) +
           " inputs with " + std::string(dtype_name(a.out)) + " output (only 128x256)");
    gemm_with_tile<GemmTile::T128x256, InT, L, 1>(a, o, pro, epi, sched, stream);
  }
}

template <class InT, BLayout L>
void gemm_plain(const GemmArgs& a, const GemmOptions& o, cudaStream_t stream) {
  if (plain_uses_ping_pong(a, o)) {
    GemmOptions po = o;
    po.epilogue_overlap = true;
    po.tile = GemmTile::T64x256;
    return gemm_plain_out<InT, L, InT>(GemmTile::T64x256, a, po, stream);
  }
  const GemmTile t = resolve_tile(a, o);
  switch (a.out) {
    case DType::bf16: return gemm_plain_out<InT, L, __nv_bfloat16>(t, a, o, stream);
    case DType::f16: return gemm_plain_out<InT, L, __half>(t, a, o, stream);
    case DType::f32: return gemm_plain_out<InT, L, float>(t, a, o, stream);
  }
  fail("gemm: output dtype " + std::string(dtype_name(a.out)) + " not supported");
}

void gemm_plain_bf16_nk(const GemmArgs&, const GemmOptions&, cudaStream_t);
void gemm_plain_bf16_kn(const GemmArgs&, const GemmOptions&, cudaStream_t);
void gemm_plain_f16_nk(const GemmArgs&, const GemmOptions&, cudaStream_t);
void gemm_plain_f16_kn(const GemmArgs&, const GemmOptions&, cudaStream_t);

}  // namespace tessera::kernels::detail
