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
#include <set>
#include <tuple>

#include "tessera/commir/cpu_executor.hpp"
#include "tessera/commir/gpu_program.hpp"
#include "tessera/commir/schedules.hpp"
#include "tessera/commir/transforms.hpp"
#include "tessera/commir/tuner.hpp"

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

// AsyncTP AllGather-GEMM on 2 ranks at MLP-1's shape: the whole
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

// AsyncTP AllGather-GEMM leaves each rank's output column block in one block
// per step; the output is assembled from all of them (an output taken from
// one step's block alone is wrong on the GPU).
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
// MLP-1).
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

// ---- attention plans ------------------------------------------------------

namespace {

Plan attention_plan(const std::vector<std::int64_t>& s, int world, const std::string& name) {
  return lower(scheduled(make_attention(s[0], s[1], s[2], s[3], s[4], s[5], {world}, tessera::DType::f32), name));
}

std::int64_t final_elements(const Plan& p) {
  std::int64_t n = 0;
  for (const auto& [b, regions] : p.final)
    for (const auto& reg : regions)
      for (const auto& bx : reg) n += bx.volume() * p.grid.buffer(b).elem;
  return n;
}

int count_ops(const DevProgram& prog, DevOpKind k) { return static_cast<int>(positions(prog, k).size()); }

}  // namespace

// Every attention schedule `tessera plan attention` lists for a one-level
// mesh: the device programs of all ranks (attention calls, LSE merges,
// point-to-point transfers of the plan's boxes) simulate to the reference —
// the same result the CPU executor reaches — MHA and GQA, regular and ragged
// lengths, batch 1 and 2 (boxes that are not contiguous in their blocks).
TEST(CommirGpuProgram, EveryAttentionScheduleSimulatesExactly) {
  const std::vector<std::vector<std::int64_t>> shapes{
      {1, 8, 8, 16, 16, 4}, {2, 8, 2, 11, 13, 3}, {1, 8, 4, 9, 10, 2}, {2, 4, 1, 8, 12, 2}};
  int ran = 0;
  for (int world : {2, 4, 8})
    for (const auto& sh : shapes)
      for (const auto& name : schedule_names("attention", 1)) {
        SCOPED_TRACE(fmt::format("{} on {} ranks, attention b{} h{} hkv{} q{} kv{} d{}", name, world, sh[0], sh[1],
                                 sh[2], sh[3], sh[4], sh[5]));
        Plan p;
        try {
          p = attention_plan(sh, world, name);
        } catch (const std::exception&) {  // the schedule does not fit the shape (4 heads on 8 ranks)
          EXPECT_EQ(sh[1], 4);
          continue;
        }
        ++ran;
        const Data d = fresh(p);
        ASSERT_LT(run_cpu(p, d.in, d.ref).max_rel_error, 1e-12);
        GpuSimRun run;
        try {
          run = simulate_gpu_programs(p, d.in, d.ref, GpuProgramOptions{true, name});
        } catch (const std::exception& e) {
          FAIL() << e.what() << "\n" << describe(p, 40);
        }
        EXPECT_LT(run.max_rel_error, 1e-12);
        EXPECT_EQ(run.checked_elements, final_elements(p));
        EXPECT_GT(run.ops, 0);
      }
  EXPECT_GE(ran, 3 * 4 * 6 - 4);
}

