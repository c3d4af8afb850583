// CPU tests of the tuning layer: JSON cache (round trip, atomic write,
// versions, corrupt files), keys and nearest-neighbour lookup, bandwidth
// curve interpolation, machine-profile round trip, and the signal tuner
// (search, cache, neighbours, and the measured verdict).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "support/temp_dir.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/tune/cache.hpp"
#include "tessera/tune/key.hpp"
#include "tessera/tune/machine_profile.hpp"
#include "tessera/tune/signal_tuner.hpp"

namespace fs = std::filesystem;
using namespace tessera::tune;
using tessera::DType;

namespace {

using tessera::testing::TempDir;

MachineProfile sample_profile() {
  MachineProfile p;
  p.machine = {"NVIDIA H200", "NV18", 2};
  p.dtype = DType::bf16;
  p.sm_count = 132;
  p.nccl_sms = 16;
  p.per_group_overhead = 4e-6;
  p.gemm_penalty_per_group = 12e-6;
  // Shapes of a bandwidth curve (synthetic numbers for the test only).
  std::vector<BandwidthCurve::Point> pts;
  for (double mib : {0.25, 1.0, 4.0, 16.0, 64.0, 256.0}) {
    const double bytes = mib * (1 << 20);
    const double bw = 250e9 * bytes / (bytes + 8e6);
    pts.push_back({bytes, 10e-6 + bytes / bw});
  }
  p.curves[Collective::AllReduce] = BandwidthCurve(pts);
  p.curves[Collective::ReduceScatter] = BandwidthCurve(pts);
  p.gemms.push_back({8192, 8192, 4096, 128, 256, 1, 116, 75e-6, 1.3e-3});
  p.gemms.push_back({4096, 8192, 4096, 128, 256, 1, 116, 75e-6, 0.65e-3});
  return p;
}

/// Stores `p` in a fresh cache under `dir` and loads it back through another
/// Cache object (as a later process would).
std::optional<MachineProfile> store_and_reload(const MachineProfile& p, const fs::path& dir) {
  Cache c("machine_profile", MachineProfile::kCacheVersion, dir);
  p.store(c);
  return MachineProfile::load(Cache("machine_profile", MachineProfile::kCacheVersion, dir), p.machine, DType::bf16);
}

}  // namespace

TEST(Cache, RoundTripAcrossInstancesAndAtomicWrite) {
  TempDir dir("tessera_tune_test");
  {
    Cache c("plans", 3, dir.path());
    EXPECT_FALSE(c.get("a").has_value());
    c.put("a", {{"x", 1}});
    c.put("b", nlohmann::json::array({1, 2, 3}));
  }
  Cache c2("plans", 3, dir.path());
  ASSERT_TRUE(c2.get("a").has_value());
  EXPECT_EQ((*c2.get("a"))["x"], 1);
  EXPECT_EQ(*c2.get("b"), nlohmann::json::array({1, 2, 3}));
  // Another writer's entry is merged, not lost.
  Cache c3("plans", 3, dir.path());
  c2.put("c", 7);
  c3.put("d", 8);
  c3.reload();
  EXPECT_TRUE(c3.get("c").has_value());
  EXPECT_TRUE(c3.get("d").has_value());
  c3.erase("c");
  EXPECT_FALSE(Cache("plans", 3, dir.path()).get("c").has_value());
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "temporary file left: " << e.path();
}

TEST(Cache, VersionMismatchIsIgnoredAndReplaced) {
  TempDir dir("tessera_tune_test");
  Cache("plans", 1, dir.path()).put("a", 1);
  Cache v2("plans", 2, dir.path());
  EXPECT_FALSE(v2.get("a").has_value());
  v2.put("b", 2);
  EXPECT_TRUE(Cache("plans", 2, dir.path()).get("b").has_value());
  EXPECT_FALSE(Cache("plans", 1, dir.path()).get("a").has_value());
}

TEST(Cache, CorruptFileThrowsOrIsMovedAside) {
  TempDir dir("tessera_tune_test");
  std::ofstream(dir.path() / "plans.json") << "{ \"tessera_cache\": \"plans\", \"version\": 1, \"entries\": {";
  EXPECT_THROW(Cache("plans", 1, dir.path(), OnCorrupt::Throw), tessera::Error);
  try {
    Cache("plans", 1, dir.path(), OnCorrupt::Throw);
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("plans.json"), std::string::npos) << e.what();
  }
  Cache warn("plans", 1, dir.path(), OnCorrupt::Warn);
  EXPECT_TRUE(warn.entries().empty());
  warn.put("a", 1);
  EXPECT_TRUE(fs::exists(dir.path() / "plans.json.corrupt"));
  EXPECT_TRUE(Cache("plans", 1, dir.path(), OnCorrupt::Throw).get("a").has_value());
  // Valid JSON that is not a cache file is corrupt too.
  std::ofstream(dir.path() / "other.json") << "[1, 2]";
  EXPECT_THROW(Cache("other", 1, dir.path(), OnCorrupt::Throw), tessera::Error);
}

