// tessera/signal/hd.hpp — TESSERA_HD: marks small index functions callable
// from host code and from CUDA device code (GEMM epilogues, un-reorder
// kernels). Plain `inline` when the translation unit is not compiled by nvcc.
#pragma once

#ifndef TESSERA_HD
#if defined(__CUDACC__)
#define TESSERA_HD __host__ __device__ __forceinline__
#else
#define TESSERA_HD inline
#endif
#endif
