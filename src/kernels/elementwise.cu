// Element-wise kernels (tessera/kernels/elementwise.hpp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "convert.cuh"
#include "tessera/kernels/elementwise.hpp"
#include "tessera/kernels/gemm/host_detail.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::kernels {
namespace {

using detail::from_f32;
using detail::to_f32;

/// One thread per 8-column group of a row: a 16-byte vector where the group
/// is full, scalars in the tail.
template <class T>
__global__ void add_2d_kernel(const T* __restrict__ x, std::int64_t ldx, const T* __restrict__ y, std::int64_t ldy,
                              T* out, std::int64_t ldo, std::int64_t rows, std::int64_t n) {
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
      for (int e = 0; e < 8; ++e) oe[e] = from_f32<T>(to_f32(xe[e]) + to_f32(ye[e]));
      *reinterpret_cast<uint4*>(orow) = ov;
    } else {
      for (std::int64_t e = 0; c0 + e < n; ++e) orow[e] = from_f32<T>(to_f32(xr[e]) + to_f32(yr[e]));
    }
  }
  __threadfence_system();
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

/// Four (gate, up) pairs per thread: 16 bytes of gu, 8 of h / dh.
template <class T>
struct Quad {
  T v[4];
};
template <class T>
struct Oct {
  T v[8];
};

template <class T, bool kBackward>
__global__ void swiglu_kernel(const Oct<T>* __restrict__ gu, Quad<T>* h, const Quad<T>* __restrict__ dh, Oct<T>* dgu,
                              std::int64_t quads) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < quads;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const Oct<T> x = gu[i];
    Quad<T> d{};
    if constexpr (kBackward) d = dh[i];
    Quad<T> hv;
    Oct<T> gv;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float g = to_f32(x.v[2 * e]), u = to_f32(x.v[2 * e + 1]);
      const float sg = 1.f / (1.f + __expf(-g));
      const float silu = g * sg;
      hv.v[e] = from_f32<T>(silu * u);
      if constexpr (kBackward) {
        const float dy = to_f32(d.v[e]);
        gv.v[2 * e] = from_f32<T>(dy * u * sg * (1.f + g * (1.f - sg)));
        gv.v[2 * e + 1] = from_f32<T>(dy * silu);
      }
    }
    if (h != nullptr) h[i] = hv;
    if constexpr (kBackward) dgu[i] = gv;
  }
}

/// Any shape: one 32x32 tile of 16-bit elements per block of 32x8 threads,
/// 4 rows each in, 4 rows each out (64-byte rows per warp access).
__global__ void transpose_kernel(const std::uint16_t* __restrict__ in, std::uint16_t* __restrict__ out,
                                 std::int64_t rows, std::int64_t cols) {
  __shared__ std::uint16_t tile[32][33];
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * 32, c0 = static_cast<std::int64_t>(blockIdx.x) * 32;
#pragma unroll
  for (int i = threadIdx.y; i < 32; i += 8) {
    const std::int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = in[r * cols + c];
  }
  __syncthreads();
#pragma unroll
  for (int i = threadIdx.y; i < 32; i += 8) {
    const std::int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (c < cols && r < rows) out[c * rows + r] = tile[threadIdx.x][i];
  }
}

/// Even rows and cols, 4-byte aligned: one 64x64 tile per block of 32x8
/// threads, moved as 32-bit pairs so every warp access is a 128-byte row.
/// Thread x loads pair x of input rows y, y+8, ..., then builds output pair
/// x of output rows 2w and 2w+1 from input rows 2x and 2x+1 (column pair w).
/// The shared tile is XOR-swizzled by row pair (word w of row i sits at
/// w ^ (i/2 % 32)) so both the row-wise stores and the row-pair reads hit 32
/// distinct banks.
__global__ void transpose_pairs_kernel(const std::uint32_t* __restrict__ in, std::uint32_t* __restrict__ out,
                                       std::int64_t rows, std::int64_t cols) {
  __shared__ std::uint32_t tile[64][32];
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * 64, c0 = static_cast<std::int64_t>(blockIdx.x) * 64;
  const std::int64_t in_words = cols / 2, out_words = rows / 2;
  const int x = threadIdx.x;
#pragma unroll
  for (int i = threadIdx.y; i < 64; i += 8) {
    const std::int64_t r = r0 + i, w = c0 / 2 + x;
    if (r < rows && w < in_words) tile[i][x ^ ((i / 2) & 31)] = in[r * in_words + w];
  }
  __syncthreads();
  const bool row_pair_in = r0 / 2 + x < out_words;
#pragma unroll
  for (int w = threadIdx.y; w < 32; w += 8) {
    const std::int64_t c = c0 + 2 * w;
    if (c >= cols || !row_pair_in) continue;
    const std::uint32_t lo = tile[2 * x][w ^ x], hi = tile[2 * x + 1][w ^ x];  // input rows 2x, 2x+1
    out[c * out_words + r0 / 2 + x] = __byte_perm(lo, hi, 0x5410);             // column c: low halves
    out[(c + 1) * out_words + r0 / 2 + x] = __byte_perm(lo, hi, 0x7632);       // column c + 1: high halves
  }
}

