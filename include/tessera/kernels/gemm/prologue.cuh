// tessera/kernels/gemm/prologue.cuh — per-tile waits (the Prologue policy).
//
// Concept:
//   static constexpr bool kActive;           // false: the kernel emits nothing
//   __device__ void wait(const TileInfo& t) const;
// and optionally, for a prologue that keeps state across the tiles of one
// producer (e.g. a memo of flags already acquired):
//   using State = ...;                       // default-constructible
//   __device__ bool wait(const TileInfo& t, State& s) const;
// wait() runs on the producer warpgroup's waiter thread (lane 0 of warp
// WaiterRing::kWaiterWarp, barriers.cuh), for the CTA's tiles in schedule
// order, up to WaiterRing::kSlots tiles ahead of the thread that issues the
// TMA loads; one thread calls it for every tile, so State lives across tiles.
// It must not return before the tile's inputs are in global memory and
// visible at the scope they were published at (acquire). The waiter then
// executes fence.proxy.async.global and arrives on the ring's ready mbarrier
// (release.cta); the TMA thread's wait on it (acquire.cta) orders the tile's
// TMA loads (async proxy) after the acquire (argument in kernel_common.cuh, run_waiter). The
// stateful form returns whether it executed an acquire; when it returns
// false (every input of t was acquired while waiting for an earlier tile)
// the waiter skips the proxy fence: the fence that followed that earlier
// acquire preceded an earlier ready arrive, which the TMA thread acquired
// before t's loads. prologue_wait() below dispatches; a prologue with only
// the stateless wait() (the ops' RsOwnerPrologue) is fenced
// after every tile, as before. wait() runs under the producer warpgroup's
// register budget (setmaxnreg kProducerRegs = 40): keep it small.
//
// A prologue may also redirect a tile's A loads (optional):
//   __device__ void a_source(const CUtensorMap*& map, int& row) const;
// called by the TMA thread before a tile's loads with map = the kernel's A
// descriptor and row = the tile's first row; it may point them at another descriptor
// (which must live in the __grid_constant__ kernel parameters, e.g. as a
// member of the prologue itself) and row coordinate. The ops' AgPrologue
// uses it to read the rank's own shard from the caller's A instead of a copy
// in the gathered workspace. Same box and swizzle as the kernel's A map.
//
// The link layer's consumer_tile_wait plugs in as a Prologue: any type with
// this interface works.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "tessera/kernels/gemm/flag_memo.hpp"
#include "tessera/kernels/gemm/ptx.cuh"
#include "tessera/kernels/gemm/tile.cuh"
#include "tessera/link/memory_order.cuh"
#include "tessera/link/wait.cuh"
#include "tessera/runtime/wait_diagnostics.hpp"

