#include "tessera/tune/gemm_tuner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>

#include "tessera/runtime/error.hpp"
#include "tessera/tune/graph_timing.hpp"

namespace tessera::tune {

namespace k = tessera::kernels;

namespace {

constexpr k::GemmTile kTiles[] = {k::GemmTile::T128x256, k::GemmTile::T256x128, k::GemmTile::T128x128,
                                  k::GemmTile::T64x256,  k::GemmTile::T64x64,   k::GemmTile::T128x192,
                                  k::GemmTile::T128x32,  k::GemmTile::T128x64,  k::GemmTile::T128x96};

int bucket_of(int64_t x) {
  return static_cast<int>(std::lround(4 * std::log2(static_cast<double>(std::max<int64_t>(x, 1)))));
}

// Warns once per key and reason in this process.
void warn_once(const std::string& key, const std::string& why) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (!seen.insert(key + "\n" + why).second) return;
  fmt::print(stderr, "tessera: warning: ignoring GEMM tune cache entry {}: {}\n", key, why);
}

// The entry's plan made to fit `a`: its split count re-derived for a's K;
// nullopt unless the result is one of a's candidates. `why` says what failed.
std::optional<k::GemmPlan> fit_plan(const nlohmann::json& entry, const k::GemmArgs& a, std::string* why) {
  if (!entry.is_object() || !entry.contains("plan")) {
    *why = "no \"plan\"";
    return std::nullopt;
  }
  std::optional<k::GemmPlan> p = gemm_plan_from_json(entry["plan"]);
  if (!p) {
    *why = "malformed plan " + entry["plan"].dump();
    return std::nullopt;
  }
  if (p->k_splits > 1) {
    const int s = k::canonical_k_splits(a, p->k_splits);
    if (s == 1) {
      *why = fmt::format("plan {} does not split K = {}", k::plan_name(*p), a.k);
      return std::nullopt;
    }
    p->k_splits = s;
  }
  if (!k::gemm_plan_valid(a, *p)) {
    *why = fmt::format("plan {} is not one plan_gemm() could run for {}x{}x{} ({} -> {})", k::plan_name(*p), a.m, a.n,
                       a.k, dtype_name(a.in), dtype_name(a.out));
    return std::nullopt;
  }
  return p;
}

}  // namespace

MachineId gemm_machine(const std::string& gpu_name, int num_sms) {
  TESSERA_CHECK(num_sms > 0, "gemm_machine: num_sms = {} must be positive", num_sms);
  return MachineId{gpu_name, fmt::format("sm{}", num_sms), 1};
}

MachineId current_gemm_machine(int num_sms) {
  int dev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return gemm_machine(prop.name, num_sms);
}

std::array<int, 3> gemm_bucket(const k::GemmArgs& a) { return {bucket_of(a.m), bucket_of(a.n), bucket_of(a.k)}; }

std::string gemm_key_prefix(const MachineId& m, const k::GemmArgs& a) {
  return fmt::format("{}|out:{}|{}|row{}", key_prefix(m, a.in, "gemm.plan"), dtype_name(a.out),
                     a.b_layout == k::BLayout::NK ? "nk" : "kn", k::row_alignment(a));
}

std::string gemm_bucket_key(const MachineId& m, const k::GemmArgs& a) {
  const std::array<int, 3> b = gemm_bucket(a);
  return fmt::format("{}|b{}_{}_{}", gemm_key_prefix(m, a), b[0], b[1], b[2]);
}

nlohmann::json gemm_plan_to_json(const k::GemmPlan& p) {
  return {{"tile", k::tile_name(p.tile)}, {"ping_pong", p.ping_pong}, {"cluster_m", p.cluster_m},
          {"cluster_n", p.cluster_n},     {"k_splits", p.k_splits},   {"stream_k", p.stream_k},
          {"swap_ab", p.swap_ab},         {"name", k::plan_name(p)}};
}

std::optional<k::GemmPlan> gemm_plan_from_json(const nlohmann::json& j) {
  if (!j.is_object()) return std::nullopt;
  const auto tile = j.find("tile");
  const auto pp = j.find("ping_pong");
  const auto cl = j.find("cluster_m");
  const auto ks = j.find("k_splits");
  if (tile == j.end() || !tile->is_string() || pp == j.end() || !pp->is_boolean() || cl == j.end() ||
      !cl->is_number_integer() || ks == j.end() || !ks->is_number_integer())
    return std::nullopt;
  k::GemmPlan p;
  bool found = false;
  for (k::GemmTile t : kTiles)
    if (k::tile_name(t) == tile->get<std::string>()) {
      p.tile = t;
      found = true;
    }
  const int64_t c = cl->get<int64_t>(), s = ks->get<int64_t>();
  if (!found || c < 1 || c > 2 || s < 1 || s > 1024) return std::nullopt;
  p.ping_pong = pp->get<bool>();
  p.cluster_m = static_cast<int>(c);
  p.k_splits = static_cast<int>(s);
  // Optional: entries written before stream-K existed have no such field.
  const auto sk = j.find("stream_k");
  if (sk != j.end()) {
    if (!sk->is_boolean()) return std::nullopt;
    p.stream_k = sk->get<bool>();
  }
  const auto cn = j.find("cluster_n");  // optional likewise (entries before clusters along N)
  if (cn != j.end()) {
    if (!cn->is_number_integer() || cn->get<int64_t>() < 1 || cn->get<int64_t>() > 2) return std::nullopt;
    p.cluster_n = static_cast<int>(cn->get<int64_t>());
  }
  const auto sw = j.find("swap_ab");  // optional likewise (entries before swapped tiles)
  if (sw != j.end()) {
    if (!sw->is_boolean()) return std::nullopt;
    p.swap_ab = sw->get<bool>();
  }
  return p;
}

