// bench/gemm/bench_gemm_kernels.hpp — device helpers of `tessera bench gemm`
// compiled with nvcc (bench_gemm_kernels.cu; no fmt there).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/kernels/gemm.hpp"

namespace tessera::bench::gemm {

/// Fills n 16-bit values (bf16 or f16 per `t`) with uniform [-1, 1) noise
/// derived from `seed` (a counter hash: fresh data per seed, never zeros).
void fill_random(void* p, int64_t n, DType t, uint64_t seed, cudaStream_t s);

enum class Hooks { Both, WaitOnly, NotifyOnly, WaitPerTile };

/// The GEMM with hooks compiled in but idle: a FlagWait prologue whose flags
/// (one per 128 rows) already hold >= `epoch`, and/or a notify epilogue that
/// increments one counter per tile. bf16 in/out, B [N, K] only.
/// WaitPerTile: the same flags through a stateless prologue that acquires
/// every flag of every tile (ld.acquire) and so is proxy-fenced per tile —
/// the FlagWait before the memo, kept to measure what the memo saves.
void gemm_idle_hooks(Hooks which, const kernels::GemmArgs& a, const kernels::GemmOptions& o,
                     const uint32_t* ready_flags, uint32_t epoch, uint32_t* tile_counters, cudaStream_t s);

}  // namespace tessera::bench::gemm
