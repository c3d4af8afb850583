// The spinning waiter of CommDriver (WaitMode::SpinKernel): one thread waits
// for the group counter with link::wait_until at Scope::gpu (acquire),
// using counter_reached (cyclic, the same test as the stream memop wait); on
// timeout it fills the WaitRecord, prints the same line and traps.
#include <cstdio>

#include "tessera/link/wait.cuh"
#include "tessera/signal/comm_driver.hpp"

namespace tessera::signal::detail {
namespace {

/// The waiter's timeout report: this kernel holds no wgmma, so it may call
/// printf.
struct PrintTimeout {
  int rank, group;
  std::uint32_t target;
  std::uint64_t timeout_ns;
  __device__ void operator()(std::uint64_t seen) const {
    printf("tessera: rank %d: signal group %d counter wait timed out after %llu ns: expected >= %u, seen %u\n", rank,
           group, static_cast<unsigned long long>(timeout_ns), target, static_cast<std::uint32_t>(seen));
  }
};

__global__ void spin_wait_kernel(const std::uint32_t* counter, std::uint32_t target, std::uint64_t timeout_ns, int rank,
                                 int group, runtime::WaitRecord* record) {
  link::wait_until<link::Scope::gpu>(
      counter, [target](std::uint32_t seen) { return counter_reached(seen, target); }, target,
      link::WaitLimit{timeout_ns, record}, link::WaitSite{runtime::WaitKind::counter, rank, group},
      PrintTimeout{rank, group, target, timeout_ns});
}

}  // namespace

const void* spin_wait_kernel_address() { return reinterpret_cast<const void*>(&spin_wait_kernel); }

cudaError_t launch_spin_wait(const std::uint32_t* counter, std::uint32_t target, std::uint64_t timeout_ns, int rank,
                             int group, runtime::WaitRecord* record, cudaStream_t stream) {
  spin_wait_kernel<<<1, 1, 0, stream>>>(counter, target, timeout_ns, rank, group, record);
  return cudaGetLastError();
}

}  // namespace tessera::signal::detail
