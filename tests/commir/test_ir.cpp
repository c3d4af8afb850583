// CommIR text round trip, transform validation (errors name the transform and
// the reason), and the CPU executor rejecting broken plans.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "tessera/commir/cpu_executor.hpp"
#include "tessera/commir/schedules.hpp"
#include "tessera/commir/text.hpp"
#include "tessera/commir/transforms.hpp"
#include "tessera/commir/tuner.hpp"
#include "tessera/runtime/error.hpp"

using namespace tessera::commir;

namespace {
// Expects `fn` to throw a tessera::Error whose message contains every fragment.
template <class F>
void expect_error(F fn, std::vector<std::string> fragments) {
  try {
    fn();
  } catch (const tessera::Error& e) {
    const std::string m = e.what();
    for (const auto& f : fragments) EXPECT_NE(m.find(f), std::string::npos) << "message: " << m << "\nmissing: " << f;
    return;
  }
  ADD_FAILURE() << "no error thrown; expected one containing " << fragments.front();
}
}  // namespace

TEST(CommirIr, RoundTripEveryNamedSchedule) {
  for (auto mesh : std::vector<std::vector<int>>{{2}, {2, 4}}) {
    for (const auto& n : schedule_names("gemm", static_cast<int>(mesh.size()))) {
      Grid g = scheduled(make_gemm(64, 32, 16, mesh), n);
      EXPECT_EQ(parse(print(g)), g) << print(g);
    }
    for (const auto& n : schedule_names("attention", static_cast<int>(mesh.size()))) {
      Grid g = scheduled(make_attention(2, 8, 2, 64, 48, 16, mesh), n);
      EXPECT_EQ(parse(print(g)), g) << print(g);
    }
  }
  Grid j = make_gemm(64, 32, 16, {2});
  apply(j, "tile(m,4) tile(k,2) join(m0,k0) tile(n,2) parallelize(n0,0) patch(gemm)");
  EXPECT_EQ(parse(print(j)), j) << print(j);
  EXPECT_EQ(j.loops.front().factors.size(), 2u);
}

TEST(CommirIr, ParseErrorsNameTheLine) {
  expect_error([] { parse("grid g {\n  axis m = x spatial\n}\n"); }, {"line 2", "integer"});
  expect_error([] { parse("grid g {\n  frobnicate\n}\n"); }, {"line 2", "unknown statement"});
  expect_error([] { parse("grid g {\n  axis m = 4 spatial\n  tile m 2\n}\n"); }, {"m#0", "covered by 0 loops"});
}

