// tessera/link/device_primitives.cuh — TileLink's tile-centric primitives
// (Table 3), device side.
//
//   producer_tile_notify(sv, map, tile, mode)   tile's data is ready: count it
//                                               in its channel on f_R(tile)
//                                               (p2p) or on every rank (broadcast)
//   consumer_tile_wait(sv, map, tile_c, epoch)  wait until every channel the
//                                               consumer tile reads is complete
//   peer_tile_notify(sv, slot, dst_rank)        set my flag `slot` on dst_rank
//   peer_tile_wait(sv, slot, src_rank, epoch)   wait for src_rank's flag `slot`
//   tile_push_data / tile_pull_data             16-byte vectorized tile copies
//                                               to / from a peer
//
// Memory-order contract (see memory_order.cuh):
//  * Notify is a release. Call it from ONE thread after every thread that
//    wrote the tile's data has passed a barrier with it (e.g. __syncthreads()
//    or a named barrier over the writers). Scope: .gpu when the destination
//    is this GPU, .sys when it is a peer.
//  * Wait is an acquire at .sys scope (the notifier may be a peer or the
//    host); have the ONE waiting thread call it and the rest of the block
//    wait on a barrier behind it before reading the data.
//  * Counters only grow. Epoch e (1, 2, ...) waits for e * (notifications
//    per epoch), so back-to-back iterations need no reset.
//  * Every wait gives up after sv.timeout_ns: it records rank, tile,
//    channel, expected and seen value in the WaitRecord, prints them and
//    traps (runtime::synchronize turns that into a tessera::Error).
#pragma once

#include <cstdint>

#include "tessera/link/memory_order.cuh"
#include "tessera/link/tile_map.hpp"
#include "tessera/runtime/signals.hpp"

