// tessera/runtime/host_device.hpp — TESSERA_HD: marks small index functions
// callable from host code and from CUDA device code (tile maps, GEMM
// epilogues, un-reorder kernels). Plain `inline` when the translation unit
// is not compiled by nvcc. The one definition every layer includes.
#pragma once

#if defined(__CUDACC__)
#define TESSERA_HD __host__ __device__ __forceinline__
#else
#define TESSERA_HD inline
#endif
