// CPU tests of the TP-MLP operators: validation, plans, strategy choice, cache.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "ops/strategy_registry.hpp"
#include "ops/tuning.hpp"
#include "tessera/ops/args.hpp"
#include "tessera/ops/plan.hpp"
#include "tessera/ops/ring_attention.hpp"
#include "tessera/ops/sp_attention.hpp"
#include "tessera/ops/ulysses_attention.hpp"
#include "tessera/ops/tp_mlp.hpp"
#include "tessera/ops/two_level_attention.hpp"
#include "tessera/ops/tuner.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/tune/cache.hpp"
#include "support/test_support.hpp"

using namespace tessera;
using namespace tessera::ops;

using tessera::testing::error_message;

namespace {

// Fake, aligned "device" addresses: validation never dereferences them.
void* fake(std::uintptr_t v) { return reinterpret_cast<void*>(v); }

AgGemmArgs good_ag(std::int64_t m, int rank, int world) {
  AgGemmArgs a;
  a.a = fake(0x1000);
  a.b = fake(0x2000);
  a.d = fake(0x3000);
  a.m = m;
  a.m_local = shard_rows(m, world).rows(m, rank);
  a.n = 1024;
  a.k = 512;
  return a;
}

/// A GEMM+RS call validate() accepts at R = 2 (M 8000, rank 1's 4000 rows).
GemmRsArgs good_rs() {
  GemmRsArgs r;
  r.a = fake(0x1000);
  r.b = fake(0x2000);
  r.d = fake(0x3000);
  r.m = 8000;
  r.m_local = 4000;
  r.n = 4096;
  r.k = 5504;
  return r;
}

}  // namespace

TEST(OpsValidate, AcceptsAlignedAndRaggedShapes) {
  for (int world : {1, 2, 4, 8})
    for (std::int64_t m : {8192, 8000, 1000, 129})
      for (int r = 0; r < world; ++r) {
        if (shard_rows(m, world).rows(m, world - 1) < 1) continue;
        EXPECT_NO_THROW(validate(good_ag(m, r, world), r, world)) << m << " " << r << "/" << world;
      }
}

TEST(OpsValidate, RejectsBadInputWithClearMessages) {
  auto a = good_ag(8192, 0, 2);
  auto bad = a;
  bad.dtype = DType::f32;
  EXPECT_NE(error_message([&] { validate(bad, 0, 2); }).find("dtype f32"), std::string::npos);
  bad = a;
  bad.a = fake(0x1008);
  EXPECT_NE(error_message([&] { validate(bad, 0, 2); }).find("16-byte aligned"), std::string::npos);
  bad = a;
  bad.b = nullptr;
  EXPECT_NE(error_message([&] { validate(bad, 0, 2); }).find("B is null"), std::string::npos);
  bad = a;
  bad.k = 500;
  EXPECT_NE(error_message([&] { validate(bad, 0, 2); }).find("multiple of 8"), std::string::npos);
  bad = a;
  bad.m_local = 4000;
  EXPECT_NE(error_message([&] { validate(bad, 0, 2); }).find("m_local = 4000"), std::string::npos);
  bad = a;
  bad.lda = 516;
  EXPECT_NE(error_message([&] { validate(bad, 0, 2); }).find("lda"), std::string::npos);
  bad = a;
  bad.swiglu = true;
  bad.n = 1023;
  EXPECT_NE(error_message([&] { validate(bad, 0, 2); }).find("even"), std::string::npos);
  EXPECT_NE(error_message([&] { validate(a, 0, 17); }).find("world size 17"), std::string::npos);
  EXPECT_NE(error_message([&] { validate(a, 2, 2); }).find("rank 2"), std::string::npos);
  // M = 5 over 4 ranks: shards of 2 leave rank 3 empty.
  auto tiny = good_ag(5, 0, 4);
  EXPECT_NE(error_message([&] { validate(tiny, 0, 4); }).find("without rows"), std::string::npos);
}

TEST(OpsValidate, GemmRsAndMlp) {
  GemmRsArgs r = good_rs();
  EXPECT_NO_THROW(validate(r, 1, 2));
  r.ldd = 4100;
  EXPECT_THROW(validate(r, 1, 2), tessera::Error);
  MlpArgs m;
  m.x = fake(0x1000);
  m.w_gate_up = fake(0x2000);
  m.w_down = fake(0x3000);
  m.out = fake(0x4000);
  m.m = 8192;
  m.m_local = 4096;
  m.h = 4096;
  m.i_local = 5504;
  EXPECT_NO_THROW(validate(m, 0, 2));
  m.i_local = 5500;
  EXPECT_THROW(validate(m, 0, 2), tessera::Error);
}

