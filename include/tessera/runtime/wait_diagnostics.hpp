// tessera/runtime/wait_diagnostics.hpp — how a device-side wait that timed
// out reports itself to the host.
//
// A waiting thread that exceeds its timeout claims the WaitRecord (host
// pinned, mapped into the device), fills in what it waited for, prints the
// same line with printf and traps. The trap kills the CUDA context; the host
// side (WaitDiagnostics::check / synchronize) then throws a tessera::Error
// that names the wait instead of the bare "unspecified launch failure".
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>

namespace tessera::runtime {

class ProcessGroup;

enum class WaitKind : int {
  none = 0,
  consumer_tile = 1,  ///< link::consumer_tile_wait
  peer_tile = 2,      ///< link::peer_tile_wait
  counter = 3,        ///< a group/tile counter (GEMM prologue, signal driver)
  host_rank = 4,      ///< link::rank_wait (stream memory operation)
  bad_id = 5,         ///< a tile/slot id outside its map (expected = limit, seen = id)
};

const char* wait_kind_name(WaitKind k);

/// Filled by the first device thread whose wait times out. `claimed` is 0
/// (free), 2 (being written) or 1 (complete). Plain old data:
/// lives in pinned host memory mapped into the device.
struct WaitRecord {
  unsigned int claimed;  ///< 1 once a waiter filled the record (link::record_wait_timeout)
  int kind;              ///< WaitKind
  int rank;              ///< rank of the waiting process
  int tile;              ///< tile id (or group id for counters)
  int channel;           ///< channel / slot waited on
  int peer;              ///< source rank for peer waits, -1 otherwise
  std::uint64_t expected;
  std::uint64_t seen;
  std::uint64_t timeout_ns;
};

/// Owns one WaitRecord in mapped pinned memory.
class WaitDiagnostics {
 public:
  WaitDiagnostics();
  ~WaitDiagnostics();
  WaitDiagnostics(const WaitDiagnostics&) = delete;
  WaitDiagnostics& operator=(const WaitDiagnostics&) = delete;

  /// Device-side address of the record (pass to kernels).
  WaitRecord* device_record() const { return device_; }
  /// The diagnostic line if a wait has timed out, nullopt otherwise.
  std::optional<std::string> describe() const;
  /// Throws tessera::Error naming the timed-out wait, if any.
  void check(const char* context) const;

 private:
  WaitRecord* host_ = nullptr;
  WaitRecord* device_ = nullptr;
};

/// The wait timeout for device and host waits: TESSERA_WAIT_TIMEOUT_MS
/// (default 5000 ms), in nanoseconds.
std::uint64_t wait_timeout_ns();

/// Bounded stream synchronization (never cudaStreamSynchronize): waits at
/// most TESSERA_WAIT_TIMEOUT_MS for `stream`, turning a failure into an Error
/// naming the timed-out device wait when `diag` holds one.
void synchronize(cudaStream_t stream, const WaitDiagnostics* diag = nullptr, const char* context = "synchronize");

/// The one bounded host wait for work that may wait on a peer (a collective,
/// a rank_wait, a device-side flag wait). Polls cudaStreamQuery on every
/// stream in `streams` (and, with `pg`, ncclCommGetAsyncError on its
/// communicator) until all are idle, at most `timeout` (default
/// TESSERA_WAIT_TIMEOUT_MS). On a timeout or an asynchronous NCCL error it
/// aborts `pg`'s communicator (ProcessGroup::abort: ncclCommAbort, which
/// also ends the NCCL kernels still waiting for the dead or stuck peer) and
/// throws a tessera::Error naming the rank, `what` and the cause; a CUDA
/// error throws too (naming the trapped wait when `diag` holds one). After
/// such an error the process group is unusable: free its buffers and exit.
void bounded_sync(std::initializer_list<cudaStream_t> streams, const char* what, ProcessGroup* pg = nullptr,
                  const WaitDiagnostics* diag = nullptr, std::optional<std::chrono::nanoseconds> timeout = {});
/// The same for one stream.
void bounded_sync(cudaStream_t stream, const char* what, ProcessGroup* pg = nullptr,
                  const WaitDiagnostics* diag = nullptr, std::optional<std::chrono::nanoseconds> timeout = {});
/// The same for an event (cudaEventQuery instead of cudaEventSynchronize).
void bounded_event_sync(cudaEvent_t event, const char* what, ProcessGroup* pg = nullptr,
                        std::optional<std::chrono::nanoseconds> timeout = {});

enum class PollState { done, waiting, failed };
/// The waiting loop of the bounded waits (separate for CPU tests): calls
/// `poll` until it returns done or failed, or `timeout` has passed (then
/// returns waiting). Sleeps between polls, 20 µs at first, growing to 1 ms.
PollState poll_until(const std::function<PollState()>& poll, std::chrono::nanoseconds timeout);

}  // namespace tessera::runtime
