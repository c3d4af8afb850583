// tessera/kernels/gemm/kernel_common.cuh — what both schedules of the GEMM
// kernel share (kernel_cooperative.cuh, kernel_ping_pong.cuh): the kernel
// parameters, the CTA's set-up, the tile walk, the warp roles and the
// producer warpgroup.
//
// Block = 1 producer warpgroup + Cfg::kConsumers consumer warpgroups.
//  * producer (warpgroup 0): drops to kProducerRegs registers; one thread
//    (one lane of warp ProducerWarpRole::kTma, elected: the TMA thread) walks
//    the schedule and streams each tile's K blocks into the smem ring with
//    TMA. If the Prologue is active, lane 0 of warp kWaiter walks the same
//    schedule up to WaiterRing::kSlots tiles ahead, runs Prologue::wait + the
//    proxy fence for each tile and hands it to the TMA thread through the
//    waiter ring (barriers.cuh), so no flag round trip sits on the TMA issue
//    path. If the Epilogue notifies, warp kNotifier is the notifier (see
//    epilogue.cuh).
//  * consumers: raise to kConsumerRegs registers; walk the same schedule,
//    multiply with wgmma, then hand each accumulator pair to the Epilogue and,
//    if it notifies, fence + barrier + tile_done (see epilogue.cuh). How the
//    consumers share the tiles is the schedule's (cooperative or ping-pong).
// Producer and consumers never exchange tile indices: both evaluate the same
// Scheduler on the same positions (blockIdx.x + i * gridDim.x).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "tessera/link/memory_order.cuh"
#include "tessera/kernels/gemm/barriers.cuh"
#include "tessera/kernels/gemm/epilogue.cuh"
#include "tessera/kernels/gemm/mainloop.cuh"
#include "tessera/kernels/gemm/pipeline.cuh"
#include "tessera/kernels/gemm/prologue.cuh"
#include "tessera/kernels/gemm/scheduler.cuh"
#include "tessera/kernels/gemm/tile.cuh"

namespace tessera::kernels::engine {

/// The kernel's parameters, made once on the host (make_kernel_params,
/// launch.cuh) from GemmArgs and the policies.
template <class Prologue, class Epilogue, class Scheduler>
struct KernelParams {
  int M, N, K;
  int tiles_m, tiles_n;
  Prologue prologue;
  Epilogue epilogue;
  Scheduler scheduler;
};

/// Kernels launched as programmatic dependents of the previous kernel in the
/// stream, which in turn let the next one be scheduled early: those that
/// neither wait on other streams or ranks (Prologue) nor publish tiles to
/// them (Epilogue::kNotify), i.e. the plain GEMM and split-K. A hooked
/// kernel keeps the stream's full serialization: the early CTAs of its
/// dependent would hold SMs that the work it waits for may need.
template <class Prologue, class Epilogue>
inline constexpr bool kDependentLaunch = !Prologue::kActive && !Epilogue::kNotify;

// Named barriers (kNotifyBarrier, kOrderBarrier, kNotifyFreeBarrier), the
// notify handshake, the prologue-waiter ring (WaiterRing) and the warp roles:
// see barriers.cuh.

/// A 4x4 transpose inside the lane quad: f[c] of lane q is e[q] of lane c
/// (3 shuffle rounds; the diagonal stays). T is float2 (two shuffles per
/// round) or uint32_t (one).
__device__ __forceinline__ float2 shfl_quad(float2 v, int src) {
  return make_float2(__shfl_sync(0xffffffffu, v.x, src), __shfl_sync(0xffffffffu, v.y, src));
}
__device__ __forceinline__ uint32_t shfl_quad(uint32_t v, int src) { return __shfl_sync(0xffffffffu, v, src); }
template <class T>
__device__ __forceinline__ void quad_transpose4(const T (&e)[4], int lane, T (&f)[4]) {
  const int q = lane & 3;
#pragma unroll
  for (int c = 0; c < 4; ++c) f[c] = e[c];  // f[q] = e[q] is the diagonal
#pragma unroll
  for (int r = 1; r < 4; ++r) {
    const int send_idx = (q - r) & 3, from = (q + r) & 3;
    T send = e[0];
#pragma unroll
    for (int j = 1; j < 4; ++j) send = send_idx == j ? e[j] : send;
    const T recv = shfl_quad(send, (lane & ~3) | from);
#pragma unroll
    for (int c = 0; c < 4; ++c) f[c] = c == from ? recv : f[c];
  }
}

/// wgmma accumulator layout (m64nN, f32): register i of thread (warp w,
/// lane l) holds row 16w + l/4 + 8*((i/2)%2), column 8*(i/4) + 2*(l%4) + i%2.
/// A lane quad shares a row; for each group g of 4 column blocks of 8 it
/// holds one float2 per (lane, block). A 4x4 transpose of float2 inside the
/// quad (quad_transpose4) gives lane q = lane % 4 the 8 consecutive columns
/// of block 4g+q of row half h in v, so each store is 8 contiguous elements.
template <int kAccRegs>
__device__ __forceinline__ void quad_transpose8(const float (&acc)[kAccRegs], int g, int h, int lane, float (&v)[8]) {
  float2 e[4], f[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) e[j] = make_float2(acc[4 * (4 * g + j) + 2 * h], acc[4 * (4 * g + j) + 2 * h + 1]);
  quad_transpose4(e, lane, f);
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    v[2 * c] = f[c].x;
    v[2 * c + 1] = f[c].y;
  }
}