namespace tessera::link {

enum class NotifyMode { p2p, broadcast };

namespace detail {

/// First-waiter-wins claim of the process's WaitRecord. It lives in device
/// memory: a system-scope atomic on host-mapped memory needs host-native
/// atomics, which PCIe hosts do not give (compute-sanitizer rejects it).
/// One word per translation unit: after the first trap the context is lost,
/// so two units filling the record at once is not worth a global word.
static __device__ unsigned int wait_record_claim = 0;

}  // namespace detail

/// Fills the host-mapped WaitRecord `r` (may be null) unless another waiter
/// of this unit already did, and publishes it: the fields, a system fence,
/// then `claimed` = 1, which the host reads with acquire semantics
/// (runtime::WaitDiagnostics). Call-free, so it may sit in a wgmma kernel.
__device__ __forceinline__ void record_wait_timeout(runtime::WaitRecord* r, runtime::WaitKind kind, int rank, int tile,
                                                    int channel, int peer, std::uint64_t expected, std::uint64_t seen,
                                                    std::uint64_t timeout_ns) {
  if (r == nullptr || atomicCAS(&detail::wait_record_claim, 0u, 1u) != 0u) return;
  r->kind = static_cast<int>(kind);
  r->rank = rank;
  r->tile = tile;
  r->channel = channel;
  r->peer = peer;
  r->expected = expected;
  r->seen = seen;
  r->timeout_ns = timeout_ns;
  __threadfence_system();
  *reinterpret_cast<volatile unsigned int*>(&r->claimed) = 1u;
  __threadfence_system();
}

namespace detail {

/// Records a timed-out wait and traps. Call-free on purpose (no printf):
/// any call inlined into a wgmma kernel makes ptxas serialize its wgmmas,
/// so the diagnostic goes to the host-mapped WaitRecord only and the host
/// prints it (runtime::synchronize / WaitDiagnostics).
__device__ __forceinline__ void wait_timed_out(const runtime::SignalView& sv, runtime::WaitKind kind, int tile,
                                               int channel, int peer, std::uint64_t expected, std::uint64_t seen) {
  record_wait_timeout(sv.diag, kind, sv.rank, tile, channel, peer, expected, seen, sv.timeout_ns);
  __trap();
}

/// Spins until *flag >= target (acquire, .sys), with exponential back-off
/// and a timeout. Returns the value seen.
__device__ __forceinline__ std::uint64_t wait_geq_sys(const runtime::SignalView& sv, const std::uint64_t* flag,
                                                      std::uint64_t target, runtime::WaitKind kind, int tile,
                                                      int channel, int peer) {
  std::uint64_t v = mo::ld_acquire_sys(flag);
  if (v >= target) return v;
  const std::uint64_t start = mo::globaltimer_ns();
  unsigned backoff = 32;
  for (unsigned it = 1;; ++it) {
    __nanosleep(backoff);
    if (backoff < 256) backoff <<= 1;
    v = mo::ld_acquire_sys(flag);
    if (v >= target) return v;
    if ((it & 63u) == 0 && mo::globaltimer_ns() - start > sv.timeout_ns)
      wait_timed_out(sv, kind, tile, channel, peer, target, v);
  }
}

/// A tile or slot id outside its map or signal array: recorded as a wait
/// whose expected value is the limit and seen value the id, then trap.
__device__ __forceinline__ void check_id(const runtime::SignalView& sv, int id, int limit, int tile) {
  if (id < 0 || id >= limit)
    wait_timed_out(sv, runtime::WaitKind::bad_id, tile, id, -1, static_cast<std::uint64_t>(limit),
                   static_cast<std::uint64_t>(static_cast<std::int64_t>(id)));
}

/// Adds one to counter `slot` on rank dst with release semantics: .gpu for
/// this GPU, .sys for a peer.
__device__ __forceinline__ void notify_counter(const runtime::SignalView& sv, int dst, int slot) {
  if (dst == sv.rank) {
    mo::red_add_release_gpu(sv.counter(slot), 1);
  } else {
    mo::red_add_release_sys(sv.peer_counter(dst, slot), 1);
  }
}

}  // namespace detail

/// Announces that producer tile `tile` is complete. Counts it in channel
/// f_C(tile) on rank f_R(tile) (p2p) or on every rank (broadcast).
template <class Map>
__device__ __forceinline__ void producer_tile_notify(const runtime::SignalView& sv, const Map& map, int tile,
                                                     NotifyMode mode) {
  detail::check_id(sv, tile, map.num_tiles(), tile);
  const int ch = map.channel(tile);
  detail::check_id(sv, ch, sv.slots, tile);
  if (mode == NotifyMode::p2p) {
    detail::notify_counter(sv, map.rank(tile), ch);
  } else {
    for (int r = 0; r < sv.world; ++r) detail::notify_counter(sv, r, ch);
  }
}

/// Same, but to an explicit destination rank (e.g. the consumer that owns
/// the rows, when f_R names the source).
template <class Map>
__device__ __forceinline__ void producer_tile_notify_to(const runtime::SignalView& sv, const Map& map, int tile,
                                                        int dst_rank) {
  detail::check_id(sv, tile, map.num_tiles(), tile);
  const int ch = map.channel(tile);
  detail::check_id(sv, ch, sv.slots, tile);
  detail::notify_counter(sv, dst_rank, ch);
}

/// Waits until every channel consumer tile `tile_c` reads has received
/// epoch * tiles_in_channel(ch) notifications. `notifiers` multiplies the
/// per-channel count when several ranks notify the same channel (broadcast
/// producers on every rank, reduce-scatter partials).
template <class Map>
__device__ __forceinline__ void consumer_tile_wait(const runtime::SignalView& sv, const Map& map, int tile_c,
                                                   std::uint64_t epoch, int notifiers = 1) {
  detail::check_id(sv, tile_c, map.num_consumer_tiles(), tile_c);
  const ChannelRange cr = map.consumer_channels(tile_c);
  for (int ch = cr.lo; ch < cr.hi; ++ch) {
    detail::check_id(sv, ch, sv.slots, tile_c);
    const std::uint64_t target = epoch * static_cast<std::uint64_t>(map.tiles_in_channel(ch)) * notifiers;
    detail::wait_geq_sys(sv, sv.counter(ch), target, runtime::WaitKind::consumer_tile, tile_c, ch, -1);
  }
}

/// Waits until this rank's counter `slot` reaches `target` (epoch-scaled by
/// the caller). For group counters and custom schemes.
__device__ __forceinline__ void counter_wait(const runtime::SignalView& sv, int slot, std::uint64_t target,
                                             int tile = -1) {
  detail::check_id(sv, slot, sv.slots, tile);
  detail::wait_geq_sys(sv, sv.counter(slot), target, runtime::WaitKind::counter, tile, slot, -1);
}

/// Waits until the counter at `counter` reaches `target`: the same wait as
/// counter_wait for a counter array the caller owns (an operator's per-tile
/// reduce counters) instead of a Signals slot. `tile` names the tile in the
/// timeout diagnostic. Returns the value seen.
__device__ __forceinline__ std::uint64_t counter_wait_at(const runtime::SignalView& sv, const std::uint64_t* counter,
                                                         std::uint64_t target, int tile) {
  return detail::wait_geq_sys(sv, counter, target, runtime::WaitKind::counter, tile, tile, -1);
}

/// Sets my flag `slot` on rank dst_rank to `value` (release; .sys for a
/// peer, .gpu for myself). Flags are per source rank, so a plain store is
/// race-free; use the epoch as the value.
__device__ __forceinline__ void peer_tile_notify(const runtime::SignalView& sv, int slot, int dst_rank,
                                                 std::uint64_t value) {
  detail::check_id(sv, slot, sv.slots, slot);
  detail::check_id(sv, dst_rank, sv.world, slot);
  if (dst_rank == sv.rank) {
    mo::st_release_gpu(sv.flag_at(dst_rank, slot), value);
  } else {
    mo::st_release_sys(sv.flag_at(dst_rank, slot), value);
  }
}

/// Waits until rank src_rank's flag `slot` (on this rank) is >= value.
__device__ __forceinline__ void peer_tile_wait(const runtime::SignalView& sv, int slot, int src_rank,
                                               std::uint64_t value) {
  detail::check_id(sv, slot, sv.slots, slot);
  detail::check_id(sv, src_rank, sv.world, slot);
  detail::wait_geq_sys(sv, sv.flag_from(src_rank, slot), value, runtime::WaitKind::peer_tile, slot, slot, src_rank);
}

// ---- data movement ---------------------------------------------------------

namespace detail {

/// Walks the elements of a rows x per_row grid with a fixed stride without
/// dividing per step (a division per 16-byte access would cost more than the
/// access at NVLink rates).
struct GridCursor {
  std::int64_t row, col;
  std::int64_t per_row, drow, dcol;
  __device__ __forceinline__ GridCursor(std::int64_t start, std::int64_t stride, std::int64_t per_row_)
      : row(start / per_row_),
        col(start % per_row_),
        per_row(per_row_),
        drow(stride / per_row_),
        dcol(stride % per_row_) {}
  __device__ __forceinline__ void advance() {
    row += drow;
    col += dcol;
    if (col >= per_row) {
      col -= per_row;
      ++row;
    }
  }
};

template <class V>
__device__ __forceinline__ void copy_grid(char* dst, std::int64_t dst_pitch, const char* src, std::int64_t src_pitch,
                                          std::int64_t rows, std::int64_t per_row, int tid, int nthreads) {
  constexpr int U = 4;  // independent loads in flight per thread before the stores
  if (rows <= 0 || per_row <= 0) return;
  GridCursor c(tid, nthreads, per_row);
  while (c.row < rows) {
    V v[U];
    std::int64_t dr[U], dc[U];
    int n = 0;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (c.row < rows) {
        dr[u] = c.row;
        dc[u] = c.col;
        v[u] = *reinterpret_cast<const V*>(src + c.row * src_pitch + c.col * sizeof(V));
        n = u + 1;
        c.advance();
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u < n) *reinterpret_cast<V*>(dst + dr[u] * dst_pitch + dc[u] * sizeof(V)) = v[u];
    }
  }
}

}  // namespace detail