// B as [K, N] (b_kn): ldb and the extent follow the layout, N keeps 16-byte
// rows, and the SiLU*up epilogue (gate/up interleaved by rows of [N, K]) is refused.
TEST(OpsValidate, BAsKN) {
  auto a = good_ag(8192, 0, 2);  // N = 1024, K = 512
  a.b_kn = true;
  EXPECT_NO_THROW(validate(a, 0, 2));
  a.ldb = 1024;  // >= N: valid for [K, N] although larger than K
  EXPECT_NO_THROW(validate(a, 0, 2));
  auto bad = a;
  bad.ldb = 512;  // the row length of [N, K], too short for [K, N]
  std::string msg = error_message([&] { validate(bad, 0, 2); });
  EXPECT_NE(msg.find("ldb = 512 is smaller than the row length 1024"), std::string::npos) << msg;
  bad = a;
  bad.ldb = 0;
  bad.n = 1020;  // packed [K, N] rows of 2040 bytes
  msg = error_message([&] { validate(bad, 0, 2); });
  EXPECT_NE(msg.find("N = 1020 must be a multiple of 8 with b_kn"), std::string::npos) << msg;
  bad.b_kn = false;  // [N, K] takes any N (with a padded D)
  bad.ldd = 1024;
  EXPECT_NO_THROW(validate(bad, 0, 2));
  bad = a;
  bad.swiglu = true;
  msg = error_message([&] { validate(bad, 0, 2); });
  EXPECT_NE(msg.find("ag_gemm: swiglu needs B as [N, K]"), std::string::npos) << msg;
  // B's bytes are counted as K rows of ldb.
  bad = a;
  bad.k = std::int64_t{1} << 24;
  bad.ldb = std::int64_t{1} << 30;  // 2^24 rows x 2^30 x 2 bytes = 2^55
  bad.lda = 0;
  msg = error_message([&] { validate(bad, 0, 2); });
  EXPECT_NE(msg.find("B of 16777216 rows"), std::string::npos) << msg;

  GemmRsArgs r = good_rs();
  r.b_kn = true;
  EXPECT_NO_THROW(validate(r, 1, 2));
  r.n = 8192;
  r.k = 4096;
  r.ldb = 4096;  // >= K (the [N, K] row) but < N: too short for [K, N]
  EXPECT_NE(error_message([&] { validate(r, 1, 2); }).find("gemm_rs: ldb = 4096 is smaller than the row length 8192"),
            std::string::npos);
  r.b_kn = false;
  EXPECT_NO_THROW(validate(r, 1, 2));
  r.b_kn = true;
  r.ldb = 0;
  r.n = 4092;
  r.ldd = 4096;
  msg = error_message([&] { validate(r, 1, 2); });
  EXPECT_NE(msg.find("gemm_rs: N = 4092 must be a multiple of 8 with b_kn"), std::string::npos) << msg;
}

TEST(OpsValidate, GemmAr) {
  GemmArArgs a;
  a.a = fake(0x1000);
  a.b = fake(0x2000);
  a.d = fake(0x3000);
  a.m = 8192;
  a.n = 4096;
  a.k = 5504;
  EXPECT_NO_THROW(validate(a, 1, 2));
  GemmArArgs bad = a;
  bad.ldd = 4000;  // shorter than a row
  EXPECT_THROW(validate(bad, 1, 2), tessera::Error);
  bad = a;
  bad.d = fake(0x3004);  // not 16-byte aligned
  EXPECT_THROW(validate(bad, 0, 2), tessera::Error);
  bad = a;
  bad.m = 1;  // rank 1 would own no rows
  try {
    validate(bad, 0, 2);
    ADD_FAILURE() << "M = 1 over 2 ranks accepted";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemm_ar"), std::string::npos) << e.what();
  }
  // Ragged M is valid (the sequential strategy runs it).
  bad = a;
  bad.m = 1000;
  EXPECT_NO_THROW(validate(bad, 1, 2));
  // Candidates: fused_ce only with tile-row shards and peers to reduce with.
  EXPECT_EQ(gemm_ar_candidates(2, true), (std::vector<Strategy>{Strategy::sequential, Strategy::fused_ce}));
  EXPECT_EQ(gemm_ar_candidates(2, false), std::vector<Strategy>{Strategy::sequential});
  EXPECT_EQ(gemm_ar_candidates(1, true), std::vector<Strategy>{Strategy::sequential});
}

