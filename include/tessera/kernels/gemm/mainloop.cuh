// tessera/kernels/gemm/mainloop.cuh — the TMA -> shared memory -> wgmma
// pipeline of one CTA: tile configuration, shared-memory ring layout, wgmma
// matrix descriptors, and the producer / consumer loops over one tile's K.
//
// Ring protocol (kStages slots, each with a `full` and an `empty` mbarrier;
// each side walks the slots with a PipelineState, pipeline.cuh):
//   producer: wait empty[s] (parity ph^1) -> arrive.expect_tx(full[s], bytes)
//             -> TMA A and B into slot s (complete_tx on full[s])
//   consumer: wait full[s] (parity ph) -> wgmma on slot s -> after the wgmma
//             reading slot s has retired (wgmma.wait_group), one arrive per
//             consumer warp on empty[s].
// The phase bit flips each time the slot index wraps. mbarrier arrive is a
// release and try_wait an acquire at CTA scope, so the TMA's writes are seen by
// the wgmma and the wgmma's reads finish before the slot is overwritten.
//
// Shared-memory layouts (128-byte swizzle, TMA and wgmma agree on it):
//   A slot: BM rows x 64 K-elements, row r at byte r*128 (K-major).
//   B slot, BLayout::NK: BN rows x 64 K (K-major, like A).
//   B slot, BLayout::KN: BN/64 chunks, each 64 K-rows x 64 N (N-major).
#pragma once

#include <cstdint>

#include "tessera/kernels/gemm/barriers.cuh"
#include "tessera/kernels/gemm/pipeline.cuh"
#include "tessera/kernels/gemm/ptx.cuh"
#include "tessera/kernels/gemm/wgmma.cuh"

namespace tessera::kernels::engine {

/// Compile-time tile configuration.
///  * Cooperative (kPingPong = false, the default): kConsumers consumer
///    warpgroups split the BM rows of one tile; each owns BM/kConsumers rows =
///    kMAtoms wgmma atoms of 64 rows, and both store the tile together.
///  * Ping-pong (kPingPong = true, GemmOptions::ping_pong): the two
///    consumer warpgroups take alternate tiles of the CTA's schedule; each owns
///    a whole BM x BN tile (kMAtoms = BM/64 atoms). While one stores its tile
///    the other runs its main loop, so the epilogue overlaps wgmma. Main loops
///    are ordered by named barriers (kernel_ping_pong.cuh); no clusters.
template <int BM_, int BN_, int kStages_, int kClusterM_ = 1, int kConsumers_ = 2, bool kPingPong_ = false,
          int kClusterN_ = 1>
struct TileConfig {
  static constexpr int BM = BM_, BN = BN_, BK = 64;
  /// CTAs per cluster along M and along N (1 or 2 each). CTA (rm, rn) of a
  /// cluster has rank rm + kClusterM * rn (cluster_m_rank / cluster_n_rank)
  /// and computes tile (kClusterM * i + rm, kClusterN * j + rn). The CTAs
  /// that share a tile column (same rn) share its B tile: each loads
  /// BN / kClusterM columns of it and multicasts them to the others; those
  /// that share a tile row (same rm) share A likewise, BM / kClusterN rows
  /// each. A 2x2 cluster thus loads half the L2->SM bytes per tile, which
  /// is what rows aligned to only 16 or 32 bytes are short of
  /// (docs/design/gemm.md, "Clusters for misaligned rows").
  static constexpr int kClusterM = kClusterM_;
  static constexpr int kClusterN = kClusterN_;
  static constexpr int kClusterSize = kClusterM * kClusterN;
  static_assert(kClusterM == 1 || kClusterM == 2, "cluster along M: 1 or 2 CTAs");
  static_assert(kClusterN == 1 || kClusterN == 2, "cluster along N: 1 or 2 CTAs");
  static_assert(kClusterM == 1 || BN % (64 * kClusterM) == 0, "B halves must be whole 64-column chunks");
  static_assert(kClusterN == 1 || (BM / kClusterN) % 64 == 0, "A halves must be whole 64-row wgmma atoms");
  static constexpr int kStages = kStages_;
  static constexpr int kConsumers = kConsumers_;
  static constexpr bool kPingPong = kPingPong_;
  static_assert(!kPingPong || (kClusterSize == 1 && kConsumers == 2), "ping-pong: 2 consumers, no clusters");
  static constexpr int kRowsPerConsumer = kPingPong ? BM : BM / kConsumers;
  /// Consumer warps that read (and release) one ring slot, over the cluster:
  /// this CTA's and those of every CTA this CTA's loads are multicast to
  /// (same tile row or same tile column).
  static constexpr int kEmptyArrivals = (kPingPong ? 1 : kConsumers) * 4 * (kClusterM + kClusterN - 1);
  /// Consumer threads that store one tile (and arrive on the notify barrier).
  static constexpr int kStoreThreads = (kPingPong ? 1 : kConsumers) * 128;
  static constexpr int kMAtoms = kRowsPerConsumer / 64;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static_assert(kRowsPerConsumer % 64 == 0, "each consumer owns whole 64-row wgmma atoms");
  // The store loop takes 32 columns per lane quad; N-major B loads 64-column
  // chunks (produce_tile), so BN 32 and 96 run K-major B only.
  static_assert(BN % 32 == 0 && BN <= 256, "BN must be a multiple of 32, at most 256");
  static_assert(BM <= 256, "TMA boxes are at most 256 rows");
  // Register budget after setmaxnreg: producer 40, consumers the rest.
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 232 : 240;

