// tessera/kernels/attention/kernel.cuh — the flash-attention forward kernel
// (sm_90a): one CTA per (128-row query tile, query head, batch).
//
// Roles (384 threads, three warpgroups, as the GEMM engine's kernel.cuh):
//   warpgroup 0, producer: one elected lane of warp 0 (the TMA thread) loads
//     the CTA's Q tile once and then, for every KV block (descending by
//     default: the causal-diagonal and ragged-tail blocks, which need masks,
//     come first; a hook may choose another order, kv_wait.cuh), TMA-loads K
//     and V into a kStages-deep ring, K and V with separate full / empty
//     mbarriers so that S = Q·Kᵀ can start before V lands. With an active KV
//     hook, lane 0 of warp engine::WaiterRing::kWaiterWarp (the waiter) runs
//     the hook's wait for each block in the same order, up to
//     WaiterRing::kSlots blocks ahead, and hands each block to the TMA thread
//     through the waiter ring (2 x 2 mbarriers, the GEMM's protocol:
//     gemm/barriers.cuh), so no flag round trip or acquire fence sits on the
//     TMA issue path. setmaxnreg gives the registers away.
//   warpgroups 1 and 2, consumers: 64 query rows each (one wgmma M atom).
//     Per KV block n (FlashAttention-3's intra-warpgroup overlap):
//       issue S_n = Q·K_nᵀ (SS wgmma);  issue O += P_{n+1}·V_{n+1} (RS wgmma,
//       P in registers); wait S_n; release K_n; online softmax of S_n in
//       registers (exp2, scale·log2e folded into one FFMA) while the P·V
//       wgmma runs; wait P·V; release V_{n+1}; rescale O; P_n = bf16(S_n).
//     With kPingPong the two consumers take turns to ISSUE their wgmmas
//     (named barriers kSchedBarrier + c): one warpgroup's softmax runs while
//     the other's matrix multiplies occupy the tensor cores.
//   Epilogue: row sums reduced over the quad, O / l staged in the consumer's
//   own rows of the Q buffer and stored as 16-byte vectors (kSmemEpilogue),
//   LSE = scale·m + ln(l).
//
// Ring protocol (per ring, K and V alike; kStages slots):
//   producer: wait empty[s] (parity ph^1) -> arrive.expect_tx(full[s]) -> TMA
//   consumer: wait full[s] (parity ph) -> wgmma reads slot s -> after the
//             wgmma retired (wait_group), one arrive per consumer warp (8)
//             on empty[s].
// mbarrier arrive is release and try_wait acquire at CTA scope (ptx.cuh), so
// the TMA's writes are seen by the wgmma and the wgmma's reads are finished
// before a slot is overwritten.
//
// Waiter ring (active hooks only; engine::WaiterRing, KV block i of the CTA's
// visiting order in slot i % kSlots):
//   waiter:     wait free[s] (free_parity(i)) -> hook wait -> fence.proxy.async
//               (when it acquired) -> arrive ready[s]
//   TMA thread: wait ready[s] (ready_parity(i)) -> arrive free[s] -> K and V
//               loads of block i
// The same rules as the GEMM's prologue waiter (barriers.cuh argues the
// parities; tests/kernels/gemm_host_test.cpp, GemmWaiterRingModel, checks
// them), with a KV block in place of a tile.
//
// Shared-memory layouts (128-byte swizzle; TMA and wgmma agree on it):
//   Q: D/64 chunks, each BM rows x 64 elements (row r at byte r*128).
//   K, V slot: D/64 chunks, each BN key rows x 64 elements. K is read as the
//   K-major B operand of S = Q·Kᵀ (like the GEMM's NK B), V as the N-major B
//   operand of O = P·V (like the GEMM's KN B; LBO = one chunk, BN*128 bytes).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "tessera/kernels/attention/kv_wait.cuh"
#include "tessera/kernels/attention/wgmma_rs.cuh"
#include "tessera/kernels/gemm/barriers.cuh"  // WaiterRing, ProducerWarpRole
#include "tessera/kernels/gemm/mainloop.cuh"  // make_desc, Wgmma, ptx

