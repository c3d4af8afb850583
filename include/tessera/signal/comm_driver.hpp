// tessera/signal/comm_driver.hpp — the communication side of signal-based
// overlap (seed §3.2, §5): on a communication stream, for each wave group
// in order, wait until the group's counter reaches its target, then run an
// ordinary NCCL collective on the group's contiguous span.
//
// Waits: WaitMode::StreamMemOp enqueues cuStreamWaitValue32(counter >=
// target) (runtime::driver, obtained through cudaGetDriverEntryPoint — no
// libcuda link); WaitMode::SpinKernel launches a one-thread kernel that
// spins on ld.acquire.gpu with a timeout (TESSERA_WAIT_TIMEOUT_MS): on
// timeout it records {rank, group, expected, seen} in a WaitDiagnostics
// record, prints it and traps. The stream-memop wait cannot time out on the
// device; synchronize() bounds it on the host: after TESSERA_WAIT_TIMEOUT_MS
// it names the groups whose counters are short, RELEASES their waits (stores
// the target into the counter from a private stream with a stream memory
// operation — no kernel), waits (bounded again) for the stream to drain and
// throws. So a counter that never arrives costs one timeout, not a hang. An
// NCCL collective whose peer never posts it cannot be released from here:
// synchronize() then says so, and the caller must abort the communicator
// (ncclCommAbort) before freeing buffers or destroying the stream.
// cudaFree synchronizes the whole device, so GroupCounters and CommDriver do
// not free device/pinned memory while an exception unwinds the stack (they
// leak it): a stuck wait then surfaces as the error, not as a hang in a
// destructor.
//
// After synchronize() has thrown, the counters no longer follow the epoch
// contract (a late producer may still add): discard them (new GroupCounters,
// epoch 1).
//
// Lazy module loading (CUDA's default): the first launch of a kernel waits
// for the whole device to go idle, so a kernel launched for the first time
// while the communication stream waits on counters that only this kernel
// bumps deadlocks (the producer GEMM, a test's fake producer). The driver
// loads its own waiter at construction; call ensure_loaded() on every kernel
// that runs while the communication stream waits, before enqueueing the waits
// (or run with CUDA_MODULE_LOADING=EAGER). Likewise NCCL connects lazily
// (NCCL_RUNTIME_CONNECT) on the first collective of a kind and may then
// synchronize its internal streams, which follow the communication stream:
// issue each collective pattern once, unblocked, before overlapping.
//
// Counters (GroupCounters): uint32 per group in device memory, zeroed once;
// call number `epoch` (1, 2, ...) waits for counter[g] >= epoch *
// tiles_in(g) (GroupPlan::counter_target). ">=" is the CYCLIC comparison of
// cuStreamWaitValue32(GEQ): (int32_t)(counter - target) >= 0 (counter_reached
// below; the spinning waiter and synchronize() use the same one). So a
// counter more than 2^31 ahead of its target does NOT pass: never preset a
// counter to a sentinel such as 0xFFFFFFFF to make waits pass; store the
// exact target (GroupCounters::store). The producer contract is in
// signal/device.cuh. The caller must not let the producer of call e+1
// overwrite a group buffer before call e's collective on it is done
// (stream-order the next GEMM after the communication stream).
//
// NCCL order: every rank must issue the same collectives in the same order
// (same plan, same calls); the driver issues one collective (or one grouped
// send/recv) per group, in group order.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/runtime/dtype.hpp"
#include "tessera/runtime/wait_diagnostics.hpp"
#include "tessera/signal/a2a.hpp"
#include "tessera/signal/group_plan.hpp"
#include "tessera/runtime/host_device.hpp"
#include "tessera/signal/reorder.hpp"

namespace tessera::signal {

/// The wait condition of every counter wait (stream memop GEQ semantics):
/// cyclic, so it survives wrap-around of the 32-bit counter.
TESSERA_HD bool counter_reached(std::uint32_t seen, std::uint32_t target) {
  return static_cast<std::int32_t>(seen - target) >= 0;
}

enum class WaitMode { StreamMemOp, SpinKernel };
const char* wait_mode_name(WaitMode m);

/// Forces the module of kernel `fn` (a __global__ function's address) to load
/// now (cudaFuncGetAttributes), so that its first launch cannot wait for a
/// device that a stream wait keeps busy (see the header comment). `name`
/// appears in the error if the kernel cannot be loaded.
void ensure_loaded(const void* fn, const char* name);

/// Per-group tile counters in device memory (zeroed at construction).
class GroupCounters {
 public:
  /// Allocates and zeroes the counters (on a private stream, so it works
  /// while other streams wait).
  explicit GroupCounters(int groups);
  ~GroupCounters();
  GroupCounters(const GroupCounters&) = delete;
  GroupCounters& operator=(const GroupCounters&) = delete;

