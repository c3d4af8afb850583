// The C interface rejects bad arguments with -1 and a message that names the
// problem, before any rendezvous or launch (no GPU needed).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <utility>

#include "tessera/capi/tessera.h"

namespace {

std::string last() { return tessera_last_error(); }

TEST(Capi, SessionCreateRejectsBadRanksAndRendezvous) {
  tessera_session* s = reinterpret_cast<tessera_session*>(0x1);
  EXPECT_EQ(tessera_session_create(2, 2, 0, 1, -1, "127.0.0.1", 29501, &s), -1);
  EXPECT_NE(last().find("rank 2 of world 2"), std::string::npos) << last();
  EXPECT_EQ(s, nullptr);  // cleared before anything else
  EXPECT_EQ(tessera_session_create(0, 2, 1, 1, -1, "127.0.0.1", 29501, &s), -1);
  EXPECT_NE(last().find("local rank 1 of 1"), std::string::npos) << last();
  EXPECT_EQ(tessera_session_create(0, 2, 0, 2, -1, "", 29501, &s), -1);
  EXPECT_NE(last().find("master_addr"), std::string::npos) << last();
  EXPECT_EQ(tessera_session_create(0, 2, 0, 2, -1, "127.0.0.1", 70000, &s), -1);
  EXPECT_NE(last().find("master_port 70000"), std::string::npos) << last();
  EXPECT_EQ(tessera_session_create(0, 1, 0, 1, -1, "127.0.0.1", 29501, nullptr), -1);
  EXPECT_NE(last().find("out is null"), std::string::npos) << last();
}

TEST(Capi, OperatorsRejectANullSession) {
  EXPECT_EQ(
      tessera_ag_gemm(nullptr, nullptr, nullptr, nullptr, 128, 64, 128, 128, 0, TESSERA_BF16, 0, TESSERA_AUTOMATIC),
      -1);
  EXPECT_NE(last().find("tessera_ag_gemm: null session"), std::string::npos) << last();
  EXPECT_EQ(tessera_gemm_rs(nullptr, nullptr, nullptr, nullptr, 128, 64, 128, 128, TESSERA_BF16, TESSERA_AUTOMATIC),
            -1);
  EXPECT_NE(last().find("tessera_gemm_rs: null session"), std::string::npos) << last();
  EXPECT_EQ(tessera_gemm_ar(nullptr, nullptr, nullptr, nullptr, 128, 128, 128, TESSERA_BF16, TESSERA_AUTOMATIC), -1);
  EXPECT_NE(last().find("tessera_gemm_ar: null session"), std::string::npos) << last();
  EXPECT_EQ(tessera_mlp(nullptr, nullptr, nullptr, nullptr, nullptr, 128, 64, 128, 64, TESSERA_BF16, TESSERA_AUTOMATIC,
                        TESSERA_AUTOMATIC),
            -1);
  EXPECT_NE(last().find("tessera_mlp: null session"), std::string::npos) << last();
  int out = -7;
  EXPECT_EQ(tessera_resolve(nullptr, 0, 128, 64, 128, 128, TESSERA_BF16, 0, nullptr, nullptr, nullptr, &out), -1);
  EXPECT_EQ(out, -7);
  EXPECT_EQ(tessera_session_stream(nullptr), nullptr);
  tessera_session_destroy(nullptr);  // a no-op, like free(NULL)
}

// The operator flags words: unknown bits are refused before the session is
// looked at (so a null session shows it), the known ones pass on to it.
TEST(Capi, OperatorFlagsRejectUnknownBits) {
  char buf[64] = {};
  void* p = buf;
  EXPECT_EQ(tessera_ag_gemm_ex(nullptr, nullptr, p, p, p, nullptr, 128, 64, 128, 128, 0, TESSERA_BF16, 4, 0), -1);
  EXPECT_NE(last().find("tessera_ag_gemm_ex: flags = 0x4 has unknown bits"), std::string::npos) << last();
  EXPECT_EQ(tessera_ag_gemm(nullptr, p, p, p, 128, 64, 128, 128, 0, TESSERA_BF16, 8, 0), -1);
  EXPECT_NE(last().find("tessera_ag_gemm: flags = 0x8 has unknown bits"), std::string::npos) << last();
  EXPECT_EQ(tessera_ag_gemm_ex(nullptr, nullptr, p, p, p, nullptr, 128, 64, 128, 128, 0, TESSERA_BF16,
                               TESSERA_AG_SWIGLU | TESSERA_B_KN, 0),
            -1);
  EXPECT_NE(last().find("tessera_ag_gemm_ex: null session"), std::string::npos) << last();
  // gemm_rs takes TESSERA_B_KN only.
  EXPECT_EQ(tessera_gemm_rs_ex2(nullptr, nullptr, p, p, p, 128, 64, 128, 128, TESSERA_BF16, 0, TESSERA_AG_SWIGLU), -1);
  EXPECT_NE(last().find("tessera_gemm_rs_ex2: flags = 0x1 has unknown bits"), std::string::npos) << last();
  EXPECT_EQ(tessera_gemm_rs_ex2(nullptr, nullptr, p, p, p, 128, 64, 128, 128, TESSERA_BF16, 0, TESSERA_B_KN), -1);
  EXPECT_NE(last().find("tessera_gemm_rs_ex2: null session"), std::string::npos) << last();
  int out = -7;
  EXPECT_EQ(tessera_resolve(nullptr, 1, 128, 64, 128, 128, TESSERA_BF16, TESSERA_AG_SWIGLU, p, p, p, &out), -1);
  EXPECT_NE(last().find("tessera_resolve: flags = 0x1 has unknown bits"), std::string::npos) << last();
  EXPECT_EQ(tessera_resolve(nullptr, 0, 128, 64, 128, 128, TESSERA_BF16, TESSERA_B_KN, p, p, p, &out), -1);
  EXPECT_NE(last().find("tessera_resolve: null session"), std::string::npos) << last();
  EXPECT_EQ(out, -7);
}

TEST(Capi, NullArgumentsNeverCrash) {
  EXPECT_EQ(tessera_gemm_rs(nullptr, nullptr, nullptr, nullptr, 1, 1, 1, 1, 0, 0), -1);
  EXPECT_FALSE(last().empty());
  tessera_session_use_cache(nullptr, 0);  // ignored, never fails
  tessera_session_tune_on_miss(nullptr, 0);
}

TEST(Capi, CreateFromIdRejectsBadArgumentsBeforeAnyNcclCall) {
  unsigned char id[TESSERA_UNIQUE_ID_BYTES] = {};
  tessera_session* s = reinterpret_cast<tessera_session*>(0x1);
  EXPECT_EQ(tessera_session_create_from_id(1, 1, 0, id, TESSERA_UNIQUE_ID_BYTES, 0, &s), -1);
  EXPECT_NE(last().find("rank 1 of world 1"), std::string::npos) << last();
  EXPECT_EQ(s, nullptr);
  EXPECT_EQ(tessera_session_create_from_id(0, 1, -1, id, TESSERA_UNIQUE_ID_BYTES, 0, &s), -1);
  EXPECT_NE(last().find("device -1"), std::string::npos) << last();
  EXPECT_EQ(tessera_session_create_from_id(0, 1, 0, nullptr, TESSERA_UNIQUE_ID_BYTES, 0, &s), -1);
  EXPECT_NE(last().find("id is null"), std::string::npos) << last();
  EXPECT_EQ(tessera_session_create_from_id(0, 1, 0, id, 64, 0, &s), -1);
  EXPECT_NE(last().find("id_bytes 64 (must be 128)"), std::string::npos) << last();
  EXPECT_EQ(tessera_session_create_from_id(0, 1, 0, id, TESSERA_UNIQUE_ID_BYTES, -5, &s), -1);
  EXPECT_NE(last().find("timeout_ms -5"), std::string::npos) << last();
  EXPECT_EQ(tessera_nccl_unique_id(id, 16), -1);
  EXPECT_NE(last().find("bytes 16 (must be 128)"), std::string::npos) << last();
}

TEST(Capi, ExOperatorsRejectANullSession) {
  EXPECT_EQ(tessera_ag_gemm_ex(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 128, 64, 128, 128, 0, TESSERA_BF16,
                               0, TESSERA_SEQUENTIAL),
            -1);
  EXPECT_NE(last().find("tessera_ag_gemm_ex: null session"), std::string::npos) << last();
  EXPECT_EQ(tessera_gemm_rs_ex(nullptr, nullptr, nullptr, nullptr, nullptr, 128, 64, 128, 128, TESSERA_BF16, 0), -1);
  EXPECT_NE(last().find("tessera_gemm_rs_ex: null session"), std::string::npos) << last();
  EXPECT_EQ(tessera_gemm_ar_ex(nullptr, nullptr, nullptr, nullptr, nullptr, 128, 128, 128, TESSERA_BF16, 0), -1);
  EXPECT_NE(last().find("tessera_gemm_ar_ex: null session"), std::string::npos) << last();
  EXPECT_EQ(tessera_mlp_ex(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 128, 64, 128, 64, TESSERA_BF16, 0, 0),
            -1);
  EXPECT_NE(last().find("tessera_mlp_ex: null session"), std::string::npos) << last();
  EXPECT_EQ(tessera_session_rank(nullptr), -1);
  EXPECT_EQ(tessera_session_world(nullptr), -1);
  EXPECT_EQ(tessera_session_lsa_reachable(nullptr), 0);
  tessera_session_abort(nullptr);  // a no-op
}

// sp_attention's arguments are checked before the session is looked at:
// each bad value is named with a null session, and a good call then reaches
// the null-session check.
TEST(Capi, SpAttentionRejectsBadArgumentsNamingThem) {
  void* p = reinterpret_cast<void*>(0x1000);
  struct Call {
    int64_t batch = 1, seq = 64, hq = 8, hkv = 2, d = 128;
    int dtype = TESSERA_BF16, causal = 1;
    float scale = 0.f;
    int strategy = TESSERA_AUTOMATIC;
    const void* q = reinterpret_cast<void*>(0x1000);
  };
  auto call = [&](const Call& c) {
    return tessera_sp_attention(nullptr, c.q, p, p, p, nullptr, c.batch, c.seq, c.hq, c.hkv, c.d, c.dtype, c.causal,
                                c.scale, c.strategy);
  };
  const std::pair<std::function<void(Call&)>, std::string> bad[] = {
      {[](Call& c) { c.batch = 0; }, "batch = 0 out of range"},
      {[](Call& c) { c.seq = 1; }, "seq = 1 out of range"},
      {[](Call& c) { c.seq = 66; }, ""},  // even: fine here (the world is checked by the operator)
      {[](Call& c) { c.seq = 65; }, "seq = 65 must be even"},
      {[](Call& c) { c.hq = 0; }, "heads_q = 0 out of range"},
      {[](Call& c) { c.hkv = 0; }, "heads_kv = 0 out of range"},
      {[](Call& c) { c.hq = 6, c.hkv = 4; }, "heads_q = 6 is not a multiple of heads_kv = 4"},
      {[](Call& c) { c.d = 96; }, "head_dim = 96 (64 or 128)"},
      {[](Call& c) { c.dtype = 7; }, "dtype code 7"},
      {[](Call& c) { c.causal = 2; }, "causal = 2 (0 or 1)"},
      {[](Call& c) { c.scale = -1.f; }, "softmax_scale = -1"},
      {[](Call& c) { c.scale = std::nanf(""); }, "softmax_scale = nan"},
      {[](Call& c) { c.strategy = TESSERA_DECOMPOSITION; }, "strategy code 2"},
      {[](Call& c) { c.strategy = TESSERA_FUSED_SM; }, "strategy code 4"},
      {[](Call& c) { c.strategy = 7; }, "strategy code 7"},
      {[](Call& c) { c.q = nullptr; }, "q is null"},
  };
  for (const auto& [edit, text] : bad) {
    Call c;
    edit(c);
    EXPECT_EQ(call(c), -1);
    const std::string want = text.empty() ? "tessera_sp_attention: null session" : "tessera_sp_attention: " + text;
    EXPECT_NE(last().find(want), std::string::npos) << "want '" << want << "', got: " << last();
  }
  for (int s :
       {TESSERA_AUTOMATIC, TESSERA_SEQUENTIAL, TESSERA_FUSED_CE, TESSERA_RING, TESSERA_ULYSSES, TESSERA_TWO_LEVEL}) {
    Call c;
    c.strategy = s;
    EXPECT_EQ(call(c), -1);
    EXPECT_NE(last().find("tessera_sp_attention: null session"), std::string::npos) << last();
  }
}

// Misaligned pointers are named before the session is looked at: q, k, v
// and o 16-byte aligned (TMA), lse 4-byte (float32).
TEST(Capi, SpAttentionRejectsMisalignedPointersNamingThem) {
  auto* p = reinterpret_cast<char*>(0x1000);
  const char* fn = "tessera_sp_attention: ";
  EXPECT_EQ(tessera_sp_attention(nullptr, p + 4, p, p, p, nullptr, 1, 64, 8, 2, 128, TESSERA_BF16, 1, 0.f, 0), -1);
  EXPECT_NE(last().find(std::string(fn) + "q = 0x1004 is not 16-byte aligned"), std::string::npos) << last();
  EXPECT_EQ(tessera_sp_attention(nullptr, p, p + 8, p, p, nullptr, 1, 64, 8, 2, 128, TESSERA_BF16, 1, 0.f, 0), -1);
  EXPECT_NE(last().find(std::string(fn) + "k = 0x1008 is not 16-byte aligned"), std::string::npos) << last();
  EXPECT_EQ(tessera_sp_attention(nullptr, p, p, p + 2, p, nullptr, 1, 64, 8, 2, 128, TESSERA_BF16, 1, 0.f, 0), -1);
  EXPECT_NE(last().find(std::string(fn) + "v = 0x1002 is not 16-byte aligned"), std::string::npos) << last();
  EXPECT_EQ(tessera_sp_attention(nullptr, p, p, p, p + 12, nullptr, 1, 64, 8, 2, 128, TESSERA_BF16, 1, 0.f, 0), -1);
  EXPECT_NE(last().find(std::string(fn) + "o = 0x100c is not 16-byte aligned"), std::string::npos) << last();
  auto* lse = reinterpret_cast<float*>(0x2002);
  EXPECT_EQ(tessera_sp_attention_ex(nullptr, nullptr, p, p, p, p, lse, 1, 64, 8, 2, 128, TESSERA_BF16, 1, 0.f, 0), -1);
  EXPECT_NE(last().find("tessera_sp_attention_ex: lse = 0x2002 is not 4-byte aligned"), std::string::npos) << last();
  // Aligned pointers reach the session check.
  EXPECT_EQ(tessera_sp_attention_ex(nullptr, nullptr, p, p, p, p, reinterpret_cast<float*>(0x2004), 1, 64, 8, 2, 128,
                                    TESSERA_BF16, 1, 0.f, 0),
            -1);
  EXPECT_NE(last().find("tessera_sp_attention_ex: null session"), std::string::npos) << last();
}

TEST(Capi, SpAttentionExAndResolveRejectANullSession) {
  void* p = reinterpret_cast<void*>(0x1000);
  EXPECT_EQ(tessera_sp_attention_ex(nullptr, nullptr, p, p, p, p, nullptr, 1, 64, 8, 8, 64, TESSERA_F16, 0, 0.f,
                                    TESSERA_FUSED_CE),
            -1);
  EXPECT_NE(last().find("tessera_sp_attention_ex: null session"), std::string::npos) << last();
  EXPECT_EQ(tessera_sp_attention_ex(nullptr, nullptr, p, p, nullptr, p, nullptr, 1, 64, 8, 8, 64, TESSERA_F16, 0, 0.f,
                                    TESSERA_FUSED_CE),
            -1);
  EXPECT_NE(last().find("tessera_sp_attention_ex: v is null"), std::string::npos) << last();
  int out = -7;
  EXPECT_EQ(tessera_sp_attention_resolve(nullptr, p, p, p, p, 1, 64, 8, 8, 128, TESSERA_BF16, 1, &out), -1);
  EXPECT_NE(last().find("tessera_sp_attention_resolve: null session"), std::string::npos) << last();
  EXPECT_EQ(out, -7);
  EXPECT_EQ(tessera_sp_attention_resolve(nullptr, p, p, p, p, 1, 64, 8, 8, 128, TESSERA_BF16, 1, nullptr), -1);
  EXPECT_NE(last().find("tessera_sp_attention_resolve: out is null"), std::string::npos) << last();
}

// The element-wise entry points check their arguments before any launch,
// so these fail with a message on a machine without a GPU too.
TEST(Capi, ElementwiseEntryPointsRejectBadArgumentsNamingThem) {
  alignas(16) static unsigned char buf[4096];
  EXPECT_EQ(tessera_transpose(nullptr, nullptr, buf, 4, 4, 0), -1);
  EXPECT_NE(last().find("in = "), std::string::npos) << last();
  EXPECT_EQ(tessera_transpose(nullptr, buf, buf, 4, 4, 0), -1);
  EXPECT_NE(last().find("distinct"), std::string::npos) << last();
  EXPECT_EQ(tessera_transpose(nullptr, buf, buf + 64, 4, 4, 7), -1);
  EXPECT_NE(last().find("dtype code 7"), std::string::npos) << last();
  EXPECT_EQ(tessera_transpose(nullptr, buf, buf + 64, -1, 4, 0), -1);
  EXPECT_NE(last().find("rows = -1"), std::string::npos) << last();
  EXPECT_EQ(tessera_swiglu_forward(nullptr, buf, buf + 64, 2, 6, 0), -1);
  EXPECT_NE(last().find("inter = 6"), std::string::npos) << last();
  EXPECT_EQ(tessera_swiglu_forward(nullptr, buf + 1, buf + 64, 2, 8, 0), -1);
  EXPECT_NE(last().find("gu = "), std::string::npos) << last();
  EXPECT_EQ(tessera_swiglu_backward(nullptr, buf, nullptr, buf + 64, nullptr, 2, 8, 0), -1);
  EXPECT_NE(last().find("dh = "), std::string::npos) << last();
  // Empty problems are no-ops.
  EXPECT_EQ(tessera_transpose(nullptr, buf, buf + 64, 0, 4, 0), 0);
  EXPECT_EQ(tessera_swiglu_forward(nullptr, buf, buf + 64, 0, 8, 0), 0);
}

TEST(Capi, SessionSettersTakeANullSession) {
  tessera_session_use_cache(nullptr, 0);
  tessera_session_tune_on_miss(nullptr, 0);
  tessera_session_sp_workspace_limit(nullptr, 1u << 20);
  tessera_session_sp_two_level_inner(nullptr, 2);
  SUCCEED();
}

TEST(Capi, StrategyTable) {
  const char* names[] = {"automatic", "sequential", "decomposition", "fused_ce", "fused_sm",
                         "ring",      "ulysses",    "pipelined",     "two_level"};
  for (int code = 0; code < 9; ++code) {
    ASSERT_NE(tessera_strategy_name(code), nullptr) << code;
    EXPECT_STREQ(tessera_strategy_name(code), names[code]);
  }
  EXPECT_EQ(tessera_strategy_name(9), nullptr);
  EXPECT_EQ(tessera_strategy_name(-1), nullptr);
  EXPECT_EQ(tessera_strategy_accepts(1, TESSERA_RING), 1);  // gemm_rs takes ring
  EXPECT_EQ(tessera_strategy_accepts(0, TESSERA_RING), 0);  // ag_gemm does not
  EXPECT_EQ(tessera_strategy_accepts(3, TESSERA_RING), 1);  // sp_attention: ring attention
  EXPECT_EQ(tessera_strategy_accepts(3, TESSERA_ULYSSES), 1);
  EXPECT_EQ(tessera_strategy_accepts(1, TESSERA_ULYSSES), 0);
  EXPECT_EQ(tessera_strategy_accepts(3, TESSERA_TWO_LEVEL), 1);
  EXPECT_EQ(tessera_strategy_accepts(0, TESSERA_TWO_LEVEL), 0);
  EXPECT_EQ(tessera_strategy_accepts(2, TESSERA_FUSED_SM), 0);
  EXPECT_EQ(tessera_strategy_accepts(3, TESSERA_FUSED_CE), 1);
  EXPECT_EQ(tessera_strategy_accepts(3, TESSERA_DECOMPOSITION), 0);
  EXPECT_EQ(tessera_strategy_accepts(4, TESSERA_SEQUENTIAL), 1);  // op 4: moe_tp
  EXPECT_EQ(tessera_strategy_accepts(0, 9), 0);
  EXPECT_EQ(tessera_strategy_accepts(4, TESSERA_PIPELINED), 1);  // moe_tp takes pipelined
  EXPECT_EQ(tessera_strategy_accepts(4, TESSERA_AUTOMATIC), 1);
  EXPECT_EQ(tessera_strategy_accepts(4, TESSERA_FUSED_CE), 0);
  EXPECT_EQ(tessera_strategy_accepts(1, TESSERA_PIPELINED), 0);  // gemm_rs does not
  for (int code : {TESSERA_AUTOMATIC, TESSERA_SEQUENTIAL, TESSERA_PIPELINED})
    EXPECT_EQ(tessera_strategy_accepts(5, code), 1) << code;  // op 5: moe_ep
  EXPECT_EQ(tessera_strategy_accepts(5, TESSERA_FUSED_CE), 0);
  EXPECT_EQ(tessera_strategy_accepts(5, TESSERA_RING), 0);
  EXPECT_EQ(tessera_strategy_accepts(6, TESSERA_SEQUENTIAL), 0);  // no op 6
}

// The MoE layers' arguments are checked before the session is looked at:
// each bad value is named with a null session, and a good call then reaches
// the null-session check.
TEST(Capi, MoeLayersRejectBadArgumentsNamingThem) {
  void* p = reinterpret_cast<void*>(0x1000);
  const auto* ids = reinterpret_cast<const int32_t*>(0x2000);
  const auto* w = reinterpret_cast<const float*>(0x3000);
  struct Call {
    int64_t tokens = 64, hidden = 256, inter = 128, capacity = 0;
    int experts = 8, topk = 2, dtype = TESSERA_BF16, strategy = TESSERA_AUTOMATIC;
    const void* x = reinterpret_cast<void*>(0x1000);
  };
  const std::pair<std::function<void(Call&)>, std::string> bad[] = {
      {[](Call& c) { c.tokens = -1; }, "tokens_local = -1 out of range"},
      {[](Call& c) { c.tokens = 0; }, ""},  // an empty shard is a valid call
      {[](Call& c) { c.hidden = 0; }, "hidden = 0 out of range"},
      {[](Call& c) { c.experts = 0; }, "experts = 0 out of range [1, 1024]"},
      {[](Call& c) { c.experts = 1025; }, "experts = 1025 out of range [1, 1024]"},
      {[](Call& c) { c.topk = 0; }, "topk = 0 out of range"},
      {[](Call& c) { c.topk = 17; }, "topk = 17 out of range [1, min(16, experts = 8)]"},
      {[](Call& c) { c.topk = 9; }, "topk = 9 out of range"},
      {[](Call& c) { c.dtype = TESSERA_F16; }, "dtype code 1 (the MoE layers take TESSERA_BF16 = 0 only)"},
      {[](Call& c) { c.strategy = TESSERA_FUSED_CE; }, "strategy code 3 (TESSERA_AUTOMATIC 0, TESSERA_SEQUENTIAL 1 or"},
      {[](Call& c) { c.strategy = TESSERA_DECOMPOSITION; }, "strategy code 2"},
      {[](Call& c) { c.strategy = 99; }, "strategy code 99"},
      {[](Call& c) { c.x = nullptr; }, "x_shard is null"},
  };
  for (const bool ep : {false, true}) {
    const std::string fn = ep ? "tessera_moe_ep_ex" : "tessera_moe_tp_ex";
    auto call = [&](const Call& c) {
      return ep ? tessera_moe_ep_ex(nullptr, nullptr, c.x, ids, w, p, p, p, c.tokens, c.hidden, c.inter, c.experts,
                                    c.topk, c.capacity, c.dtype, c.strategy)
                : tessera_moe_tp_ex(nullptr, nullptr, c.x, ids, w, p, p, p, c.tokens, c.hidden, c.inter, c.experts,
                                    c.topk, c.dtype, c.strategy);
    };
    for (const auto& [edit, text] : bad) {
      Call c;
      edit(c);
      EXPECT_EQ(call(c), -1);
      const std::string want = fn + ": " + (text.empty() ? std::string("null session") : text);
      EXPECT_NE(last().find(want), std::string::npos) << "want '" << want << "', got: " << last();
    }
    for (int s : {TESSERA_AUTOMATIC, TESSERA_SEQUENTIAL, TESSERA_PIPELINED}) {
      Call c;
      c.strategy = s;
      EXPECT_EQ(call(c), -1);
      EXPECT_NE(last().find(fn + ": null session"), std::string::npos) << last();
    }
  }
  EXPECT_EQ(tessera_moe_tp_ex(nullptr, nullptr, p, nullptr, w, p, p, p, 64, 256, 128, 8, 2, TESSERA_BF16, 0), -1);
  EXPECT_NE(last().find("tessera_moe_tp_ex: expert_ids is null"), std::string::npos) << last();
  EXPECT_EQ(tessera_moe_tp_ex(nullptr, nullptr, p, ids, w, p, nullptr, p, 64, 256, 128, 8, 2, TESSERA_BF16, 0), -1);
  EXPECT_NE(last().find("tessera_moe_tp_ex: w_down is null"), std::string::npos) << last();
  EXPECT_EQ(tessera_moe_tp_ex(nullptr, nullptr, p, ids, w, p, p, p, 64, 256, 0, 8, 2, TESSERA_BF16, 0), -1);
  EXPECT_NE(last().find("tessera_moe_tp_ex: inter_local = 0 out of range"), std::string::npos) << last();
  EXPECT_EQ(tessera_moe_ep_ex(nullptr, nullptr, p, ids, w, p, p, p, 64, 256, 0, 8, 2, 0, TESSERA_BF16, 0), -1);
  EXPECT_NE(last().find("tessera_moe_ep_ex: inter = 0 out of range"), std::string::npos) << last();
  EXPECT_EQ(tessera_moe_ep_ex(nullptr, nullptr, p, ids, w, p, p, p, 64, 256, 128, 8, 2, -5, TESSERA_BF16, 0), -1);
  EXPECT_NE(last().find("tessera_moe_ep_ex: capacity = -5 out of range"), std::string::npos) << last();
  int out = -7;
  EXPECT_EQ(tessera_moe_tp_resolve(nullptr, p, ids, w, p, p, p, 64, 256, 128, 8, 2, TESSERA_BF16, &out), -1);
  EXPECT_NE(last().find("tessera_moe_tp_resolve: null session"), std::string::npos) << last();
  EXPECT_EQ(out, -7);
  EXPECT_EQ(tessera_moe_tp_resolve(nullptr, p, ids, w, p, p, p, 64, 256, 128, 8, 2, TESSERA_BF16, nullptr), -1);
  EXPECT_NE(last().find("tessera_moe_tp_resolve: out is null"), std::string::npos) << last();
  EXPECT_EQ(tessera_moe_tp_check_status(nullptr), -1);
  EXPECT_NE(last().find("tessera_moe_tp_check_status: null session"), std::string::npos) << last();
  EXPECT_EQ(tessera_moe_ep_check_status(nullptr), -1);
  EXPECT_NE(last().find("tessera_moe_ep_check_status: null session"), std::string::npos) << last();
}

// Misaligned pointers of the MoE layers are named before the session is
// looked at: matrices 16-byte aligned, the routing 4-byte.
TEST(Capi, MoeLayersRejectMisalignedPointersNamingThem) {
  auto* p = reinterpret_cast<char*>(0x1000);
  const auto* ids = reinterpret_cast<const int32_t*>(0x2000);
  const auto* w = reinterpret_cast<const float*>(0x3000);
  struct Case {
    const void *x, *ids, *w, *gu, *dn, *out;
    std::string want;
  };
  const Case cases[] = {
      {p + 8, ids, w, p, p, p, "x_shard = 0x1008 is not 16-byte aligned"},
      {p, reinterpret_cast<const char*>(ids) + 2, w, p, p, p, "expert_ids = 0x2002 is not 4-byte aligned"},
      {p, ids, reinterpret_cast<const char*>(w) + 1, p, p, p, "weights = 0x3001 is not 4-byte aligned"},
      {p, ids, w, p + 4, p, p, "w_gate_up = 0x1004 is not 16-byte aligned"},
      {p, ids, w, p, p + 2, p, "w_down = 0x1002 is not 16-byte aligned"},
      {p, ids, w, p, p, p + 8, "out_shard = 0x1008 is not 16-byte aligned"},
  };
  for (const Case& c : cases) {
    const auto* cid = static_cast<const int32_t*>(c.ids);
    const auto* cw = static_cast<const float*>(c.w);
    void* out = const_cast<void*>(c.out);
    EXPECT_EQ(tessera_moe_tp_ex(nullptr, nullptr, c.x, cid, cw, c.gu, c.dn, out, 64, 256, 128, 8, 2, TESSERA_BF16, 0),
              -1);
    EXPECT_NE(last().find("tessera_moe_tp_ex: " + c.want), std::string::npos) << last();
    EXPECT_EQ(
        tessera_moe_ep_ex(nullptr, nullptr, c.x, cid, cw, c.gu, c.dn, out, 64, 256, 128, 8, 2, 0, TESSERA_BF16, 0), -1);
    EXPECT_NE(last().find("tessera_moe_ep_ex: " + c.want), std::string::npos) << last();
    int chosen = -7;
    EXPECT_EQ(tessera_moe_tp_resolve(nullptr, c.x, cid, cw, c.gu, c.dn, out, 64, 256, 128, 8, 2, TESSERA_BF16, &chosen),
              -1);
    EXPECT_NE(last().find("tessera_moe_tp_resolve: " + c.want), std::string::npos) << last();
  }
}

// The router checks its arguments before any launch, so these fail with a
// message on a machine without a GPU too; no tokens is a no-op.
TEST(Capi, MoeTopkGatingRejectsBadArgumentsNamingThem) {
  void* p = reinterpret_cast<void*>(0x1000);
  auto* ids = reinterpret_cast<int32_t*>(0x2000);
  auto* w = reinterpret_cast<float*>(0x3000);
  const char* fn = "tessera_moe_topk_gating: ";
  struct Case {
    int64_t tokens = 16, ld = 0;
    int experts = 8, k = 2, dtype = TESSERA_F32, renorm = 1;
    std::string want;
  };
  const Case bad[] = {
      {.tokens = -1, .want = "tokens = -1 out of range"},
      {.experts = 0, .want = "experts = 0 out of range [1, 1024]"},
      {.experts = 2000, .want = "experts = 2000 out of range"},
      {.k = 0, .want = "k = 0 out of range"},
      {.k = 9, .want = "k = 9 out of range [1, min(16, experts = 8)]"},
      {.ld = 4, .want = "ld_logits = 4 (0: experts, else >= experts = 8)"},
      {.dtype = 3, .want = "logits dtype code 3"},
      {.renorm = 2, .want = "renormalize = 2 (0 or 1)"},
  };
  for (const Case& c : bad) {
    EXPECT_EQ(tessera_moe_topk_gating(nullptr, p, ids, w, c.tokens, c.experts, c.k, c.ld, c.dtype, c.renorm), -1);
    EXPECT_NE(last().find(fn + c.want), std::string::npos) << "want '" << c.want << "', got: " << last();
  }
  EXPECT_EQ(tessera_moe_topk_gating(nullptr, p, nullptr, w, 16, 8, 2, 0, TESSERA_BF16, 1), -1);
  EXPECT_NE(last().find("expert_ids is null"), std::string::npos) << last();
  for (int dt : {TESSERA_F32, TESSERA_BF16, TESSERA_F16})
    EXPECT_EQ(tessera_moe_topk_gating(nullptr, p, ids, w, 0, 8, 2, 0, dt, 0), 0) << last();  // no tokens: no launch
}

TEST(Capi, VersionAndNcclVersions) {
  EXPECT_STRNE(tessera_version(), "unknown");
  int header = 0, runtime = 0;
  ASSERT_EQ(tessera_nccl_versions(&header, &runtime), 0) << last();
  EXPECT_GE(header, 22800);
  EXPECT_EQ(header, runtime) << "the loader picked another NCCL than the header's";
  EXPECT_EQ(tessera_nccl_versions(nullptr, &runtime), -1);
}

}  // namespace
