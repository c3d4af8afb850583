// tessera/kernels/gemm/kernel_stream_k.cuh — the stream-K schedule of the
// GEMM kernel (plain gemm() only): whole waves of tiles data-parallel, then
// every CTA an equal share of the last one to two waves' K blocks
// (StreamKScheduler, scheduler.cuh), so no SM idles in a last partial wave
// and a problem with fewer tiles than SMs still fills the GPU. Whole tiles
// are stored into D by the CTA that ran them. A tile split between CTAs is
// reduced in the kernel by its last CTA: the others store their segment as
// an f32 partial tile into their own workspace slot and raise their flag;
// the last waits for those flags, adds the slots in CTA order to its
// accumulators and stores the tile: deterministic, one launch, no atomics.
// A CTA waits only for CTAs of lower index, which the GPU dispatches first,
// so every wait ends while each CTA can find an SM. Cooperative consumers
// (both warpgroups on every segment); no clusters, no prologue, no notify.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "tessera/kernels/gemm/kernel_common.cuh"
#include "tessera/link/device_primitives.cuh"

namespace tessera::kernels::engine {

/// Where a stream-K kernel's segments go: whole tiles into D (OutT, row
/// stride ldd); a contributing segment into its CTA's BM x BN f32 slot at
/// ws + cta * BM * BN (row stride BN; only the in-problem part is written
/// and read), then flags[cta] = 1; a reduced tile into D, its accumulators
/// plus the slots of CTAs lo .. hi - 1. `flags` (one per CTA) are zero at
/// launch and zero again when the kernel ends: each CTA raises its flag at
/// most once (one contribution per range) and the one reducer that waits
/// for it clears it, so a persistent workspace needs no memset per call.
template <class OutT>
struct StreamKEpilogue {
  static constexpr bool kNotify = false;
  static constexpr bool kSysScope = false;
  OutT* d = nullptr;
  int64_t ldd = 0;
  float* ws = nullptr;
  uint64_t* flags = nullptr;
  uint64_t timeout_ns = 10'000'000'000ull;  // 10 s
  runtime::WaitRecord* diag = nullptr;      // where a timed-out wait is recorded (may be null)

