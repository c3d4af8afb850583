// CPU test of two-level attention's host logic (two_level_attention.hpp):
// the u x r mesh (groups, rings), the Ulysses degree (choice and errors),
// the workspace, the tuner's candidates, and the composition itself:
//  - the operator's own Ulysses pack / transfer / unpack functions, run over
//    host memory for each group of u emulated ranks with the group's global
//    peers, put every global token where TwoLevelPlan::head_shard_chunk says
//    (the ring shard of rank `group` in a ring of r, in its local order);
//  - the ring plan of r ranks on those head shards admits every (query, key)
//    pair of the global mask exactly once, with the same work on every rank.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ops/seq_parallel_detail.hpp"
#include "tessera/ops/ring_attention.hpp"
#include "tessera/ops/sp_attention.hpp"
#include "tessera/ops/tuner.hpp"
#include "tessera/ops/two_level_attention.hpp"
#include "tessera/ops/ulysses_attention.hpp"
#include "tessera/runtime/error.hpp"

using namespace tessera;
using ops::detail::UlyssesRank;

namespace {

constexpr std::int64_t kD = 64;  // bf16: 128-byte head rows

std::uint64_t code(int tensor, std::int64_t b, std::int64_t t, std::int64_t h) {
  return (static_cast<std::uint64_t>(tensor) << 56) | (static_cast<std::uint64_t>(b) << 40) |
         (static_cast<std::uint64_t>(t) << 16) | static_cast<std::uint64_t>(h);
}

void host_copy(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
               std::size_t rows) {
  for (std::size_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<unsigned char*>(dst) + r * dpitch, static_cast<const unsigned char*>(src) + r * spitch,
                width);
}

ops::SpAttnArgs args(std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t Hkv) {
  ops::SpAttnArgs a;
  a.batch = B;
  a.seq = S;
  a.heads_q = H;
  a.heads_kv = Hkv;
  a.head_dim = kD;
  return a;
}

}  // namespace

TEST(TwoLevelPlan, Mesh) {
  for (int R : {1, 2, 4, 6, 8})
    for (int u = 1; u <= R; ++u) {
      if (R % u) continue;
      for (int g = 0; g < R; ++g) {
        const ops::TwoLevelPlan p = ops::plan_two_level_attention(4 * R, R, g, u);
        EXPECT_EQ(p.inner * p.outer, R);
        EXPECT_EQ(p.group * u + p.index, g);
        ASSERT_EQ(static_cast<int>(p.group_ranks.size()), u);
        ASSERT_EQ(static_cast<int>(p.ring_ranks.size()), R / u);
        EXPECT_EQ(p.group_ranks[p.index], g);
        EXPECT_EQ(p.ring_ranks[p.group], g);
        for (int r : p.ring_ranks) EXPECT_EQ(r % u, p.index);  // one ring holds one head slice
        for (int r : p.group_ranks) EXPECT_EQ(r / u, p.group);
        // The head shard's 2u blocks are the group's 2u zig-zag chunks.
        std::set<int> mine, group;
        for (int m = 0; m < 2 * u; ++m) mine.insert(p.head_shard_chunk(m));
        for (int r : p.group_ranks) group.insert({r, 2 * R - 1 - r});
        EXPECT_EQ(mine, group);
      }
    }
  EXPECT_THROW(ops::plan_two_level_attention(16, 4, 0, 3), Error);
  EXPECT_THROW(ops::plan_two_level_attention(18, 4, 0, 2), Error);  // seq not a multiple of 2R
  EXPECT_THROW(ops::plan_two_level_attention(16, 4, 4, 2), Error);
  try {
    ops::plan_two_level_attention(16, 4, 0, 3);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("two_level_inner = 3"), std::string::npos) << e.what();
  }
}

