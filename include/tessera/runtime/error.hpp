// tessera/runtime/error.hpp — the one error type of Tessera and the checks
// that produce it.
//
// Every failure on the host becomes a tessera::Error whose message names the
// operation, the rank (when a ProcessGroup has set it) and the offending
// value. CUDA, CUDA-driver and NCCL return codes are all checked through the
// macros below; nothing is silently ignored.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

#if __cplusplus >= 202002L
#define TESSERA_UNLIKELY [[unlikely]]
#else
#define TESSERA_UNLIKELY
#endif

namespace tessera {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
// The rank of this process, or -1 before a ProcessGroup exists. Set once by
// the bootstrap; read when composing messages.
int current_rank() noexcept;
void set_current_rank(int rank) noexcept;

[[noreturn]] void throw_error(std::string_view file, int line, std::string_view msg);
[[noreturn]] void throw_cuda_error(std::string_view file, int line, std::string_view expr, int code);
[[noreturn]] void throw_nccl_error(std::string_view file, int line, std::string_view expr, int code);

}  // namespace detail

}  // namespace tessera

/// Throws tessera::Error with a formatted message unless `cond` holds.
#define TESSERA_CHECK(cond, ...)                                                    \
  do {                                                                              \
    if (!(cond)) TESSERA_UNLIKELY                                                   \
    ::tessera::detail::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
  } while (0)

/// Throws tessera::Error unconditionally.
#define TESSERA_FAIL(...) ::tessera::detail::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))

/// Checks a CUDA runtime call (cudaError_t).
#define TESSERA_CUDA_CHECK(expr)                                                 \
  do {                                                                           \
    const int tessera_rc_ = static_cast<int>(expr);                              \
    if (tessera_rc_ != 0) TESSERA_UNLIKELY                                       \
    ::tessera::detail::throw_cuda_error(__FILE__, __LINE__, #expr, tessera_rc_); \
  } while (0)

/// Checks an NCCL call (ncclResult_t).
#define TESSERA_NCCL_CHECK(expr)                                                 \
  do {                                                                           \
    const int tessera_rc_ = static_cast<int>(expr);                              \
    if (tessera_rc_ != 0) TESSERA_UNLIKELY                                       \
    ::tessera::detail::throw_nccl_error(__FILE__, __LINE__, #expr, tessera_rc_); \
  } while (0)
