// The ops tuner's measurements (tuning.hpp): load GEMMs, interleaved timing
// of the candidates, and the memo / cache / measure decision.
#include "tuning.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "tp_launchers.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops::detail {

namespace {

/// cuBLASLt GEMMs queued before every timed sample (sixteen 4096³ bf16
/// GEMMs, ~3.3 ms, on pseudo-random operands: 96 MiB, freed after tuning),
/// so that each candidate runs in the clock state of a loop that keeps the
/// GPU busy (the power cap), on a busy GPU with the whole call queued. The
/// GPU's clocks follow its load of the last few ms: after the idle gap
/// between samples, a 0.5 ms candidate runs at boost clocks, where cuBLASLt
/// is ~6 % faster than the engine's fused tile and decomposition wins MLP-1's
/// AG+GEMM near-tie that fused_ce wins at the cap (measured: the load GEMMs
/// ran at 748 TFLOP/s with 3 of them, 697 with 8 — decomposition still
/// chosen — and 662 with 16, close to bench mlp's 620-660, where the tuner's
/// order matched bench mlp's; a 1.5 s warm-up before sampling changed nothing).
/// TESSERA_TUNE_LOAD=n runs n GEMMs instead (0: none).
class TunerLoad {
 public:
  explicit TunerLoad(cudaStream_t s) {
    if (gemms_ <= 0) return;
    for (int i = 0; i < 3; ++i) {
      TESSERA_CUDA_CHECK(cudaMalloc(&buf_[i], kBytes));
      launch_fill_bf16(buf_[i], kN * kN, 0x5EEDu + i, s);
    }
  }
  ~TunerLoad() {
    for (void* p : buf_)
      if (p) cudaFree(p);  // cudaFree synchronizes the device: no GEMM still reads it
  }
  TunerLoad(const TunerLoad&) = delete;
  TunerLoad& operator=(const TunerLoad&) = delete;
  bool active() const { return buf_[0] != nullptr; }
  void run(cudaStream_t s) const {
    if (!buf_[0]) return;
    for (int i = 0; i < gemms_; ++i) {
      kernels::GemmArgs g{buf_[0], buf_[1], buf_[2], kN,          kN,          kN,
                          kN,      kN,      kN,      DType::bf16, DType::bf16, kernels::BLayout::NK};
      kernels::cublaslt_gemm(g, s);
    }
  }

 private:
  static constexpr std::int64_t kN = 4096;
  static constexpr std::size_t kBytes = kN * kN * 2;
  void* buf_[3] = {};
  int gemms_ = static_cast<int>(env::get_int("TESSERA_TUNE_LOAD", 16, 0, 256));
};

/// Timing events, destroyed on every path out.
struct Events {
  cudaEvent_t e[4] = {};
  Events() {
    for (cudaEvent_t& x : e) TESSERA_CUDA_CHECK(cudaEventCreate(&x));
  }
  ~Events() {
    for (cudaEvent_t x : e)
      if (x) cudaEventDestroy(x);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

}  // namespace

tune::MachineId machine_id(runtime::ProcessGroup& pg) {
  // Choices made with and without load/store reach never share a key.
  return tune::MachineId{pg.device_properties().name, topology_key(env::get("TESSERA_TOPOLOGY"), pg.lsa_reachable()),
                         pg.world()};
}

// Every candidate is timed run by run (repetition i runs each once, in
// order, after a drain, a barrier, the TunerLoad GEMMs and a one-element
// all-reduce that starts the ranks together — the barrier alone releases
// them tens of µs apart, and that skew would count against every strategy
// in proportion to how early it waits for a peer), so clock drift hits all
// alike; the median of each, max over ranks.
std::map<Strategy, double> time_candidates(runtime::ProcessGroup& pg, const TuneHooks& hooks,
                                           const std::vector<Strategy>& candidates, int warmup, int reps,
                                           double* load_ms, std::map<Strategy, PairedEvidence>* evidence) {
  cudaStream_t s = pg.stream();
  const TunerLoad load(s);
  std::vector<double> load_t;
  for (int i = 0; i < warmup; ++i)
    for (Strategy k : candidates) {
      load.run(s);
      hooks.run(k);
    }
  std::map<Strategy, std::vector<double>> t;
  const Events ev;
  const cudaEvent_t e0 = ev.e[0], e1 = ev.e[1], l0 = ev.e[2], l1 = ev.e[3];
  for (int i = 0; i < reps; ++i)
    for (Strategy k : candidates) {
      hooks.drain("ops tuner");
      pg.barrier();
      TESSERA_CUDA_CHECK(cudaEventRecord(l0, s));
      load.run(s);
      TESSERA_CUDA_CHECK(cudaEventRecord(l1, s));
      pg.align_streams(s);
      TESSERA_CUDA_CHECK(cudaEventRecord(e0, s));
      hooks.run(k);
      TESSERA_CUDA_CHECK(cudaEventRecord(e1, s));
      hooks.drain("ops tuner");
      float ms = 0;
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      t[k].push_back(ms);
      if (load.active()) {
        TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, l0, l1));
        load_t.push_back(ms);
      }
    }
  if (load_ms) {
    std::sort(load_t.begin(), load_t.end());
    *load_ms = pg.allreduce_max(load_t.empty() ? 0.0 : load_t[load_t.size() / 2]);
  }
  if (evidence) {
    // The same reduction on every rank in the same order (std::map), so the
    // host collectives pair up: the worst ratio and the fewest wins.
    *evidence = paired_evidence(t, candidates.front());
    for (auto& [k, e] : *evidence) {
      e.median_ratio = pg.allreduce_max(e.median_ratio);
      e.win_fraction = -pg.allreduce_max(-e.win_fraction);
    }
  }
  std::map<Strategy, double> out;
  for (auto& [k, v] : t) {
    std::sort(v.begin(), v.end());
    out[k] = pg.allreduce_max(v[v.size() / 2]);
  }
  return out;
}

