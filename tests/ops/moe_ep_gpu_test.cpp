// GPU test of ops::moe_ep at the launched world size (1 on one GPU): every
// rank's output against a float64 CPU reference of the whole layer for its
// own tokens, both strategies, under uniform routing, skewed routing (a hot
// expert; at R > 1 the last rank's experts, so that rank, get no token;
// ragged token counts), a capacity overflow and an invalid expert id
// reported by check_status(), and bad input refused before any launch
// (the host-only checks: moe_ep_cpu_test.cpp).
#include <gtest/gtest.h>

#include <cuda_bf16.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/gpu_group.hpp"
#include "support/test_support.hpp"
#include "tessera/ops/moe_ep.hpp"
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
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T>
  void put(const std::vector<T>& h) {
    if (!h.empty()) TESSERA_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
};

enum class Routing { uniform, skewed };

struct Problem {
  std::int64_t T_local, H, I;
  int E, k;
  Routing routing;
  std::int64_t ragged = 0;  ///< rank r holds T_local + ragged * r tokens (needs an explicit capacity)
};

/// The global problem every rank builds from one seed, and one rank's view.
struct Layer {
  int R = 1, rank = 0;
  Problem c{};
  std::vector<std::int64_t> t0;  ///< first global token of each rank, t0[R] = total
  std::vector<float> x, gate, up, down, w;
  std::vector<std::int32_t> ids;

  Layer(const Problem& p, int world, int me) : R(world), rank(me), c(p) {
    t0.assign(R + 1, 0);
    for (int r = 0; r < R; ++r) t0[r + 1] = t0[r] + c.T_local + c.ragged * r;
    const std::int64_t T = t0[R], H = c.H, I = c.I;
    std::mt19937 rng(4242 + c.E * 7 + c.k + static_cast<int>(c.routing));
    std::normal_distribution<float> nd(0.f, 1.f);
    auto rounded = [&](float scale) { return static_cast<float>(bf16_value(bf16_bits(nd(rng) * scale))); };
    x.resize(T * H);
    gate.resize(c.E * I * H);
    up.resize(c.E * I * H);
    down.resize(c.E * H * I);
    for (float& v : x) v = rounded(1.f);
    for (float& v : gate) v = rounded(1.f / std::sqrt(static_cast<float>(H)));
    for (float& v : up) v = rounded(1.f / std::sqrt(static_cast<float>(H)));
    for (float& v : down) v = rounded(1.f / std::sqrt(static_cast<float>(I)));
    // Skewed: expert 0 takes slot 0 of 3 tokens in 4; at R > 1 the experts of
    // the last rank get nothing (a rank that receives no token), at R = 1 the
    // last quarter of the experts.
    const int El = c.E / R;
    const int live = c.routing == Routing::skewed ? (R > 1 ? c.E - El : c.E - c.E / 4) : c.E;
    ids.resize(T * c.k);
    w.resize(T * c.k);
    for (std::int64_t t = 0; t < T; ++t) {
      float sum = 0;
      for (int s = 0; s < c.k; ++s) {
        int e = c.routing == Routing::skewed && s == 0 && rng() % 4 != 0 ? 0 : static_cast<int>(rng() % live);
        for (int q = 0; q < s; ++q)
          if (ids[t * c.k + q] == e) e = (e + 1) % live, q = -1;
        ids[t * c.k + s] = e;
        w[t * c.k + s] = 0.2f + static_cast<float>(rng() % 100) / 100.f;
        sum += w[t * c.k + s];
      }
      for (int s = 0; s < c.k; ++s) w[t * c.k + s] /= sum;
    }
  }
  std::int64_t tokens_local() const { return t0[rank + 1] - t0[rank]; }
  /// Rows this rank sends to its busiest destination (the lossless capacity).
  std::int64_t max_pair_rows() const {
    const int El = c.E / R;
    std::int64_t best = 0;
    for (int src = 0; src < R; ++src) {
      std::vector<std::int64_t> n(R, 0);
      for (std::int64_t i = t0[src] * c.k; i < t0[src + 1] * c.k; ++i) ++n[ids[i] / El];
      for (std::int64_t v : n) best = std::max(best, v);
    }
    return best;
  }

