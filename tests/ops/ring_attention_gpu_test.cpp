// GPU test of ops::ring_attention and ops::ulysses_attention at the launched
// world size (R = 1 in the one-GPU build; `tessera run -n R` for more):
// every strategy, causal and not, MHA and GQA, head dim 128 and 64, against
// whole-sequence attention computed by the kernel on the same global tensors
// (every rank draws them from one seed). Outputs are poisoned (NaN) before
// each call. Ring merges partial results in another order than the kernel's
// online softmax, so the figures are tolerances: relative L2 error of O
// < 1e-2, LSE within 1e-3. Strategies alternate call after call (the flag
// protocol and the epochs). Bad input is rejected before launch. With
// TESSERA_NO_LSA=1 the overlapped ring runs its NCCL form (no flags).
#include <cuda_bf16.h>
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
#include "tessera/ops/ring_attention.hpp"
#include "tessera/ops/ulysses_attention.hpp"
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

ops::RingAttnContext& ring_ctx() {
  static std::unique_ptr<ops::RingAttnContext> c = std::make_unique<ops::RingAttnContext>(group());
  return *c;
}
ops::UlyssesAttnContext& ulysses_ctx() {
  static std::unique_ptr<ops::UlyssesAttnContext> c = std::make_unique<ops::UlyssesAttnContext>(group());
  return *c;
}

struct Case {
  int64_t hkv, d;
  int64_t batch = 2;
};

void run_case(const Case& cs, bool causal) {
  runtime::ProcessGroup& pg = group();
  const int R = pg.world(), rank = pg.rank();
  const int64_t H = 4, Hkv = cs.hkv, D = cs.d;
  // The same global tensors on every rank.
  const tessera::testing::ZigZagAttention zz(R, rank, cs.batch, 256, H, Hkv, D, DType::bf16, causal,
                                             20261126 + 7 * Hkv + D + causal);
  const ops::SpAttnArgs a = zz.args();

  const bool ulysses_ok = H % R == 0 && Hkv % R == 0;
  struct Run {
    std::string name;
    std::function<void()> call;
    bool lse = true;  ///< false: called with lse = null (O only)
  };
  std::vector<Run> runs;
  ops::SpAttnArgs no_lse = a;
  no_lse.lse = nullptr;
  auto ring = [&](ops::RingStrategy s, const char* name, bool lse = true) {
    runs.push_back(
        {std::string("ring ") + name, [&, s, lse] { ops::ring_attention(ring_ctx(), lse ? a : no_lse, s); }, lse});
  };
  auto uly = [&](ops::UlyssesStrategy s, int groups, const std::string& name, bool lse = true) {
    runs.push_back({"ulysses " + name,
                    [&, s, groups, lse] { ops::ulysses_attention(ulysses_ctx(), lse ? a : no_lse, s, groups); }, lse});
  };
  // Strategies alternate so every transition of the flag protocol runs.
  ring(ops::RingStrategy::sequential, "sequential");
  ring(ops::RingStrategy::overlapped, "overlapped");
  ring(ops::RingStrategy::overlapped, "overlapped (again)");
  ring(ops::RingStrategy::sequential, "sequential (after overlapped)");
  ring(ops::RingStrategy::overlapped, "overlapped (after sequential)");
  ring(ops::RingStrategy::overlapped, "overlapped, no LSE", false);
  if (ulysses_ok) {
    uly(ops::UlyssesStrategy::sequential, 0, "sequential");
    uly(ops::UlyssesStrategy::pipelined, 0, "pipelined");
    uly(ops::UlyssesStrategy::pipelined, 0, "pipelined (again)");
    if ((Hkv / R) % 2 == 0) uly(ops::UlyssesStrategy::pipelined, 2, "pipelined, 2 head groups");
    uly(ops::UlyssesStrategy::sequential, 0, "sequential (after pipelined)");
    uly(ops::UlyssesStrategy::pipelined, 0, "pipelined, no LSE", false);
  } else {
    std::cout << "[   NOTE   ] rank " << rank << ": ulysses skipped for heads " << H << "/" << Hkv << " at world " << R
              << " (heads_kv not a multiple of the world); its rejection is checked instead\n";
    try {
      ops::ulysses_attention(ulysses_ctx(), a);
      ADD_FAILURE() << "ulysses accepted heads_kv " << Hkv << " at world " << R;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("heads_kv"), std::string::npos) << e.what();
    }
  }

  for (const Run& run : runs) {
    zz.poison();
    run.call();
    pg.synchronize(pg.stream(), "ring_attention test");
    const auto d = zz.compare(run.lse);
    const std::string what = run.name + (causal ? " causal" : "") + " heads " + std::to_string(H) + "/" +
                             std::to_string(Hkv) + " d " + std::to_string(D) + " rank " + std::to_string(rank) + "/" +
                             std::to_string(R);
    EXPECT_EQ(d.nonfinite, 0) << what << ": non-finite outputs (poison left or NaN)";
    EXPECT_LT(d.o_rel, 1e-2) << what;
    EXPECT_LT(d.lse_max, 1e-3) << what;
  }
}

}  // namespace

