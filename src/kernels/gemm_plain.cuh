// src/kernels/gemm_plain.cuh — the policy-free GEMM (StdEpilogue, no wait,
// RasterScheduler) for one input type and B layout; instantiated once per
// (input type, layout) in gemm_plain_*.cu so the kernels compile in parallel.
// plan_gemm() picks the kernel: cooperative (128x256, 256x128, 128x128;
// 2-CTA clusters along M for the first two; 128x192 for output type ==
// input type; and for that type only, clusters sharing A along N or
// 128x128 along M: cluster_kernel_compiled),
// ping-pong (128x128, 64x256, 64x64; output type == input type only),
// split-K on 128x128 / 64x256 / 64x64 (splitk.cuh), stream-K on 128x256 /
// 128x128 (kernel_stream_k.cuh; output type == input type), or swapped
// operands on 128x32 / 128x64 / 128x96 (swap_ab.cuh; B [N,K] only).
#pragma once

#include <string>
#include <type_traits>
#include <utility>

#include "tessera/kernels/gemm/launch.cuh"
#include "tessera/kernels/gemm_plan.hpp"
#include "tessera/kernels/gemm/splitk.cuh"
#include "tessera/kernels/gemm/swap_ab.cuh"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/wait_diagnostics.hpp"

namespace tessera::kernels::detail {

// The tiles the plan picks most keep room beside their rings for the
// TMA-store staging buffers: a stage added to one of them would silently
// send its short-K problems back to the register store loop.
static_assert(engine::kStoresThroughSmem<typename PingPongCfgOf<GemmTile::T64x256>::type, __nv_bfloat16,
                                         engine::TmaStoreEpilogue<__nv_bfloat16>> &&
                  engine::kStoresThroughSmem<typename PingPongCfgOf<GemmTile::T64x64>::type, __nv_bfloat16,
                                             engine::TmaStoreEpilogue<__nv_bfloat16>> &&
                  engine::kStoresThroughSmem<typename TileCfgOf<GemmTile::T128x256, 1>::type, __nv_bfloat16,
                                             engine::TmaStoreEpilogue<__nv_bfloat16>> &&
                  engine::kStoresThroughSmem<typename TileCfgOf<GemmTile::T128x192, 1>::type, __nv_bfloat16,
                                             engine::TmaStoreEpilogue<__nv_bfloat16>>,
              "a plain tile lost the shared memory of its TMA-store staging buffers");

/// The plain epilogue of a whole-K kernel whose output type is its input
/// type: D (16-byte-aligned rows: gemm() stages any other D) stored through
/// shared memory by every kernel with room for the staging buffers where N
/// is a multiple of 8, by the register store loop otherwise
/// (TmaStoreEpilogue, epilogue.cuh).
template <class T>
engine::TmaStoreEpilogue<T> plain_store_epilogue(const GemmArgs& a) {
  engine::TmaStoreEpilogue<T> epi;
  epi.d = static_cast<T*>(a.d);
  epi.ldd = a.ldd_or_packed();
  epi.through_smem =
      make_tma_store_map(a.d, a.out, a.m, a.n, epi.ldd, engine::kTmaStoreBoxRows, engine::kTmaStoreBoxCols, &epi.d_map);
  return epi;
}

/// The kernel of o.tile and o.ping_pong (resolved by plan_gemm) with output type OutT.
template <class InT, BLayout L, class OutT>
void gemm_plain_out(const GemmArgs& a, const GemmOptions& o, cudaStream_t stream) {
  const engine::RasterScheduler sched = raster_from(o);
  const engine::NoWait pro{};
  if constexpr (std::is_same_v<OutT, InT>) {
    const engine::TmaStoreEpilogue<OutT> epi = plain_store_epilogue<OutT>(a);
    if (o.ping_pong)
      gemm_with<PingPongTiles, InT, L>(a, o, pro, epi, sched, stream);
    else
      gemm_with<CooperativeTiles, InT, L>(a, o, pro, epi, sched, stream);
  } else {
    engine::StdEpilogue<OutT> epi;
    epi.d = static_cast<OutT*>(a.d);
    epi.ldd = a.ldd_or_packed();
    // Ping-pong kernels are compiled for output type == input type only.
    if (o.ping_pong)
      fail("gemm: ping_pong is not compiled for " + std::string(dtype_name(a.in)) + " inputs with " +
           std::string(dtype_name(a.out)) + " output (output type must equal the input type)");
    // Mixed input/output types are compiled for the 128x256 tile only.
    if (o.tile != GemmTile::Auto && o.tile != GemmTile::T128x256)
      fail("gemm: tile " + tile_name(o.tile) + " is not compiled for " + std::string(dtype_name(a.in)) +
           " inputs with " + std::string(dtype_name(a.out)) + " output (only 128x256)");
    gemm_with<Cooperative<GemmTile::T128x256>, InT, L>(a, o, pro, epi, sched, stream);
  }
}

/// Launches `kernel` (256-thread blocks, no shared memory) as a programmatic
/// dependent of the previous kernel in `stream`: its grid is set up while
/// that kernel runs, and the kernel waits for it (griddepcontrol.wait)
/// before reading its output. The split-K reduce and the stream-K fixup.
template <class... Params, class... Args>
void launch_dependent_256(void (*kernel)(Params...), dim3 grid, cudaStream_t stream, const char* what, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.gridDim = grid;
  cfg.blockDim = dim3(256);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cuda_check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), what);
  check_launch(what);
}

