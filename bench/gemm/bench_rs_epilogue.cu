// bench/gemm/bench_rs_epilogue.cu — the GEMM+RS fused_ce kernel on ONE GPU
// (`tessera bench gemm --rs-epilogue`): the ops' RsBandPrologue +
// RsStageEpilogue at a pretend world of 2 (rank 0), with every band flag
// already set, i.e. the kernel-only run of bench mlp without a second GPU.
// Its cost over the plain ping-pong GEMM is the fused kernel's own cost;
// the diag_skip variants and the plain kernel in the RS order split it
// (docs/design/operators.md).
#include "gemm/bench_rs_epilogue.hpp"

#include <cuda_bf16.h>

#include <string>

#include "tessera/ops/fused_policies.cuh"
#include "tessera/ops/plan.hpp"
#include "tessera/kernels/gemm/launch.cuh"
#include "tessera/runtime/wait_diagnostics.hpp"

namespace tessera::bench::gemm {

void gemm_rs_epilogue(RsEpi which, const kernels::GemmArgs& a, const RsEpilogueBuffers& b, cudaStream_t s) {
  using namespace kernels;
  if (a.b_layout != BLayout::NK || a.in != DType::bf16 || a.out != DType::bf16)
    detail::fail("bench gemm --rs-epilogue: compiled for bf16, B [N, K] only");
  constexpr GemmTile kTile = ops::kRsFusedTile;
  constexpr int kTileRows = tile_shape(kTile).bm;
  if (a.m % (2 * kTileRows) != 0)
    detail::fail("bench gemm --rs-epilogue: M must be a multiple of " + std::to_string(2 * kTileRows) +
                 " (two shards on tile rows)");
  const int tiles_m = static_cast<int>(a.m / kTileRows);
  GemmOptions o{};
  o.tile = kTile;
  o.ping_pong = true;
  // Rank 0's order: the remote shard's tile rows first (ops::plan_rs's
  // rotation); bands of o.raster_group = 8 tile rows.
  o.rotate_m = tiles_m / 2;
  switch (which) {
    case RsEpi::PlainRotated:
    case RsEpi::PlainHere: {
      engine::StdEpilogue<__nv_bfloat16> e;
      e.d = static_cast<__nv_bfloat16*>(a.d);
      e.ldd = a.n;
      if (which == RsEpi::PlainHere) o.rotate_m = 0;
      gemm_with<PingPong<kTile>, __nv_bfloat16, BLayout::NK>(a, o, engine::NoWait{}, e, raster_from(o), s);
      return;
    }
    default: {
      ops::detail::RsStageArguments args;
      args.shards.recv[0] = const_cast<void*>(b.recv);
      args.shards.per_rank = a.m / 2;
      args.shards.ld_recv = (a.n + 7) / 8 * 8;
      args.shards.rank = 0;
      args.shards.world = 2;
      args.shards.d = b.d;
      args.shards.ldd = a.n;
      args.stage = b.stage;
      args.band_count = b.band_count;
      args.band_flags = {b.band_flags, tiles_m / o.raster_group, 1};
      args.diag_skip = which == RsEpi::NoOwnerAdd ? ops::kDiagSkipOwnerAdd
                       : which == RsEpi::SkipAll
                           ? (ops::kDiagSkipOwnerAdd | ops::kDiagSkipBandWait | ops::kDiagSkipNotify)
                           : 0u;
      auto pro = ops::detail::RsBandPrologue::to_params(a, o, args);
      pro.timeout_ns = 2'000'000'000ull;
      gemm_with<PingPong<kTile>, __nv_bfloat16, BLayout::NK>(
          a, o, pro, ops::detail::RsStageEpilogue<__nv_bfloat16>::to_params(a, o, args), raster_from(o), s);
      return;
    }
  }
}

}  // namespace tessera::bench::gemm
