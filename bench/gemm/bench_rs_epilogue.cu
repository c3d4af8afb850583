// bench/gemm/bench_rs_epilogue.cu — the GEMM+RS fused_ce kernel on ONE GPU
// (`tessera bench gemm --rs-epilogue`): the ops' RsBandPrologue +
// RsStageEpilogue at a pretend world of 2 (rank 0), with every band flag
// already set, i.e. the kernel-only run of bench mlp without a second GPU.
// Its cost over the plain ping-pong GEMM is the fused kernel's own cost;
// the diag_skip variants and the plain kernel in the RS order split it
// (docs/design/operators.md).
#include "gemm/bench_rs_epilogue.hpp"

#include <cuda_bf16.h>

#include "tessera/ops/fused_policies.cuh"
#include "tessera/kernels/gemm/launch.cuh"
#include "tessera/runtime/wait_diagnostics.hpp"

namespace tessera::bench::gemm {
namespace {

template <class Epi>
void fill_epilogue(Epi& e, const RsEpilogueBuffers& b, std::int64_t m, std::int64_t n) {
  e.stage = static_cast<__nv_bfloat16*>(b.stage);
  e.recv = static_cast<const __nv_bfloat16*>(b.recv);
  e.band_count = b.band_count;
  e.d = static_cast<__nv_bfloat16*>(b.d);
  e.ldd = n;
  e.per_rank = m / 2;
  e.ld = (n + 7) / 8 * 8;
  e.rank = 0;
  e.world = 2;
  e.band_shift = 3;  // bands of 8 tile rows
  e.diag_skip = 0;
}

}  // namespace

void gemm_rs_epilogue(RsEpi which, const kernels::GemmArgs& a, const RsEpilogueBuffers& b, cudaStream_t s) {
  using namespace kernels;
  if (a.b_layout != BLayout::NK || a.in != DType::bf16 || a.out != DType::bf16)
    detail::fail("bench gemm --rs-epilogue: compiled for bf16, B [N, K] only");
  if (a.m % 128 != 0)
    detail::fail("bench gemm --rs-epilogue: M must be a multiple of 128 (two shards on 64-row tiles)");
  const int tiles_m = static_cast<int>(a.m / 64);
  ops::detail::RsBandPrologue pro;
  pro.flags = b.band_flags;
  pro.flag_stride = tiles_m / 8;
  pro.per_rank = a.m / 2;
  pro.rank = 0;
  pro.world = 2;
  pro.band_shift = 3;
  pro.epoch = 1;
  pro.timeout_ns = 2'000'000'000ull;
  pro.diag = runtime::process_wait_diagnostics().device_record();
  GemmOptions o{};
  o.tile = GemmTile::T64x256;
  o.ping_pong = true;
  // Rank 0's order: the remote shard's tile rows first (ops::plan_rs's rotation).
  const engine::RasterScheduler sched{8, false, tiles_m / 2};
  switch (which) {
    case RsEpi::PlainRotated:
    case RsEpi::PlainHere: {
      engine::StdEpilogue<__nv_bfloat16> e;
      e.d = static_cast<__nv_bfloat16*>(a.d);
      e.ldd = a.n;
      const int rot = which == RsEpi::PlainHere ? 0 : tiles_m / 2;
      gemm_with_tile_ping_pong<GemmTile::T64x256, __nv_bfloat16, BLayout::NK>(
          a, o, engine::NoWait{}, e, engine::RasterScheduler{8, false, rot}, s);
      return;
    }
    default: {
      const unsigned skip = which == RsEpi::NoOwnerAdd ? ops::kDiagSkipOwnerAdd
                            : which == RsEpi::SkipAll
                                ? (ops::kDiagSkipOwnerAdd | ops::kDiagSkipBandWait | ops::kDiagSkipNotify)
                                : 0u;
      ops::detail::RsStageEpilogue<__nv_bfloat16> e;
      fill_epilogue(e, b, a.m, a.n);
      e.diag_skip = skip;
      pro.diag_skip = skip;
      gemm_with_tile_ping_pong<GemmTile::T64x256, __nv_bfloat16, BLayout::NK>(a, o, pro, e, sched, s);
      return;
    }
  }
}

}  // namespace tessera::bench::gemm