  /// Reference output of this rank's tokens (float64 over bf16-rounded inputs).
  std::vector<double> reference() const {
    const std::int64_t H = c.H, I = c.I;
    std::vector<double> want, hbuf(I);
    for (std::int64_t t = t0[rank]; t < t0[rank + 1]; ++t) {
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
      want.insert(want.end(), o.begin(), o.end());
    }
    return want;
  }
};

/// One rank's device buffers for a Layer.
struct Buffers {
  Dev x, gu, dn, ids, w, out;
  std::int64_t Tl;
  explicit Buffers(const Layer& L)
      : x(L.tokens_local() * L.c.H * 2),
        gu((L.c.E / L.R) * 2 * L.c.I * L.c.H * 2),
        dn((L.c.E / L.R) * L.c.H * L.c.I * 2),
        ids(L.tokens_local() * L.c.k * 4),
        w(L.tokens_local() * L.c.k * 4),
        out(L.tokens_local() * L.c.H * 2),
        Tl(L.tokens_local()) {
    const std::int64_t H = L.c.H, I = L.c.I, El = L.c.E / L.R, k = L.c.k;
    std::vector<std::uint16_t> xs(Tl * H), gus(El * 2 * I * H), dns(El * H * I);
    for (std::int64_t i = 0; i < Tl * H; ++i) xs[i] = bf16_bits(L.x[L.t0[L.rank] * H + i]);
    for (std::int64_t el = 0; el < El; ++el) {
      const std::int64_t e = L.rank * El + el;
      for (std::int64_t j = 0; j < I; ++j)
        for (std::int64_t h = 0; h < H; ++h) {
          gus[(el * 2 * I + 2 * j) * H + h] = bf16_bits(L.gate[(e * I + j) * H + h]);
          gus[(el * 2 * I + 2 * j + 1) * H + h] = bf16_bits(L.up[(e * I + j) * H + h]);
        }
      for (std::int64_t i = 0; i < H * I; ++i) dns[el * H * I + i] = bf16_bits(L.down[e * H * I + i]);
    }
    x.put(xs);
    gu.put(gus);
    dn.put(dns);
    ids.put(std::vector<std::int32_t>(L.ids.begin() + L.t0[L.rank] * k, L.ids.begin() + L.t0[L.rank + 1] * k));
    w.put(std::vector<float>(L.w.begin() + L.t0[L.rank] * k, L.w.begin() + L.t0[L.rank + 1] * k));
  }
  MoeEpArgs args(const Layer& L, std::int64_t capacity) const {
    MoeEpArgs a;
    a.x_shard = x.p;
    a.expert_ids = static_cast<const std::int32_t*>(ids.p);
    a.weights = static_cast<const float*>(w.p);
    a.w_gate_up = gu.p;
    a.w_down = dn.p;
    a.out_shard = out.p;
    a.tokens_local = Tl;
    a.hidden = L.c.H;
    a.inter = L.c.I;
    a.experts = L.c.E;
    a.topk = L.c.k;
    a.capacity = capacity;
    return a;
  }
  std::vector<double> output(std::int64_t H) const {
    std::vector<std::uint16_t> o(Tl * H);
    if (!o.empty()) TESSERA_CUDA_CHECK(cudaMemcpy(o.data(), out.p, o.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<double> got(o.size());
    for (std::size_t i = 0; i < o.size(); ++i) got[i] = bf16_value(o[i]);
    return got;
  }
};

void poison(const Buffers& b, std::int64_t H) {
  if (b.Tl > 0) TESSERA_CUDA_CHECK(cudaMemset(b.out.p, 0xFF, static_cast<std::size_t>(b.Tl * H) * 2));  // NaN
}

double relative_error_or_zero(const std::vector<double>& got, const std::vector<double>& want) {
  return want.empty() ? 0.0 : tessera::testing::relative_error(got, want);
}

/// Runs both strategies on `p` (capacity 0 = the default; -1 = the busiest
/// pair's exact row count) and checks each against the reference.
void run_case(const Problem& p, std::int64_t capacity) {
  runtime::ProcessGroup& pg = tessera::testing::group();
  const int R = pg.world(), rank = pg.rank();
  ASSERT_EQ(p.E % R, 0);
  const Layer L(p, R, rank);
  const Buffers b(L);
  const std::vector<double> want = L.reference();
  const std::int64_t cap = capacity < 0 ? L.max_pair_rows() : capacity;
  MoeEpContext ctx(pg);
  for (MoeEpStrategy s : {MoeEpStrategy::sequential, MoeEpStrategy::pipelined, MoeEpStrategy::automatic}) {
    poison(b, p.H);
    MoeEpOptions o;
    o.strategy = s;
    moe_ep(ctx, b.args(L, cap), o);
    ctx.check_status();
    const double err = relative_error_or_zero(b.output(p.H), want);
    EXPECT_LT(err, 2e-2) << "strategy " << moe_ep_strategy_name(s) << ", rank " << rank << " of " << R << ", capacity "
                         << cap;
  }
  // Both transports move the same bytes into the same slabs: bitwise equal.
  // The copy engine runs twice to cross a call boundary (epochs, slab reuse).
  std::vector<double> over_nccl;
  for (MoeTransport t : {MoeTransport::nccl, MoeTransport::copy_engine, MoeTransport::copy_engine}) {
    if (t == MoeTransport::copy_engine && !pg.lsa_reachable()) continue;
    poison(b, p.H);
    MoeEpOptions o;
    o.strategy = MoeEpStrategy::pipelined;
    o.transport = t;
    moe_ep(ctx, b.args(L, cap), o);
    ctx.check_status();
    const std::vector<double> got = b.output(p.H);
    if (t == MoeTransport::nccl)
      over_nccl = got;
    else
      EXPECT_TRUE(got == over_nccl) << "rank " << rank << " of " << R
                                    << ": the copy-engine transport differs from NCCL's";
  }
}

TEST(MoeEp, UniformRoutingMatchesReference) {
  TESSERA_REQUIRE_WORLD_GPUS(1);
  run_case({96, 256, 128, 8, 2, Routing::uniform}, 0);
}

TEST(MoeEp, SkewedRoutingWithIdleExpertsAndAnIdleRankMatchesReference) {
  TESSERA_REQUIRE_WORLD_GPUS(1);
  run_case({130, 192, 128, 8, 3, Routing::skewed}, 0);
}

TEST(MoeEp, RaggedTokensAtTheExactCapacityMatchReference) {
  TESSERA_REQUIRE_WORLD_GPUS(1);
  // Rank r holds 72 + 24 r tokens; the capacity is the busiest pair's rows.
  run_case({72, 128, 64, 8, 2, Routing::skewed, 24}, -1);
}

TEST(MoeEp, CapacityOverflowIsReportedAndTheNextCallIsClean) {
  TESSERA_REQUIRE_WORLD_GPUS(1);
  runtime::ProcessGroup& pg = tessera::testing::group();
  const Problem p{64, 64, 32, 8, 2, Routing::skewed};
  const Layer L(p, pg.world(), pg.rank());
  const Buffers b(L);
  MoeEpContext ctx(pg);
  // The hot expert 0 (rank 0) receives about 3/4 of every rank's tokens in
  // slot 0 alone: a quarter of tokens_local * topk overflows on every rank.
  const std::int64_t small = p.T_local * p.k / 4;
  for (MoeEpStrategy s : {MoeEpStrategy::sequential, MoeEpStrategy::pipelined}) {
    MoeEpOptions o;
    o.strategy = s;
    moe_ep(ctx, b.args(L, small), o);
    try {
      ctx.check_status();
      ADD_FAILURE() << "no overflow reported (strategy " << moe_ep_strategy_name(s) << ")";
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find("capacity overflow"), std::string::npos) << e.what();
    }
    poison(b, p.H);
    moe_ep(ctx, b.args(L, 0), o);
    EXPECT_NO_THROW(ctx.check_status());
    EXPECT_LT(relative_error_or_zero(b.output(p.H), L.reference()), 2e-2) << moe_ep_strategy_name(s);
  }
}

TEST(MoeEp, InvalidExpertIdIsReportedAfterTheCall) {
  TESSERA_REQUIRE_WORLD_GPUS(1);
  runtime::ProcessGroup& pg = tessera::testing::group();
  const Problem p{32, 64, 32, 8, 2, Routing::uniform};
  const Layer L(p, pg.world(), pg.rank());
  Buffers b(L);
  std::vector<std::int32_t> ids(L.ids.begin() + L.t0[pg.rank()] * p.k, L.ids.begin() + L.t0[pg.rank() + 1] * p.k);
  ids[5] = p.E + 3;  // out of range
  b.ids.put(ids);
  MoeEpContext ctx(pg);
  MoeEpArgs a = b.args(L, 0);
  moe_ep(ctx, a);
  EXPECT_THROW(ctx.check_status(), tessera::Error);
  a.topk = p.E + 1;  // more slots than experts
  EXPECT_THROW(moe_ep(ctx, a), tessera::Error);
}

TEST(MoeEp, MismatchedExpertCountsAreRejectedOnEveryRank) {
  TESSERA_REQUIRE_WORLD_GPUS(2);
  runtime::ProcessGroup& pg = tessera::testing::group();
  const Problem p{32, 64, 32, 8, 2, Routing::uniform};
  const Layer L(p, pg.world(), pg.rank());
  const Buffers b(L);
  MoeEpContext ctx(pg);
  MoeEpArgs a = b.args(L, 0);
  if (pg.rank() == 1) a.experts = 2 * p.E;  // still a multiple of R: only the cross-rank check catches it
  EXPECT_THROW(moe_ep(ctx, a), tessera::Error);
}

// The transport is part of the cross-rank check too: ranks on different
// transports would wait for flags or receives that never come.
TEST(MoeEp, MismatchedTransportsAreRejectedOnEveryRank) {
  TESSERA_REQUIRE_WORLD_GPUS(2);
  runtime::ProcessGroup& pg = tessera::testing::group();
  if (!pg.lsa_reachable()) GTEST_SKIP() << "the copy-engine transport needs every rank load/store reachable";
  const Problem p{32, 64, 32, 8, 2, Routing::uniform};
  const Layer L(p, pg.world(), pg.rank());
  const Buffers b(L);
  MoeEpContext ctx(pg);
  MoeEpOptions o;
  o.strategy = MoeEpStrategy::pipelined;
  o.transport = pg.rank() == 1 ? MoeTransport::nccl : MoeTransport::copy_engine;
  try {
    moe_ep(ctx, b.args(L, 0), o);
    ADD_FAILURE() << "mismatched transports accepted";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("differs between ranks"), std::string::npos) << e.what();
  }
}

