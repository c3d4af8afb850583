// GPU test of ops::sp_attention at the launched world size (the device build
// runs it at R = 1; with R > 1 it needs `tessera run -n R`): both strategies
// against whole-sequence attention computed locally on the same global
// tensors (every rank draws them from one seed). Sequential runs the plain
// kernel over the zig-zag parts and must match bitwise; fused_ce at R = 1 runs
// the same kernels (bitwise too), at R > 1 the hooked kernel with its own
// block width (within tolerance, LSE to 1e-3). Two calls in a row exercise the
// epochs; automatic (tuned afresh, no cache) follows with the strategy it
// picked, which must be no slower than sequential as measured. Bad input is
// rejected before launch. The --diag replay of the fused kernel is checked
// against the call it replays.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
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
#include "support/zigzag_attention.hpp"
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

/// Why a fused_ce test cannot run here (no Hopper GPU, or fewer than two
/// load/store-reachable ranks), or empty.
std::string fused_skip_reason() {
  std::string why;
  if (hopper_skip_reason(&why)) return why;
  if (group().world() < 2 || !group().lsa_reachable()) return "fused_ce needs 2 load/store-reachable ranks";
  return {};
}

/// fused_ce's wait for the calls in its scope (its knobs are read per
/// call): the chunk walk, or the table wait where it fits; both knobs unset
/// at the end.
struct FusedWait {
  explicit FusedWait(bool walk) { set(walk); }
  ~FusedWait() {
    unsetenv("TESSERA_SP_SHARD_LAYOUT");
    unsetenv("TESSERA_SP_TABLE_WAIT");
  }
  static void set(bool walk) {
    setenv("TESSERA_SP_SHARD_LAYOUT", walk ? "0" : "1", 1);
    setenv("TESSERA_SP_TABLE_WAIT", walk ? "0" : "2", 1);  // 2: the causal table wait at any R
  }
};

}  // namespace

TEST(SpAttentionGpu, StrategiesMatchWholeSequenceAttention) {
  std::string why;
  if (hopper_skip_reason(&why)) GTEST_SKIP() << why;
  runtime::ProcessGroup& pg = group();
  const int R = pg.world(), rank = pg.rank();
  const int64_t H = 4, Hkv = 2;
  for (bool causal : {true, false}) {
    // The same global tensors on every rank.
    const tessera::testing::ZigZagAttention zz(R, rank, 2, 256, H, Hkv, 128, DType::bf16, causal, 20261124);
    const ops::SpAttnArgs a = zz.args();
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
      } else {
        EXPECT_EQ(ran, s);
      }
      zz.poison();
      ops::sp_attention(ctx(), a, opt);
      pg.synchronize(pg.stream(), "sp_attention test");
      const auto d = zz.compare();
      // The sequential gather runs the whole-sequence kernel's K order (and
      // at R = 1 every strategy does): bitwise equal. The others merge or
      // split differently.
      const bool bitwise = ran == ops::SpStrategy::sequential || R == 1;
      const std::string what = std::string(ops::sp_strategy_name(s)) + " (" + std::string(ops::sp_strategy_name(ran)) +
                               ")" + (causal ? " causal" : "") + " rank " + std::to_string(rank) + "/" +
                               std::to_string(R);
      EXPECT_EQ(d.nonfinite, 0) << what << ": non-finite outputs (poison left or NaN)";
      if (bitwise) {
        EXPECT_EQ(d.o_rows_differ, 0) << what << ": O rows differing from whole-sequence attention";
        EXPECT_EQ(d.lse_differ, 0) << what << ": LSE entries differing";
      } else {
        EXPECT_LT(d.o_rel, 1e-2) << what;
        EXPECT_LT(d.lse_max, 1e-3) << what;
      }
    }
  }
}

