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
//  * Every wait is link::wait_until (wait.cuh): it gives up after
//    sv.timeout_ns, records rank, tile, channel, expected and seen value in
//    the WaitRecord and traps (runtime::synchronize turns that into a
//    tessera::Error naming the wait).
//  * counter_notify / counter_notify_fenced / flag_notify / flag_wait are
//    the same operations by address, for code that holds per-rank arrays
//    rather than a SignalView (the GEMM engine's policies).
#pragma once

#include <cstdint>

#include "tessera/link/memory_order.cuh"
#include "tessera/link/tile_map.hpp"
#include "tessera/link/wait.cuh"
#include "tessera/runtime/signals.hpp"

namespace tessera::link {

enum class NotifyMode { p2p, broadcast };

// ---- counters and flags by address ------------------------------------------
// The shapes the GEMM engine's notifier and waiter threads need: they hold
// per-rank arrays (an owner's counters, a peer's flag rows), not a
// SignalView. Same contract as the primitives below; Scope S is the wider of
// the writer's and the observer's: gpu when both are on this GPU (its SMs,
// its stream front end, its copy engine), sys otherwise.

/// Counts `v` notifications on `counter` (any rank's): red.release.S. Call
/// from ONE thread after every writer of the data has passed a barrier with
/// it.
template <Scope S, class T>
__device__ __forceinline__ void counter_notify(T* counter, T v = 1) {
  mo::red_add_release<S>(counter, v);
}

/// The same as a relaxed add, for a thread that has executed fence.acq_rel
/// at scope S after the data's stores (the GEMM engine's notifier,
/// kernels/gemm/epilogue.cuh): the fence makes the add a release, and a
/// red.release would execute a second fence per tile.
template <Scope S, class T>
__device__ __forceinline__ void counter_notify_fenced(T* counter, T v = 1) {
  mo::red_add_relaxed<S>(counter, v);
}

/// Sets `flag` to `value` (st.release.S): per-source flags, written by one
/// rank only, carrying the epoch. Call as counter_notify.
template <Scope S>
__device__ __forceinline__ void flag_notify(std::uint64_t* flag, std::uint64_t value) {
  mo::st_release<S>(flag, value);
}

/// Waits until *word >= target (acquire at S; link/wait.cuh: timeout,
/// diagnostic naming `site`, trap). Returns the value seen.
template <Scope S, class T>
__device__ __forceinline__ T flag_wait(const T* word, T target, const WaitLimit& limit, const WaitSite& site) {
  return wait_geq<S>(word, target, limit, site);
}

/// One CTA's arrival at the end of a job shared by `ctas` CTAs, counted on
/// `done` (this GPU's memory, zero before the job). Call from ONE thread of
/// the CTA after a barrier over the CTA's writers of the job. Returns true
/// in the last CTA to arrive only, after resetting `done` to zero for the
/// next job and executing fence.acq_rel.S: that thread's next release at S
/// (flag_notify, counter_notify) then publishes the writes of every CTA of
/// the job (fence-fence synchronization through the relaxed add on `done`,
/// which each CTA precedes with its own fence.acq_rel.S).
template <Scope S>
__device__ __forceinline__ bool last_cta_arrive(unsigned int* done, unsigned int ctas) {
  mo::fence_acq_rel<S>();
  if (atomicAdd(done, 1u) != ctas - 1) return false;
  atomicExch(done, 0u);
  mo::fence_acq_rel<S>();
  return true;
}

namespace detail {

__device__ __forceinline__ WaitLimit limit_of(const runtime::SignalView& sv) {
  return WaitLimit{sv.timeout_ns, sv.diag};
}

/// A tile or slot id outside its map or signal array: recorded as a wait
/// whose expected value is the limit and seen value the id, then trap.
__device__ __forceinline__ void check_id(const runtime::SignalView& sv, int id, int limit, int tile) {
  if (id < 0 || id >= limit)
    wait_failed(limit_of(sv), WaitSite{runtime::WaitKind::bad_id, sv.rank, tile, -1, -1, id, -1},
                static_cast<std::uint64_t>(limit), static_cast<std::uint64_t>(static_cast<std::int64_t>(id)));
}

/// Adds one to counter `slot` on rank dst with release semantics: .gpu for
/// this GPU, .sys for a peer.
__device__ __forceinline__ void notify_counter(const runtime::SignalView& sv, int dst, int slot) {
  if (dst == sv.rank) {
    counter_notify<Scope::gpu>(sv.counter(slot), std::uint64_t{1});
  } else {
    counter_notify<Scope::sys>(sv.peer_counter(dst, slot), std::uint64_t{1});
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
    wait_geq<Scope::sys>(sv.counter(ch), target, detail::limit_of(sv),
                         WaitSite{runtime::WaitKind::consumer_tile, sv.rank, tile_c, -1, -1, ch, -1});
  }
}

/// Waits until this rank's counter `slot` reaches `target` (epoch-scaled by
/// the caller). For group counters and custom schemes.
__device__ __forceinline__ void counter_wait(const runtime::SignalView& sv, int slot, std::uint64_t target,
                                             int tile = -1) {
  detail::check_id(sv, slot, sv.slots, tile);
  wait_geq<Scope::sys>(sv.counter(slot), target, detail::limit_of(sv),
                       WaitSite{runtime::WaitKind::counter, sv.rank, tile, -1, -1, slot, -1});
}

/// Waits until the counter at `counter` reaches `target`: the same wait as
/// counter_wait for a counter array the caller owns (an operator's per-tile
/// reduce counters) instead of a Signals slot. `tile` names the tile in the
/// timeout diagnostic. Returns the value seen.
__device__ __forceinline__ std::uint64_t counter_wait_at(const runtime::SignalView& sv, const std::uint64_t* counter,
                                                         std::uint64_t target, int tile) {
  return wait_geq<Scope::sys>(counter, target, detail::limit_of(sv),
                              WaitSite{runtime::WaitKind::counter, sv.rank, tile, -1, -1, tile, -1});
}

/// Sets my flag `slot` on rank dst_rank to `value` (release; .sys for a
/// peer, .gpu for myself). Flags are per source rank, so a plain store is
/// race-free; use the epoch as the value.
__device__ __forceinline__ void peer_tile_notify(const runtime::SignalView& sv, int slot, int dst_rank,
                                                 std::uint64_t value) {
  detail::check_id(sv, slot, sv.slots, slot);
  detail::check_id(sv, dst_rank, sv.world, slot);
  if (dst_rank == sv.rank) {
    flag_notify<Scope::gpu>(sv.flag_at(dst_rank, slot), value);
  } else {
    flag_notify<Scope::sys>(sv.flag_at(dst_rank, slot), value);
  }
}

/// Waits until rank src_rank's flag `slot` (on this rank) is >= value.
__device__ __forceinline__ void peer_tile_wait(const runtime::SignalView& sv, int slot, int src_rank,
                                               std::uint64_t value) {
  detail::check_id(sv, slot, sv.slots, slot);
  detail::check_id(sv, src_rank, sv.world, slot);
  wait_geq<Scope::sys>(sv.flag_from(src_rank, slot), value, detail::limit_of(sv),
                       WaitSite{runtime::WaitKind::peer_tile, sv.rank, slot, -1, -1, slot, src_rank});
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