  struct Whole {
    OutT* d;
    int64_t ldd;
    __device__ __forceinline__ void store8(int row, int col, const float (&v)[8], int valid) const {
      store_first8(d + static_cast<int64_t>(row) * ldd + col, v, valid);
    }
  };
  /// A split tile's segment. A contributor (contributors < 0) stores into
  /// its slot; the reducer adds the slots of CTAs lo .. lo + contributors - 1
  /// and stores into D. One bound type for both keeps the kernel at two
  /// store loops. Load-ahead (epilogue.cuh): the reducer's slot loads for
  /// kLoadAhead column blocks are issued before their stores, so the
  /// reduction costs about one L2 round trip per batch instead of one per
  /// 8 values (a store may alias the next load, so the compiler cannot
  /// hoist it).
  struct Split {
    static constexpr int kLoadAhead = 4;  // divides BN / 32 of 128x128 and 128x256
    struct Loaded {
      float v[8];
    };
    OutT* d;
    int64_t ldd;
    float* slot;  ///< own slot, or CTA lo's (CTA c's: slot + (c - lo) * slot_size); (0, 0) is D's (row0, col0)
    int64_t slot_size;
    int contributors, row0, col0, bn;
    /// The contributors' sum at (row, col .. col + 7); zeros for a
    /// contributor. Slot columns past N hold no data; their sums are never
    /// stored.
    __device__ __forceinline__ Loaded load(int row, int col) const {
      Loaded l;
#pragma unroll
      for (int e = 0; e < 8; ++e) l.v[e] = 0.f;
      const float* at = slot + static_cast<int64_t>(row - row0) * bn + (col - col0);
#pragma unroll 2
      for (int c = 0; c < contributors; ++c, at += slot_size) {
        float w[8];
        OutConv<float>::load8(at, w);
#pragma unroll
        for (int e = 0; e < 8; ++e) l.v[e] += w[e];
      }
      return l;
    }
    __device__ __forceinline__ void store8(int row, int col, const float (&v)[8], int valid, const Loaded& l) const {
      if (contributors < 0) {
        store_first8(slot + static_cast<int64_t>(row - row0) * bn + (col - col0), v, valid);
        return;
      }
      float sum[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) sum[e] = v[e] + l.v[e];
      store_first8(d + static_cast<int64_t>(row) * ldd + col, sum, valid);
    }
  };
  __device__ __forceinline__ Whole bind(const TileInfo&) const { return Whole{d, ldd}; }
  /// CTA cta's slot bound to tile t: a contribution (contributors < 0), or
  /// the reduction of the slots of CTAs cta .. cta + contributors - 1.
  __device__ __forceinline__ Split bind_split(const TileInfo& t, int cta, int contributors) const {
    const int64_t slot_size = static_cast<int64_t>(t.bm) * t.bn;
    return Split{d, ldd, ws + cta * slot_size, slot_size, contributors, t.row0, t.col0, t.bn};
  }
  __device__ __forceinline__ Split bind_partial(const TileInfo& t, int cta) const { return bind_split(t, cta, -1); }
  __device__ __forceinline__ Split bind_reduced(const TileInfo& t, int lo, int hi) const {
    return bind_split(t, lo, hi - lo);
  }
};

template <class Cfg, class InT, bool kTransB, class Prologue, class Epilogue, class Scheduler>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    gemm_kernel_stream_k(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                         const __grid_constant__ KernelParams<Prologue, Epilogue, Scheduler> p) {
  static_assert(!Cfg::kPingPong && Cfg::kClusterM == 1, "stream-K: cooperative consumers, no clusters");
  static_assert(!Prologue::kActive && !Epilogue::kNotify, "stream-K: plain GEMM only (no hooks)");
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  const auto cta = gemm_cta_setup<Cfg, InT, Prologue>(p);
  const StreamKScheduler& s = p.scheduler;
  const int b = blockIdx.x;
  if (warpgroup_role(cta.warpgroup) == WarpGroupRole::kProducer) {
    ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (producer_warp_role(cta.warp_idx) == ProducerWarpRole::kTma && ptx::elect_one_sync()) {
      ptx::tma_prefetch_desc(&tma_a);
      ptx::tma_prefetch_desc(&tma_b);
      PipelineState<Cfg::kStages> pipe;
      const StreamKWalk walk(s, b);
      for (int i = 0; i < walk.count; ++i) {
        const StreamKSegment g = walk.at(s, i);
        const TileCoord t = s.inner.tile(g.position, p.tiles_m, p.tiles_n);
        produce_tile<Cfg, InT, kTransB>(cta.sm, &tma_a, &tma_b, t.m * Cfg::BM, t.n * Cfg::BN, g.k0, g.k1 - g.k0, pipe,
                                        0);
      }
      ptx::grid_dependents_launch();  // every CTA is resident: the next kernel's set-up may start
    }
    return;
  }
  ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
  const int consumer = consumer_of(cta.warpgroup);
  const int warp = (threadIdx.x % 128) / 32;
  const int lane = threadIdx.x % 32;
  float acc[Cfg::kMAtoms][Cfg::BN / 2];
  PipelineState<Cfg::kStages> pipe;
  const StreamKWalk walk(s, b);
  for (int i = 0; i < walk.count; ++i) {
    const StreamKSegment g = walk.at(s, i);
    const TileCoord t = s.inner.tile(g.position, p.tiles_m, p.tiles_n);
    consume_tile<Cfg, InT, kTransB>(cta.sm, consumer, g.k1 - g.k0, acc, pipe, 0);
    const TileInfo info = tile_info<Cfg>(p, t, g.tile);
    if (g.k0 == 0 && g.k1 == s.k_blocks) {
      store_tile_with<Cfg>(p, info, acc, consumer, warp, lane, p.epilogue.bind(info));
    } else if (g.k1 < s.k_blocks) {
      // A contribution: the slot, then (every store thread past the
      // barrier, whose release st.release extends) the flag.
      store_tile_with<Cfg>(p, info, acc, consumer, warp, lane, p.epilogue.bind_partial(info, b));
      ptx::named_barrier_sync(kStreamKBarrier, Cfg::kStoreThreads);
      if (threadIdx.x == 128) link::flag_notify<link::Scope::gpu>(p.epilogue.flags + b, 1);
    } else {
      // The tile's end: wait for the contributors (lower CTAs; one thread
      // acquires, the barrier orders the others' loads after it), clear
      // their flags for the next launch (no other CTA touches them in this
      // one), add.
      const int lo = g.lo;
      if (threadIdx.x == 128)
        for (int c = lo; c < b; ++c) {
          link::flag_wait<link::Scope::gpu>(p.epilogue.flags + c, uint64_t{1},
                                            link::WaitLimit{p.epilogue.timeout_ns, p.epilogue.diag},
                                            link::WaitSite{runtime::WaitKind::tile_flag, -1, g.tile, t.m, t.n, c, -1});
          p.epilogue.flags[c] = 0;
        }
      ptx::named_barrier_sync(kStreamKBarrier, Cfg::kStoreThreads);
      store_tile_with<Cfg>(p, info, acc, consumer, warp, lane, p.epilogue.bind_reduced(info, lo, b));
    }
  }
#endif
}

}  // namespace tessera::kernels::engine
