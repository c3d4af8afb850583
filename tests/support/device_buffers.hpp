// Small helpers of the GPU tests: a device buffer, a download, bf16 bits to
// float, and the Hopper check of the tests whose kernels need sm_90.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "support/test_support.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::testing {

/// cudaMalloc'd bytes (at least 256, so empty problems still get a valid pointer).
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(std::size_t bytes) { TESSERA_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 256))); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

/// n elements of device memory at p, copied to the host.
template <class T>
std::vector<T> download(const void* p, std::size_t n) {
  std::vector<T> h(n);
  TESSERA_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

/// A bf16 value given by its bits.
inline float bf16_to_float(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// True (with the reason) when there is no GPU or it is not an sm_90 part.
inline bool hopper_skip_reason(std::string* why) {
  if (visible_gpus() < 1) return *why = "needs a GPU", true;
  int major = 0;
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major != 9) return *why = "needs an sm_90 (Hopper) GPU", true;
  return false;
}

}  // namespace tessera::testing