/// The column form of the store loop (HasColumnStore, epilogue.cuh), for a
/// 16-bit output. Per pair of column blocks of 8 (b0 = 2p, b1 = 2p + 1): the
/// four 8x8 blocks (row halves h = 0, 1 of b0, then of b1) are packed to 16
/// bits and transposed by movmatrix, after which lane (r = lane / 4, q =
/// lane % 4) holds rows 2q, 2q + 1 of each block's column r; a 4x4
/// transpose of those words inside the lane quad (quad_transpose4, one
/// 32-bit shuffle per round) gives lane q rows 8h .. 8h + 7 of column r of
/// block b0 + q / 2, h = q % 2. Lanes 2i and 2i + 1 thus store 32
/// contiguous bytes of one row of D, and a warp instruction writes 16 rows
/// (whole 32-byte sectors where D's rows are 32-byte aligned). Every lane
/// runs the movmatrix and the shuffles; only the store is masked.
template <class Cfg, class OutT, class Params, class Bound>
__device__ __forceinline__ void store_tile_columns(const Params& p, const TileInfo& info,
                                                   const float (&acc)[Cfg::kMAtoms][Cfg::BN / 2], int consumer,
                                                   int warp, int lane, const Bound& epi) {
  static_assert(sizeof(OutT) == 2, "the column store packs 16-bit outputs");
  const int q = lane & 3, r = lane >> 2;
#pragma unroll
  for (int a = 0; a < Cfg::kMAtoms; ++a) {
    const int row_base = info.row0 + (Cfg::kPingPong ? 0 : consumer * Cfg::kRowsPerConsumer) + a * 64 + warp * 16;
    const int row = row_base + 8 * (q & 1);  // the 8 rows this lane stores
#pragma unroll
    for (int pair = 0; pair < Cfg::BN / 16; ++pair) {
      uint32_t t[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = 4 * (2 * pair + (j >> 1)) + 2 * (j & 1);  // block 2 pair + j / 2, row half j % 2
        t[j] = ptx::movmatrix_trans(OutConv<OutT>::bits(OutConv<OutT>::pack(acc[a][i], acc[a][i + 1])));
      }
      uint32_t w[4];
      quad_transpose4(t, lane, w);
      const int col = info.col0 + 8 * (2 * pair + (q >> 1)) + r;
      if (row < p.M && col < p.N) epi.store_column8(row, col, make_uint4(w[0], w[1], w[2], w[3]), min(8, p.M - row));
    }
  }
}

/// Whether the kernel of configuration Cfg stores through shared memory with
/// epilogue Epi: a TmaStoreEpilogue, and room beside the ring for the
/// staging buffers after `extra` bytes past the barriers
/// (SmemLayout::launch_bytes_with_staging; not the 7-stage 128x128
/// ping-pong ring, which then keeps the register store loop).
template <class Cfg, class InT, class Epi, int kExtra = 0>
inline constexpr bool kStoresThroughSmem = (IsTmaStoreEpilogue<Epi>::value) &&
                                           (SmemLayout<Cfg, InT>::launch_bytes_with_staging(kExtra) <= 227 * 1024);

/// Where store_tile_tma may write rows only up to row_end (a grouped tile
/// that crosses its group's end: the rows past it are the next group's),
/// and D to write them with ordinary stores: d (16-bit elements), ldd.
struct StagedRowBound {
  int row_end;
  uint8_t* d;
  int64_t ldd;
};

