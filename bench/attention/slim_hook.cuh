// The candidate slim form of sp_attention's KV hook, in pieces, for
// bench attention --hook-ab (hook_ab.cu) and the SASS study
// (scripts/sass/wait_forms.cu, scripts/sass/schedule.py):
//   SlimFlagWait     the flag to acquire per KV block from a host-made table
//                    (0: none) and a spin that traps only when the abort word
//                    (flags[0]) is set, the timeout left to the host; no
//                    timer, record, division or memo in the waiter, each of
//                    which reschedules the consumers in SASS
//                    (docs/design/waits.md). Stateless: every block of a peer
//                    chunk acquires again (an acquire and a proxy fence, 0.5 %
//                    or less per block as measured).
//   ArrivalOrder     sp_attention's visiting order (ops::kv_arrival_order's table)
//   OwnChunksInPlace the own chunks read through a second pair of maps
// SlimHook combines all three.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "tessera/kernels/attention/kv_wait.cuh"
#include "tessera/link/memory_order.cuh"

namespace tessera::bench::attention {

struct SlimFlagWait {
  static constexpr bool kActive = true;
  const std::uint64_t* flags;         ///< flags[0]: abort word; flags[f]: flag f
  const std::int32_t* flag_of_block;  ///< per KV block: the flag to acquire, 0 for none
  __device__ __forceinline__ void wait(const kernels::attn::KvBlockInfo& b) const {
    const int f = flag_of_block[b.block];
    if (f == 0) return;
    while (link::mo::ld_acquire_sys(flags + f) < 1)
      if (link::mo::ld_relaxed_sys(flags) != 0) __trap();
  }
};

struct ArrivalOrder {
  const std::int32_t* order;  ///< kv_arrival_order's table: n (n - 1) / 2 + i
  __device__ __forceinline__ int kv_block(int i, int n) const {
    return order[static_cast<long long>(n) * (n - 1) / 2 + i];
  }
};

struct OwnChunksInPlace {
  CUtensorMap own_k, own_v;  ///< the own shard's maps (chunk 0, then chunk 1)
  int chunk;                 ///< rows per chunk
  int own_start[2];          ///< global row of the own chunks
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
};

struct SlimHook : SlimFlagWait, ArrivalOrder, OwnChunksInPlace {};

}  // namespace tessera::bench::attention