template <bool kBackward>
void launch_swiglu(const SwigluArgs& a, cudaStream_t stream, const char* what) {
  if (a.rows <= 0 || a.inter <= 0) return;
  TESSERA_CHECK(a.dtype == DType::bf16 || a.dtype == DType::f16, "{}: dtype {} not supported (bf16 or f16)", what,
                dtype_name(a.dtype));
  TESSERA_CHECK(a.inter % 4 == 0, "{}: inter = {} must be a multiple of 4", what, a.inter);
  TESSERA_CHECK(a.gu != nullptr && aligned16(a.gu), "{}: gu = {} must be non-null and 16-byte aligned", what, a.gu);
  TESSERA_CHECK(kBackward || a.h != nullptr, "{}: h is null", what);
  TESSERA_CHECK(a.h == nullptr || aligned16(a.h), "{}: h = {} must be 16-byte aligned", what, a.h);
  if (kBackward)
    TESSERA_CHECK(a.dh != nullptr && a.dgu != nullptr && aligned16(a.dh) && aligned16(a.dgu),
                  "{}: dh = {} and dgu = {} must be non-null and 16-byte aligned", what, a.dh, a.dgu);
  TESSERA_CHECK(a.rows <= (std::int64_t{1} << 40) / a.inter, "{}: rows x inter = {} x {} is too large", what, a.rows,
                a.inter);
  const std::int64_t quads = a.rows * a.inter / 4;
  const std::int64_t need = (quads + 255) / 256, cap = 8LL * detail::sm_count();
  const int blocks = static_cast<int>(need < cap ? need : cap);
  auto go = [&](auto tag) {
    using T = decltype(tag);
    swiglu_kernel<T, kBackward>
        <<<blocks, 256, 0, stream>>>(static_cast<const Oct<T>*>(a.gu), static_cast<Quad<T>*>(a.h),
                                     static_cast<const Quad<T>*>(a.dh), static_cast<Oct<T>*>(a.dgu), quads);
  };
  if (a.dtype == DType::f16)
    go(__half{});
  else
    go(__nv_bfloat16{});
  detail::check_launch(what);
}

}  // namespace

void add_2d(const Add2dArgs& a, int max_ctas, cudaStream_t stream) {
  if (a.rows <= 0 || a.n <= 0) return;
  TESSERA_CHECK(a.dtype == DType::bf16 || a.dtype == DType::f16, "add_2d: dtype {} not supported (bf16 or f16)",
                dtype_name(a.dtype));
  TESSERA_CHECK(max_ctas >= 1, "add_2d: max_ctas = {} must be >= 1", max_ctas);
  TESSERA_CHECK(aligned16(a.x) && aligned16(a.y) && aligned16(a.out),
                "add_2d: x = {}, y = {}, out = {} must be 16-byte aligned", a.x, a.y, a.out);
  TESSERA_CHECK(a.ldx % 8 == 0 && a.ldy % 8 == 0 && a.ldo % 8 == 0 && a.ldx >= a.n && a.ldy >= a.n && a.ldo >= a.n,
                "add_2d: ldx = {}, ldy = {}, ldo = {} must be multiples of 8 and >= n = {}", a.ldx, a.ldy, a.ldo, a.n);
  const std::int64_t work = a.rows * ((a.n + 7) / 8);
  const std::int64_t need = (work + 255) / 256;
  const int blocks = static_cast<int>(need < max_ctas ? need : max_ctas);
  if (a.dtype == DType::f16)
    add_2d_kernel<__half><<<blocks, 256, 0, stream>>>(static_cast<const __half*>(a.x), a.ldx,
                                                      static_cast<const __half*>(a.y), a.ldy,
                                                      static_cast<__half*>(a.out), a.ldo, a.rows, a.n);
  else
    add_2d_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(a.x), a.ldx,
                                                             static_cast<const __nv_bfloat16*>(a.y), a.ldy,
                                                             static_cast<__nv_bfloat16*>(a.out), a.ldo, a.rows, a.n);
  detail::check_launch("add_2d: kernel launch");
}

void swiglu_forward(const SwigluArgs& a, cudaStream_t stream) { launch_swiglu<false>(a, stream, "swiglu_forward"); }

void swiglu_backward(const SwigluArgs& a, cudaStream_t stream) { launch_swiglu<true>(a, stream, "swiglu_backward"); }

void transpose_2d(const void* in, void* out, std::int64_t rows, std::int64_t cols, DType dtype, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  TESSERA_CHECK(dtype == DType::bf16 || dtype == DType::f16, "transpose_2d: dtype {} not supported (bf16 or f16)",
                dtype_name(dtype));
  TESSERA_CHECK(in != nullptr && out != nullptr && in != out, "transpose_2d: in = {} and out = {} (distinct, non-null)",
                in, out);
  TESSERA_CHECK(rows <= std::int64_t{65535} * 32 && cols <= std::int64_t{0x7fffffff} * 32,
                "transpose_2d: {} x {} exceeds the grid (rows <= 2097120)", rows, cols);
  const bool pairs = rows % 2 == 0 && cols % 2 == 0 && reinterpret_cast<std::uintptr_t>(in) % 4 == 0 &&
                     reinterpret_cast<std::uintptr_t>(out) % 4 == 0;
  if (pairs) {
    const dim3 grid(static_cast<unsigned>((cols + 63) / 64), static_cast<unsigned>((rows + 63) / 64));
    transpose_pairs_kernel<<<grid, dim3(32, 8), 0, stream>>>(static_cast<const std::uint32_t*>(in),
                                                             static_cast<std::uint32_t*>(out), rows, cols);
  } else {
    const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((rows + 31) / 32));
    transpose_kernel<<<grid, dim3(32, 8), 0, stream>>>(static_cast<const std::uint16_t*>(in),
                                                       static_cast<std::uint16_t*>(out), rows, cols);
  }
  detail::check_launch("transpose_2d");
}

void preload_add_2d() {
  cudaFuncAttributes attr{};
  detail::cuda_check(cudaFuncGetAttributes(&attr, add_2d_kernel<__half>), "add_2d: preload");
  detail::cuda_check(cudaFuncGetAttributes(&attr, add_2d_kernel<__nv_bfloat16>), "add_2d: preload");
}

}  // namespace tessera::kernels