/// The shared-memory form of the store loop (kStoresThroughSmem): the
/// consumer's share of the tile goes out 64 rows x 32 columns at a time.
/// Each box is packed to 16 bits and written by stmatrix (each warp its 16
/// rows, two stmatrix.x4 of 16 x 16) into one of the consumer's two staging
/// buffers, in the 64-byte-swizzled layout of the epilogue's d_map (chunk
/// c of row r at r * 64 + 16 (c ^ (r / 2 % 4)): conflict-free for stmatrix);
/// then the consumer's thread 0 issues one bulk tensor store of it, which
/// clips rows >= M and columns >= N. A buffer is rewritten only once the
/// store issued from it two boxes earlier has read it
/// (bulk_wait_group_read<1>), so each box's writes to memory overlap the
/// next box's packing; the issuing thread waits for all of them before the
/// kernel exits (tma_store_drain). Why: the register loop's quad transposes
/// cost ~40 instructions per 16-byte store, which on short K outlast the
/// other consumer's main loop (docs/design/gemm.md, "The TMA-store
/// epilogue").
///
/// kBoundRows (grouped tiles, `bound`): a bulk store clips only at the
/// tensor's bounds, so a 64-row atom that crosses bound.row_end is copied
/// out of the staging buffer by the warpgroup instead (each thread two
/// 16-byte chunks, masked per row; N % 8 == 0, so a chunk lies wholly
/// inside or outside N), and an atom wholly past it is skipped. Those
/// buffers are read by the threads themselves: the barrier that opens the
/// next box orders the reads before the buffer's next stmatrix, and the
/// issuing thread first drains every bulk store still reading either
/// buffer (bulk_wait_group_read<0>). The copy is a loop of its own, so
/// the bulk-store loop's code is the one without the bound.
template <class Cfg, bool kBoundRows = false, class Params>
__device__ __forceinline__ void store_tile_tma(const Params& p, const TileInfo& info,
                                               const float (&acc)[Cfg::kMAtoms][Cfg::BN / 2], int consumer, int warp,
                                               int lane, uint8_t* staging, const StagedRowBound& bound = {}) {
  using Conv = typename decltype(p.epilogue)::Conv;
  static_assert(kTmaStoreBoxRows == 64 && kTmaStoreBoxCols == 32,
                "the packing below writes one wgmma atom's rows, 32 columns (two stmatrix.x4 per warp) a box");
  constexpr int kBoxes = Cfg::BN / kTmaStoreBoxCols;  // per 64-row atom
  constexpr int kBufferBytes = kTmaStoreBoxBytes;
  static_assert(kBoxes % 2 == 0, "each tile must use both buffers equally often (the waits count boxes)");
  const bool issuer = threadIdx.x % 128 == 0;
  const int bar = kTmaStoreBarrier + consumer;
  const int m = lane >> 3;  // the stmatrix matrix this lane addresses: row half m % 2, column block m / 2
  const int row = warp * 16 + 8 * (m & 1) + (lane & 7);
  const uint32_t row_addr = ptx::smem_addr(staging) + row * 64;
  const int swizzle = (row >> 1) & 3;
  // Box `box` of atom `a` packed into its staging buffer.
  const auto stage_box = [&](int a, int box) {
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
      const int j = 4 * box + 2 * pair;  // column blocks j and j + 1 of 8
      uint32_t r[4];
#pragma unroll
      for (int mm = 0; mm < 4; ++mm) {  // matrix mm: row half mm % 2 of block j + mm / 2
        const int i = 4 * (j + (mm >> 1)) + 2 * (mm & 1);
        r[mm] = Conv::bits(Conv::pack(acc[a][i], acc[a][i + 1]));
      }
      const int chunk = 2 * pair + (m >> 1);
      ptx::stmatrix_x4(row_addr + (box & 1) * kBufferBytes + ((chunk ^ swizzle) << 4), r[0], r[1], r[2], r[3]);
    }
  };