TEST(TwoLevelPlan, InnerDegree) {
  // MHA 8 heads at R = 4: every divisor; the choice is the smallest proper one.
  EXPECT_EQ(ops::two_level_inner_degrees(args(1, 64, 8, 8), 4), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(ops::two_level_inner_degree(args(1, 64, 8, 8), 4), 2);
  EXPECT_EQ(ops::two_level_inner_degree(args(1, 64, 8, 8), 8), 2);
  EXPECT_EQ(ops::two_level_inner_degree(args(1, 64, 6, 6), 6), 2);
  EXPECT_EQ(ops::two_level_inner_degree(args(1, 64, 9, 3), 6), 3);  // 2 does not divide the heads
  // R = 2 (or prime): no proper divisor, the plain ring.
  EXPECT_EQ(ops::two_level_inner_degree(args(1, 64, 8, 8), 2), 1);
  EXPECT_EQ(ops::two_level_inner_degree(args(1, 64, 8, 8), 1), 1);
  // GQA 8/1 at R = 4: only u = 1.
  EXPECT_EQ(ops::two_level_inner_degrees(args(1, 64, 8, 1), 4), std::vector<int>{1});
  EXPECT_EQ(ops::two_level_inner_degree(args(1, 64, 8, 1), 4), 1);
  // Explicit degrees: taken when allowed, else an error naming the condition.
  EXPECT_EQ(ops::two_level_inner_degree(args(1, 64, 8, 4), 4, 4), 4);
  EXPECT_EQ(ops::two_level_inner_degree(args(1, 64, 8, 4), 4, 1), 1);
  auto expect_error = [](const ops::SpAttnArgs& a, int world, int inner, const std::string& needle) {
    try {
      ops::two_level_inner_degree(a, world, inner);
      ADD_FAILURE() << "accepted two_level_inner " << inner << " at world " << world;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(args(1, 64, 8, 8), 4, 3, "two_level_inner = 3 must be a divisor of the world size 4");
  expect_error(args(1, 64, 6, 6), 4, 4, "heads_q = 6 is not a multiple of two_level_inner = 4");
  expect_error(args(1, 64, 8, 2), 4, 4, "heads_kv = 2 is not a multiple of two_level_inner = 4");
  expect_error(args(1, 64, 6, 4), 4, 2, "heads_q = 6 is not a multiple of heads_kv = 4");
  expect_error(args(1, 64, 8, 8), 4, -1, "two_level_inner = -1");
}

TEST(TwoLevelPlan, WorkspaceAndCandidates) {
  const ops::SpAttnArgs a = args(2, 4096, 8, 4);
  // u = 1 is the ring, u = R Ulysses.
  EXPECT_EQ(ops::two_level_attention_workspace_bytes(a, 4, 1), ops::ring_attention_workspace_bytes(a, 4));
  EXPECT_EQ(ops::two_level_attention_workspace_bytes(a, 4, 4), ops::ulysses_attention_workspace_bytes(a, 4, 1));
  // 2 x 2: the group's head shard and staging, and a ring of 2 on H / 2 heads.
  ops::SpAttnArgs g = a, h = a;
  g.seq = a.seq / 2;
  h.heads_q /= 2;
  h.heads_kv /= 2;
  const std::size_t want = ops::ulysses_attention_workspace_bytes(g, 2, 1) + ops::ring_attention_workspace_bytes(h, 2);
  EXPECT_EQ(ops::two_level_attention_workspace_bytes(a, 4, 2), want);
  EXPECT_EQ(ops::sp_attention_workspace_bytes(a, 4, ops::SpStrategy::two_level, 2), want);
  EXPECT_EQ(ops::sp_attention_workspace_bytes(a, 4, ops::SpStrategy::two_level), want);  // 0: the choice, 2
  EXPECT_EQ(ops::two_level_attention_workspace_bytes(a, 1, 1), 0u);
  EXPECT_THROW(ops::sp_attention_workspace_bytes(a, 4, ops::SpStrategy::two_level, 3), Error);

  using V = std::vector<ops::Strategy>;
  using ops::Strategy;
  EXPECT_EQ(ops::sp_attention_candidates(4, true, true, true),
            (V{Strategy::sequential, Strategy::fused_ce, Strategy::ring, Strategy::ulysses, Strategy::two_level}));
  EXPECT_EQ(ops::sp_attention_candidates(4, true, false, true),
            (V{Strategy::sequential, Strategy::fused_ce, Strategy::ring, Strategy::two_level}));
  EXPECT_EQ(ops::sp_attention_candidates(2, true, true, true),
            (V{Strategy::sequential, Strategy::fused_ce, Strategy::ring, Strategy::ulysses}));
  EXPECT_EQ(ops::sp_attention_candidates(4, false, true, true), V{Strategy::sequential});
  EXPECT_TRUE(ops::accepts(ops::OpKind::sp_attention, Strategy::two_level));
  EXPECT_FALSE(ops::accepts(ops::OpKind::gemm_rs, Strategy::two_level));
  EXPECT_EQ(ops::parse_strategy("two_level"), Strategy::two_level);
  EXPECT_EQ(ops::sp_strategy_name(ops::SpStrategy::two_level), "two_level");
  EXPECT_EQ(static_cast<int>(ops::SpStrategy::two_level), static_cast<int>(Strategy::two_level));
}

namespace {

/// Every group's all-to-all in over host memory; checks that each rank's
/// head shard holds global token head_shard_chunk(t / C)·C + t % C of its
/// heads at row t, for Q, K and V. Returns the first mismatch ("" if none).
std::string check_head_shards(int R, int u, std::int64_t B, std::int64_t H, std::int64_t Hkv) {
  const std::int64_t C = 3, L = 2 * C, S = R * L;
  ops::SpAttnArgs a = args(B, S, H, Hkv);
  std::vector<std::vector<unsigned char>> q(R), k(R), v(R), scratch(R);
  std::vector<ops::SpAttnArgs> as(R);
  std::vector<UlyssesRank> us(R);
  std::vector<ops::TwoLevelPlan> ps(R);
  const ops::detail::Copy2d copy = host_copy;
  for (int g = 0; g < R; ++g) {
    ps[g] = ops::plan_two_level_attention(S, R, g, u);
    const int chunks[2] = {g, 2 * R - 1 - g};
    struct T {
      std::vector<unsigned char>* buf;
      std::int64_t heads;
      int tensor;
    };
    for (const T& t : {T{&q[g], H, 0}, T{&k[g], Hkv, 1}, T{&v[g], Hkv, 2}}) {
      t.buf->assign(static_cast<std::size_t>(B * L * t.heads * kD * 2), 0);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t i = 0; i < L; ++i)
          for (std::int64_t h = 0; h < t.heads; ++h) {
            const std::uint64_t c = code(t.tensor, b, chunks[i / C] * C + i % C, h);
            std::memcpy(&(*t.buf)[static_cast<std::size_t>(((b * L + i) * t.heads + h) * kD * 2)], &c, 8);
          }
    }
    as[g] = a;
    as[g].q = q[g].data();
    as[g].k = k[g].data();
    as[g].v = v[g].data();
    ops::SpAttnArgs ga = a;
    ga.seq = S / ps[g].outer;
    us[g] = ops::detail::ulysses_rank(ga, u, ps[g].index, 1);
    scratch[g].assign(us[g].layout().total, 0);
    us[g].place(scratch[g].data());
    ops::detail::ulysses_pack_in(us[g], as[g], 0, copy);
  }
  // The NCCL exchange, emulated: rank g's k-th transfer with inner peer p
  // feeds global rank group_ranks[p]'s k-th transfer with g's inner index.
  for (int g = 0; g < R; ++g)
    for (int p = 0; p < u; ++p) {
      const int peer = ps[g].group_ranks[p];
      std::vector<UlyssesRank::Transfer> sends, recvs;
      for (const auto& t : us[g].transfers_in(0))
        if (t.peer == p) sends.push_back(t);
      for (const auto& t : us[peer].transfers_in(0))
        if (t.peer == ps[g].index) recvs.push_back(t);
      if (sends.size() != recvs.size()) return "transfer counts differ";
      for (std::size_t i = 0; i < sends.size(); ++i) {
        if (sends[i].bytes != recvs[i].bytes) return "transfer sizes differ";
        std::memcpy(recvs[i].recv, sends[i].send, sends[i].bytes);
      }
    }
  for (int g = 0; g < R; ++g) {
    ops::detail::ulysses_unpack_in(us[g], 0, copy);
    const UlyssesRank& x = us[g];
    const std::int64_t T = S / ps[g].outer;  // head-shard tokens
    struct F {
      const unsigned char* full;
      std::int64_t local;
      int tensor;
    };
    for (const F& f : {F{x.fq, H / u, 0}, F{x.fk, Hkv / u, 1}, F{x.fv, Hkv / u, 2}})
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int64_t hl = 0; hl < f.local; ++hl) {
            std::uint64_t got;
            std::memcpy(&got, f.full + x.head_row(f.local, b, t, hl), 8);
            const std::int64_t tok = ps[g].head_shard_chunk(static_cast<int>(t / C)) * C + t % C;
            const std::uint64_t want = code(f.tensor, b, tok, ps[g].index * f.local + hl);
            if (got != want)
              return "R " + std::to_string(R) + " u " + std::to_string(u) + " rank " + std::to_string(g) + " tensor " +
                     std::to_string(f.tensor) + " b " + std::to_string(b) + " row " + std::to_string(t) + " head " +
                     std::to_string(hl);
          }
  }
  return "";
}

}  // namespace

TEST(TwoLevelPlan, UlyssesGroupsYieldRingShards) {
  for (int R : {1, 2, 4, 6, 8})
    for (int u = 1; u <= R; ++u) {
      if (R % u) continue;
      for (std::int64_t B : {1, 2}) {
        EXPECT_EQ(check_head_shards(R, u, B, 2 * u, u), "");  // GQA 2:1
        EXPECT_EQ(check_head_shards(R, u, B, u, u), "");      // MHA
      }
    }
}

TEST(TwoLevelPlan, RingOverHeadShardsCoversTheMask) {
  for (int R : {1, 2, 4, 6, 8})
    for (int u = 1; u <= R; ++u) {
      if (R % u) continue;
      for (bool causal : {true, false}) {
        const std::int64_t C = 2, S = 2 * R * C;
        std::map<std::pair<std::int64_t, std::int64_t>, int> seen;
        std::set<std::int64_t> work;
        for (int g = 0; g < R; ++g) {
          const ops::TwoLevelPlan p = ops::plan_two_level_attention(S, R, g, u);
          const ops::RingAttnPlan rp = ops::plan_ring_attention(S, p.outer, p.group, causal);
          EXPECT_EQ(rp.chunk, u * C);
          auto token = [&](int group, std::int64_t row) {  // global token of head-shard row `row` of group `group`
            const ops::TwoLevelPlan o = ops::plan_two_level_attention(S, R, group * u, u);
            return o.head_shard_chunk(static_cast<int>(row / C)) * C + row % C;
          };
          std::int64_t pairs = 0;
          for (const ops::RingAttnPlan::Step& s : rp.steps)
            for (std::int64_t i = s.row0; i < s.row0 + s.rows; ++i)
              for (std::int64_t j = 0; j < (s.causal ? std::min(i + 1, s.kv_len) : s.kv_len); ++j) {
                if (p.index == 0) ++seen[{token(p.group, i), token(s.owner, j)}];  // one head slice
                ++pairs;
              }
          work.insert(pairs);
        }
        EXPECT_EQ(work.size(), 1u) << "R " << R << " u " << u << ": unequal work";
        std::int64_t want = 0;
        for (std::int64_t qi = 0; qi < S; ++qi)
          for (std::int64_t ki = 0; ki < S; ++ki)
            if (!causal || ki <= qi) {
              ++want;
              EXPECT_EQ((seen[{qi, ki}]), 1)
                  << "R " << R << " u " << u << " causal " << causal << " pair " << qi << "," << ki;
            }
        EXPECT_EQ(static_cast<std::int64_t>(seen.size()), want) << "R " << R << " u " << u;
      }
    }
}
