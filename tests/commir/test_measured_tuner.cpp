// The measured autotuner's host logic (measured_tuner.hpp) against a
// simulated machine: the "hardware" is the cost model with a profile the
// tuner does not know, so the best plan and the true scales are known.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "tessera/commir/measured_tuner.hpp"
#include "tessera/commir/schedules.hpp"
#include "tessera/runtime/error.hpp"

using namespace tessera::commir;

namespace {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/tessera-measured-tuner-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// A machine whose kernels run at `compute` and whose links at `comm` times the
// model's figures; counts the plans it runs.
struct SimulatedMachine {
  MachineProfile truth;
  int runs = 0;
  std::map<std::string, int> by_label;
  double operator()(const Plan& p, const std::string& label) {
    ++runs;
    ++by_label[label];
    return estimate(p, truth).time_us;
  }
};

const MachineProfile kModel = builtin_profile("h200x2");

// A plan's time on the machine, resharding from and to `contract` included.
double true_total(const Plan& p, const MachineProfile& truth, const Layout& contract) {
  return estimate(p, truth).time_us + contract_reshard_time(contract, p, truth);
}

}  // namespace

TEST(MeasuredTuner, CalibrationRecoversTheMachinesScales) {
  const Grid op = make_attention(1, 32, 8, 16384, 16384, 128, {4});
  const MachineProfile truth = scaled_profile(kModel, 0.7, 0.25);
  std::vector<Plan> plans;
  for (const char* name : {"cp_ag", "ring", "ulysses", "tree"}) plans.push_back(lower(scheduled(op, name)));
  std::vector<const Plan*> ptrs;
  std::vector<double> us;
  for (const Plan& p : plans) {
    ptrs.push_back(&p);
    us.push_back(estimate(p, truth).time_us);
  }
  const Calibration c = calibrate(kModel, ptrs, us);
  EXPECT_EQ(c.points, 4);
  EXPECT_NEAR(std::log2(c.compute_scale), std::log2(0.7), 0.07);
  EXPECT_NEAR(std::log2(c.comm_scale), std::log2(0.25), 0.07);
  EXPECT_LT(c.rms_log_error, 0.05);
}

TEST(MeasuredTuner, PicksTheFastestPlanOfASlowerLinkThanTheModelAssumes) {
  // Mercury's attention setting: activations arrive and leave sequence-sharded.
  const Grid op = make_attention(1, 32, 8, 32768, 32768, 128, {4});
  const Layout seq = layout_of(lower(scheduled(op, "ring")));
  SimulatedMachine hw{scaled_profile(kModel, 0.8, 0.1)};
  MeasureOptions o;
  o.top_k = 3;
  o.search.contract = &seq;
  const MeasureResult r = tune_measured(op, kModel, o, std::ref(hw));
  ASSERT_GE(r.pick, 0);
  EXPECT_FALSE(r.from_cache);
  EXPECT_EQ(hw.runs, 2 * o.top_k);  // two rounds of k
  for (const auto& [label, n] : hw.by_label) EXPECT_EQ(n, 1) << label << " ran twice";
  // The pick is the fastest plan the machine ran, and the fastest of all
  // candidates on the machine (the calibrated model ranks it in its top k).
  const MeasuredPlan& pick = r.plans[r.pick];
  for (const auto& p : r.plans)
    if (p.measured_us > 0) EXPECT_LE(pick.total_us(), p.total_us()) << p.label;
  double best = 0;
  for (const auto& p : r.plans) {
    const double t = true_total(lower(p.grid), hw.truth, seq);
    best = best == 0 ? t : std::min(best, t);
  }
  EXPECT_LE(true_total(lower(pick.grid), hw.truth, seq), best * (1 + 1e-9)) << pick.label;
  // Every measured plan is bound by its links here, so the link scale is
  // what the measurements determine.
  EXPECT_NEAR(std::log2(r.calibration.comm_scale), std::log2(0.1), 0.1);
  // The list is in calibrated order.
  for (std::size_t i = 1; i < r.plans.size(); ++i)
    EXPECT_LE(r.plans[i - 1].calibrated.time_us, r.plans[i].calibrated.time_us + 1e-9);
}

