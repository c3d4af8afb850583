// The GPU executor's bookkeeping without a GPU: every named GEMM strategy's
// per-rank device program (which blocks exist, where each step reads and
// writes, NCCL call order, stream events) is built for meshes 2, 4 and 8 and
// run by the host simulator — NCCL matching across ranks, a race check over
// the two streams, results against the un-parallelized GEMM. The programs for
// the GPU test's own shape (2048^3) are built too. Plus: the simulator's
// checks can fail (a dropped event is a race, a dropped send a deadlock), and
// shapes outside the GPU limits give a clear Error at build time.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <tuple>

#include "tessera/commir/cpu_executor.hpp"
#include "tessera/commir/gpu_program.hpp"
#include "tessera/commir/schedules.hpp"

using namespace tessera::commir;

namespace {

Plan gemm_plan(std::int64_t m, std::int64_t n, std::int64_t k, int world, const std::string& name) {
  return lower(scheduled(make_gemm(m, n, k, {world}, tessera::DType::f32), name));
}

struct Data {
  Tensors in, ref;
};
Data fresh(const Plan& p) {
  Data d;
  d.in = random_inputs(p.grid, std::random_device{}());
  d.ref = reference(p.grid, d.in);
  return d;
}

// One line per op: position, stream, kind, the plan step, flags.
std::string listing(const DevProgram& prog) {
  std::string s;
  for (std::size_t i = 0; i < prog.ops.size(); ++i) {
    const DevOp& o = prog.ops[i];
    s += fmt::format("{:3} {:7} {:18} {}{}{}\n", i, o.stream == DevStream::compute ? "compute" : "comm",
                     dev_op_name(o.kind), o.what, o.accumulate ? " (accumulate)" : "", o.b_nk ? " (B [n,k])" : "");
  }
  return s;
}

std::vector<std::size_t> positions(const DevProgram& prog, DevOpKind k) {
  std::vector<std::size_t> v;
  for (std::size_t i = 0; i < prog.ops.size(); ++i)
    if (prog.ops[i].kind == k) v.push_back(i);
  return v;
}

}  // namespace

TEST(CommirGpuProgram, EveryGemmStrategySimulatesExactly) {
  for (int world : {2, 4, 8})
    for (const auto& name : schedule_names("gemm", 1))
      for (const bool b_nk : {true, false}) {
        SCOPED_TRACE(fmt::format("{} on {} ranks, B stored {}", name, world, b_nk ? "[n,k]" : "[k,n]"));
        const Plan p = gemm_plan(64, 48, 32, world, name);
        const Data d = fresh(p);
        // The CPU executor accepts the plan...
        ASSERT_LT(run_cpu(p, d.in, d.ref).max_rel_error, 1e-12);
        // ...and so must the GPU executor's program, with the same result.
        GpuSimRun run;
        try {
          run = simulate_gpu_programs(p, d.in, d.ref, GpuProgramOptions{b_nk});
        } catch (const std::exception& e) {
          FAIL() << e.what() << "\n" << describe(p, 30);
        }
        EXPECT_LT(run.max_rel_error, 1e-12);
        EXPECT_EQ(run.checked_elements, [&] {
          std::int64_t n = 0;
          for (const auto& [b, regions] : p.final)
            for (const auto& reg : regions)
              for (const auto& bx : reg) n += bx.volume();
          return n;
        }());
        EXPECT_GT(run.ops, 0);
      }
}

// The weight layout: the TP GEMM plans never move B, so every rank stores
// it [n, k] (what the hand-built operators take) and every GEMM reads it
// transposed; ragged shapes too. With the option off, nothing is transposed.
TEST(CommirGpuProgram, TpPlansStoreBInTheWeightLayout) {
  for (const auto& name : {"ag_gemm", "async_ag_gemm", "gemm_rs", "async_gemm_rs"})
    for (const auto& [m, n, k] : std::vector<std::tuple<int, int, int>>{{64, 48, 32}, {14, 10, 12}})
      for (int r = 0; r < 2; ++r) {
        SCOPED_TRACE(fmt::format("{} {}x{}x{} rank {}", name, m, n, k, r));
        const Plan p = gemm_plan(m, n, k, 2, name);
        const DevProgram prog = build_gpu_program(p, r);
        EXPECT_TRUE(prog.b_nk);
        int transposed = 0;
        for (const auto& b : prog.blocks) {
          EXPECT_EQ(b.transposed, b.buffer == "B") << b.buffer << box_text(b.box);
          transposed += b.transposed;
        }
        EXPECT_GT(transposed, 0);
        for (const auto i : positions(prog, DevOpKind::gemm)) {
          const DevOp& g = prog.ops[i];
          EXPECT_TRUE(g.b_nk) << g.what;
          EXPECT_TRUE(prog.blocks[g.b.block].transposed) << g.what;
          EXPECT_EQ(g.b.ld, prog.blocks[g.b.block].rows()) << g.what;  // K-major rows of B^T
        }
        const DevProgram kn = build_gpu_program(p, r, GpuProgramOptions{false});
        EXPECT_FALSE(kn.b_nk);
        for (const auto& b : kn.blocks) EXPECT_FALSE(b.transposed);
        for (const auto& op : kn.ops) EXPECT_FALSE(op.b_nk);
      }
}