  std::uint32_t* device() const { return counters_; }
  int groups() const { return groups_; }
  /// Current values, read on a private stream (works while others are
  /// blocked), bounded by `timeout_ns` (throws naming the timeout).
  std::vector<std::uint32_t> read(std::uint64_t timeout_ns = runtime::wait_timeout_ns()) const;
  /// Stores `value` into counter g from the private stream (a stream memory
  /// operation, no kernel) and waits for the store, bounded by `timeout_ns`.
  void store(int g, std::uint32_t value, std::uint64_t timeout_ns) const;

 private:
  std::uint32_t* counters_ = nullptr;
  std::uint32_t* host_ = nullptr;  ///< pinned mirror for read()
  cudaStream_t side_ = nullptr;
  int groups_ = 0;
};

class CommDriver {
 public:
  /// `stream`: the communication stream (all NCCL calls and waits go there).
  /// Loads the spinning waiter's module (see ensure_loaded).
  CommDriver(ncclComm_t comm, cudaStream_t stream, WaitMode mode,
             std::uint64_t timeout_ns = runtime::wait_timeout_ns());
  /// Leaks the spinning waiter's diagnostic record during stack unwinding
  /// (freeing pinned memory synchronizes the device; see the header comment).
  ~CommDriver();
  CommDriver(const CommDriver&) = delete;
  CommDriver& operator=(const CommDriver&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  WaitMode mode() const { return mode_; }
  cudaStream_t stream() const { return stream_; }

  /// Enqueues the wait for group g of call `epoch`.
  void wait_group(const GroupPlan& plan, const GroupCounters& counters, int g, std::uint64_t epoch);

  /// In-place AllReduce (sum) of every group's span of `buffer` (ArMap layout).
  void all_reduce(const GroupPlan& plan, const ArMap& map, void* buffer, DType dtype, const GroupCounters& counters,
                  std::uint64_t epoch);
  /// ReduceScatter (sum) of each group's span of `send` into `recv` (RsMap layout).
  void reduce_scatter(const GroupPlan& plan, const RsMap& map, const void* send, void* recv, DType dtype,
                      const GroupCounters& counters, std::uint64_t epoch);
  /// All-to-All per group with grouped ncclSend/ncclRecv (A2aPlan layout);
  /// waits on this rank's plan(rank()).
  void all_to_all(const A2aPlan& plan, const void* send, void* recv, DType dtype, const GroupCounters& counters,
                  std::uint64_t epoch);

  /// Host wait for the communication stream, bounded by the timeout. Throws
  /// a tessera::Error naming the spinning waiter's diagnostic or NCCL's
  /// error; or, when the stream is still busy after the timeout, naming the
  /// groups whose counters are short of their target — after releasing those
  /// waits and waiting (at most one more timeout) for the stream to drain;
  /// the message says whether it drained. Returns normally only when every
  /// wait was satisfied by the producer and the stream drained.
  void synchronize(const GroupPlan& plan, const GroupCounters& counters, std::uint64_t epoch) const;

 private:
  void check_counters(const GroupPlan& plan, const GroupCounters& counters, const char* op) const;
  ncclComm_t comm_;
  cudaStream_t stream_;
  WaitMode mode_;
  std::uint64_t timeout_ns_;
  int rank_ = 0, world_ = 1;
  std::unique_ptr<runtime::WaitDiagnostics> diag_;
};

namespace detail {
/// The one-thread spinning waiter kernel (spin_wait.cu), for ensure_loaded.
const void* spin_wait_kernel_address();
/// Launches the one-thread spinning waiter (spin_wait.cu).
cudaError_t launch_spin_wait(const std::uint32_t* counter, std::uint32_t target, std::uint64_t timeout_ns, int rank,
                             int group, runtime::WaitRecord* record, cudaStream_t stream);
}  // namespace detail

}  // namespace tessera::signal
