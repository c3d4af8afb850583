// CPU tests of the zig-zag sequence-parallel attention plan: every chunk
// owned once, the parts reproduce the global causal mask row by row, the
// causal work is balanced across ranks, and the push / receive schedules
// match between ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

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
