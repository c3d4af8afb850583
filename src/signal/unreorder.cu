// Un-reorder and fused RMSNorm + un-reorder kernels (see unreorder.hpp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "unreorder_launch.hpp"

namespace tessera::signal::detail {
namespace {

constexpr int kThreads = 256;

template <class T>
struct Pack;  // 16 bytes of T as float pairs
template <>
struct Pack<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  static __device__ float2 to_float2(T2 v) { return __bfloat1622float2(v); }
  static __device__ T2 from_float2(float2 v) { return __float22bfloat162_rn(v); }
};
template <>
struct Pack<__half> {
  using T2 = __half2;
  static __device__ float2 to_float2(T2 v) { return __half22float2(v); }
  static __device__ T2 from_float2(float2 v) { return __float22half2_rn(v); }
};

// Source element offset of output (row, col); col is a multiple of the vector width.
template <class Map>
__device__ __forceinline__ std::int64_t src_of(const Map& map, std::int64_t row, std::int64_t col) {
  const int bn = map.chunk_width();
  const int c = static_cast<int>(col / bn);
  return map.chunk_offset(row, c) + (col - std::int64_t(c) * bn);
}

template <class Map, class T>
__global__ void __launch_bounds__(kThreads) unreorder_kernel(Map map, const T* __restrict__ recv, T* __restrict__ out,
                                                             std::int64_t ld_out) {
  constexpr int V = 16 / sizeof(T);
  const std::int64_t vecs_per_row = map.cols() / V;
  const std::int64_t total = map.rows() * vecs_per_row;
  for (std::int64_t t = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; t < total;
       t += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t r = t / vecs_per_row;
    const std::int64_t col = (t - r * vecs_per_row) * V;
    const int4 v = __ldg(reinterpret_cast<const int4*>(recv + src_of(map, r, col)));
    *reinterpret_cast<int4*>(out + r * ld_out + col) = v;
  }
}

__device__ __forceinline__ float block_sum(float v, float* smem) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < int(blockDim.x / 32) ? smem[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) smem[32] = v;
  }
  __syncthreads();
  const float s = smem[32];
  __syncthreads();  // smem is reused by the next row
  return s;
}

// One block per row (grid-stride). Pass 1: sum of squares; pass 2 re-reads
// the row (now in L1/L2), scales and stores.
template <class Map, class T>
__global__ void __launch_bounds__(kThreads) rmsnorm_unreorder_kernel(Map map, const T* __restrict__ recv,
                                                                     const T* __restrict__ weight,
                                                                     T* __restrict__ out, std::int64_t ld_out,
                                                                     float eps) {
  using P = Pack<T>;
  using T2 = typename P::T2;
  constexpr int V = 16 / sizeof(T);
  __shared__ float smem[33];
  const std::int64_t n = map.cols();
  const int vecs = static_cast<int>(n / V);
  for (std::int64_t r = blockIdx.x; r < map.rows(); r += gridDim.x) {
    float ss = 0.f;
    for (int v = threadIdx.x; v < vecs; v += blockDim.x) {
      const int4 raw = __ldg(reinterpret_cast<const int4*>(recv + src_of(map, r, std::int64_t(v) * V)));
      const T2* h = reinterpret_cast<const T2*>(&raw);
#pragma unroll
      for (int k = 0; k < V / 2; ++k) {
        const float2 f = P::to_float2(h[k]);
        ss += f.x * f.x + f.y * f.y;
      }
    }
    const float scale = rsqrtf(block_sum(ss, smem) / float(n) + eps);
    for (int v = threadIdx.x; v < vecs; v += blockDim.x) {
      const std::int64_t col = std::int64_t(v) * V;
      const int4 raw = __ldg(reinterpret_cast<const int4*>(recv + src_of(map, r, col)));
      const int4 wraw = __ldg(reinterpret_cast<const int4*>(weight + col));
      const T2* h = reinterpret_cast<const T2*>(&raw);
      const T2* w = reinterpret_cast<const T2*>(&wraw);
      int4 res;
      T2* o = reinterpret_cast<T2*>(&res);
#pragma unroll
      for (int k = 0; k < V / 2; ++k) {
        const float2 x = P::to_float2(h[k]), g = P::to_float2(w[k]);
        o[k] = P::from_float2(make_float2(x.x * scale * g.x, x.y * scale * g.y));
      }
      *reinterpret_cast<int4*>(out + r * ld_out + col) = res;
    }
  }
}