// Every schedule `tessera plan attention` ranks for a one-level mesh (the
// tuner's feasible candidates: head / query / kv parallel, gathers,
// all-to-alls, rings of K/V or of partials, extra kv tiling merged locally,
// reduce-scatters along q or h) simulates to the reference too, or is
// refused at build time — none is, today.
TEST(CommirGpuProgram, EveryTunerAttentionCandidateSimulatesExactly) {
  const MachineProfile h100 = builtin_profile("h100");
  int ran = 0;
  for (int world : {2, 4})
    for (const auto& sh : std::vector<std::vector<std::int64_t>>{{1, 8, 2, 16, 16, 2}, {2, 4, 4, 12, 10, 2}}) {
      const Grid op = make_attention(sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], {world}, tessera::DType::f32);
      const TuneResult res = tune(op, h100);
      ASSERT_GT(res.ranked.size(), 0u);
      for (const Candidate& c : res.ranked) {
        SCOPED_TRACE(fmt::format("{} on {} ranks, shape {}", c.script, world, fmt::join(sh, ",")));
        const Plan p = lower(c.grid);
        const Data d = fresh(p);
        ASSERT_LT(run_cpu(p, d.in, d.ref).max_rel_error, 1e-12);
        try {
          const GpuSimRun run = simulate_gpu_programs(p, d.in, d.ref, GpuProgramOptions{true, c.script});
          EXPECT_LT(run.max_rel_error, 1e-12);
          EXPECT_EQ(run.checked_elements, final_elements(p));
          ++ran;
        } catch (const std::exception& e) {
          ADD_FAILURE() << e.what() << "\n" << describe(p, 40);
        }
      }
    }
  EXPECT_GT(ran, 50);
}

// What each schedule's program does on rank 0 of 2 (GQA 4/2 heads, batch 2):
// the kernel calls, the merges and the NCCL transfers the plan implies.
TEST(CommirGpuProgram, AttentionProgramsHaveTheExpectedShape) {
  const std::vector<std::int64_t> sh{2, 4, 2, 16, 16, 64};
  auto prog = [&](const std::string& name) { return build_gpu_program(attention_plan(sh, 2, name), 0); };
  {  // context parallel, K/V replicated: one kernel call, nothing moves
    const DevProgram p = prog("cp");
    EXPECT_EQ(count_ops(p, DevOpKind::attention), 1);
    EXPECT_EQ(count_ops(p, DevOpKind::merge), 0);
    EXPECT_EQ(count_ops(p, DevOpKind::send) + count_ops(p, DevOpKind::recv), 0);
  }
  {  // all-gather of K and V (one send + one receive each), then one call
    const DevProgram p = prog("cp_ag");
    EXPECT_EQ(count_ops(p, DevOpKind::attention), 1);
    EXPECT_EQ(count_ops(p, DevOpKind::send), 2);
    EXPECT_EQ(count_ops(p, DevOpKind::recv), 2);
    EXPECT_EQ(count_ops(p, DevOpKind::merge), 0);
  }
  {  // ring: the peer's K/V block arrives during step 0's call; step 1 merges
    // into the accumulator made from step 0's partial and writes the bf16 result
    const DevProgram p = prog("ring");
    EXPECT_EQ(count_ops(p, DevOpKind::attention), 2);
    EXPECT_EQ(count_ops(p, DevOpKind::merge), 2);
    const auto group = positions(p, DevOpKind::group_start), calls = positions(p, DevOpKind::attention);
    ASSERT_EQ(group.size(), 1u);
    EXPECT_LT(group[0], calls[0]) << listing(p);
    const auto waits = positions(p, DevOpKind::compute_waits_comm);
    ASSERT_EQ(waits.size(), 1u) << listing(p);
    EXPECT_GT(waits[0], calls[0]) << listing(p);
    EXPECT_LT(waits[0], calls[1]) << listing(p);
    const DevOp& last = p.ops[positions(p, DevOpKind::merge).back()];
    EXPECT_FALSE(last.merge.write_acc);
    ASSERT_GE(last.merge.out.block, 0);
    EXPECT_FALSE(p.blocks[last.merge.out.block].f32);  // the result is the bf16 partial
  }
  {  // Ulysses: three all-to-alls in (one NCCL group: a send and a receive each), one call, one out (O and its LSE)
    const DevProgram p = prog("ulysses");
    EXPECT_EQ(count_ops(p, DevOpKind::attention), 1);
    EXPECT_EQ(count_ops(p, DevOpKind::send), 5);
    EXPECT_EQ(count_ops(p, DevOpKind::recv), 5);
    EXPECT_EQ(count_ops(p, DevOpKind::group_start), 2);
    for (const auto& op : p.ops)
      if (op.kind == DevOpKind::send || op.kind == DevOpKind::recv)
        EXPECT_EQ(op.f32, op.what.find("LSE") != std::string::npos) << op.what;
  }
  {  // tree (AllReduce of partials): the peer's partial merged with the own one, in rank order
    const DevProgram p = prog("tree");
    EXPECT_EQ(count_ops(p, DevOpKind::attention), 1);
    EXPECT_EQ(count_ops(p, DevOpKind::merge), 2);
  }
}