TEST(Cache, DirectoryComesFromTheEnvironment) {
  TempDir dir("tessera_tune_test");
  ::setenv("TESSERA_CACHE_DIR", dir.path().c_str(), 1);
  EXPECT_EQ(cache_dir(), dir.path());
  ::setenv("TESSERA_CACHE_DIR", "", 1);
  EXPECT_THROW(cache_dir(), tessera::Error);
  ::unsetenv("TESSERA_CACHE_DIR");
  if (std::getenv("HOME")) {
    EXPECT_EQ(cache_dir(), fs::path(std::getenv("HOME")) / ".cache" / "tessera");
  }
}

TEST(Key, NearestNeighbourUsesLogDistanceWithinThePrefix) {
  TempDir dir("tessera_tune_test");
  Cache c("plans", 1, dir.path());
  const MachineId m{"NVIDIA H200", "NV18", 2};
  const std::string p = key_prefix(m, DType::bf16, "signal.all_reduce");
  for (std::vector<std::int64_t> s :
       {std::vector<std::int64_t>{1024, 8192, 4096}, {8192, 8192, 4096}, {16384, 8192, 8192}})
    c.put(make_key(p, s), {{"shape", s}});
  c.put(make_key(key_prefix(m, DType::f16, "signal.all_reduce"), {7000, 8192, 4096}), {{"shape", {7000, 8192, 4096}}});
  auto nb = nearest(c, p, {7000, 8192, 4096});
  ASSERT_TRUE(nb.has_value());
  EXPECT_EQ(nb->key, make_key(p, {8192, 8192, 4096}));
  nb = nearest(c, p, {2000, 8192, 4096});  // log-distance: 2000 is nearer 1024 than 8192
  EXPECT_EQ(nb->key, make_key(p, {1024, 8192, 4096}));
  EXPECT_FALSE(nearest(c, key_prefix(m, DType::f32, "signal.all_reduce"), {1, 2, 3}).has_value());
  EXPECT_EQ(make_key(p, {1, 2}), "NVIDIA H200|NV18|w2|bf16|signal.all_reduce|1x2");
}

TEST(BandwidthCurve, InterpolatesLogLinearlyAndIsMonotone) {
  const BandwidthCurve c({{1e6, 20e-6}, {4e6, 40e-6}, {16e6, 100e-6}});
  EXPECT_DOUBLE_EQ(c.time(1e6), 20e-6);
  EXPECT_DOUBLE_EQ(c.time(4e6), 40e-6);
  EXPECT_DOUBLE_EQ(c.time(100), 20e-6);      // latency floor
  EXPECT_NEAR(c.time(32e6), 200e-6, 1e-15);  // last bandwidth holds
  // At the geometric midpoint the bandwidth is the mean of its neighbours'.
  EXPECT_NEAR(c.bandwidth(2e6), (1e6 / 20e-6 + 4e6 / 40e-6) / 2, 1e-3);
  double prev = 0;
  for (double b = 1e3; b < 1e8; b *= 1.07) {
    EXPECT_GE(c.time(b), prev);
    prev = c.time(b);
  }
  EXPECT_THROW(BandwidthCurve({{2e6, 1e-6}, {1e6, 2e-6}}), tessera::Error);
  EXPECT_THROW(BandwidthCurve({{1e6, 2e-6}, {2e6, 1e-6}}), tessera::Error);
  EXPECT_THROW(BandwidthCurve({{1e6, std::nan("")}}), tessera::Error);
  EXPECT_THROW(BandwidthCurve(std::vector<BandwidthCurve::Point>{}), tessera::Error);
}

TEST(MachineProfile, JsonAndCacheRoundTrip) {
  TempDir dir("tessera_tune_test");
  const MachineProfile p = sample_profile();
  const auto q = store_and_reload(p, dir.path());
  Cache c("machine_profile", MachineProfile::kCacheVersion, dir.path());
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(nlohmann::json(*q), nlohmann::json(p));
  EXPECT_DOUBLE_EQ(q->curve(Collective::AllReduce).time(3e6), p.curve(Collective::AllReduce).time(3e6));
  EXPECT_THROW(q->curve(Collective::AllToAll), tessera::Error);
  EXPECT_FALSE(MachineProfile::load(c, p.machine, DType::f16).has_value());
  EXPECT_DOUBLE_EQ(q->gemm_penalty_per_group, 12e-6);
  MachineProfile bad = p;
  bad.nccl_sms = 200;
  EXPECT_THROW(bad.store(c), tessera::Error);
  bad = p;
  bad.gemm_penalty_per_group = -1;
  EXPECT_THROW(bad.store(c), tessera::Error);
  // Profiles stored before the penalty existed read it as 0.
  nlohmann::json old = nlohmann::json(p);
  old.erase("gemm_penalty_per_group");
  EXPECT_EQ(old.get<MachineProfile>().gemm_penalty_per_group, 0.0);
}