#pragma unroll
  for (int a = 0; a < Cfg::kMAtoms; ++a) {
    const int row0 = info.row0 + (Cfg::kPingPong ? 0 : consumer * Cfg::kRowsPerConsumer) + a * 64;
    if constexpr (kBoundRows) {
      if (row0 >= bound.row_end) continue;  // warpgroup-uniform; an even number of boxes
      if (row0 + kTmaStoreBoxRows > bound.row_end) {
        if (issuer) ptx::bulk_wait_group_read<0>();
#pragma unroll
        for (int box = 0; box < kBoxes; ++box) {
          ptx::named_barrier_sync(bar, 128);
          stage_box(a, box);
          ptx::named_barrier_sync(bar, 128);
          const uint8_t* buffer = staging + (box & 1) * kBufferBytes;
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int c = static_cast<int>(threadIdx.x % 128) + 128 * i;  // chunk c % 4 of box row c / 4
            const int r = c >> 2, ch = c & 3;
            const int out_row = row0 + r, out_col = info.col0 + kTmaStoreBoxCols * box + 8 * ch;
            if (out_row < bound.row_end && out_col < info.N) {
              const uint4 v = *reinterpret_cast<const uint4*>(buffer + r * 64 + ((ch ^ ((r >> 1) & 3)) << 4));
              *reinterpret_cast<uint4*>(bound.d + (static_cast<int64_t>(out_row) * bound.ldd + out_col) * 2) = v;
            }
          }
        }
        continue;
      }
    }
#pragma unroll
    for (int box = 0; box < kBoxes; ++box) {
      if (issuer) ptx::bulk_wait_group_read<1>();
      ptx::named_barrier_sync(bar, 128);
      stage_box(a, box);
      ptx::fence_proxy_async_shared();
      ptx::named_barrier_sync(bar, 128);
      if (issuer) {
        ptx::tma_store_2d(&p.epilogue.d_map, staging + (box & 1) * kBufferBytes, info.col0 + kTmaStoreBoxCols * box,
                          row0);
        ptx::bulk_commit_group();
      }
    }
  }
}

/// After a consumer's last store_tile_tma: its issuing thread waits until
/// every bulk store it issued has completed (their shared-memory source must
/// outlive them, and the kernel's writes must be done when it exits).
__device__ __forceinline__ void tma_store_drain() {
  if (threadIdx.x % 128 == 0) ptx::bulk_wait_group<0>();
}

/// The row-quad walk of one consumer warpgroup's share of a tile, in the
/// order the store loops write it: for each row this lane holds and each
/// block of 32 columns, the 8 consecutive columns quad_transpose8 gives it,
/// handed to f(row, col, v) with row and col the output's coordinates
/// (row0, col0: the tile's first). Every lane calls the transpose (it
/// shuffles over the full warp); f masks the store to the problem.
template <class Cfg, class F>
__device__ __forceinline__ void for_each_row_octet(int row0, int col0, const float (&acc)[Cfg::kMAtoms][Cfg::BN / 2],
                                                   int consumer, int warp, int lane, F&& f) {
  const int q = lane & 3;  // position in the lane quad that shares a row (see quad_transpose8)
#pragma unroll
  for (int a = 0; a < Cfg::kMAtoms; ++a) {
    const int row_base = row0 + (Cfg::kPingPong ? 0 : consumer * Cfg::kRowsPerConsumer) + a * 64 + warp * 16 + lane / 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int g = 0; g < Cfg::BN / 32; ++g) {
        float v[8];
        quad_transpose8(acc[a], g, h, lane, v);
        f(row_base + 8 * h, col0 + 8 * (4 * g + q), v);
      }
    }
  }
}

