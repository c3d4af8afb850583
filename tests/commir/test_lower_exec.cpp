// Every named strategy lowers and its plan, run on the CPU executor, matches
// the un-parallelized loop nest on meshes 2, 4, 2x2 and 2x4, with regular and
// ragged shapes, MHA and GQA.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "tessera/commir/cpu_executor.hpp"
#include "tessera/commir/schedules.hpp"
#include "tessera/commir/text.hpp"
#include "tessera/commir/transforms.hpp"

using namespace tessera::commir;

namespace {

std::uint64_t fresh_seed() { return std::random_device{}(); }

void check(const Grid& op, const std::string& sched, const std::string& label) {
  SCOPED_TRACE(label + " schedule " + sched + " mesh " + mesh_string(op.mesh));
  Grid g = scheduled(op, sched);
  ASSERT_EQ(parse(print(g)), g);
  Plan p;
  try {
    p = lower(g);
  } catch (const std::exception& e) {
    FAIL() << label << " " << sched << " on " << mesh_string(op.mesh) << ": " << e.what() << "\n" << print(g);
  }
  const auto seed = fresh_seed();
  const Tensors in = random_inputs(g, seed);
  const Tensors ref = reference(g, in);
  CpuRun run;
  try {
    run = run_cpu(p, in, ref);
  } catch (const std::exception& e) {
    FAIL() << label << " " << sched << " on " << mesh_string(op.mesh) << ": " << e.what() << "\n" << describe(p, 30);
  }
  EXPECT_LT(run.max_rel_error, 1e-12) << "seed " << seed << "\n" << describe(p, 12);
  EXPECT_GT(run.checked_elements, 0);
  for (std::size_t r = 0; r < run.peak_bytes.size(); ++r)
    EXPECT_LE(run.peak_bytes[r], p.ranks[r].peak_bytes) << "rank " << r << " measured peak above the static footprint";
}

struct Shape {
  std::int64_t a, b, c;
};

}  // namespace

TEST(CommirExec, GemmStrategiesAllMeshes) {
  const std::vector<std::vector<int>> meshes{{2}, {4}, {2, 2}, {2, 4}};
  // Regular and ragged (extents not divisible by the mesh) shapes.
  const std::vector<Shape> shapes{{16, 16, 16}, {13, 10, 11}, {9, 17, 8}};
  for (const auto& mesh : meshes)
    for (const auto& s : shapes)
      for (const auto& name : schedule_names("gemm", static_cast<int>(mesh.size())))
        check(make_gemm(s.a, s.b, s.c, mesh, tessera::DType::f32), name, fmt::format("gemm {}x{}x{}", s.a, s.b, s.c));
}

TEST(CommirExec, AttentionStrategiesAllMeshes) {
  const std::vector<std::vector<int>> meshes{{2}, {4}, {2, 2}, {2, 4}};
  struct A {
    std::int64_t b, h, hkv, q, kv, d;
  };
  // MHA and GQA, regular and ragged sequence lengths.
  const std::vector<A> shapes{{1, 8, 8, 16, 16, 4}, {2, 8, 2, 11, 13, 3}, {1, 8, 4, 9, 10, 2}};
  for (const auto& mesh : meshes)
    for (const auto& s : shapes)
      for (const auto& name : schedule_names("attention", static_cast<int>(mesh.size())))
        check(make_attention(s.b, s.h, s.hkv, s.q, s.kv, s.d, mesh, tessera::DType::f32), name,
              fmt::format("attention b{} h{} hkv{} q{} kv{} d{}", s.b, s.h, s.hkv, s.q, s.kv, s.d));
}

namespace {

// The C rows of a compute box over the GEMM's grid axes (m, n, k).
Box c_box(const Grid& g, const Box& kb) {
  Box o;
  for (const auto& d : g.buffer("C").dims)
    for (std::size_t i = 0; i < g.axes.size(); ++i)
      if (g.axes[i].name == d.axis) o.r.push_back(kb.r[i]);
  return o;
}

}  // namespace

