// time_plan_on_gpus (measured_tuner.hpp): a lowered plan timed on the GPUs
// of a process group through the GPU executor.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "tessera/commir/gpu_executor.hpp"
#include "tessera/commir/measured_tuner.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::commir {
namespace {

// Uniform values in [-1, 1) (finite and varied; the tests check correctness).
std::vector<float> random_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& f : v) f = u(rng);
  return v;
}

// Elements of the full tensor of buffer `b` (GQA dimensions divided by their group).
std::size_t full_elements(const Grid& g, const Buffer& b) {
  std::int64_t n = b.elem;
  for (const Dim& d : b.dims) n *= g.axis(d.axis).extent / d.group;
  return static_cast<std::size_t>(n);
}

struct Events {
  std::vector<cudaEvent_t> ev;
  explicit Events(std::size_t n) : ev(n, nullptr) {
    for (auto& e : ev) TESSERA_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~Events() {
    for (auto e : ev)
      if (e) cudaEventDestroy(e);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

}  // namespace

double time_plan_on_gpus(runtime::ProcessGroup& pg, const Plan& plan, const std::string& label,
                         const PlanTimingOptions& opt) {
  TESSERA_CHECK(opt.reps >= 1 && opt.reps <= 1000 && opt.warmup >= 0 && opt.warmup <= 1000,
                "time_plan_on_gpus: reps {} / warmup {} outside [1, 1000] / [0, 1000]", opt.reps, opt.warmup);
  TESSERA_CHECK(plan.grid.world() == pg.world(), "time_plan_on_gpus: plan '{}' is for {} ranks, the group has {}",
                label, plan.grid.world(), pg.world());
  cudaStream_t s = pg.stream(), cs = pg.comm_stream(0);

  // Construction (allocation, kernel validation) may fail on one rank only:
  // agree before any rank issues a collective.
  std::unique_ptr<GpuExecutor> ex;
  std::string local_error;
  try {
    GpuExecutorOptions eo;
    eo.schedule = label;
    ex = std::make_unique<GpuExecutor>(plan, pg.rank(), pg.nccl(), s, cs, eo);
    std::uint64_t seed = opt.seed;
    for (const Buffer& b : plan.grid.buffers)
      if (b.access == Access::read) ex->set_input(b.name, random_values(full_elements(plan.grid, b), seed++));
  } catch (const Error& e) {
    local_error = e.what();
    ex.reset();
  }
  if (pg.allreduce_max(local_error.empty() ? 0.0 : 1.0) > 0)
    TESSERA_FAIL("time_plan_on_gpus: plan '{}' cannot run: {}", label,
                 local_error.empty() ? std::string("refused on another rank") : local_error);

  Events join(2), timing(2 * static_cast<std::size_t>(opt.reps));
  auto run_once = [&] {
    TESSERA_CUDA_CHECK(cudaEventRecord(join.ev[0], s));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, join.ev[0], 0));
    ex->run();
    TESSERA_CUDA_CHECK(cudaEventRecord(join.ev[1], cs));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, join.ev[1], 0));
  };
  for (int i = 0; i < opt.warmup; ++i) run_once();
  pg.synchronize(s, "time_plan_on_gpus: warm-up");
  pg.barrier();
  pg.align_streams(s);
  for (int i = 0; i < opt.reps; ++i) {
    TESSERA_CUDA_CHECK(cudaEventRecord(timing.ev[2 * i], s));
    run_once();
    TESSERA_CUDA_CHECK(cudaEventRecord(timing.ev[2 * i + 1], s));
  }
  pg.synchronize(s, "time_plan_on_gpus: timed runs");
  std::vector<double> us(static_cast<std::size_t>(opt.reps));
  for (int i = 0; i < opt.reps; ++i) {
    float ms = 0;
    TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, timing.ev[2 * i], timing.ev[2 * i + 1]));
    us[static_cast<std::size_t>(i)] = 1e3 * ms;
  }
  std::nth_element(us.begin(), us.begin() + opt.reps / 2, us.end());
  const double median = us[static_cast<std::size_t>(opt.reps / 2)];
  ex.reset();  // frees this plan's blocks before the next one allocates
  return pg.allreduce_max(median);
}

}  // namespace tessera::commir
