// tessera/kernels/gemm/grouped_kernel.cuh — the persistent grouped GEMM
// kernel: G problems D_g = A_g · op(B_g) (same N and K, own M_g read from
// device memory) in one launch, on the engine's pipeline (mainloop.cuh:
// TileConfig, SmemLayout, consume_tile; the producer differs only in B's
// 3-D TMA box, produce_grouped_tile below).
//
//   A: stacked [max_rows, K] (2-D TMA map; group g's rows start at the
//      prefix sum of M_g). A tile's rows past its group's end are the next
//      group's (or TMA zero fill past max_rows): multiplied, never stored.
//      kGatherA kernels instead copy each stacked row from a row of another
//      matrix through an index table (GroupedGather, produce_gathered_tile).
//   B: [G, N, K] (NK) or [G, K, N] (KN) as ONE 3-D TMA map whose outermost
//      coordinate is the group, so N and K tails are zero-filled per group.
//   D: stacked [max_rows, N] (the Epilogue owns it; masked to the group's
//      rows and to N).
//
// Roles, barriers, the prologue-waiter ring and the notify handshake are the
// engine's (kernel_common.cuh, barriers.cuh), with GroupedTileInfo (group field,
// grouped_scheduler.cuh) handed to the policies:
//   Prologue: static constexpr bool kActive;
//             __device__ void wait(const GroupedTileInfo&) const;   (or the
//             stateful wait(const GroupedTileInfo&, State&) -> bool)
//             Engine prologues written for TileInfo (NoWait, FlagWait) work
//             unchanged: the base class is in stacked-row coordinates.
//   Epilogue: kNotify, kSysScope as in epilogue.cuh;
//             __device__ void store8(const GroupedTileInfo&, int row, int col,
//                                    const float (&v)[8], int valid) const;
//             __device__ void tile_done(const GroupedTileInfo&) const;
//             (StdEpilogue works for the stores; GroupedEpilogue below adds
//             per-group / per-tile notification.)
// Cooperative (both consumers on one tile) and ping-pong (alternate tiles)
// configurations, as the engine; no clusters.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "tessera/link/memory_order.cuh"
#include "tessera/kernels/gemm/barriers.cuh"
#include "tessera/kernels/gemm/epilogue.cuh"
#include "tessera/kernels/gemm/grouped_scheduler.cuh"
#include "tessera/kernels/gemm/kernel_common.cuh"
#include "tessera/kernels/gemm/mainloop.cuh"
#include "tessera/kernels/gemm/pipeline.cuh"
#include "tessera/kernels/gemm/prologue.cuh"

