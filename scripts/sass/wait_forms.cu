// The attention kernel under waiter waits of several forms, for
// scripts/sass/schedule.py: which forms leave the consumers' instruction
// order as in the plain kernel (docs/design/waits.md). Never linked; only
// compiled to SASS. Each hook waits once per CTA on a 64-bit flag.
#include <cuda_bf16.h>

#include <cstdint>

#include "tessera/kernels/attention/launch.cuh"
#include "tessera/link/wait.cuh"

namespace tessera::sass_forms {

enum Form : int {
  kSpin = 0,         ///< unbounded acquire spin
  kSpinSleep,        ///< unbounded spin with nanosleep
  kPollCountTrap,    ///< spin bounded by a poll count that traps
  kAbortWordTrap,    ///< spin that traps when an abort word is set
  kTimerTrap,        ///< globaltimer timeout, trap
  kClockTrap,        ///< clock64 timeout, trap
  kPollCountRecord,  ///< poll count, WaitRecord filled, trap
  kAbortWordStores,  ///< abort word, plain stores of the site, trap
  kBoundedExit,      ///< bounded loop that exits normally
  kWaitUntil,        ///< link::wait_until as the library runs it
  kTimerSmemTrap,    ///< globaltimer timeout, the start kept in shared memory, trap
  kAbortOffsetTrap,  ///< abort word at an immediate offset from the flag (no register), trap
  kTimer32Trap,      ///< globaltimer in microseconds, a 32-bit start and timeout, trap
  kSpChunkWalk,      ///< sp_attention's per-block chunk walk (R = 2) with kAbortOffsetTrap's wait
  kSpSlimWalk,       ///< the same walk with a multiply-high for the division and a 32-bit memo
  kTableFlag,        ///< the flag to acquire per block read from a host-made table (0: none)
};

template <int kForm>
struct Wait {
  static constexpr bool kActive = true;
  struct State {
    bool done = false;
  };
  const std::uint64_t* flag;
  const std::uint64_t* abort_word;
  runtime::WaitRecord* rec;
  std::uint64_t timeout;
  __device__ __forceinline__ bool wait(const kernels::attn::KvBlockInfo& b, State& s) const {
    if constexpr (kForm == kSpChunkWalk) {
      // The memo of owners acquired lives in `done` (R = 2: one peer).
      const int chunk = (b.seqlen_k + 3) / 4, world = 2, rank = 0;
      const int last = min(b.row0 + b.rows, b.seqlen_k) - 1;
      bool acquired = false;
      for (int c = b.row0 / chunk; c <= last / chunk; ++c) {
        const int owner = c < world ? c : 2 * world - 1 - c;
        if (owner == rank || s.done) continue;
        while (link::mo::ld_acquire_sys(flag + owner) < 1)
          if (link::mo::ld_relaxed_sys(flag + 8) != 0) __trap();
        s.done = true;
        acquired = true;
      }
      return acquired;
    }
    if constexpr (kForm == kTableFlag) {
      const int f = reinterpret_cast<const int*>(abort_word)[b.block];
      if (f == 0) return false;
      while (link::mo::ld_acquire_sys(flag + f) < 1)
        if (link::mo::ld_relaxed_sys(flag) != 0) __trap();
      return true;
    }
    if constexpr (kForm == kSpSlimWalk) {
      // chunk = seqlen_k / 4 via magic (host-computed in a real hook): c = umulhi(row, magic) >> shift.
      const unsigned magic = static_cast<unsigned>(timeout), world = 2, rank = 0;
      const unsigned last = static_cast<unsigned>(min(b.row0 + b.rows, b.seqlen_k) - 1);
      bool acquired = false;
      for (unsigned c = __umulhi(static_cast<unsigned>(b.row0), magic); c <= __umulhi(last, magic); ++c) {
        const unsigned owner = c < world ? c : 2 * world - 1 - c;
        if (owner == rank || s.done) continue;
        while (link::mo::ld_acquire_sys(flag + owner) < 1)
          if (link::mo::ld_relaxed_sys(flag + 8) != 0) __trap();
        s.done = true;
        acquired = true;
      }
      return acquired;
    }
    if (s.done) return false;
    s.done = true;
    std::uint64_t v = 0;
    if constexpr (kForm == kSpin) {
      while (link::mo::ld_acquire_sys(flag) < 1) {
      }
    } else if constexpr (kForm == kSpinSleep) {
      while (link::mo::ld_acquire_sys(flag) < 1) __nanosleep(64);
    } else if constexpr (kForm == kPollCountTrap) {
      unsigned k = 0;
      while (link::mo::ld_acquire_sys(flag) < 1)
        if (++k > (1u << 30)) __trap();
    } else if constexpr (kForm == kAbortWordTrap) {
      while (link::mo::ld_acquire_sys(flag) < 1)
        if (link::mo::ld_relaxed_sys(abort_word) != 0) __trap();
    } else if constexpr (kForm == kTimerTrap) {
      const std::uint64_t t0 = link::mo::globaltimer_ns();
      while (link::mo::ld_acquire_sys(flag) < 1)
        if (link::mo::globaltimer_ns() - t0 > timeout) __trap();
    } else if constexpr (kForm == kClockTrap) {
      const long long c0 = clock64();
      while (link::mo::ld_acquire_sys(flag) < 1)
        if (clock64() - c0 > static_cast<long long>(timeout)) __trap();
    } else if constexpr (kForm == kPollCountRecord) {
      unsigned k = 0;
      while ((v = link::mo::ld_acquire_sys(flag)) < 1)
        if (++k > (1u << 30)) {
          link::record_wait_timeout(rec, link::WaitSite{runtime::WaitKind::tile_flag}, 1, v, timeout);
          __trap();
        }
    } else if constexpr (kForm == kAbortWordStores) {
      while ((v = link::mo::ld_acquire_sys(flag)) < 1)
        if (link::mo::ld_relaxed_sys(abort_word) != 0) {
          rec->seen = v;
          rec->block = static_cast<int>(blockIdx.x);
          __trap();
        }
    } else if constexpr (kForm == kBoundedExit) {
      for (int k = 0; k < 1000000 && link::mo::ld_acquire_sys(flag) < 1; ++k) {
      }
    } else if constexpr (kForm == kTimerSmemTrap) {
      __shared__ std::uint64_t start;
      start = link::mo::globaltimer_ns();
      while (link::mo::ld_acquire_sys(flag) < 1)
        if (link::mo::globaltimer_ns() - start > timeout) __trap();
    } else if constexpr (kForm == kAbortOffsetTrap) {
      while (link::mo::ld_acquire_sys(flag) < 1)
        if (link::mo::ld_relaxed_sys(flag + 8) != 0) __trap();
    } else if constexpr (kForm == kTimer32Trap) {
      const auto now_us = [] { return static_cast<std::uint32_t>(link::mo::globaltimer_ns() >> 10); };
      const std::uint32_t start = now_us();
      while (link::mo::ld_acquire_sys(flag) < 1)
        if (now_us() - start > static_cast<std::uint32_t>(timeout)) __trap();
    } else {
      link::wait_geq<link::Scope::sys>(flag, std::uint64_t{1}, link::WaitLimit{timeout, rec},
                                       link::WaitSite{runtime::WaitKind::tile_flag});
    }
    return true;
  }
};

/// The slim candidate with the rest of sp_attention's hook: the arrival
/// order table (kv_block) and the own chunks read in place (kv_source), the
/// flag per block from a table, the abort-word spin; stateless.
struct SpSlimFull {
  static constexpr bool kActive = true;
  CUtensorMap own_k, own_v;
  const std::uint64_t* flags;
  const std::int32_t* flag_of_block;
  const std::int32_t* order;
  int chunk;
  int own_start[2];
  __device__ __forceinline__ int kv_block(int i, int n) const {
    return order ? order[static_cast<long long>(n) * (n - 1) / 2 + i] : n - 1 - i;
  }
  __device__ __forceinline__ bool kv_source(const kernels::attn::KvBlockInfo& b, const CUtensorMap*& k,
                                            const CUtensorMap*& v, int& row) const {
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (b.row0 >= own_start[i] && b.row0 + b.rows <= own_start[i] + chunk) {
        k = &own_k;
        v = &own_v;
        row = b.row0 - own_start[i] + i * chunk;
        return true;
      }
    return false;
  }
  __device__ __forceinline__ void wait(const kernels::attn::KvBlockInfo& b) const {
    const int f = flag_of_block[b.block];
    if (f == 0) return;
    while (link::mo::ld_acquire_sys(flags + f) < 1)
      if (link::mo::ld_relaxed_sys(flags) != 0) __trap();
  }
};

/// SpSlimFull without kv_source (own chunks from the workspace).
struct SpSlimOrderOnly {
  static constexpr bool kActive = true;
  const std::uint64_t* flags;
  const std::int32_t* flag_of_block;
  const std::int32_t* order;
  __device__ __forceinline__ int kv_block(int i, int n) const {
    return order ? order[static_cast<long long>(n) * (n - 1) / 2 + i] : n - 1 - i;
  }
  __device__ __forceinline__ void wait(const kernels::attn::KvBlockInfo& b) const {
    const int f = flag_of_block[b.block];
    if (f == 0) return;
    while (link::mo::ld_acquire_sys(flags + f) < 1)
      if (link::mo::ld_relaxed_sys(flags) != 0) __trap();
  }
};

/// SpSlimFull without kv_block (the kernel's descending order).
struct SpSlimSourceOnly {
  static constexpr bool kActive = true;
  CUtensorMap own_k, own_v;
  const std::uint64_t* flags;
  const std::int32_t* flag_of_block;
  int chunk;
  int own_start[2];
  __device__ __forceinline__ bool kv_source(const kernels::attn::KvBlockInfo& b, const CUtensorMap*& k,
                                            const CUtensorMap*& v, int& row) const {
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (b.row0 >= own_start[i] && b.row0 + b.rows <= own_start[i] + chunk) {
        k = &own_k;
        v = &own_v;
        row = b.row0 - own_start[i] + i * chunk;
        return true;
      }
    return false;
  }
  __device__ __forceinline__ void wait(const kernels::attn::KvBlockInfo& b) const {
    const int f = flag_of_block[b.block];
    if (f == 0) return;
    while (link::mo::ld_acquire_sys(flags + f) < 1)
      if (link::mo::ld_relaxed_sys(flags) != 0) __trap();
  }
};

template <int... kForms>
void instantiate(const kernels::AttentionArgs& a, cudaStream_t s, const std::uint64_t* f, runtime::WaitRecord* r) {
  kernels::attention_with<__nv_bfloat16, 128>(a, kernels::attn::NoKvWait{}, s);
  (kernels::attention_with<__nv_bfloat16, 128>(a, Wait<kForms>{f, f + 1, r, 1}, s), ...);
  SpSlimFull full{};
  full.flags = f;
  full.flag_of_block = reinterpret_cast<const std::int32_t*>(f + 2);
  full.chunk = 1024;
  kernels::attention_with<__nv_bfloat16, 128>(a, full, s);
  kernels::attention_with<__nv_bfloat16, 128>(
      a, SpSlimOrderOnly{f, reinterpret_cast<const std::int32_t*>(f + 2), nullptr}, s);
  SpSlimSourceOnly source{};
  source.flags = f;
  source.flag_of_block = reinterpret_cast<const std::int32_t*>(f + 2);
  source.chunk = 1024;
  kernels::attention_with<__nv_bfloat16, 128>(a, source, s);
}

void all_forms(const kernels::AttentionArgs& a, cudaStream_t s, const std::uint64_t* f, runtime::WaitRecord* r) {
  instantiate<kSpin, kSpinSleep, kPollCountTrap, kAbortWordTrap, kTimerTrap, kClockTrap, kPollCountRecord,
              kAbortWordStores, kBoundedExit, kWaitUntil, kTimerSmemTrap, kAbortOffsetTrap, kTimer32Trap, kSpChunkWalk,
              kSpSlimWalk, kTableFlag>(a, s, f, r);
}

}  // namespace tessera::sass_forms
