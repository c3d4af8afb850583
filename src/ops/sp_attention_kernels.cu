// The attention kernel with sp_attention's KV hooks. The chunk walk: per
// KV block, the engine's FlagWait (.sys acquire, timeout -> WaitRecord +
// trap) on the flag of the CTA's head group from every remote owner of a
// zig-zag chunk the block covers that the CTA has not acquired yet (an
// owner's chunks span many blocks: one acquire and one proxy fence per
// owner). The table wait: SpKvTableWait (ops/sp_kv_table_wait.cuh).
#include "sp_attention_kernels.hpp"

#include <algorithm>

#include "tessera/kernels/attention/launch.cuh"
#include "tessera/kernels/gemm/prologue.cuh"
#include "tessera/ops/sp_kv_table_wait.cuh"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/wait_diagnostics.hpp"

namespace tessera::ops::detail {

namespace {

struct SpKvWait {
  static constexpr bool kActive = true;
  CUtensorMap own_k, own_v;                          ///< the own shards' maps (SpKvFlags::own_k), valid if own_in_place
  using State = kernels::engine::FlagMemo;           ///< flags (owner * slots + slot) this CTA acquired
  kernels::engine::FlagWait<std::uint64_t, true> w;  ///< flags, expected = epoch, timeout, diag
  int slots, world, rank, chunk, heads_per_group;
  const std::int32_t* order;  ///< kv_arrival_order's table, or null: descending
  bool own_in_place;
  int own_start[2];  ///< global row of the own shard's chunk 0 and 1

  /// The i-th of the CTA's n KV blocks to visit (a permutation of [0, n)).
  __device__ __forceinline__ int kv_block(int i, int n) const {
    return order ? order[static_cast<long long>(n) * (n - 1) / 2 + i] : n - 1 - i;
  }

  /// A block inside an own chunk loads from the caller's shard (local row
  /// = row within the chunk + i * chunk).
  __device__ __forceinline__ bool kv_source(const kernels::attn::KvBlockInfo& b, const CUtensorMap*& k,
                                            const CUtensorMap*& v, int& row) const {
    if (!own_in_place) return false;
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (sp_block_in_own_chunk(b.row0, b.rows, own_start[i], chunk)) {
        k = &own_k;
        v = &own_v;
        row = b.row0 - own_start[i] + i * chunk;
        return true;
      }
    return false;
  }

  __device__ __forceinline__ bool wait(const kernels::attn::KvBlockInfo& b, State& memo) const {
    const int last = min(b.row0 + b.rows, b.seqlen_k) - 1;
    const kernels::engine::TileInfo t{b.block, 0, b.block, b.row0, 0, b.rows, 1, 1, 1, b.seqlen_k, 1};
    bool acquired = false;
    const int group = b.head_kv / heads_per_group;  // one head per CTA: the memo needs no group
    for (int c = b.row0 / chunk; c <= last / chunk; ++c) {
      const int owner = c < world ? c : 2 * world - 1 - c;
      if (owner == rank || memo.has(owner)) continue;
      w.wait_one(t, owner * slots + sp_kv_flag_slot(group));
      memo.mark(owner);
      acquired = true;
    }
    return acquired;
  }
};

template <class T, class Hook>
void launch(const kernels::AttentionArgs& a, const Hook& h, cudaStream_t s) {
  if (a.head_dim == 64)
    kernels::attention_with<T, 64>(a, h, s);
  else
    kernels::attention_with<T, 128>(a, h, s);
}

template <class Hook>
void launch_typed(const kernels::AttentionArgs& a, const Hook& h, cudaStream_t s) {
  if (a.dtype == DType::f16)
    launch<__half>(a, h, s);
  else
    launch<__nv_bfloat16>(a, h, s);
}

}  // namespace

int sp_attention_kv_block_rows(int head_dim) {
  return head_dim == 64 ? kernels::AttnCfgOf<64, true>::BN : kernels::AttnCfgOf<128, true>::BN;
}

void launch_sp_attention_part(const kernels::AttentionArgs& a, const SpKvFlags& f, cudaStream_t stream) {
  SpKvWait h{};
  h.w.flags = f.flags;
  h.w.expected = f.epoch;
  h.w.timeout_ns = runtime::wait_timeout_ns();
  h.w.diag = runtime::process_wait_diagnostics().device_record();
  h.slots = f.slots;
  h.world = f.world;
  h.rank = f.rank;
  h.chunk = static_cast<int>(f.chunk);
  h.heads_per_group = f.heads_per_group;
  h.order = f.order;
  h.own_in_place = f.own_k != nullptr;
  if (h.own_in_place) {
    // The own shards' K and V maps, with the box and swizzle of the kernel's.
    kernels::AttentionArgs own = a;
    own.k = f.own_k;
    own.v = f.own_v;
    own.seqlen_k = 2 * f.chunk;
    own.k_stride = own.v_stride = f.own_stride;
    CUtensorMap q_unused;
    kernels::detail::attn_make_tma(own, 128, sp_attention_kv_block_rows(static_cast<int>(a.head_dim)), &q_unused,
                                   &h.own_k, &h.own_v);
    h.own_start[0] = static_cast<int>(f.own_start[0]);
    h.own_start[1] = static_cast<int>(f.own_start[1]);
  }
  launch_typed(a, h, stream);
}

void launch_sp_attention_table(const kernels::AttentionArgs& a, const SpKvTable& f, cudaStream_t stream) {
  const int block_rows = sp_attention_kv_block_rows(static_cast<int>(a.head_dim));
  TESSERA_CHECK(f.table != nullptr && static_cast<std::int64_t>(f.blocks_per_head) * block_rows >= a.seqlen_k,
                "launch_sp_attention_table: a table of {} blocks per head for {} keys", f.blocks_per_head, a.seqlen_k);
  // A poll (a .sys load and a nanosleep of up to twice kSpKvPollSleepNs)
  // takes 0.5-3 us, so this budget lasts 2-12 x the host's timeout: the
  // host's release comes first.
  const std::uint64_t polls = 4 * runtime::wait_timeout_ns() / kSpKvPollSleepNs;
  SpKvTableWait h{};
  h.flags = f.flags;
  h.flags_of_block = reinterpret_cast<const int2*>(f.table);
  h.n_blocks = f.blocks_per_head;
  h.polls = static_cast<unsigned>(std::clamp<std::uint64_t>(polls, 1, ~0u));
  h.epoch = static_cast<std::uint32_t>(f.epoch);
  launch_typed(a, h, stream);
}

}  // namespace tessera::ops::detail
