// CPU tests of the producer's flag memo (tessera/kernels/gemm/flag_memo.hpp):
// which flags memo_wait reads, when it fences, what it memoizes, against a
// host model of the flags (monotone, some set late). Windows as FlagWait uses
// them: kFlagWindow<uint32_t> = 4, kFlagWindow<uint64_t> = 2 (16 bytes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "tessera/kernels/gemm/flag_memo.hpp"

namespace te = tessera::kernels::engine;

namespace {
constexpr int kW32 = te::kFlagWindow<uint32_t>;
constexpr int kW64 = te::kFlagWindow<uint64_t>;
static_assert(kW32 == 4 && kW64 == 2, "FlagWait reads 16-byte windows");

// Host stand-in for the device loads. A spin on an unset flag "waits" by
// setting it (the publisher finishing), which is what a real spin observes.
template <class FlagT>
struct HostLoader {
  std::vector<FlagT>& flags;
  FlagT expected;
  int relaxed_loads = 0, window_reads = 0, fences = 0, spins = 0;
  std::vector<int> unfenced;  // flags read relaxed since the last fence
  int window = 1;             // when set: every window read starts at a multiple of it, spans at most it
  // One window read (FlagWait: one 16-byte vector load): flags [first, last],
  // reduced to the ready mask the device loader returns.
  uint32_t relaxed_ready(int first, int last, FlagT e) {
    ++window_reads;
    EXPECT_LE(first, last);
    EXPECT_LT(last - first, 32);
    EXPECT_EQ(first % window, 0) << first;
    if (window > 1) EXPECT_LT(last - first, window);
    EXPECT_LT(last, static_cast<int>(flags.size()));
    uint32_t bits = 0;
    for (int f = first; f <= last; ++f) {
      ++relaxed_loads;
      unfenced.push_back(f);
      if (flags.at(f) >= e) bits |= 1u << (f - first);
    }
    return bits;
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
  te::flag_window<kW32>(13, 64, a, b);
  EXPECT_EQ(a, 12);
  EXPECT_EQ(b, 15);
  te::flag_window<kW32>(13, 14, a, b);
  EXPECT_EQ(a, 12);
  EXPECT_EQ(b, 13);
  te::flag_window<kW32>(0, 2, a, b);
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  te::flag_window<kW64>(63, 64, a, b);
  EXPECT_EQ(a, 62);
  EXPECT_EQ(b, 63);
}

TEST(FlagMemo, MarkBitsStaysInTheMemo) {
  te::FlagMemo memo;
  memo.mark_bits(60, 0xFu);
  for (int f = 60; f < 64; ++f) EXPECT_TRUE(memo.has(f)) << f;
  EXPECT_FALSE(memo.has(59));
  memo.mark_bits(64, 0xFu);  // beyond the memo: ignored
  memo.mark_bits(-4, 0xFu);
  EXPECT_EQ(memo.known, uint64_t{0xF} << 60);
  memo.mark_bits(8, 0b0101u);
  EXPECT_TRUE(memo.has(8));
  EXPECT_FALSE(memo.has(9));
  EXPECT_TRUE(memo.has(10));
  EXPECT_FALSE(memo.has(11));
}

TEST(FlagMemo, AllSetOneWindowReadThenNothing) {
  std::vector<uint32_t> flags(64, 0xFFFFFFFFu);
  HostLoader<uint32_t> ld{flags, 1};
  te::FlagMemo memo;
  EXPECT_TRUE(te::memo_wait<kW32>(memo, 9, 9, 64, 1u, ld));
  EXPECT_EQ(ld.window_reads, 1);
  EXPECT_EQ(ld.relaxed_loads, 4);
  EXPECT_EQ(ld.fences, 1);
  EXPECT_EQ(ld.spins, 0);
  EXPECT_TRUE(ld.unfenced.empty());
  // Every other flag of window [8, 11] is now free: no load, no fence.
  for (int f = 8; f <= 11; ++f) EXPECT_FALSE(te::memo_wait<kW32>(memo, f, f, 64, 1u, ld)) << f;
  EXPECT_EQ(ld.relaxed_loads, 4);
  EXPECT_EQ(ld.fences, 1);
  // A tile spanning two windows reads the second one once.
  EXPECT_TRUE(te::memo_wait<kW32>(memo, 11, 12, 64, 1u, ld));
  EXPECT_EQ(ld.window_reads, 2);
  EXPECT_EQ(ld.relaxed_loads, 8);
  EXPECT_EQ(ld.fences, 2);
  // A tile spanning three windows reads the two unseen ones, one fence each.
  EXPECT_TRUE(te::memo_wait<kW32>(memo, 15, 20, 64, 1u, ld));
  EXPECT_EQ(ld.window_reads, 4);
  EXPECT_EQ(ld.fences, 4);
  for (int f = 8; f <= 23; ++f) EXPECT_TRUE(memo.has(f)) << f;
  EXPECT_FALSE(memo.has(7));
  EXPECT_FALSE(memo.has(24));
}

TEST(FlagMemo, LastWindowIsClippedToTheFlagCount) {
  std::vector<uint32_t> flags(14, 3);  // 14 flags: window [12, 15] holds 2
  HostLoader<uint32_t> ld{flags, 3};
  te::FlagMemo memo;
  EXPECT_TRUE(te::memo_wait<kW32>(memo, 13, 13, 14, 3u, ld));
  EXPECT_EQ(ld.relaxed_loads, 2);
  EXPECT_TRUE(memo.has(12));
  EXPECT_TRUE(memo.has(13));
  EXPECT_FALSE(memo.has(14));  // never read, never memoized
  EXPECT_FALSE(memo.has(15));
}

TEST(FlagMemo, UnsetFlagsAreNeverMemoized) {
  std::vector<uint32_t> flags(64, 5);
  flags[1] = 4;  // below expected
  flags[3] = 4;
  HostLoader<uint32_t> ld{flags, 5};
  te::FlagMemo memo;
  EXPECT_TRUE(te::memo_wait<kW32>(memo, 2, 2, 64, 5u, ld));
  EXPECT_EQ(ld.spins, 0);
  EXPECT_TRUE(memo.has(0));
  EXPECT_FALSE(memo.has(1));
  EXPECT_TRUE(memo.has(2));
  EXPECT_FALSE(memo.has(3));
  // Flag 3 is needed: window read again (still unset), then the acquire spin.
  EXPECT_TRUE(te::memo_wait<kW32>(memo, 3, 3, 64, 5u, ld));
  EXPECT_EQ(ld.window_reads, 2);
  EXPECT_EQ(ld.spins, 1);
  EXPECT_TRUE(memo.has(3));
  EXPECT_FALSE(memo.has(1));
}

TEST(FlagMemo, BeyondTheMemoAndUnknownCountAcquireEveryTime) {
  std::vector<uint32_t> flags(100, 1);
  HostLoader<uint32_t> ld{flags, 1};
  te::FlagMemo memo;
  for (int rep = 0; rep < 3; ++rep) EXPECT_TRUE(te::memo_wait<kW32>(memo, 70, 70, 100, 1u, ld));
  EXPECT_EQ(ld.spins, 3);
  EXPECT_EQ(ld.relaxed_loads, 0);
  // count 0 (tile_to_flag): only the needed flag, memoized after its acquire.
  EXPECT_TRUE(te::memo_wait<kW32>(memo, 5, 5, 0, 1u, ld));
  EXPECT_FALSE(te::memo_wait<kW32>(memo, 5, 5, 0, 1u, ld));
  EXPECT_EQ(ld.spins, 4);
  EXPECT_EQ(ld.relaxed_loads, 0);
  EXPECT_FALSE(memo.has(4));
}

// Random schedules over flags that publishers set at random times: every
// return leaves all needed flags >= expected; a memoized flag was read >=
// expected and then fenced; false is returned only when nothing was read;
// every window read is aligned, within [0, count) and at most kWindow flags.
template <class FlagT, int kWindow>
void random_schedules(uint32_t seed) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const int count = 1 + static_cast<int>(rng() % 80);
    const FlagT expected = static_cast<FlagT>(1 + rng() % 3);
    std::vector<FlagT> flags(count);
    for (auto& v : flags) v = static_cast<FlagT>(rng() % (expected + 2));
    HostLoader<FlagT> ld{flags, expected};
    ld.window = kWindow;
    te::FlagMemo memo;
    for (int tile = 0; tile < 60; ++tile) {
      // Publishers progress (monotone).
      for (auto& v : flags)
        if (rng() % 4 == 0) v = v < expected ? v + 1 : v;
      const int f0 = static_cast<int>(rng() % count);
      const int f1 = std::min(count - 1, f0 + static_cast<int>(rng() % 6));
      const int loads = ld.relaxed_loads, spins = ld.spins, fences = ld.fences, windows = ld.window_reads;
      const bool acquired = te::memo_wait<kWindow>(memo, f0, f1, count, expected, ld);
      for (int f = f0; f <= f1; ++f) ASSERT_GE(flags[f], expected);
      ASSERT_TRUE(ld.unfenced.empty()) << "relaxed reads left without an acquire fence";
      ASSERT_EQ(acquired, ld.relaxed_loads != loads || ld.spins != spins);
      ASSERT_LE(ld.relaxed_loads - loads, (ld.window_reads - windows) * kWindow);
      if (ld.relaxed_loads != loads) ASSERT_EQ(ld.fences - fences, ld.window_reads - windows);
      for (int f = 0; f < count; ++f)
        if (memo.has(f)) ASSERT_GE(flags[f], expected) << f;
      for (int f = count; f < te::FlagMemo::kBits; ++f) ASSERT_FALSE(memo.has(f)) << f;
    }
  }
}

TEST(FlagMemo, RandomSchedulesKeepTheContractU32) { random_schedules<uint32_t, kW32>(12345); }
TEST(FlagMemo, RandomSchedulesKeepTheContractU64) { random_schedules<uint64_t, kW64>(777); }
