// The zig-zag sequence-parallel attention plan (sp_attention.hpp).
#include "tessera/ops/sp_attention.hpp"

#include <algorithm>

#include "sp_attention_kernels.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops {

std::int64_t SpAttnPlan::pairs() const {
  std::int64_t n = 0;
  for (const Part& p : parts)
    for (std::int64_t i = 0; i < p.rows; ++i)
      n += causal ? std::clamp<std::int64_t>(p.q_offset + i + 1, 0, p.kv_len) : p.kv_len;
  return n;
}

std::vector<std::int32_t> kv_arrival_order(const SpAttnPlan& plan, std::int64_t kv_len, int block_rows) {
  TESSERA_CHECK(block_rows >= 1, "kv_arrival_order: block_rows = {} must be >= 1", block_rows);
  TESSERA_CHECK(kv_len >= 1 && kv_len <= plan.seq, "kv_arrival_order: kv_len = {} outside [1, seq = {}]", kv_len,
                plan.seq);
  const std::int64_t n_blocks = (kv_len + block_rows - 1) / block_rows;
  TESSERA_CHECK(n_blocks <= (1 << 14), "kv_arrival_order: {} KV blocks (at most 2^14)", n_blocks);
  // Landing key of each block: 2 x arrival step + slot of the latest chunk it covers.
  std::vector<int> key(static_cast<std::size_t>(n_blocks), 0);
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    const std::int64_t lo = b * block_rows, hi = std::min(kv_len, lo + block_rows) - 1;
    for (std::int64_t c = lo / plan.chunk; c <= hi / plan.chunk; ++c) {
      const int ci = static_cast<int>(c);
      key[static_cast<std::size_t>(b)] =
          std::max(key[static_cast<std::size_t>(b)], 2 * plan.arrival_step(ci) + SpAttnPlan::slot(ci, plan.world));
    }
  }
  std::vector<std::int32_t> table;
  table.reserve(static_cast<std::size_t>(n_blocks * (n_blocks + 1) / 2));
  std::vector<std::int32_t> order;
  for (std::int64_t n = 1; n <= n_blocks; ++n) {
    order.resize(static_cast<std::size_t>(n));
    for (std::int64_t b = 0; b < n; ++b) order[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(b);
    std::sort(order.begin(), order.end(), [&](std::int32_t x, std::int32_t y) {
      const int kx = key[static_cast<std::size_t>(x)], ky = key[static_cast<std::size_t>(y)];
      return kx != ky ? kx < ky : x > y;
    });
    table.insert(table.end(), order.begin(), order.end());
  }
  return table;
}

std::vector<std::pair<std::int64_t, std::int64_t>> sp_own_edge_rows(std::int64_t start, std::int64_t chunk,
                                                                    std::int64_t block_rows) {
  TESSERA_CHECK(start >= 0 && chunk >= 1 && block_rows >= 1,
                "sp_own_edge_rows: start = {}, chunk = {}, block_rows = {} (start >= 0, the others >= 1)", start, chunk,
                block_rows);
  const std::int64_t first = (start + block_rows - 1) / block_rows * block_rows;  // first block inside
  const std::int64_t end = (start + chunk) / block_rows * block_rows;             // end of the last one
  if (first + block_rows > start + chunk) return {{start, start + chunk}};        // no block inside
  std::vector<std::pair<std::int64_t, std::int64_t>> r;
  if (first > start) r.emplace_back(start, first);
  if (end < start + chunk) r.emplace_back(end, start + chunk);
  return r;
}

int sp_shard_slot(int world, int dst, int owner) {
  TESSERA_CHECK(world >= 1 && dst >= 0 && dst < world && owner >= 0 && owner < world,
                "sp_shard_slot: dst = {}, owner = {} outside [0, world = {})", dst, owner, world);
  return world - 1 - (owner - dst + world) % world;
}

bool sp_kv_table_fits(const SpAttnPlan& plan, SpKvLayout layout, int block_rows) {
  const std::int64_t unit = layout == SpKvLayout::shard ? 2 * plan.chunk : plan.chunk;
  return plan.world > 1 && block_rows >= 1 && unit >= block_rows && (layout == SpKvLayout::global || !plan.causal);
}