std::optional<GemmLookup> lookup_gemm_plan(const Cache& cache, const MachineId& m, const k::GemmArgs& a,
                                           double max_distance) {
  const std::string key = gemm_bucket_key(m, a);
  std::string why;
  if (auto e = cache.get(key)) {
    if (auto p = fit_plan(*e, a, &why)) return GemmLookup{*p, key, true, 0};
    warn_once(key, why);
    return std::nullopt;
  }
  // The nearest tuned shape of the same prefix whose plan fits this problem.
  const std::string prefix = gemm_key_prefix(m, a) + "|";
  const double want[3] = {static_cast<double>(a.m), static_cast<double>(a.n), static_cast<double>(a.k)};
  std::optional<GemmLookup> best;
  for (auto it = cache.entries().begin(); it != cache.entries().end(); ++it) {
    if (it.key().rfind(prefix, 0) != 0) continue;
    const nlohmann::json& e = *it;
    const nlohmann::json* shape = e.is_object() && e.contains("shape") ? &e["shape"] : nullptr;
    bool ok = shape && shape->is_array() && shape->size() == 3;
    double dist = 0;
    for (size_t i = 0; ok && i < 3; ++i) {
      ok = (*shape)[i].is_number() && (*shape)[i].get<double>() >= 1;
      if (ok) {
        const double l = std::log((*shape)[i].get<double>() / want[i]);
        dist += l * l;
      }
    }
    if (!ok) {
      warn_once(it.key(), "no valid \"shape\" [M, N, K]");
      continue;
    }
    if (dist > max_distance || (best && dist >= best->distance)) continue;
    std::string skip;
    if (auto p = fit_plan(e, a, &skip)) best = GemmLookup{*p, it.key(), false, dist};
  }
  return best;
}

namespace {

// The source installed into kernels::gemm(): one cache per process, read
// once, and the answer memoized per problem.
struct Installed {
  std::mutex mu;
  std::string dir;
  std::unique_ptr<Cache> cache;
  using Problem = std::tuple<int, int64_t, int64_t, int64_t, int, int, int, int, int>;
  std::map<Problem, std::optional<k::GemmPlan>> memo;
  std::map<int, std::string> gpu_names;
};

Installed& installed() {
  static Installed s;
  return s;
}

std::optional<k::GemmPlan> installed_lookup(const k::GemmArgs& a, int num_sms) {
  Installed& s = installed();
  int dev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  const Installed::Problem key{dev,
                               a.m,
                               a.n,
                               a.k,
                               k::row_alignment(a),
                               static_cast<int>(a.in),
                               static_cast<int>(a.out),
                               static_cast<int>(a.b_layout),
                               num_sms};
  std::lock_guard<std::mutex> lock(s.mu);
  if (auto it = s.memo.find(key); it != s.memo.end()) return it->second;
  if (!s.cache) return std::nullopt;
  auto name = s.gpu_names.find(dev);
  if (name == s.gpu_names.end()) {
    cudaDeviceProp prop{};
    TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    name = s.gpu_names.emplace(dev, prop.name).first;
  }
  std::optional<k::GemmPlan> p;
  if (auto l = lookup_gemm_plan(*s.cache, gemm_machine(name->second, num_sms), a)) p = l->plan;
  if (s.memo.size() >= 65536) s.memo.clear();
  s.memo.emplace(key, p);
  return p;
}

std::string dir_or_default(const std::string& d) { return d.empty() ? cache_dir().string() : d; }

}  // namespace

void install_gemm_tuned_plans(const std::string& dir) {
  Installed& s = installed();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    const std::string d = dir_or_default(dir);
    if (!s.cache || s.dir != d) {
      s.cache = std::make_unique<Cache>(kGemmCacheName, kGemmCacheVersion, d);
      s.dir = d;
    } else {
      s.cache->reload();
    }
    s.memo.clear();
  }
  k::set_gemm_plan_lookup(&installed_lookup);
}

