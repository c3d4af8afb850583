// bench/common/device_buffer.hpp — device memory, random inputs and the
// current device for the benchmarks.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <random>

namespace tessera::bench {

/// cudaMalloc'd bytes, freed with the object.
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p(o.p) { o.p = nullptr; }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

/// Fills `n` 16-bit elements at `p` with random bf16 values in [-2, 2)
/// (never zeros; a block of up to 2^24 values drawn on the host, repeated).
void fill_random_16bit(void* p, std::size_t n, std::mt19937_64& rng);

/// The current device's properties (name, SM count) for the tables' headers.
cudaDeviceProp current_device_properties();

}  // namespace tessera::bench
