// bench/common/gpu_sleep.hpp — a GPU-side delay for the benchmarks' timing
// loops (gpu_sleep.cu, compiled with nvcc).
#pragma once

#include <cuda_runtime_api.h>

namespace tessera::bench {

/// Keeps `s` busy for at least `us` microseconds (one thread spinning on
/// the SM clock). Queued before a timed call, it lets the host enqueue the
/// whole call before the GPU reaches the start event, so the events time
/// the GPU's work, not the host's launch path: a call inside a model's step
/// is queued behind the work before it.
void gpu_sleep(double us, cudaStream_t s);

}  // namespace tessera::bench