// AsyncTP AllGather-GEMM on 2 ranks at MLP-1's shape (issue 6): the whole
// exchange (send of the own A block, receive of the peer's) is one NCCL group
// posted before the step-0 GEMM; the compute stream waits for the
// communication stream once, right before the step-1 GEMM that reads the
// received block; the received block is read in place (no copy); B is read
// in the weight layout.
TEST(CommirGpuProgram, AsyncAgGemmPostsTheExchangeBeforeTheFirstGemm) {
  const Plan p = lower(scheduled(make_gemm(8192, 11008, 4096, {2}), "async_ag_gemm"));
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(fmt::format("rank {}", r));
    const DevProgram prog = build_gpu_program(p, r);
    const std::string list = listing(prog);
    SCOPED_TRACE(list);
    if (r == 0) std::printf("async_ag_gemm, MLP-1, rank 0:\n%s", list.c_str());
    const auto& ops = prog.ops;
    const auto gemms = positions(prog, DevOpKind::gemm), sends = positions(prog, DevOpKind::send),
               recvs = positions(prog, DevOpKind::recv), waits = positions(prog, DevOpKind::compute_waits_comm),
               starts = positions(prog, DevOpKind::group_start), ends = positions(prog, DevOpKind::group_end);
    ASSERT_EQ(gemms.size(), 2u);
    ASSERT_EQ(sends.size(), 1u);
    ASSERT_EQ(recvs.size(), 1u);
    ASSERT_EQ(starts.size(), 1u);
    ASSERT_EQ(ends.size(), 1u);
    EXPECT_TRUE(positions(prog, DevOpKind::copy).empty()) << "an extra copy";
    EXPECT_LT(starts[0], sends[0]);
    EXPECT_LT(starts[0], recvs[0]);
    EXPECT_LT(sends[0], ends[0]);
    EXPECT_LT(recvs[0], ends[0]);
    EXPECT_LT(ends[0], gemms[0]);  // the exchange is in flight during the step-0 GEMM
    ASSERT_EQ(waits.size(), 1u);
    EXPECT_GT(waits[0], gemms[0]);
    EXPECT_LT(waits[0], gemms[1]);
    // Step 0 on the own rows (held from the start), step 1 on the received ones, in place.
    const std::string own = r == 0 ? "A[0:4096,0:4096]" : "A[4096:8192,0:4096]";
    EXPECT_NE(ops[sends[0]].what.find(own), std::string::npos) << ops[sends[0]].what;
    EXPECT_EQ(ops[gemms[0]].a.block, ops[sends[0]].src.block);
    EXPECT_EQ(ops[gemms[1]].a.block, ops[recvs[0]].dst.block);
    EXPECT_EQ(ops[gemms[0]].m, 4096);
    EXPECT_EQ(ops[gemms[0]].n, 5504);
    EXPECT_EQ(ops[gemms[0]].k, 4096);
    for (const auto i : gemms) {
      EXPECT_TRUE(ops[i].b_nk);
      EXPECT_FALSE(ops[i].accumulate);
    }
    EXPECT_EQ(prog.outputs.at("C").at(0).second.size(), 2u);  // the two step blocks, read back in place
  }
}

// Ragged shapes: every plan the CPU executor accepts either simulates
// exactly or is refused at build time for NCCL's layout limit — never a
// missing block.
TEST(CommirGpuProgram, RaggedShapesRunOrAreRefusedUpFront) {
  int ran = 0;
  for (int world : {2, 4})
    for (const auto& [m, n, k] : std::vector<std::tuple<int, int, int>>{{13, 10, 11}, {9, 17, 8}})
      for (const auto& name : schedule_names("gemm", 1)) {
        SCOPED_TRACE(fmt::format("{} on {} ranks, {}x{}x{}", name, world, m, n, k));
        const Plan p = gemm_plan(m, n, k, world, name);
        const Data d = fresh(p);
        ASSERT_LT(run_cpu(p, d.in, d.ref).max_rel_error, 1e-12);
        try {
          EXPECT_LT(simulate_gpu_programs(p, d.in, d.ref).max_rel_error, 1e-12);
          ++ran;
        } catch (const std::exception& e) {
          EXPECT_NE(std::string(e.what()).find("divisible by the world size"), std::string::npos) << e.what();
        }
      }
  EXPECT_GT(ran, 0);
}

