// GPU executor: every named TP GEMM plan (AllGather+GEMM, GEMM+ReduceScatter,
// GEMM+AllReduce, AsyncTP ring variants, Broadcast per step) on every rank
// of the job, with f32 outputs (bound 1e-4) and bf16 outputs (what the
// benchmark runs; bound 8e-3: each bf16 rounding of an output or a partial
// is <= 2^-9 relative, a few of them add up), checked against a float64 host
// GEMM of the same bf16-rounded inputs. One executor per plan runs 6 times,
// its non-input blocks poisoned with NaN before each run (a re-run must
// rewrite everything it reads back); prints the median time of each plan.
// Each plan runs with B stored [n, k] (the executor's default where the plan
// never moves B) and [k, n]. One process per GPU
// (`tessera run -n N`). The same plans' device programs are simulated on
// the host in commir_gpu_program (CPU test).
//
// All ranks agree (bootstrap allgather) on whether every rank could build
// its executor before any NCCL call is issued, so a rank that cannot run a
// plan does not leave the others inside a collective.
//
// Attention: every schedule `tessera plan attention` lists for the launched
// one-level mesh (cp, cp_ag, ring, ulysses, tree, tree_rs) on two small
// shapes (GQA 8/2 heads, batch 2, head_dim 64; MHA 8 heads, head_dim 128),
// fresh random bf16-rounded inputs, non-input blocks poisoned before each of
// 4 runs; this rank's O against the CPU executor's result — the float64 run
// of the same plan on the same inputs, which equals the un-parallelized
// reference (checked to 1e-12 here) — relative L2 error < 1e-2 (the
// attention kernel's own bound for bf16: P rounded to bf16, O rounded once
// per partial and once at the end). CommirGpu.TunerAttentionCandidates runs
// every schedule the tuner ranks for the mesh (`tessera plan attention`'s
// list) the same way on one shape.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>

#include "commir/attention_gpu_check.hpp"
#include "support/test_support.hpp"
#include "tessera/commir/cpu_executor.hpp"
#include "tessera/commir/gpu_executor.hpp"
#include "tessera/commir/schedules.hpp"
#include "tessera/commir/tuner.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

using namespace tessera::commir;
using namespace tessera::commir::gpu_check;

TEST(CommirGpu, TensorParallelGemmPlans) {
  const int world = tessera::testing::launched_world_size();
  TESSERA_REQUIRE_GPUS(2);
  if (world < 2) GTEST_SKIP() << "start with tessera run -n 2 (one process per GPU)";
  auto pg = tessera::runtime::ProcessGroup::from_environment();
  const std::int64_t M = 2048, N = 2048, K = 2048;
  // Same fresh inputs on every rank: rank 0 draws the seed.
  const std::uint64_t seed0 = std::random_device{}();
  const std::uint64_t seed = pg->allgather(seed0)[0];
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> A(M * K), B(K * N);
  for (auto& x : A) x = __bfloat162float(__float2bfloat16(u(rng)));
  for (auto& x : B) x = __bfloat162float(__float2bfloat16(u(rng)));
  std::vector<double> C(M * N, 0.0);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t k = 0; k < K; ++k) {
      const double a = A[i * K + k];
      for (std::int64_t j = 0; j < N; ++j) C[i * N + j] += a * B[k * N + j];
    }
  for (const tessera::DType dt : {tessera::DType::f32, tessera::DType::bf16})
    for (const std::string& name : schedule_names("gemm", 1))
      for (const bool b_nk : {true, false}) {  // B stored [n,k] (default where the plan allows) or [k,n]
        const char* dname = dt == tessera::DType::f32 ? "f32" : "bf16";
        SCOPED_TRACE(name + " " + dname + (b_nk ? " B[n,k]" : " B[k,n]"));
        GpuExecutorOptions eo;
        eo.b_nk = b_nk;
        const Plan plan = lower(scheduled(make_gemm(M, N, K, {pg->world()}, dt), name));
        std::unique_ptr<GpuExecutor> ex;
        std::string why;
        try {
          ex = std::make_unique<GpuExecutor>(plan, pg->rank(), pg->nccl(), pg->stream(), pg->comm_stream(0), eo);
          ex->set_input("A", A);
          ex->set_input("B", B);
          TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
        } catch (const std::exception& e) {
          why = e.what();
          ex.reset();
        }
        const auto ok = pg->allgather(static_cast<int>(why.empty()));
        if (std::count(ok.begin(), ok.end(), 0) > 0) {
          ADD_FAILURE() << "rank " << pg->rank() << ": "
                        << (why.empty() ? "another rank could not build the plan" : why);
          continue;
        }
        std::vector<double> times;
        double err = 0;
        for (int it = 0; it < 6; ++it) {
          ex->poison();
          TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
          pg->barrier();
          const auto t0 = std::chrono::steady_clock::now();
          ex->run();
          const auto out = ex->output("C");
          times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
          double num = 0, den = 0;
          for (const auto& [box, vals] : out)
            for (std::int64_t r = box.r[0].lo; r < box.r[0].hi; ++r)
              for (std::int64_t c = box.r[1].lo; c < box.r[1].hi; ++c) {
                const double ref = C[r * N + c];
                const double got = vals[(r - box.r[0].lo) * box.r[1].size() + (c - box.r[1].lo)];
                num += std::isnan(got) ? INFINITY : (got - ref) * (got - ref);
                den += ref * ref;
              }
          const double e = std::sqrt(num / den);
          err = std::isnan(e) ? INFINITY : std::max(err, e);
        }
        EXPECT_LT(err, dt == tessera::DType::f32 ? 1e-4 : 8e-3) << "rank " << pg->rank();
        std::sort(times.begin() + 1, times.end());
        std::printf("rank %d %-14s %-4s B%s rel err %.2e, median %.1f us incl. readback (not a benchmark)\n",
                    pg->rank(), name.c_str(), dname, ex->b_nk() ? "[n,k]" : "[k,n]", err, times[times.size() / 2]);
      }
}