/// The store loop of one consumer warpgroup's share of a tile through one bound
/// epilogue `epi` (NotBound when the Epilogue has no bind()): hands the
/// accumulators to store8, 8 consecutive columns per call, masked to the
/// problem. kLoadAhead: a bound with load() issues its loads ahead of its
/// stores (the ping-pong and stream-K kernels); the cooperative kernel keeps
/// its measured one-at-a-time order (false).
template <class Cfg, bool kLoadAhead = true, class Params, class Bound>
__device__ __forceinline__ void store_tile_with(const Params& p, const TileInfo& info,
                                                const float (&acc)[Cfg::kMAtoms][Cfg::BN / 2], int consumer, int warp,
                                                int lane, const Bound& epi) {
  if constexpr (HasColumnStore<Bound>::value) {
    store_tile_columns<Cfg, typename Bound::OutType>(p, info, acc, consumer, warp, lane, epi);
  } else if constexpr (kLoadAhead && HasLoadAhead<Bound>::value) {
    // Load-ahead (epilogue.cuh): the loads of kLoadAhead column blocks are
    // issued before their stores, so they overlap instead of each waiting
    // behind the previous store (possible aliasing).
    constexpr int kAhead = Bound::kLoadAhead;
    static_assert((Cfg::BN / 32) % kAhead == 0, "load-ahead batches must divide the column blocks");
    const int q = lane & 3;  // position in the lane quad that shares a row (see quad_transpose8)
#pragma unroll
    for (int a = 0; a < Cfg::kMAtoms; ++a) {
      const int row_base =
          info.row0 + (Cfg::kPingPong ? 0 : consumer * Cfg::kRowsPerConsumer) + a * 64 + warp * 16 + lane / 4;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row_base + 8 * h;
#pragma unroll
        for (int g0 = 0; g0 < Cfg::BN / 32; g0 += kAhead) {
          typename Bound::Loaded ld[kAhead];
#pragma unroll
          for (int j = 0; j < kAhead; ++j) {
            const int col = info.col0 + 8 * (4 * (g0 + j) + q);
            if (row < p.M && col < p.N) ld[j] = epi.load(row, col);
          }
#pragma unroll
          for (int j = 0; j < kAhead; ++j) {
            float v[8];
            quad_transpose8(acc[a], g0 + j, h, lane, v);
            const int col = info.col0 + 8 * (4 * (g0 + j) + q);
            if (row < p.M && col < p.N) epi.store8(row, col, v, min(8, p.N - col), ld[j]);
          }
        }
      }
    }
  } else {
    for_each_row_octet<Cfg>(info.row0, info.col0, acc, consumer, warp, lane, [&](int row, int col, const float(&v)[8]) {
      if (row < p.M && col < p.N) epi_store8(p.epilogue, epi, info, row, col, v, min(8, p.N - col));
    });
  }
}

/// Walks this CTA's share of the schedule. Without clusters, CTA b takes
/// positions b, b + gridDim.x, ... of a schedule over all tiles. With a
/// cluster of kClusterM x kClusterN CTAs the Scheduler orders cluster tiles
/// (tile rows kClusterM i .. kClusterM i + kClusterM - 1 of tile columns
/// kClusterN j ..): cluster c takes positions c, c + clusters, ..., and CTA
/// (rm, rn) of the cluster (TileConfig) computes tile (kClusterM i + rm,
/// kClusterN j + rn). Where tiles_m or tiles_n is not a multiple of the
/// cluster's extent, the last cluster tiles hold tiles that do not exist
/// (tile_exists): their CTA still loads (out-of-bounds rows or columns, TMA
/// fills zeros) so its peers get their shares of A and B, but it waits for
/// nothing, stores nothing and notifies nothing.
template <class Cfg, class Scheduler>
struct TileWalk {
  int first, stride, count, tiles_m, tiles_n;
  uint32_t rank;
  __device__ TileWalk(int tm, int tn) : TileWalk(tm, tn, tm * tn) {}
  /// units: positions of the schedule without clusters (tm * tn, or more for
  /// a split-K schedule: sched_units).
  __device__ TileWalk(int tm, int tn, int units) : tiles_m(tm), tiles_n(tn) {
    if constexpr (Cfg::kClusterSize == 1) {
      first = blockIdx.x;
      stride = gridDim.x;
      count = units;
      rank = 0;
    } else if constexpr (Cfg::kClusterN == 1) {
      first = blockIdx.x / 2;
      stride = gridDim.x / 2;
      count = ((tm + 1) / 2) * tn;
      rank = ptx::cluster_ctarank();
    } else {
      first = blockIdx.x / Cfg::kClusterSize;
      stride = gridDim.x / Cfg::kClusterSize;
      count = ((tm + Cfg::kClusterM - 1) / Cfg::kClusterM) * ((tn + 1) / 2);
      rank = ptx::cluster_ctarank();
    }
  }
  __device__ __forceinline__ TileCoord at(const Scheduler& s, int pos) const {
    if constexpr (Cfg::kClusterSize == 1) {
      return s.tile(pos, tiles_m, tiles_n);
    } else if constexpr (Cfg::kClusterN == 1) {
      TileCoord t = s.tile(pos, (tiles_m + 1) / 2, tiles_n);
      t.m = 2 * t.m + static_cast<int>(rank);
      return t;
    } else {
      TileCoord t = s.tile(pos, (tiles_m + Cfg::kClusterM - 1) / Cfg::kClusterM, (tiles_n + 1) / 2);
      t.m = Cfg::kClusterM * t.m + static_cast<int>(Cfg::cluster_m_rank(rank));
      t.n = 2 * t.n + static_cast<int>(Cfg::cluster_n_rank(rank));
      return t;
    }
  }
};

