// bench/gemm/bench_rs_epilogue.cu — the GEMM+RS fused_ce kernel on ONE GPU
// (`tessera bench gemm --rs-epilogue`): the ops' RsBandPrologue +
// RsStageEpilogue at a pretend world of 2 (rank 0), with every band flag
// already set, i.e. the kernel-only run of bench mlp without a second GPU.
// Its cost over the plain ping-pong GEMM is the fused kernel's own cost.
//
// RsStageEpilogueS6 is session 6's epilogue (src/ops/fused_policies.cuh at
// cee13c2: one bound type with an own/remote branch at every store), kept
// here only as the A/B baseline of the split store loops (notes/ops.md,
// session 7). Remove it once that question is settled.
#include "gemm/bench_rs_epilogue.hpp"

#include <cuda_bf16.h>

#include <type_traits>

#include "ops/fused_policies.cuh"
#include "tessera/kernels/gemm/launch.cuh"
#include "tessera/kernels/gemm/wait_diag.hpp"

namespace tessera::bench::gemm {
namespace {

/// Session 6's RsStageEpilogue (one Bound, own/remote branch per store8).
template <class OutT>
struct RsStageEpilogueS6 {
  static constexpr bool kNotify = true;
  static constexpr bool kSysScope = false;
  OutT* stage = nullptr;
  const OutT* recv = nullptr;
  std::uint64_t* band_count = nullptr;
  OutT* d = nullptr;
  std::int64_t ldd = 0;
  std::int64_t per_rank = 0, ld = 0;
  int rank = 0, world = 1, band_rows = 1;
  unsigned diag_skip = 0;

  struct Bound {
    static constexpr int kLoadAhead = 4;
    using Loaded = uint4;
    OutT* out;
    std::int64_t ldo;
    std::int64_t row_off;
    const OutT* slab;
    std::int64_t ld, slab_stride;
    int world, rank, first_peer;
    bool own, skip_peers;

    __device__ __forceinline__ Loaded load(int row, int col) const {
      if (!own || skip_peers) return Loaded{};
      return __ldcg(reinterpret_cast<const uint4*>(slab + (row - row_off) * ld + col + first_peer * slab_stride));
    }
    __device__ __forceinline__ void store8(int row, int col, const float (&acc)[8], int valid, const Loaded& l) const {
      float v[8];
      if (!own) {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = acc[i];
      } else {
        ops::detail::owner_sum8(slab + (row - row_off) * ld + col, slab_stride, world, rank, skip_peers, acc, v,
                                first_peer, l);
      }
      kernels::engine::store_first8(out + (row - row_off) * ldo + col, v, valid);
    }
    __device__ __forceinline__ void store8(int row, int col, const float (&acc)[8], int valid) const {
      store8(row, col, acc, valid, load(row, col));
    }
  };
  __device__ __forceinline__ Bound bind(const kernels::engine::TileInfo& t) const {
    const int o = static_cast<int>(t.row0 / per_rank);
    const bool own = o == rank;
    const std::int64_t own_row0 = static_cast<std::int64_t>(rank) * per_rank;
    return Bound{own ? d : stage, own ? ldd : ld, own ? own_row0 : 0, recv, ld, per_rank * ld, world, rank,
                 rank == 0 ? 1 : 0, own, (diag_skip & ops::kDiagSkipOwnerAdd) != 0};
  }
  __device__ __forceinline__ void tile_done(const kernels::engine::TileInfo& t) const {
    if (static_cast<int>(t.row0 / per_rank) != rank && !(diag_skip & ops::kDiagSkipNotify))
      link::mo::red_add_relaxed_gpu(band_count + t.m / band_rows, 1);
  }
};

/// Session 6's RasterScheduler (integer divisions, a modulo per tile for the
/// rotation), for the PlainS6 / PlainRotatedS6 A/B only.
struct RasterSchedulerS6 {
  int group = 8;
  int rotate_m = 0;
  __host__ __device__ __forceinline__ kernels::engine::TileCoord tile(int pos, int tiles_m, int tiles_n) const {
    const int per_band = group * tiles_n;
    const int band = pos / per_band;
    const int first = band * group;
    const int width = tiles_m - first < group ? tiles_m - first : group;
    const int in_band = pos - band * per_band;
    kernels::engine::TileCoord t{first + in_band % width, in_band / width};
    if (rotate_m) t.m = (t.m + rotate_m) % tiles_m;
    return t;
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
  if constexpr (std::is_same_v<Epi, RsStageEpilogueS6<__nv_bfloat16>>)
    e.band_rows = 8;
  else
    e.band_shift = 3;  // bands of 8 tile rows
  e.diag_skip = 0;
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
  pro.band_shift = 3;
  pro.epoch = 1;
  pro.timeout_ns = 2'000'000'000ull;
  pro.diag = wait_diagnostics();
  GemmOptions o{};
  o.tile = GemmTile::T64x256;
  o.epilogue_overlap = true;
  // Rank 0's order: the remote shard's tile rows first (ops::plan_rs's rotation).
  const engine::RasterScheduler sched{8, false, tiles_m / 2};
  switch (which) {
    case RsEpi::PlainRotated:
    case RsEpi::PlainHere:
    case RsEpi::PlainS6:
    case RsEpi::PlainRotatedS6: {
      engine::StdEpilogue<__nv_bfloat16> e;
      e.d = static_cast<__nv_bfloat16*>(a.d);
      e.ldd = a.n;
      if (which == RsEpi::PlainS6 || which == RsEpi::PlainRotatedS6) {
        gemm_with_tile_overlap<GemmTile::T64x256, __nv_bfloat16, BLayout::NK>(
            a, o, engine::NoWait{}, e, RasterSchedulerS6{8, which == RsEpi::PlainS6 ? 0 : tiles_m / 2}, s);
        return;
      }
      const int rot = which == RsEpi::PlainHere ? 0 : tiles_m / 2;
      gemm_with_tile_overlap<GemmTile::T64x256, __nv_bfloat16, BLayout::NK>(a, o, engine::NoWait{}, e,
                                                                          engine::RasterScheduler{8, false, rot}, s);
      return;
    }
    case RsEpi::S6: {
      RsStageEpilogueS6<__nv_bfloat16> e;
      fill_epilogue(e, b, a.m, a.n);
      gemm_with_tile_overlap<GemmTile::T64x256, __nv_bfloat16, BLayout::NK>(a, o, pro, e, sched, s);
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
      gemm_with_tile_overlap<GemmTile::T64x256, __nv_bfloat16, BLayout::NK>(a, o, pro, e, sched, s);
      return;
    }
  }
}

}  // namespace tessera::bench::gemm