// The ring at R = 4: step t's kernel waits for step t's K/V block only, not
// for step t + 1's, which is in flight during it (the compute stream's wait
// comes before the next prefetch group is posted).
TEST(CommirGpuProgram, RingAttentionOverlapsTheNextTransfer) {
  for (int world : {3, 4, 8}) {
    const Plan plan = attention_plan({1, 8, 8, 64, 64, 64}, world, "ring");
    for (int r = 0; r < world; ++r) {
      SCOPED_TRACE(fmt::format("{} ranks, rank {}", world, r));
      const DevProgram p = build_gpu_program(plan, r);
      const auto calls = positions(p, DevOpKind::attention), waits = positions(p, DevOpKind::compute_waits_comm),
                 groups = positions(p, DevOpKind::group_start);
      ASSERT_EQ(static_cast<int>(calls.size()), world);
      for (int t = 1; t + 1 < world; ++t) {
        auto before = [&](const std::vector<std::size_t>& v) {
          std::size_t last = 0;
          for (auto i : v)
            if (i < calls[t]) last = i;
          return last;
        };
        EXPECT_LT(before(waits), before(groups)) << "step " << t << "\n" << listing(p);
        EXPECT_GT(before(waits), calls[t - 1]) << "step " << t << "\n" << listing(p);
      }
    }
    const Data d = fresh(attention_plan({1, 4, 4, 12, 12, 2}, world, "ring"));
    EXPECT_LT(simulate_gpu_programs(attention_plan({1, 4, 4, 12, 12, 2}, world, "ring"), d.in, d.ref).max_rel_error,
              1e-12);
  }
}

// GQA boxes that start inside a group of query heads sharing a KV head are
// split into kernel calls that each index their KV heads from 0.
TEST(CommirGpuProgram, AttentionSplitsHeadRunsAcrossKvGroups) {
  // 6 heads over 3 ranks: [0,2) [2,4) [4,6) with groups of 3 -> rank 1 gets heads 2 | 3.
  const Plan p = lower(scheduled(make_attention(1, 6, 2, 8, 8, 64, {3}, tessera::DType::f32), "ulysses"));
  const DevProgram prog = build_gpu_program(p, 1);
  const auto calls = positions(prog, DevOpKind::attention);
  ASSERT_EQ(calls.size(), 2u) << listing(prog);
  for (auto i : calls) {
    EXPECT_EQ(prog.ops[i].attn.heads_q, 1);
    EXPECT_EQ(prog.ops[i].attn.heads_kv, 1);
  }
  const Data d = fresh(p);
  EXPECT_LT(simulate_gpu_programs(p, d.in, d.ref).max_rel_error, 1e-12);
}

