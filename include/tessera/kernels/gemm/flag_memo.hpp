// tessera/kernels/gemm/flag_memo.hpp — the producer-side memo of ready flags
// used by FlagWait (prologue.cuh). Plain C++ (host and device), so the
// decision logic is unit-tested on the CPU (tests/kernels/gemm_flag_memo_test.cpp).
//
// Why: a ping-pong 64x256 CTA starts a tile every ~10-20 us and its 5-stage
// ring covers only ~2 us of wgmma; one blocking ld.acquire (an L2 round trip)
// plus a proxy fence per tile on the producer thread showed as +1..5% even
// with every flag already set (bench/RESULTS-archive.md, "ping-pong default").
// Since v7 the wait runs on a separate waiter thread ahead of the TMA
// thread (kernel_common.cuh); the memo stays: fewer L2 round trips, MEMBARs and L1
// invalidations (ld.acquire) on the SM, at no cost to the TMA issue path.
//
// What: memo_wait() waits for flags [f0, f1] (the flags one tile needs).
//  * A flag once observed >= expected stays so for the rest of the launch
//    (FlagWait's contract: flags only grow while the GEMM runs), so a flag in
//    the memo needs no load at all.
//  * On a miss, the aligned window of kWindow flags around it is read with
//    RELAXED loads (FlagWait: one 16-byte vector load, one L2 round trip),
//    reduced at once to a kWindow-bit "ready" mask, then ONE acquire fence;
//    every flag of the window seen >= expected is memoized. The next tiles of
//    the CTA usually need flags of the same window.
//  * A needed flag that is still below expected falls back to the spinning
//    acquire wait (with timeout) and is memoized after it.
// Returns true iff it executed an acquire (fence or acquire load): only then
// must the kernel execute fence.proxy.async before the tile's TMA loads.
//
// Memory order (PTX memory model): "strong read, then fence.acq_rel" is an
// acquire pattern on every location read, so each memoized flag was acquired
// by the fence that followed its relaxed read, and the waiter's
// fence.proxy.async after that fence, then its ready arrive (release.cta) and
// the TMA thread's wait on it (acquire.cta), order every later TMA load (of
// this and all later tiles: program order of both threads) after the acquire
// (kernel_common.cuh, the waiter ring). A vector load counts as
// one strong relaxed read per element (PTX: vector accesses are a set of
// scalar accesses), so the pattern holds for each flag of the window. Reducing
// the values to a mask before the fence changes nothing: what is acquired is
// the read, and nothing the tile reads is loaded before the fence. A memo hit
// therefore needs neither a load nor a fence: the acquire and the proxy fence
// that cover it already precede the tile's loads in program order. Unsatisfied
// flags are never memoized.
//
// Registers (why the window is 16 bytes and the loader returns a mask): the
// waiter (producer warpgroup) runs under setmaxnreg 40; an 8-value window kept live across the
// fence spilled to local memory (docs/design/gemm-engine.md). The memo is one 64-bit
// mask, the window costs 4 registers for the duration of one compare.
//
// Limits: flags with index >= FlagMemo::kBits (64) are never memoized (they
// are acquired per tile, as before); count == 0 (unknown number of flags,
// e.g. a tile_to_flag table) disables the window read (only the needed flag
// is acquired, and memoized).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TESSERA_MEMO_FN __host__ __device__ __forceinline__
#else
#define TESSERA_MEMO_FN inline
#endif

namespace tessera::kernels::engine {

/// Bit f set: flag f was acquired with a value >= expected in this launch.
struct FlagMemo {
  static constexpr int kBits = 64;
  uint64_t known = 0;
  TESSERA_MEMO_FN bool has(int f) const { return f >= 0 && f < kBits && ((known >> f) & 1u) != 0; }
  TESSERA_MEMO_FN void mark(int f) {
    if (f >= 0 && f < kBits) known |= uint64_t{1} << f;
  }
  /// Marks flag first + j for every bit j of `bits` (bits that would land
  /// past the memo's 64 flags are dropped by the shift).
  TESSERA_MEMO_FN void mark_bits(int first, uint32_t bits) {
    if (first >= 0 && first < kBits) known |= uint64_t{bits} << first;
  }
};

/// Flags per window read: 16 bytes, one vector load (4 u32 / 2 u64 flags).
template <class FlagT>
inline constexpr int kFlagWindow = 16 / static_cast<int>(sizeof(FlagT));

/// The aligned window of kWindow flags that holds flag f, clipped to
/// [0, count): flags [first, last]. kWindow is a power of two dividing
/// FlagMemo::kBits, so a window of a memoizable flag never crosses the memo's
/// end (and first * sizeof(flag) is a multiple of the window's byte size).
template <int kWindow>
TESSERA_MEMO_FN void flag_window(int f, int count, int& first, int& last) {
  static_assert(kWindow > 0 && (kWindow & (kWindow - 1)) == 0 && FlagMemo::kBits % kWindow == 0,
                "window must be a power of two dividing the memo size");
  first = f & ~(kWindow - 1);  // f >= 0
  last = first + kWindow - 1 < count - 1 ? first + kWindow - 1 : count - 1;
}

/// Waits until every flag in [f0, f1] is >= expected (see the file comment).
/// Loader:
///   uint32_t relaxed_ready(int first, int last, FlagT expected): strong
///     relaxed loads of flags [first, last] (last - first < kWindow, first a
///     multiple of kWindow), all issued before any is compared; bit j set iff
///     flag first + j read >= expected (bits past last are 0);
///   void fence_acquire(): fence.acq_rel at the flags' scope;
///   void spin(int f): acquire loads until flag f >= expected (times out itself).
template <int kWindow, class FlagT, class Loader>
TESSERA_MEMO_FN bool memo_wait(FlagMemo& memo, int f0, int f1, int count, FlagT expected, Loader& ld) {
  static_assert(kWindow <= 32, "the ready mask is 32 bits");
  bool acquired = false;
  for (int f = f0; f <= f1; ++f) {
    if (memo.has(f)) continue;
    if (count > 0 && f < FlagMemo::kBits) {
      int first = 0, last = 0;
      flag_window<kWindow>(f, count, first, last);
      const uint32_t ready = ld.relaxed_ready(first, last, expected);
      ld.fence_acquire();  // acquire pattern for every flag read above
      acquired = true;
      memo.mark_bits(first, ready);
      if (memo.has(f)) continue;
    }
    ld.spin(f);
    memo.mark(f);
    acquired = true;
  }
  return acquired;
}

}  // namespace tessera::kernels::engine

#undef TESSERA_MEMO_FN
