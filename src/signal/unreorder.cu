// Un-reorder and fused RMSNorm + un-reorder kernels (see unreorder.hpp).
//
// Fused RMSNorm: why it is shaped this way
// (the first version, two passes over a grid-stride row loop with the full
// map index math per 16-byte vector, ran +54..67% over plain RMSNorm on the
// AllReduce layout, device run 2 on H200):
//  - one CTA per output row, or per ROWS = 2/4 consecutive rows for rows of
//    <= 4 vectors per thread on tall matrices (rows_per_cta below: a short
//    row alone could not hide the table fill and its barrier; no grid-stride
//    loop, so no tail imbalance from a capped grid);
//  - the row's chunk offsets (one per BN-wide chunk: Nt = N/BN values, 64 for
//    N = 8192, BN = 128) are computed once per row by Nt threads into shared
//    memory, so the per-vector cost is one shared load and one add instead
//    of the map's 64-bit divisions and tile-order math;
//  - a thread's columns (vector v = tid + k*256, k < VPT) and their chunk /
//    in-chunk offsets do not depend on the row: computed once;
//  - single pass: the row stays in registers (VPT 16-byte vectors per
//    thread, VPT <= 8, i.e. N <= 16384 bf16/f16) between the sum of squares
//    and the scaled store, so the reordered buffer is read exactly once.
//    Wider rows fall back to a two-pass loop over the same table (the second
//    pass hits L2/L1).
// A warp reads 32 consecutive 16-byte vectors of the output row; with BN =
// 128 bf16 that is 2 chunks of 256 contiguous bytes (whole 128-byte lines).
// Prediction (to be checked by `tessera bench signal-kernels`): fused AR / RS
// / A2A within +2..8% of the plain RMSNorm that runs this same kernel on a
// RowMajorMap (one chunk per row); the plain kernel itself at or below the
// old 89.9 us for 8192x8192 bf16 (one read of the input instead of two).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tessera/runtime/env.hpp"
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


// Per-thread column plan: vector k of this thread is output vector
// v = threadIdx.x + k * kThreads of the row; chunk c = v / (BN/V) and the
// element offset inside the chunk. Row independent.
template <int VPT>
struct ColumnPlan {
  int chunk[VPT];
  int within[VPT];  // element offset inside the chunk; -1: no such vector
  __device__ ColumnPlan(int vecs, int vecs_per_chunk, int v_elems) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int v = threadIdx.x + k * kThreads;
      const int c = v / vecs_per_chunk;
      chunk[k] = c;
      within[k] = v < vecs ? (v - c * vecs_per_chunk) * v_elems : -1;
    }
  }
};

// Fills table[c] = map.chunk_offset(row, c) for the row's chunks (any number
// of chunks, strided over the block); the caller synchronizes.
template <class Map>
__device__ __forceinline__ void fill_chunk_table(const Map& map, std::int64_t row, int chunks, std::int64_t* table) {
  for (int c = threadIdx.x; c < chunks; c += kThreads) table[c] = map.chunk_offset(row, c);
}

// Sum over the block of one float per thread: warp shuffles, then every
// thread adds the kThreads/32 warp partials (a broadcast read). `partial`
// must not be rewritten before every thread has read it: a multi-row CTA
// gives each row its own array (a fast warp may write row r+1's partial
// while a slow one still reads row r's).
__device__ __forceinline__ float block_sum(float v, float* partial) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) s += partial[w];
  return s;
}

template <class T>
__device__ __forceinline__ float sum_sq(const int4& raw) {
  using P = Pack<T>;
  const typename P::T2* h = reinterpret_cast<const typename P::T2*>(&raw);
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {  // 16 bytes = 4 pairs
    const float2 f = P::to_float2(h[k]);
    ss += f.x * f.x + f.y * f.y;
  }
  return ss;
}

