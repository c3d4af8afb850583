#include "tessera/runtime/error.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>

namespace tessera::detail {

namespace {
std::atomic<int> g_rank{-1};

std::string where(std::string_view file, int line) {
  auto slash = file.rfind('/');
  if (slash != std::string_view::npos) file.remove_prefix(slash + 1);
  const int r = g_rank.load(std::memory_order_relaxed);
  if (r >= 0) return fmt::format("[tessera rank {}] ({}:{}) ", r, file, line);
  return fmt::format("[tessera] ({}:{}) ", file, line);
}
}  // namespace

int current_rank() noexcept { return g_rank.load(std::memory_order_relaxed); }
void set_current_rank(int rank) noexcept { g_rank.store(rank, std::memory_order_relaxed); }

void throw_error(std::string_view file, int line, std::string_view msg) {
  throw Error(where(file, line) + std::string(msg));
}

void throw_cuda_error(std::string_view file, int line, std::string_view expr, int code) {
  const auto err = static_cast<cudaError_t>(code);
  throw Error(where(file, line) +
              fmt::format("CUDA error {} ({}: {}) in {}", code, cudaGetErrorName(err), cudaGetErrorString(err), expr));
}

void throw_nccl_error(std::string_view file, int line, std::string_view expr, int code) {
  const auto res = static_cast<ncclResult_t>(code);
  throw Error(where(file, line) + fmt::format("NCCL error {} ({}) in {}", code, ncclGetErrorString(res), expr));
}

}  // namespace tessera::detail
