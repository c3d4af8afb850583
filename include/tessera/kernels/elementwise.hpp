// tessera/kernels/elementwise.hpp — element-wise kernels the operators and
// the CommIR executor share.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/runtime/dtype.hpp"

namespace tessera::kernels {

/// out[r, j] = x[r, j] + y[r, j] for r < rows, j < n, in f32, rounded to
/// `dtype` (bf16 or f16). Row strides in elements, multiples of 8 and
/// pointers 16-byte aligned (rows are read as 16-byte vectors, the ragged
/// tail of a row as scalars). `out` may be a peer's memory: every thread
/// fences at system scope after its stores, so they are performed before the
/// kernel retires and a stream-ordered flag write after it (link::rank_notify)
/// is their release.
struct Add2dArgs {
  const void* x = nullptr;
  std::int64_t ldx = 0;
  const void* y = nullptr;
  std::int64_t ldy = 0;
  void* out = nullptr;
  std::int64_t ldo = 0;
  std::int64_t rows = 0, n = 0;
  DType dtype = DType::bf16;
};

/// Launches the add on `stream` over at most `max_ctas` CTAs (the SMs it
/// may take from a concurrently running GEMM). Empty problems launch
/// nothing. Throws tessera::Error on a bad dtype, alignment or launch.
void add_2d(const Add2dArgs& a, int max_ctas, cudaStream_t stream);

/// Loads the add kernels' module now, so the first add_2d inside a timed or
/// overlapped region does not pay for lazy module loading.
void preload_add_2d();

}  // namespace tessera::kernels