TEST(SignalTuner, SearchesCachesAndReusesNeighbours) {
  TempDir dir("tessera_tune_test");
  Cache plans("signal_plans", SignalTuner::kCacheVersion, dir.path());
  SignalTuner t(sample_profile(), plans);
  SignalQuery q{Collective::AllReduce, 8192, 8192, 4096, 128, 256};
  const auto first = t.choose(q);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->source, "search");
  const auto again = t.choose(q);
  EXPECT_EQ(again->source, "cache");
  EXPECT_EQ(again->waves_per_group, first->waves_per_group);
  // Unseen (never timed) shape near 8192: the neighbour's partition, rescaled.
  SignalQuery u = q;
  u.m = 7680;
  const auto nb = t.choose(u);
  ASSERT_TRUE(nb.has_value());
  EXPECT_EQ(nb->source.rfind("neighbour", 0), 0u) << nb->source;
  const int waves = t.overlapped_model(u).waves();
  int sum = 0;
  for (int w : nb->waves_per_group) sum += w;
  EXPECT_EQ(sum, waves);
  // No neighbour for another collective and untimed shape.
  SignalQuery rs = u;
  rs.op = Collective::ReduceScatter;
  EXPECT_FALSE(t.choose(rs).has_value());
  // The choice never predicts worse than sequential.
  const auto cost = t.cost(q);
  EXPECT_LE(first->predicted, cost.sequential_gemm + cost.comm_all);
  SignalQuery untimed = q;
  untimed.k = 1234;
  EXPECT_THROW(t.cost(untimed), tessera::Error);
}

// ---- the measured verdict (never slower than non-overlap) ------------------

TEST(SignalVerdict, KeepsOverlapOnlyWhenMeasuredFasterByTheMargin) {
  EXPECT_TRUE(keep_overlap(0.97e-3, 1.0e-3, 0.01));
  EXPECT_FALSE(keep_overlap(0.99e-3, 1.0e-3, 0.01));   // exactly at the margin: not faster enough
  EXPECT_FALSE(keep_overlap(0.995e-3, 1.0e-3, 0.01));  // 0.5 % faster: inside the margin
  EXPECT_FALSE(keep_overlap(1.02e-3, 1.0e-3, 0.01));   // slower: never kept
  EXPECT_FALSE(keep_overlap(1.0e-3, 1.0e-3, 0.0));     // a tie is no gain
  EXPECT_TRUE(keep_overlap(0.999e-3, 1.0e-3, 0.0));
  EXPECT_THROW(keep_overlap(std::nan(""), 1.0e-3, 0.01), tessera::Error);  // NaN never passes
  EXPECT_THROW(keep_overlap(1.0e-3, std::nan(""), 0.01), tessera::Error);
  EXPECT_THROW(keep_overlap(0.0, 1.0e-3, 0.01), tessera::Error);
  EXPECT_THROW(keep_overlap(1.0e-3, -1.0, 0.01), tessera::Error);
  EXPECT_THROW(keep_overlap(1.0e-3, INFINITY, 0.01), tessera::Error);
  EXPECT_THROW(keep_overlap(1.0e-3, 1.0e-3, 1.0), tessera::Error);
  EXPECT_THROW(keep_overlap(1.0e-3, 1.0e-3, -0.01), tessera::Error);
}

TEST(SignalVerdict, RecordedVerdictOverridesThePredictionAndPersists) {
  TempDir dir("tessera_tune_test");
  const SignalQuery q{Collective::AllReduce, 8192, 8192, 4096, 128, 256};
  std::vector<int> searched;
  bool predicted_overlap = false;
  double predicted = 0;
  {
    Cache plans("signal_plans", SignalTuner::kCacheVersion, dir.path());
    SignalTuner t(sample_profile(), plans);
    const int W = t.overlapped_model(q).waves();
    const auto first = t.choose(q);
    ASSERT_TRUE(first.has_value());
    EXPECT_FALSE(first->verified);
    EXPECT_EQ(first->predicted_overlap, first->overlap);
    predicted_overlap = first->predicted_overlap;
    predicted = first->predicted;
    // The model's best overlapped partition, whatever best() decided.
    searched = {W / 3, W / 3, W - 2 * (W / 3)};
    // Measured 2 % slower than no overlap: the verdict is no overlap.
    const SignalChoice slow = t.record_measured(q, searched, 1.02e-3, 1.00e-3);
    EXPECT_TRUE(slow.verified);
    EXPECT_FALSE(slow.overlap);
    EXPECT_EQ(slow.waves_per_group, std::vector<int>{W});
    EXPECT_EQ(slow.source, "verified");
    EXPECT_DOUBLE_EQ(slow.measured_overlapped, 1.02e-3);
    EXPECT_DOUBLE_EQ(slow.measured_sequential, 1.00e-3);
    // The prediction stays visible beside the verdict.
    EXPECT_EQ(slow.predicted_overlap, predicted_overlap);
    EXPECT_DOUBLE_EQ(slow.predicted, predicted);
    const auto again = t.choose(q);
    ASSERT_TRUE(again.has_value());
    EXPECT_EQ(again->source, "verified");
    EXPECT_FALSE(again->overlap);
    EXPECT_TRUE(again->verified);
  }
  {
    // Another process: the verdict was stored.
    Cache plans("signal_plans", SignalTuner::kCacheVersion, dir.path());
    SignalTuner t(sample_profile(), plans);
    const auto c = t.choose(q);
    ASSERT_TRUE(c.has_value());
    EXPECT_TRUE(c->verified);
    EXPECT_FALSE(c->overlap);
    EXPECT_EQ(c->predicted_overlap, predicted_overlap);
    // A later measurement where the partition wins by 5 %: overlap, that partition.
    const SignalChoice fast = t.record_measured(q, searched, 0.95e-3, 1.00e-3);
    EXPECT_TRUE(fast.overlap);
    EXPECT_EQ(fast.waves_per_group, searched);
    EXPECT_EQ(t.choose(q)->waves_per_group, searched);
  }
}

