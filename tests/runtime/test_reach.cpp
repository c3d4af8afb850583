// On the CPU: the bounded waiting loop that every
// peer-dependent host wait uses (runtime::poll_until), and the operators'
// strategy candidates and cache-key topology with and without load/store
// reach between the ranks.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "tessera/ops/tuner.hpp"
#include "tessera/runtime/wait_diagnostics.hpp"

namespace {

using namespace std::chrono_literals;
using tessera::ops::Strategy;
using tessera::runtime::PollState;
using Clock = std::chrono::steady_clock;

TEST(BoundedWait, ReturnsAsSoonAsTheWorkIsDone) {
  int polls = 0;
  const auto t0 = Clock::now();
  EXPECT_EQ(tessera::runtime::poll_until([&] { return ++polls < 5 ? PollState::waiting : PollState::done; }, 10s),
            PollState::done);
  EXPECT_EQ(polls, 5);
  EXPECT_LT(Clock::now() - t0, 1s);
}

TEST(BoundedWait, AFailureEndsTheWaitAtOnce) {
  int polls = 0;
  EXPECT_EQ(tessera::runtime::poll_until([&] { return ++polls < 3 ? PollState::waiting : PollState::failed; }, 10s),
            PollState::failed);
  EXPECT_EQ(polls, 3);
}

TEST(BoundedWait, WorkThatNeverFinishesTimesOutOnTime) {
  // A peer that died inside a collective: the stream never drains.
  int polls = 0;
  const auto t0 = Clock::now();
  EXPECT_EQ(tessera::runtime::poll_until(
                [&] {
                  ++polls;
                  return PollState::waiting;
                },
                200ms),
            PollState::waiting);
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, 400ms);
  EXPECT_GT(polls, 10) << "polls between naps";
  EXPECT_LT(polls, 20000) << "naps between polls (no busy spin)";
}

TEST(NoLoadStoreReach, OnlyTheNcclStrategyIsACandidate) {
  using V = std::vector<Strategy>;
  for (int world : {1, 2, 4, 8}) {
    for (bool rows : {true, false}) {
      EXPECT_EQ(tessera::ops::gemm_rs_candidates(world, rows, false), V{Strategy::sequential});
      EXPECT_EQ(tessera::ops::gemm_ar_candidates(world, rows, false), V{Strategy::sequential});
    }
    EXPECT_EQ(tessera::ops::ag_gemm_candidates(world, false), V{Strategy::sequential});
  }
  // With reach, the candidates are as before.
  EXPECT_EQ(tessera::ops::ag_gemm_candidates(2, true),
            (V{Strategy::sequential, Strategy::decomposition, Strategy::fused_ce, Strategy::fused_sm}));
  EXPECT_EQ(tessera::ops::gemm_rs_candidates(4, true, true),
            (V{Strategy::sequential, Strategy::decomposition, Strategy::fused_sm, Strategy::fused_ce, Strategy::ring}));
  EXPECT_EQ(tessera::ops::gemm_rs_candidates(4, true), tessera::ops::gemm_rs_candidates(4, true, true));
  EXPECT_EQ(tessera::ops::gemm_ar_candidates(2, true, true), (V{Strategy::sequential, Strategy::fused_ce}));
  // Whatever the reach, every candidate is one that can run there.
  for (bool lsa : {true, false})
    for (Strategy s : tessera::ops::gemm_rs_candidates(4, true, lsa)) EXPECT_TRUE(lsa || !tessera::ops::needs_lsa(s));
}

TEST(NoLoadStoreReach, OnlySequentialAndAutomaticNeedNoReach) {
  EXPECT_FALSE(tessera::ops::needs_lsa(Strategy::sequential));
  EXPECT_FALSE(tessera::ops::needs_lsa(Strategy::automatic));
  for (Strategy s : {Strategy::decomposition, Strategy::fused_ce, Strategy::fused_sm, Strategy::ring})
    EXPECT_TRUE(tessera::ops::needs_lsa(s)) << tessera::ops::strategy_name(s);
}

TEST(NoLoadStoreReach, TheCacheKeyTopologySeparatesReachFromNoReach) {
  using tessera::ops::topology_key;
  EXPECT_EQ(topology_key(std::nullopt, true), "lsa");
  EXPECT_EQ(topology_key(std::nullopt, false), "net");
  EXPECT_EQ(topology_key(std::string(""), false), "net");
  EXPECT_EQ(topology_key(std::string("NV18"), true), "NV18");
  EXPECT_EQ(topology_key(std::string("NV18"), false), "NV18/net");
  EXPECT_EQ(topology_key(std::string("net"), false), "net");
  EXPECT_NE(topology_key(std::string("NV18"), true), topology_key(std::string("NV18"), false));
}

}  // namespace