namespace tessera::kernels::engine {

/// No wait: the default; compiles to nothing.
struct NoWait {
  static constexpr bool kActive = false;
  __device__ __forceinline__ void wait(const TileInfo&) const {}
};

namespace detail {
struct NoPrologueState {};
template <class P, class = void>
struct PrologueStateOf {
  using type = NoPrologueState;
};
template <class P>
struct PrologueStateOf<P, std::void_t<typename P::State>> {
  using type = typename P::State;
};
template <class P, class S, class = void>
struct HasStatefulWait : std::false_type {};
template <class P, class S>
struct HasStatefulWait<
    P, S,
    std::enable_if_t<std::is_same_v<
        decltype(std::declval<const P&>().wait(std::declval<const TileInfo&>(), std::declval<S&>())), bool>>>
    : std::true_type {};
}  // namespace detail

template <class P, class = void>
struct HasASource : std::false_type {};
template <class P>
struct HasASource<P, std::void_t<decltype(std::declval<const P&>().a_source(
                         std::declval<const CUtensorMap*&>(), std::declval<int&>()))>> : std::true_type {};

/// Lets P redirect a tile's A loads (see the concept above); a no-op for
/// prologues without a_source.
template <class P>
__device__ __forceinline__ void prologue_a_source(const P& p, const CUtensorMap*& map, int& row) {
  if constexpr (HasASource<P>::value) p.a_source(map, row);
}

/// The producer's per-launch state of Prologue P (an empty struct if P has none).
template <class P>
using PrologueState = typename detail::PrologueStateOf<P>::type;

/// Calls P's stateful wait if it has one, else the stateless one. Returns
/// whether the kernel must execute fence.proxy.async.global before the
/// tile's TMA loads (always true for a stateless prologue).
template <class P>
__device__ __forceinline__ bool prologue_wait(const P& p, const TileInfo& t, PrologueState<P>& s) {
  if constexpr (detail::HasStatefulWait<P, PrologueState<P>>::value) {
    return p.wait(t, s);
  } else {
    p.wait(t);
    return true;
  }
}

/// Strong relaxed loads of flags (no ordering by themselves: memo_wait
/// follows them with an acquire fence). .sys scope for peer / host producers.
__device__ __forceinline__ uint32_t ld_relaxed_flag(const uint32_t* p, bool sys) {
  uint32_t v;
  if (sys)
    asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  else
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t ld_relaxed_flag(const uint64_t* p, bool sys) {
  uint64_t v;
  if (sys)
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  else
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

/// One 16-byte relaxed vector load (p 16-byte aligned) of 4 u32 / 2 u64
/// flags, reduced to a ready mask: bit j iff p[j] >= expected. Each element is
/// a strong relaxed read (PTX: a vector access is a set of scalar accesses).
__device__ __forceinline__ uint32_t ld_relaxed_ready16(const uint32_t* p, uint32_t expected, bool sys) {
  uint32_t a, b, c, d;
  if (sys)
    asm volatile("ld.relaxed.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
                 : "l"(p)
                 : "memory");
  else
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
                 : "l"(p)
                 : "memory");
  return uint32_t{a >= expected} | uint32_t{b >= expected} << 1 | uint32_t{c >= expected} << 2 |
         uint32_t{d >= expected} << 3;
}
__device__ __forceinline__ uint32_t ld_relaxed_ready16(const uint64_t* p, uint64_t expected, bool sys) {
  uint64_t a, b;
  if (sys)
    asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
  else
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
  return uint32_t{a >= expected} | uint32_t{b >= expected} << 1;
}

/// Waits until flag[f] >= expected for every flag f the tile maps to.
///
/// Tile -> flag map, in order of precedence:
///  * tile_to_flag != nullptr: one flag, tile_to_flag[tile_m * tiles_n + tile_n];
///  * rows_per_flag > 0: A-row readiness — the flags covering rows
///    [row0, row0 + BM) ∩ [0, M), i.e. flags row/rows_per_flag (AG+GEMM: one
///    flag per gathered chunk of rows);
///  * cols_per_flag > 0: B-column readiness, likewise over columns.
/// Flags are uint32_t or uint64_t (FlagT), read with ld.acquire at .gpu scope
/// (same-GPU producer) or .sys scope (peer / host producer, kSys = true).
/// Epoch-based: callers pass the epoch they expect (>=), nothing is reset.
/// Contract: while the GEMM runs, a flag never decreases (no reset, no wrap),
/// so the producer memoizes flags it has acquired (State = FlagMemo, see
/// flag_memo.hpp: one relaxed 16-byte read of an aligned window of flags +
/// one acquire fence on a miss; nothing at all on a hit). `flags` should be
/// 16-byte aligned (see Loader; misaligned works, with scalar loads).
///
/// The spin is link::wait_until (link/wait.cuh): a wait longer than
/// timeout_ns records block, tile, flag index, expected and seen values in
/// `diag` (a runtime::WaitRecord, e.g. runtime::process_wait_diagnostics()'s,
/// readable after the context is lost; WaitDiagnostics::describe formats it),
/// then traps: the host sees cudaErrorLaunchFailure from the next
/// synchronising call.
///
/// No printf here on purpose: any call in the kernel makes ptxas serialize
/// every wgmma of the kernel (warning C7510), costing ~10-25%. The same
/// holds for any Prologue/Epilogue: keep device code call-free.
template <class FlagT = uint32_t, bool kSys = false>
struct FlagWait {
  static constexpr bool kActive = true;
  const FlagT* flags = nullptr;
  FlagT expected = 1;
  const int* tile_to_flag = nullptr;
  int rows_per_flag = 0;
  int cols_per_flag = 0;
  uint64_t timeout_ns = 10'000'000'000ull;  // 10 s
  runtime::WaitRecord* diag = nullptr;      // where a timeout is recorded (may be null)
  static constexpr link::Scope kScope = kSys ? link::Scope::sys : link::Scope::gpu;

  __device__ __forceinline__ void wait_one(const TileInfo& t, int f) const {
    link::wait_geq<kScope>(flags + f, expected, link::WaitLimit{timeout_ns, diag},
                           link::WaitSite{runtime::WaitKind::tile_flag, -1, -1, t.m, t.n, f, -1});
  }

  /// Relaxed reads of a window of flags per miss: 16 bytes (4 u32 / 2 u64),
  /// one vector load, reduced to a mask at once — within the producer's 40
  /// registers (an 8-value window spilled: docs/design/gemm-engine.md).
  static constexpr int kWindow = kFlagWindow<FlagT>;
  using State = FlagMemo;

  /// Alignment contract: `flags` should be 16-byte aligned (cudaMalloc /
  /// cudaHostAlloc arrays and any offset that is a multiple of 16 bytes are).
  /// Then window [first, first + kWindow) (first a multiple of kWindow) is one
  /// aligned v4.u32 / v2.u64 load. A misaligned array, and the clipped last
  /// window of an array whose length is not a multiple of kWindow, are read
  /// with scalar relaxed loads of flags [first, last] only (same memory
  /// order, more instructions; never a read past flag count - 1).
  struct Loader {
    const FlagWait* w;
    TileInfo t;  // by value: no address-taken TileInfo (stack frame)
    __device__ __forceinline__ uint32_t relaxed_ready(int first, int last, FlagT e) const {
      const FlagT* p = w->flags + first;
      if (last - first == kWindow - 1 && (reinterpret_cast<uintptr_t>(p) & 15u) == 0)
        return ld_relaxed_ready16(p, e, kSys);
      // Scalar path: every load in [first, last] (index clamped, no branch),
      // all issued before the compares.
      FlagT v[kWindow];
#pragma unroll
      for (int j = 0; j < kWindow; ++j) v[j] = ld_relaxed_flag(p + min(j, last - first), kSys);
      uint32_t bits = 0;
#pragma unroll
      for (int j = 0; j < kWindow; ++j) bits |= uint32_t{j <= last - first && v[j] >= e} << j;
      return bits;
    }
    __device__ __forceinline__ void fence_acquire() const { link::mo::fence_acq_rel<kScope>(); }
    __device__ __forceinline__ void spin(int f) const { w->wait_one(t, f); }
  };

  /// Memoized wait (the kernel's path): true iff it acquired anything. One
  /// memo_wait call site (and wait_one force-inlined): no device function
  /// call, no stack frame in the producer.
  __device__ __forceinline__ bool wait(const TileInfo& t, FlagMemo& memo) const {
    int f0 = 0, f1 = -1, count = 0;  // flags [f0, f1]; count 0: unknown (no window)
    if (tile_to_flag) {
      f0 = f1 = tile_to_flag[t.m * t.tiles_n + t.n];
    } else if (rows_per_flag > 0) {
      f0 = t.row0 / rows_per_flag;
      f1 = (min(t.row0 + t.bm, t.M) - 1) / rows_per_flag;
      count = (t.M + rows_per_flag - 1) / rows_per_flag;
    } else if (cols_per_flag > 0) {
      f0 = t.col0 / cols_per_flag;
      f1 = (min(t.col0 + t.bn, t.N) - 1) / cols_per_flag;
      count = (t.N + cols_per_flag - 1) / cols_per_flag;
    }
    Loader ld{this, t};
    return memo_wait<kWindow>(memo, f0, f1, count, expected, ld);
  }

  /// Stateless form (one tile, no memo across tiles).
  __device__ void wait(const TileInfo& t) const {
    FlagMemo memo;
    wait(t, memo);
  }
};

}  // namespace tessera::kernels::engine
