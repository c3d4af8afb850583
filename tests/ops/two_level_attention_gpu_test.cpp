// GPU test of ops::two_level_attention (Ulysses inside groups of u ranks,
// ring across R / u groups) and of sp_attention's two_level strategy at the
// launched world size (`tessera run -n R`; skipped below 2 ranks): every
// factorisation u x r of R the heads allow (R = 2: 2x1 and 1x2; R = 4: 4x1,
// 2x2, 1x4), the ring sequential and overlapped, causal and not, MHA and GQA,
// bf16 and fp16, batch 2 (staged all-to-all) and 1 (in place), with and
// without LSE, against whole-sequence attention computed by the kernel on
// the same global tensors (every rank draws them from one seed). Outputs are
// poisoned (NaN) before each call. Factorisations and strategies alternate
// call after call in one context (the ring contexts per size, their flags
// and epochs; sp_attention's other strategies in between). Tolerances as the
// ring's (partials rounded once): relative L2 error of O < 1e-2, LSE within
// 1e-3. Bad input is rejected before launch with errors naming the degree.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "support/device_buffers.hpp"
#include "support/gpu_group.hpp"
#include "support/test_support.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/ops/sp_attention.hpp"
#include "tessera/ops/two_level_attention.hpp"
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

ops::TwoLevelAttnContext& two_level_ctx() {
  static std::unique_ptr<ops::TwoLevelAttnContext> c = std::make_unique<ops::TwoLevelAttnContext>(group());
  return *c;
}
ops::SpAttnContext& sp_ctx() {
  static std::unique_ptr<ops::SpAttnContext> c = std::make_unique<ops::SpAttnContext>(group());
  return *c;
}

bool skip(std::string* why) {
  if (hopper_skip_reason(why)) return true;
  if (group().world() < 2) {
    *why = "two-level attention needs at least 2 ranks (run with tessera run -n 2 or -n 4)";
    return true;
  }
  return false;
}

float to_float(std::uint16_t x, DType t) {
  if (t == DType::f16) {
    __half h;
    std::memcpy(&h, &x, 2);
    return __half2float(h);
  }
  return bf16_to_float(x);
}

std::uint16_t from_float(float x, DType t) {
  std::uint16_t r;
  if (t == DType::f16) {
    const __half h = __float2half(x);
    std::memcpy(&r, &h, 2);
  } else {
    const __nv_bfloat16 h = __float2bfloat16(x);
    std::memcpy(&r, &h, 2);
  }
  return r;
}

struct Case {
  int64_t hq, hkv, d = 128, batch = 2;
  DType dtype = DType::bf16;
};

