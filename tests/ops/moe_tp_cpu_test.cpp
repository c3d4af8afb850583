// CPU tests of ops::moe_tp's host-side logic: the pipelined strategy's plan
// (shard orders, ring-step pairing, which GEMMs run beside a transfer), the
// (source shard, expert) order of the routed entries, a host emulation of
// the pipelined data flow against the direct formula, and the strategy
// table entries and option checks (the layer itself: moe_gpu_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ops/moe_scratch.hpp"
#include "tessera/ops/args.hpp"
#include "tessera/ops/moe.hpp"
#include "tessera/ops/plan.hpp"
#include "tessera/ops/tuner.hpp"
#include "tessera/runtime/error.hpp"
#include "support/test_support.hpp"

namespace tessera::ops {
using tessera::testing::error_message;
using tessera::testing::pointer_text;

namespace {

TEST(MoeTpPlan, OrdersArePermutationsOwnFirstThenOwnLast) {
  for (int R = 1; R <= 8; ++R)
    for (int r = 0; r < R; ++r) {
      const MoeTpPlan p = plan_moe_tp(100, 2, R, r);
      ASSERT_EQ(static_cast<int>(p.gate_up.size()), R);
      ASSERT_EQ(static_cast<int>(p.down.size()), R);
      ASSERT_EQ(static_cast<int>(p.send_to.size()), R - 1);
      ASSERT_EQ(static_cast<int>(p.recv_from.size()), R - 1);
      EXPECT_EQ(p.gate_up.front().shard, r);
      EXPECT_EQ(p.gate_up.front().comm_step, 0);
      EXPECT_EQ(p.down.back().shard, r);
      EXPECT_EQ(p.down.back().comm_step, 0);
      // Part 1's last shard is part 2's first: its down follows its gate/up.
      EXPECT_EQ(p.gate_up.back().shard, p.down.front().shard);
      std::set<int> up, dn;
      for (int j = 0; j < R; ++j) {
        up.insert(p.gate_up[j].shard);
        dn.insert(p.down[j].shard);
        // Part 1: shard r-j arrives at step j, sent by its owner.
        EXPECT_EQ(p.gate_up[j].comm_step, j);
        if (j > 0) EXPECT_EQ(p.recv_from[j - 1], p.gate_up[j].shard);
        EXPECT_EQ(p.gate_up[j].beside_comm, j < R - 1) << "R " << R << " j " << j;
        // Part 2: a remote shard's partial leaves at its step, to its owner.
        if (p.down[j].shard != r) EXPECT_EQ(p.send_to[p.down[j].comm_step - 1], p.down[j].shard);
        EXPECT_EQ(p.down[j].beside_comm, j > 0);
      }
      EXPECT_EQ(static_cast<int>(up.size()), R);
      EXPECT_EQ(static_cast<int>(dn.size()), R);
    }
}

TEST(MoeTpPlan, RingStepsPairUpAcrossRanks) {
  // At step d every rank sends to r+d and receives from r-d: the send of one
  // rank is the receive of its destination at the same step (NCCL groups
  // issued in the same order everywhere cannot deadlock).
  for (int R = 2; R <= 8; ++R) {
    std::vector<MoeTpPlan> plans;
    for (int r = 0; r < R; ++r) plans.push_back(plan_moe_tp(8, 1, R, r));
    for (int r = 0; r < R; ++r)
      for (int d = 1; d < R; ++d) {
        const int to = plans[r].send_to[d - 1];
        EXPECT_EQ(plans[to].recv_from[d - 1], r) << "R " << R << " r " << r << " d " << d;
        // What r sends at RS step d is shard `to`; `to` receives a partial of its own shard.
        const auto it = std::find_if(plans[r].down.begin(), plans[r].down.end(),
                                     [&](const MoeTpStep& s) { return s.comm_step == d; });
        ASSERT_NE(it, plans[r].down.end());
        EXPECT_EQ(it->shard, to);
      }
  }
}

TEST(MoeTpPlan, RowRegionsTileTheExpertBuffers) {
  const MoeTpPlan p = plan_moe_tp(37, 5, 4, 1);
  EXPECT_EQ(p.rows_per_shard(), 37 * 5);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(p.row_base(s), s * 37 * 5);
  EXPECT_EQ(p.row_base(3) + p.rows_per_shard(), 4 * 37 * 5);
  EXPECT_EQ(p.rs_slab(1), 0);
  EXPECT_EQ(p.rs_slab(3), 2);
  const MoeTpPlan empty = plan_moe_tp(0, 2, 2, 0);
  EXPECT_EQ(empty.rows_per_shard(), 0);
  EXPECT_THROW(plan_moe_tp(8, 0, 2, 0), tessera::Error);
  EXPECT_THROW(plan_moe_tp(8, 2, 2, 2), tessera::Error);
  EXPECT_THROW(plan_moe_tp(-1, 2, 2, 0), tessera::Error);
}

TEST(MoeShardOrder, SmallExampleByHand) {
  // R = 2, T_l = 2, k = 2, E = 3. Entries (global): shard 0 = 0..3, shard 1 = 4..7.
  const std::vector<std::int32_t> ids{2, 0, 1, 0, /* shard 1 */ 1, 2, 7, 1};  // 7: invalid, dropped
  const MoeShardOrder o = moe_shard_expert_order(ids, 2, 2, 3, 2);
  // Shard 0: expert 0 = entries 1, 3; expert 1 = 2; expert 2 = 0.
  // Shard 1 (rows from 4): expert 1 = 4, 7; expert 2 = 5; the dropped entry leaves row 7 empty.
  EXPECT_EQ(o.sorted_entry, (std::vector<std::int32_t>{1, 3, 2, 0, 4, 7, 5, -1}));
  EXPECT_EQ(o.entry_row, (std::vector<std::int32_t>{3, 0, 2, 1, 4, 6, -1, 5}));
  EXPECT_EQ(o.group_rows, (std::vector<std::int32_t>{2, 1, 1, 0, 2, 1}));
  EXPECT_THROW(moe_shard_expert_order(ids, 3, 2, 3, 2), tessera::Error);  // wrong size
}

TEST(MoeShardOrder, RandomRoutingIsShardThenExpertThenEntry) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const int R = 1 + static_cast<int>(rng() % 4), E = 1 + static_cast<int>(rng() % 9);
    const int k = 1 + static_cast<int>(rng() % 3);
    const std::int64_t Tl = static_cast<std::int64_t>(rng() % 17);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(R * Tl * k));
    for (auto& v : ids) v = static_cast<std::int32_t>(rng() % (E + 1)) - (rng() % 13 == 0 ? 5 : 0);  // some invalid
    const MoeShardOrder o = moe_shard_expert_order(ids, Tl, R, E, k);
    const std::int64_t per = Tl * k;
    for (int s = 0; s < R; ++s) {
      std::int64_t valid = 0;
      for (int e = 0; e < E; ++e) valid += o.group_rows[static_cast<std::size_t>(s * E + e)];
      std::int64_t prev_key = -1;
      for (std::int64_t p = s * per; p < (s + 1) * per; ++p) {
        const std::int32_t i = o.sorted_entry[static_cast<std::size_t>(p)];
        if (p - s * per >= valid) {
          EXPECT_EQ(i, -1);
          continue;
        }
        ASSERT_GE(i, s * per);  // only the shard's own entries
        ASSERT_LT(i, (s + 1) * per);
        const std::int32_t e = ids[static_cast<std::size_t>(i)];
        ASSERT_TRUE(e >= 0 && e < E);
        const std::int64_t key = static_cast<std::int64_t>(e) * R * per + i;  // (expert, entry) order
        EXPECT_GT(key, prev_key);
        prev_key = key;
        EXPECT_EQ(o.entry_row[static_cast<std::size_t>(i)], p);
      }
    }
    for (std::size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= E) EXPECT_EQ(o.entry_row[i], -1);
  }
}