/// The problem D^T = B A^T of a (B [N,K]): A and B, M and N exchanged; the
/// kernel's tensor maps and tile counts come from it, D from a.
inline GemmArgs swapped_args(const GemmArgs& a) {
  GemmArgs s = a;
  s.a = a.b;
  s.b = a.a;
  s.m = a.n;
  s.n = a.m;
  s.lda = a.ldb_or_packed();
  s.ldb = a.lda_or_packed();
  return s;
}

/// Split-K with configuration Cfg (no clusters): units write f32 partials
/// into a stream-ordered workspace, splitk_reduce sums them into D. kSwap:
/// the kernel runs swapped_args(a) and stores its partials transposed, so
/// the workspace and the reduce are D's either way.
template <class Cfg, class InT, BLayout L, bool kSwap = false>
void gemm_plain_splitk_cfg(const GemmArgs& a, const GemmOptions& o, int splits, cudaStream_t stream) {
  const GemmArgs ka = kSwap ? swapped_args(a) : a;  // the kernel's problem
  const int tm = static_cast<int>((ka.m + Cfg::BM - 1) / Cfg::BM),
            tn = static_cast<int>((ka.n + Cfg::BN - 1) / Cfg::BN);
  const int kb = static_cast<int>((a.k + Cfg::BK - 1) / Cfg::BK);
  const engine::SplitKScheduler sched = engine::SplitKScheduler::make(raster_from(o), tm, tn, kb, splits);
  const int64_t ldw = (a.n + 7) / 8 * 8;
  const int64_t stride = a.m * ldw;
  float* ws =
      static_cast<float*>(acquire_workspace(static_cast<size_t>(stride * sched.splits) * sizeof(float), stream));
  std::conditional_t<kSwap, engine::SplitKTransposedEpilogue, engine::SplitKEpilogue> epi;
  epi.ws = ws;
  epi.ldw = ldw;
  epi.split_stride = stride;
  epi.tiles_div = engine::FastDivmod::make(static_cast<uint32_t>(tm * tn));
  GemmOptions so = o;
  so.cluster_m = 1;
  so.ping_pong = false;
  launch_config<Cfg, InT, L>(ka, so, engine::NoWait{}, epi, sched, stream);
  const int64_t total = a.m * ((a.n + 7) / 8);
  const int blocks = static_cast<int>(std::min<int64_t>((total + 255) / 256, int64_t{sm_count()} * 16));
  const int M = static_cast<int>(a.m), N = static_cast<int>(a.n);
  const int64_t ldd = a.ldd_or_packed();
  const float* wsc = ws;
  const int splits_run = sched.splits;
  const dim3 grid(blocks);
  constexpr const char* kWhat = "cudaLaunchKernelEx(gemm split-K reduce)";
  switch (a.out) {
    case DType::bf16:
      launch_dependent_256(engine::splitk_reduce<__nv_bfloat16>, grid, stream, kWhat, wsc, splits_run, stride, ldw, M,
                           N, static_cast<__nv_bfloat16*>(a.d), ldd);
      break;
    case DType::f16:
      launch_dependent_256(engine::splitk_reduce<__half>, grid, stream, kWhat, wsc, splits_run, stride, ldw, M, N,
                           static_cast<__half*>(a.d), ldd);
      break;
    case DType::f32:
      launch_dependent_256(engine::splitk_reduce<float>, grid, stream, kWhat, wsc, splits_run, stride, ldw, M, N,
                           static_cast<float*>(a.d), ldd);
      break;
  }
  release_workspace(ws, stream);
}