TEST(OpsPlan, SpAttentionWorkspaceBytes) {
  SpAttnArgs a;
  a.batch = 2;
  a.seq = 4096;
  a.heads_q = 8;
  a.heads_kv = 2;
  a.head_dim = 128;
  const std::size_t kv = 2 * 4096 * 2 * 128 * 2;  // one gathered tensor, bf16
  EXPECT_EQ(sp_attention_workspace_bytes(a, 2, SpStrategy::fused_ce), 2 * kv);
  EXPECT_EQ(sp_attention_workspace_bytes(a, 2, SpStrategy::sequential), 4 * kv);
  EXPECT_EQ(sp_attention_workspace_bytes(a, 4, SpStrategy::ring), ring_attention_workspace_bytes(a, 4));
  EXPECT_EQ(sp_attention_workspace_bytes(a, 2, SpStrategy::ulysses), ulysses_attention_workspace_bytes(a, 2, 1));
  EXPECT_EQ(sp_attention_workspace_bytes(a, 4, SpStrategy::two_level, 2), two_level_attention_workspace_bytes(a, 4, 2));
  // Ring's workspace shrinks with the world; the gathered KV does not (MHA:
  // with GQA, ring's float32 accumulator over every query head dominates).
  a.heads_kv = a.heads_q;
  EXPECT_LT(sp_attention_workspace_bytes(a, 8, SpStrategy::ring),
            sp_attention_workspace_bytes(a, 8, SpStrategy::fused_ce));
  EXPECT_THROW(sp_attention_workspace_bytes(a, 2, SpStrategy::automatic), tessera::Error);
  // A code sp_attention does not take (decomposition) is refused, and named as unknown.
  EXPECT_THROW(sp_attention_workspace_bytes(a, 2, static_cast<SpStrategy>(2)), tessera::Error);
  EXPECT_EQ(sp_strategy_name(static_cast<SpStrategy>(2)), "unknown");
  EXPECT_EQ(sp_strategy_name(SpStrategy::two_level), "two_level");
}

TEST(OpsPlan, ChooseStrategyAgainstAnotherBaseline) {
  // Without sequential (a workspace limit left it out) the first candidate is the baseline.
  const std::map<Strategy, double> t{{Strategy::fused_ce, 10.0}, {Strategy::ring, 9.95}};
  EXPECT_EQ(choose_strategy(t, 0.01, Strategy::fused_ce), Strategy::fused_ce);  // within the margin
  EXPECT_EQ(choose_strategy(t, 0.001, Strategy::fused_ce), Strategy::ring);
  EXPECT_THROW(choose_strategy(t), tessera::Error);  // no sequential time
}

TEST(OpsPlan, SpAttentionCandidates) {
  using V = std::vector<Strategy>;
  EXPECT_EQ(sp_attention_candidates(1, true, true), V{Strategy::sequential});
  EXPECT_EQ(sp_attention_candidates(2, false, true), V{Strategy::sequential});
  EXPECT_EQ(sp_attention_candidates(2, true, true),
            (V{Strategy::sequential, Strategy::fused_ce, Strategy::ring, Strategy::ulysses}));
  EXPECT_EQ(sp_attention_candidates(4, true, false), (V{Strategy::sequential, Strategy::fused_ce, Strategy::ring}));
  for (Strategy s : sp_attention_candidates(4, true, true)) EXPECT_TRUE(accepts(OpKind::sp_attention, s));
}

TEST(OpsPlan, AllGatherOrderMatchesArrival) {
  for (int world : {2, 4, 8})
    for (int r = 0; r < world; ++r) {
      const AgPlan p = plan_ag(8192, world, r, 4, 128);
      ASSERT_EQ(static_cast<int>(p.push_to.size()), world - 1);
      ASSERT_EQ(p.recv_from.front(), r);
      // Step j: I push to (r - j); the receiver (r - j) reads source (r - j) + j = r at its step j.
      for (int j = 1; j < world; ++j) {
        const AgPlan q = plan_ag(8192, world, p.push_to[j - 1], 4, 128);
        EXPECT_EQ(q.recv_from[j], r);
      }
      EXPECT_EQ(p.rotate_m, static_cast<int>(r * (8192 / world) / 128));
      EXPECT_EQ(p.map.channel_of_row(p.shards.lo(r)), r * 4);
    }
}

TEST(OpsPlan, RaggedChannelsCoverEveryRowOnce) {
  for (std::int64_t m : {8000, 1000, 130, 8192})
    for (int world : {2, 3, 8}) {
      if (shard_rows(m, world).rows(m, world - 1) < 1) continue;
      const AgPlan p = plan_ag(m, world, 0, 3, 128);
      std::int64_t covered = 0;
      for (int ch = 0; ch < p.map.num_channels(); ++ch) covered += p.map.channel_rows(ch).size();
      EXPECT_EQ(covered, m);
      for (std::int64_t row : {std::int64_t{0}, m / 2, m - 1}) {
        const int ch = p.map.channel_of_row(row);
        const auto rr = p.map.channel_rows(ch);
        EXPECT_TRUE(rr.lo <= row && row < rr.hi) << m << " " << world << " row " << row;
      }
    }
  EXPECT_THROW(plan_ag(8192, 2, 0, 0, 128), tessera::Error);
  EXPECT_THROW(plan_ag(8192, 2, 0, kMaxChannels + 1, 128), tessera::Error);
}