// The pipelined data flow on the host: each rank holds a slice of every
// expert (scalar "weights" a[r][e]: expert e's contribution from rank r's
// slice is a[r][e] * x), the partials of remote shards travel along the
// plan's RS steps and the own shard adds what it received. The result
// must equal the direct sum over ranks of every token's routed experts.
TEST(MoeTpPlan, HostEmulationOfThePipelinedLayerMatchesTheDirectSum) {
  std::mt19937 rng(11);
  for (int R = 1; R <= 6; ++R) {
    const int E = 5, k = 2;
    const std::int64_t Tl = 7;
    std::vector<double> x(static_cast<std::size_t>(R * Tl));
    for (auto& v : x) v = static_cast<double>(rng() % 100) / 10.0;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(R * Tl * k));
    for (auto& v : ids) v = static_cast<std::int32_t>(rng() % E);
    std::vector<double> w(ids.size());
    for (auto& v : w) v = static_cast<double>(1 + rng() % 9) / 10.0;
    std::vector<std::vector<double>> a(static_cast<std::size_t>(R), std::vector<double>(E));
    for (auto& row : a)
      for (auto& v : row) v = static_cast<double>(1 + rng() % 7);
    const MoeShardOrder order = moe_shard_expert_order(ids, Tl, R, E, k);
    // Per rank: the expert outputs of every sorted row (its slice), then the
    // partial of every shard through the combine.
    std::vector<std::vector<std::vector<double>>> partial(static_cast<std::size_t>(R));
    for (int r = 0; r < R; ++r) {
      const MoeTpPlan p = plan_moe_tp(Tl, k, R, r);
      std::vector<double> y(order.sorted_entry.size(), 0.0);
      for (const MoeTpStep& st : p.gate_up)  // every shard's rows, in the plan's order
        for (std::int64_t row = p.row_base(st.shard); row < p.row_base(st.shard) + p.rows_per_shard(); ++row) {
          const std::int32_t i = order.sorted_entry[static_cast<std::size_t>(row)];
          if (i >= 0) y[static_cast<std::size_t>(row)] = a[r][ids[i]] * x[i / k];
        }
      partial[r].assign(static_cast<std::size_t>(R), std::vector<double>(static_cast<std::size_t>(Tl), 0.0));
      for (const MoeTpStep& st : p.down)
        for (std::int64_t t = 0; t < Tl; ++t)
          for (int s = 0; s < k; ++s) {
            const std::int64_t i = (st.shard * Tl + t) * k + s;
            const std::int32_t row = order.entry_row[static_cast<std::size_t>(i)];
            if (row >= 0) partial[r][st.shard][t] += w[i] * y[row];
          }
    }
    // RS along the plan: at step d rank r sends its partial of shard
    // send_to[d-1] there; the owner adds what it received to its own.
    std::vector<std::vector<double>> out(static_cast<std::size_t>(R));
    for (int r = 0; r < R; ++r) out[r] = partial[r][r];
    for (int d = 1; d < R; ++d)
      for (int r = 0; r < R; ++r) {
        const MoeTpPlan p = plan_moe_tp(Tl, k, R, r);
        const int to = p.send_to[d - 1];
        const MoeTpPlan q = plan_moe_tp(Tl, k, R, to);
        ASSERT_EQ(q.recv_from[d - 1], r);
        for (std::int64_t t = 0; t < Tl; ++t) out[to][t] += partial[r][to][t];
      }
    for (int r = 0; r < R; ++r)
      for (std::int64_t t = 0; t < Tl; ++t) {
        double want = 0;
        const std::int64_t tg = r * Tl + t;
        for (int s = 0; s < k; ++s)
          for (int q = 0; q < R; ++q) want += w[tg * k + s] * a[q][ids[tg * k + s]] * x[tg];
        EXPECT_NEAR(out[r][t], want, 1e-9 * (1 + std::abs(want))) << "R " << R << " rank " << r << " token " << t;
      }
  }
}

