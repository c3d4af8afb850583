// The measured autotuner on GPUs (one process per GPU, `tessera run -n N`):
// time_plan_on_gpus is collective and returns the same time on every rank,
// so every rank takes the same decisions; a plan refused on one rank is
// refused on all without a hang; the pick is cached per shape bucket and
// reused without running anything. (The plans' results are checked against
// the CPU executor in commir_gpu_executor.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "support/test_support.hpp"
#include "tessera/commir/measured_tuner.hpp"
#include "tessera/commir/schedules.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

using namespace tessera::commir;

TEST(CommirMeasuredTunerGpu, RanksAgreeOnThePickAndReuseIt) {
  const int world = tessera::testing::launched_world_size();
  TESSERA_REQUIRE_GPUS(2);
  if (world < 2) GTEST_SKIP() << "start with tessera run -n 2 (one process per GPU)";
  auto pg = tessera::runtime::ProcessGroup::from_environment();
  const int R = pg->world();
  // A fresh cache directory, named by rank 0 for every rank.
  const std::uint64_t tag = pg->allgather(static_cast<std::uint64_t>(std::random_device{}()))[0];
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("tessera-mt-gpu-" + std::to_string(tag));

  const Grid op = make_attention(1, 8, 8, 1024 * R, 1024 * R, 128, {R});
  PlanTimingOptions to;
  to.reps = 3;
  to.warmup = 1;
  int runs = 0;
  auto runner = [&](const Plan& p, const std::string& label) {
    ++runs;
    return time_plan_on_gpus(*pg, p, label, to);
  };
  MeasureOptions mo;
  mo.top_k = 2;
  mo.cache_name = "commir-gpu-test";
  mo.cache_dir = dir.string();
  mo.cache_prefix = "test|w" + std::to_string(R);
  const MeasureResult r = tune_measured(op, builtin_profile("h200x2"), mo, runner);
  ASSERT_GE(r.pick, 0);
  EXPECT_GE(runs, 2);
  EXPECT_LE(runs, 4);
  const double pick_us = r.plans[r.pick].measured_us;
  EXPECT_GT(pick_us, 0);
  for (const auto& p : r.plans)
    if (p.measured_us > 0) EXPECT_LE(pick_us, p.measured_us) << p.label;
  // Every rank measured the same times (the slowest rank's) and picked the same plan.
  EXPECT_EQ(pg->allreduce_max(pick_us), pick_us);
  EXPECT_EQ(pg->allreduce_max(-pick_us), -pick_us);

  pg->barrier();  // rank 0's cache write is done before anyone reads (a shared /tmp)
  const MeasureResult again = tune_measured(op, builtin_profile("h200x2"), mo, runner);
  EXPECT_TRUE(again.from_cache);
  EXPECT_EQ(again.plans.at(0).script, r.plans[r.pick].script);
  EXPECT_LE(runs, 4);

  // A plan for another world size is refused before anything runs, on every rank.
  const Plan wrong = lower(scheduled(make_attention(1, 8, 8, 1024 * (R + 1), 1024 * (R + 1), 128, {R + 1}), "ring"));
  EXPECT_THROW(time_plan_on_gpus(*pg, wrong, "wrong world", to), tessera::Error);
  pg->barrier();
  if (pg->rank() == 0) std::filesystem::remove_all(dir);
}
