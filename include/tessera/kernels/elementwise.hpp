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

/// SiLU·up of a gated MLP whose gate and up columns are interleaved (the
/// fused gate/up weight's layout): for r < rows, j < inter,
///   g = gu[r, 2j], u = gu[r, 2j + 1], h[r, j] = SiLU(g)·u,
/// in f32, rounded once to `dtype`. Training keeps gu for the backward.
/// Rows are packed (gu: 2·inter, h / dh: inter elements); pointers 16-byte
/// aligned; inter a multiple of 4 (rows are read as 16-byte vectors).
struct SwigluArgs {
  const void* gu = nullptr;  ///< [rows, 2·inter]
  void* h = nullptr;         ///< [rows, inter]: SiLU(g)·u (backward: optional, nullptr skips it)
  const void* dh = nullptr;  ///< backward: [rows, inter], the gradient of h
  void* dgu = nullptr;       ///< backward: [rows, 2·inter], interleaved as gu
  std::int64_t rows = 0, inter = 0;
  DType dtype = DType::bf16;
};

/// h = SiLU(g)·u. One pass: reads gu, writes h.
void swiglu_forward(const SwigluArgs& a, cudaStream_t stream);
/// dgu = (dh·u·σ(g)·(1 + g·(1 − σ(g))), dh·SiLU(g)) interleaved, and h =
/// SiLU(g)·u when a.h is set (the down projection's weight gradient needs
/// it; recomputing it here saves keeping it from the forward). One pass.
void swiglu_backward(const SwigluArgs& a, cudaStream_t stream);

/// out[c, r] = in[r, c] for a packed [rows, cols] matrix of 16-bit
/// elements (bf16 or f16): the transposed weight that a backward GEMM reads
/// as B [N, K]. Tiled through shared memory, so reads and writes are both
/// coalesced (a strided element copy runs at a fraction of the bandwidth).
void transpose_2d(const void* in, void* out, std::int64_t rows, std::int64_t cols, DType dtype, cudaStream_t stream);

/// Loads the add kernels' module now, so the first add_2d inside a timed or
/// overlapped region does not pay for lazy module loading.
void preload_add_2d();

}  // namespace tessera::kernels