void run_case(const Case& cs, bool causal) {
  runtime::ProcessGroup& pg = group();
  const int R = pg.world(), rank = pg.rank();
  const int64_t B = cs.batch, C = 192, S = 2 * R * C, L = 2 * C, H = cs.hq, Hkv = cs.hkv, D = cs.d;
  std::mt19937_64 rng(20261127 + 7 * Hkv + 3 * H + D + causal + 11 * static_cast<int>(cs.dtype) + 13 * B);
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t nq = B * S * H * D, nk = B * S * Hkv * D;
  DeviceBuffer q(nq * 2), k(nk * 2), v(nk * 2), o(nq * 2), lse(B * H * S * 4);
  for (auto [buf, n] : {std::pair{&q, nq}, std::pair{&k, nk}, std::pair{&v, nk}}) {
    std::vector<uint16_t> h(n);
    for (auto& x : h) x = from_float(nd(rng), cs.dtype);
    TESSERA_CUDA_CHECK(cudaMemcpy(buf->p, h.data(), n * 2, cudaMemcpyHostToDevice));
  }
  const int chunks[2] = {rank, 2 * R - 1 - rank};
  auto global_row = [&](int64_t i) { return chunks[i / C] * C + i % C; };
  DeviceBuffer sq(B * L * H * D * 2), sk(B * L * Hkv * D * 2), sv(B * L * Hkv * D * 2), so(B * L * H * D * 2),
      slse(B * H * L * 4);
  for (auto [dst, src, heads] : {std::tuple{&sq, &q, H}, std::tuple{&sk, &k, Hkv}, std::tuple{&sv, &v, Hkv}}) {
    const size_t row = heads * D * 2;
    for (int i = 0; i < 2; ++i)
      TESSERA_CUDA_CHECK(cudaMemcpy2D(static_cast<char*>(dst->p) + i * C * row, L * row,
                                      static_cast<const char*>(src->p) + chunks[i] * C * row, S * row, C * row, B,
                                      cudaMemcpyDeviceToDevice));
  }
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
  full.dtype = cs.dtype;
  full.causal = causal;
  tk::attention(full);
  const auto o_full = download<uint16_t>(o.p, nq);
  const auto lse_full = download<float>(lse.p, B * H * S);

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
  a.dtype = cs.dtype;
  a.causal = causal;
  ops::SpAttnArgs no_lse = a;
  no_lse.lse = nullptr;

  struct Run {
    std::string name;
    std::function<void()> call;
    bool lse = true;  ///< false: called with lse = null (O only)
  };
  std::vector<Run> runs;
  const std::vector<int> degrees = ops::two_level_inner_degrees(a, R);
  for (int u : degrees) {
    const std::string f = std::to_string(u) + "x" + std::to_string(R / u);
    runs.push_back({f + " ring sequential",
                    [&, u] { ops::two_level_attention(two_level_ctx(), a, u, ops::RingStrategy::sequential); }});
    runs.push_back({f + " ring overlapped",
                    [&, u] { ops::two_level_attention(two_level_ctx(), a, u, ops::RingStrategy::overlapped); }});
    runs.push_back({f + " ring overlapped, no LSE",
                    [&, u] { ops::two_level_attention(two_level_ctx(), no_lse, u, ops::RingStrategy::overlapped); },
                    false});
    runs.push_back({f + " via sp_attention", [&, u] {
                      ops::SpAttnOptions o;
                      o.strategy = ops::SpStrategy::two_level;
                      o.two_level_inner = u;
                      ops::sp_attention(sp_ctx(), a, o);
                    }});
    runs.push_back({f + " ring sequential (after overlapped)",
                    [&, u] { ops::two_level_attention(two_level_ctx(), a, u, ops::RingStrategy::sequential); }});
  }
  // Another factorisation's context after each, and sp_attention's ring in between.
  for (int u : degrees)
    runs.push_back({std::to_string(u) + "x" + std::to_string(R / u) + " again, overlapped",
                    [&, u] { ops::two_level_attention(two_level_ctx(), a, u, ops::RingStrategy::overlapped); }});
  runs.push_back({"sp_attention ring (between)", [&] { ops::sp_attention(sp_ctx(), a, ops::SpStrategy::ring); }});
  runs.push_back({"sp_attention two_level, chosen degree " + std::to_string(ops::two_level_inner_degree(a, R)),
                  [&] { ops::sp_attention(sp_ctx(), a, ops::SpStrategy::two_level); }});

  for (const Run& run : runs) {
    TESSERA_CUDA_CHECK(cudaMemset(so.p, 0xFF, B * L * H * D * 2));
    TESSERA_CUDA_CHECK(cudaMemset(slse.p, 0xFF, B * H * L * 4));
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    run.call();
    pg.synchronize_all("two_level_attention test");
    const auto o_sh = download<uint16_t>(so.p, B * L * H * D);
    const auto lse_sh = download<float>(slse.p, B * H * L);
    double num = 0, den = 0, lse_err = 0;
    int64_t bad = 0;
    const size_t row = H * D;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < L; ++i) {
        const int64_t g = global_row(i);
        const uint16_t* x = &o_sh[(b * L + i) * row];
        const uint16_t* y = &o_full[(b * S + g) * row];
        for (size_t j = 0; j < row; ++j) {
          const float xf = to_float(x[j], cs.dtype), yf = to_float(y[j], cs.dtype);
          bad += !std::isfinite(xf);
          num += (xf - yf) * (xf - yf);
          den += yf * yf;
        }
        if (!run.lse) continue;
        for (int64_t h = 0; h < H; ++h) {
          const float l0 = lse_sh[(b * H + h) * L + i], l1 = lse_full[(b * H + h) * S + g];
          bad += !std::isfinite(l0);
          lse_err = std::max(lse_err, static_cast<double>(std::abs(l0 - l1)));
        }
      }
    const std::string what = run.name + (causal ? " causal" : "") + " heads " + std::to_string(H) + "/" +
                             std::to_string(Hkv) + " d " + std::to_string(D) + " " + std::string(dtype_name(cs.dtype)) +
                             " batch " + std::to_string(B) + " rank " + std::to_string(rank) + "/" + std::to_string(R);
    EXPECT_EQ(bad, 0) << what << ": non-finite outputs (poison left or NaN)";
    EXPECT_LT(std::sqrt(num / den), 1e-2) << what;
    EXPECT_LT(lse_err, 1e-3) << what;
  }
}

}  // namespace

