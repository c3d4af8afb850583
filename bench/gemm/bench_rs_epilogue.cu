// bench/gemm/bench_rs_epilogue.cu — the GEMM+RS fused_ce kernel on ONE GPU
// (`tessera bench gemm --rs-epilogue`): the ops' RsBandPrologue +
// RsStageEpilogue at a pretend world of 2 (rank 0), with every band flag
// already set, i.e. the kernel-only run of bench mlp without a second GPU.
// Its cost over the plain ping-pong GEMM is the fused kernel's own cost.
//
// RsStageEpilogueS5 is session 5's epilogue (src/ops/fused_policies.cuh at
// 13d7bb4: the rank loop unrolled at every store8 site, a store per path),
// kept here only as the A/B baseline of the code-size change (notes/ops.md,
// session 6). Remove it once that question is settled.
#include "gemm/bench_rs_epilogue.hpp"

#include <cuda_bf16.h>

#include "ops/fused_policies.cuh"
#include "tessera/kernels/gemm/launch.cuh"
#include "tessera/kernels/gemm/wait_diag.hpp"

namespace tessera::bench::gemm {
namespace {

template <class OutT>
struct RsStageEpilogueS5 {
  static constexpr bool kNotify = true;
  static constexpr bool kSysScope = false;
  OutT* stage = nullptr;
  const OutT* recv = nullptr;
  std::uint64_t* band_count = nullptr;
  OutT* d = nullptr;
  std::int64_t ldd = 0;
  std::int64_t per_rank = 0, ld = 0;
  int rank = 0, world = 1, band_rows = 1;

  __device__ __forceinline__ void store8(const kernels::engine::TileInfo& t, int row, int col, const float (&acc)[8],
                                         int valid) const {
    const int o = static_cast<int>(t.row0 / per_rank);
    const std::int64_t lr = row - static_cast<std::int64_t>(o) * per_rank;
    if (o != rank) {
      kernels::engine::store_first8(stage + (static_cast<std::int64_t>(o) * per_rank + lr) * ld + col, acc, valid);
      return;
    }
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int s = 0; s < world; ++s) {
      if (s == rank) {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] += acc[i];
      } else {
        const uint4 u =
            __ldcg(reinterpret_cast<const uint4*>(recv + (static_cast<std::int64_t>(s) * per_rank + lr) * ld + col));
        float x[8];
        kernels::engine::OutConv<OutT>::load8(reinterpret_cast<const OutT*>(&u), x);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] += x[i];
      }
    }
    kernels::engine::store_first8(d + lr * ldd + col, v, valid);
  }

  __device__ __forceinline__ void tile_done(const kernels::engine::TileInfo& t) const {
    if (static_cast<int>(t.row0 / per_rank) != rank) link::mo::red_add_relaxed_gpu(band_count + t.m / band_rows, 1);
  }
};

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
  e.band_rows = 8;
}

}  // namespace

void gemm_rs_epilogue(RsEpi which, const kernels::GemmArgs& a, const RsEpilogueBuffers& b, cudaStream_t s) {
  using namespace kernels;
  if (a.b_layout != BLayout::NK || a.in != DType::bf16 || a.out != DType::bf16)
    detail::fail("bench gemm --rs-epilogue: compiled for bf16, B [N, K] only");
  if (a.m % 128 != 0) detail::fail("bench gemm --rs-epilogue: M must be a multiple of 128 (two shards on 64-row tiles)");
  const int tiles_m = static_cast<int>(a.m / 64);
  ops::detail::RsBandPrologue pro;
  pro.flags = b.band_flags;
  pro.flag_stride = tiles_m / 8;
  pro.per_rank = a.m / 2;
  pro.rank = 0;
  pro.world = 2;
  pro.band_rows = 8;
  pro.epoch = 1;
  pro.timeout_ns = 2'000'000'000ull;
  pro.diag = wait_diagnostics();
  GemmOptions o{};
  o.tile = GemmTile::T64x256;
  o.epilogue_overlap = true;
  // Rank 0's order: the remote shard's tile rows first (ops::plan_rs's rotation).
  const engine::RasterScheduler sched{8, false, tiles_m / 2};
  if (which == RsEpi::Current) {
    ops::detail::RsStageEpilogue<__nv_bfloat16> e;
    fill_epilogue(e, b, a.m, a.n);
    gemm_with_tile_overlap<GemmTile::T64x256, __nv_bfloat16, BLayout::NK>(a, o, pro, e, sched, s);
  } else {
    RsStageEpilogueS5<__nv_bfloat16> e;
    fill_epilogue(e, b, a.m, a.n);
    gemm_with_tile_overlap<GemmTile::T64x256, __nv_bfloat16, BLayout::NK>(a, o, pro, e, sched, s);
  }
}

}  // namespace tessera::bench::gemm