TEST(MoeTpStrategies, TableEntriesAndOptions) {
  EXPECT_EQ(parse_strategy("pipelined"), Strategy::pipelined);
  EXPECT_EQ(strategy_name(Strategy::pipelined), "pipelined");
  EXPECT_EQ(static_cast<int>(Strategy::pipelined), 7);
  EXPECT_EQ(strategy_table().size(), kStrategyCount);
  EXPECT_EQ(find_strategy(static_cast<int>(kStrategyCount)), nullptr);
  for (Strategy s : {Strategy::automatic, Strategy::sequential, Strategy::pipelined})
    EXPECT_TRUE(accepts(OpKind::moe_tp, s)) << strategy_name(s);
  for (Strategy s : {Strategy::decomposition, Strategy::fused_ce, Strategy::fused_sm, Strategy::ring})
    EXPECT_FALSE(accepts(OpKind::moe_tp, s)) << strategy_name(s);
  for (OpKind op : {OpKind::ag_gemm, OpKind::gemm_rs, OpKind::gemm_ar, OpKind::sp_attention})
    EXPECT_FALSE(accepts(op, Strategy::pipelined));
  EXPECT_EQ(moe_tp_candidates(1), (std::vector<Strategy>{Strategy::sequential}));
  EXPECT_EQ(moe_tp_candidates(2), (std::vector<Strategy>{Strategy::sequential, Strategy::pipelined}));
  // The tuner's cache entries can hold the choice.
  const auto j = choice_to_json(Strategy::pipelined, {{Strategy::sequential, 1.0}, {Strategy::pipelined, 0.8}}, {1});
  EXPECT_EQ(choice_from_json(j, moe_tp_candidates(2)), Strategy::pipelined);
  EXPECT_EQ(choice_from_json(j, moe_tp_candidates(1)), std::nullopt);

  MoeTpOptions o;
  EXPECT_NO_THROW(validate(o, 132));
  o.strategy = Strategy::fused_ce;
  EXPECT_THROW(validate(o, 132), tessera::Error);
  o.strategy = Strategy::pipelined;
  o.comm_ctas = 0;
  EXPECT_THROW(validate(o, 132), tessera::Error);
  o.comm_ctas = 65;
  EXPECT_THROW(validate(o, 132), tessera::Error);
  o.comm_ctas = 16;
  EXPECT_THROW(validate(o, 16), tessera::Error);  // no SM left for the GEMM
  EXPECT_NO_THROW(validate(o, 17));
}

