#include "tessera/tune/machine_profile.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tessera/runtime/error.hpp"

namespace tessera::tune {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllReduce:
      return "all_reduce";
    case Collective::ReduceScatter:
      return "reduce_scatter";
    case Collective::AllGather:
      return "all_gather";
    case Collective::AllToAll:
      return "all_to_all";
  }
  return "?";
}

Collective parse_collective(const std::string& name) {
  for (Collective c : {Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather, Collective::AllToAll})
    if (name == collective_name(c)) return c;
  TESSERA_FAIL("tune::parse_collective: unknown collective '{}'", name);
}

namespace {

// `what` names the curve in the messages (e.g. "MachineProfile ...: no-overlap all_reduce curve").
void check_points(const std::vector<BandwidthCurve::Point>& pts, const std::string& what) {
  TESSERA_CHECK(!pts.empty(), "{}: needs at least one measured point", what);
  for (size_t i = 0; i < pts.size(); ++i) {
    const BandwidthCurve::Point& p = pts[i];
    TESSERA_CHECK(std::isfinite(p.bytes) && p.bytes > 0 && std::isfinite(p.seconds) && p.seconds > 0,
                  "{}: point {} ({} bytes, {} s) must be finite and positive", what, i, p.bytes, p.seconds);
    if (i > 0) {
      TESSERA_CHECK(p.bytes > pts[i - 1].bytes, "{}: sizes must increase, point {} has {} after {}", what, i, p.bytes,
                    pts[i - 1].bytes);
      TESSERA_CHECK(p.seconds >= pts[i - 1].seconds,
                    "{}: time must not decrease with size, point {} ({} bytes) takes {} s < {} s", what, i, p.bytes,
                    p.seconds, pts[i - 1].seconds);
    }
  }
}

}  // namespace

BandwidthCurve::BandwidthCurve(std::vector<Point> points) : points_(std::move(points)) {
  check_points(points_, "BandwidthCurve");
}

double BandwidthCurve::time(double bytes) const {
  TESSERA_CHECK(!points_.empty(), "BandwidthCurve::time: empty curve");
  TESSERA_CHECK(std::isfinite(bytes) && bytes >= 0, "BandwidthCurve::time: bytes must be >= 0, got {}", bytes);
  if (bytes <= points_.front().bytes) return points_.front().seconds;
  if (bytes >= points_.back().bytes) return bytes * points_.back().seconds / points_.back().bytes;
  const auto hi =
      std::upper_bound(points_.begin(), points_.end(), bytes, [](double b, const Point& p) { return b < p.bytes; });
  const Point& b = *hi;
  const Point& a = *(hi - 1);
  const double f = std::log(bytes / a.bytes) / std::log(b.bytes / a.bytes);
  const double bw = (1 - f) * (a.bytes / a.seconds) + f * (b.bytes / b.seconds);
  return std::clamp(bytes / bw, a.seconds, b.seconds);
}

const BandwidthCurve& MachineProfile::curve(Collective c) const {
  auto it = curves.find(c);
  TESSERA_CHECK(it != curves.end() && !it->second.empty(), "MachineProfile {}: no {} bandwidth curve measured",
                machine.str(), collective_name(c));
  return it->second;
}

const BandwidthCurve& MachineProfile::no_overlap_curve(Collective c) const {
  auto it = no_overlap_curves.find(c);
  if (it != no_overlap_curves.end() && !it->second.empty()) return it->second;
  return curve(c);  // format 1, or not measured on the default communicator
}

const GemmTiming* MachineProfile::find_gemm(std::int64_t m, std::int64_t n, std::int64_t k, int tile_m,
                                            int tile_n) const {
  for (const GemmTiming& g : gemms)
    if (g.m == m && g.n == n && g.k == k && g.tile_m == tile_m && g.tile_n == tile_n) return &g;
  return nullptr;
}

void MachineProfile::validate() const {
  TESSERA_CHECK(machine.world > 0 && sm_count > 0 && nccl_sms >= 0 && nccl_sms < sm_count,
                "MachineProfile {}: need world > 0 and 0 <= nccl_sms ({}) < sm_count ({})", machine.str(), nccl_sms,
                sm_count);
  TESSERA_CHECK(std::isfinite(per_group_overhead) && per_group_overhead >= 0,
                "MachineProfile {}: per-group overhead must be >= 0, got {}", machine.str(), per_group_overhead);
  TESSERA_CHECK(std::isfinite(gemm_penalty_per_group) && gemm_penalty_per_group >= 0,
                "MachineProfile {}: GEMM penalty per group must be >= 0, got {}", machine.str(),
                gemm_penalty_per_group);
  TESSERA_CHECK(
      std::isfinite(comm_slowdown_beside_gemm) && comm_slowdown_beside_gemm >= 0 && comm_slowdown_beside_gemm <= 2,
      "MachineProfile {}: comm slowdown beside the GEMM must be in [0, 2], got {}", machine.str(),
      comm_slowdown_beside_gemm);
  for (const auto* set : {&curves, &no_overlap_curves})
    for (const auto& [c, cv] : *set)
      check_points(cv.points(), fmt::format("MachineProfile {}: {} {} curve", machine.str(),
                                            set == &curves ? "overlap" : "no-overlap", collective_name(c)));
  for (const GemmTiming& g : gemms)
    TESSERA_CHECK(
        g.m > 0 && g.n > 0 && g.k > 0 && g.tile_m > 0 && g.tile_n > 0 && g.sms > 0 && g.per_wave > 0 && g.full_gpu > 0,
        "MachineProfile {}: GEMM timing {}x{}x{} has a non-positive field", machine.str(), g.m, g.n, g.k);
}