TEST(OpsPlan, ReduceScatterOwnersAndOrder) {
  const RsPlan p = plan_rs(8000, 4100, 2, 1, 128, 256);
  EXPECT_EQ(p.shards.per_rank, 4000);
  EXPECT_EQ(p.ld_recv, 4104);
  EXPECT_EQ(p.tiles_m, 63);
  EXPECT_EQ(p.tiles_n, 17);
  EXPECT_EQ(p.expected_per_tile_row(), 34u);
  // Tile row 31 = rows 3968..4095 straddles owners 0 and 1.
  EXPECT_EQ(p.first_owner(31), 0);
  EXPECT_EQ(p.last_owner(31, 8000), 1);
  EXPECT_EQ(p.own_tile_lo, 31);
  EXPECT_EQ(p.own_tile_hi, 63);
  // Rank 1 starts with shard 0 (remote), rank 0 with shard 1.
  EXPECT_EQ(p.rotate_m, 0);
  EXPECT_EQ(plan_rs(8000, 4100, 2, 0, 128, 256).rotate_m, 4000 / 128);
}

TEST(OpsPlan, OwnerEpilogueNeedsShardsOnTileRows) {
  EXPECT_FALSE(plan_rs(8000, 4100, 2, 1, 128, 256).shards_on_tile_rows());  // 4000 rows per shard
  EXPECT_TRUE(plan_rs(8192, 4096, 2, 1, 128, 256).shards_on_tile_rows());
  EXPECT_TRUE(plan_rs(1024, 700, 4, 3, 128, 256).shards_on_tile_rows());    // 256 per shard
  EXPECT_FALSE(plan_rs(1024, 700, 16, 3, 128, 256).shards_on_tile_rows());  // 64 per shard
  EXPECT_TRUE(plan_rs(1000, 700, 1, 0, 128, 256).shards_on_tile_rows());    // one rank: no peers
  // Raster bands never mix remote and own tile rows.
  EXPECT_EQ(plan_rs(8192, 4096, 2, 0, 128, 256).owner_raster_group(), 8);
  EXPECT_EQ(plan_rs(1024, 700, 2, 0, 128, 256).owner_raster_group(), 4);
  EXPECT_EQ(plan_rs(1024, 700, 4, 1, 128, 256).owner_raster_group(), 2);
  const RsPlan short_last = plan_rs(1150, 512, 3, 0, 128, 256);  // shards 384, 384, 382
  EXPECT_TRUE(short_last.shards_on_tile_rows());
  EXPECT_EQ(short_last.owner_raster_group(), 1);
  EXPECT_EQ(rs_reduce_name(RsReduce::epilogue), "epilogue");
  EXPECT_EQ(rs_reduce_name(RsReduce::kernel), "kernel");
}

TEST(OpsTuner, NeverKeepsAChoiceSlowerThanSequential) {
  using S = Strategy;
  EXPECT_EQ(choose_strategy({{S::sequential, 1.0}, {S::fused_ce, 0.8}, {S::decomposition, 0.9}}), S::fused_ce);
  EXPECT_EQ(choose_strategy({{S::sequential, 1.0}, {S::fused_ce, 1.2}}), S::sequential);
  EXPECT_EQ(choose_strategy({{S::sequential, 1.0}, {S::fused_ce, 0.995}}), S::sequential);  // within margin
  EXPECT_EQ(choose_strategy({{S::sequential, 1.0}}), S::sequential);
  EXPECT_THROW(choose_strategy({{S::fused_ce, 1.0}}), tessera::Error);
  EXPECT_THROW(choose_strategy({{S::sequential, 1.0}, {S::fused_ce, std::nan("")}}), tessera::Error);
  EXPECT_THROW(choose_strategy({{S::sequential, 0.0}}), tessera::Error);
}

TEST(OpsTuner, PairedEvidenceCountsRepetitionWins) {
  using S = Strategy;
  // Drift shared by both calls of a repetition cancels in the ratio.
  const std::map<S, std::vector<double>> t{{S::sequential, {1.0, 2.0, 4.0, 1.0}},
                                           {S::decomposition, {0.9, 1.8, 3.6, 1.1}},
                                           {S::fused_ce, {1.0, 2.0, 4.0, 1.0}}};
  const auto e = paired_evidence(t);
  ASSERT_EQ(e.size(), 2u);                                       // the baseline has none
  EXPECT_NEAR(e.at(S::decomposition).median_ratio, 0.9, 1e-12);  // even count: mean of the middle two
  EXPECT_DOUBLE_EQ(e.at(S::decomposition).win_fraction, 0.75);
  EXPECT_DOUBLE_EQ(e.at(S::fused_ce).median_ratio, 1.0);
  EXPECT_DOUBLE_EQ(e.at(S::fused_ce).win_fraction, 0.0);                  // a tie is not a win
  EXPECT_EQ(evidence_text(e.at(S::decomposition)), "x0.900, wins 75 %");  // as tune and bench mlp print it
  EXPECT_THROW(paired_evidence({{S::fused_ce, {1.0}}}), tessera::Error);  // no baseline
  EXPECT_THROW(paired_evidence({{S::sequential, {}}}), tessera::Error);
  EXPECT_THROW(paired_evidence({{S::sequential, {1.0, 1.0}}, {S::fused_ce, {1.0}}}), tessera::Error);
  EXPECT_THROW(paired_evidence({{S::sequential, {1.0}}, {S::fused_ce, {-1.0}}}), tessera::Error);
}

