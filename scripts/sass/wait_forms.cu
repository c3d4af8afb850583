// The attention kernel under waiter waits of several forms, for
// scripts/sass/schedule.py: which forms leave the consumers' instruction
// order as in the plain kernel (docs/design/waits.md). Never linked; only
// compiled to SASS. Each hook waits once per CTA on a 64-bit flag.
#include <cuda_bf16.h>

#include <cstdint>

#include "tessera/kernels/attention/launch.cuh"
#include "attention/slim_hook.cuh"
#include "tessera/link/wait.cuh"
#include "tessera/ops/sp_kv_table_wait.cuh"

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
    if constexpr (kForm == kSpChunkWalk || kForm == kSpSlimWalk) {
      // R = 2, rank 0 (owners 0 1 1 0); the memo of the one peer is `done`.
      // The chunk of a row by division, or by a multiply-high with a magic
      // number (host-computed in a real hook; `timeout` stands in for it).
      const auto chunk_of = [&](int row) {
        if constexpr (kForm == kSpChunkWalk)
          return row / ((b.seqlen_k + 3) / 4);
        else
          return static_cast<int>(__umulhi(static_cast<unsigned>(row), static_cast<unsigned>(timeout)));
      };
      const int world = 2, rank = 0, last = min(b.row0 + b.rows, b.seqlen_k) - 1;
      bool acquired = false;
      for (int c = chunk_of(b.row0); c <= chunk_of(last); ++c) {
        const int owner = c < world ? c : 2 * world - 1 - c;
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

/// The slim hook's pieces (bench/attention/slim_hook.cuh) one at a time.
struct SlimOrderOnly : bench::attention::SlimFlagWait, bench::attention::ArrivalOrder {};
struct SlimSourceOnly : bench::attention::SlimFlagWait, bench::attention::OwnChunksInPlace {};

/// SpKvTableWait's parts one at a time (bits: 1 pair of flags, 2 64-bit epoch
/// from a parameter, 4 poll budget with nanosleep, 8 row of the KV head, 16
/// the flag's low word against a 32-bit epoch).
template <int kBits>
struct ShardPartsWait {
  static constexpr bool kActive = true;
  const std::uint64_t* flags;
  const int2* table;
  int n_blocks;
  unsigned polls;
  std::uint64_t epoch;
  __device__ __forceinline__ void spin(int i) const {
    const std::uint64_t e = (kBits & 2) ? epoch : 1;
    unsigned left = polls;
    const auto short_of = [&] {
      if constexpr ((kBits & 16) != 0)  // the flag's low word against a 32-bit epoch, wrap-safe
        return static_cast<int>(link::mo::ld_acquire_sys(reinterpret_cast<const std::uint32_t*>(flags + i)) -
                                static_cast<std::uint32_t>(epoch)) < 0;
      else
        return link::mo::ld_acquire_sys(flags + i) < e;
    };
    while (short_of()) {
      if constexpr ((kBits & 4) != 0) {
        if (--left == 0) __trap();
        __nanosleep(1024);
      }
    }
  }
  __device__ __forceinline__ void wait(const kernels::attn::KvBlockInfo& b) const {
    const int idx = (kBits & 8) ? b.head_kv * n_blocks + b.block : b.block;
    if constexpr ((kBits & 1) != 0) {
      const int2 f = table[idx];
      if (f.x != 0) spin(f.x - 1);
      if (f.y != 0) spin(f.y - 1);
    } else {
      const int f = reinterpret_cast<const int*>(table)[idx];
      if (f != 0) spin(f - 1);
    }
  }
};

template <int... kBits>
void shard_parts(const kernels::AttentionArgs& a, cudaStream_t s, const std::uint64_t* f) {
  (kernels::attention_with<__nv_bfloat16, 128>(
       a, ShardPartsWait<kBits>{f, reinterpret_cast<const int2*>(f + 2), 64, 1u << 20, 1}, s),
   ...);
}

template <int... kForms>
void instantiate(const kernels::AttentionArgs& a, cudaStream_t s, const std::uint64_t* f, runtime::WaitRecord* r) {
  kernels::attention_with<__nv_bfloat16, 128>(a, kernels::attn::NoKvWait{}, s);
  (kernels::attention_with<__nv_bfloat16, 128>(a, Wait<kForms>{f, f + 1, r, 1}, s), ...);
  const auto* table = reinterpret_cast<const std::int32_t*>(f + 2);
  kernels::attention_with<__nv_bfloat16, 128>(a, bench::attention::SlimFlagWait{f, table}, s);
  SlimOrderOnly order{};
  order.flags = f;
  order.flag_of_block = order.order = table;
  kernels::attention_with<__nv_bfloat16, 128>(a, order, s);
  SlimSourceOnly source{};
  source.flags = f;
  source.flag_of_block = table;
  source.chunk = 1024;
  kernels::attention_with<__nv_bfloat16, 128>(a, source, s);
  bench::attention::SlimHook full{};
  full.flags = f;
  full.flag_of_block = full.order = table;
  full.chunk = 1024;
  kernels::attention_with<__nv_bfloat16, 128>(a, full, s);
  shard_parts<1, 2, 4, 8, 17, 29>(a, s, f);
  // sp_attention's hook over the shard layout, as the operator runs it.
  kernels::attention_with<__nv_bfloat16, 128>(
      a, ops::SpKvTableWait{f, reinterpret_cast<const int2*>(table), 64, 1u << 20, 1}, s);
}

void all_forms(const kernels::AttentionArgs& a, cudaStream_t s, const std::uint64_t* f, runtime::WaitRecord* r) {
  instantiate<kSpin, kSpinSleep, kPollCountTrap, kAbortWordTrap, kTimerTrap, kClockTrap, kPollCountRecord,
              kAbortWordStores, kBoundedExit, kWaitUntil, kTimerSmemTrap, kAbortOffsetTrap, kTimer32Trap, kSpChunkWalk,
              kSpSlimWalk>(a, s, f, r);
}

}  // namespace tessera::sass_forms
