// tests/kernels/gemm_test_util.hpp — device buffers, random fills and
// conversions for the GEMM tests.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "tessera/runtime/dtype.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::kernels::testk {

/// Owning device allocation.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  explicit DevBuf(size_t n) : bytes(n) { TESSERA_CUDA_CHECK(cudaMalloc(&p, n)); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

inline uint16_t to_bits(float v, DType t) {
  uint16_t bits;
  if (t == DType::bf16) {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    std::memcpy(&bits, &h, 2);
  } else {
    const __half h = __float2half_rn(v);
    std::memcpy(&bits, &h, 2);
  }
  return bits;
}

inline double from_bits(uint16_t bits, DType t) {
  if (t == DType::bf16) {
    __nv_bfloat16 h;
    std::memcpy(&h, &bits, 2);
    return static_cast<double>(__bfloat162float(h));
  }
  __half h;
  std::memcpy(&h, &bits, 2);
  return static_cast<double>(__half2float(h));
}

/// rows x cols 16-bit matrix with row stride ld, uniform in [-1, 1]; returns
/// the device buffer and fills `host` (row-major, ld) with the exact values.
inline DevBuf random_matrix(int64_t rows, int64_t cols, int64_t ld, DType t, std::mt19937_64& rng,
                            std::vector<double>* host = nullptr) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint16_t> bits(static_cast<size_t>(rows * ld), 0);
  if (host) host->assign(bits.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * ld + c);
      bits[i] = to_bits(u(rng), t);
      if (host) (*host)[i] = from_bits(bits[i], t);
    }
  DevBuf d(bits.size() * 2);
  TESSERA_CUDA_CHECK(cudaMemcpy(d.p, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  return d;
}

/// Fills a device buffer with 0xFF bytes: NaN in bf16, f16 and f32.
inline void poison(const DevBuf& d) { TESSERA_CUDA_CHECK(cudaMemset(d.p, 0xFF, d.bytes)); }

/// Reads rows x cols of a device matrix (row stride ld) as doubles.
inline std::vector<double> download(const void* p, int64_t rows, int64_t cols, int64_t ld, DType t) {
  const size_t es = dtype_size(t);
  std::vector<uint8_t> raw(static_cast<size_t>(rows * ld) * es);
  TESSERA_CUDA_CHECK(cudaMemcpy(raw.data(), p, raw.size(), cudaMemcpyDeviceToHost));
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * ld + c);
      double v;
      if (t == DType::f32) {
        float f;
        std::memcpy(&f, raw.data() + i * 4, 4);
        v = f;
      } else {
        uint16_t b;
        std::memcpy(&b, raw.data() + i * 2, 2);
        v = from_bits(b, t);
      }
      out[static_cast<size_t>(r * cols + c)] = v;
    }
  return out;
}

/// Raw bytes of a device buffer.
inline std::vector<uint8_t> bytes_of(const DevBuf& d) {
  std::vector<uint8_t> out(d.bytes);
  TESSERA_CUDA_CHECK(cudaMemcpy(out.data(), d.p, d.bytes, cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace tessera::kernels::testk
