// bench/signal/signal_bench_kernels.hpp — device helpers of `tessera bench
// signal` and `tessera bench signal-kernels`, compiled with nvcc
// (signal_bench_kernels.cu; no fmt there).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/kernels/gemm.hpp"

namespace tessera::bench::signalb {

/// Keeps `s` busy for at least `us` microseconds (one thread spinning on
/// the SM clock). Queued before a timed batch of short kernels, it lets the
/// host enqueue the batch before the GPU reaches the start event, so the
/// events time GPU work only, not the host's launch path.
void gpu_sleep(double us, cudaStream_t s);

/// n bf16 values, uniform in [-1, 1) from a counter hash of (seed, index):
/// fresh data per seed, never zeros.
void fill_random_bf16(void* p, std::int64_t n, std::uint64_t seed, cudaStream_t s);

/// The engine GEMM (bf16 in/out) writing its tiles through the signal
/// layer's GroupEpilogue (tables from signal::DeviceEpilogueTables) and
/// bumping `counters`. Tile order: RasterScheduler{o.raster_group, o.raster_along_m}.
void gemm_into_groups(const kernels::GemmArgs& a, const kernels::GemmOptions& o, void* buffer,
                      const std::int64_t* tile_base, const std::int64_t* seg_stride, const int* tile_group,
                      int sub_rows, int tile_n, std::uint32_t* counters, cudaStream_t s);

}  // namespace tessera::bench::signalb