TEST(SignalVerdict, NeighboursCarryTheVerdict) {
  TempDir dir("tessera_tune_test");
  Cache plans("signal_plans", SignalTuner::kCacheVersion, dir.path());
  SignalTuner t(sample_profile(), plans);
  const SignalQuery q{Collective::AllReduce, 8192, 8192, 4096, 128, 256};
  SignalQuery u = q;  // never timed: only a neighbour can answer
  u.m = 7680;
  const int W = t.overlapped_model(q).waves(), Wu = t.overlapped_model(u).waves();
  ASSERT_TRUE(t.choose(q).has_value());
  // Measured loss at q: the unseen neighbour gets no overlap, not the prediction.
  t.record_measured(q, {W / 2, W - W / 2}, 1.5e-3, 1.4e-3);
  auto nb = t.choose(u);
  ASSERT_TRUE(nb.has_value());
  EXPECT_FALSE(nb->overlap);
  EXPECT_FALSE(nb->verified);  // this shape itself was not measured
  EXPECT_EQ(nb->waves_per_group, std::vector<int>{Wu});
  EXPECT_NE(nb->source.find("(verified)"), std::string::npos) << nb->source;
  // Measured win at q: the neighbour gets q's partition, rescaled to its waves.
  t.record_measured(q, {W / 2, W - W / 2}, 1.2e-3, 1.4e-3);
  nb = t.choose(u);
  ASSERT_TRUE(nb.has_value());
  EXPECT_TRUE(nb->overlap);
  EXPECT_EQ(nb->waves_per_group.size(), 2u);
  int sum = 0;
  for (int w : nb->waves_per_group) sum += w;
  EXPECT_EQ(sum, Wu);
  // A shape that was only predicted is named so.
  SignalQuery v = q;
  v.m = 4096;
  v.op = Collective::ReduceScatter;
  ASSERT_TRUE(t.choose(v).has_value());  // timed in the profile: searched
  SignalQuery vu = v;
  vu.m = 3840;
  const auto pred_nb = t.choose(vu);
  ASSERT_TRUE(pred_nb.has_value());
  EXPECT_NE(pred_nb->source.find("(predicted)"), std::string::npos) << pred_nb->source;
}

TEST(SignalVerdict, BadMeasurementsAreRejectedAndLeaveTheCacheAlone) {
  TempDir dir("tessera_tune_test");
  Cache plans("signal_plans", SignalTuner::kCacheVersion, dir.path());
  SignalTuner t(sample_profile(), plans);
  const SignalQuery q{Collective::AllReduce, 8192, 8192, 4096, 128, 256};
  const auto first = t.choose(q);
  ASSERT_TRUE(first.has_value());
  const int W = t.overlapped_model(q).waves();
  EXPECT_THROW(t.record_measured(q, {W / 2, W / 2 + 5}, 1e-3, 1e-3), tessera::Error);  // not a partition of W
  EXPECT_THROW(t.record_measured(q, {W - 1, 0, 1}, 1e-3, 1e-3), tessera::Error);       // empty group
  EXPECT_THROW(t.record_measured(q, {W}, std::nan(""), 1e-3), tessera::Error);
  EXPECT_THROW(t.record_measured(q, {W}, 1e-3, 0.0), tessera::Error);
  const auto c = t.choose(q);
  EXPECT_EQ(c->source, "cache");
  EXPECT_FALSE(c->verified);
  EXPECT_EQ(c->waves_per_group, first->waves_per_group);
  // A plan cache of the old format (version 1: predictions only) is refused.
  Cache old("signal_plans_v1", 1, dir.path());
  EXPECT_THROW(SignalTuner(sample_profile(), old), tessera::Error);
}