// As moe_tp's: the copy-engine transport is refused inside a capture before
// anything is queued; the capture ends cleanly and the next eager call runs.
TEST(MoeEp, CopyEngineTransportIsRefusedUnderCapture) {
  TESSERA_REQUIRE_WORLD_GPUS(2);
  runtime::ProcessGroup& pg = tessera::testing::group();
  if (!pg.lsa_reachable()) GTEST_SKIP() << "the copy-engine transport needs every rank load/store reachable";
  const Problem p{32, 64, 32, 8, 2, Routing::uniform};
  const Layer L(p, pg.world(), pg.rank());
  const Buffers b(L);
  MoeEpContext ctx(pg);
  MoeEpOptions o;
  o.strategy = MoeEpStrategy::pipelined;
  o.transport = MoeTransport::copy_engine;
  moe_ep(ctx, b.args(L, 0), o);  // eager: slabs and flags exist before the capture
  pg.synchronize(pg.stream(), "moe_ep capture test: eager call");
  tessera::testing::expect_refused_under_capture(
      pg, [&] { moe_ep(ctx, b.args(L, 0), o); }, "cannot be captured");
  moe_ep(ctx, b.args(L, 0), o);
  pg.synchronize(pg.stream(), "moe_ep capture test: eager call after the capture");
  EXPECT_NO_THROW(ctx.check_status());
}

}  // namespace
}  // namespace tessera::ops