TEST(OpsTuner, NeedsConsistentWinsToLeaveSequential) {
  using S = Strategy;
  // Medians favour fused_ce by 5 %, but it won only 5 of 11 repetitions: one
  // slow baseline sample decided the medians.
  const std::map<S, double> medians{{S::sequential, 1.0}, {S::fused_ce, 0.95}, {S::decomposition, 0.97}};
  std::map<S, PairedEvidence> e{{S::fused_ce, {0.98, 5.0 / 11}}, {S::decomposition, {0.97, 9.0 / 11}}};
  EXPECT_EQ(choose_strategy(medians, e), S::decomposition);
  e[S::decomposition].median_ratio = 0.995;  // consistent, but inside the margin
  EXPECT_EQ(choose_strategy(medians, e), S::sequential);
  e[S::fused_ce] = {0.9, 8.0 / 11};  // 8 of 11 is enough
  EXPECT_EQ(choose_strategy(medians, e), S::fused_ce);
  // Equal medians, yet 10 of 11 repetitions 3 % faster: the pairs decide.
  EXPECT_EQ(
      choose_strategy({{S::sequential, 2.296}, {S::decomposition, 2.297}}, {{S::decomposition, {0.972, 10.0 / 11}}}),
      S::decomposition);
  // Among qualifying candidates the medians rank: MLP-1's AG+GEMM had
  // decomposition at x0.782 and fused_ce at x0.786 against sequential, but
  // fused_ce's median 0.560 ms against 0.576 (the benchmark: 0.598 / 0.608).
  EXPECT_EQ(choose_strategy({{S::sequential, 0.731}, {S::decomposition, 0.576}, {S::fused_ce, 0.560}},
                            {{S::decomposition, {0.782, 1.0}}, {S::fused_ce, {0.786, 1.0}}}),
            S::fused_ce);
  // A faster median that does not qualify is passed over.
  EXPECT_EQ(choose_strategy({{S::sequential, 1.0}, {S::decomposition, 0.90}, {S::fused_ce, 0.85}},
                            {{S::decomposition, {0.93, 1.0}}, {S::fused_ce, {0.95, 0.5}}}),
            S::decomposition);
  e.erase(S::fused_ce);  // no evidence: not a candidate
  EXPECT_EQ(choose_strategy(medians, e), S::sequential);
  EXPECT_EQ(choose_strategy(medians, e, 0.01, 0.0), S::sequential);  // decomposition's ratio still misses
  EXPECT_THROW(choose_strategy(medians, e, 0.01, 1.5), tessera::Error);
  EXPECT_THROW(choose_strategy({{S::fused_ce, 1.0}}, e), tessera::Error);  // no baseline time
  // A candidate with perfect evidence and a NaN median is still an error, not skipped.
  EXPECT_THROW(choose_strategy({{S::sequential, 1.0}, {S::fused_ce, std::nan("")}}, {{S::fused_ce, {0.5, 1.0}}}),
               tessera::Error);
  EXPECT_THROW(choose_strategy({{S::sequential, 1.0}, {S::fused_ce, 1.0}}, {{S::fused_ce, {std::nan(""), 1.0}}}),
               tessera::Error);
}

TEST(OpsTuner, MlpLayerCheckKeepsThePairWithoutTuning) {
  using S = Strategy;
  using V = std::vector<Strategy>;
  // The pair is the baseline (what tune_choice takes without a measurement);
  // it is named by its first overlapped half.
  EXPECT_EQ(mlp_layer_candidates(S::fused_ce, S::sequential), (V{S::fused_ce, S::sequential}));
  EXPECT_EQ(mlp_layer_candidates(S::sequential, S::fused_sm), (V{S::fused_sm, S::sequential}));
  EXPECT_EQ(mlp_layer_candidates(S::decomposition, S::fused_ce), (V{S::decomposition, S::sequential}));
  EXPECT_THROW(mlp_layer_candidates(S::sequential, S::sequential), tessera::Error);
  EXPECT_THROW(mlp_layer_candidates(S::automatic, S::fused_ce), tessera::Error);
  // Sequential replaces the pair only on consistent paired wins.
  const auto base = mlp_layer_candidates(S::fused_ce, S::sequential).front();
  EXPECT_EQ(choose_strategy({{base, 0.412}, {S::sequential, 0.428}}, {{S::sequential, {1.04, 0.0}}}, 0.01,
                            kMinWinFraction, base),
            S::fused_ce);
  EXPECT_EQ(choose_strategy({{base, 0.428}, {S::sequential, 0.412}}, {{S::sequential, {0.962, 10.0 / 11}}}, 0.01,
                            kMinWinFraction, base),
            S::sequential);
  // Different pairs never share a key.
  EXPECT_NE(mlp_layer_key_flags(S::fused_ce, S::sequential), mlp_layer_key_flags(S::sequential, S::fused_ce));
  EXPECT_NE(mlp_layer_key_flags(S::fused_ce, S::fused_sm), mlp_layer_key_flags(S::fused_ce, S::fused_ce));
}