TEST(RingAttentionGpu, MhaHeadDim128) {
  std::string why;
  if (hopper_skip_reason(&why)) GTEST_SKIP() << why;
  for (bool causal : {true, false}) run_case({4, 128}, causal);
}

TEST(RingAttentionGpu, GqaHeadDim128) {
  std::string why;
  if (hopper_skip_reason(&why)) GTEST_SKIP() << why;
  for (bool causal : {true, false}) run_case({2, 128}, causal);
}

TEST(RingAttentionGpu, MhaHeadDim64) {
  std::string why;
  if (hopper_skip_reason(&why)) GTEST_SKIP() << why;
  run_case({4, 64}, true);
}

// Batch 1: Ulysses receives rows in place (no staging copies).
TEST(RingAttentionGpu, MhaBatch1) {
  std::string why;
  if (hopper_skip_reason(&why)) GTEST_SKIP() << why;
  run_case({4, 128, 1}, true);
}

TEST(RingAttentionGpu, RejectsBadInputBeforeLaunch) {
  std::string why;
  if (hopper_skip_reason(&why)) GTEST_SKIP() << why;
  runtime::ProcessGroup& pg = group();
  const int R = pg.world();
  DeviceBuffer x(1 << 20);
  ops::SpAttnArgs a;
  a.q = a.k = a.v = x.p;
  a.o = x.p;
  a.seq = 2 * R * 8;
  a.heads_q = 4 * R;
  a.heads_kv = 2 * R;
  a.head_dim = 128;
  auto expect_error = [&](const char* what, const std::string& needle) {
    for (int op = 0; op < 2; ++op) {
      try {
        if (op == 0)
          ops::ring_attention(ring_ctx(), a);
        else
          ops::ulysses_attention(ulysses_ctx(), a);
        ADD_FAILURE() << (op ? "ulysses" : "ring") << " accepted " << what;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
      }
    }
  };
  a.seq = 2 * R * 8 + 1;
  expect_error("seq not a multiple of 2R", "multiple of 2 x world");
  a.seq = 2 * R * 8;
  a.head_dim = 96;
  expect_error("head_dim 96", "head_dim");
  a.head_dim = 128;
  a.dtype = DType::f32;
  expect_error("dtype f32", "dtype");
  a.dtype = DType::bf16;
  a.heads_q = 6 * R;
  a.heads_kv = 4 * R;
  expect_error("heads 6R / 4R", "not a multiple of heads_kv");
  a.heads_q = 4 * R;
  a.heads_kv = 2 * R;
  try {
    ops::ulysses_attention(ulysses_ctx(), a, ops::UlyssesStrategy::pipelined, 3);
    ADD_FAILURE() << "ulysses accepted 3 head groups";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_groups = 3"), std::string::npos) << e.what();
  }
  {  // inside a CUDA-graph capture: refused before anything is enqueued
    a.heads_q = 4 * R;
    a.heads_kv = 2 * R;
    TESSERA_CUDA_CHECK(cudaStreamBeginCapture(pg.stream(), cudaStreamCaptureModeRelaxed));
    std::string errors;
    for (int op = 0; op < 2; ++op) {
      try {
        if (op == 0)
          ops::ring_attention(ring_ctx(), a);
        else
          ops::ulysses_attention(ulysses_ctx(), a);
        errors += op ? "ulysses accepted a capture; " : "ring accepted a capture; ";
      } catch (const Error& e) {
        if (std::string(e.what()).find("CUDA graph") == std::string::npos) errors += std::string(e.what()) + "; ";
      }
    }
    cudaGraph_t graph = nullptr;
    TESSERA_CUDA_CHECK(cudaStreamEndCapture(pg.stream(), &graph));
    if (graph) TESSERA_CUDA_CHECK(cudaGraphDestroy(graph));
    EXPECT_EQ(errors, "");
  }
  if (R > 1) {
    a.heads_q = 4 * R + 1;
    a.heads_kv = 4 * R + 1;
    try {
      ops::ulysses_attention(ulysses_ctx(), a);
      ADD_FAILURE() << "ulysses accepted heads " << a.heads_q << " at world " << R;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("heads_q"), std::string::npos) << e.what();
    }
  }
}
