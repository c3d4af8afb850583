// Shared helpers for Tessera's tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tessera::testing {

/// Number of CUDA devices this process can use (0 without a driver or GPU).
int visible_gpus();

/// World size this test process was started with (WORLD_SIZE etc.; 1 if none).
int launched_world_size();

/// ‖a − b‖₂ / ‖b‖₂ in double precision; NaN/inf anywhere gives +inf.
double relative_error(const std::vector<double>& out, const std::vector<double>& ref);

/// The message of the tessera::Error `f` throws; "" when it throws none.
std::string error_message(const std::function<void()>& f);

/// A pointer as the library's messages print it (fmt's {} of a pointer).
std::string pointer_text(const void* p);

}  // namespace tessera::testing

/// Skips the current test (reported as skipped, never passed) unless at
/// least `n` GPUs are visible.
#define TESSERA_REQUIRE_GPUS(n)                                                                     \
  do {                                                                                              \
    const int tessera_have_ = ::tessera::testing::visible_gpus();                                   \
    if (tessera_have_ < (n)) GTEST_SKIP() << "needs " << (n) << " GPU(s), found " << tessera_have_; \
  } while (0)