  /// The CTA's position in its cluster from its rank (%cluster_ctarank).
  __host__ __device__ static constexpr uint32_t cluster_m_rank(uint32_t rank) { return rank % kClusterM; }
  __host__ __device__ static constexpr uint32_t cluster_n_rank(uint32_t rank) { return rank / kClusterM; }
};

/// One box of the TMA-store epilogue's staging (kernel_common.cuh,
/// store_tile_tma): one wgmma atom's 64 rows x 32 columns of a 16-bit D,
/// the box D's tensor map is encoded with (detail::make_tma_store_map).
constexpr int kTmaStoreBoxRows = 64, kTmaStoreBoxCols = 32;
constexpr int kTmaStoreBoxBytes = kTmaStoreBoxRows * kTmaStoreBoxCols * 2;

template <class Cfg, class InT>
struct SmemLayout {
  static constexpr int kABytes = Cfg::BM * Cfg::BK * 2;
  static constexpr int kBBytes = Cfg::BN * Cfg::BK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "slots must stay 1024-byte aligned (swizzle atom)");
  static constexpr int kBarrierOffset = Cfg::kStages * kStageBytes;
  /// Barriers: full[kStages], empty[kStages], then the prologue-waiter ring
  /// ready[kSlots], free[kSlots] (barriers.cuh, WaiterRing). The ring is
  /// reserved in every kernel (32 bytes; initialised and used only when the
  /// Prologue is active) so full / empty keep their offsets and the
  /// hook-free kernels their code.
  static constexpr int kBarrierCount = 2 * Cfg::kStages + 2 * WaiterRing::kSlots;
  static constexpr int kBytes = kBarrierOffset + kBarrierCount * 8;
  /// Dynamic shared memory requested at launch (+1 KiB to align the base).
  static constexpr int kLaunchBytes = kBytes + 1024;
  /// The TMA-store epilogue's staging buffers (kernel_common.cuh,
  /// store_tile_tma), when the kernel has them: after the barriers and
  /// `extra` bytes a kernel keeps there (the grouped kernel's table), 1 KiB
  /// aligned (the 64-byte swizzle's pattern repeats every 512 bytes), one
  /// kStagingBytesPerConsumer region per consumer warpgroup.
  static constexpr int kStagingBytesPerConsumer = 2 * kTmaStoreBoxBytes;
  __host__ __device__ static constexpr int staging_offset(int extra = 0) {
    return (kBytes + extra + 1023) / 1024 * 1024;
  }
  /// Dynamic shared memory requested at launch with the staging buffers.
  __host__ __device__ static constexpr int launch_bytes_with_staging(int extra = 0) {
    return staging_offset(extra) + Cfg::kConsumers * kStagingBytesPerConsumer + 1024;
  }

  uint8_t* base;
  __device__ uint8_t* a(int s) const { return base + s * kStageBytes; }
  __device__ uint8_t* b(int s) const { return base + s * kStageBytes + kABytes; }
  __device__ uint64_t* full(int s) const { return reinterpret_cast<uint64_t*>(base + kBarrierOffset) + s; }
  __device__ uint64_t* empty(int s) const {
    return reinterpret_cast<uint64_t*>(base + kBarrierOffset) + Cfg::kStages + s;
  }
  __device__ uint64_t* prologue_ready(int s) const {
    return reinterpret_cast<uint64_t*>(base + kBarrierOffset) + 2 * Cfg::kStages + s;
  }
  __device__ uint64_t* prologue_free(int s) const {
    return reinterpret_cast<uint64_t*>(base + kBarrierOffset) + 2 * Cfg::kStages + WaiterRing::kSlots + s;
  }
  __device__ uint8_t* staging(int consumer, int extra = 0) const {
    return base + staging_offset(extra) + consumer * kStagingBytesPerConsumer;
  }
};

