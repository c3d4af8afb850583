// src/ops/scratch.hpp — the grow-only buffers of the operators' contexts:
// local device scratch (the MoE layers, the sequence-parallel attention
// contexts) and the symmetric workspaces peers push into (sp_attention, ring
// attention). Internal to src/ops.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "tessera/link/host_primitives.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"
#include "tessera/runtime/signals.hpp"
#include "tessera/runtime/symmetric_heap.hpp"

namespace tessera::ops::detail {

/// A device buffer that only grows; contents are not kept across growth.
/// Growth first waits (bounded: a dead peer is reported, naming `growth`)
/// until no kernel or copy of an earlier call may still use the old buffer:
/// pg.stream() alone (Drain::compute_stream: the operator joins its other
/// streams into pg.stream() before returning) or every stream of the group
/// (Drain::all_streams: the operator leaves work of its own on them).
/// Growth inside a CUDA-graph capture of pg.stream() is an error naming
/// `growth` (no allocation can be captured); after keep_replaced() a grown
/// buffer's old allocation is kept until destruction, for graphs that hold
/// its address.
class ScratchBuffer {
 public:
  enum class Drain { compute_stream, all_streams };

  explicit ScratchBuffer(const char* growth, Drain drain = Drain::compute_stream) : growth_(growth), drain_(drain) {}
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ~ScratchBuffer() {
    if (p_) cudaFree(p_);
    for (void* p : replaced_) cudaFree(p);
  }

  /// From now on growth keeps the old allocation (a captured graph may read it).
  void keep_replaced() { keep_replaced_ = true; }

  /// At least `bytes` bytes (the same address while it needs no growth).
  void* get(std::size_t bytes, runtime::ProcessGroup& pg) {
    if (bytes > bytes_) {
      TESSERA_CHECK(!runtime::stream_capturing(pg.stream()),
                    "{} inside a CUDA-graph capture: run the same call once eagerly before capturing it", growth_);
      if (p_) {
        if (keep_replaced_) {
          replaced_.push_back(p_);
        } else {
          if (drain_ == Drain::all_streams)
            pg.synchronize_all(growth_);
          else
            pg.synchronize(pg.stream(), growth_);
          TESSERA_CUDA_CHECK(cudaFree(p_));
        }
        p_ = nullptr;
        bytes_ = 0;
      }
      TESSERA_CUDA_CHECK(cudaMalloc(&p_, bytes));
      bytes_ = bytes;
    }
    return p_;
  }
  /// Room for `count` elements of T (at least one).
  template <class T>
  T* get(std::int64_t count, runtime::ProcessGroup& pg) {
    return static_cast<T*>(get(static_cast<std::size_t>(count > 0 ? count : 1) * sizeof(T), pg));
  }

 private:
  const char* growth_;
  Drain drain_;
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
  bool keep_replaced_ = false;
  std::vector<void*> replaced_;
};

/// Bounded waits for the compute stream and every communication stream of
/// the group; a wait on one of `signals` that cannot finish is reported and
/// released (link::synchronize), naming `what`.
inline void drain_streams(runtime::ProcessGroup& pg, std::initializer_list<const runtime::Signals*> signals,
                          const char* what) {
  link::synchronize(pg.stream(), signals, what);
  for (int i = 0; i < pg.comm_stream_count(); ++i) link::synchronize(pg.comm_stream(i), signals, what);
}

/// A symmetric workspace grown to at least `bytes`; collective (every rank
/// grows in the same call). Before the old window goes: drain_streams, then
/// a barrier, so no peer still pushes into or reads it. With `replaced`, the
/// old window moves there instead of being freed (a captured graph may hold
/// its address). Growth inside a capture of pg.stream() is an error naming
/// `what`.
inline void grow_symmetric(runtime::SymBuffer<unsigned char>& ws, std::size_t bytes, runtime::ProcessGroup& pg,
                           std::initializer_list<const runtime::Signals*> signals, const char* what,
                           std::vector<runtime::SymBuffer<unsigned char>>* replaced = nullptr) {
  if (!ws.empty() && ws.bytes() >= bytes) return;
  TESSERA_CHECK(!runtime::stream_capturing(pg.stream()),
                "{} inside a CUDA-graph capture: run the same call once eagerly before capturing it", what);
  drain_streams(pg, signals, what);
  pg.barrier();
  if (replaced != nullptr && !ws.empty()) replaced->push_back(std::move(ws));
  ws = runtime::SymBuffer<unsigned char>();
  ws = runtime::SymBuffer<unsigned char>(pg, bytes);
}

}  // namespace tessera::ops::detail
