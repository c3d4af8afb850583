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
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>

#include "support/test_support.hpp"
#include "tessera/commir/gpu_executor.hpp"
#include "tessera/commir/schedules.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

using namespace tessera::commir;

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
