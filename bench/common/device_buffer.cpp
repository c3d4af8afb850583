#include "common/device_buffer.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "tessera/runtime/error.hpp"

namespace tessera::bench {

DeviceBuffer::DeviceBuffer(std::size_t bytes) { TESSERA_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 16))); }

DeviceBuffer::~DeviceBuffer() {
  if (p) cudaFree(p);  // destructor: nothing to report to
}

void fill_random_16bit(void* p, std::size_t n, std::mt19937_64& rng) {
  // Rounding a float per element on the host would be slow at these sizes:
  // one block of random values, copied over and over.
  std::vector<__nv_bfloat16> h(std::min<std::size_t>(n, std::size_t{1} << 24));
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (auto& x : h) x = __float2bfloat16(u(rng));
  for (std::size_t off = 0; off < n; off += h.size()) {
    const std::size_t cnt = std::min(h.size(), n - off);
    TESSERA_CUDA_CHECK(cudaMemcpy(static_cast<__nv_bfloat16*>(p) + off, h.data(), cnt * 2, cudaMemcpyHostToDevice));
  }
}

cudaDeviceProp current_device_properties() {
  cudaDeviceProp prop{};
  int dev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return prop;
}

}  // namespace tessera::bench
