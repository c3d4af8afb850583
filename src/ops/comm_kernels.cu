// Helper kernels of the TP operators: owner reduction, SM push of a shard,
// SiLU(gate)*up for the sequential path; and the dtype dispatch of the fused
// GEMMs (instantiated in fused_gemm_{bf16,f16}.cu).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tp_launchers.hpp"
#include "tessera/kernels/elementwise.hpp"
#include "tessera/kernels/gemm/host_detail.hpp"
#include "tessera/link/device_primitives.cuh"

namespace tessera::ops::detail {

void ag_gemm_bf16(const AgGemmArguments& p, cudaStream_t s);
void ag_gemm_f16(const AgGemmArguments& p, cudaStream_t s);
void gemm_rs_bf16(const GemmRsArguments& p, cudaStream_t s);
void gemm_rs_f16(const GemmRsArguments& p, cudaStream_t s);
void preload_bf16();
void preload_f16();

void launch_ag_gemm(const AgGemmArguments& p, cudaStream_t s) {
  if (p.problem.in == DType::f16) return ag_gemm_f16(p, s);
  return ag_gemm_bf16(p, s);
}

void launch_gemm_rs(const GemmRsArguments& p, cudaStream_t s) {
  if (p.problem.in == DType::f16) return gemm_rs_f16(p, s);
  return gemm_rs_bf16(p, s);
}

namespace {

template <class T>
__device__ __forceinline__ float to_f(T v);
template <>
__device__ __forceinline__ float to_f(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_f(__half v) {
  return __half2float(v);
}
template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f(float v) {
  return __float2half_rn(v);
}

/// One tile row per CTA iteration: wait (one thread, acquire .sys), barrier,
/// sum the R slabs in rank order 0..R-1 in f32, store; barrier, consume.
template <class T>
__global__ void reduce_kernel(ReduceLaunch p) {
  const T* slabs = static_cast<const T*>(p.slabs);
  T* out = static_cast<T*>(p.out);
  const std::int64_t row_end = p.row0 + p.rows;
  const int t_lo = static_cast<int>(p.row0 / p.tile_m);
  const int t_hi = static_cast<int>((row_end + p.tile_m - 1) / p.tile_m);
  const bool vec = (p.n % 8 == 0) && (p.ldo % 8 == 0);
  for (int t = t_lo + blockIdx.x; t < t_hi; t += gridDim.x) {
    if (p.counters != nullptr && threadIdx.x == 0) link::counter_wait_at(p.sv, p.counters + t, p.expected, t);
    __syncthreads();
    const std::int64_t lo =
        t * static_cast<std::int64_t>(p.tile_m) > p.row0 ? t * static_cast<std::int64_t>(p.tile_m) : p.row0;
    const std::int64_t hi = (t + 1) * static_cast<std::int64_t>(p.tile_m) < row_end
                                ? (t + 1) * static_cast<std::int64_t>(p.tile_m)
                                : row_end;
    const std::int64_t per_row = vec ? p.n / 8 : p.n;
    const std::int64_t total = (hi - lo) * per_row;
    for (std::int64_t i = threadIdx.x; i < total; i += blockDim.x) {
      const std::int64_t lr = lo - p.row0 + i / per_row;  // row local to this rank
      const std::int64_t c = (i % per_row) * (vec ? 8 : 1);
      if (vec) {
        // Issue every slab's load before the first add (independent loads in
        // flight: a serial load-add loop left one 16-byte load per thread in
        // flight and starved the reduction of bandwidth); sum in rank order.
        uint4 u[runtime::kMaxPeers];
#pragma unroll
        for (int s = 0; s < runtime::kMaxPeers; ++s)
          if (s < p.world) u[s] = *reinterpret_cast<const uint4*>(slabs + (s * p.per_rank + lr) * p.ld_recv + c);
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
        for (int s = 0; s < runtime::kMaxPeers; ++s) {
          if (s >= p.world) break;
          const T* e = reinterpret_cast<const T*>(&u[s]);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[j] += to_f(e[j]);
        }
        uint4 o;
        T* oe = reinterpret_cast<T*>(&o);
#pragma unroll
        for (int j = 0; j < 8; ++j) oe[j] = from_f<T>(acc[j]);
        *reinterpret_cast<uint4*>(out + lr * p.ldo + c) = o;
      } else {
        float acc = 0;
        for (int s = 0; s < p.world; ++s) acc += to_f(slabs[(s * p.per_rank + lr) * p.ld_recv + c]);
        out[lr * p.ldo + c] = from_f<T>(acc);
      }
    }
    __syncthreads();
    // Consume this call's notifications. Relaxed is enough: the next call's
    // producers only start after this kernel completes (kRsFree, stream order).
    if (p.counters != nullptr && threadIdx.x == 0)
      atomicAdd(reinterpret_cast<unsigned long long*>(p.counters + t), 0ull - p.expected);
  }
}

/// Chunks in step order; every CTA pushes its slice of a chunk
/// (link::tile_push_data), then the last CTA to finish it
/// (link::last_cta_arrive) release-stores the flag at the destination.
__global__ void push_kernel(PushLaunch p) {
  const int total = p.steps * p.channels;
  const char* src_base = static_cast<const char*>(p.ws[p.sv.rank]);
  for (int q = 0; q < total; ++q) {
    const int j = q / p.channels, c = q % p.channels;
    const int dst = p.push_to[j];
    std::int64_t c_lo = c * p.rows_per_channel;
    std::int64_t c_hi = c_lo + p.rows_per_channel;
    if (c_hi > p.rows) c_hi = p.rows;
    if (c_lo > c_hi) c_lo = c_hi;
    const std::int64_t nrows = c_hi - c_lo;
    const std::int64_t per_block = (nrows + gridDim.x - 1) / gridDim.x;
    std::int64_t b_lo = c_lo + per_block * blockIdx.x;
    std::int64_t b_hi = b_lo + per_block;
    if (b_hi > c_hi) b_hi = c_hi;
    if (b_lo < b_hi)
      link::tile_push_data(static_cast<char*>(p.ws[dst]), p.row_bytes, p.lo + b_lo, src_base, p.row_bytes, p.lo + b_lo,
                           b_hi - b_lo, p.row_bytes, threadIdx.x, blockDim.x);
    __syncthreads();
    if (threadIdx.x == 0 && link::last_cta_arrive<link::Scope::sys>(p.done + q, gridDim.x))
      link::flag_notify<link::Scope::sys>(p.sv.flag_at(dst, c), p.epoch);
  }
}

template <class T>
__global__ void swiglu_kernel(const T* in, std::int64_t ld_in, T* out, std::int64_t ld_out, std::int64_t rows,
                              std::int64_t n_out) {
  const std::int64_t total = rows * n_out;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / n_out, j = i % n_out;
    const float g = to_f(in[r * ld_in + 2 * j]), u = to_f(in[r * ld_in + 2 * j + 1]);
    out[r * ld_out + j] = from_f<T>(g / (1.0f + __expf(-g)) * u);
  }
}

}  // namespace

void launch_reduce(const ReduceLaunch& p, int ctas, cudaStream_t s) {
  if (p.rows <= 0) return;
  if (p.dtype == DType::f16)
    reduce_kernel<__half><<<ctas, 512, 0, s>>>(p);
  else
    reduce_kernel<__nv_bfloat16><<<ctas, 512, 0, s>>>(p);
  kernels::detail::check_launch("ops: reduce kernel launch");
}

void launch_push(const PushLaunch& p, int ctas, cudaStream_t s) {
  push_kernel<<<ctas, 512, 0, s>>>(p);
  kernels::detail::check_launch("ops: push kernel launch");
}

void launch_swiglu(const void* in, std::int64_t ld_in, void* out, std::int64_t ld_out, std::int64_t rows,
                   std::int64_t n_out, DType dtype, cudaStream_t s) {
  const std::int64_t total = rows * n_out;
  const int blocks = static_cast<int>(total / 1024 + 1 < 4096 ? total / 1024 + 1 : 4096);
  if (dtype == DType::f16)
    swiglu_kernel<__half>
        <<<blocks, 256, 0, s>>>(static_cast<const __half*>(in), ld_in, static_cast<__half*>(out), ld_out, rows, n_out);
  else
    swiglu_kernel<__nv_bfloat16><<<blocks, 256, 0, s>>>(static_cast<const __nv_bfloat16*>(in), ld_in,
                                                        static_cast<__nv_bfloat16*>(out), ld_out, rows, n_out);
  kernels::detail::check_launch("ops: swiglu kernel launch");
}

namespace {
__global__ void copy_rows_kernel(uint4* dst, std::int64_t dst_pitch, const uint4* src, std::int64_t src_pitch,
                                 std::int64_t vec_per_row, std::int64_t total) {
  // Plain loads and stores: the consumer is the next kernel on this stream.
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / vec_per_row, c = i - r * vec_per_row;
    dst[r * dst_pitch + c] = src[r * src_pitch + c];
  }
}
}  // namespace

