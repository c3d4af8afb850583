// tessera/link/wait.cuh — the one device-side wait: spin on a word with an
// acquire load until a predicate holds, give up after a timeout with a
// diagnostic record, and trap.
//
// Every wait of the library that can hang goes through wait_until: link's
// tile primitives (device_primitives.cuh), the GEMM engine's FlagWait
// (kernels/gemm/prologue.cuh), the ops' fused prologues and the signal
// layer's spinning waiter. The scope is a template parameter (Scope::gpu
// when the writer is on this GPU, Scope::sys when it is a peer or the host).
//
// Contract:
//  * Acquire: wait_until returns the first value v read with ld.acquire at
//    scope S for which ready(v) holds, so the caller sees every write the
//    writer released (at S or wider) before storing or adding that value.
//    Call it from ONE thread; the others wait on a barrier behind it.
//  * Poll: one load; while not ready, load again, check the timer and
//    sleep kWaitSleepNs. The first load costs no timer read (the fast path
//    of a flag that is already set).
//  * Timeout: once `timeout_ns` nanoseconds of the global timer have passed
//    since the first failed load, the waiter fills the WaitRecord (record may be null:
//    nothing is recorded) with the site, the expected value and the last
//    value seen, calls `report` (a caller that is not a wgmma kernel may
//    printf there), and traps. The host turns the record into an Error
//    (runtime::WaitDiagnostics, runtime::synchronize).
//  * Call-free by default: no printf, no function call, so the wait may sit
//    in a wgmma kernel (a call there makes ptxas serialize every wgmma).
#pragma once

#include <cstdint>

#include "tessera/link/memory_order.cuh"
#include "tessera/runtime/wait_diagnostics.hpp"

namespace tessera::link {

/// Nanoseconds a waiter sleeps between two loads of the word.
inline constexpr unsigned kWaitSleepNs = 64;

/// Where a wait is, for its diagnostic (runtime::WaitRecord's fields; -1:
/// not known or not applicable). The waiting block is recorded itself.
struct WaitSite {
  runtime::WaitKind kind;
  int rank = -1;
  int tile = -1;
  int tile_m = -1, tile_n = -1;
  int channel = -1;
  int peer = -1;
};

/// How long a wait may last and where a timeout is recorded.
struct WaitLimit {
  std::uint64_t timeout_ns = 0;
  runtime::WaitRecord* record = nullptr;
};

namespace detail {

/// First-waiter-wins claim of the process's WaitRecord. It lives in device
/// memory: a system-scope atomic on host-mapped memory needs host-native
/// atomics, which PCIe hosts do not give (compute-sanitizer rejects it).
/// One word per translation unit: after the first trap the context is lost,
/// so two units filling the record at once is not worth a global word.
static __device__ unsigned int wait_record_claim = 0;

/// The default report hook: nothing (call-free).
struct NoReport {
  __device__ __forceinline__ void operator()(std::uint64_t) const {}
};

}  // namespace detail

/// Fills the host-mapped WaitRecord `r` (may be null) unless another waiter
/// of this unit already did, and publishes it: the fields, a system fence,
/// then `claimed` = 1, which the host reads with acquire semantics
/// (runtime::WaitDiagnostics). Call-free, so it may sit in a wgmma kernel.
__device__ __forceinline__ void record_wait_timeout(runtime::WaitRecord* r, const WaitSite& site,
                                                    std::uint64_t expected, std::uint64_t seen,
                                                    std::uint64_t timeout_ns) {
  if (r == nullptr || atomicCAS(&detail::wait_record_claim, 0u, 1u) != 0u) return;
  r->kind = static_cast<int>(site.kind);
  r->rank = site.rank;
  r->block = static_cast<int>(blockIdx.x);
  r->tile = site.tile;
  r->tile_m = site.tile_m;
  r->tile_n = site.tile_n;
  r->channel = site.channel;
  r->peer = site.peer;
  r->expected = expected;
  r->seen = seen;
  r->timeout_ns = timeout_ns;
  __threadfence_system();
  *reinterpret_cast<volatile unsigned int*>(&r->claimed) = 1u;
  __threadfence_system();
}

/// Records a failed wait (or check) and traps.
__device__ __forceinline__ void wait_failed(const WaitLimit& limit, const WaitSite& site, std::uint64_t expected,
                                            std::uint64_t seen) {
  record_wait_timeout(limit.record, site, expected, seen, limit.timeout_ns);
  __trap();
}

/// The one wait (see the file comment): spins until ready(v) for v =
/// ld.acquire.S(word) and returns v; on a timeout records `site`,
/// `expected` and the last v, calls report(v) and traps.
template <Scope S, class T, class Ready, class Report = detail::NoReport>
__device__ __forceinline__ T wait_until(const T* word, Ready ready, std::uint64_t expected, const WaitLimit& limit,
                                        const WaitSite& site, Report report = {}) {
  T v = mo::ld_acquire<S>(word);
  if (ready(v)) return v;
  const std::uint64_t start = mo::globaltimer_ns();
  while (!ready(v = mo::ld_acquire<S>(word))) {
    if (mo::globaltimer_ns() - start > limit.timeout_ns) {
      record_wait_timeout(limit.record, site, expected, static_cast<std::uint64_t>(v), limit.timeout_ns);
      report(static_cast<std::uint64_t>(v));
      __trap();
    }
    __nanosleep(kWaitSleepNs);
  }
  return v;
}

/// wait_until for the common case: *word >= target (flags and counters
/// that only grow).
template <Scope S, class T>
__device__ __forceinline__ T wait_geq(const T* word, T target, const WaitLimit& limit, const WaitSite& site) {
  return wait_until<S>(
      word, [target](T v) { return v >= target; }, static_cast<std::uint64_t>(target), limit, site);
}

}  // namespace tessera::link
