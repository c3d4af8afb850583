// tessera/runtime/symmetric_heap.hpp — symmetric memory on NCCL windows.
//
// Every allocation is collective: all ranks allocate the same number of
// bytes in the same order (checked; a mismatch is an Error naming both
// sizes). Memory comes from ncclMemAlloc and is registered as an NCCL window
// (NCCL_WIN_COLL_SYMMETRIC), so it is also usable by NCCL's symmetric
// collectives. Peer addresses are resolved once with ncclGetPeerPointer and
// kept both for kernels (PeerPtrs, passed by value) and for the host
// (cudaMemcpyAsync to a peer = the copy engine).
//
// Limits: needs every rank in one load/store domain (ProcessGroup::
// lsa_reachable()); at most kMaxPeers ranks; the buffer is freed
// collectively (destroy the SymBuffers in the same order on every rank).
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "tessera/runtime/process_group.hpp"

namespace tessera::runtime {

inline constexpr int kMaxPeers = 16;

/// Addresses of one symmetric buffer on every rank, for kernels (by value).
template <class T>
struct PeerPtrs {
  T* ptr[kMaxPeers];
  int rank;
  int world;
  __host__ __device__ T* local() const { return ptr[rank]; }
  __host__ __device__ T* peer(int r) const { return ptr[r]; }
};

/// One collective allocation. Untyped; SymBuffer<T> is the typed view.
class SymAllocation {
 public:
  /// Collective. `bytes` > 0; `alignment` a power of two <= 4096 (NCCL
  /// windows are 4096-aligned, so any such alignment holds).
  SymAllocation(ProcessGroup& pg, std::size_t bytes, std::size_t alignment = 256);
  ~SymAllocation();
  SymAllocation(const SymAllocation&) = delete;
  SymAllocation& operator=(const SymAllocation&) = delete;

  void* local() const { return base_; }
  /// Host-usable address of rank r's buffer (cudaMemcpyAsync, kernels).
  void* peer(int r) const;
  std::size_t bytes() const { return bytes_; }
  ncclWindow_t window() const { return win_; }
  ProcessGroup& group() const { return *pg_; }

 private:
  ProcessGroup* pg_;
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
  ncclWindow_t win_ = nullptr;
  std::vector<void*> peers_;
};

/// A typed symmetric buffer of `count` elements on every rank.
template <class T>
class SymBuffer {
 public:
  SymBuffer() = default;
  SymBuffer(ProcessGroup& pg, std::size_t count)
      : count_(count),
        alloc_(std::make_unique<SymAllocation>(pg, count * sizeof(T), alignof(T) < 16 ? 16 : alignof(T))) {}

  T* local() const { return static_cast<T*>(alloc_->local()); }
  T* peer(int r) const { return static_cast<T*>(alloc_->peer(r)); }
  std::size_t count() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }
  ncclWindow_t window() const { return alloc_->window(); }
  bool empty() const { return !alloc_; }

  PeerPtrs<T> peers() const {
    PeerPtrs<T> p{};
    const int w = alloc_->group().world();
    for (int r = 0; r < w; ++r) p.ptr[r] = peer(r);
    p.rank = alloc_->group().rank();
    p.world = w;
    return p;
  }

 private:
  std::size_t count_ = 0;
  std::unique_ptr<SymAllocation> alloc_;
};

/// Factory for symmetric buffers of one process group.
class SymmetricHeap {
 public:
  explicit SymmetricHeap(ProcessGroup& pg) : pg_(&pg) {}
  template <class T>
  SymBuffer<T> alloc(std::size_t count) {
    return SymBuffer<T>(*pg_, count);
  }
  ProcessGroup& group() const { return *pg_; }

 private:
  ProcessGroup* pg_;
};

namespace detail {
/// Resolves every rank's address of `win` (a device kernel: the window
/// structure lives in device memory). Returns world pointers.
std::vector<void*> resolve_peer_pointers(ncclWindow_t win, int world, cudaStream_t stream);
}  // namespace detail

}  // namespace tessera::runtime
