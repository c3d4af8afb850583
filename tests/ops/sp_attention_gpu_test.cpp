// GPU test of ops::sp_attention at the launched world size (the device build
// runs it at R = 1; with R > 1 it needs `tessera run -n R`): both strategies
// against whole-sequence attention computed locally on the same global
// tensors (every rank draws them from one seed). Sequential runs the plain
// kernel over the zig-zag parts and must match bitwise; fused_ce at R = 1 runs
// the same kernels (bitwise too), at R > 1 the hooked kernel with its own
// block width (within tolerance, LSE to 1e-3). Two calls in a row exercise the
// epochs; automatic (tuned afresh, no cache) follows with the strategy it
// picked, which must be no slower than sequential as measured. Bad input is
// rejected before launch.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>
#include <algorithm>

#include "support/device_buffers.hpp"
#include "support/gpu_group.hpp"
#include "support/test_support.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/ops/sp_attention.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

using namespace tessera;
namespace tk = tessera::kernels;

using tessera::testing::bf16_to_float;
using tessera::testing::DeviceBuffer;
using tessera::testing::download;
using tessera::testing::group;
using tessera::testing::hopper_skip_reason;

namespace {

ops::SpAttnContext& ctx() {
  static std::unique_ptr<ops::SpAttnContext> c = std::make_unique<ops::SpAttnContext>(group());
  return *c;
}

}  // namespace

TEST(SpAttentionGpu, StrategiesMatchWholeSequenceAttention) {
  std::string why;
  if (hopper_skip_reason(&why)) GTEST_SKIP() << why;
  runtime::ProcessGroup& pg = group();
  const int R = pg.world(), rank = pg.rank();
  const int64_t B = 2, C = 256, S = 2 * R * C, L = 2 * C, H = 4, Hkv = 2, D = 128;
  std::mt19937_64 rng(20261124);  // the same global tensors on every rank
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t nq = B * S * H * D, nk = B * S * Hkv * D;
  DeviceBuffer q(nq * 2), k(nk * 2), v(nk * 2), o(nq * 2), lse(B * H * S * 4);
  for (auto [buf, n] : {std::pair{&q, nq}, std::pair{&k, nk}, std::pair{&v, nk}}) {
    std::vector<__nv_bfloat16> h(n);
    for (auto& x : h) x = __float2bfloat16(nd(rng));
    TESSERA_CUDA_CHECK(cudaMemcpy(buf->p, h.data(), n * 2, cudaMemcpyHostToDevice));
  }
  const ops::SpAttnPlan plan = ops::plan_sp_attention(S, R, rank, true);
  DeviceBuffer sq(B * L * H * D * 2), sk(B * L * Hkv * D * 2), sv(B * L * Hkv * D * 2), so(B * L * H * D * 2),
      slse(B * H * L * 4);
  for (auto [dst, src, heads] : {std::tuple{&sq, &q, H}, std::tuple{&sk, &k, Hkv}, std::tuple{&sv, &v, Hkv}}) {
    const size_t row = heads * D * 2;
    for (int i = 0; i < 2; ++i)
      TESSERA_CUDA_CHECK(cudaMemcpy2D(static_cast<char*>(dst->p) + i * C * row, L * row,
                                      static_cast<const char*>(src->p) + plan.chunks[i] * C * row, S * row, C * row, B,
                                      cudaMemcpyDeviceToDevice));
  }
  for (bool causal : {true, false}) {
    tk::AttentionArgs full;
    full.q = q.p;
    full.k = k.p;
    full.v = v.p;
    full.o = o.p;
    full.lse = static_cast<float*>(lse.p);
    full.batch = B;
    full.seqlen_q = full.seqlen_k = S;
    full.heads_q = H;
    full.heads_kv = Hkv;
    full.head_dim = D;
    full.causal = causal;
    tk::attention(full);
    const auto o_full = download<uint16_t>(o.p, nq);
    const auto lse_full = download<float>(lse.p, B * H * S);
    // Strategies alternate so every transition between their protocols runs.
    std::vector<ops::SpStrategy> order{ops::SpStrategy::sequential, ops::SpStrategy::fused_ce,
                                       ops::SpStrategy::ring,       ops::SpStrategy::fused_ce,
                                       ops::SpStrategy::ring,       ops::SpStrategy::sequential};
    const bool heads_divide = H % R == 0 && Hkv % R == 0;
    if (heads_divide) order.insert(order.end(), {ops::SpStrategy::ulysses, ops::SpStrategy::fused_ce});
    order.push_back(ops::SpStrategy::automatic);
    for (ops::SpStrategy s : order) {
      ops::SpAttnOptions opt;
      opt.strategy = s;
      opt.use_cache = false;
      TESSERA_CUDA_CHECK(cudaMemset(so.p, 0xFF, B * L * H * D * 2));
      TESSERA_CUDA_CHECK(cudaMemset(slse.p, 0xFF, B * H * L * 4));
      TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
      ops::SpAttnArgs a;
      a.q = sq.p;
      a.k = sk.p;
      a.v = sv.p;
      a.o = so.p;
      a.lse = static_cast<float*>(slse.p);
      a.batch = B;
      a.seq = S;
      a.heads_q = H;
      a.heads_kv = Hkv;
      a.head_dim = D;
      a.causal = causal;
      ops::TuneReport report;
      const ops::SpStrategy ran = ops::resolve_sp_attention(ctx(), a, opt, &report);
      if (s == ops::SpStrategy::automatic) {
        const std::vector<ops::Strategy> cands = ops::sp_attention_candidates(R, pg.lsa_reachable(), heads_divide);
        EXPECT_NE(std::find(cands.begin(), cands.end(), static_cast<ops::Strategy>(ran)), cands.end())
            << ops::sp_strategy_name(ran);
        if (R == 1) EXPECT_EQ(ran, ops::SpStrategy::sequential) << "nothing to measure at R = 1";
        if (!report.times_ms.empty()) {
          ASSERT_TRUE(report.times_ms.count(ops::Strategy::sequential));
          EXPECT_LE(report.times_ms[static_cast<ops::Strategy>(ran)], report.times_ms[ops::Strategy::sequential]);
        }
        pg.synchronize(pg.stream(), "sp_attention test: tuning");
        TESSERA_CUDA_CHECK(cudaMemset(so.p, 0xFF, B * L * H * D * 2));
        TESSERA_CUDA_CHECK(cudaMemset(slse.p, 0xFF, B * H * L * 4));
        TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
      } else {
        EXPECT_EQ(ran, s);
      }
      // The sequential gather runs the whole-sequence kernel's K order;
      // the others merge or split differently.
      const bool exact_order = ran == ops::SpStrategy::sequential;
      ops::sp_attention(ctx(), a, opt);
      pg.synchronize(pg.stream(), "sp_attention test");
      const auto o_sh = download<uint16_t>(so.p, B * L * H * D);
      const auto lse_sh = download<float>(slse.p, B * H * L);
      const bool bitwise = exact_order || R == 1;
      int64_t o_diff = 0, lse_diff = 0;
      double num = 0, den = 0, lse_err = 0;
      const size_t row = H * D;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < L; ++i) {
          const int64_t g = plan.global_row(i);
          const uint16_t* x = &o_sh[(b * L + i) * row];
          const uint16_t* y = &o_full[(b * S + g) * row];
          o_diff += std::memcmp(x, y, row * 2) != 0;
          for (size_t j = 0; j < row; ++j) {
            num += (bf16_to_float(x[j]) - bf16_to_float(y[j])) * (bf16_to_float(x[j]) - bf16_to_float(y[j]));
            den += bf16_to_float(y[j]) * bf16_to_float(y[j]);
          }
          for (int64_t h = 0; h < H; ++h) {
            const float l0 = lse_sh[(b * H + h) * L + i], l1 = lse_full[(b * H + h) * S + g];
            lse_diff += std::memcmp(&l0, &l1, 4) != 0;
            lse_err = std::max(lse_err, static_cast<double>(std::abs(l0 - l1)));
          }
        }
      const std::string what = std::string(ops::sp_strategy_name(s)) + " (" + std::string(ops::sp_strategy_name(ran)) +
                               ")" + (causal ? " causal" : "") + " rank " + std::to_string(rank) + "/" +
                               std::to_string(R);
      if (bitwise) {
        EXPECT_EQ(o_diff, 0) << what << ": O rows differing from whole-sequence attention";
        EXPECT_EQ(lse_diff, 0) << what << ": LSE entries differing";
      } else {
        EXPECT_LT(std::sqrt(num / den), 1e-2) << what;
        EXPECT_LT(lse_err, 1e-3) << what;
      }
    }
  }
}