TEST(CommirIr, IllegalSchedulesNameTransformAndReason) {
  const Grid g = make_attention(1, 8, 8, 16, 16, 4, {2, 4});
  auto with = [&](const std::string& s) {
    Grid x = g;
    apply(x, s);
    return x;
  };
  expect_error([&] { with("tile(q,3) parallelize(q0,0)"); }, {"parallelize(q0, 0)", "extent 3", "2 devices"});
  expect_error([&] { with("tile(q,2) parallelize(q0,5)"); }, {"parallelize(q0, 5)", "levels 0..1"});
  expect_error([&] { with("tile(q,2) parallelize(q0,0) tile(h,2) parallelize(h0,0)"); },
               {"parallelize(h0, 0)", "already taken by loop q0"});
  expect_error([&] { with("tile(q,2) parallelize(q0,0) tile(kv,4) shift(kv0,q0)"); },
               {"shift(kv0, q0)", "extent 4", "must match"});
  expect_error([&] { with("tile(q,2) tile(kv,2) shift(kv0,q0)"); }, {"shift(kv0, q0)", "not parallelized"});
  expect_error([&] { with("tile(q,2) parallelize(q0,0) tile(q,2) shift(q1,q0)"); }, {"shift(q1, q0)", "move no data"});
  expect_error([&] { with("tile(q,2) parallelize(q0,0) shard(Q,q0)"); }, {"shard(Q, q0)", "already partitioned"});
  expect_error([&] { with("tile(q,2) parallelize(q0,0) shard(K,q0,b)"); },
               {"shard(K, q0, b)", "fewer than the 2 ranks"});
  expect_error([&] { with("tile(q,2) parallelize(q0,0) shard(K,q0,kv) shard(K,q0,kv)"); },
               {"shard(K, q0, kv)", "already placed"});
  expect_error([&] { with("tile(q,17)"); }, {"tile(q, 17)", "16 element(s)"});
  expect_error([&] { with("tile(q,2) tile(kv,2) join(kv0,q0)"); }, {"join(kv0, q0)", "adjacent"});
  expect_error([&] { with("tile(q,2) parallelize(q0,0) tile(kv,2) join(q0,kv0)"); }, {"join(q0, kv0)", "parallelized"});
  expect_error([&] { with("reorder(q0)"); }, {"reorder(q0)", "no loop"});
  expect_error([&] { with("patch(gemm)"); }, {"patch(gemm)", "not a contraction"});
  expect_error([&] { with("patch(conv)"); }, {"patch(conv)", "unknown kernel"});
  expect_error([&] { with("bogus(q)"); }, {"unknown primitive 'bogus'"});
  // Lowering refuses incomplete schedules.
  expect_error([&] { lower(with("tile(q,2) parallelize(q0,0) patch(attention)")); },
               {"lower", "mesh level 1", "no parallel loop"});
  expect_error([&] { lower(with("tile(q,2) parallelize(q0,0) tile(h,4) parallelize(h0,1)")); }, {"lower", "no kernel"});
}

TEST(CommirIr, ExecutorRejectsBrokenPlans) {
  const Grid g = scheduled(make_attention(1, 4, 4, 8, 8, 2, {4}, tessera::DType::f32), "ring");
  const Plan good = lower(g);
  const Tensors in = random_inputs(g, std::random_device{}());
  const Tensors ref = reference(g, in);
  EXPECT_LT(run_cpu(good, in, ref).max_rel_error, 1e-12);
  // Dropping a receive: the compute that needs the block fails, naming it.
  {
    Plan bad = good;
    auto& st = bad.ranks[1].steps;
    st.erase(std::find_if(st.begin(), st.end(), [](const Step& s) { return s.kind == StepKind::recv; }));
    expect_error([&] { run_cpu(bad, in, ref, std::chrono::milliseconds(2000)); }, {"cpu executor", "rank 1"});
  }
  // Computing the wrong block (rank 2's own kv shard twice, at time 1 as at
  // time 0): wrong numbers. Compute boxes run over the grid axes b, h, q, kv.
  {
    Plan bad = good;
    auto& st = bad.ranks[2].steps;
    const auto own =
        std::find_if(st.begin(), st.end(), [](const Step& s) { return s.kind == StepKind::compute && s.time == 0; });
    ASSERT_NE(own, st.end());
    ASSERT_EQ(own->box.r.size(), 4u);
    const Range own_kv = own->box.r[3];
    int changed = 0;
    for (auto& s : st)
      if (s.kind == StepKind::compute && s.time == 1) {
        ASSERT_NE(s.box.r[3], own_kv);
        s.box.r[3] = own_kv;
        ++changed;
      }
    ASSERT_GT(changed, 0);
    bool caught = false;
    try {
      caught = run_cpu(bad, in, ref).max_rel_error > 1e-3;
    } catch (const tessera::Error&) {
      caught = true;
    }
    EXPECT_TRUE(caught);
  }
  // A removed send makes the receiver time out with a diagnostic, not hang.
  {
    Plan bad = good;
    auto& st = bad.ranks[0].steps;
    st.erase(std::find_if(st.begin(), st.end(), [](const Step& s) { return s.kind == StepKind::send; }));
    expect_error([&] { run_cpu(bad, in, ref, std::chrono::milliseconds(300)); }, {"timed out"});
  }
}

