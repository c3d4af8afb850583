// bench/common/results.hpp — what the benchmarks write into bench/results
// files beside their figures.
#pragma once

#include <fmt/format.h>

#include <cctype>
#include <string>

namespace tessera::bench {

/// The machine kind as the results files name it (e.g. nvidia-h200-x2):
/// the GPU name's first two words, lower case, joined by '-', and "-xR" for
/// R > 1 ranks.
inline std::string machine_kind(const char* gpu_name, int world) {
  std::string s;
  int tokens = 0;
  for (const char* c = gpu_name; *c && tokens < 2; ++c) {
    if (*c == ' ') {
      if (++tokens < 2) s += '-';
      continue;
    }
    s += static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
  }
  return world > 1 ? fmt::format("{}-x{}", s, world) : s;
}

}  // namespace tessera::bench