// AsyncTP GEMM+RS is the ring reduce-scatter: step t on the rank at ring
// coordinate i computes cell (t + i + 1) mod J, so the partials travel
// i+1 -> i and the last step computes the rows the rank owns — its result is
// final where the output is sharded, with no epilogue exchange. Every mesh,
// regular and ragged shapes.
TEST(CommirExec, AsyncGemmRsLastStepComputesOwnRows) {
  for (const auto& mesh : std::vector<std::vector<int>>{{2}, {4}, {2, 2}, {2, 4}})
    for (const auto& s : std::vector<Shape>{{16, 16, 16}, {13, 10, 11}, {9, 17, 8}}) {
      SCOPED_TRACE(fmt::format("mesh {} gemm {}x{}x{}", mesh_string(mesh), s.a, s.b, s.c));
      const Plan p = lower(scheduled(make_gemm(s.a, s.b, s.c, mesh, tessera::DType::f32), "async_gemm_rs"));
      const int J = mesh.back();
      ASSERT_EQ(p.steps_per_rank, J);
      // J - 1 partial hops per rank, nothing else on the links.
      EXPECT_EQ(p.counts()["p2p"], static_cast<int>(p.ranks.size()) * (J - 1)) << describe(p, 20);
      for (const auto& r : p.ranks) {
        SCOPED_TRACE(fmt::format("rank {}", r.rank));
        const Step* last = nullptr;
        for (const auto& st : r.steps) {
          EXPECT_FALSE(st.kind == StepKind::collective) << "a collective in the ring reduce-scatter";
          if (st.kind == StepKind::send || st.kind == StepKind::recv) {
            EXPECT_TRUE(st.partial);
            EXPECT_LT(st.time, p.steps_per_rank) << "an epilogue move of the result\n" << describe(p, 20);
          }
          if (st.kind == StepKind::compute) last = &st;
        }
        ASSERT_NE(last, nullptr);
        EXPECT_EQ(last->time, J - 1);
        const Region& own = p.final.at("C")[r.rank];
        ASSERT_EQ(own.size(), 1u);
        EXPECT_EQ(c_box(p.grid, last->box), own[0]) << describe(p, 20);
      }
    }
}

// The offset is for the reduction ring only: a read ring (AsyncTP AG+GEMM,
// RingAttention) still starts from the rank's own block, so step 0 receives
// nothing; a shift that rings both an input and the reduced output keeps that
// order too (the output's owner is then reached by one move after the ring).
TEST(CommirExec, ReadRingsStartFromTheOwnBlock) {
  auto no_recv_at_step0 = [](const Plan& p) {
    for (const auto& r : p.ranks)
      for (const auto& st : r.steps)
        if (st.kind == StepKind::recv && st.time <= 0) return false;
    return true;
  };
  for (const auto& mesh : std::vector<std::vector<int>>{{2}, {4}, {2, 4}}) {
    SCOPED_TRACE(mesh_string(mesh));
    const Plan ag = lower(scheduled(make_gemm(16, 16, 16, mesh, tessera::DType::f32), "async_ag_gemm"));
    EXPECT_TRUE(no_recv_at_step0(ag)) << describe(ag, 12);
    const Plan ring = lower(scheduled(make_attention(1, 4, 4, 16, 16, 2, mesh, tessera::DType::f32), "ring"));
    EXPECT_TRUE(no_recv_at_step0(ring)) << describe(ring, 12);
  }
  for (int p : {2, 4}) {
    // kv parallel (reduction), q shifted: Q and O both ride the ring.
    Grid g = make_attention(1, 2, 2, 8 + p, 12, 2, {p}, tessera::DType::f32);
    tessera::commir::apply(
        g, fmt::format("tile(kv,{0}) parallelize(kv0,0) tile(q,{0}) shift(q0,kv0) patch(attention)", p));
    SCOPED_TRACE(print(g));
    const Plan pl = lower(g);
    EXPECT_TRUE(no_recv_at_step0(pl)) << describe(pl, 20);
    const Tensors in = random_inputs(g, fresh_seed());
    EXPECT_LT(run_cpu(pl, in, reference(g, in)).max_rel_error, 1e-12) << describe(pl, 20);
  }
}