TEST(OpsTuner, ChoiceRoundTripsThroughTheCache) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera_ops_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  tune::MachineId m{"NVIDIA H200", "NV18", 2};
  const std::string key = choice_key(m, DType::bf16, "ag_gemm", {8192, 11008, 4096, 1});
  {
    tune::Cache c("ops", 1, dir);
    std::map<Strategy, double> t{{Strategy::sequential, 0.7}, {Strategy::fused_ce, 0.55}};
    c.put(key, choice_to_json(choose_strategy(t), t, {8192, 11008, 4096, 1}));
  }
  tune::Cache c("ops", 1, dir);
  auto j = c.get(key);
  ASSERT_TRUE(j.has_value());
  EXPECT_EQ(choice_from_json(*j), Strategy::fused_ce);
  EXPECT_NE(key.find("ops.ag_gemm"), std::string::npos);
  EXPECT_NE(key.find("w2"), std::string::npos);
  EXPECT_FALSE(choice_from_json(nlohmann::json{{"strategy", "bogus"}}).has_value());
  EXPECT_FALSE(choice_from_json(nlohmann::json::array()).has_value());
  std::filesystem::remove_all(dir);
}

TEST(OpsStrategy, NamesRoundTrip) {
  for (Strategy s :
       {Strategy::automatic, Strategy::sequential, Strategy::decomposition, Strategy::fused_ce, Strategy::fused_sm})
    EXPECT_EQ(parse_strategy(strategy_name(s)), s);
  EXPECT_THROW(parse_strategy("fast"), tessera::Error);
}

namespace strategies_test {
using Launch = void (*)(int&);
void noop(int&) {}
using Entry = ops::detail::StrategyEntry<Launch>;
using Registry = ops::detail::StrategyRegistry<Launch>;
const Entry seq{.strategy = Strategy::sequential, .needs = {}, .launch = &noop};
const Entry ce{
    .strategy = Strategy::fused_ce, .needs = {.min_world = 2, .lsa = true, .tile_row_shards = true}, .launch = &noop};
const Entry ring{.strategy = Strategy::ring, .needs = {.min_world = 3, .lsa = true}, .launch = &noop};
}  // namespace strategies_test

TEST(OpsStrategy, RegistryHoldsExactlyTheTablesStrategies) {
  using namespace strategies_test;
  using V = std::vector<Strategy>;
  const Registry r(OpKind::gemm_ar, "gemm_ar", {&seq, &ce});
  EXPECT_EQ(r.strategies(), (V{Strategy::sequential, Strategy::fused_ce}));
  EXPECT_EQ(r.candidates({.world = 2}), (V{Strategy::sequential, Strategy::fused_ce}));
  EXPECT_EQ(r.candidates({.world = 1}), V{Strategy::sequential});
  EXPECT_EQ(r.candidates({.world = 2, .lsa = false}), V{Strategy::sequential});
  EXPECT_EQ(r.candidates({.world = 2, .tile_row_shards = false}), V{Strategy::sequential});
  EXPECT_EQ(&r.find(Strategy::fused_ce), &ce);
  EXPECT_NE(error_message([&] { r.find(Strategy::ring); }).find("gemm_ar: strategy ring"), std::string::npos);
  // The table gives gemm_ar fused_ce: leaving it out, adding ring, a
  // duplicate or a baseline other than sequential is refused.
  EXPECT_THROW(Registry(OpKind::gemm_ar, "gemm_ar", {&seq}), Error);
  EXPECT_THROW(Registry(OpKind::gemm_ar, "gemm_ar", {&seq, &ce, &ring}), Error);
  EXPECT_THROW(Registry(OpKind::gemm_ar, "gemm_ar", {&seq, &ce, &ce}), Error);
  EXPECT_THROW(Registry(OpKind::gemm_ar, "gemm_ar", {&ce, &seq}), Error);
}

