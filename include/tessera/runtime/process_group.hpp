// tessera/runtime/process_group.hpp — one process per GPU: rank, world,
// device, NCCL communicator (host and device API), streams, and host-side
// helpers over the TCP bootstrap.
//
// Usage:
//   auto pg = tessera::runtime::ProcessGroup::from_environment();
//   ... pg.nccl(), pg.dev_comm(), pg.stream() ...
//
// Start-up order: read the launcher's environment (torchrun / SLURM / Open
// MPI), connect the TCP bootstrap, check that this node has a GPU for every
// local rank, select device local_rank, exchange the NCCL unique id, create
// the communicator and its device communicator (ncclDevCommCreate). Every
// step fails with a tessera::Error naming the problem; a peer that never
// arrives or dies during start-up is reported by the bootstrap's timeout.
//
// Limits: all ranks of the communicator must be load/store reachable (one
// NVLink/P2P domain) for symmetric memory and the link primitives;
// lsa_reachable() tells, and SymmetricHeap refuses otherwise.
// TESSERA_NO_LSA=1 or TESSERA_TOPOLOGY=net makes lsa_reachable() false
// (and skips the device communicator) even where NVLink/P2P exists: the
// operators then run only their NCCL-based strategies (ops/tp_mlp.hpp).
//
// Teardown never hangs on a dead peer: the destructor waits for its streams
// at most TESSERA_WAIT_TIMEOUT_MS, aborts the communicator when they do not
// drain (or NCCL reports an error), and bounds the finalize likewise.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <nccl_device.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/runtime/bootstrap.hpp"
#include "tessera/runtime/dtype.hpp"
#include "tessera/runtime/launch.hpp"

namespace tessera::runtime {

class Signals;

struct ProcessGroupOptions {
  /// Timeout of the TCP rendezvous and of host-side exchanges.
  std::chrono::milliseconds bootstrap_timeout = default_bootstrap_timeout();
  /// CUDA device; -1 selects local_rank.
  int device = -1;
  /// Number of extra (communication) streams to create.
  int comm_streams = 2;
};

class ProcessGroup {
 public:
  /// Bootstraps from the launcher's environment (see runtime/launch.hpp).
  static std::unique_ptr<ProcessGroup> from_environment(ProcessGroupOptions opts = {});
  /// Bootstraps from an explicit LaunchInfo.
  static std::unique_ptr<ProcessGroup> create(const LaunchInfo& info, ProcessGroupOptions opts = {});
  /// Builds the group from an NCCL unique id that the caller made on one rank
  /// (ncclGetUniqueId) and handed to every rank by its own means (e.g. a
  /// torch.distributed broadcast): collective over the `world` ranks, opens
  /// no port. Host-side exchanges then run over the NCCL communicator
  /// (NcclBootstrap, runtime/nccl_bootstrap.hpp), bounded by
  /// opts.bootstrap_timeout. `device` >= 0 is required (no launcher
  /// environment says which); launch_info() has local_rank = rank and
  /// local_world = world (one node: the operators need load/store reach).
  static std::unique_ptr<ProcessGroup> create_from_unique_id(int rank, int world, int device, const ncclUniqueId& id,
                                                             ProcessGroupOptions opts = {});

  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  /// Makes `stream` wait for the work enqueued so far on the streams of every
  /// live ProcessGroup of this process on CUDA device `device` (streams being
  /// captured into a graph are skipped: they hold no work). NCCL host
  /// exchanges call it before their collectives (NcclBootstrap's hook): a
  /// collective that runs beside another group's persistent, peer-waiting
  /// kernel can deadlock across devices, so it runs after it. Each
  /// operator's side streams join its group's compute stream within the
  /// call, so the groups' own streams carry every such kernel.
  static void order_after_all_groups(cudaStream_t stream, int device);

  int rank() const { return info_.rank; }
  int world() const { return info_.world; }
  int local_rank() const { return info_.local_rank; }
  int local_world() const { return info_.local_world; }
  int device() const { return device_; }
  const LaunchInfo& launch_info() const { return info_; }

  /// Throws tessera::Error once abort() ran: the communicator is gone, and
  /// an NCCL call on it would touch freed memory.
  ncclComm_t nccl() const {
    if (aborted_) throw_aborted("nccl()");
    return comm_;
  }
  /// The NCCL device communicator (symmetric-memory device API); throws
  /// after abort() as nccl() does.
  const ncclDevComm& dev_comm() const {
    if (aborted_) throw_aborted("dev_comm()");
    return dev_comm_;
  }
  /// True when every rank is in this rank's load/store-accessible team.
  /// False also when TESSERA_NO_LSA=1 / TESSERA_TOPOLOGY=net turn it off.
  bool lsa_reachable() const { return !lsa_off_ && lsa_size_ == info_.world; }
  int lsa_size() const { return lsa_size_; }

  /// The compute stream (non-blocking).
  cudaStream_t stream() const { return stream_; }
  /// Communication stream i (non-blocking), i < comm_stream_count().
  cudaStream_t comm_stream(int i = 0) const;
  int comm_stream_count() const { return static_cast<int>(comm_streams_.size()); }

