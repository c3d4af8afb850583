// tessera/kernels/gemm/kernel_stream_k.cuh — the stream-K schedule of the
// GEMM kernel (plain gemm() only): whole waves of tiles data-parallel, then
// every CTA an equal share of the last one to two waves' K blocks
// (StreamKScheduler, scheduler.cuh), so no SM idles in a last partial wave
// and a problem with fewer tiles than SMs still fills the GPU. Whole tiles
// are stored into D by the CTA that ran them. A tile split between CTAs is
// reduced in the kernel by its last CTA: the others store their segment's
// accumulators into their own f32 workspace slot in register (fragment)
// order and raise their flag; the last waits for those flags, adds the
// slots in CTA order to its accumulators and stores the tile:
// deterministic, one launch, no atomics. Fragment order makes each warp's
// slot traffic whole 512-byte runs with no shuffles (the same kernel reads
// the slot, so thread t finds its own elements at the same places); in
// D's row-major order a 128x256 partial cost 4 us to store and 7 us to
// read back and add. A CTA waits only for CTAs of lower index, which the
// GPU dispatches first, so every wait ends while each CTA can find an SM.
// Cooperative consumers (both warpgroups on every segment); no clusters,
// no prologue, no notify.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "tessera/kernels/gemm/kernel_common.cuh"
#include "tessera/link/device_primitives.cuh"

namespace tessera::kernels::engine {

/// Where a stream-K kernel's segments go: whole tiles and reduced tiles
/// into D (OutT, row stride ldd); a contributing segment's accumulators into
/// its CTA's slot of BM x BN floats at ws + cta * BM * BN (fragment order,
/// store_partial), then flags[cta] = 1. `flags` (one per CTA) are zero at
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
  __device__ __forceinline__ Whole bind(const TileInfo&) const { return Whole{d, ldd}; }
};

/// Floats of one CTA's slot: the accumulators of all its store threads.
template <class Cfg>
__host__ __device__ constexpr int stream_k_slot_floats() {
  return Cfg::kStoreThreads * Cfg::kMAtoms * (Cfg::BN / 2);
}

/// Stores store thread st's accumulators into `slot` in fragment order:
/// float4 chunk j of the thread at slot[(j * kStoreThreads + st) * 4], so
/// one warp's chunk j is 512 contiguous bytes. L2 only (st.global.cg): the
/// reducer runs on another SM.
template <class Cfg>
__device__ __forceinline__ void store_partial(float* slot, const float (&acc)[Cfg::kMAtoms][Cfg::BN / 2], int st) {
  constexpr int kChunks = Cfg::BN / 8;  // float4 chunks per atom
#pragma unroll
  for (int a = 0; a < Cfg::kMAtoms; ++a)
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const float4 v = make_float4(acc[a][4 * j], acc[a][4 * j + 1], acc[a][4 * j + 2], acc[a][4 * j + 3]);
      __stcg(reinterpret_cast<float4*>(slot) + (a * kChunks + j) * Cfg::kStoreThreads + st, v);
    }
}

/// Adds `contributors` slots (slot, slot + stream_k_slot_floats(), ...; CTA
/// order) to store thread st's accumulators, as store_partial laid them
/// out. Loads go in batches of 8 chunks, all issued before their adds
/// (no store between them, so nothing aliases).
template <class Cfg>
__device__ __forceinline__ void add_partials(const float* slot, int contributors,
                                             float (&acc)[Cfg::kMAtoms][Cfg::BN / 2], int st) {
  constexpr int kChunks = Cfg::BN / 8;
  constexpr int kBatch = 8;
  static_assert(kChunks % kBatch == 0, "whole batches of float4 chunks");
#pragma unroll 1
  for (int c = 0; c < contributors; ++c, slot += stream_k_slot_floats<Cfg>()) {
    const float4* from = reinterpret_cast<const float4*>(slot);
#pragma unroll
    for (int a = 0; a < Cfg::kMAtoms; ++a)
#pragma unroll
      for (int j0 = 0; j0 < kChunks; j0 += kBatch) {
        float4 v[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) v[j] = __ldcg(from + (a * kChunks + j0 + j) * Cfg::kStoreThreads + st);
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          float* x = &acc[a][4 * (j0 + j)];
          x[0] += v[j].x;
          x[1] += v[j].y;
          x[2] += v[j].z;
          x[3] += v[j].w;
        }
      }
  }
}

template <class Cfg, class InT, bool kTransB, class Prologue, class Epilogue, class Scheduler>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    gemm_kernel_stream_k(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                         const __grid_constant__ KernelParams<Prologue, Epilogue, Scheduler> p) {
  static_assert(!Cfg::kPingPong && Cfg::kClusterSize == 1, "stream-K: cooperative consumers, no clusters");
  static_assert(!Prologue::kActive && !Epilogue::kNotify, "stream-K: plain GEMM only (no hooks)");
  static_assert(stream_k_slot_floats<Cfg>() == Cfg::BM * Cfg::BN, "a slot holds one tile (the host sizes it so)");
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
  const int st = threadIdx.x - 128;  // store thread: both consumer warpgroups
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
      store_partial<Cfg>(p.epilogue.ws + static_cast<int64_t>(b) * stream_k_slot_floats<Cfg>(), acc, st);
      ptx::named_barrier_sync(kStreamKBarrier, Cfg::kStoreThreads);
      if (threadIdx.x == 128) link::flag_notify<link::Scope::gpu>(p.epilogue.flags + b, 1);
    } else {
      // The tile's end: wait for the contributors (lower CTAs; one thread
      // acquires, the barrier orders the others' loads after it), clear
      // their flags for the next launch (no other CTA touches them in this
      // one), add their slots, store.
      const int lo = g.lo;
      if (threadIdx.x == 128)
        for (int c = lo; c < b; ++c) {
          link::flag_wait<link::Scope::gpu>(p.epilogue.flags + c, uint64_t{1},
                                            link::WaitLimit{p.epilogue.timeout_ns, p.epilogue.diag},
                                            link::WaitSite{runtime::WaitKind::tile_flag, -1, g.tile, t.m, t.n, c, -1});
          p.epilogue.flags[c] = 0;
        }
      ptx::named_barrier_sync(kStreamKBarrier, Cfg::kStoreThreads);
      add_partials<Cfg>(p.epilogue.ws + static_cast<int64_t>(lo) * stream_k_slot_floats<Cfg>(), b - lo, acc, st);
      store_tile_with<Cfg>(p, info, acc, consumer, warp, lane, p.epilogue.bind(info));
    }
  }
#endif
}

}  // namespace tessera::kernels::engine
