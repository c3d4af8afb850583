// Ring GEMM+ReduceScatter's reduction step (Strategy::ring): the f32 add of
// the running sum received from rank r+1 and this rank's partial, written to
// rank r-1's receive slab (peer stores) or, at the last step, to D.
// Memory order: plain (possibly NVLink peer) stores, then one
// __threadfence_system per thread so they are performed at system scope
// before the kernel retires; the host enqueues rank_notify (system-fenced
// stream write) after this kernel: that store is the release the receiver's
// rank_wait acquires.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "device_ops.hpp"
#include "tessera/kernels/gemm/host_detail.hpp"

namespace tessera::ops::detail {

namespace {

template <class T>
__device__ __forceinline__ float to_f(T v);
template <>
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ __half from_f(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f(float v) { return __float2bfloat16_rn(v); }

/// One thread per 8-column group of a row: a 16-byte vector where the group
/// is full (rows start 16-byte aligned: ld % 8 == 0), scalars in the tail.
template <class T>
__global__ void ring_add_kernel(const T* __restrict__ x, std::int64_t ldx, const T* __restrict__ y,
                                std::int64_t ldy, T* out, std::int64_t ldo, std::int64_t rows, std::int64_t n) {
  const std::int64_t groups = (n + 7) / 8;
  const std::int64_t total = rows * groups;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / groups, c0 = (i % groups) * 8;
    const T* xr = x + r * ldx + c0;
    const T* yr = y + r * ldy + c0;
    T* orow = out + r * ldo + c0;
    if (c0 + 8 <= n) {
      const uint4 xv = *reinterpret_cast<const uint4*>(xr);
      const uint4 yv = *reinterpret_cast<const uint4*>(yr);
      const T* xe = reinterpret_cast<const T*>(&xv);
      const T* ye = reinterpret_cast<const T*>(&yv);
      uint4 ov;
      T* oe = reinterpret_cast<T*>(&ov);
#pragma unroll
      for (int e = 0; e < 8; ++e) oe[e] = from_f<T>(to_f(xe[e]) + to_f(ye[e]));
      *reinterpret_cast<uint4*>(orow) = ov;
    } else {
      for (std::int64_t e = 0; c0 + e < n; ++e) orow[e] = from_f<T>(to_f(xr[e]) + to_f(yr[e]));
    }
  }
  __threadfence_system();
}

}  // namespace

void launch_add(const AddLaunch& p, int ctas, cudaStream_t s) {
  if (p.rows <= 0 || p.n <= 0) return;
  const std::int64_t work = p.rows * ((p.n + 7) / 8);
  const std::int64_t need = (work + 255) / 256;
  const int blocks = static_cast<int>(need < ctas ? need : ctas);
  if (p.dtype == DType::f16)
    ring_add_kernel<__half><<<blocks, 256, 0, s>>>(static_cast<const __half*>(p.x), p.ldx,
                                                   static_cast<const __half*>(p.y), p.ldy,
                                                   static_cast<__half*>(p.out), p.ldo, p.rows, p.n);
  else
    ring_add_kernel<__nv_bfloat16><<<blocks, 256, 0, s>>>(
        static_cast<const __nv_bfloat16*>(p.x), p.ldx, static_cast<const __nv_bfloat16*>(p.y), p.ldy,
        static_cast<__nv_bfloat16*>(p.out), p.ldo, p.rows, p.n);
  kernels::detail::check_launch("ops: ring add kernel launch");
}

void preload_ring() {
  cudaFuncAttributes attr{};
  kernels::detail::cuda_check(cudaFuncGetAttributes(&attr, ring_add_kernel<__half>), "ops: preload ring add");
  kernels::detail::cuda_check(cudaFuncGetAttributes(&attr, ring_add_kernel<__nv_bfloat16>), "ops: preload ring add");
}

}  // namespace tessera::ops::detail