int grid_for(std::int64_t work, int per_block, int sms) {
  const std::int64_t want = (work + per_block - 1) / per_block;
  const std::int64_t cap = std::int64_t(sms) * 8;
  return static_cast<int>(want < cap ? (want > 0 ? want : 1) : cap);
}

template <class Map, class T>
cudaError_t unreorder_t(const Map& map, const void* recv, void* out, std::int64_t ld_out, int sms, cudaStream_t stream) {
  const std::int64_t total = map.rows() * (map.cols() / (16 / std::int64_t(sizeof(T))));
  if (total == 0) return cudaSuccess;
  unreorder_kernel<Map, T><<<grid_for(total, kThreads, sms), kThreads, 0, stream>>>(
      map, static_cast<const T*>(recv), static_cast<T*>(out), ld_out);
  return cudaGetLastError();
}

template <class Map, class T>
cudaError_t rmsnorm_t(const Map& map, const void* recv, const void* weight, void* out, std::int64_t ld_out, float eps,
                      int sms, cudaStream_t stream) {
  if (map.rows() == 0) return cudaSuccess;
  rmsnorm_unreorder_kernel<Map, T><<<grid_for(map.rows(), 1, sms), kThreads, 0, stream>>>(
      map, static_cast<const T*>(recv), static_cast<const T*>(weight), static_cast<T*>(out), ld_out, eps);
  return cudaGetLastError();
}

}  // namespace

template <class Map>
cudaError_t launch_unreorder(const Map& map, const void* recv, void* out, std::int64_t ld_out, DType dtype, int sms,
                             cudaStream_t stream) {
  switch (dtype) {
    case DType::bf16: return unreorder_t<Map, __nv_bfloat16>(map, recv, out, ld_out, sms, stream);
    case DType::f16: return unreorder_t<Map, __half>(map, recv, out, ld_out, sms, stream);
    case DType::f32: return unreorder_t<Map, float>(map, recv, out, ld_out, sms, stream);
  }
  return cudaErrorInvalidValue;
}

template <class Map>
cudaError_t launch_rmsnorm_unreorder(const Map& map, const void* recv, const void* weight, void* out,
                                     std::int64_t ld_out, float eps, DType dtype, int sms, cudaStream_t stream) {
  switch (dtype) {
    case DType::bf16: return rmsnorm_t<Map, __nv_bfloat16>(map, recv, weight, out, ld_out, eps, sms, stream);
    case DType::f16: return rmsnorm_t<Map, __half>(map, recv, weight, out, ld_out, eps, sms, stream);
    case DType::f32: break;  // rejected by the caller
  }
  return cudaErrorInvalidValue;
}

#define TESSERA_INSTANTIATE(Map)                                                                                \
  template cudaError_t launch_unreorder<Map>(const Map&, const void*, void*, std::int64_t, DType, int,        \
                                             cudaStream_t);                                                     \
  template cudaError_t launch_rmsnorm_unreorder<Map>(const Map&, const void*, const void*, void*, std::int64_t, \
                                                     float, DType, int, cudaStream_t);
TESSERA_INSTANTIATE(ArMap)
TESSERA_INSTANTIATE(RsShard)
TESSERA_INSTANTIATE(A2aRecvMap)
TESSERA_INSTANTIATE(RowMajorMap)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::signal::detail
