// CPU tests of ops::moe_ep's host-side checks: validation before any launch,
// the strategy names and its registry (the layer itself: moe_ep_gpu_test.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ops/moe_ep/moe_ep.hpp"
#include "tessera/ops/args.hpp"
#include "tessera/ops/moe_ep.hpp"
#include "tessera/runtime/error.hpp"
#include "support/test_support.hpp"

namespace tessera::ops {
using tessera::testing::error_message;
using tessera::testing::pointer_text;

namespace {

TEST(MoeEp, ValidateRejectsBadShapes) {
  MoeEpArgs a;
  alignas(16) int buf[64] = {};
  a.x_shard = a.w_gate_up = a.w_down = a.out_shard = buf;
  a.expert_ids = buf;
  a.weights = reinterpret_cast<const float*>(buf);
  a.tokens_local = 16;
  a.hidden = 64;
  a.inter = 32;
  a.experts = 8;
  a.topk = 2;
  EXPECT_NO_THROW(validate(a, 2));
  EXPECT_THROW(validate(a, 3), tessera::Error);  // 8 experts over 3 ranks
  a.topk = 9;                                    // top-k > E
  EXPECT_THROW(validate(a, 2), tessera::Error);
  a.topk = 2;
  a.hidden = 60;  // not a multiple of 8
  EXPECT_THROW(validate(a, 2), tessera::Error);
  a.hidden = 64;
  a.capacity = -1;
  EXPECT_THROW(validate(a, 2), tessera::Error);
  a.capacity = std::int64_t{1} << 30;  // capacity * world reaches 2^31
  EXPECT_THROW(validate(a, 2), tessera::Error);
  a.capacity = 0;
  a.tokens_local = std::int64_t{1} << 40;
  EXPECT_THROW(validate(a, 2), tessera::Error);
  EXPECT_THROW(parse_moe_ep_strategy("fused"), tessera::Error);
  EXPECT_EQ(parse_moe_ep_strategy("pipelined"), MoeEpStrategy::pipelined);
}

// Issue 22's bad input, each named before any launch: experts not a
// multiple of the world, top-k > E, capacity negative or overflowing,
// sizes, dtype, null and misaligned pointers. Expert ids outside [0, E) and
// rows over the capacity are device data: check_status() reports them after
// the call (moe_ep_gpu_test.cpp), as it does mismatched expert counts
// across ranks (two GPUs).
TEST(MoeEp, ValidateNamesEachBadArgument) {
  alignas(16) static int buf[64] = {};
  const auto good = [] {
    MoeEpArgs a;
    a.x_shard = a.w_gate_up = a.w_down = a.out_shard = buf;
    a.expert_ids = buf;
    a.weights = reinterpret_cast<const float*>(buf);
    a.tokens_local = 16;
    a.hidden = 64;
    a.inter = 32;
    a.experts = 8;
    a.topk = 2;
    return a;
  };
  const void* misaligned = reinterpret_cast<const char*>(buf) + 8;
  const std::pair<std::function<void(MoeEpArgs&, int&)>, std::string> bad[] = {
      {[](MoeEpArgs&, int& world) { world = 3; }, "experts = 8 is not a multiple of the world size 3"},
      {[](MoeEpArgs& a, int&) { a.topk = 9; }, "topk = 9 out of range [1, min(16, experts = 8)]"},
      {[](MoeEpArgs& a, int&) { a.experts = 2048; }, "experts = 2048 out of range [1, 1024]"},
      {[](MoeEpArgs& a, int&) { a.capacity = -1; }, "capacity = -1 must be >= 0 (0: tokens_local * topk)"},
      {[](MoeEpArgs& a, int&) { a.capacity = std::int64_t{1} << 30; },
       "capacity (1073741824) * world (2) must stay below 2^31"},
      {[](MoeEpArgs& a, int&) { a.tokens_local = -5; }, "tokens_local = -5 out of range [0, 2^31)"},
      {[](MoeEpArgs& a, int&) { a.tokens_local = std::int64_t{1} << 30; },
       "tokens_local (1073741824) * topk (2) must stay below 2^31"},
      {[](MoeEpArgs& a, int&) { a.inter = 12; }, "inter = 12 must be a positive multiple of 8"},
      {[](MoeEpArgs& a, int&) { a.dtype = DType::f32; }, "dtype f32 not supported (bf16)"},
      {[](MoeEpArgs& a, int&) { a.out_shard = nullptr; }, "out_shard is null"},
      {[](MoeEpArgs& a, int&) { a.weights = nullptr; }, "weights is null"},
      {[&](MoeEpArgs& a, int&) { a.x_shard = misaligned; },
       "x_shard = " + pointer_text(misaligned) + " is not 16-byte aligned"},
  };
  EXPECT_NO_THROW(validate(good(), 2));
  for (const auto& [edit, want] : bad) {
    MoeEpArgs a = good();
    int world = 2;
    edit(a, world);
    const std::string e = error_message([&] { validate(a, world); });
    EXPECT_NE(e.find("moe_ep: " + want), std::string::npos) << "want '" << want << "', got: '" << e << "'";
  }
}

// The C API and Python take moe_ep's strategy codes from the one strategy
// table: exactly the MoeEpStrategy values, under the table's names.
TEST(MoeEp, StrategyTableGivesItsStrategies) {
  for (const StrategyInfo& i : strategy_table()) {
    const bool own =
        i.strategy == Strategy::automatic || i.strategy == Strategy::sequential || i.strategy == Strategy::pipelined;
    EXPECT_EQ(accepts(OpKind::moe_ep, i.strategy), own) << i.name;
    if (own && i.strategy != Strategy::automatic)
      EXPECT_EQ(moe_ep_strategy_name(parse_moe_ep_strategy(i.name)), i.name);
  }
}

// moe_ep dispatches through its registry, which holds exactly the table's
// strategies for it (checked when it is built), the baseline first.
TEST(MoeEp, RegistryHoldsTheTablesStrategies) {
  const moeep::Registry& r = moe_ep_registry();
  EXPECT_EQ(r.strategies(), (std::vector<Strategy>{Strategy::sequential, Strategy::pipelined}));
  EXPECT_EQ(r.candidates({.world = 1}), std::vector<Strategy>{Strategy::sequential});
  EXPECT_EQ(r.candidates({.world = 2}), (std::vector<Strategy>{Strategy::sequential, Strategy::pipelined}));
}

TEST(MoeEp, DefaultCapacityIsLossless) {
  MoeEpArgs a;
  a.tokens_local = 100;
  a.topk = 3;
  EXPECT_EQ(moe_ep_capacity(a), 300);
  a.capacity = 64;
  EXPECT_EQ(moe_ep_capacity(a), 64);
}

}  // namespace
}  // namespace tessera::ops