TEST(OpsStrategy, CandidatesCoverTheTable) {
  // Every strategy the table gives an operator is measured somewhere (the
  // registries are built, and checked against the table, on first use).
  const std::pair<OpKind, std::vector<Strategy>> ops[] = {
      {OpKind::ag_gemm, ag_gemm_candidates(8, true)},
      {OpKind::gemm_rs, gemm_rs_candidates(8, true, true)},
      {OpKind::gemm_ar, gemm_ar_candidates(8, true, true)},
      {OpKind::sp_attention, sp_attention_candidates(8, true, true, true)},
  };
  for (const auto& [op, cands] : ops) {
    std::set<Strategy> want;
    for (const StrategyInfo& i : strategy_table())
      if (i.strategy != Strategy::automatic && accepts(op, i.strategy)) want.insert(i.strategy);
    EXPECT_EQ(std::set<Strategy>(cands.begin(), cands.end()), want) << static_cast<unsigned>(op);
    EXPECT_EQ(cands.front(), Strategy::sequential);
  }
}

TEST(OpsValidate, UpperBoundsAndOverflowCheckedSizes) {
  auto a = good_ag(8192, 0, 2);
  auto bad = a;
  bad.lda = std::int64_t{1} << 40;
  EXPECT_NE(error_message([&] { validate(bad, 0, 2); }).find("lda"), std::string::npos);
  bad = a;
  bad.ldd = std::int64_t{1} << 62;
  EXPECT_NE(error_message([&] { validate(bad, 0, 2); }).find("ldd"), std::string::npos);
  GemmRsArgs r;
  r.a = r.b = fake(0x1000);
  r.d = fake(0x2000);
  r.m = 8192, r.m_local = 4096, r.n = 4096 * 64, r.k = 4096, r.ldb = (std::int64_t{1} << 31) - 8;
  EXPECT_NE(error_message([&] { validate(r, 0, 2); }).find("2^48 bytes"), std::string::npos);
  MlpArgs m;
  m.x = fake(0x1000);
  m.w_gate_up = fake(0x2000);
  m.w_down = fake(0x3000);
  m.out = fake(0x4000);
  m.m = 8192;
  m.m_local = 4096;
  m.h = 4096;
  m.i_local = std::int64_t{1} << 62;  // 2 * I/R would overflow
  EXPECT_NE(error_message([&] { validate(m, 0, 2); }).find("I/R"), std::string::npos);
  m.i_local = 5504;
  m.h = std::int64_t{1} << 40;
  EXPECT_NE(error_message([&] { validate(m, 0, 2); }).find("H ="), std::string::npos);
}

TEST(OpsTuner, CachedChoiceMustBeACandidateWithSaneTimes) {
  using J = nlohmann::json;
  // Ring is no candidate at R = 2: ignored (re-tuned), though a known name.
  const J ring{{"strategy", "ring"}, {"times_ms", {{"ring", 1.0}, {"sequential", 2.0}}}};
  EXPECT_EQ(choice_from_json(ring), Strategy::ring);
  EXPECT_FALSE(choice_from_json(ring, gemm_rs_candidates(2)).has_value());
  EXPECT_EQ(choice_from_json(ring, gemm_rs_candidates(4)), Strategy::ring);
  EXPECT_FALSE(choice_from_json(J{{"strategy", "fused_sm"}, {"times_ms", {{"sequential", 2.0}}}}).has_value());
  EXPECT_FALSE(choice_from_json(J{{"strategy", "fused_sm"}, {"times_ms", {{"fused_sm", -1.0}}}}).has_value());
  EXPECT_FALSE(choice_from_json(J{{"strategy", "auto"}}).has_value());
  EXPECT_FALSE(choice_from_json(J{{"strategy", 5}}).has_value());
}

TEST(OpsTuner, NearestChoiceReusesANeighbourOfTheSameFlags) {
  using J = nlohmann::json;
  const std::string pre = "H200|lsa|w2|bf16|ops.ag_gemm";
  const auto entry = [](const char* s, std::vector<std::int64_t> shape) {
    return J{{"strategy", s}, {"times_ms", {{"sequential", 2.0}, {s, 1.0}}}, {"shape", shape}};
  };
  J e = J::object();
  e[pre + "|8192x4096x4096x0"] = entry("fused_ce", {8192, 4096, 4096, 0});
  e[pre + "|8192x4096x4096x1"] = entry("decomposition", {8192, 4096, 4096, 1});
  e["H200|lsa|w2|bf16|ops.gemm_rs|8192x4096x4096x0"] = entry("fused_sm", {8192, 4096, 4096, 0});
  const auto cand = ag_gemm_candidates(2);
  // Nearest with the same swiglu flag; other operators' entries never count.
  EXPECT_EQ(nearest_choice(e, pre, {6144, 4096, 4096, 0}, 3, cand), Strategy::fused_ce);
  EXPECT_EQ(nearest_choice(e, pre, {6144, 4096, 4096, 1}, 3, cand), Strategy::decomposition);
  // Too far (M 8x smaller), a flag never measured, or not a candidate here: none.
  EXPECT_FALSE(nearest_choice(e, pre, {1024, 4096, 4096, 0}, 3, cand).has_value());
  EXPECT_FALSE(nearest_choice(e, pre, {8192, 4096, 4096, 2}, 3, cand).has_value());
  EXPECT_FALSE(nearest_choice(e, pre, {8192, 4096, 4096, 0}, 3, {Strategy::sequential}).has_value());
  // The closer of two neighbours wins; malformed entries are skipped.
  e[pre + "|4096x4096x4096x0"] = entry("fused_sm", {4096, 4096, 4096, 0});
  e[pre + "|bad"] = J{{"strategy", "fused_sm"}, {"shape", {"x", 1, 1, 0}}};
  EXPECT_EQ(nearest_choice(e, pre, {5000, 4096, 4096, 0}, 3, cand), Strategy::fused_sm);
  EXPECT_EQ(nearest_choice(e, pre, {7000, 4096, 4096, 0}, 3, cand), Strategy::fused_ce);
  EXPECT_THROW(nearest_choice(e, pre, {0, 4096, 4096, 0}, 3, cand), Error);
}