GemmTuneResult gemm_tune(const k::GemmArgs& a, cudaStream_t caller, const GemmTuneOptions& o) {
  k::validate(a, "gemm_tune");
  TESSERA_CHECK(o.top_k >= 1 && o.top_k <= 64, "gemm_tune: top_k = {} outside [1, 64]", o.top_k);
  TESSERA_CHECK(o.reps >= 1 && o.warmup >= 0, "gemm_tune: reps = {} (>= 1), warmup = {} (>= 0)", o.reps, o.warmup);
  TESSERA_CHECK(o.target_us > 0, "gemm_tune: target_us = {} must be positive", o.target_us);
  k::GemmOptions base;
  base.max_ctas = o.max_ctas;
  const int sms = k::plan_sm_count(base);
  const MachineId machine = current_gemm_machine(sms);
  GemmTuneResult res;
  res.key = gemm_bucket_key(machine, a);
  res.model_plan = k::plan_gemm(a, base);
  const std::string dir = dir_or_default(o.cache_dir);
  std::optional<Cache> cache;
  if (o.use_cache) {
    cache.emplace(kGemmCacheName, kGemmCacheVersion, dir);
    if (!o.refresh)
      if (auto e = cache->get(res.key)) {
        std::string why;
        if (auto p = fit_plan(*e, a, &why)) {
          res.plan = *p;
          res.from_cache = true;
          install_gemm_tuned_plans(dir);
          return res;
        }
        warn_once(res.key, why);
      }
  }

  // The model's top_k, then its own pick (the legacy rule's, on large
  // aligned problems) if not among them.
  const std::vector<k::GemmPlanEstimate> ranked = k::gemm_plan_estimates(a, sms);
  const size_t top = std::min<size_t>(o.top_k, ranked.size());
  std::vector<k::GemmPlan> plans;
  if (std::none_of(ranked.begin(), ranked.begin() + top,
                   [&](const k::GemmPlanEstimate& x) { return x.plan == res.model_plan; }))
    plans.push_back(res.model_plan);
  for (size_t i = 0; i < top; ++i) plans.push_back(ranked[i].plan);
  // The model's pick first: it is the baseline of the margin.
  std::stable_partition(plans.begin(), plans.end(), [&](const k::GemmPlan& p) { return p == res.model_plan; });

  if (caller)
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(caller));
  else
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  cudaStream_t stream = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() {
      (void)cudaStreamSynchronize(s);
      (void)cudaStreamDestroy(s);
    }
  } guard{stream};

  // One eager call each: loads the kernels and drops plans that cannot run.
  std::vector<k::GemmPlan> runnable;
  for (const k::GemmPlan& p : plans) {
    try {
      k::gemm(a, k::plan_options(p, base), stream);
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
      runnable.push_back(p);
    } catch (const std::exception& e) {
      res.errors.push_back(k::plan_name(p) + ": " + e.what());
    }
  }
  TESSERA_CHECK(!runnable.empty(), "gemm_tune: none of the {} plans for {}x{}x{} could run (first: {})", plans.size(),
                a.m, a.n, a.k, res.errors.empty() ? "?" : res.errors.front());
  std::vector<std::function<void(int)>> bodies;
  for (const k::GemmPlan& p : runnable) {
    const k::GemmOptions po = k::plan_options(p, base);
    bodies.push_back([&a, po, stream](int) { k::gemm(a, po, stream); });
  }
  GraphTimingOptions g;
  g.warmup = o.warmup;
  g.reps = o.reps;
  g.calls = static_cast<int>(
      std::clamp(std::ceil(o.target_us / std::max(1.0, k::model_gemm_us(a, sms, res.model_plan))), 1.0, 16.0));
  const GraphTimes timed = time_graphs_interleaved(stream, bodies, g, "gemm_tune");
  if (!timed.gpu_only)
    fmt::print(stderr, "tessera: warning: gemm_tune {}x{}x{}: timed by host-recorded events ({})\n", a.m, a.n, a.k,
               timed.why);
  const std::vector<std::vector<double>>& us = timed.us;

  size_t pick = 0;
  double model_us = NAN;
  for (size_t i = 0; i < runnable.size(); ++i) {
    const double t = median_of(us[i]);
    res.times_us.push_back({runnable[i], t});
    if (runnable[i] == res.model_plan) model_us = t;
    if (t < res.times_us[pick].second) pick = i;
  }
  res.plan = runnable[pick];
  // The model's pick stays unless another plan beats it by the margin.
  if (std::isfinite(model_us) && res.times_us[pick].second > model_us * (1 - kGemmTuneMargin))
    res.plan = res.model_plan;
  // A pick outside the candidates (plan_gemm()'s own, where its rule names
  // a kernel the search would not) is what gemm() runs anyway: not cached.
  if (cache && k::gemm_plan_valid(a, res.plan)) {
    nlohmann::json times = nlohmann::json::object();
    for (const auto& [p, t] : res.times_us) times[k::plan_name(p)] = t;
    double chosen_us = NAN;
    for (const auto& [p, t] : res.times_us)
      if (p == res.plan) chosen_us = t;
    cache->put(res.key, {{"plan", gemm_plan_to_json(res.plan)},
                         {"shape", {a.m, a.n, a.k}},
                         {"us", chosen_us},
                         {"model_plan", k::plan_name(res.model_plan)},
                         {"model_us", std::isfinite(model_us) ? nlohmann::json(model_us) : nlohmann::json(nullptr)},
                         {"times_us", times}});
  }
  if (cache) install_gemm_tuned_plans(dir);
  return res;
}

}  // namespace tessera::tune