// ---- profile format 2: comm slowdown beside the GEMM, no-overlap curves ----

namespace {

// `c` with every time multiplied by `f` (a curve of another communicator).
BandwidthCurve scaled(const BandwidthCurve& c, double f) {
  std::vector<BandwidthCurve::Point> pts = c.points();
  for (auto& p : pts) p.seconds *= f;
  return BandwidthCurve(pts);
}

}  // namespace

TEST(MachineProfile, FormatTwoRoundTripsAndFormatOneLoads) {
  TempDir dir("tessera_tune_test");
  MachineProfile p = sample_profile();
  p.comm_slowdown_beside_gemm = 0.25;
  p.no_overlap_curves[Collective::AllReduce] = scaled(p.curve(Collective::AllReduce), 0.8);
  const auto q = store_and_reload(p, dir.path());
  Cache c("machine_profile", MachineProfile::kCacheVersion, dir.path());
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(nlohmann::json(*q), nlohmann::json(p));
  EXPECT_EQ(nlohmann::json(*q).at("format").get<int>(), MachineProfile::kFormatVersion);
  EXPECT_DOUBLE_EQ(q->comm_slowdown_beside_gemm, 0.25);
  EXPECT_DOUBLE_EQ(q->no_overlap_curve(Collective::AllReduce).time(3e6),
                   0.8 * p.curve(Collective::AllReduce).time(3e6));
  // Measured for AR only: RS falls back to the overlap curve.
  EXPECT_DOUBLE_EQ(q->no_overlap_curve(Collective::ReduceScatter).time(3e6),
                   q->curve(Collective::ReduceScatter).time(3e6));
  EXPECT_THROW(q->no_overlap_curve(Collective::AllToAll), tessera::Error);

  // A format-1 entry (as stored before session 5): no slowdown, no-overlap = overlap curve.
  nlohmann::json old = nlohmann::json(p);
  old.erase("format");
  old.erase("comm_slowdown_beside_gemm");
  old.erase("no_overlap_curves");
  Cache c1("machine_profile_format1", MachineProfile::kCacheVersion, dir.path());
  c1.put(key_prefix(p.machine, DType::bf16, "profile"), old);
  const auto o = MachineProfile::load(c1, p.machine, DType::bf16);
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->comm_slowdown_beside_gemm, 0.0);
  EXPECT_TRUE(o->no_overlap_curves.empty());
  EXPECT_DOUBLE_EQ(o->no_overlap_curve(Collective::AllReduce).time(3e6), o->curve(Collective::AllReduce).time(3e6));
  // A newer format than this build reads is refused, not half-read.
  nlohmann::json newer = nlohmann::json(p);
  newer["format"] = MachineProfile::kFormatVersion + 1;
  EXPECT_THROW(newer.get<MachineProfile>(), tessera::Error);

  // validate(): slowdown in [0, 2], finite; every stored curve non-empty and monotone.
  for (double bad : {-0.01, 2.01, std::nan(""), double(INFINITY)}) {
    MachineProfile b = p;
    b.comm_slowdown_beside_gemm = bad;
    EXPECT_THROW(b.validate(), tessera::Error) << bad;
    EXPECT_THROW(b.store(c), tessera::Error) << bad;
  }
  MachineProfile edge = p;
  edge.comm_slowdown_beside_gemm = 2.0;
  EXPECT_NO_THROW(edge.validate());
  MachineProfile empty_curve = p;
  empty_curve.no_overlap_curves[Collective::ReduceScatter] = BandwidthCurve();
  EXPECT_THROW(empty_curve.validate(), tessera::Error);
  // A stored curve that decreases with size is rejected on load (by the curve and by validate()).
  nlohmann::json decreasing = nlohmann::json(p);
  decreasing["no_overlap_curves"]["all_reduce"] = {{1e6, 2e-6}, {2e6, 1e-6}};
  EXPECT_THROW(decreasing.get<MachineProfile>(), tessera::Error);
  // The stored entry is unchanged by the refused stores.
  const auto after =
      MachineProfile::load(Cache("machine_profile", MachineProfile::kCacheVersion, dir.path()), p.machine, DType::bf16);
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(nlohmann::json(*after), nlohmann::json(p));
}