TEST(MeasuredTuner, CachesThePickPerShapeBucket) {
  TempDir dir;
  const Grid op = make_attention(1, 32, 8, 16384, 16384, 128, {2});
  SimulatedMachine hw{scaled_profile(kModel, 0.9, 0.5)};
  MeasureOptions o;
  o.cache_name = "commir-test";
  o.cache_dir = dir.path.string();
  o.cache_prefix = "NVIDIA H200|NV18|w2|bf16|commir.attention";
  const MeasureResult first = tune_measured(op, kModel, o, std::ref(hw));
  const int runs = hw.runs;
  ASSERT_GT(runs, 0);

  // Same bucket (a few percent longer sequence): the cached script, no runs.
  const Grid near = make_attention(1, 32, 8, 16384 + 512, 16384 + 512, 128, {2});
  const MeasureResult again = tune_measured(near, kModel, o, std::ref(hw));
  EXPECT_TRUE(again.from_cache);
  EXPECT_EQ(hw.runs, runs);
  ASSERT_EQ(again.plans.size(), 1u);
  EXPECT_EQ(again.plans[0].script, first.plans[first.pick].script);
  EXPECT_EQ(again.cache_key, first.cache_key);

  // Another bucket (twice the sequence), or refresh: measured again.
  const Grid far = make_attention(1, 32, 8, 32768, 32768, 128, {2});
  EXPECT_FALSE(tune_measured(far, kModel, o, std::ref(hw)).from_cache);
  EXPECT_GT(hw.runs, runs);
  o.refresh = true;
  const int before = hw.runs;
  EXPECT_FALSE(tune_measured(op, kModel, o, std::ref(hw)).from_cache);
  EXPECT_GT(hw.runs, before);
  EXPECT_NE(shape_bucket_key(o.cache_prefix, op), shape_bucket_key(o.cache_prefix, far));
}

TEST(MeasuredTuner, TheContractIsPartOfTheCacheKey) {
  TempDir dir;
  const Grid op = make_attention(1, 32, 8, 16384, 16384, 128, {2});
  const Grid near = make_attention(1, 32, 8, 16384 + 512, 16384 + 512, 128, {2});
  const Layout seq = layout_of(lower(scheduled(op, "ring")));
  const Layout seq_near = layout_of(lower(scheduled(near, "ring")));
  const Layout by_kv = layout_of(lower(scheduled(op, "tree")));  // K, V sharded along kv; Q whole
  const std::string p = "test";
  EXPECT_NE(shape_bucket_key(p, op), shape_bucket_key(p, op, &seq));
  EXPECT_NE(shape_bucket_key(p, op, &seq), shape_bucket_key(p, op, &by_kv));
  EXPECT_EQ(shape_bucket_key(p, op, &seq), shape_bucket_key(p, near, &seq_near));  // same sharding, same bucket

  // A pick cached without a contract is not reused under one.
  SimulatedMachine hw{scaled_profile(kModel, 0.9, 0.5)};
  MeasureOptions o;
  o.cache_name = "commir-test";
  o.cache_dir = dir.path.string();
  o.cache_prefix = p;
  EXPECT_FALSE(tune_measured(op, kModel, o, std::ref(hw)).from_cache);
  o.search.contract = &seq;
  EXPECT_FALSE(tune_measured(op, kModel, o, std::ref(hw)).from_cache);
  EXPECT_TRUE(tune_measured(op, kModel, o, std::ref(hw)).from_cache);
}

TEST(MeasuredTuner, PlansThatCannotRunAreSkippedAndNamed) {
  const Grid op = make_attention(1, 32, 8, 16384, 16384, 128, {2});
  SimulatedMachine hw{kModel};
  std::string refused;
  auto run = [&](const Plan& p, const std::string& label) -> double {
    if (refused.empty()) {
      refused = label;
      TESSERA_FAIL("out of memory (simulated)");
    }
    return hw(p, label);
  };
  MeasureOptions o;
  const MeasureResult r = tune_measured(op, kModel, o, run);
  ASSERT_GE(r.pick, 0);
  EXPECT_NE(r.plans[r.pick].label, refused);
  bool named = false;
  for (const auto& p : r.plans)
    if (p.label == refused) named = p.error.find("out of memory") != std::string::npos;
  EXPECT_TRUE(named);

  auto never = [](const Plan&, const std::string&) -> double { TESSERA_FAIL("no GPU (simulated)"); };
  try {
    tune_measured(op, kModel, o, never);
    FAIL() << "expected an error";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no GPU (simulated)"), std::string::npos) << e.what();
  }
}

TEST(MeasuredTuner, BadOptionsAreRejected) {
  const Grid op = make_attention(1, 32, 8, 16384, 16384, 128, {2});
  SimulatedMachine hw{kModel};
  MeasureOptions o;
  o.top_k = 0;
  EXPECT_THROW(tune_measured(op, kModel, o, std::ref(hw)), tessera::Error);
  o.top_k = 3;
  o.search.memory_limit_gb = 1e-6;  // nothing fits
  EXPECT_THROW(tune_measured(op, kModel, o, std::ref(hw)), tessera::Error);
  EXPECT_EQ(hw.runs, 0);
  EXPECT_THROW(tune_measured(op, kModel, MeasureOptions{}, PlanRunner{}), tessera::Error);
}
