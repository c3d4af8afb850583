// tessera/link/host_primitives.hpp — TileLink's rank-level primitives,
// host side: no spinning kernel, no SM taken.
//
//   rank_notify(stream, signals, dst_rank, slot, value)
//       enqueues a store of `value` into my flag `slot` on dst_rank
//       (cuStreamWriteValue64: after the stream's earlier work, preceded by a
//       system fence — a release as seen by dst_rank).
//   rank_wait(stream, signals, src_rank, slot, value)
//       enqueues a wait until src_rank's flag `slot` here is >= value
//       (cuStreamWaitValue64 GEQ, with a remote-write flush where supported —
//       the acquire). Stream waits cannot time out by themselves: wait for
//       the stream with link::synchronize, which does.
//   rank_copy_data(stream, dst, src, bytes)
//       a copy-engine transfer (cudaMemcpyAsync) between any two addresses
//       of the symmetric heap, local or peer.
//
// Flags are per source rank, so stores never race; use the epoch as value.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "tessera/runtime/signals.hpp"

namespace tessera::link {

void rank_notify(cudaStream_t stream, const runtime::Signals& signals, int dst_rank, int slot, std::uint64_t value);
void rank_wait(cudaStream_t stream, const runtime::Signals& signals, int src_rank, int slot, std::uint64_t value);
void rank_copy_data(cudaStream_t stream, void* dst, const void* src, std::size_t bytes);

/// Waits for `stream` to drain, at most TESSERA_WAIT_TIMEOUT_MS. If a device
/// wait trapped, throws an Error naming it. If the stream is stuck (e.g. a
/// rank_wait whose notify never comes), throws an Error naming every pending
/// rank_wait of `signals` with the value it expects and the value it sees,
/// after releasing those waits so the stream drains and nothing hangs.
void synchronize(cudaStream_t stream, const runtime::Signals& signals, const char* context = "synchronize");
/// The same when the stream's rank_waits use several Signals objects (each
/// one's pending waits are reported and released).
void synchronize(cudaStream_t stream, std::initializer_list<const runtime::Signals*> signals,
                 const char* context = "synchronize");

}  // namespace tessera::link
