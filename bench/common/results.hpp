// bench/common/results.hpp — what the benchmarks write into bench/results
// files beside their figures.
#pragma once

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tessera/runtime/error.hpp"

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

/// The commit a results file records: `given`, else $TESSERA_COMMIT, else "unknown".
inline std::string results_commit(const std::string& given = {}) {
  if (!given.empty()) return given;
  const char* env = std::getenv("TESSERA_COMMIT");
  return env && *env ? env : "unknown";
}

/// Today's date (UTC), YYYY-MM-DD, as results files record it.
inline std::string results_date() {
  return fmt::format("{:%Y-%m-%d}",
                     fmt::gmtime(std::chrono::system_clock::to_time_t(std::chrono::system_clock::now())));
}

/// Writes a bench/results file (bench/results/README.md's format):
/// {"provenance": ..., "records": [...]}. Throws naming `what` when the
/// file cannot be written.
inline void write_results(const std::string& path, const nlohmann::json& provenance, const nlohmann::json& records,
                          const std::string& what) {
  std::ofstream f(path);
  f << nlohmann::json{{"provenance", provenance}, {"records", records}}.dump(1) << "\n";
  TESSERA_CHECK(f.good(), "{}: cannot write {}", what, path);
}

}  // namespace tessera::bench
