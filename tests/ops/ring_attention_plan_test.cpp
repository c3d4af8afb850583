// CPU tests of the ring and Ulysses attention plans: the ring steps of all
// ranks admit every (query, key) pair of the global mask exactly once, with
// equal work per rank, and a step's keys are the shard its rank holds; the
// Ulysses head groups and head divisibility are checked before launch.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessera/ops/ring_attention.hpp"
#include "tessera/ops/ulysses_attention.hpp"
#include "tessera/runtime/error.hpp"

using namespace tessera;

namespace {

/// Global row of local shard row i on rank r (zig-zag: chunks r, 2R-1-r).
std::int64_t global_row(int r, int world, std::int64_t chunk, std::int64_t i) {
  const std::int64_t c = i < chunk ? r : 2 * world - 1 - r;
  return c * chunk + i % chunk;
}

}  // namespace

TEST(RingAttentionPlan, StepsCoverTheMaskOnceWithEqualWork) {
  for (int world : {1, 2, 3, 4, 8})
    for (bool causal : {true, false}) {
      const std::int64_t chunk = 6, seq = 2 * world * chunk;
      std::vector<int> seen(static_cast<std::size_t>(seq * seq), 0);
      std::int64_t pairs0 = -1;
      for (int r = 0; r < world; ++r) {
        const ops::RingAttnPlan p = ops::plan_ring_attention(seq, world, r, causal);
        ASSERT_EQ(static_cast<int>(p.steps.size()), world);
        EXPECT_EQ(p.send_to, (r - 1 + world) % world);
        EXPECT_EQ(p.recv_from, (r + 1) % world);
        std::int64_t counted = 0;
        for (int j = 0; j < world; ++j) {
          const ops::RingAttnPlan::Step& s = p.steps[j];
          // Step j holds the shard rank r+1 held at step j-1.
          EXPECT_EQ(s.owner, (r + j) % world);
          if (j > 0) {
            EXPECT_EQ(s.owner, ops::plan_ring_attention(seq, world, p.recv_from, causal).steps[j - 1].owner);
          }
          ASSERT_GE(s.row0, 0);
          ASSERT_LE(s.row0 + s.rows, 2 * chunk);
          ASSERT_LE(s.kv_len, 2 * chunk);
          for (std::int64_t i = s.row0; i < s.row0 + s.rows; ++i)
            for (std::int64_t k = 0; k < s.kv_len; ++k) {
              if (s.causal && k > i) continue;
              const std::int64_t gq = global_row(r, world, chunk, i), gk = global_row(s.owner, world, chunk, k);
              ++seen[static_cast<std::size_t>(gq * seq + gk)];
              ++counted;
            }
        }
        EXPECT_EQ(counted, p.pairs());
        if (pairs0 < 0) pairs0 = counted;
        EXPECT_EQ(counted, pairs0) << "rank " << r << " of " << world << (causal ? " causal" : "");
      }
      for (std::int64_t q = 0; q < seq; ++q)
        for (std::int64_t k = 0; k < seq; ++k)
          ASSERT_EQ(seen[static_cast<std::size_t>(q * seq + k)], (!causal || k <= q) ? 1 : 0)
              << "pair (" << q << ", " << k << ") world " << world << (causal ? " causal" : "");
    }
}

TEST(RingAttentionPlan, RejectsBadSequence) {
  EXPECT_THROW(ops::plan_ring_attention(2 * 4 * 8 + 2, 4, 0, true), Error);
  EXPECT_THROW(ops::plan_ring_attention(2, 2, 0, true), Error);
  EXPECT_THROW(ops::plan_ring_attention(64, 2, 2, true), Error);
  try {
    ops::plan_ring_attention(100, 8, 0, false);
    ADD_FAILURE() << "accepted seq 100 at world 8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 2 x world"), std::string::npos) << e.what();
  }
}

TEST(RingAttentionPlan, WorkspaceBytes) {
  ops::RingAttnArgs a;
  a.batch = 2;
  a.seq = 4096;
  a.heads_q = 8;
  a.heads_kv = 2;
  a.head_dim = 128;
  EXPECT_EQ(ops::ring_attention_workspace_bytes(a, 1), 0u);
  // 2 slots x (K, V) of [2, 2048, 2, 128] bf16, f32 O + 2 LSE, bf16 partial O.
  const std::size_t kv = 2 * 2048 * 2 * 128 * 2, o = 2 * 2048 * 8 * 128, lse = 2 * 8 * 2048 * 4;
  EXPECT_EQ(ops::ring_attention_workspace_bytes(a, 2), 4 * kv + 4 * o + 2 * lse + 2 * o);
}

TEST(UlyssesAttentionPlan, HeadGroupsAndDivisibility) {
  ops::UlyssesAttnArgs a;
  a.batch = 1;
  a.seq = 1024;
  a.heads_q = 32;
  a.heads_kv = 8;
  a.head_dim = 128;
  EXPECT_EQ(ops::ulysses_head_groups(a, 2, ops::UlyssesStrategy::sequential), 1);
  EXPECT_EQ(ops::ulysses_head_groups(a, 2, ops::UlyssesStrategy::pipelined), 4);
  EXPECT_EQ(ops::ulysses_head_groups(a, 4, ops::UlyssesStrategy::pipelined), 2);
  EXPECT_EQ(ops::ulysses_head_groups(a, 8, ops::UlyssesStrategy::pipelined), 1);
  EXPECT_EQ(ops::ulysses_head_groups(a, 2, ops::UlyssesStrategy::pipelined, 2), 2);
  EXPECT_THROW(ops::ulysses_head_groups(a, 2, ops::UlyssesStrategy::pipelined, 3), Error);
  EXPECT_THROW(ops::ulysses_head_groups(a, 2, ops::UlyssesStrategy::pipelined, -1), Error);
  a.heads_kv = 2;
  try {
    ops::ulysses_head_groups(a, 4, ops::UlyssesStrategy::sequential);
    ADD_FAILURE() << "accepted heads_kv 2 at world 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("heads_kv = 2 is not a multiple of world = 4"), std::string::npos) << e.what();
  }
  a.heads_q = 6;
  a.heads_kv = 6;
  try {
    ops::ulysses_head_groups(a, 4, ops::UlyssesStrategy::pipelined);
    ADD_FAILURE() << "accepted heads_q 6 at world 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("heads_q = 6 is not a multiple of world = 4"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ops::ulysses_attention_workspace_bytes(a, 1, 1), 0u);
  a.heads_q = 8;
  a.heads_kv = 8;
  EXPECT_GT(ops::ulysses_attention_workspace_bytes(a, 2, 2), 0u);
}