// Partial attention results that ride a ring (kv parallel, q shifted: Q and
// O pass rank to rank) carry O and LSE and merge on arrival.
TEST(CommirGpuProgram, AttentionPartialsRideTheRing) {
  for (int world : {2, 3, 4}) {
    SCOPED_TRACE(fmt::format("{} ranks", world));
    Grid g = make_attention(1, 2, 2, 8 + world, 12, 2, {world}, tessera::DType::f32);
    tessera::commir::apply(
        g, fmt::format("tile(kv,{0}) parallelize(kv0,0) tile(q,{0}) shift(q0,kv0) patch(attention)", world));
    const Plan p = lower(g);
    const Data d = fresh(p);
    ASSERT_LT(run_cpu(p, d.in, d.ref).max_rel_error, 1e-12);
    GpuSimRun run;
    try {
      run = simulate_gpu_programs(p, d.in, d.ref);
    } catch (const std::exception& e) {
      FAIL() << e.what() << "\n" << describe(p, 40);
    }
    EXPECT_LT(run.max_rel_error, 1e-12);
    bool partial_lse = false;
    for (const auto& op : build_gpu_program(p, 0).ops)
      partial_lse |= op.kind == DevOpKind::send && op.f32 && op.what.find("partial") != std::string::npos;
    EXPECT_TRUE(partial_lse);
  }
}

// Schedules outside the GPU limits are refused at build time, before
// anything could launch, naming the schedule and why: GEMM plans on a
// two-level mesh (attention plans run there).
TEST(CommirGpuProgram, TwoLevelGemmIsRefusedNamingTheSchedule) {
  for (const std::string& name : schedule_names("gemm", 2)) {
    const Plan p = lower(scheduled(make_gemm(16, 16, 16, {2, 2}), name));
    try {
      build_gpu_program(p, 0, GpuProgramOptions{true, name});
      FAIL() << name << " on a 2x2 mesh built";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("(" + name + ")"), std::string::npos) << what;
      EXPECT_NE(what.find("one-level meshes only"), std::string::npos) << what;
    }
  }
}

// ---- attention on two-level meshes ----------------------------------------

namespace {

Plan attention_plan_2d(const std::vector<std::int64_t>& s, const std::vector<int>& mesh, const std::string& name,
                       tessera::DType dt = tessera::DType::f32) {
  return lower(scheduled(make_attention(s[0], s[1], s[2], s[3], s[4], s[5], mesh, dt), name));
}

// The CPU executor's result and the simulated GPU programs' both equal the
// reference to 1e-12, so they equal each other.
void expect_sim_equals_cpu(const Plan& p, const std::string& label) {
  const Data d = fresh(p);
  ASSERT_LT(run_cpu(p, d.in, d.ref).max_rel_error, 1e-12);
  GpuSimRun run;
  try {
    run = simulate_gpu_programs(p, d.in, d.ref, GpuProgramOptions{true, label});
  } catch (const std::exception& e) {
    FAIL() << e.what() << "\n" << describe(p, 40);
  }
  EXPECT_LT(run.max_rel_error, 1e-12);
  EXPECT_EQ(run.checked_elements, final_elements(p));
}

}  // namespace

// Every attention schedule `tessera plan attention` names for a two-level
// mesh (cp, cp_ag, ring = two_level, ulysses, tree, tree_rs over both
// levels; usp: Ulysses inside, ring across) simulates to the CPU executor's
// result at 2x2, 2x4 and 4x2, and on the degenerate meshes 1x2, 2x1, 1x4,
// 4x1: the per-level transfers run on sub-groups of ranks (those sharing the
// other coordinate) over the world communicator.
TEST(CommirGpuProgram, EveryTwoLevelAttentionScheduleSimulatesExactly) {
  const std::vector<std::vector<std::int64_t>> shapes{
      {1, 8, 8, 16, 16, 4}, {2, 8, 2, 11, 13, 3}, {1, 8, 4, 9, 10, 2}, {2, 4, 1, 8, 12, 2}};
  int ran = 0;
  for (const auto& mesh : std::vector<std::vector<int>>{{2, 2}, {2, 4}, {4, 2}, {1, 2}, {2, 1}, {1, 4}, {4, 1}})
    for (const auto& sh : shapes)
      for (const auto& name : schedule_names("attention", 2)) {
        SCOPED_TRACE(fmt::format("{} on {}, attention b{} h{} hkv{} q{} kv{} d{}", name, mesh_string(mesh), sh[0],
                                 sh[1], sh[2], sh[3], sh[4], sh[5]));
        Plan p;
        try {
          p = attention_plan_2d(sh, mesh, name);
        } catch (const std::exception& e) {  // 4 heads cannot be split 8 ways (ulysses)
          EXPECT_EQ(sh[1], 4) << e.what();
          continue;
        }
        ++ran;
        expect_sim_equals_cpu(p, name);
      }
  EXPECT_GE(ran, 7 * 4 * 8 - 8);
}

