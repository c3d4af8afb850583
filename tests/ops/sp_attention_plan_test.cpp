// CPU tests of the zig-zag sequence-parallel attention plan: every chunk
// owned once, the parts reproduce the global causal mask row by row, the
// causal work is balanced across ranks, and the push / receive schedules
// match between ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "tessera/ops/sp_attention.hpp"
#include "tessera/runtime/error.hpp"

using tessera::ops::plan_sp_attention;
using tessera::ops::SpAttnPlan;

TEST(SpAttentionPlan, ZigZagCoversBalancesAndSchedules) {
  for (int world : {1, 2, 3, 4, 8})
    for (bool causal : {true, false}) {
      const std::int64_t chunk = 24, seq = 2 * world * chunk;
      std::set<int> owned;
      std::int64_t pairs0 = -1;
      for (int r = 0; r < world; ++r) {
        const SpAttnPlan p = plan_sp_attention(seq, world, r, causal);
        ASSERT_EQ(p.chunk, chunk);
        for (int c : p.chunks) {
          EXPECT_TRUE(owned.insert(c).second) << "chunk " << c << " owned twice";
          EXPECT_EQ(SpAttnPlan::owner(c, world), r);
          EXPECT_EQ(p.arrival_step(c), 0);
        }
        EXPECT_EQ(SpAttnPlan::slot(p.chunks[0], world), 0);
        EXPECT_EQ(SpAttnPlan::slot(p.chunks[1], world), 1);
        // Every local row, through its part, admits exactly the keys the
        // global mask admits for its global position.
        std::int64_t covered = 0;
        for (const SpAttnPlan::Part& part : p.parts) {
          EXPECT_LE(part.kv_len, seq);
          for (std::int64_t i = 0; i < part.rows; ++i) {
            const std::int64_t local = part.local_row0 + i, g = p.global_row(local);
            const std::int64_t admitted =
                causal ? std::clamp<std::int64_t>(part.q_offset + i + 1, 0, part.kv_len) : part.kv_len;
            EXPECT_EQ(admitted, causal ? g + 1 : seq) << "rank " << r << " local row " << local;
          }
          covered += part.rows;
        }
        EXPECT_EQ(covered, 2 * chunk);
        // Balance: the same admitted pairs on every rank.
        if (pairs0 < 0) pairs0 = p.pairs();
        EXPECT_EQ(p.pairs(), pairs0) << "rank " << r << (causal ? " causal" : "");
        // Schedules: r pushes to d at step j  <=>  d receives from r at step j.
        ASSERT_EQ(static_cast<int>(p.push_to.size()), world - 1);
        ASSERT_EQ(static_cast<int>(p.recv_from.size()), world);
        EXPECT_EQ(p.recv_from[0], r);
        for (int j = 1; j < world; ++j) {
          const int d = p.push_to[j - 1];
          EXPECT_EQ(plan_sp_attention(seq, world, d, causal).recv_from[j], r);
          EXPECT_EQ(p.arrival_step(p.recv_from[j]), j);  // chunk s < R is rank s's first
        }
      }
      EXPECT_EQ(static_cast<int>(owned.size()), 2 * world);
      if (causal) {
        EXPECT_EQ(pairs0, chunk * chunk * (2 * world - 1) + chunk * (chunk + 1));
      }
    }
}

TEST(SpAttentionPlan, RejectsBadShapes) {
  EXPECT_THROW(plan_sp_attention(100, 4, 0, true), tessera::Error);  // not a multiple of 2R
  EXPECT_THROW(plan_sp_attention(64, 0, 0, true), tessera::Error);
  EXPECT_THROW(plan_sp_attention(64, 2, 2, true), tessera::Error);
  EXPECT_THROW(plan_sp_attention(2, 2, 0, true), tessera::Error);
}