TEST(SignalTuner, CostUsesCommSlowdownAndTheNoOverlapCurve) {
  TempDir dir("tessera_tune_test");
  Cache plans("signal_plans", SignalTuner::kCacheVersion, dir.path());
  MachineProfile p = sample_profile();
  p.comm_slowdown_beside_gemm = 0.4;
  const BandwidthCurve def = scaled(p.curve(Collective::AllReduce), 0.7);
  p.no_overlap_curves[Collective::AllReduce] = def;
  SignalTuner t(p, plans);
  const SignalQuery q{Collective::AllReduce, 8192, 8192, 4096, 128, 256};
  const tessera::signal::OverlapCost cost = t.cost(q);
  const GemmTiming& g = *p.find_gemm(q.m, q.n, q.k, q.tile_m, q.tile_n);
  // No overlap: the GEMM on all SMs, then the M x N output on the default communicator's curve.
  EXPECT_DOUBLE_EQ(cost.comm_all, def.time(8192.0 * 8192 * 2));
  EXPECT_DOUBLE_EQ(cost.comm_slowdown_beside_gemm, 0.4);
  const tessera::signal::PredictiveSearch s(cost);
  EXPECT_DOUBLE_EQ(s.predict_sequential(), g.full_gpu + def.time(8192.0 * 8192 * 2));
  // Two groups by hand: the first collective (beside the GEMM) takes 1.4 x the
  // split curve; the last is unslowed and starts after C(W) + 1 penalty.
  const auto wm = t.overlapped_model(q);
  const int W = wm.waves(), a = W / 2;
  const double tile_bytes = 128.0 * 256 * 2;
  const BandwidthCurve& split = p.curve(Collective::AllReduce);
  const double ovh = p.per_group_overhead, pen = p.gemm_penalty_per_group;
  const double end0 = a * g.per_wave + ovh + 1.4 * split.time(wm.wave_begin(a) * tile_bytes);
  const double end1 =
      std::max(W * g.per_wave + pen, end0) + ovh + split.time((wm.wave_begin(W) - wm.wave_begin(a)) * tile_bytes);
  EXPECT_NEAR(s.predict({a, W - a}), end1, 1e-12);
  // Same inputs, same model: the free function bench signal predicts with.
  const auto fc = signal_overlap_cost(p, q, g);
  EXPECT_DOUBLE_EQ(tessera::signal::PredictiveSearch(fc).predict({a, W - a}), s.predict({a, W - a}));
  EXPECT_DOUBLE_EQ(fc.comm_all, cost.comm_all);
  // The timing must be of the overlapped GEMM (NCCL's SMs taken).
  GemmTiming wrong = g;
  wrong.sms = p.sm_count;
  EXPECT_THROW(signal_overlap_cost(p, q, wrong), tessera::Error);
}

namespace {
// What a fresh tuner (empty plan cache) chooses for q on profile p.
SignalChoice choose_fresh(const SignalQuery& q, const MachineProfile& p) {
  TempDir dir("tessera_tune_test");
  Cache plans("signal_plans", SignalTuner::kCacheVersion, dir.path());
  SignalTuner t(p, plans);
  return *t.choose(q);
}
}  // namespace

// Each new profile field changes the choice on a hand-made profile: a tuner
// that ignored either would choose alike in both halves of the test.
TEST(SignalTuner, CommSlowdownChangesTheChoice) {
  const SignalQuery q{Collective::AllReduce, 8192, 8192, 4096, 128, 256};
  const auto choose_with = [&](double slowdown) {
    MachineProfile p = sample_profile();
    p.comm_slowdown_beside_gemm = slowdown;
    // The same default-communicator curve in both halves (0.7 x the split one).
    p.no_overlap_curves[Collective::AllReduce] = scaled(p.curve(Collective::AllReduce), 0.7);
    return choose_fresh(q, p);
  };
  const SignalChoice as_measured = choose_with(0.0), slowed = choose_with(2.0);
  EXPECT_TRUE(as_measured.overlap) << "predicted " << as_measured.predicted;
  EXPECT_FALSE(slowed.overlap) << "predicted " << slowed.predicted;
  EXPECT_GT(slowed.predicted, as_measured.predicted);
}

TEST(SignalTuner, NoOverlapCurveChangesTheChoice) {
  const SignalQuery q{Collective::AllReduce, 8192, 8192, 4096, 128, 256};
  const auto choose_with = [&](double default_comm_factor) {
    MachineProfile p = sample_profile();
    if (default_comm_factor > 0)
      p.no_overlap_curves[Collective::AllReduce] = scaled(p.curve(Collective::AllReduce), default_comm_factor);
    return choose_fresh(q, p);
  };
  // Without a default-communicator curve (format 1): the split curve, overlap wins.
  const SignalChoice fallback = choose_with(0);
  EXPECT_TRUE(fallback.overlap);
  // The default communicator's collective is much faster: no overlap wins.
  const SignalChoice fast_default = choose_with(0.2);
  EXPECT_FALSE(fast_default.overlap) << "predicted " << fast_default.predicted;
  EXPECT_LT(fast_default.predicted, fallback.predicted);
}

// ---- measured top-k refinement ----------------------------------------------