TEST(CommirIr, ValidationNamesTheOffenderAndTheReason) {
  const std::string k = print(scheduled(make_gemm(64, 32, 16, {2}), "async_ag_gemm"));
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = k;
    const auto i = s.find(from);
    EXPECT_NE(i, std::string::npos) << from;
    return s.replace(i, from.size(), to);
  };
  expect_error([&] { parse(with("tile n 2", "tile n 0")); }, {"n#0", "0 cells"});
  expect_error([&] { parse(with("A[m, k]", "A[m/0, k]")); }, {"buffer A", "group 0"});
  expect_error([&] { parse(with("A[m, k]", "A[]")); }, {"buffer A", "0 dimensions"});
  expect_error([&] { parse("grid g {\n}\n"); }, {"0 axes"});
  expect_error([&] { parse(with("m = 64", "m = 99999999999999999999")); }, {"line", "too large"});
  expect_error([&] { parse(with("  axis k = 16 reduction\n", "  axis k = 16 reduction\n  axis k = 8 reduction\n")); },
               {"axis 'k'", "declared twice"});
  expect_error(
      [&] { parse(with("  buffer C[m, n] : 1 write\n", "  buffer C[m, n] : 1 write\n  buffer C[m, n] : 1 write\n")); },
      {"buffer 'C'", "declared twice"});
  expect_error([&] { parse(with("B[k, n]", "B[k, z]")); }, {"buffer B", "'z'", "not an axis"});
  expect_error([&] { parse(with("body C += A * B", "body C += A * Z")); }, {"'Z'", "not a buffer"});
  expect_error([&] { parse(with("shift n0", "shift m0")); }, {"loop m0 shift m0", "cannot shift itself"});
  expect_error([&] { parse(with("shift n0", "shift zz")); }, {"no loop 'zz'"});
  expect_error([&] { parse(with("shard A n0", "shard Z n0")); }, {"no buffer 'Z'"});
  expect_error([&] { parse(with("mesh 2", "mesh 4096x4096x4096")); }, {"mesh '4096x4096x4096'", "256 devices"});
  expect_error([&] { parse(with("mesh 2", "mesh 4")); }, {"loop n0", "extent 2", "4 devices"});
  expect_error([&] { parse(with("  mesh 2\n", "  mesh 2\n  mesh 2\n")); }, {"second 'mesh'"});
  expect_error([&] { parse(with("kernel gemm", "kernel attention")); }, {"patch(attention)"});
  expect_error([&] { parse(k + std::string(kMaxTextBytes, '#')); }, {"bytes (at most"});
  expect_error([&] { parse_mesh("99999999999"); }, {"mesh '99999999999'"});
  expect_error([&] { parse_mesh("2x"); }, {"mesh '2x'"});
  expect_error([&] { make_gemm(std::int64_t{1} << 32, std::int64_t{1} << 32, std::int64_t{1} << 32, {2}); },
               {"make_gemm", "exceeds the limit"});
  Grid g = make_gemm(64, 32, 16, {2});
  expect_error([&] { apply(g, "tile(m,99999999999999999999)"); }, {"schedule: tile", "too large"});
  expect_error([&] { apply(g, "tile(m,0)"); }, {"tile(m, 0)", ">= 1"});
}

TEST(CommirIr, SearchStopsAtItsBudgetWithTheBestSoFar) {
  TuneOptions o;
  o.budget_s = 0.3;
  const auto t0 = std::chrono::steady_clock::now();
  const TuneResult r = tune(make_gemm(4096, 4096, 4096, {2, 2, 2, 2}), builtin_profile("h100"), o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(r.out_of_time);
  EXPECT_FALSE(r.ranked.empty());
  EXPECT_LT(s, 5.0);  // the budget plus one candidate, on a loaded machine
  o.budget_s = -1;
  EXPECT_THROW(tune(make_gemm(64, 64, 64, {2}), builtin_profile("h100"), o), tessera::Error);
}
