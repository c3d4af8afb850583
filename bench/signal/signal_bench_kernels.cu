#include "signal/signal_bench_kernels.hpp"

#include <cuda_bf16.h>

#include "tessera/kernels/gemm/launch.cuh"
#include "tessera/signal/epilogue.cuh"

namespace tessera::bench::signalb {
namespace {

__global__ void fill_kernel(__nv_bfloat16* p, std::int64_t n, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull ^ (std::uint64_t(i) * 0xBF58476D1CE4E5B9ull);
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    const float u = float(x >> 40) * (1.0f / float(1ull << 24));  // [0, 1)
    p[i] = __float2bfloat16_rn(2.f * u - 1.f + 1e-3f);
  }
}

}  // namespace

void fill_random_bf16(void* p, std::int64_t n, std::uint64_t seed, cudaStream_t s) {
  fill_kernel<<<1024, 256, 0, s>>>(static_cast<__nv_bfloat16*>(p), n, seed);
}

void gemm_into_groups(const kernels::GemmArgs& a, const kernels::GemmOptions& o,
                      const signal::GroupEpilogueArguments& epi, cudaStream_t s) {
  using Epi = signal::GroupEpilogue<__nv_bfloat16>;
  kernels::gemm_with<kernels::CooperativeTiles, __nv_bfloat16, kernels::BLayout::NK, kernels::BLayout::KN>(
      a, o, kernels::engine::NoWait{}, Epi::to_params(a, o, epi),
      kernels::engine::RasterScheduler{o.raster_group, o.raster_along_m, 0}, s);
}

}  // namespace tessera::bench::signalb