Strategy tune_choice(runtime::ProcessGroup& pg, TuneState& st, const TuneQuery& q,
                     const std::vector<Strategy>& candidates, const TuneHooks& hooks, TuneReport* report) {
  const std::string key = tune::make_key(q.prefix, q.shape);
  TESSERA_CHECK(!candidates.empty(), "ops tuner: no candidate strategy for {}", key);
  if (auto it = st.memo.find(key); it != st.memo.end()) {
    if (report) report->chosen = it->second, report->from_cache = true;
    return it->second;
  }
  if (auto it = st.guessed.find(key); !q.tune_on_miss && it != st.guessed.end()) {
    if (report) report->chosen = it->second, report->from_cache = true;
    return it->second;
  }
  if (candidates.size() == 1) {  // e.g. no load/store reach: nothing to measure
    st.memo[key] = candidates.front();
    if (report) report->chosen = candidates.front(), report->from_cache = false;
    return candidates.front();
  }
  // Version 3: choices need paired evidence (tuner.hpp); those made by the
  // medians alone are not reused.
  if (q.use_cache && !st.cache) st.cache = std::make_unique<tune::Cache>("ops", 3);
  int cached = -1;
  if (q.use_cache) {
    if (auto j = st.cache->get(key))
      if (auto s = choice_from_json(*j, candidates))  // a strategy that is not a candidate here is ignored
        cached = static_cast<int>(*s);
  }
  const std::vector<int> all = pg.allgather(cached);
  if (cached > 0 && std::all_of(all.begin(), all.end(), [&](int v) { return v == cached; })) {
    const auto s = static_cast<Strategy>(cached);
    st.memo[key] = s;
    if (report) report->chosen = s, report->from_cache = true;
    return s;
  }
  if (!q.tune_on_miss) {
    // The nearest measured shape's choice (this process's or the cache's),
    // else the baseline; a host exchange makes every rank take the same one.
    nlohmann::json pool = st.measured;
    if (q.use_cache) pool.update(st.cache->entries());
    const auto nb = nearest_choice(pool, q.prefix, q.shape, q.sized, candidates);
    const int mine = static_cast<int>(nb.value_or(candidates.front()));
    const std::vector<int> votes = pg.allgather(mine);
    const bool agree = std::all_of(votes.begin(), votes.end(), [&](int v) { return v == mine; });
    const Strategy s = agree ? static_cast<Strategy>(mine) : candidates.front();
    st.guessed[key] = s;
    if (report) report->chosen = s, report->from_cache = agree && nb.has_value();
    return s;
  }
  double load_ms = 0;
  std::map<Strategy, PairedEvidence> evidence;
  const std::map<Strategy, double> times = time_candidates(pg, hooks, candidates, 2, 11, &load_ms, &evidence);
  const Strategy best = choose_strategy(times, evidence, 0.01, kMinWinFraction, candidates.front());
  st.memo[key] = best;
  st.measured[key] = choice_to_json(best, times, q.shape);
  if (q.use_cache) st.cache->put(key, st.measured[key]);
  if (report) {
    report->times_ms = times;
    report->evidence = evidence;
    report->chosen = best;
    report->from_cache = false;
    report->load_ms = load_ms;
  }
  return best;
}

std::optional<Strategy> agreed_choice(const TuneState& st, const TuneQuery& q) {
  const std::string key = tune::make_key(q.prefix, q.shape);
  if (auto it = st.memo.find(key); it != st.memo.end()) return it->second;
  if (auto it = st.guessed.find(key); it != st.guessed.end()) return it->second;
  return std::nullopt;
}

}  // namespace tessera::ops::detail