namespace tessera::kernels::engine {

/// Row gather of A (the MoE dispatch fused into the gate/up loads): stacked
/// row i reads row index[i] / div of `a` ([rows, K], row stride lda) instead
/// of row i of the stacked A. Rows past the groups' total, and indices
/// outside [0, rows), read zeros.
struct GroupedGather {
  const void* a = nullptr;
  const int* index = nullptr;  ///< device [max_rows]; only the first sum(M_g) are read
  long long lda = 0;           ///< elements
  int rows = 0;
  FastDivmod div;  ///< index -> source row (MoE: the sorted entry -> its token, div = top-k)
};

template <class Prologue, class Epilogue>
struct GroupedParams {
  int N, K;
  int groups;
  int max_rows;  ///< rows of the stacked A and D (the host's bound)
  int tiles_n;
  GroupedRaster raster;   ///< order of a group's tiles
  const int* group_rows;  ///< device [groups]: M_g
  int* status;            ///< device [kGroupedStatusWords] or nullptr
  Prologue prologue;
  Epilogue epilogue;
  GroupedGather gather;  ///< used by the kGatherA kernels only
};

/// B's K block k0 of group g, columns col0.. into ring slot `stage` by TMA
/// (box {64, BN, 1} for NK, {64, 64, 1} chunks for KN).
template <class Cfg, class InT, bool kTransB>
__device__ __forceinline__ void load_grouped_b(const SmemLayout<Cfg, InT>& sm, const CUtensorMap* tma_b, int stage,
                                               int k0, int col0, int g) {
  if constexpr (!kTransB) {
    ptx::tma_load_3d(sm.b(stage), tma_b, sm.full(stage), k0, col0, g);
  } else {
#pragma unroll
    for (int c = 0; c < Cfg::BN / 64; ++c)
      ptx::tma_load_3d(sm.b(stage) + c * 64 * 64 * 2, tma_b, sm.full(stage), col0 + c * 64, k0, g);
  }
}

/// Producer side of one grouped tile: produce_tile (mainloop.cuh) with B read
/// through the 3-D map at group `g` (box {64, BN, 1} for NK, {64, 64, 1}
/// chunks for KN: the same smem image as the 2-D boxes).
template <class Cfg, class InT, bool kTransB>
__device__ __forceinline__ void produce_grouped_tile(const SmemLayout<Cfg, InT>& sm, const CUtensorMap* tma_a,
                                                     const CUtensorMap* tma_b, int row0, int col0, int g, int k_blocks,
                                                     PipelineState<Cfg::kStages>& pipe) {
  static_assert(Cfg::kClusterSize == 1, "grouped GEMM: no clusters");
  using L = SmemLayout<Cfg, InT>;
  for (int kb = 0; kb < k_blocks; ++kb) {
    const int stage = pipe.stage;
    ptx::mbar_wait(sm.empty(stage), pipe.phase ^ 1);
    ptx::mbar_arrive_expect_tx(sm.full(stage), L::kStageBytes);
    const int k0 = kb * Cfg::BK;
    ptx::tma_load_2d(sm.a(stage), tma_a, sm.full(stage), k0, row0);
    load_grouped_b<Cfg, InT, kTransB>(sm, tma_b, stage, k0, col0, g);
    pipe.advance();
  }
}

/// Shared memory the kGatherA kernels add after the group table: the
/// producer's source-row addresses of two tiles.
template <class Cfg>
inline constexpr int kGroupedGatherBytes = 2 * Cfg::BM * 8;

/// Producer side of one grouped tile with A gathered row by row
/// (GroupedGather), run by the whole producer warpgroup (one warp's
/// cp.asyncs keep too few bytes in flight). The tile's source-row addresses
/// go to `row_addr` (shared, BM entries, 0 = no source) once, behind one
/// warpgroup barrier (the caller alternates two buffers, so the barrier also
/// orders the refill after every thread's reads two tiles back). Per K block
/// thread t copies 16-byte chunk t % 8 of rows t / 8 + 16 j: eight lanes
/// read one row's 128 bytes, so a warp's copy touches four lines. Each
/// chunk lands where TMA's 128-byte swizzle puts it (chunk c of row r at
/// r * 128 + (c ^ (r % 8)) * 16); each thread arrives on the full barrier
/// when its copies land (mbar_init counts 1 + 128 arrivals). Thread 0 loads
/// B by TMA as produce_grouped_tile does. Chunks past K and rows without a
/// source are zero-filled.
template <class Cfg, class InT, bool kTransB>
__device__ __forceinline__ void produce_gathered_tile(const SmemLayout<Cfg, InT>& sm, const GroupedGather& ga,
                                                      unsigned long long* row_addr, const CUtensorMap* tma_b, int row0,
                                                      int rows_total, int col0, int g, int K, int k_blocks,
                                                      PipelineState<Cfg::kStages>& pipe) {
  static_assert(Cfg::kClusterSize == 1, "grouped GEMM: no clusters");
  static_assert(Cfg::BM % 16 == 0 && Cfg::BM <= 128, "16 rows per pass; one source per thread");
  using L = SmemLayout<Cfg, InT>;
  const int t = threadIdx.x % 128, chunk = t % 8, r0 = t / 8;
  if (t < Cfg::BM) {
    unsigned long long addr = 0;
    if (row0 + t < rows_total) {
      const int idx = __ldg(ga.index + row0 + t);
      const int src = idx < 0 ? -1 : static_cast<int>(ga.div.div(static_cast<uint32_t>(idx)));
      if (src >= 0 && src < ga.rows)
        addr = reinterpret_cast<unsigned long long>(static_cast<const char*>(ga.a) + src * ga.lda * 2);
    }
    row_addr[t] = addr;
  }
  ptx::named_barrier_sync(kGatherBarrier, 128);
  for (int kb = 0; kb < k_blocks; ++kb) {
    const int stage = pipe.stage;
    ptx::mbar_wait(sm.empty(stage), pipe.phase ^ 1);
    const int k0 = kb * Cfg::BK;
    if (t == 0) {
      ptx::mbar_arrive_expect_tx(sm.full(stage), L::kBBytes);
      load_grouped_b<Cfg, InT, kTransB>(sm, tma_b, stage, k0, col0, g);
    }
    const bool k_in = k0 + chunk * 8 < K;
    const int offset = (k0 + chunk * 8) * 2;
    const unsigned long long any = reinterpret_cast<unsigned long long>(ga.a);  // read by no zero-fill copy
    uint8_t* a_s = sm.a(stage) + r0 * 128 + ((chunk ^ (r0 & 7)) << 4);          // rows r0 + 16 j: the same r % 8
#pragma unroll
    for (int j = 0; j < Cfg::BM / 16; ++j) {
      const unsigned long long addr = row_addr[r0 + 16 * j];
      const bool ok = k_in && addr != 0;
      ptx::cp_async_16(a_s + j * 16 * 128, reinterpret_cast<const char*>(ok ? addr + offset : any), ok ? 16u : 0u);
    }
    ptx::cp_async_mbar_arrive_noinc(sm.full(stage));
    pipe.advance();
  }
}

namespace detail {
template <class P, class S, class = void>
struct HasGroupedStatefulWait : std::false_type {};
template <class P, class S>
struct HasGroupedStatefulWait<
    P, S,
    std::enable_if_t<std::is_same_v<
        decltype(std::declval<const P&>().wait(std::declval<const GroupedTileInfo&>(), std::declval<S&>())), bool>>>
    : std::true_type {};
template <class E, class = void>
struct HasGroupedBind : std::false_type {};
template <class E>
struct HasGroupedBind<E, std::void_t<decltype(std::declval<const E&>().bind(std::declval<const GroupedTileInfo&>()))>>
    : std::true_type {};
}  // namespace detail

/// prologue_wait (prologue.cuh) with the GroupedTileInfo: true when the
/// kernel must fence the async proxy before the tile's loads.
template <class P>
__device__ __forceinline__ bool grouped_prologue_wait(const P& p, const GroupedTileInfo& t, PrologueState<P>& s) {
  if constexpr (detail::HasGroupedStatefulWait<P, PrologueState<P>>::value) {
    return p.wait(t, s);
  } else {
    p.wait(t);
    return true;
  }
}

/// Stores one consumer's accumulators of tile `t` through `epi` (an
/// Epilogue, or the object its bind(t) returned), masked to the group's rows
/// (row < t.M) and to N.
template <class Cfg, class Epi, class Bound>
__device__ __forceinline__ void grouped_store_tile(const Epi& epi, const Bound& bound, const GroupedTileInfo& t,
                                                   const float (&acc)[Cfg::kMAtoms][Cfg::BN / 2], int consumer,
                                                   int warp, int lane) {
  // Rows of one warp straddle the group's end: only the store is masked.
  for_each_row_octet<Cfg>(t.row0, t.col0, acc, consumer, warp, lane, [&](int row, int col, const float(&v)[8]) {
    if (row < t.M && col < t.N) {
      if constexpr (detail::HasGroupedBind<Epi>::value)
        bound.store8(row, col, v, min(8, t.N - col));
      else
        epi.store8(t, row, col, v, min(8, t.N - col));
    }
  });
}

template <class Epi>
__device__ __forceinline__ auto grouped_bind(const Epi& epi, const GroupedTileInfo& t) {
  if constexpr (detail::HasGroupedBind<Epi>::value)
    return epi.bind(t);
  else
    return NotBound{};
}

/// Per-group epilogue for MoE: the stores of StdEpilogue<OutT, kFeatures>
/// (plain, or kEpiSwiGLU: D[r, c/2] = SiLU(gate) * up from interleaved
/// columns, D then has N/2 columns), and with kEpiNotify / kEpiNotifySys a
/// notification after each tile is visible (the kernel's fence precedes
/// tile_done, epilogue.cuh's contract):
///   per_group: flags[group] += notify_add — an expert's count reaches
///              epoch * tiles_m(g) * tiles_n when all its tiles are stored;
///   else:      flags[pos] += notify_add — one flag per tile, in schedule
///              order (pos = tile_start[g] + m * tiles_n + n).
/// kEpiReorder and kEpiAddPartial are not supported (rejected at compile time).
template <class OutT, unsigned kFeatures = kEpiPlain>
struct GroupedEpilogue {
  static_assert((kFeatures & (kEpiReorder | kEpiAddPartial | kEpiBias)) == 0,
                "GroupedEpilogue: plain or SwiGLU stores, with or without notify");
  static constexpr bool kSysScope = (kFeatures & kEpiNotifySys) != 0;
  static constexpr bool kNotify = kSysScope || (kFeatures & kEpiNotify) != 0;
  using Store = StdEpilogue<OutT, kFeatures & ~(kEpiNotify | kEpiNotifySys)>;
  Store store;
  uint32_t* flags = nullptr;
  bool per_group = true;
  uint32_t notify_add = 1;

