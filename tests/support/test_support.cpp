#include "support/test_support.hpp"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdlib>
#include <limits>

namespace tessera::testing {

int visible_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

int launched_world_size() {
  for (const char* v : {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"}) {
    if (const char* s = std::getenv(v)) return std::atoi(s);
  }
  return 1;
}

double relative_error(const std::vector<double>& out, const std::vector<double>& ref) {
  if (out.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i]) || !std::isfinite(ref[i])) return std::numeric_limits<double>::infinity();
    const double d = out[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

}  // namespace tessera::testing