// Every prefix's order is a permutation of its blocks, blocks come by the
// arrival step of the latest chunk they cover, and descending within one.
TEST(SpAttentionPlan, ArrivalOrderIsAPermutationByLandingStep) {
  for (int world : {2, 3, 4})
    for (int rank = 0; rank < world; ++rank)
      for (const auto& [seq, block] :
           {std::pair{2048 * world, 176}, std::pair{512 * world, 128}, std::pair{48 * world, 176}}) {
        const SpAttnPlan p = plan_sp_attention(seq, world, rank, true);
        for (const SpAttnPlan::Part& part : p.parts) {
          const auto t = tessera::ops::kv_arrival_order(p, part.kv_len, block);
          const std::int64_t nb = (part.kv_len + block - 1) / block;
          ASSERT_EQ(static_cast<std::int64_t>(t.size()), nb * (nb + 1) / 2);
          auto landing = [&](std::int32_t b) {
            const std::int64_t lo = std::int64_t{b} * block, hi = std::min(part.kv_len, lo + block) - 1;
            int k = 0;
            for (std::int64_t c = lo / p.chunk; c <= hi / p.chunk; ++c)
              k = std::max(k, 2 * p.arrival_step(static_cast<int>(c)) + SpAttnPlan::slot(static_cast<int>(c), world));
            return k;
          };
          for (std::int64_t n = 1; n <= nb; ++n) {
            const auto* o = t.data() + n * (n - 1) / 2;
            std::set<std::int32_t> seen(o, o + n);
            ASSERT_EQ(static_cast<std::int64_t>(seen.size()), n);
            ASSERT_EQ(*seen.begin(), 0);
            ASSERT_EQ(*seen.rbegin(), n - 1);
            for (std::int64_t i = 1; i < n; ++i) {
              const int k0 = landing(o[i - 1]), k1 = landing(o[i]);
              ASSERT_TRUE(k0 < k1 || (k0 == k1 && o[i - 1] > o[i]))
                  << "world " << world << " rank " << rank << " n " << n << " at " << i;
            }
          }
        }
      }
  const SpAttnPlan p = plan_sp_attention(1024, 2, 0, false);
  EXPECT_THROW(tessera::ops::kv_arrival_order(p, 0, 128), tessera::Error);
  EXPECT_THROW(tessera::ops::kv_arrival_order(p, 1024, 0), tessera::Error);
}

// fused_ce's head groups: a power of two <= kSpMaxHeadGroups dividing the KV
// heads, pieces of at least 1 KiB per row, the largest such.
TEST(SpAttentionPlan, HeadGroups) {
  using tessera::ops::kSpMaxHeadGroups;
  using tessera::ops::sp_attention_head_groups;
  EXPECT_EQ(sp_attention_head_groups(32, 128, 2), 8);  // 4 heads x 256 B = 1 KiB pieces
  EXPECT_EQ(sp_attention_head_groups(64, 128, 2), 8);
  EXPECT_EQ(sp_attention_head_groups(8, 128, 2), 2);  // GQA 8 KV heads: 4 heads = 1 KiB
  EXPECT_EQ(sp_attention_head_groups(8, 64, 2), 1);
  EXPECT_EQ(sp_attention_head_groups(1, 128, 2), 1);   // MQA
  EXPECT_EQ(sp_attention_head_groups(12, 128, 2), 2);  // 6 heads = 1.5 KiB
  EXPECT_EQ(sp_attention_head_groups(3, 128, 2), 1);
  for (std::int64_t h = 1; h <= 128; ++h)
    for (std::int64_t d : {64, 128}) {
      const int g = sp_attention_head_groups(h, d, 2);
      ASSERT_GE(g, 1);
      ASSERT_LE(g, kSpMaxHeadGroups);
      ASSERT_EQ(g & (g - 1), 0);
      ASSERT_EQ(h % g, 0);
      if (g > 1) {
        ASSERT_GE(h / g * d * 2, 1024);
      }
      if (2 * g <= kSpMaxHeadGroups && h % (2 * g) == 0) {
        ASSERT_LT(h / (2 * g) * d * 2, 1024) << h << " heads, d " << d << ": a larger group count fits";
      }
    }
  EXPECT_THROW(sp_attention_head_groups(0, 128, 2), tessera::Error);
}

// The own rows the fused kernel still reads from the workspace when it reads
// its own chunks in place: with the blocks inside the chunk they cover the
// chunk exactly once; only head and tail; every edge row lies in a block
// that also covers a row outside the chunk.
TEST(SpAttentionPlan, OwnEdgeRowsAndInsideBlocksCoverTheChunkOnce) {
  using tessera::ops::sp_own_edge_rows;
  for (std::int64_t block : {1, 64, 128, 176})
    for (std::int64_t chunk : {1, 50, 96, 128, 176, 200, 352, 4096})
      for (std::int64_t start : {std::int64_t{0}, chunk, 3 * chunk, 7 * chunk + 0}) {
        std::vector<int> cover(static_cast<std::size_t>(chunk), 0);
        const auto edges = sp_own_edge_rows(start, chunk, block);
        ASSERT_LE(edges.size(), 2u);
        for (const auto& [lo, hi] : edges) {
          ASSERT_LT(lo, hi);
          ASSERT_GE(lo, start);
          ASSERT_LE(hi, start + chunk);
          for (std::int64_t r = lo; r < hi; ++r) {
            ++cover[static_cast<std::size_t>(r - start)];
            const std::int64_t b0 = r / block * block;
            EXPECT_TRUE(b0 < start || b0 + block > start + chunk)
                << "edge row " << r << " lies in a block inside the chunk";
          }
        }
        for (std::int64_t b0 = start / block * block; b0 < start + chunk; b0 += block)
          if (b0 >= start && b0 + block <= start + chunk)
            for (std::int64_t r = b0; r < b0 + block; ++r) ++cover[static_cast<std::size_t>(r - start)];
        for (std::int64_t i = 0; i < chunk; ++i)
          ASSERT_EQ(cover[static_cast<std::size_t>(i)], 1)
              << "row " << start + i << " of chunk [" << start << ", +" << chunk << ") block " << block;
      }
  EXPECT_THROW(sp_own_edge_rows(0, 0, 176), tessera::Error);
  EXPECT_THROW(sp_own_edge_rows(0, 64, 0), tessera::Error);
}