template <class T>
__device__ __forceinline__ int4 scale_vec(const int4& raw, const int4& wraw, float scale) {
  using P = Pack<T>;
  using T2 = typename P::T2;
  const T2* h = reinterpret_cast<const T2*>(&raw);
  const T2* w = reinterpret_cast<const T2*>(&wraw);
  int4 res;
  T2* o = reinterpret_cast<T2*>(&res);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 x = P::to_float2(h[k]), g = P::to_float2(w[k]);
    o[k] = P::from_float2(make_float2(x.x * scale * g.x, x.y * scale * g.y));
  }
  return res;
}

// Loads this thread's vectors of one output row through the row's chunk
// table (vector k only where it exists: cols.within[k] >= 0).
template <class T, int VPT>
__device__ __forceinline__ void load_row(const T* __restrict__ recv, const std::int64_t* table,
                                         const ColumnPlan<VPT>& cols, int4 (&x)[VPT]) {
#pragma unroll
  for (int k = 0; k < VPT; ++k)
    if (cols.within[k] >= 0) x[k] = __ldg(reinterpret_cast<const int4*>(recv + table[cols.chunk[k]] + cols.within[k]));
}

// Single pass, rows in registers: CTA b handles output rows
// [b*ROWS, min((b+1)*ROWS, rows)). One barrier after the chunk tables of all
// of its rows are filled (ROWS*chunks entries spread over the block, so the
// fill's index-math latency and the barrier are paid once per ROWS rows);
// then the rows go one after another, the loads of the next kDepth-1 rows
// issued before the current row is reduced (all ROWS rows in flight when
// ROWS*VPT <= 8 vectors per thread, i.e. the same 32 data registers as the
// VPT = 8 single-row case; otherwise one row ahead). Per row the sum of
// squares, the block reduction and the scaling are exactly those of ROWS = 1
// (same order, same operations): the result does not depend on ROWS, bit
// for bit. Dynamic shared memory: ROWS*chunks int64 (row r's table at
// r*chunks).
template <class Map, class T, int VPT, int ROWS>
__global__ void __launch_bounds__(kThreads) rmsnorm_unreorder_kernel(Map map, const T* __restrict__ recv,
                                                                     const T* __restrict__ weight,
                                                                     T* __restrict__ out, std::int64_t ld_out,
                                                                     float eps) {
  constexpr int V = 16 / sizeof(T);
  constexpr int kDepth = ROWS * VPT <= 8 ? ROWS : (ROWS > 1 ? 2 : 1);  // rows whose loads are in flight
  extern __shared__ std::int64_t chunk_table[];
  // One partial array per row: with a single barrier per CTA, row r+1's
  // partials must not overwrite row r's while a slower warp still reads them.
  __shared__ float partial[ROWS][kThreads / 32];
  const std::int64_t row0 = std::int64_t(blockIdx.x) * ROWS;
  const std::int64_t left = map.rows() - row0;
  const int here = left < ROWS ? static_cast<int>(left) : ROWS;  // the last CTA may get fewer rows
  const int n = static_cast<int>(map.cols());
  const int vecs = n / V;
  const int bn = map.chunk_width();
  const int chunks = (n + bn - 1) / bn;
  const ColumnPlan<VPT> cols(vecs, bn / V, V);
  if constexpr (ROWS == 1) {
    fill_chunk_table(map, row0, chunks, chunk_table);
  } else {
    for (int i = threadIdx.x; i < here * chunks; i += kThreads) {
      const int r = i / chunks;
      chunk_table[i] = map.chunk_offset(row0 + r, i - r * chunks);
    }
  }
  __syncthreads();
  int4 x[ROWS][VPT];
#pragma unroll
  for (int r = 0; r < kDepth - 1; ++r)
    if (r < here) load_row<T, VPT>(recv, chunk_table + r * chunks, cols, x[r]);
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    if (r + kDepth - 1 < ROWS && r + kDepth - 1 < here)
      load_row<T, VPT>(recv, chunk_table + (r + kDepth - 1) * chunks, cols, x[r + kDepth - 1]);
    if (r < here) {  // block-uniform: every thread reaches block_sum's barrier or none
      float ss = 0.f;
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (cols.within[k] >= 0) ss += sum_sq<T>(x[r][k]);
      const float scale = rsqrtf(block_sum(ss, partial[r]) / float(n) + eps);
      T* out_row = out + (row0 + r) * ld_out;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        if (cols.within[k] >= 0) {
          const int col = (threadIdx.x + k * kThreads) * V;
          const int4 w = __ldg(reinterpret_cast<const int4*>(weight + col));
          *reinterpret_cast<int4*>(out_row + col) = scale_vec<T>(x[r][k], w, scale);
        }
      }
    }
  }
}