// When a TP call restarts the flags' epochs (TpContext::Impl::begin_call).
// Inside a CUDA-graph capture sp_attention's automatic reads the choice an
// eager call agreed on, with no exchange: measured (memo) before guessed,
// nothing for a key never chosen.
TEST(OpsAgreedChoice, MeasuredBeforeGuessedAndNoneForANewKey) {
  ops::detail::TuneState st;
  ops::detail::TuneQuery q{"machine/bf16/ops.sp_attention", {65536, 1, 32, 8, 128, 1}, 4, false, false};
  EXPECT_FALSE(ops::detail::agreed_choice(st, q).has_value());
  const std::string key = tune::make_key(q.prefix, q.shape);
  st.guessed[key] = Strategy::sequential;
  EXPECT_EQ(ops::detail::agreed_choice(st, q), Strategy::sequential);
  st.memo[key] = Strategy::fused_ce;
  EXPECT_EQ(ops::detail::agreed_choice(st, q), Strategy::fused_ce);
  q.shape.push_back(1 << 2);  // a candidate mask keys the choice apart
  EXPECT_FALSE(ops::detail::agreed_choice(st, q).has_value());
}

TEST(OpsRsCopyChunks, CoalesceSmallBandsUpToTheTarget) {
  const std::size_t mib = std::size_t{1} << 20;
  // 64-row bands of a 1480-column bf16 output (190 KB): 12 per 2 MiB copy.
  EXPECT_EQ(rs_copy_chunk_bands(64 * 1480 * 2, 23, 2 * mib), 12);
  // Never more than the owner's bands, never fewer than one.
  EXPECT_EQ(rs_copy_chunk_bands(64 * 1480 * 2, 5, 2 * mib), 5);
  EXPECT_EQ(rs_copy_chunk_bands(4 * mib, 8, 2 * mib), 1);  // MLP-1's 512-row bands stay one per copy
  EXPECT_EQ(rs_copy_chunk_bands(2 * mib, 8, 2 * mib), 1);
  EXPECT_EQ(rs_copy_chunk_bands(2 * mib - 1, 8, 2 * mib), 2);
  // Target 0: one band per copy (the measurement baseline).
  EXPECT_EQ(rs_copy_chunk_bands(1000, 40, 0), 1);
  EXPECT_THROW(rs_copy_chunk_bands(1000, 0, 2 * mib), Error);
}

TEST(OpsCallStart, ResetsAtEachCapturesFirstCallAndOnEagerCallsAfterACapture) {
  // Never captured: eager calls run on with their epochs.
  CallStart s = flag_call_start(true, std::nullopt, false, 0);
  EXPECT_FALSE(s.reset);
  EXPECT_FALSE(s.captured);
  // A capture's first call resets inside the graph; its later calls do not.
  s = flag_call_start(true, 7ull, s.captured, s.reset_capture);
  EXPECT_TRUE(s.reset);
  EXPECT_TRUE(s.captured);
  EXPECT_EQ(s.reset_capture, 7ull);
  s = flag_call_start(true, 7ull, s.captured, s.reset_capture);
  EXPECT_FALSE(s.reset);
  // Eager after a capture: every call resets (a replay may have run since).
  for (int i = 0; i < 3; ++i) {
    s = flag_call_start(true, std::nullopt, s.captured, s.reset_capture);
    EXPECT_TRUE(s.reset) << "eager call " << i << " after a capture";
    EXPECT_TRUE(s.captured);
  }
  // A second capture resets at its own first call.
  s = flag_call_start(true, 8ull, s.captured, s.reset_capture);
  EXPECT_TRUE(s.reset);
  EXPECT_EQ(s.reset_capture, 8ull);
  // Without flags (no load/store reach: NCCL only) nothing is ever reset.
  const CallStart n = flag_call_start(false, 9ull, false, 0);
  EXPECT_FALSE(n.reset);
  EXPECT_FALSE(n.captured);
}
