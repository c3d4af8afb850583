// Un-reorder and fused RMSNorm + un-reorder kernels (see unreorder.hpp).
//
// Fused RMSNorm: why it is shaped this way
// (the first version, two passes over a grid-stride row loop with the full
// map index math per 16-byte vector, ran +54..67% over plain RMSNorm on the
// AllReduce layout, device run 2 on H200):
//  - one wave of CTAs, each a pipeline over its rows (row b, b + grid, ...:
//    rows_per_cta below): the next row's chunk table and loads are in flight
//    while the current row is reduced and stored, so the table fill and its
//    barrier are hidden (one CTA per row left them exposed: +13..18 % at
//    4096x4096 on the AR map, sessions 2-8);
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

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "fast_gather.hpp"
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
__global__ void __launch_bounds__(kThreads)
    unreorder_kernel(Map map, const T* __restrict__ recv, T* __restrict__ out, std::int64_t ld_out) {
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

// Resident CTAs per SM the single-pass kernel is compiled for (its register
// cap: 65536 / (256 * this)). Short rows are latency-bound per row, so their
// throughput follows the CTAs in flight per SM; left alone, ptxas gave the AR
// map's VPT = 1 kernel 48 registers (5 CTAs per SM) against the plain
// kernel's 32 (8). Measured (one H200, % over the plain kernel):
// the caps took AR 4096x2048 from +18 to +10 %, 4096x4096 from +2.9 to
// +1.6 %, A2A 16384x1024 from +12.8 to +7.2 %. No kernel spills under them
// (ptxas -v, sm_90a).
template <int VPT>
constexpr int kMinCtasPerSm = VPT <= 1   ? 8
                              : VPT <= 2 ? 5
                              : VPT <= 4 ? 3
                                         : 2;

// Single pass, rows in registers, a pipeline of rows per CTA: CTA b
// handles output rows b, b + grid, b + 2*grid, ... (rows_per_cta of them,
// the last CTAs one fewer). Per row the sum of squares, the block reduction
// and the scaling are exactly those of one row per CTA (same order, same
// operations): the result does not depend on the grid, bit for bit.
//
// Why a pipeline: with one CTA per row, every short row (N = 4096 bf16:
// 8 KiB) paid the CTA's fixed latency — the chunk-table fill (the map's
// index math), a barrier, then the loads — with nothing to hide it behind
// (4096x4096 AR +13..18 % over the plain kernel, sessions 2-8). Here the
// next row's table is filled, and the next row's loads are issued, while the
// current row is reduced and stored; the fixed latency is paid once per CTA.
//
// Schedule of row i (cur = i & 1, nxt = cur ^ 1); tables and partials are
// double-buffered and every hand-over goes through block_sum's barrier:
//   1. sum of squares of x (its loads were issued in step 3 of row i-1);
//   2. block_sum(partial[cur]) — its barrier also publishes table[nxt],
//      written in step 4 of row i-1;
//   3. issue row i+1's loads through table[nxt] into y (x = y after step 5);
//   4. fill table[cur] with row i+2's offsets. Safe: every thread read
//      table[cur] (row i's loads) before it arrived at row i's barrier;
//   5. scale and store row i.
// partial[cur] is rewritten by row i+2's step 2, after row i+1's barrier, by
// which point every thread has read row i's partials.
// Dynamic shared memory: 2 * chunks int64 (the two tables).
template <class Map, class T, int VPT>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm<VPT>)
    rmsnorm_unreorder_kernel(Map map, const T* __restrict__ recv, const T* __restrict__ weight, T* __restrict__ out,
                             std::int64_t ld_out, float eps) {
  constexpr int V = 16 / sizeof(T);
  extern __shared__ std::int64_t chunk_table[];  // [2][chunks]
  __shared__ float partial[2][kThreads / 32];
  const std::int64_t rows = map.rows();
  const std::int64_t step = gridDim.x;
  const int n = static_cast<int>(map.cols());
  const int vecs = n / V;
  const int bn = map.chunk_width();
  const int chunks = (n + bn - 1) / bn;
  const ColumnPlan<VPT> cols(vecs, bn / V, V);
  std::int64_t row = blockIdx.x;  // < rows: the grid has at most one CTA per row
  fill_chunk_table(map, row, chunks, chunk_table);
  __syncthreads();
  // x: the row being reduced; y: the next row's loads in flight.
  // Buffers are picked by offset arithmetic and a register copy, never by a
  // runtime array index (that would put x in local memory).
  int4 x[VPT], y[VPT];
  load_row<T, VPT>(recv, chunk_table, cols, x);
  if (row + step < rows) fill_chunk_table(map, row + step, chunks, chunk_table + chunks);
  for (int i = 0; row < rows; ++i, row += step) {
    const int cur = i & 1;
    std::int64_t* const table_cur = chunk_table + cur * chunks;
    const std::int64_t* const table_nxt = chunk_table + (cur ^ 1) * chunks;
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (cols.within[k] >= 0) ss += sum_sq<T>(x[k]);
    const float scale = rsqrtf(block_sum(ss, partial[cur]) / float(n) + eps);
    const bool more = row + step < rows;  // block-uniform
    if (more) load_row<T, VPT>(recv, table_nxt, cols, y);
    if (row + 2 * step < rows) fill_chunk_table(map, row + 2 * step, chunks, table_cur);
    T* out_row = out + row * ld_out;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (cols.within[k] >= 0) {
        const int col = (threadIdx.x + k * kThreads) * V;
        const int4 w = __ldg(reinterpret_cast<const int4*>(weight + col));
        *reinterpret_cast<int4*>(out_row + col) = scale_vec<T>(x[k], w, scale);
      }
    }
    if (more) {
      // Waits for y's loads (needed next anyway); no runtime set index.
#pragma unroll
      for (int k = 0; k < VPT; ++k) x[k] = y[k];
    }
  }
}