// Every schedule `tessera plan attention` ranks for a 2x2 and a 2x4 mesh
// (the tuner's feasible candidates: each level parallel over b, h, q or kv,
// with gathers, all-to-alls, rings of K/V or of partials, extra tiling, both
// loop orders) simulates to the CPU executor's result.
TEST(CommirGpuProgram, EveryTunerTwoLevelAttentionCandidateSimulatesExactly) {
  const MachineProfile h100 = builtin_profile("h100");
  int ran = 0;
  for (const auto& mesh : std::vector<std::vector<int>>{{2, 2}, {2, 4}})
    for (const auto& sh : std::vector<std::vector<std::int64_t>>{{1, 8, 2, 16, 16, 2}, {2, 4, 4, 12, 10, 2}}) {
      const Grid op = make_attention(sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], mesh, tessera::DType::f32);
      const TuneResult res = tune(op, h100);
      ASSERT_GT(res.ranked.size(), 0u);
      for (const Candidate& c : res.ranked) {
        SCOPED_TRACE(fmt::format("{} on {}, shape {}", c.script, mesh_string(mesh), fmt::join(sh, ",")));
        expect_sim_equals_cpu(lower(c.grid), c.script);
        ++ran;
      }
    }
  EXPECT_GT(ran, 1000);
}

// usp on 2x2: the Ulysses all-to-alls stay inside level 1 (rank 0 exchanges
// with rank 1 only) and the K/V ring runs across level 0 (rank 0 receives
// from rank 2); one kernel call per ring step.
TEST(CommirGpuProgram, UspExchangesPerLevel) {
  const Plan p = attention_plan_2d({1, 8, 8, 64, 64, 64}, {2, 2}, "usp", tessera::DType::bf16);
  const DevProgram prog = build_gpu_program(p, 0, GpuProgramOptions{true, "usp"});
  EXPECT_EQ(count_ops(prog, DevOpKind::attention), 2) << listing(prog);
  std::set<int> a2a_peers, ring_peers;
  for (const auto& op : prog.ops) {
    if (op.kind != DevOpKind::send && op.kind != DevOpKind::recv) continue;
    (op.what.find("AllToAll") != std::string::npos ? a2a_peers : ring_peers).insert(op.peer);
  }
  EXPECT_EQ(a2a_peers, std::set<int>{1}) << listing(prog);
  EXPECT_EQ(ring_peers, std::set<int>{2}) << listing(prog);
}

// On a one-level mesh the two-level schedules are not listed: two_level
// degenerates to the ring (the same grid, so it runs as ring does) and usp
// is refused when it is scheduled, naming itself and why.
TEST(CommirGpuProgram, TwoLevelSchedulesOnOneLevelMeshes) {
  const Grid op = make_attention(1, 8, 8, 16, 16, 64, {2});
  EXPECT_EQ(scheduled(op, "two_level"), scheduled(op, "ring"));
  try {
    scheduled(op, "usp");
    FAIL() << "usp on a one-level mesh was scheduled";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("schedule usp: needs a two-level mesh"), std::string::npos) << e.what();
  }
}

