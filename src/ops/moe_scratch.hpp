// Private to the MoE operators (moe.cpp, moe_ep.cpp): a grow-only device
// buffer and the size limit their validation shares.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::ops::detail {

/// Dimensions the MoE kernels index with int32 or pass to the grouped GEMM.
constexpr std::int64_t kMoeMaxDim = std::int64_t{1} << 31;

/// A device buffer that only grows; contents are not kept across growth.
/// Growth first waits (bounded) for pg.stream(): a kernel of an earlier call
/// may still use the old buffer, and every operator joins its other streams
/// into pg.stream() before returning.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (p_) cudaFree(p_);
  }
  void* get(std::size_t bytes, runtime::ProcessGroup& pg, const char* what = "moe: workspace growth") {
    if (bytes > bytes_) {
      if (p_) {
        pg.synchronize(pg.stream(), what);
        TESSERA_CUDA_CHECK(cudaFree(p_));
        p_ = nullptr;
        bytes_ = 0;
      }
      TESSERA_CUDA_CHECK(cudaMalloc(&p_, bytes));
      bytes_ = bytes;
    }
    return p_;
  }
  template <class T>
  T* get(std::int64_t count, runtime::ProcessGroup& pg, const char* what = "moe: workspace growth") {
    return static_cast<T*>(get(static_cast<std::size_t>(count > 0 ? count : 1) * sizeof(T), pg, what));
  }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace tessera::ops::detail