/// Whether tile t of a cluster tile exists (TileWalk): without a cluster
/// along N only its row can lie past the problem.
template <class Cfg, class Params>
__device__ __forceinline__ bool tile_exists(const Params& p, const TileCoord& t) {
  if constexpr (Cfg::kClusterN == 1)
    return t.m < p.tiles_m;
  else
    return t.m < p.tiles_m && t.n < p.tiles_n;
}

/// What the policies are told about tile `t` at schedule position `pos`.
template <class Cfg, class Params>
__device__ __forceinline__ TileInfo tile_info(const Params& p, const TileCoord& t, int pos) {
  return TileInfo{t.m, t.n, pos, t.m * Cfg::BM, t.n * Cfg::BN, Cfg::BM, Cfg::BN, p.tiles_m, p.tiles_n, p.M, p.N};
}

/// The warp index of the calling thread, warp-uniform (as CUTLASS's
/// canonical_warp_idx_sync). The shuffle tells ptxas the warp index is the
/// same in every lane, so the role branches are uniform; the TMA thread is
/// chosen by elect.sync, so ptxas knows one lane runs its loop and keeps the
/// loop's addresses in uniform registers. With threadIdx.x tests instead, a
/// second producer role (notifier, waiter) made ptxas move the TMA operands
/// to vector registers (~4 R2UR per TMA issue, and every issue wrapped in an
/// ELECT / BRA.U.ANY loop), which lengthened the TMA thread's reaction to a
/// freed slot: the idle hooks' cost (docs/design/gemm-engine.md).
__device__ __forceinline__ int canonical_warp_idx() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 32, 0);
}

/// One CTA of the kernel after set-up: its shared memory, the calling
/// thread's warp-uniform warp and warpgroup indices (and whether it is lane 0
/// of its warp), its tile walk and the K blocks of every tile.
template <class Cfg, class InT, class Scheduler>
struct GemmCta {
  SmemLayout<Cfg, InT> sm;
  int warp_idx;
  bool lane0;
  int warpgroup;
  TileWalk<Cfg, Scheduler> walk;
  int k_blocks;
};

/// The CTA's set-up, run by every thread: aligns the dynamic shared memory,
/// initialises the ring's mbarriers (and the waiter ring's, with an active
/// Prologue) and publishes them to the CTA (to the cluster: the peer's
/// barriers exist before anyone multicasts or arrives remotely).
template <class Cfg, class InT, class Prologue, class Params>
__device__ __forceinline__ auto gemm_cta_setup(const Params& p) {
  using L = SmemLayout<Cfg, InT>;
  using Scheduler = decltype(p.scheduler);
  extern __shared__ uint8_t smem_raw[];
  const L sm{reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023))};
  const int warp_idx = canonical_warp_idx();
  const bool lane0 = threadIdx.x % 32 == 0;
  const int warpgroup = warp_idx / 4;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      ptx::mbar_init(sm.full(s), 1);  // the local producer's arrive.expect_tx
      // one arrive per consumer warp of every CTA that reads this slot's data
      // (ping-pong: only the warps of the consumer that owns the tile)
      ptx::mbar_init(sm.empty(s), Cfg::kEmptyArrivals);
    }
    if constexpr (Prologue::kActive) {
      for (int s = 0; s < WaiterRing::kSlots; ++s) {
        ptx::mbar_init(sm.prologue_ready(s), 1);  // the waiter's arrive
        ptx::mbar_init(sm.prologue_free(s), 1);   // the TMA thread's arrive
      }
    }
    ptx::fence_barrier_init();
  }
  if constexpr (Cfg::kClusterSize == 1)
    __syncthreads();
  else
    ptx::cluster_sync();
  // Programmatic dependent launch (kDependentLaunch): the set-up above may
  // overlap the previous kernel's tail; nothing in global memory is read or
  // written before this wait (a no-op without the launch attribute). The
  // TMA thread lets the next kernel be scheduled once it issued its last
  // load (run_tma_thread).
  ptx::grid_dependency_wait();

  // Split-K (a scheduler with kSplitK): more units than tiles, each over one
  // split's share of K; clusters are not combined with it.
  static_assert(!IsSplitK<Scheduler>::value || Cfg::kClusterSize == 1, "split-K runs without clusters");
  const TileWalk<Cfg, Scheduler> walk(p.tiles_m, p.tiles_n, sched_units(p.scheduler, p.tiles_m, p.tiles_n));
  const int k_blocks = sched_k_blocks(p.scheduler, (p.K + Cfg::BK - 1) / Cfg::BK);
  return GemmCta<Cfg, InT, Scheduler>{sm, warp_idx, lane0, warpgroup, walk, k_blocks};
}