TEST(CommirGpu, AttentionPlans) {
  const int world = tessera::testing::launched_world_size();
  TESSERA_REQUIRE_GPUS(2);
  if (world < 2) GTEST_SKIP() << "start with tessera run -n 2 (one process per GPU)";
  auto pg = tessera::runtime::ProcessGroup::from_environment();
  for (const AttnShape sh : {AttnShape{2, 8, 2, 256, 64}, AttnShape{1, 8, 8, 384, 128}}) {
    const Grid op = make_attention(sh.b, sh.h, sh.hkv, sh.s, sh.s, sh.d, {pg->world()});
    const AttnData d = attn_data(*pg, op);
    for (const std::string& name : schedule_names("attention", 1)) {
      SCOPED_TRACE(fmt::format("{} b{} h{} hkv{} s{} d{}", name, sh.b, sh.h, sh.hkv, sh.s, sh.d));
      const Plan plan = lower(scheduled(op, name));
      ASSERT_LT(run_cpu(plan, d.in, d.ref).max_rel_error, 1e-12);  // the CPU executor's result is the reference
      run_attention_plan(*pg, plan, name, sh, d);
    }
  }
}

// Every schedule `tessera plan attention` ranks for this mesh (the tuner's
// feasible candidates on the h100 profile; their CPU-executor equality at
// small shapes is commir_gpu_program's EveryTunerAttentionCandidate...).
TEST(CommirGpu, TunerAttentionCandidates) {
  const int world = tessera::testing::launched_world_size();
  TESSERA_REQUIRE_GPUS(2);
  if (world < 2) GTEST_SKIP() << "start with tessera run -n 2 (one process per GPU)";
  auto pg = tessera::runtime::ProcessGroup::from_environment();
  const AttnShape sh{1, 8, 2, 256, 64};
  const Grid op = make_attention(sh.b, sh.h, sh.hkv, sh.s, sh.s, sh.d, {pg->world()});
  const AttnData d = attn_data(*pg, op);
  const TuneResult res = tune(op, builtin_profile("h100"));  // deterministic: the same list on every rank
  ASSERT_GT(res.ranked.size(), 0u);
  for (const Candidate& c : res.ranked) {
    SCOPED_TRACE(c.script);
    run_attention_plan(*pg, lower(c.grid), c.script, sh, d);
  }
}

// Schedules outside the executor's limits are refused at construction,
// before any launch, with a message naming the schedule: GEMM plans on a
// two-level mesh of the launched ranks (1 x world; attention plans run
// there: commir_gpu_two_level).
TEST(CommirGpu, AttentionOutsideTheLimitsIsRefusedBeforeLaunch) {
  const int world = tessera::testing::launched_world_size();
  TESSERA_REQUIRE_GPUS(2);
  if (world < 2) GTEST_SKIP() << "start with tessera run -n 2 (one process per GPU)";
  auto pg = tessera::runtime::ProcessGroup::from_environment();
  for (const std::string name : {"ag_gemm", "gemm_rs"}) {
    const Plan plan = lower(scheduled(make_gemm(256, 256, 256, {1, pg->world()}), name));
    GpuExecutorOptions eo;
    eo.schedule = name;
    try {
      GpuExecutor ex(plan, pg->rank(), pg->nccl(), pg->stream(), pg->comm_stream(0), eo);
      ADD_FAILURE() << name << " on mesh 1x" << pg->world() << " was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("(" + name + ")"), std::string::npos) << e.what();
    }
  }
  // A head_dim the kernel does not support: refused by kernels::validate at construction.
  const Plan plan = lower(scheduled(make_attention(1, 8, 8, 256, 256, 32, {pg->world()}), "ring"));
  GpuExecutorOptions eo;
  eo.schedule = "ring";
  EXPECT_THROW(GpuExecutor(plan, pg->rank(), pg->nccl(), pg->stream(), pg->comm_stream(0), eo), tessera::Error);
}
