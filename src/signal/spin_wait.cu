// The spinning waiter of CommDriver (WaitMode::SpinKernel): one thread polls
// the group counter with ld.acquire.gpu until it reaches the target
// (counter_reached: cyclic, the same test as the stream memop wait); on
// timeout it fills the WaitRecord (link::record_wait_timeout), prints and
// traps.
#include <cstdio>

#include "tessera/link/device_primitives.cuh"
#include "tessera/signal/comm_driver.hpp"
#include "tessera/signal/device.cuh"

namespace tessera::signal::detail {
namespace {

__global__ void spin_wait_kernel(const std::uint32_t* counter, std::uint32_t target, std::uint64_t timeout_ns, int rank,
                                 int group, runtime::WaitRecord* record) {
  const std::uint64_t start = link::mo::globaltimer_ns();
  std::uint32_t seen = ld_acquire_gpu_u32(counter);
  while (!counter_reached(seen, target)) {  // cyclic, as cuStreamWaitValue32(GEQ)
    if (link::mo::globaltimer_ns() - start > timeout_ns) {
      link::record_wait_timeout(record, runtime::WaitKind::counter, rank, group, -1, -1, target, seen, timeout_ns);
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
