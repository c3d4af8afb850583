// bench/gemm/bench_rs_epilogue.hpp — the GEMM+RS fused_ce kernel on one GPU
// (bench_rs_epilogue.cu; `tessera bench gemm --rs-epilogue`).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/kernels/gemm.hpp"

namespace tessera::bench::gemm {

/// Current: src/ops' RsStageEpilogue. NoOwnerAdd / SkipAll: the same with
/// ops::DiagSkip bits (the owner's add; owner add + band wait + notify).
/// PlainRotated: the plain epilogue in the RS kernel's rotated tile order, no
/// hooks (d = a.d); PlainHere: the same launch unrotated (the library's plain
/// kernel, launched from this file: tells the order's cost from the launch
/// path's).
enum class RsEpi { Current, NoOwnerAdd, SkipAll, PlainRotated, PlainHere };

/// Buffers of a pretend 2-rank GEMM+RS at rank 0 (M rows, N columns, ld = N
/// rounded up to 8): stage and recv [2][M/2][ld], d [M/2][N], band_flags
/// [2][M/512] already >= 1, band_count [M/512] scratch.
struct RsEpilogueBuffers {
  void* stage = nullptr;
  const void* recv = nullptr;
  void* d = nullptr;
  const std::uint64_t* band_flags = nullptr;
  std::uint64_t* band_count = nullptr;
};

/// D = A · Bᵀ (bf16, B [N, K]) through the fused_ce kernel; a.d is used by PlainRotated only.
void gemm_rs_epilogue(RsEpi which, const kernels::GemmArgs& a, const RsEpilogueBuffers& b, cudaStream_t s);

}  // namespace tessera::bench::gemm
