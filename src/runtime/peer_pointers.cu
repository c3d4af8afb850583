// Resolves the addresses of a symmetric window on every rank. The window
// structure (ncclWindow_t) lives in device memory, so the lookup runs on
// the device, once per allocation.
#include <nccl_device.h>

#include "tessera/runtime/error.hpp"
#include "tessera/runtime/symmetric_heap.hpp"
#include "tessera/runtime/wait_diagnostics.hpp"

namespace tessera::runtime::detail {

namespace {
__global__ void peer_pointer_kernel(ncclWindow_t win, int world, void** out) {
  const int r = threadIdx.x;
  if (r < world) out[r] = ncclGetPeerPointer(win, 0, r);
}
}  // namespace

std::vector<void*> resolve_peer_pointers(ncclWindow_t win, int world, cudaStream_t stream) {
  TESSERA_CHECK(world > 0 && world <= kMaxPeers, "resolve_peer_pointers: world {} out of range", world);
  void** d = nullptr;
  TESSERA_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&d), sizeof(void*) * world, stream));
  peer_pointer_kernel<<<1, kMaxPeers, 0, stream>>>(win, world, d);
  TESSERA_CUDA_CHECK(cudaGetLastError());
  std::vector<void*> h(world);
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(h.data(), d, sizeof(void*) * world, cudaMemcpyDeviceToHost, stream));
  TESSERA_CUDA_CHECK(cudaFreeAsync(d, stream));
  bounded_sync(stream, "symmetric allocation: resolving peer pointers");  // the stream may hold a peer's work
  return h;
}

}  // namespace tessera::runtime::detail