/// wgmma shared-memory matrix descriptor for a 128-byte-swizzled operand.
/// lbo / sbo in bytes (see the PTX ISA, "Matrix Descriptor Format").
__device__ __forceinline__ uint64_t make_desc(const void* smem, uint32_t lbo, uint32_t sbo) {
  const uint32_t addr = ptx::smem_addr(smem);
  uint64_t d = 0;
  d |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16;
  d |= static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32;
  d |= 1ull << 62;  // 128-byte swizzle
  return d;
}

/// Producer side of one tile: for each 64-wide K block, wait for a free slot
/// and issue the TMA loads of A (rows row0..row0+BM) and B (cols col0..col0+BN);
/// with a cluster, this CTA's share of each operand its tile shares
/// (TileConfig), multicast. With clusters a slot is free only once the
/// consumers of every CTA this CTA writes into released it (and those CTAs
/// write into this one), so empty[s] counts the consumer warps of all of
/// them.
/// The K range is blocks [kb_begin, kb_begin + k_blocks) (split-K: one
/// split's share; blocks past K are zero-filled by TMA).
template <class Cfg, class InT, bool kTransB>
__device__ __forceinline__ void produce_tile(const SmemLayout<Cfg, InT>& sm, const CUtensorMap* tma_a,
                                             const CUtensorMap* tma_b, int row0, int col0, int kb_begin, int k_blocks,
                                             PipelineState<Cfg::kStages>& pipe, uint32_t cta_rank) {
  using L = SmemLayout<Cfg, InT>;
  for (int kb = kb_begin; kb < kb_begin + k_blocks; ++kb) {
    const int stage = pipe.stage;
    ptx::mbar_wait(sm.empty(stage), pipe.phase ^ 1);
    ptx::mbar_arrive_expect_tx(sm.full(stage), L::kStageBytes);
    const int k0 = kb * Cfg::BK;
    if constexpr (Cfg::kClusterN == 1) {
      ptx::tma_load_2d(sm.a(stage), tma_a, sm.full(stage), k0, row0);
    } else {
      // This CTA's half of A, multicast to the CTAs of its tile row.
      constexpr int kHalfA = Cfg::BM / 2;
      const uint32_t rm = Cfg::cluster_m_rank(cta_rank), rn = Cfg::cluster_n_rank(cta_rank);
      const uint16_t row_mask = static_cast<uint16_t>((1u << rm) | (1u << (rm + Cfg::kClusterM)));
      ptx::tma_load_2d_multicast(sm.a(stage) + rn * kHalfA * 128, tma_a, sm.full(stage), k0,
                                 row0 + static_cast<int>(rn) * kHalfA, row_mask);
    }
    if constexpr (Cfg::kClusterM == 1) {
      if constexpr (!kTransB) {
        ptx::tma_load_2d(sm.b(stage), tma_b, sm.full(stage), k0, col0);
      } else {
        static_assert(Cfg::BN % 64 == 0, "N-major B is loaded in 64-column chunks");
#pragma unroll
        for (int c = 0; c < Cfg::BN / 64; ++c)
          ptx::tma_load_2d(sm.b(stage) + c * 64 * 64 * 2, tma_b, sm.full(stage), col0 + c * 64, k0);
      }
    } else {
      // This CTA's half of B, multicast to the CTAs of its tile column
      // (without a cluster along N: both CTAs of the cluster).
      constexpr int kHalf = Cfg::BN / 2;
      const int r = static_cast<int>(Cfg::kClusterN == 1 ? cta_rank : Cfg::cluster_m_rank(cta_rank));
      const uint16_t col_mask =
          Cfg::kClusterN == 1 ? uint16_t{0x3} : static_cast<uint16_t>(0x3u << (2 * Cfg::cluster_n_rank(cta_rank)));
      if constexpr (!kTransB) {
        ptx::tma_load_2d_multicast(sm.b(stage) + r * kHalf * 128, tma_b, sm.full(stage), k0, col0 + r * kHalf,
                                   col_mask);
      } else {
#pragma unroll
        for (int c = 0; c < kHalf / 64; ++c) {
          const int chunk = r * (kHalf / 64) + c;
          ptx::tma_load_2d_multicast(sm.b(stage) + chunk * 64 * 64 * 2, tma_b, sm.full(stage), col0 + chunk * 64, k0,
                                     col_mask);
        }
      }
    }
    pipe.advance();
  }
}