// The GPU test's shape: every rank's program builds (no "is not present").
TEST(CommirGpuProgram, GpuTestShapeBuildsOnEveryRank) {
  for (int world : {2, 4})
    for (const auto& name : schedule_names("gemm", 1)) {
      const Plan p = gemm_plan(2048, 2048, 2048, world, name);
      for (int r = 0; r < world; ++r) {
        SCOPED_TRACE(fmt::format("{} on {} ranks, rank {}", name, world, r));
        DevProgram prog;
        ASSERT_NO_THROW(prog = build_gpu_program(p, r));
        ASSERT_EQ(prog.outputs.count("C"), 1u);
        EXPECT_GT(prog.bytes(), 0);
      }
    }
}

// The GPU failure seen on commit 3a4d62a: AsyncTP AllGather-GEMM leaves each
// rank's output column block in one block per step; the output is assembled
// from all of them.
TEST(CommirGpuProgram, AsyncAllGatherOutputAssembledFromStepBlocks) {
  const Plan p = gemm_plan(2048, 2048, 2048, 2, "async_ag_gemm");
  const DevProgram prog = build_gpu_program(p, 0);
  const auto& outs = prog.outputs.at("C");
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(box_text(outs[0].first), "[0:2048,0:1024]");
  EXPECT_EQ(outs[0].second.size(), 2u);
}

TEST(CommirGpuProgram, SimulatorCatchesAMissingEvent) {
  const Plan p = gemm_plan(32, 32, 32, 2, "gemm_rs");
  const Data d = fresh(p);
  std::vector<DevProgram> progs{build_gpu_program(p, 0), build_gpu_program(p, 1)};
  auto& ops = progs[0].ops;
  const auto before = ops.size();
  std::erase_if(ops, [](const DevOp& op) { return op.kind == DevOpKind::comm_waits_compute; });
  ASSERT_LT(ops.size(), before);
  try {
    simulate_gpu_programs(p, progs, d.in, d.ref);
    FAIL() << "a ReduceScatter reading the GEMM's output without waiting for it passed";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("missing event"), std::string::npos) << e.what();
  }
}

TEST(CommirGpuProgram, SimulatorCatchesAnUnmatchedSend) {
  const Plan p = gemm_plan(32, 32, 32, 2, "async_ag_gemm");
  const Data d = fresh(p);
  std::vector<DevProgram> progs{build_gpu_program(p, 0), build_gpu_program(p, 1)};
  auto& ops = progs[1].ops;
  const auto it = std::find_if(ops.begin(), ops.end(), [](const DevOp& op) { return op.kind == DevOpKind::send; });
  ASSERT_NE(it, ops.end());
  ops.erase(it);
  try {
    simulate_gpu_programs(p, progs, d.in, d.ref);
    FAIL() << "a receive without its send completed";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("deadlock"), std::string::npos) << e.what();
  }
}

TEST(CommirGpuProgram, SimulatorCatchesUninitializedOutput) {
  const Plan p = gemm_plan(32, 32, 32, 2, "gemm_ar");
  const Data d = fresh(p);
  std::vector<DevProgram> progs{build_gpu_program(p, 0), build_gpu_program(p, 1)};
  // The first GEMM into a block overwrites it; make it accumulate instead.
  auto it = std::find_if(progs[0].ops.begin(), progs[0].ops.end(),
                         [](const DevOp& op) { return op.kind == DevOpKind::gemm; });
  ASSERT_NE(it, progs[0].ops.end());
  ASSERT_FALSE(it->accumulate);
  it->accumulate = true;
  const GpuSimRun run = simulate_gpu_programs(p, progs, d.in, d.ref);
  EXPECT_FALSE(run.max_rel_error < 1e-6) << "accumulating into unwritten memory passed";
}

// bf16 outputs (make_gemm's default, what the benchmark runs): every block,
// transfer and merge of the output is bf16, and the plans still simulate
// (the simulator computes in double; NCCL matching checks the dtypes).
TEST(CommirGpuProgram, Bf16OutputsStoreAndMoveBf16) {
  for (int world : {2, 4})
    for (const auto& name : schedule_names("gemm", 1)) {
      SCOPED_TRACE(fmt::format("{} on {} ranks", name, world));
      const Plan p = lower(scheduled(make_gemm(64, 48, 32, {world}), name));
      const Data d = fresh(p);
      EXPECT_LT(simulate_gpu_programs(p, d.in, d.ref).max_rel_error, 1e-12);
      for (int r = 0; r < world; ++r) {
        const DevProgram prog = build_gpu_program(p, r);
        for (const auto& b : prog.blocks) EXPECT_FALSE(b.f32) << b.buffer << box_text(b.box);
        for (const auto& op : prog.ops) {
          EXPECT_FALSE(op.f32) << dev_op_name(op.kind) << " " << op.what;
          EXPECT_NE(op.kind, DevOpKind::zero) << "a memset where the first GEMM could overwrite: " << op.what;
        }
      }
    }
}

