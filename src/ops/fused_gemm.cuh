// src/ops/fused_gemm.cuh — instantiations of the fused TP GEMMs for one
// input type (included by fused_gemm_bf16.cu / fused_gemm_f16.cu so that the
// two types compile in parallel). One tile for every fused GEMM (kAgTile,
// kRsTile; tp_launchers.hpp) keeps the kernel count, and the build time,
// small. B is [N, K] or [K, N] (AgGemmArgs / GemmRsArgs b_kn): every fused
// kernel but AG's SiLU·up one (NK only, args.cpp) compiles for both layouts
// and gemm_with picks problem.b_layout's.
#pragma once

#include "tessera/ops/fused_policies.cuh"
#include "tp_launchers.hpp"
#include "tessera/kernels/gemm/launch.cuh"
#include "tessera/runtime/wait_diagnostics.hpp"

namespace tessera::ops::detail {

/// Runs the fused kernel of policies Pro and Epi on tile `Tile`: each
/// policy's Params made once from the launch's Arguments.
template <kernels::GemmTile Tile, class T, class Pro, class Epi>
void run_fused(const kernels::GemmArgs& problem, const kernels::GemmOptions& options,
               const typename Pro::Arguments& pro, const typename Epi::Arguments& epi, cudaStream_t s) {
  kernels::gemm_with<kernels::PingPong<Tile>, T, kernels::BLayout::NK, kernels::BLayout::KN>(
      problem, options, Pro::to_params(problem, options, pro), Epi::to_params(problem, options, epi),
      kernels::raster_from(options), s);
}

/// The engine's store of D (problem.d, row stride problem.ldd) with features kFeatures.
template <class T, unsigned kFeatures>
kernels::engine::StdEpilogue<T, kFeatures> output_epilogue(const kernels::GemmArgs& problem) {
  kernels::engine::StdEpilogue<T, kFeatures> epi;
  epi.d = static_cast<T*>(problem.d);
  epi.ldd = problem.ldd;
  return epi;
}

template <class T>
void ag_gemm_typed(const AgGemmArguments& p, cudaStream_t s) {
  const AgPrologue pro = AgPrologue::to_params(p.problem, p.options, p.prologue);
  const kernels::engine::RasterScheduler sched = kernels::raster_from(p.options);
  if (p.swiglu)
    kernels::gemm_with<kernels::PingPong<kAgTile>, T, kernels::BLayout::NK>(
        p.problem, p.options, pro, output_epilogue<T, kernels::engine::kEpiSwiGLU>(p.problem), sched, s);
  else
    kernels::gemm_with<kernels::PingPong<kAgTile>, T, kernels::BLayout::NK, kernels::BLayout::KN>(
        p.problem, p.options, pro, output_epilogue<T, kernels::engine::kEpiPlain>(p.problem), sched, s);
}

template <class T>
void gemm_rs_typed(const GemmRsArguments& p, cudaStream_t s) {
  switch (p.kind) {
    case RsEpilogueKind::stage_ce:
      return run_fused<kRsTile, T, RsBandPrologue, RsStageEpilogue<T>>(p.problem, p.options, p.rs, p.rs, s);
    case RsEpilogueKind::owner_add:
      return run_fused<kRsTile, T, RsOwnerPrologue, RsOwnerEpilogue<T>>(p.problem, p.options, p.rs.shards, p.rs.shards,
                                                                        s);
    case RsEpilogueKind::slabs:
      return kernels::gemm_with<kernels::PingPong<kRsTile>, T, kernels::BLayout::NK, kernels::BLayout::KN>(
          p.problem, p.options, kernels::engine::NoWait{}, RsEpilogue<T>::to_params(p.problem, p.options, p.rs.shards),
          kernels::raster_from(p.options), s);
  }
}

/// Loads (attribute query) every fused kernel of one B layout (kTransB: KN).
template <class T, bool kTransB>
void preload_layout() {
  using Cfg = kernels::PingPongCfgOf<kAgTile>::type;
  using RsCfg = kernels::PingPongCfgOf<kRsTile>::type;
  using Sched = kernels::engine::RasterScheduler;
  cudaFuncAttributes attr{};
  kernels::detail::cuda_check(
      cudaFuncGetAttributes(
          &attr, kernels::engine::gemm_kernel<Cfg, T, kTransB, AgPrologue,
                                              kernels::engine::StdEpilogue<T, kernels::engine::kEpiPlain>, Sched>()),
      "ops: preload AG GEMM");
  if constexpr (!kTransB)  // SiLU*up takes B as [N, K] only
    kernels::detail::cuda_check(
        cudaFuncGetAttributes(
            &attr, kernels::engine::gemm_kernel<Cfg, T, false, AgPrologue,
                                                kernels::engine::StdEpilogue<T, kernels::engine::kEpiSwiGLU>, Sched>()),
        "ops: preload AG GEMM (SiLU*up)");
  kernels::detail::cuda_check(
      cudaFuncGetAttributes(
          &attr, kernels::engine::gemm_kernel<RsCfg, T, kTransB, kernels::engine::NoWait, RsEpilogue<T>, Sched>()),
      "ops: preload RS GEMM");
  kernels::detail::cuda_check(
      cudaFuncGetAttributes(
          &attr, kernels::engine::gemm_kernel<RsCfg, T, kTransB, RsOwnerPrologue, RsOwnerEpilogue<T>, Sched>()),
      "ops: preload RS GEMM (owner epilogue)");
  kernels::detail::cuda_check(
      cudaFuncGetAttributes(
          &attr, kernels::engine::gemm_kernel<RsCfg, T, kTransB, RsBandPrologue, RsStageEpilogue<T>, Sched>()),
      "ops: preload RS GEMM (copy engine)");
}

template <class T>
void preload_typed() {
  preload_layout<T, false>();
  preload_layout<T, true>();
}

}  // namespace tessera::ops::detail
