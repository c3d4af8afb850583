// bench/signal/signal_bench_kernels.hpp — device helpers of `tessera bench
// signal` and `tessera bench signal-kernels`, compiled with nvcc
// (signal_bench_kernels.cu; no fmt there).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/kernels/gemm.hpp"
#include "tessera/signal/epilogue_tables.hpp"

namespace tessera::bench::signalb {

/// n bf16 values, uniform in [-1, 1) from a counter hash of (seed, index):
/// fresh data per seed, never zeros.
void fill_random_bf16(void* p, std::int64_t n, std::uint64_t seed, cudaStream_t s);

/// The engine GEMM (bf16 in/out) writing its tiles through the signal
/// layer's GroupEpilogue (`epi`: the buffer, the group plan's device tables
/// and the counters it bumps). Tile order: RasterScheduler{o.raster_group, o.raster_along_m}.
void gemm_into_groups(const kernels::GemmArgs& a, const kernels::GemmOptions& o,
                      const signal::GroupEpilogueArguments& epi, cudaStream_t s);

}  // namespace tessera::bench::signalb
