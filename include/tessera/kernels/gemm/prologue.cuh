// tessera/kernels/gemm/prologue.cuh — per-tile waits (the Prologue policy).
//
// Concept:
//   static constexpr bool kActive;           // false: the kernel emits nothing
//   __device__ void wait(const TileInfo& t) const;
// wait() runs on the producer thread (the one that issues the tile's TMA
// loads) before the first load of tile t. It must not return before the
// tile's inputs are in global memory and visible at the scope they were
// published at (acquire). The kernel then executes fence.proxy.async.global
// so the TMA loads (async proxy) are ordered after the acquire.
//
// The link layer's consumer_tile_wait plugs in as a Prologue: any type with
// this interface works.
#pragma once

#include <cstdint>

#include "tessera/kernels/gemm/ptx.cuh"
#include "tessera/kernels/gemm/tile.cuh"
#include "tessera/kernels/gemm/wait_diag.hpp"

namespace tessera::kernels::engine {

__device__ __forceinline__ void record_timeout(WaitDiag* d, const TileInfo& t, int flag, uint64_t expected,
                                               uint64_t seen, uint64_t timeout_ns) {
  if (!d) return;
  if (atomicCAS(reinterpret_cast<unsigned int*>(&d->magic), 0u, 1u) != 0u) return;  // someone else recorded
  volatile WaitDiag* v = d;
  v->block = static_cast<int>(blockIdx.x);
  v->tile_m = t.m;
  v->tile_n = t.n;
  v->flag = flag;
  v->expected = expected;
  v->seen = seen;
  v->timeout_ns = timeout_ns;
  __threadfence_system();
  v->magic = WaitDiag::kMagic;
  __threadfence_system();
}

/// No wait: the default; compiles to nothing.
struct NoWait {
  static constexpr bool kActive = false;
  __device__ __forceinline__ void wait(const TileInfo&) const {}
};

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
///
/// A wait longer than timeout_ns records block, tile, flag index, expected and
/// seen values in `diag` (host-mapped memory from kernels::wait_diagnostics(),
/// readable after the context is lost; kernels::last_wait_timeout() formats
/// it), then traps: the host sees cudaErrorLaunchFailure from the next
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
  WaitDiag* diag = nullptr;                  // where a timeout is recorded (may be null)

  __device__ __forceinline__ FlagT load(int f) const {
    if constexpr (kSys)
      return ptx::ld_acquire_sys(flags + f);
    else
      return ptx::ld_acquire_gpu(flags + f);
  }

  __device__ void wait_one(const TileInfo& t, int f) const {
    FlagT seen = load(f);
    if (seen >= expected) return;
    const uint64_t start = ptx::globaltimer_ns();
    while ((seen = load(f)) < expected) {
      if (ptx::globaltimer_ns() - start > timeout_ns) {
        record_timeout(diag, t, f, static_cast<uint64_t>(expected), static_cast<uint64_t>(seen), timeout_ns);
        __trap();
      }
      __nanosleep(64);
    }
  }

  __device__ void wait(const TileInfo& t) const {
    if (tile_to_flag) {
      wait_one(t, tile_to_flag[t.m * t.tiles_n + t.n]);
    } else if (rows_per_flag > 0) {
      const int last = min(t.row0 + t.bm, t.M) - 1;
      for (int f = t.row0 / rows_per_flag; f <= last / rows_per_flag; ++f) wait_one(t, f);
    } else if (cols_per_flag > 0) {
      const int last = min(t.col0 + t.bn, t.N) - 1;
      for (int f = t.col0 / cols_per_flag; f <= last / cols_per_flag; ++f) wait_one(t, f);
    }
  }
};

}  // namespace tessera::kernels::engine
