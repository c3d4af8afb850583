#include "tessera/tune/key.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "tessera/runtime/error.hpp"

namespace tessera::tune {

std::string MachineId::str() const { return fmt::format("{}|{}|w{}", gpu_model, topology, world); }

std::string key_prefix(const MachineId& m, DType dtype, const std::string& what) {
  TESSERA_CHECK(m.world > 0, "tune::key_prefix: world size must be positive, got {}", m.world);
  return fmt::format("{}|{}|{}", m.str(), dtype_name(dtype), what);
}

std::string make_key(const std::string& prefix, const std::vector<std::int64_t>& shape) {
  return fmt::format("{}|{}", prefix, fmt::join(shape, "x"));
}

std::optional<Neighbour> nearest(const Cache& cache, const std::string& prefix,
                                 const std::vector<std::int64_t>& shape) {
  for (auto d : shape) TESSERA_CHECK(d > 0, "tune::nearest: shape dimensions must be positive, got {}", d);
  std::optional<Neighbour> best;
  const std::string p = prefix + "|";
  for (auto it = cache.entries().begin(); it != cache.entries().end(); ++it) {
    if (it.key().rfind(p, 0) != 0 || !it->is_object() || !it->contains("shape")) continue;
    const auto& s = (*it)["shape"];
    if (!s.is_array() || s.size() != shape.size()) continue;
    double dist = 0;
    bool ok = true;
    for (size_t i = 0; i < shape.size() && ok; ++i) {
      if (!s[i].is_number() || s[i].get<double>() <= 0) {
        ok = false;
        break;
      }
      const double l = std::log(s[i].get<double>() / double(shape[i]));
      dist += l * l;
    }
    if (ok && (!best || dist < best->distance)) best = Neighbour{it.key(), *it, dist};
  }
  return best;
}

}  // namespace tessera::tune
