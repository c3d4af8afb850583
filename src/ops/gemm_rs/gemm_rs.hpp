// src/ops/gemm_rs/gemm_rs.hpp — what GEMM+ReduceScatter's strategies share
// (gemm_rs.cpp), and fused_ce's launcher, which GEMM+AllReduce's fused_ce
// runs too. Each strategy's launcher is in its own file here and registered
// in gemm_rs.cpp. Reduction order is always rank 0..R-1 (fused,
// decomposition), the ring's (s-1, s-2, ..., s for shard s) or NCCL's
// (sequential). Internal to src/ops.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../context_impl.hpp"
#include "../tp_launchers.hpp"

namespace tessera::ops {

/// cuBLASLt D[rows, N] (row stride ldd) = rows [row0, row0 + rows) of A · Bᵀ
/// (b_kn: A · B; the row-parallel operators' plain GEMM).
void row_parallel_gemm(const GemmRsArgs& a, std::int64_t row0, std::int64_t rows, void* d, std::int64_t ldd,
                       cudaStream_t s);

/// GEMM+AR's full output, for fused_ce's all-gather half.
struct ArTail {
  void* d = nullptr;  ///< [M, N], row stride ldd
  std::int64_t ldd = 0;
};
/// fused_ce GEMM+RS (gemm_rs/fused_ce.cpp); with `ar`, also GEMM+AR's
/// all-gather of the reduced bands into ar->d (a.d must then be this rank's
/// rows of it).
void run_fused_ce(TpContext::Impl& c, const GemmRsArgs& a, const RsPlan& plan, bool kernel_only, unsigned diag_skip,
                  const ArTail* ar = nullptr);

namespace rs {

/// What every strategy starts from.
struct Env {
  int world, rank;
  cudaStream_t st;  ///< the compute stream (pg.stream())
  std::int64_t es;  ///< element bytes
};
Env env(const TpContext::Impl& c, const GemmRsArgs& a);
/// B's layout and row stride (packed: K for [N, K], N for b_kn's [K, N]).
kernels::BLayout b_layout(const GemmRsArgs& a);
std::int64_t b_ld(const GemmRsArgs& a);

/// The plan of the fused tile (kRsTileM x kRsTileN), which every strategy
/// but ring uses for its shards and slabs.
RsPlan tile_plan(const TpContext::Impl& c, const GemmRsArgs& a);
/// The fused GEMM+RS launch of epilogue `kind` on at most max_ctas CTAs
/// (0: all), as far as fused_sm and fused_ce share it: operands, every
/// rank's receive slab, the shard geometry, the schedule (remote shards
/// first: RasterScheduler rotate_m) and, for the owner-adding kinds, the
/// raster band and this rank's output rows. The caller adds the counters
/// (and fused_ce's staging and band flags).
detail::GemmRsArguments fused_launch(TpContext::Impl& c, const GemmRsArgs& a, const RsPlan& plan,
                                     detail::RsEpilogueKind kind, int max_ctas);
/// The owner's reduction of its receive slabs into D (no counters set).
detail::ReduceLaunch reduce_launch(const TpContext::Impl& c, const GemmRsArgs& a, const RsPlan& plan);
/// The compute stream waits for `cs`'s work so far.
void join(TpContext::Impl& c, cudaStream_t cs);
/// Every peer told kRsFree = e on the compute stream: my slabs are free again.
void notify_free(TpContext::Impl& c, std::uint64_t e);

/// The strategies (one file each).
extern const TpStrategy<GemmRsArgs> sequential;
extern const TpStrategy<GemmRsArgs> decomposition;
extern const TpStrategy<GemmRsArgs> fused_sm;
extern const TpStrategy<GemmRsArgs> fused_ce;
extern const TpStrategy<GemmRsArgs> ring;

}  // namespace rs
}  // namespace tessera::ops
