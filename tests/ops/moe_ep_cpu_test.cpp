// CPU tests of ops::moe_ep's host-side checks: validation before any launch,
// the strategy names and its registry (the layer itself: moe_ep_gpu_test.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "ops/moe_ep/moe_ep.hpp"
#include "tessera/ops/args.hpp"
#include "tessera/ops/moe_ep.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops {
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