TEST(SignalTuner, CandidatesAreTheKBestPredictedPartitions) {
  TempDir dir("tessera_tune_test");
  Cache plans("signal_plans", SignalTuner::kCacheVersion, dir.path());
  SignalTuner t(sample_profile(), plans);
  const SignalQuery q{Collective::AllReduce, 8192, 8192, 4096, 128, 256};
  const int W = t.overlapped_model(q).waves();
  ASSERT_GE(W, 3);  // at least 4 partitions
  const auto c = t.candidates(q, 3);
  ASSERT_EQ(c.size(), 3u);
  const tessera::signal::PredictiveSearch s(t.cost(q));
  EXPECT_EQ(c[0].waves_per_group, s.best_overlapped().waves_per_group);
  for (std::size_t i = 0; i < c.size(); ++i) {
    EXPECT_NEAR(s.predict(c[i].waves_per_group), c[i].latency, 1e-12 * c[i].latency);
    if (i > 0) EXPECT_LE(c[i - 1].latency, c[i].latency);
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(c[i].waves_per_group, c[j].waves_per_group);
  }
  // The search's choice (when it overlaps) is candidate 0.
  const auto chosen = t.choose(q);
  ASSERT_TRUE(chosen.has_value());
  if (chosen->overlap) EXPECT_EQ(chosen->waves_per_group, c[0].waves_per_group);
  EXPECT_THROW(t.candidates(q, 0), tessera::Error);
  SignalQuery untimed = q;
  untimed.k = 1234;
  EXPECT_THROW(t.candidates(untimed, 3), tessera::Error);
}

TEST(SignalVerdict, TopKRecordsTheFastestMeasuredCandidate) {
  TempDir dir("tessera_tune_test");
  const SignalQuery q{Collective::AllReduce, 8192, 8192, 4096, 128, 256};
  std::vector<std::vector<int>> cand;
  {
    Cache plans("signal_plans", SignalTuner::kCacheVersion, dir.path());
    SignalTuner t(sample_profile(), plans);
    const int W = t.overlapped_model(q).waves();
    for (const auto& p : t.candidates(q, 3)) cand.push_back(p.waves_per_group);
    ASSERT_EQ(cand.size(), 3u);
    // The predicted best measured 2 % slower than no overlap, the third 4 %
    // faster: alone, the first would say "no overlap"; the top-k keeps the third.
    EXPECT_FALSE(t.record_measured(q, cand[0], 1.02e-3, 1.00e-3).overlap);
    const SignalChoice c =
        t.record_measured_candidates(q, {{cand[0], 1.02e-3}, {cand[1], 0.985e-3}, {cand[2], 0.96e-3}}, 1.00e-3);
    EXPECT_TRUE(c.verified);
    EXPECT_TRUE(c.overlap);
    EXPECT_EQ(c.waves_per_group, cand[2]);
    EXPECT_DOUBLE_EQ(c.measured_overlapped, 0.96e-3);
    EXPECT_DOUBLE_EQ(c.measured_sequential, 1.00e-3);
    EXPECT_EQ(c.measured_candidates, 3);
    // The fastest is inside the margin (0.5 % faster): no overlap.
    const SignalChoice close = t.record_measured_candidates(q, {{cand[0], 1.01e-3}, {cand[1], 0.995e-3}}, 1.00e-3);
    EXPECT_FALSE(close.overlap);
    EXPECT_EQ(close.waves_per_group, std::vector<int>{W});
    EXPECT_EQ(close.measured_candidates, 2);
    // A tie goes to the earlier (better predicted) candidate.
    const SignalChoice tie = t.record_measured_candidates(q, {{cand[1], 0.9e-3}, {cand[0], 0.9e-3}}, 1.00e-3);
    EXPECT_EQ(tie.waves_per_group, cand[1]);
    // The single-partition form is the list of one.
    EXPECT_EQ(t.record_measured(q, cand[1], 0.95e-3, 1.00e-3).measured_candidates, 1);
    const SignalChoice last = t.record_measured_candidates(q, {{cand[0], 0.97e-3}, {cand[1], 0.93e-3}}, 1.00e-3);
    EXPECT_EQ(last.waves_per_group, cand[1]);
  }
  {
    // Another process: the last verdict (cand[1], of two measured) was stored.
    Cache plans("signal_plans", SignalTuner::kCacheVersion, dir.path());
    SignalTuner t(sample_profile(), plans);
    const auto c = t.choose(q);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->source, "verified");
    EXPECT_TRUE(c->overlap);
    EXPECT_EQ(c->waves_per_group, cand[1]);
    EXPECT_DOUBLE_EQ(c->measured_overlapped, 0.93e-3);
    EXPECT_EQ(c->measured_candidates, 2);
    // Bad lists are refused before anything is stored: empty, a partition
    // twice, one bad time among good ones, one bad partition among good ones.
    const int W = t.overlapped_model(q).waves();
    EXPECT_THROW(t.record_measured_candidates(q, {}, 1e-3), tessera::Error);
    EXPECT_THROW(t.record_measured_candidates(q, {{cand[0], 0.5e-3}, {cand[0], 0.6e-3}}, 1e-3), tessera::Error);
    EXPECT_THROW(t.record_measured_candidates(q, {{cand[0], 0.5e-3}, {cand[2], std::nan("")}}, 1e-3), tessera::Error);
    EXPECT_THROW(t.record_measured_candidates(q, {{cand[0], 0.5e-3}, {{W, 1}, 0.4e-3}}, 1e-3), tessera::Error);
    EXPECT_THROW(t.record_measured_candidates(q, {{cand[0], 0.5e-3}}, INFINITY), tessera::Error);
    const auto after = t.choose(q);
    EXPECT_EQ(after->waves_per_group, cand[1]);
    EXPECT_DOUBLE_EQ(after->measured_overlapped, 0.93e-3);
    EXPECT_EQ(after->measured_candidates, 2);
  }
}

