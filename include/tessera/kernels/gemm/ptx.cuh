// tessera/kernels/gemm/ptx.cuh — thin wrappers over the Hopper (sm_90a) PTX
// the GEMM engine uses: mbarriers, TMA bulk tensor copies, wgmma
// fence/commit/wait, register reallocation, acquire/release flag accesses.
//
// Memory-order notes (each wrapper states its own):
//  * mbarrier arrive has release semantics at CTA scope, try_wait acquire:
//    a consumer that saw a phase complete sees the smem the producer's TMA
//    wrote (complete_tx) and a producer that saw "empty" may overwrite it.
//  * TMA loads run in the async proxy. Data written to global memory by
//    ordinary stores (generic proxy) in another kernel/agent and acquired via
//    a flag needs fence_proxy_async_global() before the TMA that reads it
//    (by the acquiring thread, then CTA synchronisation if another thread
//    issues the TMA).
#pragma once

#include <cuda.h>
#include <cstdint>

namespace tessera::kernels::engine::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier ---------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
/// Makes mbarrier initialisation visible to the async proxy (TMA) and cluster.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
/// True in exactly one active lane of the (fully active) warp: elect.sync.
/// A branch on it tells ptxas that one lane runs the body, so the body may
/// keep warp-uniform values in uniform registers (CUTLASS's elect_one_sync).
__device__ __forceinline__ bool elect_one_sync() {
  uint32_t pred = 0;
  asm volatile("{\n.reg .pred P;\nelect.sync _|P, 0xffffffff;\nselp.b32 %0, 1, 0, P;\n}\n" : "=r"(pred));
  return pred != 0;
}
/// Release-arrive (CTA scope).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
/// Blocks until the phase with the given parity has completed (acquire).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred P1;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@!P1 bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// ---- TMA ----------------------------------------------------------------------
__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
/// 4-D tiled bulk tensor load (coordinates c0 innermost .. c3 outermost),
/// e.g. a [seq, head_dim] box of one (batch, head) of a [B, S, H, D] tensor
/// mapped as {D, S, H, B}: out-of-bounds elements are zero-filled per
/// dimension (a box past the sequence end never reads the next head).
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
/// 2-D tiled bulk tensor load global -> shared; completes on `bar` (complete_tx).
/// Out-of-bounds box elements are zero-filled and still count toward the bytes.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
      : "memory");
}
/// 3-D tiled bulk tensor load (coordinates c0 innermost .. c2 outermost),
/// e.g. one group's [N, K] matrix of a [G, N, K] tensor with c2 = group:
/// out-of-bounds elements in each dimension are zero-filled per group.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];" ::
          "r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
/// The same, multicast: the box lands at the same smem offset in every CTA of
/// `cta_mask` (this cluster) and completes on the mbarrier at the same offset
/// in each of them.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                                      uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
}

// ---- bulk tensor stores (the TMA-store epilogue) -----------------------------------
/// 2-D tiled bulk tensor store shared -> global of the box at `src` to
/// coordinates (c0 innermost, c1); elements outside the tensor's dims are
/// not written. Part of this thread's current bulk group (bulk_commit_group).
/// The smem it reads must have been written before a
/// fence_proxy_async_shared by each writer and a barrier with this thread.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1)
               : "memory");
}
/// Closes this thread's current bulk group (the stores issued since the last one).
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
/// Waits until at most N of this thread's bulk groups still read their
/// shared memory source (the smem may then be rewritten; their global
/// writes may still be in flight).
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
/// Waits until at most N of this thread's bulk groups are incomplete
/// (N = 0: every store issued is complete, its writes performed).
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

/// Stores four 8x8 matrices of 16-bit values, held by the warp in the mma
/// fragment layout (register r_i: matrix i; lane l holds row l / 4, columns
/// 2 (l % 4) and 2 (l % 4) + 1, the low half first), to shared memory: lane
/// l gives the address of row l % 8 of matrix l / 8 (16 contiguous bytes).
/// Warp-wide: every lane must execute it.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// ---- clusters -----------------------------------------------------------------
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
/// Arrive on the mbarrier at the same smem offset in CTA `cta` of this
/// cluster (default .release.cta semantics, as for a local arrive: the slot's
/// readers are this thread's retired wgmma; a .release.cluster qualifier is
/// not needed and may make each arrive wait for outstanding operations).
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_addr(bar)),
      "r"(cta)
      : "memory");
}
/// All threads of all CTAs of the cluster (release / acquire at cluster scope).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

/// Orders this thread's earlier generic-proxy global accesses (e.g. an
/// acquire load of a ready flag) before later async-proxy (TMA) accesses: its
/// own, and those of threads it then synchronises with (release/acquire, e.g.
/// an mbarrier arrive / wait: the GEMM's prologue waiter, kernel_common.cuh).
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

/// Orders shared memory this thread observed written through the generic
/// proxy (cp.async, st.shared; seen through an mbarrier wait) before its
/// later async-proxy reads of it (wgmma's shared-memory operands).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// ---- cp.async (per-thread 16-byte copies; the grouped GEMM's row gather) ------
/// 16 bytes global -> shared, cached in L2 only; src_bytes 0 writes zeros
/// (and reads nothing: `src` may then be any valid address).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
/// Arrives on `bar` once every cp.async this thread issued so far has landed
/// (.noinc: the arrival counts against the barrier's expected count, so
/// mbar_init must include one per arriving thread).
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// ---- wgmma --------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/// Keeps the compiler from moving accumulator reads/writes across wgmma ops.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/// Transposes an 8x8 matrix of 16-bit values held by the warp in the mma
/// fragment layout (lane l: row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1,
/// the low half first); returns the transposed matrix in the same layout.
/// Warp-wide: every lane of the warp must execute it.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t a) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
  return d;
}

// ---- register reallocation ----------------------------------------------------------
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
}

/// Arrive on named barrier `id` without waiting (release-like: this thread's
/// earlier memory accesses are performed relative to the threads that wait
/// on the barrier with bar.sync).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/// Named barrier among `threads` threads (multiple of 32) with id `id` (1..15).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/// Programmatic dependent launch (a kernel launched with
/// cudaLaunchAttributeProgrammaticStreamSerialization): blocks until the
/// preceding kernel in the stream has completed and its memory is visible.
/// A no-op in a kernel launched without the attribute.
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

/// Programmatic dependent launch, the other side: lets the next kernel in
/// the stream, if it was launched with the attribute, be scheduled once every
/// CTA of this grid executed this (or exited). It says nothing about this
/// grid's memory: the dependent still waits (grid_dependency_wait) for this
/// grid's completion before it touches what this grid writes. A kernel that
/// waits on work outside its own stream must not trigger early: the
/// dependent's CTAs would hold SMs that work may need.
__device__ __forceinline__ void grid_dependents_launch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

}  // namespace tessera::kernels::engine::ptx