  __device__ __forceinline__ void store8(const GroupedTileInfo& t, int row, int col, const float (&v)[8],
                                         int valid) const {
    store.store8(t, row, col, v, valid);
  }
  __device__ __forceinline__ void tile_done(const GroupedTileInfo& t) const {
    if constexpr (kNotify) {
      const int f = per_group ? t.group : t.pos;
      if constexpr (kSysScope)
        link::mo::red_add_relaxed_sys(flags + f, notify_add);
      else
        link::mo::red_add_relaxed_gpu(flags + f, notify_add);
    }
  }
};

/// The plain grouped epilogue (no notify) of a 16-bit D that the kernels
/// store through shared memory (store_tile_tma, as the plain gemm()'s
/// TmaStoreEpilogue) where through_smem is set (N % 8 == 0) and the kernel
/// has room for the staging buffers (kGroupedStoresThroughSmem): 64-row
/// atoms inside their group by bulk stores, an atom that crosses its
/// group's end by masked 16-byte stores from the staging buffer (a bulk
/// store clips only at the tensor's bounds, max_rows, and would write the
/// next group's rows). d_map: D as [max_rows, N] (ldd), box 32 columns x
/// 64 rows, 64-byte swizzle; both set by detail::make_tma_store_map.
template <class OutT>
struct GroupedTmaStoreEpilogue : GroupedEpilogue<OutT, kEpiPlain> {
  using Conv = OutConv<OutT>;
  bool through_smem = false;
  CUtensorMap d_map;
};
template <class OutT>
struct IsTmaStoreEpilogue<GroupedTmaStoreEpilogue<OutT>> : std::true_type {};

/// Whether the grouped kernel stores through shared memory: the ring and
/// its barriers (SmemLayout), the group table, then the TMA-store staging
/// buffers (SmemLayout::staging with the table as `extra`); the row
/// gather's table (kGatherA) leaves no room for them.
template <class Cfg, class InT, class Epi, bool kGatherA>
inline constexpr bool kGroupedStoresThroughSmem = !kGatherA && kStoresThroughSmem<Cfg, InT, Epi, GroupedTable::kBytes>;

/// One consumer's store of grouped tile t: through shared memory with a
/// GroupedTmaStoreEpilogue whose through_smem is set (the rows of an atom
/// that crosses the group's end copied out of the staging buffer and
/// masked: store_tile_tma's kBoundRows), else the register loop.
template <class Cfg, bool kThroughSmem, class Params, class Bound>
__device__ __forceinline__ void grouped_store(const Params& p, const Bound& bound, const GroupedTileInfo& t,
                                              const float (&acc)[Cfg::kMAtoms][Cfg::BN / 2], int consumer, int warp,
                                              int lane, uint8_t* staging) {
  if constexpr (kThroughSmem) {
    if (p.epilogue.through_smem) {
      const StagedRowBound rows{t.M, reinterpret_cast<uint8_t*>(p.epilogue.store.d), p.epilogue.store.ldd};
      store_tile_tma<Cfg, true>(p, t, acc, consumer, warp, lane, staging, rows);
      return;
    }
  }
  grouped_store_tile<Cfg>(p.epilogue, bound, t, acc, consumer, warp, lane);
}

/// The grouped kernel. Grid: persistent, at most one CTA per SM (any size
/// >= 1 works: CTA b takes positions b, b + gridDim.x, ...). kGatherA: A's
/// rows come through p.gather (produce_gathered_tile), not the TMA map.
template <class Cfg, class InT, bool kTransB, class Prologue, class Epilogue, bool kGatherA = false>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                        const __grid_constant__ GroupedParams<Prologue, Epilogue> p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  static_assert(Cfg::kClusterSize == 1, "grouped GEMM: no clusters");
  using L = SmemLayout<Cfg, InT>;
  extern __shared__ uint8_t smem_raw[];
  const L sm{reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023))};
  const GroupedTable tab = GroupedTable::at(sm.base + L::kBytes);

  const int warp_idx = canonical_warp_idx();
  const bool lane0 = threadIdx.x % 32 == 0;
  const int warpgroup = warp_idx / 4;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) {
      ptx::mbar_init(sm.full(s), kGatherA ? 1 + 128 : 1);
      ptx::mbar_init(sm.empty(s), Cfg::kEmptyArrivals);
    }
    if constexpr (Prologue::kActive) {
      for (int s = 0; s < WaiterRing::kSlots; ++s) {
        ptx::mbar_init(sm.prologue_ready(s), 1);
        ptx::mbar_init(sm.prologue_free(s), 1);
      }
    }
    ptx::fence_barrier_init();
  }
  // The table (ends with __syncthreads, which also publishes the barriers).
  build_grouped_table<Cfg::kThreads, Cfg::BM>(tab, p.group_rows, p.groups, p.tiles_n, p.max_rows, p.status);

  const int total = tab.tile_start[p.groups];
  const int first = blockIdx.x, stride = gridDim.x;
  const int k_blocks = (p.K + Cfg::BK - 1) / Cfg::BK;
  auto cursor_at = [&](GroupCursor<Cfg::BM, Cfg::BN>& c, int pos) { return c.at(tab, pos, p.raster, p.N); };
  PipelineState<Cfg::kStages> pipe;  // the TMA thread's, or this consumer's

  if (warpgroup_role(warpgroup) == WarpGroupRole::kProducer) {
    ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    const ProducerWarpRole role = producer_warp_role(warp_idx);
    if constexpr (Epilogue::kNotify) {
      if (role == ProducerWarpRole::kNotifier) {
        // Notifier (kernel_common.cuh): barrier of tile iter -> handshake -> fence -> tile_done.
        GroupCursor<Cfg::BM, Cfg::BN> cur;
        const int tiles = first < total ? (total - first + stride - 1) / stride : 0;
        int iter = 0;
        for (int pos = first; pos < total; pos += stride, ++iter) {
          const GroupedTileInfo t = cursor_at(cur, pos);
          ptx::named_barrier_sync(kNotifyBarrier + (iter & 1), Cfg::kStoreThreads + 32);
          if (NotifyHandshake::notifier_frees(iter, tiles))
            ptx::named_barrier_arrive(kNotifyFreeBarrier + (iter & 1), Cfg::kStoreThreads + 32);
          if (lane0) {
            if constexpr (Epilogue::kSysScope)
              link::mo::fence_acq_rel_sys();
            else
              link::mo::fence_acq_rel_gpu();
            p.epilogue.tile_done(t);
          }
        }
      }
    }
    if constexpr (Prologue::kActive) {
      if (role == ProducerWarpRole::kWaiter && lane0) {
        // Waiter (kernel_common.cuh): the Prologue's wait per tile, kSlots ahead of the TMA thread.
        GroupCursor<Cfg::BM, Cfg::BN> cur;
        PrologueState<Prologue> prologue_state{};
        int iter = 0;
        for (int pos = first; pos < total; pos += stride, ++iter) {
          const GroupedTileInfo t = cursor_at(cur, pos);
          const int s = WaiterRing::slot(iter);
          ptx::mbar_wait(sm.prologue_free(s), WaiterRing::free_parity(iter));
          if (grouped_prologue_wait(p.prologue, t, prologue_state)) ptx::fence_proxy_async_global();
          ptx::mbar_arrive(sm.prologue_ready(s));
        }
      }
    }
    if constexpr (kGatherA) {
      // The whole warpgroup: cp.async rows of A, TMA of B (no waiter or notifier roles).
      static_assert(!Prologue::kActive && !Epilogue::kNotify, "grouped GEMM: the row gather takes no hooks");
      if (threadIdx.x == 0) ptx::tma_prefetch_desc(&tma_b);
      unsigned long long* row_addr = reinterpret_cast<unsigned long long*>(sm.base + L::kBytes + GroupedTable::kBytes);
      GroupCursor<Cfg::BM, Cfg::BN> cur;
      const int rows_total = tab.row_start[p.groups];
      int iter = 0;
      for (int pos = first; pos < total; pos += stride, ++iter) {
        const GroupedTileInfo t = cursor_at(cur, pos);
        produce_gathered_tile<Cfg, InT, kTransB>(sm, p.gather, row_addr + (iter & 1) * Cfg::BM, &tma_b, t.row0,
                                                 rows_total, t.col0, t.group, p.K, k_blocks, pipe);
      }
    } else if (role == ProducerWarpRole::kTma && ptx::elect_one_sync()) {  // the TMA thread
      ptx::tma_prefetch_desc(&tma_a);
      ptx::tma_prefetch_desc(&tma_b);
      GroupCursor<Cfg::BM, Cfg::BN> cur;
      [[maybe_unused]] int iter = 0;
      for (int pos = first; pos < total; pos += stride) {
        if constexpr (Prologue::kActive) {
          const int s = WaiterRing::slot(iter);
          ptx::mbar_wait(sm.prologue_ready(s), WaiterRing::ready_parity(iter));
          ptx::mbar_arrive(sm.prologue_free(s));
          ++iter;
        }
        const GroupedTileInfo t = cursor_at(cur, pos);
        const CUtensorMap* map_a = &tma_a;
        int row_a = t.row0;
        prologue_a_source(p.prologue, map_a, row_a);
        produce_grouped_tile<Cfg, InT, kTransB>(sm, map_a, &tma_b, row_a, t.col0, t.group, k_blocks, pipe);
      }
    }
  } else {
    ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
    const int consumer = consumer_of(warpgroup);
    const int warp = (threadIdx.x % 128) / 32;
    const int lane = threadIdx.x % 32;
    float acc[Cfg::kMAtoms][Cfg::BN / 2];
    GroupCursor<Cfg::BM, Cfg::BN> cur;
    constexpr bool kThroughSmem = kGroupedStoresThroughSmem<Cfg, InT, Epilogue, kGatherA>;
    uint8_t* const staging = sm.staging(consumer, GroupedTable::kBytes);
    if constexpr (!Cfg::kPingPong) {
      int iter = 0;
      for (int pos = first; pos < total; pos += stride, ++iter) {
        const GroupedTileInfo t = cursor_at(cur, pos);
        consume_tile<Cfg, InT, kTransB, kGatherA>(sm, consumer, k_blocks, acc, pipe, 0u);
        const auto bound = grouped_bind(p.epilogue, t);
        grouped_store<Cfg, kThroughSmem>(p, bound, t, acc, consumer, warp, lane, staging);
        if constexpr (Epilogue::kNotify) {
          if (NotifyHandshake::store_waits_free(iter))
            ptx::named_barrier_sync(kNotifyFreeBarrier + (iter & 1), Cfg::kStoreThreads + 32);
          ptx::named_barrier_arrive(kNotifyBarrier + (iter & 1), Cfg::kStoreThreads + 32);
        }
      }
    } else {
      // Ping-pong (kernel_ping_pong.cuh explains the ring indices and order
      // barriers): consumer c takes the CTA's tiles iter = c, c + 2, ...
      for (int pos = first + consumer * stride, iter = consumer; pos < total; pos += 2 * stride, iter += 2) {
        const GroupedTileInfo t = cursor_at(cur, pos);
        pipe = PipelineState<Cfg::kStages>::at(static_cast<int64_t>(iter) * k_blocks);
        if (iter > 0) ptx::named_barrier_sync(kOrderBarrier + consumer, 256);
        const bool next_exists = pos + stride < total;
        consume_tile<Cfg, InT, kTransB, kGatherA>(sm, consumer, k_blocks, acc, pipe, 0u, [&] {
          if (next_exists) ptx::named_barrier_arrive(kOrderBarrier + (consumer ^ 1), 256);
        });
        const auto bound = grouped_bind(p.epilogue, t);
        grouped_store<Cfg, kThroughSmem>(p, bound, t, acc, consumer, warp, lane, staging);
        if constexpr (Epilogue::kNotify) {
          if (NotifyHandshake::store_waits_free(iter))
            ptx::named_barrier_sync(kNotifyFreeBarrier + (iter & 1), Cfg::kStoreThreads + 32);
          ptx::named_barrier_arrive(kNotifyBarrier + (iter & 1), Cfg::kStoreThreads + 32);
        }
      }
    }
    if constexpr (kThroughSmem) tma_store_drain();
  }
#endif
}

}  // namespace tessera::kernels::engine