// Rows wider than kThreads * 8 vectors: two passes over the same table (the
// second read of the row mostly hits L1/L2). One CTA per row.
template <class Map, class T>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_unreorder_wide_kernel(Map map, const T* __restrict__ recv, const T* __restrict__ weight,
                                  T* __restrict__ out, std::int64_t ld_out, float eps) {
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
cudaError_t unreorder_t(const Map& map, const void* recv, void* out, std::int64_t ld_out, int sms,
                        cudaStream_t stream) {
  const std::int64_t total = map.rows() * (map.cols() / (16 / std::int64_t(sizeof(T))));
  if (total == 0) return cudaSuccess;
  unreorder_kernel<Map, T><<<grid_for(total, kThreads, sms), kThreads, 0, stream>>>(map, static_cast<const T*>(recv),
                                                                                    static_cast<T*>(out), ld_out);
  return cudaGetLastError();
}

// Rows per CTA of the pipelined single-pass kernel, and so its grid
// (ceil(rows / rows_per_cta) CTAs). The pipeline pays a CTA's fixed latency
// once for all of its rows, so one wave of CTAs — as many as fit on the GPU
// at once (occupancy x SMs) — is enough, and more only repeats that latency:
// rows_per_cta = ceil(rows / resident CTAs). A matrix with no more rows than
// resident CTAs keeps one row per CTA. TESSERA_RMSNORM_ROWS = k >= 1 forces k
// rows per CTA (A/B timing; read at every call so that a benchmark can
// compare values in one process); 0 or unset: the rule.
std::int64_t rows_per_cta(std::int64_t rows, int resident_ctas) {
  const std::int64_t forced = env::get_int("TESSERA_RMSNORM_ROWS", 0, 0, std::int64_t(1) << 30);
  if (forced > 0) return forced;
  const std::int64_t r = std::max(resident_ctas, 1);
  return (rows + r - 1) / r;
}

template <class Map, class T, int VPT>
cudaError_t launch_rows(const Map& map, const void* recv, const void* weight, void* out, std::int64_t ld_out, float eps,
                        std::size_t table_bytes, int sms, cudaStream_t stream) {
  const auto kernel = rmsnorm_unreorder_kernel<Map, T, VPT>;
  const std::size_t smem = 2 * table_bytes;  // two chunk tables
  // Resident CTAs per SM, queried once per kernel and shared-memory size (the
  // launch path runs per call): one atomic word holds (smem << 16 | per_sm),
  // so a reader never pairs one size with another's count. Threads racing
  // on a miss store the same value. The grid only sizes the work, never the
  // result.
  static std::atomic<std::uint64_t> cached{0};
  const std::uint64_t hit = cached.load(std::memory_order_relaxed);
  int per_sm = (hit >> 16) == smem ? static_cast<int>(hit & 0xffff) : 0;
  if (per_sm == 0) {
    const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem);
    if (e != cudaSuccess) return e;
    cached.store(std::uint64_t(smem) << 16 | std::uint64_t(per_sm & 0xffff), std::memory_order_relaxed);
  }
  const std::int64_t k = rows_per_cta(map.rows(), per_sm * sms);
  const auto grid = static_cast<unsigned>((map.rows() + k - 1) / k);
  kernel<<<grid, kThreads, smem, stream>>>(map, static_cast<const T*>(recv), static_cast<const T*>(weight),
                                           static_cast<T*>(out), ld_out, eps);
  return cudaGetLastError();
}

