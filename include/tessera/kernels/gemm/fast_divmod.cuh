// tessera/kernels/gemm/fast_divmod.cuh — division by a runtime constant as a
// multiply-high and a shift, made on the host, evaluated on either side.
// Used by the GEMM's tile scheduler (scheduler.cuh) and by the signal
// layer's un-reorder kernels (src/signal/fast_gather.hpp). Includable from
// host-only translation units (cuda_runtime_api.h defines __host__ /
// __device__ there). No memory-order content: pure arithmetic.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessera::kernels::engine {

/// n / d for 0 <= n < 2^31 by a multiply-high and a shift (Granlund and
/// Montgomery's round-up method; CUTLASS's tile schedulers do the same). An
/// integer division is a ~20-instruction dependent sequence (I2F, MUFU.RCP,
/// fix-ups), and the schedule is evaluated per tile by the TMA thread and by
/// every consumer at the tile boundary. Measured (docs/design/gemm-engine.md):
/// the plain kernel's own two divisions cost nothing visible, one more (the
/// old rotation's %) +0.3 %, and the GEMM+RS epilogue's 64-bit divisions
/// ~1 point; the walk is kept division-free so that what policies add on the
/// boundary is all there is. make() runs on the host; a FastDivmod that was
/// not made divides plainly on the host and must not reach device code.
struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t mul = 0;  ///< 0: not made (divide plainly)
  uint32_t shift = 0;

  static FastDivmod make(uint32_t d) {  // d >= 1
    uint32_t l = 0;
    while ((uint64_t{1} << l) < d) ++l;
    // m = floor(2^32 (2^l - d) / d) + 1 < 2^32 for d <= 2^31.
    const uint64_t m = ((uint64_t{1} << 32) * ((uint64_t{1} << l) - d)) / d + 1;
    return FastDivmod{d, static_cast<uint32_t>(m), l};
  }
  __host__ __device__ __forceinline__ uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, mul);
#else
    if (mul == 0) return n / divisor;
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * mul) >> 32);
#endif
    return (hi + n) >> shift;  // no overflow: hi <= n < 2^31
  }
};

}  // namespace tessera::kernels::engine