TEST(CacheHardening, RefusesLinksFifosHugeAndDeepFiles) {
  TempDir dir("tessera_tune_test");
  const fs::path f = dir.path() / "ops.json";
  const std::string doc = R"({"tessera_cache": "ops", "version": 2, "entries": {"k": 1}})";
  auto expect_refused = [&](const char* what, const char* fragment) {
    try {
      Cache("ops", 2, dir.path(), OnCorrupt::Throw);
      ADD_FAILURE() << what << ": accepted";
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << what << ": " << e.what();
    }
    EXPECT_FALSE(Cache("ops", 2, dir.path(), OnCorrupt::Warn).get("k").has_value()) << what;
    fs::remove(f);
  };
  std::ofstream(dir.path() / "real.json") << doc;
  fs::create_symlink(dir.path() / "real.json", f);
  expect_refused("symlink", "symbolic link");
  ::mkfifo(f.c_str(), 0600);
  expect_refused("fifo", "not a regular file");
  std::ofstream(f) << R"({"tessera_cache": "ops", "version": 2, "entries": {"k": )" << std::string(10000, '[')
                   << std::string(10000, ']') << "}}";
  expect_refused("deep", "nested deeper than 64");
  { std::ofstream(f) << doc; }
  fs::resize_file(f, kMaxCacheBytes + 1);
  expect_refused("huge", "bytes");
  std::ofstream(f) << R"({"tessera_cache": "ops", "version": 4294967298, "entries": {"k": 1}})";
  expect_refused("version 2^32+2", "outside");
  // The directory itself must not be a link when writing.
  fs::create_symlink(dir.path(), dir.path() / "link");
  EXPECT_THROW(Cache("ops", 2, dir.path() / "link", OnCorrupt::Throw).put("k", 1), tessera::Error);
}

TEST(CacheHardening, TemporaryFilesAreExclusiveAndLocksNotFollowed) {
  TempDir dir("tessera_tune_test");
  std::ofstream(dir.path() / "victim") << "precious";
  // The old predictable temporary name, planted as a link: left alone.
  fs::create_symlink(dir.path() / "victim", dir.path() / ("ops.json.tmp." + std::to_string(::getpid())));
  Cache c("ops", 2, dir.path(), OnCorrupt::Throw);
  c.put("k", 1);
  EXPECT_TRUE(Cache("ops", 2, dir.path(), OnCorrupt::Throw).get("k").has_value());
  std::ifstream in(dir.path() / "victim");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "precious");
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().rfind(".ops.json.tmp.", 0), std::string::npos) << "left: " << e.path();
  // A lock file that is a link is refused, not followed.
  TempDir d2;
  fs::create_symlink(dir.path() / "victim", d2.path() / "ops.json.lock");
  EXPECT_THROW(Cache("ops", 2, d2.path(), OnCorrupt::Throw).put("k", 1), tessera::Error);
}

TEST(CacheHardening, IntegersAreRangeCheckedNotTruncated) {
  EXPECT_EQ(json_int(nlohmann::json(7), "x", 0, 10), 7);
  EXPECT_THROW(json_int(nlohmann::json(4294967298ULL), "version", 0, 2147483647), tessera::Error);
  EXPECT_THROW(json_int(nlohmann::json(-4294967294LL), "version", 0, 2147483647), tessera::Error);
  EXPECT_THROW(json_int(nlohmann::json(2.5), "version", 0, 10), tessera::Error);
  EXPECT_THROW(json_int(nlohmann::json("2"), "version", 0, 10), tessera::Error);
  EXPECT_THROW(json_int(nlohmann::json(18446744073709551615ULL), "x", 0, 10), tessera::Error);
  // A profile entry whose world reads as 2 after truncation is refused.
  TempDir dir("tessera_tune_test");
  const MachineProfile p = sample_profile();
  nlohmann::json j = p;
  j["world"] = 4294967298ULL;
  Cache c("machine_profile", MachineProfile::kCacheVersion, dir.path());
  c.put(key_prefix(p.machine, DType::bf16, "profile"), j);
  EXPECT_THROW(
      MachineProfile::load(Cache("machine_profile", MachineProfile::kCacheVersion, dir.path()), p.machine, DType::bf16),
      tessera::Error);
}
