// tessera/tune/machine_profile.hpp — what the offline stage measures on a
// machine (seed §4.2.1) and the online search reads: a bandwidth curve per
// collective, the SMs an NCCL collective occupies, and per-wave GEMM times.
//
// Curves: time in seconds of one call vs bytes of the per-rank send buffer
// (AllReduce: the buffer; ReduceScatter: the full input, R x recvcount;
// AllGather: the per-rank input; All-to-All: the bytes this rank sends),
// sampled at dense sizes. Between samples the bandwidth is interpolated
// linearly in log(bytes); below the first sample the time is the first
// sample's (latency floor); above the last the last bandwidth holds. The
// predicted time is clamped between its neighbours so it never decreases
// with size. Stored in a tune::Cache ("machine_profile") under
// key_prefix(machine, dtype, "profile"). Nothing here is invented: every
// figure comes from a measurement stored by the profiler (or, for the
// fitted overlap parameters below, from an offline fit named in the notes
// and passed explicitly to the profiler).
//
// Two curves per collective (profile format 2, docs/design/signal.md):
// `curves` is measured on the communicator the overlapped groups use (the
// split one, NCCL on the reserved SMs); `no_overlap_curves` on the process
// group's default communicator, which a non-overlapped run uses (NCCL's
// defaults: more CTAs, clusters). Predicting "no overlap" with the split
// curve made it 3-6 % too slow on H200 x2 and biased the choice towards
// overlap. A profile without a no-overlap curve for a collective (format 1
// files, or a profiler that did not measure it) falls back to `curves`.
//
// Format versions: the entry carries "format" (kFormatVersion). Format 1
// (no "format" key) loads: comm_slowdown_beside_gemm = 0 (the curve as
// measured), no no-overlap curves (fallback above), gemm_penalty_per_group
// 0 when absent. An entry of a newer format than this code is an error
// naming it. The cache file's version (kCacheVersion) stays 1 on purpose:
// tune::Cache ignores a file of another version whole, which would drop the
// older profiles that must still load.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/runtime/dtype.hpp"
#include "tessera/tune/cache.hpp"
#include "tessera/tune/key.hpp"

namespace tessera::tune {

enum class Collective { AllReduce, ReduceScatter, AllGather, AllToAll };
const char* collective_name(Collective c);
Collective parse_collective(const std::string& name);

class BandwidthCurve {
 public:
  struct Point {
    double bytes = 0, seconds = 0;
  };
  BandwidthCurve() = default;
  /// Points with strictly increasing bytes > 0 and non-decreasing seconds > 0.
  explicit BandwidthCurve(std::vector<Point> points);

  double time(double bytes) const;
  double bandwidth(double bytes) const { return bytes / time(bytes); }
  const std::vector<Point>& points() const { return points_; }
  bool empty() const { return points_.empty(); }

 private:
  std::vector<Point> points_;
};

/// A measured GEMM: per-wave time when it runs with `sms` worker CTAs (the
/// SMs NCCL leaves free) and its time alone on the whole GPU.
struct GemmTiming {
  std::int64_t m = 0, n = 0, k = 0;
  int tile_m = 128, tile_n = 128, swizzle = 1;
  int sms = 0;          ///< worker CTAs during overlap
  double per_wave = 0;  ///< seconds per wave with `sms` CTAs
  double full_gpu = 0;  ///< seconds of the whole GEMM on all SMs
};

struct MachineProfile {
  MachineId machine;
  DType dtype = DType::bf16;
  int sm_count = 0;               ///< SMs of the GPU
  int nccl_sms = 0;               ///< SMs a running NCCL collective occupies
  double per_group_overhead = 0;  ///< measured wait + launch cost of one group (s)
  /// Measured delay of the GEMM per group collective launched beside it (s;
  /// signal::OverlapCost::gemm_penalty_per_group). Absent in older files: 0.
  double gemm_penalty_per_group = 0;
  /// Relative slowdown of a group collective that runs beside the GEMM
  /// (every group but the last; signal::OverlapCost::
  /// comm_slowdown_beside_gemm), in [0, 2]. Fitted, not measured per run:
  /// 0.25 on H200 x2 with 16 NCCL SMs (docs/design/signal.md). Format 1: 0.
  double comm_slowdown_beside_gemm = 0;
  /// Curves on the communicator of the overlapped groups (split, reserved SMs).
  std::map<Collective, BandwidthCurve> curves;
  /// Curves on the process group's default communicator: the collective of
  /// a non-overlapped run. Optional per collective (see no_overlap_curve()).
  std::map<Collective, BandwidthCurve> no_overlap_curves;
  std::vector<GemmTiming> gemms;

  int gemm_sms() const { return sm_count - nccl_sms; }
  /// Throws naming the collective if it was not measured.
  const BandwidthCurve& curve(Collective c) const;
  /// The default-communicator curve of c when measured, else curve(c).
  const BandwidthCurve& no_overlap_curve(Collective c) const;
  /// The measured timing of exactly this GEMM, or nullptr.
  const GemmTiming* find_gemm(std::int64_t m, std::int64_t n, std::int64_t k, int tile_m, int tile_n) const;
  /// Throws unless counts are sane (0 <= nccl_sms < sm_count, ...), the
  /// slowdown is in [0, 2] and every stored curve is non-empty with
  /// increasing sizes and non-decreasing positive times.
  void validate() const;

  /// Version of the tune::Cache file (kept at 1, see the file comment).
  static constexpr int kCacheVersion = 1;
  /// Version of one profile entry: 2 adds comm_slowdown_beside_gemm and
  /// no_overlap_curves.
  static constexpr int kFormatVersion = 2;
  void store(Cache& cache) const;
  static std::optional<MachineProfile> load(const Cache& cache, const MachineId& machine, DType dtype);
};

void to_json(nlohmann::json& j, const BandwidthCurve& c);
void from_json(const nlohmann::json& j, BandwidthCurve& c);
void to_json(nlohmann::json& j, const MachineProfile& p);
void from_json(const nlohmann::json& j, MachineProfile& p);

}  // namespace tessera::tune