// fused_ce pushes each chunk in head groups (a flag per chunk and group):
// shapes whose KV rows split into 2 and 8 groups, both dtypes and head
// dims, against whole-sequence attention, two calls each (the second reuses
// the flags at the next epoch).
TEST(SpAttentionGpu, FusedHeadGroupsMatchWholeSequenceAttention) {
  if (const std::string why = fused_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  runtime::ProcessGroup& pg = group();
  const int R = pg.world(), rank = pg.rank();
  struct Case {
    int64_t heads, heads_kv, head_dim;
    DType dtype;
    int groups;  // sp_attention_head_groups()
  };
  for (const Case& c : {Case{16, 8, 128, DType::bf16, 2}, Case{32, 32, 128, DType::bf16, 8},
                        Case{32, 16, 64, DType::f16, 2}, Case{64, 64, 64, DType::bf16, 8}}) {
    ASSERT_EQ(ops::sp_attention_head_groups(c.heads_kv, c.head_dim, 2), c.groups);
    for (bool causal : {true, false}) {
      const tessera::testing::ZigZagAttention zz(R, rank, 1, 128, c.heads, c.heads_kv, c.head_dim, c.dtype, causal,
                                                 20261127);
      ops::SpAttnOptions opt;
      opt.strategy = ops::SpStrategy::fused_ce;
      opt.use_cache = false;
      for (int call = 0; call < 2; ++call) {
        zz.poison();
        ops::sp_attention(ctx(), zz.args(), opt);
        pg.synchronize(pg.stream(), "sp_attention head-group test");
        const auto d = zz.compare();
        const std::string what = std::to_string(c.heads) + "/" + std::to_string(c.heads_kv) + " heads, d " +
                                 std::to_string(c.head_dim) + (causal ? " causal" : "") + ", call " +
                                 std::to_string(call) + ", rank " + std::to_string(rank) + "/" + std::to_string(R);
        EXPECT_EQ(d.nonfinite, 0) << what << ": non-finite outputs (poison left or NaN)";
        EXPECT_LT(d.o_rel, 1e-2) << what;
        EXPECT_LT(d.lse_max, 1e-3) << what;
      }
    }
  }
}

// fused_ce in the global layout reads the own chunks in place
// (TESSERA_SP_OWN_IN_PLACE, default on) and copies only the own rows of KV
// blocks that straddle a chunk boundary (ops::sp_own_edge_rows): bitwise the
// same O and LSE as copying the whole chunks (same kernel, same blocks).
// Before each in-place call a call on other data leaves other own rows in
// the workspace, so a missing edge row cannot pass. Chunks shorter than a
// block, a multiple of it, and neither; both head dims (176- and 128-row
// blocks), GQA, batch 2. With chunks of at least a block the calls would
// take the table wait, which reads nothing in place: TESSERA_SP_TABLE_WAIT=0
// and TESSERA_SP_SHARD_LAYOUT=0 keep the chunk walk.
TEST(SpAttentionGpu, FusedOwnChunksInPlaceMatchTheCopy) {
  if (const std::string why = fused_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  runtime::ProcessGroup& pg = group();
  const int R = pg.world(), rank = pg.rank();
  const FusedWait walk(true);
  struct EnvScope {
    ~EnvScope() { unsetenv("TESSERA_SP_OWN_IN_PLACE"); }
  } restore;
  ops::SpAttnOptions opt;
  opt.strategy = ops::SpStrategy::fused_ce;
  opt.use_cache = false;
  for (int64_t d : {64, 128})
    for (int64_t chunk : {96, 200, 256, 352})
      for (bool causal : {true, false}) {
        const tessera::testing::ZigZagAttention zz(R, rank, 2, chunk, 4, 2, d, DType::bf16, causal, 20261127 + chunk);
        const tessera::testing::ZigZagAttention other(R, rank, 2, chunk, 4, 2, d, DType::bf16, causal, 7 + chunk);
        const ops::SpAttnArgs a = zz.args();
        const std::size_t o_elems = static_cast<std::size_t>(zz.B * zz.L * zz.H * zz.D);
        const std::size_t lse_elems = static_cast<std::size_t>(zz.B * zz.H * zz.L);
        auto run = [&](const tessera::testing::ZigZagAttention& z, const char* in_place) {
          setenv("TESSERA_SP_OWN_IN_PLACE", in_place, 1);
          z.poison();
          ops::sp_attention(ctx(), z.args(), opt);
          pg.synchronize(pg.stream(), "sp_attention in-place test");
        };
        run(zz, "0");
        const auto o_copy = download<std::uint16_t>(a.o, o_elems);
        const auto lse_copy = download<float>(a.lse, lse_elems);
        run(other, "0");
        run(zz, "1");
        const std::string what = "d " + std::to_string(d) + ", chunk " + std::to_string(chunk) +
                                 (causal ? " causal" : "") + ", rank " + std::to_string(rank) + "/" + std::to_string(R);
        EXPECT_TRUE(download<std::uint16_t>(a.o, o_elems) == o_copy) << what << ": O differs from the copy";
        EXPECT_TRUE(download<float>(a.lse, lse_elems) == lse_copy) << what << ": LSE differs from the copy";
        const auto diff = zz.compare();
        EXPECT_EQ(diff.nonfinite, 0) << what;
        EXPECT_LT(diff.o_rel, 1e-2) << what;
        EXPECT_LT(diff.lse_max, 1e-3) << what;
      }
}

// fused_ce's table wait (the default where chunks are at least a KV block):
// non-causal in the shard layout, causal in global order. Against the
// reference: two calls in a row (epochs), then a chunk-walk call
// (TESSERA_SP_SHARD_LAYOUT=0 / TESSERA_SP_TABLE_WAIT=0) and a sequential
// call between table-wait calls, so each way follows the others over the
// same workspace. Chunks shorter than a block (chunk 32: blocks of 192 rows
// at d 128) fall back to the chunk walk (causal), or to it in global order
// (non-causal: shards of 64 rows); chunks that are and are not multiples of
// a block; both head dims, GQA, head groups (16/8 heads at d 128: two),
// batch 2.
TEST(SpAttentionGpu, FusedTableWaitMatchesTheReference) {
  if (const std::string why = fused_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  runtime::ProcessGroup& pg = group();
  const int R = pg.world(), rank = pg.rank();
  const FusedWait table(false);
  struct Case {
    int64_t batch, chunk, heads, heads_kv, head_dim;
  };
  for (bool causal : {false, true})
    for (const Case& c : {Case{2, 32, 4, 2, 128}, Case{2, 96, 4, 2, 64}, Case{1, 200, 16, 8, 128},
                          Case{2, 256, 4, 4, 128}, Case{1, 352, 8, 2, 64}}) {
      const tessera::testing::ZigZagAttention zz(R, rank, c.batch, c.chunk, c.heads, c.heads_kv, c.head_dim,
                                                 DType::bf16, causal, 20261127 + c.chunk);
      ops::SpAttnOptions opt;
      opt.use_cache = false;
      const char* steps[] = {"table", "table", "walk", "table", "sequential", "table"};
      for (const char* step : steps) {
        const std::string s = step;
        FusedWait::set(s == "walk");
        opt.strategy = s == "sequential" ? ops::SpStrategy::sequential : ops::SpStrategy::fused_ce;
        zz.poison();
        ops::sp_attention(ctx(), zz.args(), opt);
        pg.synchronize(pg.stream(), "sp_attention table-wait test");
        const auto d = zz.compare();
        const std::string what = std::string(causal ? "causal" : "non-causal") + ", chunk " + std::to_string(c.chunk) +
                                 ", " + std::to_string(c.heads) + "/" + std::to_string(c.heads_kv) + " heads, d " +
                                 std::to_string(c.head_dim) + ", " + s + ", rank " + std::to_string(rank) + "/" +
                                 std::to_string(R);
        EXPECT_EQ(d.nonfinite, 0) << what << ": non-finite outputs (poison left or NaN)";
        EXPECT_LT(d.o_rel, 1e-2) << what;
        EXPECT_LT(d.lse_max, 1e-3) << what;
      }
    }
}

// sp_attention_diag_fused_kernel (bench sp-attention --diag) re-runs
// fused_ce's hooked kernel over the KV the last call gathered: as run it is
// bitwise the call's O and LSE (same kernel, blocks and order); in the
// default order it matches the reference; the plain-kernel variant runs.
// After a sequential call, and with unknown variant bits, it throws. Both
// waits: the table wait (default) and the chunk walk.
TEST(SpAttentionGpu, DiagReplayOfTheFusedKernel) {
  if (const std::string why = fused_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  runtime::ProcessGroup& pg = group();
  const int R = pg.world(), rank = pg.rank();
  const FusedWait table(false);
  for (bool walk : {false, true})
    for (bool causal : {true, false}) {
      FusedWait::set(walk);
      const tessera::testing::ZigZagAttention zz(R, rank, 1, 384, 4, 2, 128, DType::bf16, causal, 20261128);
      const ops::SpAttnArgs a = zz.args();
      const std::size_t o_elems = static_cast<std::size_t>(zz.B * zz.L * zz.H * zz.D);
      const std::size_t lse_elems = static_cast<std::size_t>(zz.B * zz.H * zz.L);
      const std::string what = std::string(causal ? "causal" : "non-causal") +
                               (walk ? ", chunk walk" : ", table wait") + ", rank " + std::to_string(rank);
      zz.poison();
      ops::sp_attention(ctx(), a, ops::SpStrategy::fused_ce);
      pg.synchronize(pg.stream(), "sp_attention diag test: fused_ce");
      const auto o_fused = download<std::uint16_t>(a.o, o_elems);
      const auto lse_fused = download<float>(a.lse, lse_elems);
      zz.poison();
      ops::sp_attention_diag_fused_kernel(ctx(), a, 0);
      pg.synchronize(pg.stream(), "sp_attention diag test: replay");
      EXPECT_TRUE(download<std::uint16_t>(a.o, o_elems) == o_fused) << what << ": the replay's O differs";
      EXPECT_TRUE(download<float>(a.lse, lse_elems) == lse_fused) << what << ": the replay's LSE differs";
      zz.poison();
      ops::sp_attention_diag_fused_kernel(ctx(), a, ops::kSpDiagDescending);
      pg.synchronize(pg.stream(), "sp_attention diag test: descending replay");
      const auto diff = zz.compare();
      EXPECT_EQ(diff.nonfinite, 0) << what;
      EXPECT_LT(diff.o_rel, 1e-2) << what;
      EXPECT_LT(diff.lse_max, 1e-3) << what;
      ops::sp_attention_diag_fused_kernel(ctx(), a, ops::kSpDiagPlainKernel);
      pg.synchronize(pg.stream(), "sp_attention diag test: plain kernel");
      EXPECT_THROW(ops::sp_attention_diag_fused_kernel(ctx(), a, 1u << 7), Error) << what;
      pg.barrier();  // every rank is done with the workspace before the next call
      ops::sp_attention(ctx(), a, ops::SpStrategy::sequential);
      pg.synchronize(pg.stream(), "sp_attention diag test: sequential");
      try {
        ops::sp_attention_diag_fused_kernel(ctx(), a, 0);
        ADD_FAILURE() << what << ": replayed after a sequential call";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("was not fused_ce"), std::string::npos) << e.what();
      }
    }
}

// CUDA graphs: sequential and fused_ce captured on their own context after
// one eager call each, replayed on fresh inputs copied into the graph's
// buffers, with eager calls of the same strategies in between (each resets
// the flags the replays left). Each replay equals the eager call on the same
// input bitwise; ring is refused inside a capture with the reason, before
// anything is enqueued.
TEST(SpAttentionGpu, CapturedReplaysEqualEager) {
  std::string why;
  if (hopper_skip_reason(&why)) GTEST_SKIP() << why;
  runtime::ProcessGroup& pg = group();
  const int R = pg.world(), rank = pg.rank();
  ops::SpAttnContext c(pg);
  cudaStream_t st = pg.stream();
  for (bool causal : {true, false}) {
    using tessera::testing::ZigZagAttention;
    const ZigZagAttention graph_io(R, rank, 1, 256, 4, 2, 128, DType::bf16, causal, 7);
    std::vector<std::unique_ptr<ZigZagAttention>> inputs;
    for (int i = 0; i < 3; ++i)
      inputs.push_back(std::make_unique<ZigZagAttention>(R, rank, 1, 256, 4, 2, 128, DType::bf16, causal, 100 + i));
    const ops::SpAttnArgs g = graph_io.args();
    const std::size_t q_bytes = static_cast<std::size_t>(g.batch * graph_io.L * g.heads_q * g.head_dim) * 2,
                      kv_bytes = static_cast<std::size_t>(g.batch * graph_io.L * g.heads_kv * g.head_dim) * 2,
                      lse_elems = static_cast<std::size_t>(g.batch * g.heads_q * graph_io.L);
    const ops::SpStrategy strategies[2] = {ops::SpStrategy::sequential, ops::SpStrategy::fused_ce};
    // Eager references (workspaces grown, signatures agreed, before any capture).
    std::vector<std::uint16_t> ref_o[2][3];
    std::vector<float> ref_lse[2][3];
    for (int s = 0; s < 2; ++s)
      for (int i = 0; i < 3; ++i) {
        const ops::SpAttnArgs a = inputs[i]->args();
        inputs[i]->poison();
        ops::sp_attention(c, a, strategies[s]);
        pg.synchronize(st, "sp_attention capture test: eager reference");
        ref_o[s][i] = download<std::uint16_t>(a.o, q_bytes / 2);
        ref_lse[s][i] = download<float>(a.lse, lse_elems);
        const auto d = inputs[i]->compare();
        ASSERT_EQ(d.nonfinite, 0);
        ASSERT_LT(d.o_rel, 1e-2);
      }
    for (ops::SpStrategy s : strategies) {  // the graph's own buffers, eagerly first
      ops::sp_attention(c, g, s);
      pg.synchronize(st, "sp_attention capture test: warm-up");
    }
    cudaGraphExec_t exec[2] = {};
    for (int s = 0; s < 2; ++s) {
      cudaGraph_t graph = nullptr;
      TESSERA_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      try {
        ops::sp_attention(c, g, strategies[s]);
      } catch (const std::exception& e) {
        (void)cudaStreamEndCapture(st, &graph);
        FAIL() << ops::sp_strategy_name(strategies[s]) << " refused under capture: " << e.what();
      }
      TESSERA_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
      TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec[s], graph, 0));
      TESSERA_CUDA_CHECK(cudaGraphDestroy(graph));
    }
    if (R > 1) {  // ring runs on a context of its own: refused before anything is enqueued
      cudaGraph_t graph = nullptr;
      TESSERA_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      std::string err;
      try {
        ops::sp_attention(c, g, ops::SpStrategy::ring);
      } catch (const Error& e) {
        err = e.what();
      }
      TESSERA_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
      EXPECT_NE(err.find("cannot be captured"), std::string::npos) << err;
      if (graph) TESSERA_CUDA_CHECK(cudaGraphDestroy(graph));
    }
    for (int r = 0; r < 30; ++r) {
      const int s = r % 2, i = (r / 2) % 3;
      const ops::SpAttnArgs in = inputs[i]->args();
      graph_io.poison();
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(const_cast<void*>(g.q), in.q, q_bytes, cudaMemcpyDeviceToDevice, st));
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(const_cast<void*>(g.k), in.k, kv_bytes, cudaMemcpyDeviceToDevice, st));
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(const_cast<void*>(g.v), in.v, kv_bytes, cudaMemcpyDeviceToDevice, st));
      TESSERA_CUDA_CHECK(cudaGraphLaunch(exec[s], st));
      pg.synchronize(st, "sp_attention capture test: replay");
      const std::string what = std::string(ops::sp_strategy_name(strategies[s])) + (causal ? " causal" : "") +
                               ", replay " + std::to_string(r) + ", input " + std::to_string(i) + ", rank " +
                               std::to_string(rank) + "/" + std::to_string(R);
      ASSERT_TRUE(download<std::uint16_t>(g.o, q_bytes / 2) == ref_o[s][i]) << what << ": O differs from eager";
      ASSERT_TRUE(download<float>(g.lse, lse_elems) == ref_lse[s][i]) << what << ": LSE differs from eager";
      if (r % 5 == 4) {  // an eager call between replays resets the flags they left
        const int j = (i + 1) % 3;
        inputs[j]->poison();
        ops::sp_attention(c, inputs[j]->args(), strategies[s]);
        pg.synchronize(st, "sp_attention capture test: eager after replays");
        ASSERT_TRUE(download<std::uint16_t>(inputs[j]->args().o, q_bytes / 2) == ref_o[s][j])
            << what << ": the eager call after it differs";
      }
    }
    for (cudaGraphExec_t e : exec) TESSERA_CUDA_CHECK(cudaGraphExecDestroy(e));
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
  // Head counts that differ across ranks (each valid on its own rank): every
  // rank gets the error, before anything is launched.
  if (pg.world() >= 2) {
    ops::SpAttnArgs mine = a;
    if (pg.rank() == 1) mine.heads_kv = 4;
    try {
      ops::sp_attention(ctx(), mine, ops::SpStrategy::sequential);
      ADD_FAILURE() << "accepted head counts differing across ranks";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("differs between ranks"), std::string::npos) << e.what();
    }
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