void launch_copy_rows(void* dst, std::int64_t dst_pitch, const void* src, std::int64_t src_pitch,
                      std::int64_t row_bytes, std::int64_t rows, cudaStream_t s) {
  if (rows <= 0 || row_bytes <= 0) return;
  if (row_bytes % 16 || dst_pitch % 16 || src_pitch % 16 || reinterpret_cast<std::uintptr_t>(dst) % 16 ||
      reinterpret_cast<std::uintptr_t>(src) % 16)
    kernels::detail::fail("ops: copy_rows needs 16-byte rows, pitches and addresses");
  const std::int64_t vec = row_bytes / 16, total = vec * rows;
  const int blocks = static_cast<int>(total / 2048 + 1 < 1056 ? total / 2048 + 1 : 1056);
  copy_rows_kernel<<<blocks, 256, 0, s>>>(static_cast<uint4*>(dst), dst_pitch / 16, static_cast<const uint4*>(src),
                                          src_pitch / 16, vec, total);
  kernels::detail::check_launch("ops: copy_rows kernel launch");
}

namespace {
// bf16 values in [-1, 1) from a hash of the index (the tuner's load GEMM:
// zeros would draw less power than real operands).
__global__ void fill_bf16_kernel(__nv_bfloat16* p, std::int64_t count, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < count;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 0x9E3779B9u ^ seed;
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    p[i] = __float2bfloat16(static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}
}  // namespace

void launch_fill_bf16(void* p, std::int64_t count, std::uint32_t seed, cudaStream_t s) {
  fill_bf16_kernel<<<528, 256, 0, s>>>(static_cast<__nv_bfloat16*>(p), count, seed);
  kernels::detail::check_launch("ops: fill kernel launch");
}

void preload_kernels() {
  cudaFuncAttributes attr{};
  kernels::detail::cuda_check(cudaFuncGetAttributes(&attr, reduce_kernel<__half>), "ops: preload reduce");
  kernels::detail::cuda_check(cudaFuncGetAttributes(&attr, reduce_kernel<__nv_bfloat16>), "ops: preload reduce");
  kernels::detail::cuda_check(cudaFuncGetAttributes(&attr, push_kernel), "ops: preload push");
  kernels::detail::cuda_check(cudaFuncGetAttributes(&attr, copy_rows_kernel), "ops: preload copy_rows");
  kernels::detail::cuda_check(cudaFuncGetAttributes(&attr, fill_bf16_kernel), "ops: preload fill");
  preload_bf16();
  preload_f16();
  kernels::preload_add_2d();
}

}  // namespace tessera::ops::detail