TEST(MoeTpStrategies, ValidateRejectsBadShapes) {
  MoeTpArgs a;
  alignas(16) int buf[64] = {};
  a.x_shard = a.w_gate_up = a.w_down = a.out_shard = buf;
  a.expert_ids = buf;
  a.weights = reinterpret_cast<const float*>(buf);
  a.tokens_local = 16;
  a.hidden = 64;
  a.inter_local = 32;
  a.experts = 4;
  a.topk = 2;
  EXPECT_NO_THROW(validate(a, 2));
  a.topk = 5;  // top-k > E
  EXPECT_THROW(validate(a, 2), tessera::Error);
  a.topk = 2;
  a.experts = 1025;
  EXPECT_THROW(validate(a, 2), tessera::Error);
}

// Issue 22's bad input, each named before any launch: top-k > E, experts
// outside the grouped GEMM's table, negative or overflowing sizes, dtype,
// null and misaligned pointers; then the options (strategy, comm_ctas).
// Expert ids outside [0, E) are device data: check_status() reports them
// after the call (moe_gpu_test.cpp); mismatched expert counts across ranks
// are the cross-rank check's (moe_gpu_test.cpp, two GPUs).
TEST(MoeTpStrategies, ValidateNamesEachBadArgument) {
  alignas(16) static int buf[64] = {};
  const auto good = [] {
    MoeTpArgs a;
    a.x_shard = a.w_gate_up = a.w_down = a.out_shard = buf;
    a.expert_ids = buf;
    a.weights = reinterpret_cast<const float*>(buf);
    a.tokens_local = 16;
    a.hidden = 64;
    a.inter_local = 32;
    a.experts = 4;
    a.topk = 2;
    return a;
  };
  const void* misaligned = reinterpret_cast<const char*>(buf) + 4;
  const std::pair<std::function<void(MoeTpArgs&, int&)>, std::string> bad[] = {
      {[](MoeTpArgs& a, int&) { a.topk = 5; }, "topk = 5 out of range [1, min(16, experts = 4)]"},
      {[](MoeTpArgs& a, int&) { a.topk = 0; }, "topk = 0 out of range"},
      {[](MoeTpArgs& a, int&) {
         a.experts = 64;
         a.topk = 17;
       },
       "topk = 17 out of range [1, min(16, experts = 64)]"},
      {[](MoeTpArgs& a, int&) { a.experts = 0; }, "experts = 0 out of range [1, 1024]"},
      {[](MoeTpArgs& a, int&) { a.experts = 1025; }, "experts = 1025 out of range [1, 1024]"},
      {[](MoeTpArgs& a, int&) { a.tokens_local = -1; }, "tokens_local = -1 out of range [0, 2^31)"},
      {[](MoeTpArgs& a, int&) { a.tokens_local = std::int64_t{1} << 40; }, "tokens_local = 1099511627776 out of range"},
      {[](MoeTpArgs& a, int&) { a.tokens_local = std::int64_t{1} << 29; },
       "tokens (1073741824) * topk (2) must stay below 2^31"},
      {[](MoeTpArgs& a, int&) { a.hidden = 60; }, "hidden = 60 must be a positive multiple of 8 below 2^31"},
      {[](MoeTpArgs& a, int&) { a.hidden = -64; }, "hidden = -64 must be a positive multiple of 8"},
      {[](MoeTpArgs& a, int&) { a.inter_local = 0; }, "inter_local = 0 must be a positive multiple of 8"},
      {[](MoeTpArgs& a, int&) { a.inter_local = std::int64_t{1} << 31; }, "inter_local = 2147483648 must be"},
      {[](MoeTpArgs& a, int&) { a.dtype = DType::f16; }, "dtype f16 not supported (bf16)"},
      {[](MoeTpArgs&, int& world) { world = 0; }, "world = 0 must be >= 1"},
      {[](MoeTpArgs& a, int&) { a.x_shard = nullptr; }, "x_shard is null"},
      {[](MoeTpArgs& a, int&) { a.expert_ids = nullptr; }, "expert_ids is null"},
      {[](MoeTpArgs& a, int&) { a.w_down = nullptr; }, "w_down is null"},
      {[&](MoeTpArgs& a, int&) { a.w_gate_up = misaligned; },
       "w_gate_up = " + pointer_text(misaligned) + " is not 16-byte aligned"},
      {[&](MoeTpArgs& a, int&) { a.out_shard = const_cast<void*>(misaligned); },
       "out_shard = " + pointer_text(misaligned) + " is not 16-byte aligned"},
  };
  EXPECT_NO_THROW(validate(good(), 2));
  for (const auto& [edit, want] : bad) {
    MoeTpArgs a = good();
    int world = 2;
    edit(a, world);
    const std::string e = error_message([&] { validate(a, world); });
    EXPECT_NE(e.find("moe_tp: " + want), std::string::npos) << "want '" << want << "', got: '" << e << "'";
  }
  const auto option_error = [](const MoeTpOptions& o, int sms) { return error_message([&] { validate(o, sms); }); };
  MoeTpOptions o;
  o.strategy = Strategy::ring;
  EXPECT_NE(option_error(o, 132).find("moe_tp: strategy ring is not a TP MoE strategy"), std::string::npos);
  o = {};
  o.comm_ctas = -3;
  EXPECT_NE(option_error(o, 132).find("moe_tp: comm_ctas = -3 out of range [1, min(64, SMs - 1 = 131)]"),
            std::string::npos);
}