/// Notifier (ProducerWarpRole::kNotifier, Epilogue::kNotify): waits until all
/// consumer threads stored tile i, makes the stores visible at the epilogue's
/// scope, publishes tile_done. Then (before the fence: the store threads may
/// wait for it) frees the barrier for tile i + 2 (NotifyHandshake,
/// barriers.cuh).
template <class Cfg, class Params, class Cta>
__device__ __forceinline__ void run_notifier(const Params& p, const Cta& cta) {
  using Epilogue = decltype(p.epilogue);
  const auto& walk = cta.walk;
  const int tiles = walk.first < walk.count ? (walk.count - walk.first + walk.stride - 1) / walk.stride : 0;
  int iter = 0;
  for (int pos = walk.first; pos < walk.count; pos += walk.stride, ++iter) {
    const TileCoord t = walk.at(p.scheduler, pos);
    ptx::named_barrier_sync(kNotifyBarrier + (iter & 1), Cfg::kStoreThreads + 32);
    if (NotifyHandshake::notifier_frees(iter, tiles))
      ptx::named_barrier_arrive(kNotifyFreeBarrier + (iter & 1), Cfg::kStoreThreads + 32);
    if (cta.lane0 && tile_exists<Cfg>(p, t)) {
      if constexpr (Epilogue::kSysScope)
        link::mo::fence_acq_rel_sys();
      else
        link::mo::fence_acq_rel_gpu();
      p.epilogue.tile_done(tile_info<Cfg>(p, t, pos));
    }
  }
}

/// Waiter (lane 0 of ProducerWarpRole::kWaiter, Prologue::kActive): the
/// Prologue's wait for every tile of this CTA, in schedule order, at most
/// WaiterRing::kSlots tiles ahead of the TMA thread.
///
/// Memory order (why the TMA thread's loads of tile j see the data the
/// flags publish, although another thread acquired them):
///   remote writes -> release (flag store, any scope the prologue uses)
///   -> waiter: acquire of the flag (ld.acquire, or relaxed loads +
///      fence.acq_rel: FlagMemo), generic proxy
///   -> waiter: fence.proxy.async.global (orders the acquired global
///      data, generic proxy, before later async-proxy accesses)
///   -> waiter: mbarrier.arrive on ready[s] (release, CTA scope)
///   -> TMA thread: mbarrier.try_wait on ready[s] (acquire, CTA scope)
///   -> TMA thread: cp.async.bulk.tensor loads of tile j (async proxy).
/// Every arrow is program order or a release/acquire pair, so the
/// remote writes happen before the TMA reads; the proxy crossing is
/// made by the thread that did the generic-proxy access, before the
/// CTA-scope synchronisation — the pattern CUTLASS uses for a TMA
/// store of smem written by other threads (each writer
/// fence.proxy.async, then a barrier, then one thread issues the TMA).
/// When a stateful prologue (FlagWait's memo) acquired nothing new for
/// tile j, the fence is skipped: the acquire and fence that covered
/// its flags preceded an earlier ready arrive, which the TMA thread
/// acquired before tile j's loads (program order). Tiles that do not
/// exist (tile_exists: past the problem in a cluster tile)
/// wait for nothing but still take a ring slot, so both threads count
/// the same tiles. The waiter exits after its last tile: no barrier counts
/// it any more.
template <class Cfg, class Params, class Cta>
__device__ __forceinline__ void run_waiter(const Params& p, const Cta& cta) {
  using Prologue = decltype(p.prologue);
  const auto& walk = cta.walk;
  PrologueState<Prologue> prologue_state{};  // e.g. FlagWait's memo of acquired flags
  int iter = 0;
  for (int pos = walk.first; pos < walk.count; pos += walk.stride, ++iter) {
    const TileCoord t = walk.at(p.scheduler, pos);
    const int s = WaiterRing::slot(iter);
    ptx::mbar_wait(cta.sm.prologue_free(s), WaiterRing::free_parity(iter));
    if (tile_exists<Cfg>(p, t) && prologue_wait(p.prologue, tile_info<Cfg>(p, t, pos), prologue_state))
      ptx::fence_proxy_async_global();
    ptx::mbar_arrive(cta.sm.prologue_ready(s));
  }
}