template <class Map, class T>
cudaError_t rmsnorm_t(const Map& map, const void* recv, const void* weight, void* out, std::int64_t ld_out, float eps,
                      int sms, cudaStream_t stream) {
  if (map.rows() == 0) return cudaSuccess;
  constexpr std::int64_t V = 16 / sizeof(T);
  // grid.x <= 2^31 - 1; two rows' chunk tables must fit the default 48 KiB
  // of dynamic shared memory (unreorder.cpp checks both).
  const std::int64_t vecs = map.cols() / V;
  const std::int64_t chunks = (map.cols() + map.chunk_width() - 1) / map.chunk_width();
  const std::size_t smem = static_cast<std::size_t>(chunks) * sizeof(std::int64_t);
  const std::int64_t vpt = (vecs + kThreads - 1) / kThreads;
  // The next row's loads are in flight at every width up to 16384 bf16/f16:
  // at VPT = 8 that is 121..128 registers (ptxas, sm_90a, no spills), still
  // the 2 CTAs per SM of a one-set kernel (94). More rows in flight (a ring
  // of 4 register sets, unrolled) measured slower at N <= 4096 (4096x4096
  // AR +29 % against +3..8 %: 100 registers, 2 CTAs per SM).
  if (vpt <= 1) return launch_rows<Map, T, 1>(map, recv, weight, out, ld_out, eps, smem, sms, stream);
  if (vpt <= 2) return launch_rows<Map, T, 2>(map, recv, weight, out, ld_out, eps, smem, sms, stream);
  if (vpt <= 4) return launch_rows<Map, T, 4>(map, recv, weight, out, ld_out, eps, smem, sms, stream);
  if (vpt <= 8) return launch_rows<Map, T, 8>(map, recv, weight, out, ld_out, eps, smem, sms, stream);
  rmsnorm_unreorder_wide_kernel<Map, T><<<static_cast<unsigned>(map.rows()), kThreads, smem, stream>>>(
      map, static_cast<const T*>(recv), static_cast<const T*>(weight), static_cast<T*>(out), ld_out, eps);
  return cudaGetLastError();
}

}  // namespace

// The kernels read every map through its fast gather form (fast_gather.hpp:
// the divisions by the map's constants precomputed on the host).
template <class Map>
cudaError_t launch_unreorder(const Map& map, const void* recv, void* out, std::int64_t ld_out, DType dtype, int sms,
                             cudaStream_t stream) {
  const auto g = fast_gather(map);
  using G = std::decay_t<decltype(g)>;
  switch (dtype) {
    case DType::bf16:
      return unreorder_t<G, __nv_bfloat16>(g, recv, out, ld_out, sms, stream);
    case DType::f16:
      return unreorder_t<G, __half>(g, recv, out, ld_out, sms, stream);
    case DType::f32:
      return unreorder_t<G, float>(g, recv, out, ld_out, sms, stream);
  }
  return cudaErrorInvalidValue;
}

template <class Map>
cudaError_t launch_rmsnorm_unreorder(const Map& map, const void* recv, const void* weight, void* out,
                                     std::int64_t ld_out, float eps, DType dtype, int sms, cudaStream_t stream) {
  const auto g = fast_gather(map);
  using G = std::decay_t<decltype(g)>;
  switch (dtype) {
    case DType::bf16:
      return rmsnorm_t<G, __nv_bfloat16>(g, recv, weight, out, ld_out, eps, sms, stream);
    case DType::f16:
      return rmsnorm_t<G, __half>(g, recv, weight, out, ld_out, eps, sms, stream);
    case DType::f32:
      break;  // rejected by the caller
  }
  return cudaErrorInvalidValue;
}

#define TESSERA_INSTANTIATE(Map)                                                                                       \
  template cudaError_t launch_unreorder<Map>(const Map&, const void*, void*, std::int64_t, DType, int, cudaStream_t);  \
  template cudaError_t launch_rmsnorm_unreorder<Map>(const Map&, const void*, const void*, void*, std::int64_t, float, \
                                                     DType, int, cudaStream_t);
TESSERA_INSTANTIATE(ArMap)
TESSERA_INSTANTIATE(RsShard)
TESSERA_INSTANTIATE(A2aRecvMap)
TESSERA_INSTANTIATE(RowMajorMap)
#undef TESSERA_INSTANTIATE

}  // namespace tessera::signal::detail
