// tessera/link/memory_order.cuh — the few PTX memory operations the link
// primitives are built from, named by scope and order.
//
// Scopes (PTX memory model): `gpu` orders against every thread of this GPU;
// `sys` against every thread of the system, peer GPUs (NVLink/P2P) and the
// host included. Use `gpu` when producer and consumer run on the same GPU
// and `sys` whenever the other side is a peer GPU or the host (stream
// memory operations, copy engine).
//
// Release is cumulative: a release by thread T makes visible every write
// that happens-before it, including writes of other threads of T's CTA that
// T observed through a barrier (bar.sync). Hence the producer pattern
//   all threads store the tile -> __syncthreads() -> one thread releases.
// Acquire pairs with the release that wrote (or preceded, in the RMW chain)
// the value it reads: after acquire-reading a flag >= target, the reader
// sees every write released before the corresponding notify.
#pragma once

#include <cstdint>

namespace tessera::link::mo {

// ---- loads -----------------------------------------------------------------
__device__ __forceinline__ std::uint64_t ld_acquire_gpu(const std::uint64_t* p) {
  std::uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ std::uint64_t ld_acquire_sys(const std::uint64_t* p) {
  std::uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
/// Relaxed (no ordering) load at sys scope: for polling before an acquire.
__device__ __forceinline__ std::uint64_t ld_relaxed_sys(const std::uint64_t* p) {
  std::uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// ---- stores ----------------------------------------------------------------
__device__ __forceinline__ void st_release_gpu(std::uint64_t* p, std::uint64_t v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_release_sys(std::uint64_t* p, std::uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// ---- read-modify-write (no return: `red`) ----------------------------------
__device__ __forceinline__ void red_add_release_gpu(std::uint64_t* p, std::uint64_t v) {
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void red_add_release_sys(std::uint64_t* p, std::uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
/// Relaxed (strong) add: a release only together with a preceding
/// fence.acq_rel.{sys,gpu} by the same thread (the GEMM notifier's fence).
__device__ __forceinline__ void red_add_relaxed_sys(std::uint64_t* p, std::uint64_t v) {
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void red_add_relaxed_gpu(std::uint64_t* p, std::uint64_t v) {
  asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// ---- 32-bit flags and counters (GEMM tile flags, wave-group counters) -----
__device__ __forceinline__ std::uint32_t ld_acquire_gpu(const std::uint32_t* p) {
  std::uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ std::uint32_t ld_acquire_sys(const std::uint32_t* p) {
  std::uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_add_release_gpu(std::uint32_t* p, std::uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_add_release_sys(std::uint32_t* p, std::uint32_t v) {
  asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
/// Relaxed (strong) adds: a release only after the same thread's
/// fence.acq_rel at that scope (the GEMM notifier's fence precedes every
/// tile's add; kernels/gemm/epilogue.cuh, visibility contract).
__device__ __forceinline__ void red_add_relaxed_gpu(std::uint32_t* p, std::uint32_t v) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_add_relaxed_sys(std::uint32_t* p, std::uint32_t v) {
  asm volatile("red.relaxed.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// ---- fences ----------------------------------------------------------------
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

/// Nanoseconds of the global timer (coarse, but shared by all SMs).
__device__ __forceinline__ std::uint64_t globaltimer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace tessera::link::mo

namespace tessera::link {

/// The scope of a memory operation, as a parameter (NCCL's device API takes
/// a cuda::thread_scope the same way): `gpu` when every other party runs on
/// this GPU (its SMs, its stream front end, its copy engine), `sys` when one
/// is a peer GPU or the host.
enum class Scope { gpu, sys };

}  // namespace tessera::link

namespace tessera::link::mo {

// ---- the same operations with the scope as a template parameter -----------
// Each compiles to exactly the named operation above (if constexpr).

template <Scope S, class T>
__device__ __forceinline__ T ld_acquire(const T* p) {
  if constexpr (S == Scope::sys)
    return ld_acquire_sys(p);
  else
    return ld_acquire_gpu(p);
}
template <Scope S, class T>
__device__ __forceinline__ void red_add_release(T* p, T v) {
  if constexpr (S == Scope::sys)
    red_add_release_sys(p, v);
  else
    red_add_release_gpu(p, v);
}
template <Scope S, class T>
__device__ __forceinline__ void red_add_relaxed(T* p, T v) {
  if constexpr (S == Scope::sys)
    red_add_relaxed_sys(p, v);
  else
    red_add_relaxed_gpu(p, v);
}
template <Scope S>
__device__ __forceinline__ void st_release(std::uint64_t* p, std::uint64_t v) {
  if constexpr (S == Scope::sys)
    st_release_sys(p, v);
  else
    st_release_gpu(p, v);
}
template <Scope S>
__device__ __forceinline__ void fence_acq_rel() {
  if constexpr (S == Scope::sys)
    fence_acq_rel_sys();
  else
    fence_acq_rel_gpu();
}

}  // namespace tessera::link::mo
