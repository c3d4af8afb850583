// tessera/kernels/gemm/barriers.cuh — the named barriers of the GEMM kernel
// (kernel_common.cuh, kernel_cooperative.cuh, kernel_ping_pong.cuh), its warp
// roles, and the handshake that keeps the notify barriers safe. Host-
// compilable (constexpr only), so tests/kernels/gemm_host_test.cpp models the
// protocol with the very predicates the kernel uses.
//
// Named barriers (bar.sync / bar.arrive with an explicit thread count; id 0 is
// __syncthreads):
//   2, 3  notify: the store threads of a CTA-local tile `iter` bar.arrive on
//         kNotifyBarrier + (iter & 1); the notifier warp bar.syncs on it, then
//         fences and calls Epilogue::tile_done. kStoreThreads + 32 threads.
//   4, 5  order (ping-pong only): kOrderBarrier + c releases consumer c's main
//         loop. 256 threads.
//   6, 7  notify-free: the notifier bar.arrives on kNotifyFreeBarrier +
//         (iter & 1) right after its bar.sync of tile iter; the store threads
//         of tile iter + 2 bar.sync on it before they arrive on the notify
//         barrier. kStoreThreads + 32 threads.
//   8     gather: the grouped GEMM's row-gathering producer warpgroup.
//   9     stream-K: the store threads of a split tile, between its partial
//         stores and its flag, or between the flag waits and the reduction.
//   10, 11  TMA store: kTmaStoreBarrier + c, consumer c's 128 threads around
//         each staging buffer's rewrite and its bulk store (store_tile_tma).
//
// Why notify-free exists (without it the ping-pong GEMM+RS times out): a named
// barrier counts arriving warps and completes, and resets, as soon as the count
// reaches the expected number — it has no notion of whose arrival it is. The
// store threads never waited for the notifier, so when the notifier lagged by
// three tiles (a fence.acq_rel.sys after NVLink stores takes microseconds; a
// K = 64 tile's main loop takes well under one) the arrivals of tile iter + 2
// landed on the barrier still holding tile iter's: 128 + 128 arrivals against
// 160 expected complete one phase WITHOUT the notifier and leave 96 counted.
// From then on the notifier is released by the wrong tile's arrivals (its
// fence no longer covers the stores it announces) and its last bar.sync never
// completes: that CTA never exits and one tile is never notified, so the
// reduce kernel / the owner's prologue waits until its timeout (CUDA 719).
// With the handshake each barrier strictly alternates between one arrival set
// and the notifier's sync: the store threads of tile iter + 2 cannot arrive
// before the notifier consumed tile iter's arrival. They stall only when the
// notifier is two tiles behind (then the notifier is the bottleneck anyway).
//
// Besides the named barriers, kernels with an active Prologue have the
// prologue-waiter ring (WaiterRing below): 2 x 2 mbarriers in shared memory
// (SmemLayout::prologue_ready / prologue_free), no named barrier.
#pragma once

#include <cuda_runtime.h>  // __host__ / __device__ in host compilers too

#include <cstdint>