// A ring-reduced output whose partials do not pass to the neighbour one step
// after it was last used — further sequential loops inside the shifted one,
// or the shifted loop inside another so that the ring wraps and revisits
// every cell — still reaches the rank that continues it (from whichever
// rank holds it). `tessera plan attention` ranked such plans that dropped
// partials (relative error ~0.4-1 on the CPU executor) before 2026-11-26.
TEST(CommirExec, RingReducedPartialsSurviveInnerLoopsAndWraps) {
  for (int p : {2, 4})
    for (const std::string extra :
         {"tile(kv,2)", "tile(kv,2) reorder(kv1,q0)", "tile(h,2)", "tile(h,2) reorder(h0,q0)"}) {
      Grid g = make_attention(2, 4, 2, 8 + p, 12, 2, {p}, tessera::DType::f32);
      tessera::commir::apply(
          g, fmt::format("tile(kv,{0}) parallelize(kv0,0) tile(q,{0}) shift(q0,kv0) {1} patch(attention)", p, extra));
      SCOPED_TRACE(print(g));
      const Plan pl = lower(g);
      const Tensors in = random_inputs(g, fresh_seed());
      EXPECT_LT(run_cpu(pl, in, reference(g, in)).max_rel_error, 1e-12) << describe(pl, 30);
    }
}

// On a 2-D mesh an output reduced along a ring on one level and by an
// AllReduce on the other ends on the wrong ranks and is moved in the
// epilogue: a rank that receives a piece at T + 1 forwards it at T + 2, never
// before it has it (kv over both levels, h shifted by the outer kv loop).
TEST(CommirExec, EpilogueForwardsOnlyWhatHasArrived) {
  for (const std::string& script :
       {"tile(kv,2) parallelize(kv0,0) tile(kv,4) parallelize(kv1,1) tile(h,2) shift(h0,kv0) patch(attention)",
        "tile(kv,2) parallelize(kv0,0) tile(kv,4) parallelize(kv1,1) tile(q,4) shift(q0,kv1) patch(attention)"}) {
    SCOPED_TRACE(script);
    Grid g = make_attention(2, 4, 4, 12, 10, 2, {2, 4}, tessera::DType::f32);
    apply(g, script);
    const Plan p = lower(g);
    const Tensors in = random_inputs(g, fresh_seed());
    const Tensors ref = reference(g, in);
    try {
      EXPECT_LT(run_cpu(p, in, ref).max_rel_error, 1e-12);
    } catch (const std::exception& e) {
      FAIL() << e.what() << "\n" << describe(p, 30);
    }
    for (const auto& rp : p.ranks) {  // a rank's send of a finished O box follows its receive of it
      std::map<std::string, int> got;
      for (const auto& s : rp.steps)
        if (s.kind == StepKind::recv && s.buffer == "O" && !s.partial) got[box_text(s.box)] = s.time;
      for (const auto& s : rp.steps)
        if (s.kind == StepKind::send && s.buffer == "O" && !s.partial && got.count(box_text(s.box)))
          EXPECT_GT(s.time, got[box_text(s.box)]) << "rank " << rp.rank << " sends O" << box_text(s.box);
    }
  }
}

// Shards on two levels whose prologue collective would need data from
// outside its group are refused by lowering, naming the placements and why.
TEST(CommirExec, ShardsThatLeaveTheGroupAreRefused) {
  Grid g = make_attention(2, 4, 4, 12, 10, 2, {2, 4}, tessera::DType::f32);
  apply(g, "tile(kv,2) parallelize(kv0,0) tile(q,4) parallelize(q0,1) shard(Q,kv0,q) shard(Q,q0,h) patch(attention)");
  try {
    lower(g);
    FAIL() << "lowered";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("shard(Q,q0,h)"), std::string::npos) << what;
    EXPECT_NE(what.find("shard(Q,kv0,q)"), std::string::npos) << what;
    EXPECT_NE(what.find("no rank of its group"), std::string::npos) << what;
  }
}