  const cudaDeviceProp& device_properties() const { return props_; }
  int sm_count() const { return props_.multiProcessorCount; }

  /// Aborts the NCCL communicator (ncclCommAbort): the way out after a
  /// collective that a peer never joined (a timed-out wait reported an
  /// error). Later NCCL calls on this group fail; the destructor skips the
  /// collective finalize. Free symmetric buffers only after aborting.
  /// Bounded: ncclCommAbort runs on a helper thread and is waited for at
  /// most TESSERA_WAIT_TIMEOUT_MS (it cannot finish while a non-NCCL kernel
  /// is stuck on the device; then it is left behind and abort() returns).
  void abort();
  bool aborted() const { return aborted_; }

  /// Every Signals object of this group registers itself here, so that a
  /// timed-out synchronize() can release the stream waits (link::rank_wait)
  /// still pending on any stream: otherwise such a wait never ends, the
  /// device never drains, and every later cudaFree (ncclCommAbort's, a
  /// destructor's) blocks for good.
  void register_signals(const Signals* s);
  void unregister_signals(const Signals* s);
  /// Stores the expected value into the flag of every pending stream wait
  /// of every registered Signals whose flag is still short; returns them as
  /// "slot S from rank R expected >= V but saw W; ..." (empty: none).
  std::string release_host_waits();

  /// Bounded wait for `stream` (runtime::bounded_sync): at most
  /// TESSERA_WAIT_TIMEOUT_MS, watching ncclCommGetAsyncError; on a timeout or
  /// an NCCL error it aborts this group and throws an Error naming the rank
  /// and `what`. Use it instead of cudaStreamSynchronize for work that waits
  /// on peers.
  void synchronize(cudaStream_t stream, const char* what);
  /// The same for the compute stream and every communication stream.
  void synchronize_all(const char* what);

  // ---- host-side exchanges over the bootstrap (not for the data path) ----
  Bootstrap& bootstrap() { return *boot_; }
  void barrier();
  /// Collective: enqueues a one-element all-reduce on `stream`. It completes
  /// on every rank within microseconds of the others, so work enqueued after
  /// it starts together across ranks (a host barrier() releases ranks tens
  /// of µs apart). Timing code calls it after barrier(), before its start
  /// event, so the skew does not count against work that waits for a peer.
  void align_streams(cudaStream_t stream);
  /// Allocates align_streams' operand now, so that a later align_streams can
  /// be enqueued inside a CUDA-graph capture (which allows no cudaMalloc).
  void prepare_align_streams();
  /// Maximum over ranks (e.g. of a time, so a benchmark reports the slowest rank).
  double allreduce_max(double v);
  /// Throws an Error naming `what` and the disagreeing ranks unless every rank
  /// passes the same bytes (used to validate shapes/dtypes before a launch).
  void check_same_on_all_ranks(const std::string& what, const void* data, std::size_t bytes);
  template <class T>
  void check_same_on_all_ranks(const std::string& what, const T& value) {
    // Bytes are compared: padding (indeterminate) would make equal values differ.
    static_assert(std::has_unique_object_representations_v<T>,
                  "check_same_on_all_ranks: T has padding or floating-point members; compare a padding-free struct");
    check_same_on_all_ranks(what, &value, sizeof(T));
  }
  /// Gathers one trivially-copyable value per rank.
  template <class T>
  std::vector<T> allgather(const T& value) {
    std::vector<T> out(world());
    boot_->allgather(&value, out.data(), sizeof(T));
    return out;
  }

 private:
  ProcessGroup() = default;
  LaunchInfo info_;
  int device_ = -1;
  cudaDeviceProp props_{};
  std::unique_ptr<Bootstrap> boot_;
  ncclComm_t comm_ = nullptr;
  ncclDevComm dev_comm_{};
  bool dev_comm_created_ = false;
  int lsa_size_ = 0;
  bool lsa_off_ = false;  ///< TESSERA_NO_LSA / TESSERA_TOPOLOGY=net
  bool aborted_ = false;
  [[noreturn]] void throw_aborted(const char* what) const;
  void register_group();  ///< into order_after_all_groups' registry (at the end of create*)
  void unregister_group();
  std::mutex signals_mutex_;
  std::vector<const Signals*> signals_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaStream_t> comm_streams_;
  float* align_token_ = nullptr;  ///< align_streams' operand (allocated at first use)
};

/// True while `stream` is being captured into a CUDA graph (operators whose
/// flags carry a per-call epoch refuse to be captured).
bool stream_capturing(cudaStream_t stream);
/// The id of the capture sequence `stream` belongs to (streams forked into one
/// capture share it), or std::nullopt when it is not being captured.
std::optional<unsigned long long> capture_id(cudaStream_t stream);

/// NCCL version of the loaded library, checked against the header at start-up.
int nccl_runtime_version();

/// NCCL's type for a Tessera dtype (bf16, f16, f32); throws for others.
ncclDataType_t nccl_dtype(DType t);

}  // namespace tessera::runtime