/// Copies a rows x row_bytes tile between (possibly peer) addresses, by
/// `nthreads` cooperating threads (thread index `tid`). 16-byte accesses when
/// both pointers, both pitches and row_bytes are 16-byte aligned; 4-byte
/// otherwise when possible; bytes as the last resort. Four loads are in
/// flight per thread before the stores, which matters when the source is
/// remote (pull).
__device__ __forceinline__ void copy_tile_bytes(void* dst, std::int64_t dst_pitch, const void* src,
                                                std::int64_t src_pitch, std::int64_t rows, std::int64_t row_bytes,
                                                int tid, int nthreads) {
  const auto a = reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src) |
                 static_cast<std::uintptr_t>(dst_pitch) | static_cast<std::uintptr_t>(src_pitch) |
                 static_cast<std::uintptr_t>(row_bytes);
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if ((a & 15) == 0) {
    detail::copy_grid<int4>(d, dst_pitch, s, src_pitch, rows, row_bytes / 16, tid, nthreads);
  } else if ((a & 3) == 0) {
    detail::copy_grid<int>(d, dst_pitch, s, src_pitch, rows, row_bytes / 4, tid, nthreads);
  } else {
    detail::copy_grid<char>(d, dst_pitch, s, src_pitch, rows, row_bytes, tid, nthreads);
  }
}

/// Pushes `rows` x `cols` elements starting at row `src_row` of a local
/// source to row `dst_row` of a peer destination (row-major, leading
/// dimensions in elements). The caller notifies after a barrier over the
/// copying threads.
template <class T>
__device__ __forceinline__ void tile_push_data(T* peer_dst, std::int64_t ld_dst, std::int64_t dst_row,
                                               const T* local_src, std::int64_t ld_src, std::int64_t src_row,
                                               std::int64_t rows, std::int64_t cols, int tid, int nthreads) {
  copy_tile_bytes(peer_dst + dst_row * ld_dst, ld_dst * sizeof(T), local_src + src_row * ld_src, ld_src * sizeof(T),
                  rows, cols * sizeof(T), tid, nthreads);
}

/// Pulls `rows` x `cols` elements from row `src_row` of a peer source into
/// row `dst_row` of a local destination. Call after the matching wait.
template <class T>
__device__ __forceinline__ void tile_pull_data(T* local_dst, std::int64_t ld_dst, std::int64_t dst_row,
                                               const T* peer_src, std::int64_t ld_src, std::int64_t src_row,
                                               std::int64_t rows, std::int64_t cols, int tid, int nthreads) {
  copy_tile_bytes(local_dst + dst_row * ld_dst, ld_dst * sizeof(T), peer_src + src_row * ld_src, ld_src * sizeof(T),
                  rows, cols * sizeof(T), tid, nthreads);
}

}  // namespace tessera::link
