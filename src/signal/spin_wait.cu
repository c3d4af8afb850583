// The spinning waiter of CommDriver (WaitMode::SpinKernel): one thread polls
// the group counter with ld.acquire.gpu until it reaches the target
// (counter_reached: cyclic, the same test as the stream memop wait); on
// timeout it fills the WaitRecord (first waiter wins), prints and traps.
#include <cstdio>

#include "tessera/signal/comm_driver.hpp"
#include "tessera/signal/device.cuh"

namespace tessera::signal::detail {
namespace {

__device__ __forceinline__ std::uint64_t globaltimer() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_wait_kernel(const std::uint32_t* counter, std::uint32_t target, std::uint64_t timeout_ns, int rank,
                                 int group, runtime::WaitRecord* record) {
  const std::uint64_t start = globaltimer();
  std::uint32_t seen = ld_acquire_gpu_u32(counter);
  while (!counter_reached(seen, target)) {  // cyclic, as cuStreamWaitValue32(GEQ)
    if (globaltimer() - start > timeout_ns) {
      if (record && atomicCAS_system(&record->claimed, 0u, 1u) == 0u) {
        record->kind = static_cast<int>(runtime::WaitKind::counter);
        record->rank = rank;
        record->tile = group;
        record->channel = -1;
        record->peer = -1;
        record->expected = target;
        record->seen = seen;
        record->timeout_ns = timeout_ns;
        __threadfence_system();
      }
      printf("tessera: rank %d: signal group %d counter wait timed out after %llu ns: expected >= %u, seen %u\n", rank,
             group, static_cast<unsigned long long>(timeout_ns), target, seen);
      __trap();
    }
    __nanosleep(128);
    seen = ld_acquire_gpu_u32(counter);
  }
}

}  // namespace

const void* spin_wait_kernel_address() { return reinterpret_cast<const void*>(&spin_wait_kernel); }

cudaError_t launch_spin_wait(const std::uint32_t* counter, std::uint32_t target, std::uint64_t timeout_ns, int rank,
                             int group, runtime::WaitRecord* record, cudaStream_t stream) {
  spin_wait_kernel<<<1, 1, 0, stream>>>(counter, target, timeout_ns, rank, group, record);
  return cudaGetLastError();
}

}  // namespace tessera::signal::detail