// The shard layout: every rank's shard in one slot of each workspace, the
// own one last, the peers in arrival order (the order recv_from lists).
TEST(SpAttentionPlan, ShardSlotsPlaceOwnLastThenArrivals) {
  for (int world : {2, 3, 4, 8})
    for (int dst = 0; dst < world; ++dst) {
      const SpAttnPlan p = plan_sp_attention(2 * world * 64, world, dst, false);
      std::set<int> slots;
      for (int owner = 0; owner < world; ++owner) slots.insert(tessera::ops::sp_shard_slot(world, dst, owner));
      EXPECT_EQ(slots.size(), static_cast<std::size_t>(world));
      EXPECT_EQ(*slots.begin(), 0);
      EXPECT_EQ(*slots.rbegin(), world - 1);
      for (int step = 0; step < world; ++step)  // descending slots visit recv_from in order
        EXPECT_EQ(tessera::ops::sp_shard_slot(world, dst, p.recv_from[static_cast<std::size_t>(step)]),
                  world - 1 - step);
    }
  EXPECT_THROW(tessera::ops::sp_shard_slot(2, 2, 0), tessera::Error);
  EXPECT_THROW(tessera::ops::sp_shard_slot(2, 0, -1), tessera::Error);
}

// The wait table names, for every (KV head, block), exactly the flags of the
// peer chunks (global order) or shards (shard layout) whose rows the block
// covers (checked row by row), each once, with the head's group slot; none
// for the rank's own. The shard layout refuses causal plans; both refuse
// R = 1 and units (chunks, shards) shorter than a block.
TEST(SpAttentionPlan, FlagTableNamesThePeerDataOfEachBlock) {
  using tessera::ops::sp_kv_flag_table;
  using tessera::ops::sp_kv_table_fits;
  using tessera::ops::SpKvLayout;
  const int slots = 8;
  for (SpKvLayout layout : {SpKvLayout::global, SpKvLayout::shard})
    for (bool causal : {false, true})
      for (int world : {2, 3, 4})
        for (std::int64_t chunk : {64, 96, 100, 200})
          for (int block_rows : {128, 192})
            for (int rank = 0; rank < world; ++rank) {
              const bool shard = layout == SpKvLayout::shard;
              const std::int64_t seq = 2 * world * chunk, unit = shard ? 2 * chunk : chunk, heads_kv = 4;
              const SpAttnPlan p = plan_sp_attention(seq, world, rank, causal);
              const bool fits = unit >= block_rows && !(shard && causal);
              ASSERT_EQ(sp_kv_table_fits(p, layout, block_rows), fits);
              if (!fits) {
                EXPECT_THROW(sp_kv_flag_table(p, layout, block_rows, heads_kv, 2, slots), tessera::Error);
                continue;
              }
              const auto t = sp_kv_flag_table(p, layout, block_rows, heads_kv, 2, slots);
              const std::int64_t n_blocks = (seq + block_rows - 1) / block_rows;
              ASSERT_EQ(t.size(), static_cast<std::size_t>(2 * heads_kv * n_blocks));
              // The owner of global row i (global order) or workspace row i (shard layout).
              const auto owner_of = [&](std::int64_t row) {
                if (!shard) return SpAttnPlan::owner(static_cast<int>(row / chunk), world);
                for (int o = 0; o < world; ++o)
                  if (tessera::ops::sp_shard_slot(world, rank, o) == row / unit) return o;
                return -1;
              };
              for (std::int64_t h = 0; h < heads_kv; ++h)
                for (std::int64_t b = 0; b < n_blocks; ++b) {
                  std::set<int> want;
                  for (std::int64_t row = b * block_rows; row < std::min(seq, (b + 1) * block_rows); ++row)
                    if (owner_of(row) != rank) want.insert(owner_of(row) * slots + static_cast<int>(h / 2) + 1);
                  std::set<int> got;
                  for (int i = 0; i < 2; ++i) {
                    const std::int32_t f = t[static_cast<std::size_t>(2 * (h * n_blocks + b) + i)];
                    if (f != 0) EXPECT_TRUE(got.insert(f).second) << "a flag named twice";
                  }
                  EXPECT_EQ(got, want) << (shard ? "shard" : "global") << " world " << world << " chunk " << chunk
                                       << " rank " << rank << " head " << h << " block " << b;
                }
            }
  EXPECT_FALSE(sp_kv_table_fits(plan_sp_attention(1024, 1, 0, false), SpKvLayout::global, 128));
  EXPECT_THROW(sp_kv_flag_table(plan_sp_attention(1024, 2, 0, false), SpKvLayout::shard, 128, 4, 3, slots),
               tessera::Error);
}
