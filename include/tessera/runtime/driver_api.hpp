// tessera/runtime/driver_api.hpp — the few CUDA driver entry points Tessera
// needs (stream memory operations), obtained through the runtime's
// cudaGetDriverEntryPointByVersion so that the library does not link
// libcuda directly (CPU-only machines can load it and run the CPU tests).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessera::runtime::driver {

/// Enqueues a 64-bit store of `value` to `addr` on `stream`. Ordered after
/// the stream's preceding work and preceded by a system-scope memory fence
/// (the driver's default), i.e. a release store as seen by peers and host.
void stream_write_u64(cudaStream_t stream, std::uint64_t* addr, std::uint64_t value);

/// Same for a 32-bit value (e.g. releasing a group counter wait from the host
/// side after a timeout: no kernel, so no module load can block on the
/// stuck stream).
void stream_write_u32(cudaStream_t stream, std::uint32_t* addr, std::uint32_t value);

/// Enqueues a wait until *addr >= value on `stream` (no spinning kernel);
/// followed by a flush of remote writes where the device supports it, so
/// data written by peers before their release is visible to later work
/// (acquire).
void stream_wait_geq_u64(cudaStream_t stream, std::uint64_t* addr, std::uint64_t value);

/// Same for 32-bit values (group counters of the signal layer).
void stream_wait_geq_u32(cudaStream_t stream, std::uint32_t* addr, std::uint32_t value);

}  // namespace tessera::runtime::driver
