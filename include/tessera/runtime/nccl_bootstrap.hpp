// tessera/runtime/nccl_bootstrap.hpp — host-side exchanges (broadcast,
// allgather, barrier, check_same) carried by an existing NCCL communicator
// instead of the TCP rendezvous: for a ProcessGroup built from an NCCL unique
// id that the caller distributed (ProcessGroup::create_from_unique_id, e.g.
// through a torch.distributed group), so Tessera opens no port of its own.
//
// Each exchange is two NCCL collectives on a private stream over a small
// device buffer staged through pinned host memory: first a fixed header
// {exchange kind, sequence number, byte count, root} from every rank, then
// the payload. The header makes ranks that call different exchanges, or pass
// different sizes, fail with an error naming the ranks (the same error on
// every rank) instead of exchanging garbage or hanging inside NCCL.
//
// Failure contract: every exchange waits at most `timeout` (polling its
// completion event and ncclCommGetAsyncError); a rank that never joins gives
// a tessera::Error naming the exchange and the timeout. The communicator is
// then unusable: the owner aborts it (ProcessGroup::abort). A broken
// NcclBootstrap throws on every later call and leaks its buffers rather than
// free them under a collective that may never finish.
//
// Ordering: the exchange's private stream is not ordered with other work on
// the device. A persistent kernel of another group that spins on its peers
// (a fused operator) can hold the SMs that this exchange's NCCL kernel needs
// on one rank while the opposite holds on its peer: a cross-device deadlock.
// set_before_exchange installs a hook that runs before each exchange's
// collectives are enqueued, with the private stream, so the owner can order
// the exchange after such work (ProcessGroup::order_after_all_groups).
//
// Not thread-safe; same call order on every rank (as Bootstrap). The
// communicator must outlive this object; nothing here calls NCCL on
// destruction.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "tessera/runtime/bootstrap.hpp"

namespace tessera::runtime {

class NcclBootstrap final : public Bootstrap {
 public:
  /// `comm` spans exactly `world` ranks, this process being `rank`, on CUDA
  /// device `device` (made current around each exchange).
  NcclBootstrap(ncclComm_t comm, int rank, int world, int device, std::chrono::milliseconds timeout);
  ~NcclBootstrap() override;

  void broadcast(void* data, std::size_t bytes, int root) override;
  void allgather(const void* in, void* out, std::size_t bytes_per_rank) override;
  void barrier() override;
  void check_same(const void* data, std::size_t bytes, const std::string& what) override;

  /// `hook(stream)` runs before the collectives of every later exchange are
  /// enqueued on `stream` (this object's private stream); it may enqueue
  /// stream waits there. Empty: no hook.
  void set_before_exchange(std::function<void(cudaStream_t)> hook) { before_exchange_ = std::move(hook); }

  /// True once an exchange failed (timeout, NCCL error, mismatch of calls).
  bool broken() const { return broken_; }

 private:
  struct Header {
    std::uint32_t kind = 0;
    std::uint32_t seq = 0;
    std::uint64_t bytes = 0;
    std::int32_t root = 0;
    std::int32_t rank = 0;
  };
  /// Allgathers the header and checks that every rank called the same
  /// exchange with the same size and root.
  void agree(std::uint32_t kind, std::size_t bytes, int root);
  /// Raw allgather of `bytes` per rank from host `in` to host `out`.
  void raw_allgather(const void* in, void* out, std::size_t bytes, const char* what);
  void reserve(std::size_t device_bytes, std::size_t host_bytes);
  /// Waits for the private stream's work with the timeout; throws on timeout
  /// or an asynchronous NCCL error.
  void wait(const char* what, std::size_t bytes);
  [[noreturn]] void fail(const std::string& msg);

  /// Runs before_exchange_ (if set) on the private stream.
  void order_before_exchange();

  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  std::function<void(cudaStream_t)> before_exchange_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  char* dev_ = nullptr;
  std::size_t dev_bytes_ = 0;
  char* host_ = nullptr;  ///< pinned staging (device-to-host copies stay asynchronous)
  std::size_t host_bytes_ = 0;
  std::uint32_t seq_ = 0;
  bool broken_ = false;
};

}  // namespace tessera::runtime
