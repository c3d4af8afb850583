// GPU test of ops::moe_tp at the launched world size (1 on one GPU): every
// rank's output shard, for each strategy (sequential, pipelined, automatic)
// on a NaN-poisoned output, against a float64 CPU reference of the whole
// layer, under uniform and skewed routing (an expert with no tokens),
// shard-disjoint routing (each shard's tokens use experts no other shard
// uses: every per-shard grouped GEMM has empty experts) and concentrated
// routing (the last rank's tokens all go to experts 0..k-1, none to the
// others); and the status report of an invalid expert id.
#include <gtest/gtest.h>

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/gpu_group.hpp"
#include "support/test_support.hpp"
#include "tessera/ops/moe.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops {
namespace {

std::uint16_t bf16_bits(float v) {
  const __nv_bfloat16 h = __float2bfloat16_rn(v);
  std::uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
double bf16_value(std::uint16_t b) {
  __nv_bfloat16 h;
  std::memcpy(&h, &b, 2);
  return __bfloat162float(h);
}

struct Dev {
  void* p = nullptr;
  explicit Dev(std::size_t bytes) { TESSERA_CUDA_CHECK(cudaMalloc(&p, bytes > 16 ? bytes : 16)); }
  ~Dev() { cudaFree(p); }
  template <class T>
  void put(const std::vector<T>& h) {
    TESSERA_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
};

enum class Routing { uniform, skewed, shard_disjoint, concentrated };

struct Problem {
  std::int64_t T_local, H, I;  // I: the full intermediate size
  int E, k;
  Routing routing;
};

void run_case(const Problem& c) {
  runtime::ProcessGroup& pg = tessera::testing::group();
  const int R = pg.world(), rank = pg.rank();
  ASSERT_EQ(c.I % R, 0);
  ASSERT_TRUE(c.routing != Routing::shard_disjoint || c.E / R >= c.k) << "fewer than k experts per shard";
  const std::int64_t T = c.T_local * R, H = c.H, I = c.I, Il = c.I / R;
  std::mt19937 rng(2024 + c.E * 3 + c.k);  // the same problem on every rank
  std::normal_distribution<float> nd(0.f, 1.f);
  auto rounded = [&](float scale) { return static_cast<float>(bf16_value(bf16_bits(nd(rng) * scale))); };
  std::vector<float> x(T * H), gate(c.E * I * H), up(c.E * I * H), down(c.E * H * I);
  for (float& v : x) v = rounded(1.f);
  for (float& v : gate) v = rounded(1.f / std::sqrt(static_cast<float>(H)));
  for (float& v : up) v = rounded(1.f / std::sqrt(static_cast<float>(H)));
  for (float& v : down) v = rounded(1.f / std::sqrt(static_cast<float>(I)));
  std::vector<std::int32_t> ids(T * c.k);
  std::vector<float> w(T * c.k);
  const bool skewed = c.routing == Routing::skewed;
  for (std::int64_t t = 0; t < T; ++t) {
    float sum = 0;
    const int shard = static_cast<int>(t / c.T_local);
    for (int s = 0; s < c.k; ++s) {
      // Distinct experts per token; skewed: expert 0 takes one slot of most
      // tokens and the last expert gets none.
      int e = skewed && s == 0 && (rng() % 4 != 0) ? 0 : static_cast<int>(rng() % (c.E - (skewed ? 1 : 0)));
      for (int q = 0; q < s; ++q)
        if (ids[t * c.k + q] == e) e = (e + 1) % (c.E - (skewed ? 1 : 0)), q = -1;
      if (c.routing == Routing::shard_disjoint) {
        // Experts e with e % R == shard only (E / R >= k of them).
        const int own = c.E / R;
        e = static_cast<int>((rng() % own) * R + shard);
        for (int q = 0; q < s; ++q)
          if (ids[t * c.k + q] == e) e = ((e / R + 1) % own) * R + shard, q = -1;
      } else if (c.routing == Routing::concentrated && shard == R - 1) {
        e = s;  // experts 0..k-1
      }
      ids[t * c.k + s] = e;
      w[t * c.k + s] = 0.2f + static_cast<float>(rng() % 100) / 100.f;
      sum += w[t * c.k + s];
    }
    for (int s = 0; s < c.k; ++s) w[t * c.k + s] /= sum;
  }
  // This rank's shards.
  std::vector<std::uint16_t> xs(c.T_local * H), gu(c.E * 2 * Il * H), dn(c.E * H * Il);
  for (std::int64_t i = 0; i < c.T_local * H; ++i) xs[i] = bf16_bits(x[rank * c.T_local * H + i]);
  for (int e = 0; e < c.E; ++e)
    for (std::int64_t j = 0; j < Il; ++j)
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t gj = rank * Il + j;
        gu[(e * 2 * Il + 2 * j) * H + h] = bf16_bits(gate[(e * I + gj) * H + h]);
        gu[(e * 2 * Il + 2 * j + 1) * H + h] = bf16_bits(up[(e * I + gj) * H + h]);
      }
  for (int e = 0; e < c.E; ++e)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t j = 0; j < Il; ++j) dn[(e * H + h) * Il + j] = bf16_bits(down[(e * H + h) * I + rank * Il + j]);
  std::vector<std::int32_t> ids_l(ids.begin() + rank * c.T_local * c.k, ids.begin() + (rank + 1) * c.T_local * c.k);
  std::vector<float> w_l(w.begin() + rank * c.T_local * c.k, w.begin() + (rank + 1) * c.T_local * c.k);
  Dev dx(xs.size() * 2), dgu(gu.size() * 2), ddn(dn.size() * 2), dids(ids_l.size() * 4), dw(w_l.size() * 4),
      dout(c.T_local * H * 2);
  dx.put(xs);
  dgu.put(gu);
  ddn.put(dn);
  dids.put(ids_l);
  dw.put(w_l);
  MoeContext ctx(pg);
  MoeTpArgs a;
  a.x_shard = dx.p;
  a.expert_ids = static_cast<const std::int32_t*>(dids.p);
  a.weights = static_cast<const float*>(dw.p);
  a.w_gate_up = dgu.p;
  a.w_down = ddn.p;
  a.out_shard = dout.p;
  a.tokens_local = c.T_local;
  a.hidden = H;
  a.inter_local = Il;
  a.experts = c.E;
  a.topk = c.k;
  // Reference: the whole layer in float64 over the full I.
  std::vector<double> want;
  std::vector<double> hbuf(I);
  for (std::int64_t tl = 0; tl < c.T_local; ++tl) {
    const std::int64_t t = rank * c.T_local + tl;
    std::vector<double> o(H, 0.0);
    for (int s = 0; s < c.k; ++s) {
      const int e = ids[t * c.k + s];
      for (std::int64_t j = 0; j < I; ++j) {
        double g = 0, u = 0;
        for (std::int64_t h = 0; h < H; ++h) {
          g += static_cast<double>(gate[(e * I + j) * H + h]) * x[t * H + h];
          u += static_cast<double>(up[(e * I + j) * H + h]) * x[t * H + h];
        }
        hbuf[j] = g / (1.0 + std::exp(-g)) * u;
      }
      for (std::int64_t h = 0; h < H; ++h) {
        double acc = 0;
        for (std::int64_t j = 0; j < I; ++j) acc += static_cast<double>(down[(e * H + h) * I + j]) * hbuf[j];
        o[h] += w[t * c.k + s] * acc;
      }
    }
    for (std::int64_t h = 0; h < H; ++h) want.push_back(o[h]);
  }
  // Each strategy with the gather inside the gate/up GEMM's loads (the
  // default) and with the gather kernel: the same bits (same rows, same
  // arithmetic).
  const std::pair<Strategy, bool> strategies[] = {{Strategy::sequential, true},
                                                  {Strategy::sequential, false},
                                                  {Strategy::pipelined, true},
                                                  {Strategy::pipelined, false},
                                                  {Strategy::automatic, true}};
  std::vector<std::uint16_t> fused_out;
  for (const auto& [st, fused_gather] : strategies) {
    // NaN poison, ordered before the call on its stream.
    TESSERA_CUDA_CHECK(cudaMemsetAsync(dout.p, 0xFF, c.T_local * H * 2, pg.stream()));
    MoeTpOptions o;
    o.strategy = st;
    o.fused_gather = fused_gather;
    o.use_cache = false;  // automatic: measured here, no cache file written
    moe_tp(ctx, a, o);
    ctx.check_status();
    std::vector<std::uint16_t> out(c.T_local * H);
    TESSERA_CUDA_CHECK(cudaMemcpy(out.data(), dout.p, out.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<double> got;
    for (std::uint16_t v : out) got.push_back(bf16_value(v));
    const double err = tessera::testing::relative_error(got, want);
    EXPECT_LT(err, 2e-2) << "rank " << rank << " of " << R << ", strategy " << strategy_name(st)
                         << (fused_gather ? "" : ", gather kernel");
    if (st == Strategy::automatic) continue;
    if (fused_gather)
      fused_out = out;
    else
      EXPECT_TRUE(out == fused_out) << "rank " << rank << " of " << R << ", strategy " << strategy_name(st)
                                    << ": the gather kernel and the gathering GEMM differ";
  }
  // Part 2 in column chunks adds the same terms in the same order per
  // element, and both transports move the same bytes: bitwise equal to one
  // chunk over NCCL. The copy engine runs twice to cross a call boundary
  // (its flags and buffer reuse carry the epoch).
  std::vector<std::uint16_t> reference;
  const std::pair<int, MoeTransport> variants[] = {{1, MoeTransport::nccl},        {2, MoeTransport::nccl},
                                                   {4, MoeTransport::nccl},        {1, MoeTransport::copy_engine},
                                                   {4, MoeTransport::copy_engine}, {4, MoeTransport::copy_engine},
                                                   {2, MoeTransport::automatic}};
  for (const auto& [chunks, transport] : variants) {
    if (transport == MoeTransport::copy_engine && !pg.lsa_reachable()) continue;
    TESSERA_CUDA_CHECK(cudaMemsetAsync(dout.p, 0xFF, c.T_local * H * 2, pg.stream()));
    MoeTpOptions o;
    o.strategy = Strategy::pipelined;
    o.rs_chunks = chunks;
    o.transport = transport;
    moe_tp(ctx, a, o);
    ctx.check_status();
    std::vector<std::uint16_t> out(c.T_local * H);
    TESSERA_CUDA_CHECK(cudaMemcpy(out.data(), dout.p, out.size() * 2, cudaMemcpyDeviceToHost));
    if (reference.empty())
      reference = out;
    else
      EXPECT_TRUE(out == reference) << "rank " << rank << " of " << R << ": pipelined with " << chunks
                                    << " column chunks, transport " << static_cast<int>(transport)
                                    << ", differs from one chunk over NCCL";
  }
}

TEST(MoeTp, UniformRoutingMatchesReference) {
  TESSERA_REQUIRE_WORLD_GPUS(1);
  run_case({96, 256, 256, 8, 2, Routing::uniform});
}

TEST(MoeTp, SkewedRoutingWithAnIdleExpertMatchesReference) {
  TESSERA_REQUIRE_WORLD_GPUS(1);
  run_case({130, 192, 128, 6, 3, Routing::skewed});
}

TEST(MoeTp, ShardDisjointRoutingMatchesReference) {
  TESSERA_REQUIRE_WORLD_GPUS(1);
  // E / R >= k experts per shard at any world size.
  const int R = tessera::testing::group().world();
  run_case({72, 128, 128, std::max(8, 2 * R), 2, Routing::shard_disjoint});
}

TEST(MoeTp, ConcentratedRoutingOfTheLastRankMatchesReference) {
  TESSERA_REQUIRE_WORLD_GPUS(1);
  run_case({80, 128, 256, 8, 2, Routing::concentrated});
}

/// A small moe_tp call on zero activations and weights: H 64, inter 32, E 4
/// experts, top-2, one token per two entries of `ids` (each entry's weight
/// 0.5); weights allocated for `weight_experts` experts.
struct ZeroTpCall {
  static constexpr std::int64_t H = 64, Il = 32;
  static constexpr int E = 4, k = 2;
  const std::int64_t T;
  Dev dx, dgu, ddn, dids, dw, dout;
  MoeTpArgs a;
  explicit ZeroTpCall(const std::vector<std::int32_t>& ids, int weight_experts = E)
      : T(static_cast<std::int64_t>(ids.size()) / k),
        dx(T * H * 2),
        dgu(weight_experts * 2 * Il * H * 2),
        ddn(weight_experts * H * Il * 2),
        dids(ids.size() * 4),
        dw(ids.size() * 4),
        dout(T * H * 2) {
    TESSERA_CUDA_CHECK(cudaMemset(dx.p, 0, T * H * 2));
    TESSERA_CUDA_CHECK(cudaMemset(dgu.p, 0, weight_experts * 2 * Il * H * 2));
    TESSERA_CUDA_CHECK(cudaMemset(ddn.p, 0, weight_experts * H * Il * 2));
    dids.put(ids);
    dw.put(std::vector<float>(ids.size(), 0.5f));
    a.x_shard = dx.p;
    a.expert_ids = static_cast<const std::int32_t*>(dids.p);
    a.weights = static_cast<const float*>(dw.p);
    a.w_gate_up = dgu.p;
    a.w_down = ddn.p;
    a.out_shard = dout.p;
    a.tokens_local = T;
    a.hidden = H;
    a.inter_local = Il;
    a.experts = E;
    a.topk = k;
  }
};

TEST(MoeTp, PipelinedReportsInvalidIdsOfAPeerShard) {
  TESSERA_REQUIRE_WORLD_GPUS(1);
  runtime::ProcessGroup& pg = tessera::testing::group();
  std::vector<std::int32_t> ids(48 * ZeroTpCall::k, 2);
  if (pg.rank() == pg.world() - 1) ids[3] = -1;  // one bad id on the last rank only
  const ZeroTpCall call(ids);
  const MoeTpArgs& a = call.a;
  MoeContext ctx(pg);
  MoeTpOptions o;
  o.strategy = Strategy::pipelined;
  moe_tp(ctx, a, o);
  // Every rank sorts every shard's routing, so every rank reports it.
  EXPECT_THROW(ctx.check_status(), tessera::Error);
  o.strategy = Strategy::fused_ce;  // not a moe_tp strategy
  EXPECT_THROW(moe_tp(ctx, a, o), tessera::Error);
  o.strategy = Strategy::pipelined;
  o.comm_ctas = 0;
  EXPECT_THROW(moe_tp(ctx, a, o), tessera::Error);
}

TEST(MoeTp, InvalidExpertIdIsReportedAfterTheCall) {
  TESSERA_REQUIRE_WORLD_GPUS(1);
  runtime::ProcessGroup& pg = tessera::testing::group();
  const int E = ZeroTpCall::E;
  std::vector<std::int32_t> ids(64 * ZeroTpCall::k, 1);
  ids[5] = E + 3;  // out of range
  const ZeroTpCall call(ids);
  MoeTpArgs a = call.a;
  MoeContext ctx(pg);
  moe_tp(ctx, a);
  EXPECT_THROW(ctx.check_status(), tessera::Error);
  a.topk = E + 1;  // more slots than experts
  EXPECT_THROW(moe_tp(ctx, a), tessera::Error);
}

// Issue 22: mismatched expert counts (or transports) across ranks are
// rejected on every rank by the cross-rank check, before any launch.
TEST(MoeTp, MismatchedExpertCountsOrTransportsAreRejectedOnEveryRank) {
  TESSERA_REQUIRE_WORLD_GPUS(2);
  runtime::ProcessGroup& pg = tessera::testing::group();
  const int E = ZeroTpCall::E;
  // Weights sized for 2E experts, so the larger count is a valid call on its own.
  const ZeroTpCall call(std::vector<std::int32_t>(64 * ZeroTpCall::k, 1), 2 * E);
  const MoeTpArgs& a = call.a;
  for (Strategy s : {Strategy::sequential, Strategy::pipelined}) {
    MoeContext ctx(pg);
    MoeTpArgs mine = a;
    if (pg.rank() == 1) mine.experts = 2 * E;
    MoeTpOptions o;
    o.strategy = s;
    try {
      moe_tp(ctx, mine, o);
      ADD_FAILURE() << "mismatched expert counts accepted (strategy " << strategy_name(s) << ")";
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find("differs between ranks"), std::string::npos) << e.what();
    }
  }
  if (pg.lsa_reachable()) {
    MoeContext ctx(pg);
    MoeTpOptions o;
    o.strategy = Strategy::pipelined;
    o.transport = pg.rank() == 1 ? MoeTransport::nccl : MoeTransport::copy_engine;
    try {
      moe_tp(ctx, a, o);
      ADD_FAILURE() << "mismatched transports accepted";
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find("differs between ranks"), std::string::npos) << e.what();
    }
  }
}

// The copy-engine transport cannot be captured (its flags carry a per-call
// epoch): asked for inside a capture it is refused with that reason before
// anything is queued, so the capture ends cleanly, and the next eager call
// runs.
TEST(MoeTp, CopyEngineTransportIsRefusedUnderCapture) {
  TESSERA_REQUIRE_WORLD_GPUS(2);
  runtime::ProcessGroup& pg = tessera::testing::group();
  if (!pg.lsa_reachable()) GTEST_SKIP() << "the copy-engine transport needs every rank load/store reachable";
  const ZeroTpCall call(std::vector<std::int32_t>(64 * ZeroTpCall::k, 1));
  const MoeTpArgs& a = call.a;
  MoeContext ctx(pg);
  MoeTpOptions o;
  o.strategy = Strategy::pipelined;
  o.transport = MoeTransport::copy_engine;
  moe_tp(ctx, a, o);  // eager: buffers and flags exist before the capture
  pg.synchronize(pg.stream(), "moe_tp capture test: eager call");
  tessera::testing::expect_refused_under_capture(
      pg, [&] { moe_tp(ctx, a, o); }, "cannot be captured");
  moe_tp(ctx, a, o);
  pg.synchronize(pg.stream(), "moe_tp capture test: eager call after the capture");
  EXPECT_NO_THROW(ctx.check_status());
}

TEST(MoeTp, ValidateRejectsBadShapes) {
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
  a.hidden = 60;  // not a multiple of 8
  EXPECT_THROW(validate(a, 2), tessera::Error);
  a.hidden = 64;
  a.experts = 0;
  EXPECT_THROW(validate(a, 2), tessera::Error);
  a.experts = 4;
  a.tokens_local = std::int64_t{1} << 40;
  EXPECT_THROW(validate(a, 2), tessera::Error);
}

}  // namespace
}  // namespace tessera::ops