/// Stream-K with configuration Cfg (cooperative, no cluster, output type ==
/// input type): one CTA per SM (with fewer tiles than SMs, fewer CTAs, so
/// each runs at least kStreamKMinBlocks K blocks). When any tile is split,
/// the CTAs' f32 slots and flags come from the stream's persistent
/// workspace (stream_k_workspace: no allocation, no memset per call; the
/// kernel reduces split tiles itself and leaves the flags zero,
/// kernel_stream_k.cuh).
template <class Cfg, class InT, BLayout L>
void gemm_plain_stream_k_cfg(const GemmArgs& a, const GemmOptions& o, cudaStream_t stream) {
  if (a.out != a.in) fail("gemm: stream-K is compiled for output type == input type");
  const int tm = static_cast<int>((a.m + Cfg::BM - 1) / Cfg::BM), tn = static_cast<int>((a.n + Cfg::BN - 1) / Cfg::BN);
  const int kb = static_cast<int>((a.k + Cfg::BK - 1) / Cfg::BK);
  if (!stream_k_fits(static_cast<int64_t>(tm) * tn, kb))
    fail("gemm: stream-K: " + std::to_string(static_cast<int64_t>(tm) * tn * kb) +
         " tile K blocks reach 2^31 (run split-K or whole tiles)");
  const engine::StreamKScheduler sched =
      engine::StreamKScheduler::make(raster_from(o), tm, tn, kb, plan_sm_count(o), kStreamKMinBlocks);
  engine::StreamKEpilogue<InT> epi;
  epi.d = static_cast<InT*>(a.d);
  epi.ldd = a.ldd_or_packed();
  if (sched.any_split()) {
    const StreamKWorkspace ws = stream_k_workspace(stream, static_cast<size_t>(Cfg::BM) * Cfg::BN * sizeof(float));
    epi.ws = ws.slots;
    epi.flags = ws.flags;
    epi.timeout_ns = runtime::wait_timeout_ns();
    epi.diag = runtime::process_wait_diagnostics().device_record();
  }
  GemmOptions so = o;
  so.cluster_m = 1;
  so.ping_pong = false;
  launch_config<Cfg, InT, L>(a, so, engine::NoWait{}, epi, sched, stream);
}

/// A kernel set that `gemm_with` runs only as planned here (the 64x64
/// ping-pong and 128x192 cooperative tiles, the plain-only cluster
/// kernels): whole K, output type == input type.
template <class KernelSet, class InT, BLayout L>
void gemm_plain_whole_k(const GemmArgs& a, const GemmOptions& o, cudaStream_t stream) {
  const engine::TmaStoreEpilogue<InT> epi = plain_store_epilogue<InT>(a);
  GemmOptions po = o;
  po.cluster_m = 1;
  po.ping_pong = KernelSet::kPingPong;
  po.k_splits = 1;
  gemm_with<KernelSet, InT, L>(a, po, engine::NoWait{}, epi, raster_from(o), stream);
}

/// The plain gemm()'s own cluster kernels (cluster_kernel_compiled): whole
/// K, output type == input type. The RasterScheduler orders cluster tiles,
/// so rotate_m counts those (rounded down: the rotation only orders tiles).
template <class InT, BLayout L>
void gemm_plain_cluster(const GemmArgs& a, const GemmOptions& o, const GemmPlan& plan, cudaStream_t stream) {
  if (a.out != a.in) fail("gemm: the cluster kernels along N are compiled for output type == input type");
  GemmOptions co = o;
  co.rotate_m = o.rotate_m / plan.cluster_m;
  const int c = plan.cluster_m * 10 + plan.cluster_n;
  switch (plan.tile) {
    case GemmTile::T128x128:
      if (c == 21) return gemm_plain_whole_k<Cooperative<GemmTile::T128x128, 2, 1>, InT, L>(a, co, stream);
      if (c == 12) return gemm_plain_whole_k<Cooperative<GemmTile::T128x128, 1, 2>, InT, L>(a, co, stream);
      if (c == 22) return gemm_plain_whole_k<Cooperative<GemmTile::T128x128, 2, 2>, InT, L>(a, co, stream);
      break;
    case GemmTile::T128x256:
      if (c == 22) return gemm_plain_whole_k<Cooperative<GemmTile::T128x256, 2, 2>, InT, L>(a, co, stream);
      break;
    case GemmTile::T128x192:
      if (c == 12) return gemm_plain_whole_k<Cooperative<GemmTile::T128x192, 1, 2>, InT, L>(a, co, stream);
      break;
    default:
      break;
  }
  fail("gemm: no " + std::to_string(plan.cluster_m) + "x" + std::to_string(plan.cluster_n) +
       " cluster kernel for tile " + tile_name(plan.tile));
}