// Rows wider than kThreads * 8 vectors: two passes over the same table (the
// second read of the row mostly hits L1/L2). One CTA per row.
template <class Map, class T>
__global__ void __launch_bounds__(kThreads) rmsnorm_unreorder_wide_kernel(Map map, const T* __restrict__ recv,
                                                                          const T* __restrict__ weight,
                                                                          T* __restrict__ out, std::int64_t ld_out,
                                                                          float eps) {
  constexpr int V = 16 / sizeof(T);
  extern __shared__ std::int64_t chunk_table[];
  __shared__ float partial[kThreads / 32];
  const std::int64_t row = blockIdx.x;
  const int n = static_cast<int>(map.cols());
  const int vecs = n / V;
  const int bn = map.chunk_width();
  const int vpc = bn / V;
  const int chunks = (n + bn - 1) / bn;
  fill_chunk_table(map, row, chunks, chunk_table);
  __syncthreads();
  float ss = 0.f;
  for (int v = threadIdx.x; v < vecs; v += kThreads) {
    const int c = v / vpc;
    ss += sum_sq<T>(__ldg(reinterpret_cast<const int4*>(recv + chunk_table[c] + (v - c * vpc) * V)));
  }
  const float scale = rsqrtf(block_sum(ss, partial) / float(n) + eps);
  T* out_row = out + row * ld_out;
  for (int v = threadIdx.x; v < vecs; v += kThreads) {
    const int c = v / vpc;
    const int4 x = __ldg(reinterpret_cast<const int4*>(recv + chunk_table[c] + (v - c * vpc) * V));
    const int4 w = __ldg(reinterpret_cast<const int4*>(weight + v * V));
    *reinterpret_cast<int4*>(out_row + v * V) = scale_vec<T>(x, w, scale);
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

template <class Map, class T, int VPT, int ROWS>
cudaError_t launch_rows(const Map& map, const void* recv, const void* weight, void* out, std::int64_t ld_out,
                        float eps, std::size_t table_bytes, cudaStream_t stream) {
  const auto grid = static_cast<unsigned>((map.rows() + ROWS - 1) / ROWS);
  rmsnorm_unreorder_kernel<Map, T, VPT, ROWS><<<grid, kThreads, table_bytes * ROWS, stream>>>(
      map, static_cast<const T*>(recv), static_cast<const T*>(weight), static_cast<T*>(out), ld_out, eps);
  return cudaGetLastError();
}

// Rows per CTA of the single-pass kernel (1, 2 or 4). Why more than one:
// with one CTA per row, a short row (VPT <= 2: N <= 4096 bf16/f16, 8 KiB)
// moves too little data to hide the CTA's fixed latency (the chunk-table
// fill's 64-bit index math, or the A2A table's global load, then a barrier
// before any row load can issue): +13..18% over the plain kernel at
// 4096x4096 bf16, while 8192-wide rows (twice the data per CTA) met the 10%
// target. So: ROWS = 4 when 4 * VPT <= 8 (a CTA then holds the same 8
// vectors per thread as one 16384-wide row, every row's loads in flight at
// once, 32 data registers), provided that
//  - a row has more than one chunk (a one-chunk row, the plain RMSNorm, has
//    no table cost to amortize and measured faster with one row per CTA);
//  - the grid still gives every SM at least 2 CTAs (rows / 4 >= 2 * sms):
//    fewer, fatter CTAs would leave SMs idle on short matrices;
//  - the 4 chunk tables fit the default 48 KiB of dynamic shared memory.
// Otherwise one row per CTA (ROWS = 2 measured slower than both).
// Cost (ptxas, sm_90a, bf16 VPT = 2): 62..64 registers per thread at ROWS =
// 4 instead of 32..40 at ROWS = 1, so 4 resident CTAs per SM instead of 6..8;
// still twice the bytes in flight per SM (4 x 256 x 8 x 16 B = 128 KiB).
// TESSERA_RMSNORM_ROWS = 1..4 (rounded down to 1, 2 or 4) forces the value
// for rows of up to 4 vectors per thread (N <= 8192 bf16/f16), for A/B
// timing; 0 or unset: the rule above. The 48 KiB limit still applies.
int rows_per_cta(std::int64_t rows, std::int64_t vpt, std::size_t table_bytes, int sms) {
  static const int forced = static_cast<int>(env::get_int("TESSERA_RMSNORM_ROWS", 0, 0, 4));
  int want = 1;
  if (forced > 0) {
    want = forced == 3 ? 2 : forced;  // 3 rounds down to 2
  } else if (table_bytes > sizeof(std::int64_t)) {
    // One chunk per row (the identity map, the plain RMSNorm): nothing to
    // amortize, and one row per CTA keeps more CTAs resident (4096x4096 bf16:
    // 25.4 us against 27.6 with four rows, session 8, call 6).
    // Four rows or one: two rows per CTA measured slower than either
    // (4096x4096 AR 35.8 us against 28.5-29.2; 8192x8192 AR 82.5 against
    // 78.0 with one; session 8, call 7), so 8192-wide rows keep one.
    if (4 * vpt <= 8 && rows / 4 >= 2 * std::int64_t(sms)) want = 4;
  }
  while (want > 1 && table_bytes * want > 48 * 1024) want /= 2;
  return want;
}

template <class Map, class T, int VPT>
cudaError_t launch_single_pass(const Map& map, const void* recv, const void* weight, void* out, std::int64_t ld_out,
                               float eps, std::size_t table_bytes, int sms, cudaStream_t stream) {
  switch (rows_per_cta(map.rows(), VPT, table_bytes, sms)) {
    case 4: return launch_rows<Map, T, VPT, 4>(map, recv, weight, out, ld_out, eps, table_bytes, stream);
    case 2: return launch_rows<Map, T, VPT, 2>(map, recv, weight, out, ld_out, eps, table_bytes, stream);
    default: return launch_rows<Map, T, VPT, 1>(map, recv, weight, out, ld_out, eps, table_bytes, stream);
  }
}

template <class Map, class T>
cudaError_t rmsnorm_t(const Map& map, const void* recv, const void* weight, void* out, std::int64_t ld_out, float eps,
                      int sms, cudaStream_t stream) {
  if (map.rows() == 0) return cudaSuccess;
  constexpr std::int64_t V = 16 / sizeof(T);
  // grid.x <= 2^31 - 1; one row's chunk table must fit the default 48 KiB
  // of dynamic shared memory (unreorder.cpp checks both).
  const std::int64_t vecs = map.cols() / V;
  const std::int64_t chunks = (map.cols() + map.chunk_width() - 1) / map.chunk_width();
  const std::size_t smem = static_cast<std::size_t>(chunks) * sizeof(std::int64_t);
  const std::int64_t vpt = (vecs + kThreads - 1) / kThreads;
  if (vpt <= 1) return launch_single_pass<Map, T, 1>(map, recv, weight, out, ld_out, eps, smem, sms, stream);
  if (vpt <= 2) return launch_single_pass<Map, T, 2>(map, recv, weight, out, ld_out, eps, smem, sms, stream);
  if (vpt <= 4) return launch_single_pass<Map, T, 4>(map, recv, weight, out, ld_out, eps, smem, sms, stream);
  // 16384-wide rows: one row already holds 8 vectors per thread.
  if (vpt <= 8) return launch_rows<Map, T, 8, 1>(map, recv, weight, out, ld_out, eps, smem, stream);
  rmsnorm_unreorder_wide_kernel<Map, T><<<static_cast<unsigned>(map.rows()), kThreads, smem, stream>>>(
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
