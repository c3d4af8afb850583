// tessera/kernels/attention/kv_wait.cuh — the attention kernel's KV-loop
// hook (the counterpart of the GEMM's Prologue, ../gemm/prologue.cuh).
//
// Concept:
//   static constexpr bool kActive;            // false: the kernel emits nothing
//   __device__ void wait(const KvBlockInfo& b) const;
//   or, stateful (preferred):
//   using State = ...;                        // per CTA, value-initialized
//   __device__ bool wait(const KvBlockInfo& b, State& s) const;  // true: it acquired
// wait() runs on the producer warpgroup's waiter thread (lane 0 of warp
// engine::WaiterRing::kWaiterWarp, gemm/barriers.cuh), for every KV block of
// the CTA in visiting order (kv_block_at: descending b.block by default, the
// diagonal / ragged blocks first), up to WaiterRing::kSlots blocks ahead of
// the TMA thread that loads K and V rows [b.row0, b.row0 + b.rows) of
// (b.batch, b.head_kv); one thread calls it for every block, so State lives
// across blocks. It must not return before those rows are in global memory
// and visible at the scope they were published at (acquire). The waiter then
// executes fence.proxy.async.global and arrives on the ring's ready mbarrier
// (release.cta); the TMA thread's wait on it (acquire.cta) orders the block's
// TMA loads (async proxy) after the acquire (argument in kernel.cuh,
// run_kv_waiter). A stateful hook remembers what it acquired (flags never
// decrease during the kernel) and returns false when it acquired nothing new;
// the waiter then skips the fence: the acquire and fence that covered those
// flags preceded an earlier ready arrive, which the TMA thread acquired before
// this block's loads. The stateless form is fenced after every block. wait()
// runs under the producer's register budget (AttnConfig::kProducerRegs):
// keep it small and call-free (no printf: see FlagWait).
//
// Optionally, a hook chooses the order in which the CTA visits its KV blocks
// (producer and consumers alike; the online softmax is order-free):
//   __device__ int kv_block(int i, int n_blocks) const;  // i-th block to visit
// a permutation of [0, n_blocks) for every n_blocks (the CTA's causal
// prefix). Default: descending, n_blocks - 1 - i (masked blocks first).
// sp_attention's hook visits blocks in the order their chunks land
// (ops::kv_arrival_order), so a CTA does not wait on a late chunk while
// chunks that have landed wait behind it (docs/design/attention.md).
//
// Optionally, a hook reads some KV blocks from other tensor maps (the same
// box and swizzle as the kernel's K and V maps), called by the TMA thread:
//   __device__ bool kv_source(const KvBlockInfo& b, const CUtensorMap*& k,
//                             const CUtensorMap*& v, int& row) const;
// true: block b's K and V rows are loaded from k and v at key row `row`
// instead of b.row0 of the kernel's maps. The data must be in global memory
// before the kernel starts (the hook's wait does not cover it). sp_attention
// reads the rank's own chunks in place from the caller's K and V this way.
//
// ops::sp_attention waits for all-gathered KV chunks through KvFlagWait
// below: the engine's FlagWait (row readiness, rows_per_flag = the chunk
// length), so the timeout diagnostic and the memo are the GEMM's.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "tessera/kernels/gemm/prologue.cuh"

namespace tessera::kernels::attn {

/// What the kernel tells its KV hook about the block it is about to load.
struct KvBlockInfo {
  int batch, head_kv;
  int block;     ///< KV block index (row0 / BN)
  int row0;      ///< first key row of the block
  int rows;      ///< block height (BN); rows past seqlen_k are zero-filled
  int seqlen_k;  ///< key rows of the KV tensor
};

template <class H, class = void>
struct HasKvBlockOrder : std::false_type {};
template <class H>
struct HasKvBlockOrder<H, std::void_t<decltype(std::declval<const H&>().kv_block(0, 1))>> : std::true_type {};

template <class H, class = void>
struct HasKvSource : std::false_type {};
template <class H>
struct HasKvSource<H, std::void_t<decltype(std::declval<const H&>().kv_source(
                          std::declval<const KvBlockInfo&>(), std::declval<const CUtensorMap*&>(),
                          std::declval<const CUtensorMap*&>(), std::declval<int&>()))>> : std::true_type {};

/// Lets hook h redirect block b's K and V loads (see the concept above); a
/// no-op for hooks without kv_source.
template <class H>
__device__ __forceinline__ void kv_block_source(const H& h, const KvBlockInfo& b, const CUtensorMap*& k,
                                                const CUtensorMap*& v, int& row) {
  if constexpr (HasKvSource<H>::value) h.kv_source(b, k, v, row);
}

/// A stateful hook's per-CTA State (see the concept above), else an empty type.
template <class H, class = void>
struct KvWaitState {
  struct type {};
  static constexpr bool kStateful = false;
};
template <class H>
struct KvWaitState<H, std::void_t<typename H::State>> {
  using type = typename H::State;
  static constexpr bool kStateful = true;
};

/// The i-th KV block of n_blocks the CTA visits under hook h.
template <class H>
__device__ __forceinline__ int kv_block_at(const H& h, int i, int n_blocks) {
  if constexpr (HasKvBlockOrder<H>::value)
    return h.kv_block(i, n_blocks);
  else
    return n_blocks - 1 - i;
}

/// Calls h's stateful wait if it has a State, else the stateless one.
/// Returns whether the waiter must execute fence.proxy.async.global before
/// it hands the block to the TMA thread (always true for a stateless hook).
template <class H>
__device__ __forceinline__ bool kv_wait(const H& h, const KvBlockInfo& b, typename KvWaitState<H>::type& s) {
  if constexpr (KvWaitState<H>::kStateful) {
    return h.wait(b, s);
  } else {
    h.wait(b);
    return true;
  }
}

/// No wait: a plain attention kernel.
struct NoKvWait {
  static constexpr bool kActive = false;
  __device__ __forceinline__ void wait(const KvBlockInfo&) const {}
};

/// Waits for the flags covering the block's key rows through the GEMM
/// engine's FlagWait (rows_per_flag > 0 required: one flag per chunk of
/// rows_per_flag key rows, flag index = row / rows_per_flag; the same flags
/// serve every batch and head). Epoch-based like FlagWait (>= expected).
template <class FlagT = uint32_t, bool kSys = false>
struct KvFlagWait {
  static constexpr bool kActive = true;
  using State = engine::FlagMemo;  ///< the flags this CTA has acquired
  engine::FlagWait<FlagT, kSys> flags;
  __device__ __forceinline__ bool wait(const KvBlockInfo& b, State& memo) const {
    const engine::TileInfo t{b.block, 0,          b.block, b.row0, 0, b.rows, 1, (b.seqlen_k + b.rows - 1) / b.rows,
                             1,       b.seqlen_k, 1};
    return flags.wait(t, memo);
  }
};

}  // namespace tessera::kernels::attn