/// Swapped operands on swap tile Cfg (B [N,K]): the cooperative kernel runs
/// swapped_args(a) and stores D transposed; split over `splits` when > 1.
template <class Cfg, class InT, BLayout L>
void gemm_plain_swapped_cfg(const GemmArgs& a, const GemmOptions& o, int splits, cudaStream_t stream) {
  if constexpr (L != BLayout::NK) {
    fail("gemm: swap_ab needs B as [N, K] (b_layout NK)");
  } else {
    if (splits > 1) return gemm_plain_splitk_cfg<Cfg, InT, L, true>(a, o, splits, stream);
    if (a.out != a.in) fail("gemm: swap_ab over whole K is compiled for output type == input type");
    engine::TransposedEpilogue<InT> epi;
    epi.d = static_cast<InT*>(a.d);
    epi.ldd = a.ldd_or_packed();
    GemmOptions so = o;
    so.cluster_m = 1;
    so.ping_pong = false;
    so.k_splits = 1;
    launch_config<Cfg, InT, L>(swapped_args(a), so, engine::NoWait{}, epi, raster_from(o), stream);
  }
}

template <class InT, BLayout L>
void gemm_plain(const GemmArgs& a, const GemmOptions& opts, cudaStream_t stream) {
  const GemmPlan plan = plan_gemm(a, opts);
  GemmOptions o = opts;
  o.dependent_launch = plain_dependent_launch(a, opts, plan, plan_sm_count(opts));
  if (plan.stream_k) {
    if (plan.tile == GemmTile::T128x128)
      return gemm_plain_stream_k_cfg<typename TileCfgOf<GemmTile::T128x128, 1>::type, InT, L>(a, o, stream);
    return gemm_plain_stream_k_cfg<typename TileCfgOf<GemmTile::T128x256, 1>::type, InT, L>(a, o, stream);
  }
  if (plan.swap_ab) {
    switch (plan.tile) {
      case GemmTile::T128x32:
        return gemm_plain_swapped_cfg<typename TileCfgOf<GemmTile::T128x32, 1>::type, InT, L>(a, o, plan.k_splits,
                                                                                              stream);
      case GemmTile::T128x64:
        return gemm_plain_swapped_cfg<typename TileCfgOf<GemmTile::T128x64, 1>::type, InT, L>(a, o, plan.k_splits,
                                                                                              stream);
      case GemmTile::T128x96:
        return gemm_plain_swapped_cfg<typename TileCfgOf<GemmTile::T128x96, 1>::type, InT, L>(a, o, plan.k_splits,
                                                                                              stream);
      default:
        fail("gemm: swap_ab runs tile 128x32, 128x64 or 128x96, not " + tile_name(plan.tile));
    }
  }
  if (cluster_kernel_compiled(plan.tile, plan.cluster_m, plan.cluster_n))
    return gemm_plain_cluster<InT, L>(a, o, plan, stream);
  if (plan.tile == GemmTile::T128x192) {
    // plan_gemm() gives it whole K and output type == input type only.
    if (plan.k_splits > 1 || a.out != a.in) fail("gemm: tile 128x192 runs whole K with output type == input type");
    return gemm_plain_whole_k<Cooperative<GemmTile::T128x192>, InT, L>(a, o, stream);
  }
  if (plan.tile == GemmTile::T64x64) {
    // Few tiles (plan_gemm): split-K, or whole K when the output type is the
    // input type (the ping-pong kernels store only that type).
    if (plan.k_splits > 1 || a.out != a.in)
      return gemm_plain_splitk_cfg<typename PingPongCfgOf<GemmTile::T64x64>::type, InT, L>(a, o, plan.k_splits, stream);
    return gemm_plain_whole_k<PingPong<GemmTile::T64x64>, InT, L>(a, o, stream);
  }
  if (plan.k_splits > 1) {
    if (plan.ping_pong)
      return gemm_plain_splitk_cfg<typename PingPongCfgOf<GemmTile::T64x256>::type, InT, L>(a, o, plan.k_splits,
                                                                                            stream);
    return gemm_plain_splitk_cfg<typename TileCfgOf<GemmTile::T128x128, 1>::type, InT, L>(a, o, plan.k_splits, stream);
  }
  GemmOptions po = o;
  po.tile = plan.tile;
  po.ping_pong = plan.ping_pong;
  po.cluster_m = plan.cluster_m;
  po.k_splits = 1;
  switch (a.out) {
    case DType::bf16:
      return gemm_plain_out<InT, L, __nv_bfloat16>(a, po, stream);
    case DType::f16:
      return gemm_plain_out<InT, L, __half>(a, po, stream);
    case DType::f32:
      return gemm_plain_out<InT, L, float>(a, po, stream);
  }
  fail("gemm: output dtype " + std::string(dtype_name(a.out)) + " not supported");
}

void gemm_plain_bf16_nk(const GemmArgs&, const GemmOptions&, cudaStream_t);
void gemm_plain_bf16_kn(const GemmArgs&, const GemmOptions&, cudaStream_t);
void gemm_plain_f16_nk(const GemmArgs&, const GemmOptions&, cudaStream_t);
void gemm_plain_f16_kn(const GemmArgs&, const GemmOptions&, cudaStream_t);

}  // namespace tessera::kernels::detail