namespace tessera::kernels::engine {

/// The warpgroups of a GEMM CTA (kernel_common.cuh): warpgroup 0 produces, warpgroup
/// 1 + c is consumer c (consumer_of).
enum class WarpGroupRole : int { kProducer, kConsumer };

/// The warps of the producer warpgroup, by their index in it: the TMA thread
/// is one elected lane of kTma; kNotifier runs Epilogue::tile_done (only when
/// the Epilogue notifies); lane 0 of kWaiter runs the Prologue's waits (only
/// when the Prologue is active); kIdle has no work.
enum class ProducerWarpRole : int { kTma = 0, kNotifier = 1, kWaiter = 2, kIdle = 3 };

/// The role of warpgroup `warpgroup` (warp index / 4). Derive it from a
/// warp-uniform warp index (canonical_warp_idx, kernel_common.cuh) so that the
/// role branches stay uniform.
__host__ __device__ constexpr WarpGroupRole warpgroup_role(int warpgroup) {
  return warpgroup == 0 ? WarpGroupRole::kProducer : WarpGroupRole::kConsumer;
}
/// The consumer index (0, 1, ...) of consumer warpgroup `warpgroup`.
__host__ __device__ constexpr int consumer_of(int warpgroup) { return warpgroup - 1; }
/// The role of warp `warp_idx` of the producer warpgroup. The producer is
/// warpgroup 0, so its warps' CTA indices are their indices in it (0..3).
__host__ __device__ constexpr ProducerWarpRole producer_warp_role(int warp_idx) {
  return static_cast<ProducerWarpRole>(warp_idx);
}

constexpr int kNotifyBarrier = 2;
constexpr int kOrderBarrier = 4;
constexpr int kNotifyFreeBarrier = 6;
/// The grouped GEMM's row-gathering producer warpgroup (grouped_kernel.cuh).
constexpr int kGatherBarrier = 8;
/// The stream-K kernel's store threads (kernel_stream_k.cuh).
constexpr int kStreamKBarrier = 9;
/// The TMA-store epilogue: kTmaStoreBarrier + c orders consumer c's writes
/// of its staging buffers against its issuing thread (store_tile_tma).
constexpr int kTmaStoreBarrier = 10;

/// The handshake on the notify barriers, per CTA-local tile index `iter`
/// (0 .. tiles - 1, the CTA's tiles in schedule order; tiles >= 1).
struct NotifyHandshake {
  /// The store threads of tile iter wait on kNotifyFreeBarrier + (iter & 1)
  /// before arriving on kNotifyBarrier + (iter & 1): the barrier still served
  /// tile iter - 2.
  __host__ __device__ static constexpr bool store_waits_free(int iter) { return iter >= 2; }
  /// After its bar.sync of tile iter, the notifier arrives on
  /// kNotifyFreeBarrier + (iter & 1) exactly when tile iter + 2 exists (so
  /// every arrive is matched by one store_waits_free sync).
  __host__ __device__ static constexpr bool notifier_frees(int iter, int tiles) { return iter + 2 < tiles; }
};

/// The prologue-waiter ring (kernel_common.cuh, only when Prologue::kActive;
/// docs/design/gemm-engine.md). The waiter (lane 0 of warp kWaiterWarp of the producer
/// warpgroup) runs the Prologue's wait for the CTA's tiles in schedule order,
/// AHEAD of the TMA thread, and hands each tile over through kSlots slots of
/// two mbarriers (count 1 each): ready[s] (the waiter arrives) and free[s] (the
/// TMA thread arrives; back-pressure, so the waiter never laps the ring).
/// CTA-local tile j uses slot j % kSlots for the (j / kSlots)-th time, n:
///   waiter, tile j:     wait free[s] (free_parity(j)) -> Prologue wait ->
///                       fence.proxy.async (when needed) -> arrive ready[s]
///   TMA thread, tile j: wait ready[s] (ready_parity(j)) -> arrive free[s] ->
///                       TMA loads of tile j
/// Why the parity waits are exact (a parity wait passes once the phase of
/// that parity completed, and cannot tell phase n from n + 2):
///  * ready[s] when the TMA thread waits for tile j: completed n phases
///    (tiles s, s + 2, ..., j - 2) or n + 1 (tile j too); it cannot have
///    completed n + 2: the waiter signals tile j + 2 only after free[s]'s
///    phase n, which the TMA thread completes only after this wait. Parity n
///    passes exactly at n + 1 completions.
///  * free[s] when the waiter waits for tile j (n >= 1): completed n - 1
///    (tile j - 2 not taken yet) or n; not n + 1 (tile j was not signalled).
///    Parity (n - 1) & 1 passes exactly at n. For n = 0 (tiles 0 and 1) it
///    waits parity 1 on a fresh barrier, which passes at once (the phase
///    before phase 0 counts as complete; same convention as the producer's
///    first empty waits).
/// So the waiter is at most kSlots tiles ahead of the TMA thread. Arrival
/// counts depend on nobody else: the waiter may exit after its last tile
/// (the TMA thread's last kSlots free arrivals are simply never waited on).
/// Host model: tests/kernels/gemm_host_test.cpp (GemmWaiterRingModel). The
/// attention kernel (attention/kernel.cuh, run_kv_waiter) runs the same ring
/// for its KV hook, with the CTA's KV blocks in visiting order for the tiles.
struct WaiterRing {
  static constexpr int kSlots = 2;
  static constexpr int kWaiterWarp = static_cast<int>(ProducerWarpRole::kWaiter);
  __host__ __device__ static constexpr int slot(int j) { return j % kSlots; }
  __host__ __device__ static constexpr uint32_t ready_parity(int j) { return static_cast<uint32_t>((j / kSlots) & 1); }
  __host__ __device__ static constexpr uint32_t free_parity(int j) {
    return static_cast<uint32_t>(((j / kSlots) & 1) ^ 1);
  }
};

}  // namespace tessera::kernels::engine