/// All of K (blocks [0, k_blocks)).
template <class Cfg, class InT, bool kTransB>
__device__ __forceinline__ void produce_tile(const SmemLayout<Cfg, InT>& sm, const CUtensorMap* tma_a,
                                             const CUtensorMap* tma_b, int row0, int col0, int k_blocks,
                                             PipelineState<Cfg::kStages>& pipe, uint32_t cta_rank) {
  produce_tile<Cfg, InT, kTransB>(sm, tma_a, tma_b, row0, col0, 0, k_blocks, pipe, cta_rank);
}

/// Frees slot s for the producers: this CTA's, and with a cluster those of
/// the CTAs that multicast into our slot (the other CTA of our tile column,
/// rank ^ 1, and of our tile row, rank ^ kClusterM).
template <class Cfg>
__device__ __forceinline__ void release_slot(uint64_t* empty, uint32_t cta_rank) {
  ptx::mbar_arrive(empty);
  if constexpr (Cfg::kClusterM == 2) ptx::mbar_arrive_cluster(empty, cta_rank ^ 1u);
  if constexpr (Cfg::kClusterN == 2) ptx::mbar_arrive_cluster(empty, cta_rank ^ static_cast<uint32_t>(Cfg::kClusterM));
}

/// consume_tile's default hook: nothing.
struct NoHook {
  __device__ __forceinline__ void operator()() const {}
};

/// Consumer side of one tile: accumulates the warpgroup's kMAtoms x (64 x BN)
/// slice over all K blocks into acc, releasing each slot once the wgmma that
/// read it has retired (one wgmma group kept in flight). `after_last_issue`
/// runs once every full-wait of the tile has passed and every wgmma has been
/// issued, before the last group retires (the ping-pong schedule hands the
/// tensor cores to the other consumer there). kGenericA: the producer wrote
/// A with cp.async (generic proxy), so each stage is fenced to the async
/// proxy before wgmma reads it.
template <class Cfg, class InT, bool kTransB, bool kGenericA = false, class Hook = NoHook>
__device__ __forceinline__ void consume_tile(const SmemLayout<Cfg, InT>& sm, int consumer, int k_blocks,
                                             float (&acc)[Cfg::kMAtoms][Cfg::BN / 2], PipelineState<Cfg::kStages>& pipe,
                                             uint32_t cta_rank, const Hook& after_last_issue = {}) {
  using Mma = Wgmma<InT, Cfg::BN, kTransB ? 1 : 0>;
  const bool warp_leader = (threadIdx.x % 32) == 0;
  int prev = -1;
#pragma unroll
  for (int a = 0; a < Cfg::kMAtoms; ++a) ptx::fence_regs(acc[a]);
  for (int kb = 0; kb < k_blocks; ++kb) {
    const int stage = pipe.stage;
    ptx::mbar_wait(sm.full(stage), pipe.phase);
    if constexpr (kGenericA) ptx::fence_proxy_async_shared();
    ptx::wgmma_fence();
    // Ping-pong: the consumer owns the whole A slot (all BM rows).
    const uint8_t* a_base = sm.a(stage) + (Cfg::kPingPong ? 0 : consumer * Cfg::kRowsPerConsumer * 128);
    const uint8_t* b_base = sm.b(stage);
#pragma unroll
    for (int k16 = 0; k16 < Cfg::BK / 16; ++k16) {
      // K-major: a k16 step is 32 bytes inside the 128-byte swizzled row.
      // N-major B: a k16 step is 16 K-rows of 128 bytes; LBO = 64x64 chunk.
      const uint64_t db =
          kTransB ? make_desc(b_base + k16 * 16 * 128, 64 * 64 * 2, 1024) : make_desc(b_base + k16 * 32, 16, 1024);
#pragma unroll
      for (int a = 0; a < Cfg::kMAtoms; ++a) {
        const uint64_t da = make_desc(a_base + a * 64 * 128 + k16 * 32, 16, 1024);
        Mma::run(acc[a], da, db, (kb | k16) != 0);
      }
    }
    ptx::wgmma_commit();
    if (prev >= 0) {
      ptx::wgmma_wait<1>();
      if (warp_leader) release_slot<Cfg>(sm.empty(prev), cta_rank);
    }
    prev = stage;
    pipe.advance();
  }
  after_last_issue();
  ptx::wgmma_wait<0>();
  if (prev >= 0 && warp_leader) release_slot<Cfg>(sm.empty(prev), cta_rank);
#pragma unroll
  for (int a = 0; a < Cfg::kMAtoms; ++a) ptx::fence_regs(acc[a]);
}

}  // namespace tessera::kernels::engine