// The shared pointer and transport checks (moe_scratch.hpp) name the
// argument: each matrix 16-byte aligned, the routing 4-byte, and only the
// transports MoeTransport defines.
TEST(MoeTpStrategies, SharedPointerAndTransportChecksNameTheArgument) {
  const auto* m = reinterpret_cast<const void*>(0x10000);
  const auto* ids = reinterpret_cast<const std::int32_t*>(0x20000);
  const auto* w = reinterpret_cast<const float*>(0x30000);
  const auto error = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const tessera::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const auto check = [&](const void* x, const std::int32_t* i, const float* wt, const void* gu, const void* dn,
                         const void* out) {
    return error([=] { detail::validate_moe_pointers("moe_tp", x, i, wt, gu, dn, out); });
  };
  EXPECT_EQ(check(m, ids, w, m, m, m), "");
  const char* c = reinterpret_cast<const char*>(m);
  EXPECT_NE(check(nullptr, ids, w, m, m, m).find("x_shard is null"), std::string::npos);
  EXPECT_NE(check(c + 8, ids, w, m, m, m).find("moe_tp: x_shard = 0x10008 is not 16-byte aligned"), std::string::npos);
  EXPECT_NE(check(m, ids, w, c + 4, m, m).find("moe_tp: w_gate_up = 0x10004 is not 16-byte aligned"),
            std::string::npos);
  EXPECT_NE(check(m, ids, w, m, c + 2, m).find("moe_tp: w_down = 0x10002 is not 16-byte aligned"), std::string::npos);
  EXPECT_NE(check(m, ids, w, m, m, nullptr).find("moe_tp: out_shard is null"), std::string::npos);
  EXPECT_NE(check(m, nullptr, w, m, m, m).find("expert_ids is null"), std::string::npos);
  EXPECT_NE(check(m, reinterpret_cast<const std::int32_t*>(0x20002), w, m, m, m)
                .find("moe_tp: expert_ids = 0x20002 is not 4-byte aligned"),
            std::string::npos);
  EXPECT_NE(check(m, ids, reinterpret_cast<const float*>(0x30001), m, m, m)
                .find("moe_tp: weights = 0x30001 is not 4-byte aligned"),
            std::string::npos);
  for (MoeTransport t : {MoeTransport::automatic, MoeTransport::nccl, MoeTransport::copy_engine})
    EXPECT_EQ(error([=] { detail::validate_moe_transport("moe_ep", t); }), "");
  EXPECT_NE(error([] {
              detail::validate_moe_transport("moe_ep", static_cast<MoeTransport>(5));
            }).find("moe_ep: transport code 5 (automatic 0, nccl 1 or copy_engine 2)"),
            std::string::npos);
}

