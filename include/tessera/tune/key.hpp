// tessera/tune/key.hpp — how tuning results are keyed, and nearest-
// neighbour reuse for shapes never tuned.
//
// Key = "<gpu model>|<topology>|w<world>|<dtype>|<what>|<d0>x<d1>x...".
// Entries stored under such keys carry their shape as "shape": [d0, ...] so
// that nearest() can compare shapes of the same machine/dtype/what prefix.
// Distance: sum over dimensions of (ln a - ln b)^2 (ratios matter, not sizes).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/runtime/dtype.hpp"
#include "tessera/tune/cache.hpp"

namespace tessera::tune {

struct MachineId {
  std::string gpu_model;  ///< e.g. "NVIDIA H200"
  std::string topology;   ///< e.g. "NV18" or "PCIe"; free-form but stable
  int world = 1;

  std::string str() const;
  bool operator==(const MachineId&) const = default;
};

/// Prefix for one machine, dtype and kind of result ("signal.ar", "profile").
std::string key_prefix(const MachineId& m, DType dtype, const std::string& what);
/// Full key: prefix + "|" + shape.
std::string make_key(const std::string& prefix, const std::vector<std::int64_t>& shape);

struct Neighbour {
  std::string key;
  nlohmann::json value;
  double distance = 0;
};

/// The entry under `prefix` whose "shape" is nearest to `shape` (same rank
/// of shape only), or nullopt when there is none.
std::optional<Neighbour> nearest(const Cache& cache, const std::string& prefix, const std::vector<std::int64_t>& shape);

}  // namespace tessera::tune
