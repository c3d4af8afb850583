// One ProcessGroup per test process, created on first use (NCCL start-up is
// too slow to repeat per test). Tests call TESSERA_REQUIRE_WORLD_GPUS()
// first so that a machine without enough GPUs skips instead of failing.
#pragma once

#include <memory>

#include "support/test_support.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::testing {

inline runtime::ProcessGroup& group() {
  static std::unique_ptr<runtime::ProcessGroup> pg = runtime::ProcessGroup::from_environment();
  return *pg;
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