TEST(MoeTpPlan, PartTwoColumnChunks) {
  // Automatic: the most of {4, 2, 1} that leave >= 1024 columns, a multiple of 64.
  EXPECT_EQ(moe_rs_chunks(4096, 0, false), 4);
  EXPECT_EQ(moe_rs_chunks(8192, 0, false), 4);
  EXPECT_EQ(moe_rs_chunks(2048, 0, false), 2);
  EXPECT_EQ(moe_rs_chunks(3072, 0, false), 2);  // 4 x 768: below 1024
  EXPECT_EQ(moe_rs_chunks(2176, 0, false), 2);  // 2 x 1088
  EXPECT_EQ(moe_rs_chunks(2112, 0, false), 1);  // 2 x 1056: not a multiple of 64
  EXPECT_EQ(moe_rs_chunks(1024, 0, false), 1);
  EXPECT_EQ(moe_rs_chunks(256, 0, false), 1);
  for (std::int64_t h : {64, 512, 1000, 2048, 4096, 5120, 7168}) {
    const int c = moe_rs_chunks(h, 0, false);
    EXPECT_EQ(h % c, 0) << h;
    EXPECT_EQ((h / c) % 8, 0) << h;
  }
  // Over the copy engine: one chunk unless asked.
  EXPECT_EQ(moe_rs_chunks(8192, 0, true), 1);
  EXPECT_EQ(moe_rs_chunks(8192, 4, true), 4);
  // Explicit: any count that divides hidden into multiples of 8 columns.
  EXPECT_EQ(moe_rs_chunks(192, 4, false), 4);
  EXPECT_EQ(moe_rs_chunks(2048, 1, false), 1);
  EXPECT_THROW(moe_rs_chunks(192, 5, false), tessera::Error);  // does not divide
  EXPECT_THROW(moe_rs_chunks(200, 2, false), tessera::Error);  // 100 columns: not a multiple of 8
  EXPECT_THROW(moe_rs_chunks(2048, -1, false), tessera::Error);
  EXPECT_EQ(moe_rs_chunks(2048, kMoeMaxRsChunks, true), kMoeMaxRsChunks);
  EXPECT_THROW(moe_rs_chunks(4096, 2 * kMoeMaxRsChunks, true), tessera::Error);  // more chunks than flags
}

}  // namespace
}  // namespace tessera::ops