// AsyncTP GEMM+RS on 2 ranks: the second step's GEMM must not wait for the
// partial received from the peer (that transfer overlaps it); the received
// partial is added afterwards, on the compute stream. The first GEMM makes
// the peer's rows, the second the own rows (ring reduce-scatter order), so the
// sum is the rank's output block: the only transfer is the partial — no
// epilogue exchange of the finished result (it cost ~0.11 ms on h200-x2 at
// MLP-1, issue 6).
TEST(CommirGpuProgram, AsyncGemmRsOverlapsThePartialTransfer) {
  const Plan p = lower(scheduled(make_gemm(2048, 2048, 2048, {2}), "async_gemm_rs"));
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(fmt::format("rank {}", r));
    const DevProgram prog = build_gpu_program(p, r);
    const auto& ops = prog.ops;
    SCOPED_TRACE(listing(prog));
    auto pos = [&](auto pred) {
      std::vector<std::size_t> v;
      for (std::size_t i = 0; i < ops.size(); ++i)
        if (pred(ops[i])) v.push_back(i);
      return v;
    };
    const auto gemms = pos([](const DevOp& o) { return o.kind == DevOpKind::gemm; });
    const auto recvs = pos([](const DevOp& o) { return o.kind == DevOpKind::recv; });
    const auto sends = pos([](const DevOp& o) { return o.kind == DevOpKind::send; });
    const auto adds = pos([](const DevOp& o) { return o.kind == DevOpKind::add; });
    ASSERT_EQ(gemms.size(), 2u);
    ASSERT_EQ(recvs.size(), 1u);
    ASSERT_EQ(sends.size(), 1u);
    ASSERT_EQ(adds.size(), 1u);
    for (const auto i : {recvs[0], sends[0]}) {
      EXPECT_NE(ops[i].what.find("partial"), std::string::npos) << ops[i].what;
      EXPECT_EQ(ops[i].what.find("epilogue"), std::string::npos) << "the finished result moves: " << ops[i].what;
    }
    // The peer's rows go out, the own rows come in and stay.
    const std::string own = r == 0 ? "C[0:1024,0:2048]" : "C[1024:2048,0:2048]";
    const std::string peer = r == 0 ? "C[1024:2048,0:2048]" : "C[0:1024,0:2048]";
    EXPECT_NE(ops[sends[0]].what.find(peer), std::string::npos) << ops[sends[0]].what;
    EXPECT_NE(ops[recvs[0]].what.find(own), std::string::npos) << ops[recvs[0]].what;
    const auto& outs = prog.outputs.at("C");
    ASSERT_EQ(outs.size(), 1u);
    EXPECT_EQ(box_text(outs[0].first), own.substr(1));
    EXPECT_EQ(ops[adds[0]].stream, DevStream::compute);
    EXPECT_FALSE(ops[gemms[1]].accumulate);
    EXPECT_LT(recvs[0], gemms[1]);  // posted before the GEMM it overlaps
    for (std::size_t i = recvs[0]; i < gemms[1]; ++i)
      EXPECT_NE(ops[i].kind, DevOpKind::compute_waits_comm) << "the second GEMM waits for the partial transfer";
    EXPECT_LT(gemms[1], adds[0]);
  }
}

TEST(CommirGpuProgram, OutsideTheGpuLimitsIsAClearError) {
  // Ragged rows: NCCL's ReduceScatter needs equal parts.
  try {
    build_gpu_program(gemm_plan(13, 10, 11, 2, "gemm_rs"), 0);
    FAIL() << "ragged ReduceScatter accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("divisible by the world size"), std::string::npos) << e.what();
  }
  // Two-level meshes.
  try {
    build_gpu_program(lower(scheduled(make_gemm(16, 16, 16, {2, 2}, tessera::DType::f32), "ag_gemm")), 0);
    FAIL() << "two-level mesh accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("one-level meshes"), std::string::npos) << e.what();
  }
  // Ragged shapes whose plans need no collective run (P2P only).
  const Plan p = gemm_plan(13, 10, 11, 2, "async_ag_gemm");
  const Data d = fresh(p);
  EXPECT_LT(simulate_gpu_programs(p, d.in, d.ref).max_rel_error, 1e-12);
}
