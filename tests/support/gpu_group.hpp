// One ProcessGroup per test process, created on first use (NCCL start-up is
// too slow to repeat per test). Tests call TESSERA_REQUIRE_WORLD_GPUS()
// first so that a machine without enough GPUs skips instead of failing.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "support/test_support.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::testing {

inline runtime::ProcessGroup& group() {
  static std::unique_ptr<runtime::ProcessGroup> pg = runtime::ProcessGroup::from_environment();
  return *pg;
}

/// Begins a capture of pg's stream, expects `call` to throw a tessera::Error
/// whose message holds `needle` before it queues anything, and expects the
/// capture to end cleanly (a refused call must not leave it invalid).
template <class F>
void expect_refused_under_capture(runtime::ProcessGroup& pg, F&& call, const std::string& needle) {
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(pg.stream(), cudaStreamCaptureModeThreadLocal));
  try {
    call();
    ADD_FAILURE() << "the call was captured";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(pg.stream(), &g), cudaSuccess) << "the refused call left the capture invalid";
  if (g) TESSERA_CUDA_CHECK(cudaGraphDestroy(g));
}

}  // namespace tessera::testing

/// Skips unless this node has a GPU for every launched rank and at least
/// `min_world` ranks were launched.
#define TESSERA_REQUIRE_WORLD_GPUS(min_world)                                                \
  do {                                                                                       \
    const int tessera_world_ = ::tessera::testing::launched_world_size();                    \
    if (tessera_world_ < (min_world))                                                        \
      GTEST_SKIP() << "needs " << (min_world) << " ranks, launched with " << tessera_world_; \
    TESSERA_REQUIRE_GPUS(tessera_world_);                                                    \
  } while (0)