std::vector<std::int32_t> sp_kv_flag_table(const SpAttnPlan& plan, SpKvLayout layout, int block_rows,
                                           std::int64_t heads_kv, int head_groups, int slots) {
  const bool shard = layout == SpKvLayout::shard;
  TESSERA_CHECK(sp_kv_table_fits(plan, layout, block_rows),
                "sp_kv_flag_table: the {} layout's table needs R > 1 (R = {}){}, and {} of at least a block ({} rows, "
                "block {})",
                shard ? "shard" : "global", plan.world, shard ? " and a non-causal plan" : "",
                shard ? "shards" : "chunks", shard ? 2 * plan.chunk : plan.chunk, block_rows);
  TESSERA_CHECK(head_groups >= 1 && heads_kv >= 1 && heads_kv % head_groups == 0 && head_groups <= slots,
                "sp_kv_flag_table: heads_kv = {} in {} groups of {} slots", heads_kv, head_groups, slots);
  const std::int64_t unit = shard ? 2 * plan.chunk : plan.chunk, n_blocks = (plan.seq + block_rows - 1) / block_rows;
  // The rank whose data unit u (a shard slot, or a global chunk) holds.
  const auto owner_of = [&](std::int64_t u) {
    return shard ? static_cast<int>((plan.rank + plan.world - 1 - u) % plan.world)
                 : SpAttnPlan::owner(static_cast<int>(u), plan.world);
  };
  const std::int64_t heads_per_group = heads_kv / head_groups;
  std::vector<std::int32_t> table(static_cast<std::size_t>(2 * heads_kv * n_blocks), 0);
  for (std::int64_t h = 0; h < heads_kv; ++h) {
    const int slot = detail::sp_kv_flag_slot(static_cast<int>(h / heads_per_group));
    for (std::int64_t b = 0; b < n_blocks; ++b) {
      const std::int64_t lo = b * block_rows, hi = std::min(plan.seq, lo + block_rows) - 1;
      std::int32_t* entry = &table[static_cast<std::size_t>(2 * (h * n_blocks + b))];
      int named = 0;  // two units at most (unit >= block_rows); two global chunks may share an owner
      for (std::int64_t u = lo / unit; u <= hi / unit; ++u) {
        const int owner = owner_of(u);
        const std::int32_t flag = owner * slots + slot + 1;
        if (owner != plan.rank && (named == 0 || entry[0] != flag)) entry[named++] = flag;
      }
    }
  }
  return table;
}

int sp_attention_head_groups(std::int64_t heads_kv, std::int64_t head_dim, std::size_t elem_bytes) {
  TESSERA_CHECK(heads_kv >= 1 && head_dim >= 1 && elem_bytes >= 1,
                "sp_attention_head_groups: heads_kv = {}, head_dim = {}, element bytes = {} must be >= 1", heads_kv,
                head_dim, elem_bytes);
  constexpr std::int64_t kMinPieceBytes = 1024;
  for (int g = kSpMaxHeadGroups; g > 1; g /= 2)
    if (heads_kv % g == 0 && heads_kv / g * head_dim * static_cast<std::int64_t>(elem_bytes) >= kMinPieceBytes)
      return g;
  return 1;
}

SpAttnPlan plan_sp_attention(std::int64_t seq, int world, int rank, bool causal) {
  TESSERA_CHECK(world >= 1, "zig-zag plan: world = {} must be >= 1", world);
  TESSERA_CHECK(rank >= 0 && rank < world, "zig-zag plan: rank = {} out of range [0, {})", rank, world);
  TESSERA_CHECK(seq >= 2 * world && seq % (2 * world) == 0,
                "zig-zag plan: sequence length {} must be a positive multiple of 2 x world = {} (zig-zag chunks)", seq,
                2 * world);
  SpAttnPlan p;
  p.rank = rank;
  p.world = world;
  p.seq = seq;
  p.chunk = seq / (2 * world);
  p.causal = causal;
  p.chunks[0] = rank;
  p.chunks[1] = 2 * world - 1 - rank;
  if (causal) {
    for (int i = 0; i < 2; ++i)
      p.parts.push_back({i * p.chunk, p.chunk, p.chunks[i] * p.chunk, (p.chunks[i] + 1) * p.chunk});
  } else {
    p.parts.push_back({0, 2 * p.chunk, 0, seq});
  }
  p.recv_from.push_back(rank);
  for (int j = 1; j < world; ++j) {
    p.push_to.push_back((rank - j + world) % world);
    p.recv_from.push_back((rank + j) % world);
  }
  return p;
}

}  // namespace tessera::ops