// MHA with heads divisible by every degree of R (R = 2, 4: all of them).
TEST(TwoLevelAttentionGpu, MhaEveryFactorisation) {
  std::string why;
  if (skip(&why)) GTEST_SKIP() << why;
  const int R = group().world();
  for (bool causal : {true, false}) run_case({2 * R, 2 * R}, causal);
}

// GQA 2:1 with KV heads divisible by every degree.
TEST(TwoLevelAttentionGpu, GqaEveryFactorisation) {
  std::string why;
  if (skip(&why)) GTEST_SKIP() << why;
  const int R = group().world();
  for (bool causal : {true, false}) run_case({2 * R, R}, causal);
}

// GQA 4:1 with 2 KV heads: at R = 4 only 1x4 and 2x2 (4x1 is refused below).
TEST(TwoLevelAttentionGpu, GqaFewKvHeads) {
  std::string why;
  if (skip(&why)) GTEST_SKIP() << why;
  run_case({8, 2}, true);
}

TEST(TwoLevelAttentionGpu, Fp16Batch1HeadDim64) {
  std::string why;
  if (skip(&why)) GTEST_SKIP() << why;
  const int R = group().world();
  run_case({2 * R, R, 64, 1, DType::f16}, true);
  run_case({2 * R, 2 * R, 128, 1, DType::bf16}, false);
}

TEST(TwoLevelAttentionGpu, RejectsBadInputBeforeLaunch) {
  std::string why;
  if (skip(&why)) GTEST_SKIP() << why;
  runtime::ProcessGroup& pg = group();
  const int R = pg.world();
  DeviceBuffer x(1 << 20);
  ops::SpAttnArgs a;
  a.q = a.k = a.v = x.p;
  a.o = x.p;
  a.seq = 2 * R * 8;
  a.heads_q = 2 * R;
  a.heads_kv = R;
  a.head_dim = 128;
  auto expect_error = [&](const std::string& what, const std::string& needle, int inner) {
    for (int op = 0; op < 2; ++op) {
      try {
        if (op == 0) {
          ops::two_level_attention(two_level_ctx(), a, inner);
        } else {
          ops::SpAttnOptions o;
          o.strategy = ops::SpStrategy::two_level;
          o.two_level_inner = inner;
          ops::sp_attention(sp_ctx(), a, o);
        }
        ADD_FAILURE() << (op ? "sp_attention" : "two_level_attention") << " accepted " << what;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
      }
    }
  };
  expect_error("a degree that does not divide the world", "two_level_inner = " + std::to_string(R + 1), R + 1);
  a.heads_kv = 1;  // GQA 2R:1: no degree above 1 divides the KV heads
  expect_error("heads_kv 1 at degree R", "heads_kv = 1 is not a multiple of two_level_inner", R);
  a.heads_kv = R;
  a.heads_q = 3 * R + 1;
  expect_error("heads_q not a multiple of heads_kv", "not a multiple of heads_kv", 1);
  a.heads_q = 2 * R;
  a.seq = 2 * R * 8 + 2;
  expect_error("seq not a multiple of 2R", "multiple of 2 x world", 1);
  a.seq = 2 * R * 8;
  a.head_dim = 96;
  expect_error("head_dim 96", "head_dim", 1);
  a.head_dim = 128;
  {  // inside a CUDA-graph capture: refused before anything is enqueued
    TESSERA_CUDA_CHECK(cudaStreamBeginCapture(pg.stream(), cudaStreamCaptureModeRelaxed));
    std::string errors;
    try {
      ops::two_level_attention(two_level_ctx(), a, 1);
      errors += "two_level accepted a capture; ";
    } catch (const Error& e) {
      if (std::string(e.what()).find("CUDA graph") == std::string::npos) errors += std::string(e.what()) + "; ";
    }
    cudaGraph_t graph = nullptr;
    TESSERA_CUDA_CHECK(cudaStreamEndCapture(pg.stream(), &graph));
    if (graph) TESSERA_CUDA_CHECK(cudaGraphDestroy(graph));
    EXPECT_EQ(errors, "");
  }
}