TEST(SpAttentionGpu, RejectsBadInputBeforeLaunch) {
  std::string why;
  if (hopper_skip_reason(&why)) GTEST_SKIP() << why;
  runtime::ProcessGroup& pg = group();
  DeviceBuffer x(1 << 20);
  ops::SpAttnArgs a;
  a.q = a.k = a.v = x.p;
  a.o = x.p;
  a.seq = 2 * pg.world() * 8 + 1;
  a.heads_q = 4;
  a.heads_kv = 2;
  a.head_dim = 128;
  try {
    ops::sp_attention(ctx(), a);
    ADD_FAILURE() << "accepted seq " << a.seq;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 2 x world"), std::string::npos) << e.what();
  }
  a.seq = 2 * pg.world() * 8;
  a.heads_q = 6;
  a.heads_kv = 4;
  try {
    ops::sp_attention(ctx(), a);
    ADD_FAILURE() << "accepted heads 6 / 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple of heads_kv"), std::string::npos) << e.what();
  }
  a.heads_q = 4;
  a.heads_kv = 2;
  try {
    ops::sp_attention(ctx(), a, static_cast<ops::SpStrategy>(2));
    ADD_FAILURE() << "accepted strategy code 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("strategy code 2"), std::string::npos) << e.what();
  }
  // Workspace limits: an explicit strategy over it, and a limit nothing fits.
  ops::SpAttnOptions o;
  o.strategy = ops::SpStrategy::fused_ce;
  o.workspace_limit_bytes = ops::sp_attention_workspace_bytes(a, pg.world(), ops::SpStrategy::fused_ce) - 1;
  try {
    ops::sp_attention(ctx(), a, o);
    ADD_FAILURE() << "fused_ce ran over its workspace limit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("over the limit"), std::string::npos) << e.what();
  }
  o.strategy = ops::SpStrategy::automatic;
  o.workspace_limit_bytes = 1;
  try {
    ops::sp_attention(ctx(), a, o);
    ADD_FAILURE() << "automatic ran with a 1-byte workspace limit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no strategy fits"), std::string::npos) << e.what();
  }
}