/// The TMA thread (one elected lane of ProducerWarpRole::kTma): streams every
/// tile's K blocks into the ring, in schedule order; with an active Prologue
/// each tile only after the waiter handed it over.
template <class Cfg, class InT, bool kTransB, class Params, class Cta>
__device__ __forceinline__ void run_tma_thread(const CUtensorMap& tma_a, const CUtensorMap& tma_b, const Params& p,
                                               const Cta& cta) {
  using Prologue = decltype(p.prologue);
  constexpr bool kSplitK = IsSplitK<decltype(p.scheduler)>::value;
  const auto& sm = cta.sm;
  const auto& walk = cta.walk;
  ptx::tma_prefetch_desc(&tma_a);
  ptx::tma_prefetch_desc(&tma_b);
  PipelineState<Cfg::kStages> pipe;
  [[maybe_unused]] int iter = 0;  // CTA-local tile index (waiter ring only)
  for (int pos = walk.first; pos < walk.count; pos += walk.stride) {
    if constexpr (Prologue::kActive) {
      // Normally complete long ago: the waiter runs up to kSlots tiles
      // ahead. Frees the slot at once (the waiter may start tile
      // iter + kSlots while this thread loads tile iter).
      const int s = WaiterRing::slot(iter);
      ptx::mbar_wait(sm.prologue_ready(s), WaiterRing::ready_parity(iter));
      ptx::mbar_arrive(sm.prologue_free(s));
      ++iter;
    }
    const TileCoord t = walk.at(p.scheduler, pos);
    const CUtensorMap* map_a = &tma_a;
    int row_a = t.m * Cfg::BM;
    prologue_a_source(p.prologue, map_a, row_a);  // e.g. the own shard read in place
    if constexpr (kSplitK)
      produce_tile<Cfg, InT, kTransB>(sm, map_a, &tma_b, row_a, t.n * Cfg::BN, p.scheduler.k_begin(pos), cta.k_blocks,
                                      pipe, walk.rank);
    else
      produce_tile<Cfg, InT, kTransB>(sm, map_a, &tma_b, row_a, t.n * Cfg::BN, cta.k_blocks, pipe, walk.rank);
  }
  // The CTA's last load is issued: the next kernel's CTAs may now be
  // scheduled (one thread's trigger counts for the CTA), onto SMs this grid
  // leaves idle or frees, and run their set-up during this CTA's last tiles
  // rather than wait on those SMs through the whole kernel.
  if constexpr (kDependentLaunch<Prologue, decltype(p.epilogue)>) ptx::grid_dependents_launch();
  if constexpr (Cfg::kClusterSize > 1) {
    // Tail: wait until every slot was released by its readers' consumers, so
    // no remote arrive can target this CTA's smem after it exits.
    for (int i = 0; i < Cfg::kStages; ++i) {
      ptx::mbar_wait(sm.empty(pipe.stage), pipe.phase ^ 1);
      pipe.advance();
    }
  }
}

/// The producer warpgroup: lowers its register budget and runs each warp's
/// role (ProducerWarpRole; a role whose hook is compiled out has no work).
template <class Cfg, class InT, bool kTransB, class Params, class Cta>
__device__ __forceinline__ void run_producer_warpgroup(const CUtensorMap& tma_a, const CUtensorMap& tma_b,
                                                       const Params& p, const Cta& cta) {
  using Prologue = decltype(p.prologue);
  using Epilogue = decltype(p.epilogue);
  ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
  const ProducerWarpRole role = producer_warp_role(cta.warp_idx);
  if constexpr (Epilogue::kNotify) {
    if (role == ProducerWarpRole::kNotifier) run_notifier<Cfg>(p, cta);
  }
  if constexpr (Prologue::kActive) {
    if (cta.lane0 && role == ProducerWarpRole::kWaiter) run_waiter<Cfg>(p, cta);
  }
  if (role == ProducerWarpRole::kTma && ptx::elect_one_sync()) run_tma_thread<Cfg, InT, kTransB>(tma_a, tma_b, p, cta);
}

}  // namespace tessera::kernels::engine
