// tessera/runtime/signals.hpp — flag and counter arrays in symmetric memory.
//
// Layout on every rank (uint64 slots, zeroed once at creation):
//   counters[slots]          — channel counters; any rank may add to them
//                              (link::producer_tile_notify, GEMM epilogues)
//   peer_flags[world][slots] — per-source flags; row s is written only by
//                              rank s (link::peer_tile_notify, rank_notify)
//
// Epochs: iteration e (1, 2, ...) waits for a counter to reach
// e * (notifications per iteration) and a flag to reach e, so back-to-back
// iterations need no reset and no barrier between them. 2^64 increments
// never wrap in practice. A user that must restart its epochs (a CUDA-graph
// replay repeats the ones it captured) zeroes the flags between two stream
// barriers (zero_local) and starts again at e = 1.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <tuple>

#include "tessera/runtime/symmetric_heap.hpp"
#include "tessera/runtime/wait_diagnostics.hpp"

namespace tessera::runtime {

/// What kernels get (by value): every rank's signal arrays plus the wait
/// timeout and diagnostic record.
struct SignalView {
  std::uint64_t* base[kMaxPeers];  ///< each rank's signal array
  int rank;
  int world;
  int slots;
  std::uint64_t timeout_ns;
  WaitRecord* diag;

  __host__ __device__ std::uint64_t* counter(int slot) const { return base[rank] + slot; }
  __host__ __device__ std::uint64_t* peer_counter(int dst, int slot) const { return base[dst] + slot; }
  /// My flag for notifications from rank `src`.
  __host__ __device__ std::uint64_t* flag_from(int src, int slot) const {
    return base[rank] + slots + static_cast<std::int64_t>(src) * slots + slot;
  }
  /// Rank dst's flag that receives my notifications.
  __host__ __device__ std::uint64_t* flag_at(int dst, int slot) const {
    return base[dst] + slots + static_cast<std::int64_t>(rank) * slots + slot;
  }
};

class Signals {
 public:
  /// Collective: `slots` channels/flags per rank, zeroed, all ranks past the
  /// zeroing before this returns (so no early notify is lost).
  Signals(ProcessGroup& pg, int slots);
  ~Signals();
  Signals(const Signals&) = delete;
  Signals& operator=(const Signals&) = delete;

  SignalView view() const;
  int slots() const { return slots_; }
  ProcessGroup& group() const { return *pg_; }
  const WaitDiagnostics& diagnostics() const { return *diag_; }

  /// Pending waits the host must be able to release, for diagnostics: the
  /// largest value enqueued per (stream, source rank, slot). link::rank_wait
  /// records its stream waits, and a kernel whose device waits have no
  /// timeout of their own records the flags it spins on (sp_attention's
  /// table-wait kernel); link::synchronize reports and clears.
  struct HostWait {
    cudaStream_t stream;
    int src;
    int slot;
    std::uint64_t value;
    const char* what = "rank_wait";  ///< the waiter, as the report names it (a string literal)
  };
  void note_host_wait(const HostWait& w) const;
  std::vector<HostWait> host_waits(cudaStream_t stream) const;
  void clear_host_waits(cudaStream_t stream) const;
  /// Releases pending waits: stores each one's expected value into its flag
  /// (on `side`) where the flag is still short, forgets them, and returns
  /// those it released as "<what> on rank R: slot S from rank P expected
  /// >= V but saw W; ..." (empty: none). `stream`: only that stream's waits;
  /// std::nullopt: every stream's.
  std::string release_host_waits(cudaStream_t side, std::optional<cudaStream_t> stream) const;

  /// Enqueues the zeroing of this rank's counters and flags on `stream` and
  /// forgets every recorded host wait. Peers may write these flags: the
  /// caller orders the zeroing after their last write and before their next
  /// one (TpContext::Impl::reset_flags: a stream barrier on either side).
  void zero_local(cudaStream_t stream) const;

  /// Host reads (debugging, tests): a copy on `stream`, synchronized.
  std::uint64_t read_counter(int slot, cudaStream_t stream) const;
  std::uint64_t read_flag_from(int src, int slot, cudaStream_t stream) const;

 private:
  ProcessGroup* pg_;
  int slots_;
  SymBuffer<std::uint64_t> buf_;
  std::unique_ptr<WaitDiagnostics> diag_;
  mutable std::mutex waits_mutex_;
  struct PendingWait {
    std::uint64_t value = 0;
    const char* what = nullptr;
  };
  mutable std::map<std::tuple<cudaStream_t, int, int>, PendingWait> host_waits_;
};

}  // namespace tessera::runtime
