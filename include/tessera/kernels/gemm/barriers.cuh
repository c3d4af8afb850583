// tessera/kernels/gemm/barriers.cuh — the named barriers of the GEMM kernel
// (kernel.cuh) and the handshake that keeps the notify barriers safe. Host-
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
//
// Why notify-free exists (issue 4, the ping-pong GEMM+RS timeout): a named
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
#pragma once

#include <cuda_runtime.h>  // __host__ / __device__ in host compilers too

namespace tessera::kernels::engine {

constexpr int kNotifyBarrier = 2;
constexpr int kOrderBarrier = 4;
constexpr int kNotifyFreeBarrier = 6;

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

}  // namespace tessera::kernels::engine
