#include "common/gpu_sleep.hpp"

namespace tessera::bench {
namespace {

__global__ void sleep_kernel(unsigned ns) {
  // __nanosleep sleeps at most ~1 ms per call and may wake early: loop on the clock.
  const long long end = clock64() + (long long)ns * 2;  // >= ns at <= 2 GHz SM clocks
  while (clock64() < end) __nanosleep(1000);
}

}  // namespace

void gpu_sleep(double us, cudaStream_t s) { sleep_kernel<<<1, 1, 0, s>>>(static_cast<unsigned>(us * 1000)); }

}  // namespace tessera::bench
