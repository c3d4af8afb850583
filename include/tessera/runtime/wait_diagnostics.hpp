// tessera/runtime/wait_diagnostics.hpp — how a device-side wait that timed
// out reports itself to the host.
//
// Every device wait with a timeout (link::wait_until, link/wait.cuh: the
// link primitives, the GEMM engine's FlagWait, the ops' prologues, the
// signal layer's spinning waiter) fills the same WaitRecord, host pinned and
// mapped into the device, then traps. The trap kills the CUDA context; the
// host side (WaitDiagnostics::check / synchronize) then throws a
// tessera::Error that names the wait instead of the bare "unspecified launch
// failure". Device code stays call-free (no printf: a call in a wgmma
// kernel serializes its wgmmas), so the host prints the record.
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
  tile_flag = 6,      ///< a tile's flag: the engine's FlagWait (GEMM, attention KV blocks), the ops' prologues
};

const char* wait_kind_name(WaitKind k);

/// Filled by the first device thread whose wait times out
/// (link::record_wait_timeout). `claimed` is 0 (free) or 1 (complete: the
/// other fields are written and fenced before it). Plain old data: lives in
/// pinned host memory mapped into the device. A field the waiter does not
/// know is -1.
struct WaitRecord {
  unsigned int claimed;  ///< 1 once a waiter filled the record
  int kind;              ///< WaitKind
  int rank;              ///< rank of the waiting process
  int block;             ///< blockIdx.x of the waiting thread
  int tile;              ///< tile id (or group id for counters)
  int tile_m, tile_n;    ///< a GEMM tile's coordinates (tile_flag waits)
  int channel;           ///< channel / slot / flag index waited on
  int peer;              ///< source rank for peer waits
  std::uint64_t expected;
  std::uint64_t seen;
  std::uint64_t timeout_ns;
};

/// The diagnostic line of a complete record (the wait, where, expected and
/// seen values, the timeout). Pure: unit-tested on the CPU.
std::string describe_wait(const WaitRecord& r);

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
  /// Frees the record for the next wait (a test's fresh context). The
  /// device side's claim word is per translation unit and is not reset: a
  /// trap loses the context, so a unit claims at most once per process.
  void clear();

 private:
  WaitRecord* host_ = nullptr;
  WaitRecord* device_ = nullptr;
};

/// The process's record for waits that have no Signals of their own (the
/// GEMM engine's FlagWait, the ops' fused prologues, sp_attention's KV
/// waits): pinned, mapped and portable (valid on every device), created on
/// first use and never freed.
WaitDiagnostics& process_wait_diagnostics();

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
