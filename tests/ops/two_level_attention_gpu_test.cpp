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
#include "support/zigzag_attention.hpp"
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

struct Case {
  int64_t hq, hkv, d = 128, batch = 2;
  DType dtype = DType::bf16;
};

void run_case(const Case& cs, bool causal) {
  runtime::ProcessGroup& pg = group();
  const int R = pg.world(), rank = pg.rank();
  const int64_t B = cs.batch, H = cs.hq, Hkv = cs.hkv, D = cs.d;
  // The same global tensors on every rank.
  const tessera::testing::ZigZagAttention zz(
      R, rank, B, 192, H, Hkv, D, cs.dtype, causal,
      20261127 + 7 * Hkv + 3 * H + D + causal + 11 * static_cast<int>(cs.dtype) + 13 * B);
  const ops::SpAttnArgs a = zz.args();
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
    zz.poison();
    run.call();
    pg.synchronize_all("two_level_attention test");
    const auto d = zz.compare(run.lse);
    const std::string what = run.name + (causal ? " causal" : "") + " heads " + std::to_string(H) + "/" +
                             std::to_string(Hkv) + " d " + std::to_string(D) + " " + std::string(dtype_name(cs.dtype)) +
                             " batch " + std::to_string(B) + " rank " + std::to_string(rank) + "/" + std::to_string(R);
    EXPECT_EQ(d.nonfinite, 0) << what << ": non-finite outputs (poison left or NaN)";
    EXPECT_LT(d.o_rel, 1e-2) << what;
    EXPECT_LT(d.lse_max, 1e-3) << what;
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
