// CPU tests of the ring GEMM+ReduceScatter schedule (Strategy::ring,
// RingRsPlan): shard order, who sends what where, flag values per epoch,
// ragged chunks, and a host simulation of whole calls at R = 2, 3, 4, 8.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

#include "tessera/ops/plan.hpp"
#include "tessera/ops/tuner.hpp"
#include "tessera/runtime/error.hpp"

using namespace tessera;
using namespace tessera::ops;

namespace {

constexpr int kWorlds[] = {2, 3, 4, 8};

TEST(OpsRingPlan, ShardOrderNeighboursAndOwnShardLast) {
  for (int R : kWorlds)
    for (int r = 0; r < R; ++r) {
      const RingRsPlan p = plan_ring_rs(1000, 700, R, r, 4);
      ASSERT_EQ(static_cast<int>(p.steps.size()), R);
      EXPECT_EQ(p.send_to, (r - 1 + R) % R);
      EXPECT_EQ(p.recv_from, (r + 1) % R);
      std::set<int> seen;
      for (int j = 0; j < R; ++j) {
        EXPECT_EQ(p.steps[j].shard, (r + j + 1) % R) << "R " << R << " rank " << r << " step " << j;
        EXPECT_EQ(p.steps[j].receives, j > 0);
        EXPECT_EQ(p.steps[j].sends, j < R - 1);
        seen.insert(p.steps[j].shard);
      }
      EXPECT_EQ(static_cast<int>(seen.size()), R) << "every shard computed exactly once";
      EXPECT_EQ(p.steps.back().shard, r) << "the last step lands the own shard";
      EXPECT_EQ(p.notifications_per_call(), (R - 1) * 4);
      EXPECT_EQ(p.ld_recv, 704);
    }
}

// What rank r sends at step j is what rank r-1 continues at step j+1: same shard.
TEST(OpsRingPlan, SenderAndReceiverAgreeOnTheShard) {
  for (int R : kWorlds) {
    std::vector<RingRsPlan> p;
    for (int r = 0; r < R; ++r) p.push_back(plan_ring_rs(4096, 512, R, r, 2));
    for (int r = 0; r < R; ++r)
      for (int j = 0; j + 1 < R; ++j) {
        const RingRsPlan& dst = p[p[r].send_to];
        EXPECT_EQ(dst.recv_from, r);
        EXPECT_EQ(dst.steps[j + 1].shard, p[r].steps[j].shard) << "R " << R << " rank " << r << " step " << j;
      }
  }
}

TEST(OpsRingPlan, RaggedChunksCoverEveryRowOnce) {
  // (M, R, channels): aligned, ragged, shards shorter than the channel count.
  const struct {
    std::int64_t m;
    int world, channels;
  } cases[] = {{1024, 2, 4}, {1000, 3, 4}, {1000, 4, 3}, {7, 4, 4}, {1001, 8, 32}, {65, 8, 8}, {4096, 8, 1}};
  for (const auto& cs : cases) {
    const RingRsPlan p = plan_ring_rs(cs.m, 64, cs.world, 0, cs.channels);
    std::int64_t total = 0;
    for (int s = 0; s < cs.world; ++s) {
      std::int64_t next = 0;
      for (int c = 0; c < cs.channels; ++c) {
        EXPECT_EQ(p.chunk_lo(s, c), next) << "M " << cs.m << " shard " << s << " chunk " << c;
        EXPECT_GE(p.chunk_rows(s, c), 0);
        EXPECT_LE(p.chunk_rows(s, c), p.chunk_rows_max(s));
        next += p.chunk_rows(s, c);
      }
      EXPECT_EQ(next, p.shards.rows(cs.m, s));
      total += next;
    }
    EXPECT_EQ(total, cs.m);
  }
  // M = 7 over 4 ranks, 4 channels: the last shard has 1 row, chunks 1..3 empty.
  const RingRsPlan p = plan_ring_rs(7, 64, 4, 0, 4);
  EXPECT_EQ(p.chunk_rows(3, 0), 1);
  EXPECT_EQ(p.chunk_rows(3, 1), 0);
  EXPECT_EQ(p.chunk_rows(3, 3), 0);
}

TEST(OpsRingPlan, FlagValuesGrowWithinAndAcrossEpochs) {
  for (int R : kWorlds)
    for (int C : {1, 4, kMaxChannels}) {
      std::uint64_t prev = 0;
      for (std::uint64_t e = 1; e <= 4; ++e)
        for (int j = 1; j < R; ++j)
          for (int c = 0; c < C; ++c) {
            const std::uint64_t v = RingRsPlan::flag_value(e, j, c);
            EXPECT_GT(v, prev) << "R " << R << " C " << C << " e " << e << " j " << j << " c " << c;
            prev = v;
          }
    }
  // A later call's first value exceeds any value of an earlier call, whatever
  // the channel count of that call was (the largest possible one).
  EXPECT_GT(RingRsPlan::flag_value(6, 1, 0), RingRsPlan::flag_value(5, kRingMaxWorld - 1, kMaxChannels - 1));
}

TEST(OpsRingPlan, RejectsBadParameters) {
  EXPECT_THROW(plan_ring_rs(1000, 64, 4, 4, 4), tessera::Error);
  EXPECT_THROW(plan_ring_rs(1000, 64, 17, 0, 4), tessera::Error);
  EXPECT_THROW(plan_ring_rs(1000, 64, 4, 0, 0), tessera::Error);
  EXPECT_THROW(plan_ring_rs(1000, 64, 4, 0, kMaxChannels + 1), tessera::Error);
  EXPECT_THROW(plan_ring_rs(5, 64, 4, 0, 1), tessera::Error);  // shards 2, 2, 1, 0: one empty
  EXPECT_THROW(plan_ring_rs(1000, 0, 4, 0, 1), tessera::Error);
  EXPECT_THROW(RingRsPlan::flag_value(0, 1, 0), tessera::Error);
  EXPECT_THROW(RingRsPlan::flag_value(1, 0, 0), tessera::Error);
  EXPECT_THROW(RingRsPlan::flag_value(1, 1, kMaxChannels), tessera::Error);
}

// Host simulation of back-to-back calls, executing each rank's schedule the
// way run_ring enqueues it (steps in lockstep; what is sent at step j is
// read at step j+1): every slab slot is written once per call by the right
// sender, each wait expects exactly the value the sender stored for that
// chunk, the sender's stores grow, and rank r ends with the contributions
// of every rank, in the fixed order r-1, r-2, ..., r+1, r.
TEST(OpsRingPlan, SimulatedCallsReduceEveryShardInRingOrder) {
  for (int R : kWorlds) {
    const int C = 3;
    std::vector<RingRsPlan> p;
    for (int r = 0; r < R; ++r) p.push_back(plan_ring_rs(1000, 100, R, r, C));
    std::vector<std::uint64_t> flag(R, 0);  // kRingData flag on each rank (stored by its recv_from)
    for (std::uint64_t e = 1; e <= 3; ++e) {
      struct Slot {
        int shard = -1;
        std::vector<int> order;
        int writes = 0;
      };
      std::vector<std::vector<Slot>> slab(R, std::vector<Slot>(R));
      std::vector<std::map<int, std::uint64_t>> stored(R);  // receiver -> (step*C+c -> value)
      std::vector<std::vector<int>> result(R);
      for (int j = 0; j < R; ++j)
        for (int r = 0; r < R; ++r) {
          const RingRsStep& st = p[r].steps[j];
          std::vector<int> sum;
          if (st.receives) {
            const Slot& in = slab[r][j];
            ASSERT_EQ(in.writes, 1) << "R " << R << " rank " << r << " step " << j;
            ASSERT_EQ(in.shard, st.shard);
            for (int c = 0; c < C; ++c) {
              const std::uint64_t want = RingRsPlan::flag_value(e, j, c);
              ASSERT_EQ(stored[r].at(j * C + c), want);
              EXPECT_GE(flag[r], want);
            }
            sum = in.order;
          }
          sum.push_back(r);  // x (received) first, own partial second
          if (st.sends) {
            const int d = p[r].send_to;
            Slot& out = slab[d][j + 1];
            ++out.writes;
            out.shard = st.shard;
            out.order = sum;
            for (int c = 0; c < C; ++c) {
              const std::uint64_t v = RingRsPlan::flag_value(e, j + 1, c);
              EXPECT_GT(v, flag[d]) << "stores to one flag must grow";
              flag[d] = v;
              stored[d][(j + 1) * C + c] = v;
            }
          } else {
            result[r] = sum;
          }
        }
      for (int r = 0; r < R; ++r) {
        ASSERT_EQ(static_cast<int>(result[r].size()), R);
        for (int i = 0; i < R; ++i) EXPECT_EQ(result[r][i], ((r - 1 - i) % R + R) % R) << "R " << R << " rank " << r;
        EXPECT_EQ(slab[r][0].writes, 0) << "slab 0 is never written";
      }
    }
  }
}

TEST(OpsTuner, FusedCeRsIsACandidateOnlyWithTileRowShards) {
  auto has = [](int w, bool rows) {
    for (Strategy s : gemm_rs_candidates(w, rows))
      if (s == Strategy::fused_ce) return true;
    return false;
  };
  EXPECT_TRUE(has(2, true));
  EXPECT_TRUE(has(4, true));
  EXPECT_FALSE(has(2, false));
  EXPECT_FALSE(has(1, true));  // nothing to reduce
}

TEST(OpsRingTuner, RingIsACandidateOnlyAboveTwoRanks) {
  auto has_ring = [](int w) {
    for (Strategy s : gemm_rs_candidates(w))
      if (s == Strategy::ring) return true;
    return false;
  };
  EXPECT_FALSE(has_ring(1));
  EXPECT_FALSE(has_ring(2));
  for (int w : {3, 4, 8}) EXPECT_TRUE(has_ring(w)) << w;
  EXPECT_EQ(gemm_rs_candidates(4).front(), Strategy::sequential);
  EXPECT_EQ(parse_strategy("ring"), Strategy::ring);
  EXPECT_EQ(strategy_name(Strategy::ring), "ring");
  EXPECT_EQ(
      choice_from_json(choice_to_json(Strategy::ring, {{Strategy::sequential, 1.0}, {Strategy::ring, 0.8}}, {1, 2, 3})),
      Strategy::ring);
}

}  // namespace