void MachineProfile::store(Cache& cache) const {
  validate();
  TESSERA_CHECK(cache.version() == kCacheVersion, "MachineProfile::store: cache {} has version {}, profiles use {}",
                cache.file().string(), cache.version(), kCacheVersion);
  cache.put(key_prefix(machine, dtype, "profile"), *this);
}

std::optional<MachineProfile> MachineProfile::load(const Cache& cache, const MachineId& machine, DType dtype) {
  auto j = cache.get(key_prefix(machine, dtype, "profile"));
  if (!j) return std::nullopt;
  MachineProfile p;
  try {
    p = j->get<MachineProfile>();
  } catch (const nlohmann::json::exception& e) {
    TESSERA_FAIL("MachineProfile::load: entry {} in {} is malformed: {}", machine.str(), cache.file().string(),
                 e.what());
  }
  p.validate();
  return p;
}

void to_json(nlohmann::json& j, const BandwidthCurve& c) {
  j = nlohmann::json::array();
  for (const auto& p : c.points()) j.push_back({p.bytes, p.seconds});
}

void from_json(const nlohmann::json& j, BandwidthCurve& c) {
  std::vector<BandwidthCurve::Point> pts;
  for (const auto& p : j) pts.push_back({p.at(0).get<double>(), p.at(1).get<double>()});
  c = BandwidthCurve(std::move(pts));
}

void to_json(nlohmann::json& j, const MachineProfile& p) {
  j = {{"gpu_model", p.machine.gpu_model},
       {"topology", p.machine.topology},
       {"world", p.machine.world},
       {"dtype", std::string(dtype_name(p.dtype))},
       {"sm_count", p.sm_count},
       {"nccl_sms", p.nccl_sms},
       {"per_group_overhead", p.per_group_overhead},
       {"gemm_penalty_per_group", p.gemm_penalty_per_group},
       {"format", MachineProfile::kFormatVersion},
       {"comm_slowdown_beside_gemm", p.comm_slowdown_beside_gemm}};
  for (const auto& [c, curve] : p.curves) j["curves"][collective_name(c)] = curve;
  for (const auto& [c, curve] : p.no_overlap_curves) j["no_overlap_curves"][collective_name(c)] = curve;
  j["gemms"] = nlohmann::json::array();
  for (const GemmTiming& g : p.gemms)
    j["gemms"].push_back({{"m", g.m},
                          {"n", g.n},
                          {"k", g.k},
                          {"tile_m", g.tile_m},
                          {"tile_n", g.tile_n},
                          {"swizzle", g.swizzle},
                          {"sms", g.sms},
                          {"per_wave", g.per_wave},
                          {"full_gpu", g.full_gpu}});
}

void from_json(const nlohmann::json& j, MachineProfile& p) {
  const auto ival = [&j](const nlohmann::json& v, const char* name, std::int64_t lo, std::int64_t hi) {
    return json_int(v, fmt::format("MachineProfile: {}", name), lo, hi);
  };
  const int format = j.contains("format") ? static_cast<int>(ival(j["format"], "format", 0, 1 << 20))
                                          : 1;  // format 1 had no "format" key
  TESSERA_CHECK(format >= 1 && format <= MachineProfile::kFormatVersion,
                "MachineProfile: entry has format {}, this build reads 1..{} (written by a newer Tessera?)", format,
                MachineProfile::kFormatVersion);
  p.machine = {j.at("gpu_model").get<std::string>(), j.at("topology").get<std::string>(),
               static_cast<int>(ival(j.at("world"), "world", 1, 1 << 20))};
  const std::string dt = j.at("dtype").get<std::string>();
  bool found = false;
  for (DType d : {DType::bf16, DType::f16, DType::f32})
    if (dt == dtype_name(d)) {
      p.dtype = d;
      found = true;
    }
  TESSERA_CHECK(found, "MachineProfile: unknown dtype '{}'", dt);
  p.sm_count = static_cast<int>(ival(j.at("sm_count"), "sm_count", 1, 1 << 16));
  p.nccl_sms = static_cast<int>(ival(j.at("nccl_sms"), "nccl_sms", 0, 1 << 16));
  p.per_group_overhead = j.at("per_group_overhead").get<double>();
  p.gemm_penalty_per_group = j.value("gemm_penalty_per_group", 0.0);
  // Absent in format 1: the curve as measured, and no-overlap falls back to `curves`.
  p.comm_slowdown_beside_gemm = j.value("comm_slowdown_beside_gemm", 0.0);
  const auto read_curves = [&j](const char* name, std::map<Collective, BandwidthCurve>& out) {
    out.clear();
    if (j.contains(name))
      for (auto it = j[name].begin(); it != j[name].end(); ++it)
        out[parse_collective(it.key())] = it->get<BandwidthCurve>();
  };
  read_curves("curves", p.curves);
  read_curves("no_overlap_curves", p.no_overlap_curves);
  p.gemms.clear();
  for (const auto& g : j.at("gemms"))
    p.gemms.push_back({ival(g.at("m"), "gemm m", 1, std::int64_t{1} << 40),
                       ival(g.at("n"), "gemm n", 1, std::int64_t{1} << 40),
                       ival(g.at("k"), "gemm k", 1, std::int64_t{1} << 40),
                       static_cast<int>(ival(g.at("tile_m"), "gemm tile_m", 1, 1 << 16)),
                       static_cast<int>(ival(g.at("tile_n"), "gemm tile_n", 1, 1 << 16)),
                       static_cast<int>(ival(g.at("swizzle"), "gemm swizzle", 0, 1 << 16)),
                       static_cast<int>(ival(g.at("sms"), "gemm sms", 1, 1 << 16)), g.at("per_wave").get<double>(),
                       g.at("full_gpu").get<double>()});
}

}  // namespace tessera::tune
