// CPU tests of the producer's flag memo (tessera/kernels/gemm/flag_memo.hpp):
// which flags memo_wait reads, when it fences, what it memoizes, against a
// host model of the flags (monotone, some set late).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "tessera/kernels/gemm/flag_memo.hpp"

namespace te = tessera::kernels::engine;

namespace {
// Host stand-in for the device loads. A spin on an unset flag "waits" by
// setting it (the publisher finishing), which is what a real spin observes.
struct HostLoader {
  std::vector<uint32_t>& flags;
  uint32_t expected;
  int relaxed_loads = 0, fences = 0, spins = 0;
  std::vector<int> unfenced;  // flags read relaxed since the last fence
  uint32_t relaxed(int f) {
    ++relaxed_loads;
    unfenced.push_back(f);
    return flags.at(f);
  }
  void fence_acquire() {
    ++fences;
    unfenced.clear();
  }
  void spin(int f) {
    ++spins;
    if (flags.at(f) < expected) flags[f] = expected;
  }
};
}  // namespace

TEST(FlagMemo, WindowIsAlignedAndClipped) {
  int a = 0, b = 0;
  te::flag_window<8>(13, 64, a, b);
  EXPECT_EQ(a, 8);
  EXPECT_EQ(b, 15);
  te::flag_window<8>(13, 11, a, b);
  EXPECT_EQ(a, 8);
  EXPECT_EQ(b, 10);
  te::flag_window<4>(0, 2, a, b);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
}

TEST(FlagMemo, AllSetOneWindowReadThenNothing) {
  std::vector<uint32_t> flags(64, 0xFFFFFFFFu);
  HostLoader ld{flags, 1};
  te::FlagMemo memo;
  EXPECT_TRUE(te::memo_wait<8>(memo, 9, 9, 64, 1u, ld));
  EXPECT_EQ(ld.relaxed_loads, 8);
  EXPECT_EQ(ld.fences, 1);
  EXPECT_EQ(ld.spins, 0);
  EXPECT_TRUE(ld.unfenced.empty());
  // Every other flag of window [8, 15] is now free: no load, no fence.
  for (int f = 8; f <= 15; ++f) EXPECT_FALSE(te::memo_wait<8>(memo, f, f, 64, 1u, ld)) << f;
  EXPECT_EQ(ld.relaxed_loads, 8);
  EXPECT_EQ(ld.fences, 1);
  // A tile spanning two windows reads the second one once.
  EXPECT_TRUE(te::memo_wait<8>(memo, 15, 16, 64, 1u, ld));
  EXPECT_EQ(ld.relaxed_loads, 16);
  EXPECT_EQ(ld.fences, 2);
}

TEST(FlagMemo, UnsetFlagsAreNeverMemoized) {
  std::vector<uint32_t> flags(64, 5);
  flags[3] = 4;  // below expected
  flags[6] = 4;
  HostLoader ld{flags, 5};
  te::FlagMemo memo;
  EXPECT_TRUE(te::memo_wait<8>(memo, 2, 2, 64, 5u, ld));
  EXPECT_EQ(ld.spins, 0);
  EXPECT_FALSE(memo.has(3));
  EXPECT_FALSE(memo.has(6));
  EXPECT_TRUE(memo.has(7));
  // Flag 3 is needed: window read again (still unset), then the acquire spin.
  EXPECT_TRUE(te::memo_wait<8>(memo, 3, 3, 64, 5u, ld));
  EXPECT_EQ(ld.spins, 1);
  EXPECT_TRUE(memo.has(3));
  EXPECT_FALSE(memo.has(6));
}

TEST(FlagMemo, BeyondTheMemoAndUnknownCountAcquireEveryTime) {
  std::vector<uint32_t> flags(100, 1);
  HostLoader ld{flags, 1};
  te::FlagMemo memo;
  for (int rep = 0; rep < 3; ++rep) EXPECT_TRUE(te::memo_wait<8>(memo, 70, 70, 100, 1u, ld));
  EXPECT_EQ(ld.spins, 3);
  EXPECT_EQ(ld.relaxed_loads, 0);
  // count 0 (tile_to_flag): only the needed flag, memoized after its acquire.
  EXPECT_TRUE(te::memo_wait<8>(memo, 5, 5, 0, 1u, ld));
  EXPECT_FALSE(te::memo_wait<8>(memo, 5, 5, 0, 1u, ld));
  EXPECT_EQ(ld.spins, 4);
  EXPECT_EQ(ld.relaxed_loads, 0);
  EXPECT_FALSE(memo.has(4));
}

// Random schedules over flags that publishers set at random times: every
// return leaves all needed flags >= expected; a memoized flag was read >=
// expected and then fenced; false is returned only when nothing was read.
TEST(FlagMemo, RandomSchedulesKeepTheContract) {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 200; ++trial) {
    const int count = 1 + static_cast<int>(rng() % 80);
    const uint32_t expected = 1 + rng() % 3;
    std::vector<uint32_t> flags(count);
    for (auto& v : flags) v = rng() % (expected + 2);
    HostLoader ld{flags, expected};
    te::FlagMemo memo;
    for (int tile = 0; tile < 60; ++tile) {
      // Publishers progress (monotone).
      for (auto& v : flags)
        if (rng() % 4 == 0) v = v < expected ? v + 1 : v;
      const int f0 = static_cast<int>(rng() % count);
      const int f1 = std::min(count - 1, f0 + static_cast<int>(rng() % 3));
      const int loads = ld.relaxed_loads, spins = ld.spins, fences = ld.fences;
      const bool acquired = te::memo_wait<8>(memo, f0, f1, count, expected, ld);
      for (int f = f0; f <= f1; ++f) ASSERT_GE(flags[f], expected);
      ASSERT_TRUE(ld.unfenced.empty()) << "relaxed reads left without an acquire fence";
      ASSERT_EQ(acquired, ld.relaxed_loads != loads || ld.spins != spins);
      if (ld.relaxed_loads != loads) ASSERT_GT(ld.fences, fences);
      for (int f = 0; f < count; ++f)
        if (memo.has(f)) ASSERT_GE(flags[f], expected) << f;
    }
  }
}