namespace tessera::kernels::attn {

namespace ptx = engine::ptx;
using engine::WaiterRing;

/// Compile-time configuration. BM = 128 query rows (two consumer warpgroups
/// of 64), BN keys per KV block, kStages K/V ring slots. kHookActive: the
/// configuration of a kernel with an active KV hook (the producer's register
/// budget and the waiter ring's mbarriers); a hook-free kernel may use it too.
template <int D_, int BN_, int kStages_, bool kPingPong_, bool kHookActive_, bool kSmemEpilogue_ = true>
struct AttnConfig {
  static constexpr int D = D_, BM = 128, BN = BN_, kStages = kStages_;
  static constexpr bool kPingPong = kPingPong_;
  static constexpr bool kHookActive = kHookActive_;
  /// Epilogue through shared memory: each consumer stages its 64 x D tile
  /// of O in its own (then unused) rows of the Q buffer and stores 16-byte
  /// vectors, whole rows per warp; false: 4-byte stores from registers.
  static constexpr bool kSmemEpilogue = kSmemEpilogue_;
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(BN % 16 == 0 && BN <= 256, "BN: a multiple of 16 (P·V k-steps), at most 256 (TMA box)");
  static constexpr int kDChunks = D / 64;
  static constexpr int kThreads = 384;
  static constexpr int kQBytes = BM * D * 2;
  static constexpr int kKVBytes = BN * D * 2;  ///< one K (or V) slot
  static constexpr int kBarrierOffset = kQBytes + 2 * kStages * kKVBytes;
  // Barriers: q_full, k_full[S], k_empty[S], v_full[S], v_empty[S], and with
  // kHookActive the waiter ring's ready[kSlots], free[kSlots].
  static constexpr int kRingBarriers = kHookActive ? 2 * WaiterRing::kSlots : 0;
  static constexpr int kBytes = kBarrierOffset + (1 + 4 * kStages + kRingBarriers) * 8;
  static constexpr int kLaunchBytes = kBytes + 1024;  ///< +1 KiB to align the base
  static_assert(kLaunchBytes <= 227 * 1024, "shared memory");
  /// Register budget after setmaxnreg. 168 per thread at launch (384 threads,
  /// one CTA per SM): 24 + 2 x 240 balances exactly. With a hook too: ptxas
  /// allocates each role within its budget, and the waiter and the TMA thread
  /// fit 24 (no spills, ptxas -v); 232 consumer registers spill at BN = 192.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static constexpr int kEmptyArrivals = 8;  ///< consumer warps reading a slot
  static constexpr int kSchedBarrier = 1;   ///< named barriers 1, 2 (ping-pong)
  static constexpr int kEpiBarrier = 3;     ///< named barriers 3, 4 (smem epilogue)
};

template <class Cfg>
struct AttnSmem {
  uint8_t* base;
  __device__ uint8_t* q() const { return base; }
  __device__ uint8_t* k(int s) const { return base + Cfg::kQBytes + s * Cfg::kKVBytes; }
  __device__ uint8_t* v(int s) const { return base + Cfg::kQBytes + (Cfg::kStages + s) * Cfg::kKVBytes; }
  __device__ uint64_t* bars() const { return reinterpret_cast<uint64_t*>(base + Cfg::kBarrierOffset); }
  __device__ uint64_t* q_full() const { return bars(); }
  __device__ uint64_t* k_full(int s) const { return bars() + 1 + s; }
  __device__ uint64_t* k_empty(int s) const { return bars() + 1 + Cfg::kStages + s; }
  __device__ uint64_t* v_full(int s) const { return bars() + 1 + 2 * Cfg::kStages + s; }
  __device__ uint64_t* v_empty(int s) const { return bars() + 1 + 3 * Cfg::kStages + s; }
  // The waiter ring (Cfg::kHookActive only): the waiter arrives on ready, the
  // TMA thread on free.
  __device__ uint64_t* kv_ready(int s) const { return bars() + 1 + 4 * Cfg::kStages + s; }
  __device__ uint64_t* kv_free(int s) const { return bars() + 1 + 4 * Cfg::kStages + WaiterRing::kSlots + s; }
};

/// Kernel parameters (built once on the host: attention/launch.cuh).
template <class Hook>
struct AttnParams {
  int batch, seqlen_q, seqlen_k, heads_q, group;  ///< group = heads_q / heads_kv
  int causal;
  int q_offset;  ///< causal: row i attends keys j <= i + q_offset
  int q_split;   ///< causal: rows >= q_split (> 0, a multiple of BM) use q_offset_split
  int q_offset_split;
  int m_blocks;      ///< ceil(seqlen_q / BM)
  float scale;       ///< softmax scale (natural units, for the LSE)
  float scale_log2;  ///< scale * log2(e)
  void* o;
  int64_t o_sb, o_ss, o_sh;  ///< O element strides (batch, seq, head)
  float* lse;                ///< [batch, heads_q, seqlen_q] or null
  int64_t lse_sb, lse_sh;    ///< LSE element strides (batch, head); rows contiguous
  Hook hook;
};

/// The CTA's work: query tile, head, batch, and its KV block range.
struct AttnBlock {
  int m_block, head, batch;
  int n_max;     ///< KV blocks [0, n_max) are visited (descending)
  int n_nomask;  ///< blocks n < n_nomask need no mask
  int q_offset;  ///< causal: the tile's row i attends keys j <= i + q_offset
};

template <class Cfg, class Hook>
__device__ __forceinline__ AttnBlock attn_block(const AttnParams<Hook>& p) {
  AttnBlock b;
  const int x = static_cast<int>(blockIdx.x) % p.m_blocks;
  const int rest = static_cast<int>(blockIdx.x) / p.m_blocks;
  b.head = rest % p.heads_q;
  b.batch = rest / p.heads_q;
  // Causal: the longest tiles of each head first (tail balance); KV blocks
  // of one head stay in L2 across its tiles either way.
  b.m_block = p.causal ? p.m_blocks - 1 - x : x;
  const int n_blocks = (p.seqlen_k + Cfg::BN - 1) / Cfg::BN;
  const int m0 = b.m_block * Cfg::BM;
  b.q_offset = p.q_split > 0 && m0 >= p.q_split ? p.q_offset_split : p.q_offset;
  int n_full = p.seqlen_k / Cfg::BN;  // blocks without a ragged tail
  if (p.causal) {
    const int last_row = min(m0 + Cfg::BM, p.seqlen_q) - 1;
    const int64_t keys = int64_t{last_row} + b.q_offset + 1;  // keys the last row admits
    b.n_max = keys <= 0 ? 0 : static_cast<int>(min(int64_t{n_blocks}, (keys + Cfg::BN - 1) / Cfg::BN));
    const int64_t first_keys = int64_t{m0} + b.q_offset + 1;  // keys the first row admits
    const int n_diag = first_keys <= 0 ? 0 : static_cast<int>(min(int64_t{n_blocks}, first_keys / Cfg::BN));
    n_full = min(n_full, n_diag);
  } else {
    b.n_max = n_blocks;
  }
  b.n_nomask = min(n_full, b.n_max);
  return b;
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <class T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

template <int R>
__device__ __forceinline__ void fence_u32(uint32_t (&r)[R][4]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

/// Online softmax of one KV block's scores s (this thread's two rows, r and
/// r + 8, in the m64nBN accumulator layout) against running max m and
/// thread-partial row sums l; returns the rescale factors of O in corr.
/// kMask: columns col0 + c (c the accumulator column) at or past lim[row]
/// are masked (causal limit and the ragged KV tail).
template <bool kMask, int BN>
__device__ __forceinline__ void softmax_block(float (&s)[BN / 2], float (&m)[2], float (&l)[2], float (&corr)[2],
                                              float scale_log2, int col0, const int (&lim)[2]) {
  const int q = static_cast<int>(threadIdx.x % 4);
  if constexpr (kMask) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (col0 + 8 * j + 2 * q + (e & 1) >= lim[e >> 1]) s[4 * j + e] = -INFINITY;
  }
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    mx[0] = fmaxf(mx[0], fmaxf(s[4 * j], s[4 * j + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
  float ms[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    // A row with no admitted key so far keeps max -inf: subtract 0, not
    // -inf (exp2(-inf - -inf) would be NaN); its p are exp2(-inf) = 0.
    ms[r] = mx[r] == -INFINITY ? 0.f : mx[r] * scale_log2;
    corr[r] = ex2(m[r] * scale_log2 - ms[r]);  // m = -inf: 0 (O and l are 0 anyway)
    m[r] = mx[r];
  }
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[4 * j + e] = ex2(fmaf(s[4 * j + e], scale_log2, -ms[e >> 1]));
      sum[e >> 1] += s[4 * j + e];
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + sum[r];
}

/// The waiter (lane 0 of warp WaiterRing::kWaiterWarp, Hook::kActive): the
/// hook's wait for every KV block of the CTA, in the TMA thread's visiting
/// order, at most WaiterRing::kSlots blocks ahead of it.
///
/// Memory order (why the TMA thread's K / V loads of block i see the rows
/// the flags publish, although another thread acquired them):
///   remote writes (peer stores, copy engine) -> release (flag store or
///   notify, at the scope the hook waits at)
///   -> waiter: acquire of the flag (ld.acquire, or relaxed loads +
///      fence.acq_rel: FlagMemo), generic proxy
///   -> waiter: fence.proxy.async.global (orders the acquired global data,
///      generic proxy, before later async-proxy accesses)
///   -> waiter: mbarrier.arrive on ready[s] (release, CTA scope)
///   -> TMA thread: mbarrier.try_wait on ready[s] (acquire, CTA scope)
///   -> TMA thread: cp.async.bulk.tensor loads of block i (async proxy).
/// Every arrow is program order or a release/acquire pair, so the remote
/// writes happen before the TMA reads; the proxy crossing is made by the
/// thread that did the generic-proxy access, before the CTA-scope
/// synchronisation (the GEMM's waiter, gemm/kernel_common.cuh run_waiter,
/// and CUTLASS's pattern for a TMA store of smem other threads wrote). When
/// a stateful hook (FlagWait's memo) acquired nothing new for block i, the
/// fence is skipped: the acquire and fence that covered its flags preceded an
/// earlier ready arrive, which the TMA thread acquired before block i's loads
/// (program order of both threads). The waiter exits after its last block:
/// no barrier counts it any more (the TMA thread's last free arrivals are
/// never waited on).
template <class Cfg, class Hook>
__device__ __forceinline__ void run_kv_waiter(const AttnParams<Hook>& p, const AttnSmem<Cfg>& sm, const AttnBlock& blk,
                                              int head_kv) {
  typename KvWaitState<Hook>::type state{};  // e.g. FlagWait's memo of acquired flags
  for (int i = 0; i < blk.n_max; ++i) {
    const int n = kv_block_at(p.hook, i, blk.n_max);
    const int s = WaiterRing::slot(i);
    ptx::mbar_wait(sm.kv_free(s), WaiterRing::free_parity(i));
    if (kv_wait(p.hook, KvBlockInfo{blk.batch, head_kv, n, n * Cfg::BN, Cfg::BN, p.seqlen_k}, state))
      ptx::fence_proxy_async_global();
    ptx::mbar_arrive(sm.kv_ready(s));
  }
}

template <class Cfg, class T, class Hook>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    attention_fwd_kernel(const __grid_constant__ CUtensorMap tma_q, const __grid_constant__ CUtensorMap tma_k,
                         const __grid_constant__ CUtensorMap tma_v, const __grid_constant__ AttnParams<Hook> p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  constexpr int BN = Cfg::BN, D = Cfg::D, S = Cfg::kStages;
  static_assert(!Hook::kActive || Cfg::kHookActive,
                "an active KV hook needs a kHookActive configuration (register budget, waiter ring)");
  extern __shared__ uint8_t smem_raw[];
  const AttnSmem<Cfg> sm{reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023))};
  const int warp_idx = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 32, 0);
  const int warpgroup = warp_idx / 4;
  if (threadIdx.x == 0) {
    ptx::mbar_init(sm.q_full(), 1);
    for (int s = 0; s < S; ++s) {
      ptx::mbar_init(sm.k_full(s), 1);
      ptx::mbar_init(sm.v_full(s), 1);
      ptx::mbar_init(sm.k_empty(s), Cfg::kEmptyArrivals);
      ptx::mbar_init(sm.v_empty(s), Cfg::kEmptyArrivals);
    }
    if constexpr (Hook::kActive) {
      for (int s = 0; s < WaiterRing::kSlots; ++s) {
        ptx::mbar_init(sm.kv_ready(s), 1);  // the waiter's arrive
        ptx::mbar_init(sm.kv_free(s), 1);   // the TMA thread's arrive
      }
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();

  const AttnBlock blk = attn_block<Cfg>(p);
  const int m0 = blk.m_block * Cfg::BM;
  const int head_kv = blk.head / p.group;

  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    // Roles by the warp-uniform warp index (engine::ProducerWarpRole). The
    // TMA warp comes first and leaves as a whole warp: with the waiter's
    // wait (which may trap on a timeout) in a later branch, ptxas keeps the
    // TMA loop's operands in uniform registers only in this shape (no R2UR
    // before a UTMALDG in the SASS).
    if (engine::producer_warp_role(warp_idx) == engine::ProducerWarpRole::kTma) {
      if (!ptx::elect_one_sync() || blk.n_max <= 0) return;
      ptx::tma_prefetch_desc(&tma_q);
      ptx::tma_prefetch_desc(&tma_k);
      ptx::tma_prefetch_desc(&tma_v);
      ptx::mbar_arrive_expect_tx(sm.q_full(), Cfg::kQBytes);
#pragma unroll
      for (int c = 0; c < Cfg::kDChunks; ++c)
        ptx::tma_load_4d(sm.q() + c * Cfg::BM * 128, &tma_q, sm.q_full(), c * 64, m0, blk.head, blk.batch);
      int stage = 0;
      uint32_t phase = 0;
      for (int i = 0; i < blk.n_max; ++i) {
        const int n = kv_block_at(p.hook, i, blk.n_max);
        if constexpr (Hook::kActive) {
          // Normally complete long ago: the waiter runs up to kSlots blocks
          // ahead. Frees the slot at once (the waiter may start block
          // i + kSlots while this thread loads block i).
          const int r = WaiterRing::slot(i);
          ptx::mbar_wait(sm.kv_ready(r), WaiterRing::ready_parity(i));
          ptx::mbar_arrive(sm.kv_free(r));
        }
        const CUtensorMap* map_k = &tma_k;
        const CUtensorMap* map_v = &tma_v;
        int row = n * BN;
        kv_block_source(p.hook, KvBlockInfo{blk.batch, head_kv, n, n * BN, BN, p.seqlen_k}, map_k, map_v, row);
        ptx::mbar_wait(sm.k_empty(stage), phase ^ 1);
        ptx::mbar_arrive_expect_tx(sm.k_full(stage), Cfg::kKVBytes);
#pragma unroll
        for (int c = 0; c < Cfg::kDChunks; ++c)
          ptx::tma_load_4d(sm.k(stage) + c * BN * 128, map_k, sm.k_full(stage), c * 64, row, head_kv, blk.batch);
        ptx::mbar_wait(sm.v_empty(stage), phase ^ 1);
        ptx::mbar_arrive_expect_tx(sm.v_full(stage), Cfg::kKVBytes);
#pragma unroll
        for (int c = 0; c < Cfg::kDChunks; ++c)
          ptx::tma_load_4d(sm.v(stage) + c * BN * 128, map_v, sm.v_full(stage), c * 64, row, head_kv, blk.batch);
        if (++stage == S) {
          stage = 0;
          phase ^= 1;
        }
      }
      return;
    }
    if constexpr (Hook::kActive) {
      if (engine::producer_warp_role(warp_idx) == engine::ProducerWarpRole::kWaiter && threadIdx.x % 32 == 0 &&
          blk.n_max > 0)
        run_kv_waiter<Cfg>(p, sm, blk, head_kv);
    }
    return;
  }

  // ---- consumers ----------------------------------------------------------------
  ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
  const int wg = warpgroup - 1;  // 0 or 1: query rows wg*64 ..
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int row_in_tile = wg * 64 + (warp_idx % 4) * 16 + lane / 4;  // and + 8
  const bool warp_leader = lane == 0;
  using MmaS = engine::Wgmma<T, BN, 0>;
  using MmaO = engine::WgmmaRS<T, D, 1>;

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  int lim[2];  // keys admitted per row: columns < lim
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = m0 + row_in_tile + 8 * r;
    lim[r] = p.causal ? static_cast<int>(max(int64_t{0}, min(int64_t{p.seqlen_k}, int64_t{row} + blk.q_offset + 1)))
                      : p.seqlen_k;
  }

  auto sched_wait = [&] {
    if constexpr (Cfg::kPingPong) ptx::named_barrier_sync(Cfg::kSchedBarrier + wg, 256);
  };
  auto sched_pass = [&] {
    if constexpr (Cfg::kPingPong) ptx::named_barrier_arrive(Cfg::kSchedBarrier + (wg ^ 1), 256);
  };
  auto issue_s = [&](float(&s)[BN / 2], int st) {
    const uint8_t* qb = sm.q() + wg * 64 * 128;
    const uint8_t* kb = sm.k(st);
#pragma unroll
    for (int c = 0; c < Cfg::kDChunks; ++c)
#pragma unroll
      for (int k16 = 0; k16 < 4; ++k16) {
        const uint64_t da = engine::make_desc(qb + c * Cfg::BM * 128 + k16 * 32, 16, 1024);
        const uint64_t db = engine::make_desc(kb + c * BN * 128 + k16 * 32, 16, 1024);
        MmaS::run(s, da, db, (c | k16) != 0);
      }
  };
  auto issue_pv = [&](const uint32_t(&pr)[BN / 16][4], int st) {
    const uint8_t* vb = sm.v(st);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) MmaO::run(o, pr[kk], engine::make_desc(vb + kk * 16 * 128, BN * 128, 1024), 1);
  };
  auto to_p = [&](const float(&s)[BN / 2], uint32_t(&pr)[BN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) pr[kk][i] = pack2<T>(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
  };
  auto rescale_o = [&](const float(&corr)[2]) {
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[4 * j + e] *= corr[e >> 1];
  };
  auto softmax = [&](float(&s)[BN / 2], int n, float(&corr)[2]) {
    const int col0 = n * BN;
    if (n >= blk.n_nomask)
      softmax_block<true, BN>(s, m, l, corr, p.scale_log2, col0, lim);
    else
      softmax_block<false, BN>(s, m, l, corr, p.scale_log2, col0, lim);
  };

  if (Cfg::kPingPong && wg == 1) ptx::named_barrier_arrive(Cfg::kSchedBarrier + 0, 256);  // consumer 0 first

  if (blk.n_max > 0) {
    float s[BN / 2];
    uint32_t pr[BN / 16][4];
    float corr[2];
    int stage = 0;
    uint32_t phase = 0;
    ptx::mbar_wait(sm.q_full(), 0);

    // First block: S only.
    int n = kv_block_at(p.hook, 0, blk.n_max);
    ptx::mbar_wait(sm.k_full(stage), phase);
    sched_wait();
    ptx::wgmma_fence();
    issue_s(s, stage);
    ptx::wgmma_commit();
    sched_pass();
    ptx::wgmma_wait<0>();
    ptx::fence_regs(s);
    if (warp_leader) ptx::mbar_arrive(sm.k_empty(stage));
    softmax(s, n, corr);
    to_p(s, pr);
    int v_stage = stage;
    uint32_t v_phase = phase;
    if (++stage == S) {
      stage = 0;
      phase ^= 1;
    }

    for (int i = 1; i < blk.n_max; ++i) {
      n = kv_block_at(p.hook, i, blk.n_max);
      ptx::mbar_wait(sm.k_full(stage), phase);
      sched_wait();
      ptx::fence_regs(o);
      ptx::wgmma_fence();
      issue_s(s, stage);
      ptx::wgmma_commit();
      ptx::mbar_wait(sm.v_full(v_stage), v_phase);
      issue_pv(pr, v_stage);
      ptx::wgmma_commit();
      sched_pass();
      ptx::wgmma_wait<1>();  // S_n retired (groups retire in order)
      ptx::fence_regs(s);
      if (warp_leader) ptx::mbar_arrive(sm.k_empty(stage));
      softmax(s, n, corr);  // overlaps the P·V wgmma
      ptx::wgmma_wait<0>();
      ptx::fence_regs(o);
      fence_u32(pr);  // P stays live (unmodified) until its wgmma retired
      if (warp_leader) ptx::mbar_arrive(sm.v_empty(v_stage));
      rescale_o(corr);
      to_p(s, pr);
      v_stage = stage;
      v_phase = phase;
      if (++stage == S) {
        stage = 0;
        phase ^= 1;
      }
    }

    // Last block's P·V.
    ptx::mbar_wait(sm.v_full(v_stage), v_phase);
    sched_wait();
    ptx::fence_regs(o);
    ptx::wgmma_fence();
    issue_pv(pr, v_stage);
    ptx::wgmma_commit();
    sched_pass();
    ptx::wgmma_wait<0>();
    ptx::fence_regs(o);
    fence_u32(pr);
    if (warp_leader) ptx::mbar_arrive(sm.v_empty(v_stage));
  }

  // ---- epilogue: O / l, LSE ------------------------------------------------------
  float inv[2], lse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const bool any = l[r] > 0.f;
    inv[r] = any ? 1.f / l[r] : 0.f;
    lse[r] = any ? m[r] * p.scale + __logf(l[r]) : -INFINITY;
  }
  T* const o_base = static_cast<T*>(p.o) + blk.batch * p.o_sb + blk.head * p.o_sh;
  const int q = lane % 4;
  if constexpr (Cfg::kSmemEpilogue) {
    // This consumer's Q rows are free: its last S wgmma retired. Layout: the
    // Q chunks (64 columns, 128-byte rows), 16-byte unit u of row r at
    // u ^ (r % 8): conflict-free for the quad-per-row writes below and the
    // 16-byte row reads after.
    uint8_t* const st = sm.q() + wg * 64 * 128;
    const int r_local = row_in_tile - wg * 64;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = r_local + 8 * r;
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        *reinterpret_cast<uint32_t*>(st + (j / 8) * Cfg::BM * 128 + row * 128 + (((j % 8) ^ (row % 8)) * 16) + 4 * q) =
            pack2<T>(o[4 * j + 2 * r] * inv[r], o[4 * j + 2 * r + 1] * inv[r]);
    }
    ptx::named_barrier_sync(Cfg::kEpiBarrier + wg, 128);
    const int t = static_cast<int>(threadIdx.x % 128);
    constexpr int kUnits = D / 8;  // 16-byte units per row
#pragma unroll
    for (int i = 0; i < 64 * kUnits / 128; ++i) {
      const int idx = i * 128 + t;
      const int row = idx / kUnits, unit = idx % kUnits;
      const uint4 val = *reinterpret_cast<const uint4*>(st + (unit / 8) * Cfg::BM * 128 + row * 128 +
                                                        (((unit % 8) ^ (row % 8)) * 16));
      const int grow = m0 + wg * 64 + row;
      if (grow < p.seqlen_q) *reinterpret_cast<uint4*>(o_base + grow * p.o_ss + unit * 8) = val;
    }
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = m0 + row_in_tile + 8 * r;
      if (row >= p.seqlen_q) continue;
      T* const orow = o_base + row * p.o_ss + 2 * q;
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        *reinterpret_cast<uint32_t*>(orow + 8 * j) = pack2<T>(o[4 * j + 2 * r] * inv[r], o[4 * j + 2 * r + 1] * inv[r]);
    }
  }
  if (p.lse && q == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = m0 + row_in_tile + 8 * r;
      if (row < p.seqlen_q) p.lse[blk.batch * p.lse_sb + blk.head * p.lse_sh + row] = lse[r];
    }
  }
#endif
}

}  // namespace tessera::kernels::attn