// CommirGpu.TunerAttentionCandidates' shape: every candidate the tuner
// ranks builds on every rank, and simulates exactly at 2 ranks.
TEST(CommirGpuProgram, TunerCandidatesOfTheGpuTestShapeBuild) {
  for (int world : {2, 4, 8}) {
    const Grid op = make_attention(1, 8, 2, 256, 256, 64, {world});
    const TuneResult res = tune(op, builtin_profile("h100"));
    ASSERT_GT(res.ranked.size(), 0u);
    for (const Candidate& c : res.ranked) {
      SCOPED_TRACE(fmt::format("{} on {} ranks", c.script, world));
      const Plan p = lower(c.grid);
      for (int r = 0; r < world; ++r) ASSERT_NO_THROW(build_gpu_program(p, r, GpuProgramOptions{true, c.script}));
      if (world == 2) {
        const Data d = fresh(p);
        EXPECT_LT(simulate_gpu_programs(p, d.in, d.ref).max_rel_error, 1e-12);
      }
    }
  }
}

// The GPU test's shapes and the benchmark's default shape (bench commir
// --attention) build on every rank (no "is not present").
TEST(CommirGpuProgram, AttentionGpuTestShapesBuildOnEveryRank) {
  for (int world : {2, 4, 8})
    for (const auto& sh : std::vector<std::vector<std::int64_t>>{
             {2, 8, 2, 256, 256, 64}, {1, 8, 8, 384, 384, 128}, {1, 32, 8, 16384, 16384, 128}})
      for (const auto& name : schedule_names("attention", 1)) {
        const Plan p = lower(scheduled(make_attention(sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], {world}), name));
        for (int r = 0; r < world; ++r) {
          SCOPED_TRACE(fmt::format("{} on {} ranks, rank {}", name, world, r));
          DevProgram prog;
          ASSERT_NO_THROW(prog = build_gpu_program(p, r, GpuProgramOptions{true, name}));
          ASSERT_EQ(prog.outputs.count("O"), 1u);
          EXPECT_GT(prog.bytes(), 0);
        }
      }
}

// The two-level GPU test's meshes and shapes (CommirGpu.TwoLevelAttention*:
// the 2-D factorizations of R = 2 and 4) and the benchmark's default shape on
// its default meshes (2x2 at R = 4, 2x4 at R = 8) build on every rank; the
// GPU test's smaller shape simulates exactly at 2x2.
TEST(CommirGpuProgram, TwoLevelGpuTestShapesBuildOnEveryRank) {
  struct Case {
    std::vector<int> mesh;
    std::vector<std::int64_t> sh;
  };
  std::vector<Case> cases;
  for (const auto& mesh : std::vector<std::vector<int>>{{1, 2}, {2, 1}, {2, 2}, {1, 4}, {4, 1}})
    for (const auto& sh : std::vector<std::vector<std::int64_t>>{{2, 8, 2, 256, 256, 64}, {1, 8, 8, 384, 384, 128}})
      cases.push_back({mesh, sh});
  for (const auto& mesh : std::vector<std::vector<int>>{{2, 2}, {2, 4}})
    cases.push_back({mesh, {1, 32, 8, 16384, 16384, 128}});
  for (const auto& [mesh, sh] : cases)
    for (const auto& name : schedule_names("attention", 2)) {
      const Plan p = lower(scheduled(make_attention(sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], mesh), name));
      for (int r = 0; r < p.grid.world(); ++r) {
        SCOPED_TRACE(fmt::format("{} on {}, rank {}, seq {}", name, mesh_string(mesh), r, sh[3]));
        DevProgram prog;
        ASSERT_NO_THROW(prog = build_gpu_program(p, r, GpuProgramOptions{true, name}));
        ASSERT_EQ(prog.outputs.count("O"), 1u);
        EXPECT_GT(prog.bytes(), 0);
      }
    }
  for (const auto& name : schedule_names("attention", 2)) {
    SCOPED_TRACE(name + " on 2x2 at the GPU test's shape");
    expect_sim_equals_cpu(attention_plan_2d({2, 8, 2, 256, 256, 64}, {2, 2}, name), name);
  }
}
