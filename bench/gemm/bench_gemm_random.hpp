// bench/gemm/bench_gemm_random.hpp — `tessera bench gemm --random N --seed S`:
// the engine against cuBLASLt on shapes drawn at random, or on an
// explicit M x N x K list (--mnk), every shape checked against cuBLASLt.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/timing.hpp"

namespace tessera::bench::gemm {

struct RandomOptions {
  int count = 0;                 ///< shapes to draw (--random N)
  uint64_t seed = 1;             ///< --seed S
  std::vector<std::string> mnk;  ///< explicit MxNxK shapes instead of a draw
  std::string dtype = "bf16";
  std::string layout = "nk";
  int reps = 20;
  int warmup = 5;
  int sets = 3;
  bool diag = false;  ///< also time every compiled kernel and padded leading dimensions
  /// Tune each shape first (tune::gemm_tune, re-measured and cached under
  /// $TESSERA_CACHE_DIR) and time "ours (tuned)" (kernels::gemm, plan_source Tuned) too.
  bool tuned = false;
  int tune_top_k = 5;
  /// Also time "ours (no PDL)": the same plan with GemmOptions::dependent_launch off.
  bool pdl_ab = false;
  std::string json;  ///< write per-shape records and the summary here
  std::string commit = "unknown";
  std::string device_kind = "unknown";
  std::string command_line;
};

/// Draws the shape distribution: M log-uniform in [16, 16384]; N and K
/// log-uniform in [512, 16384], rounded to multiples of 8. Deterministic per seed.
std::vector<std::array<int64_t, 3>> draw_shapes(int count, uint64_t seed);

void run_random(const RandomOptions& o);

/// Times several variants interleaved run by run (each bracketed by its own
/// events) after `warmup` interleaved rounds; gap_ms > 0 drains and idles
/// before each run. Defined in bench_gemm.cpp.
std::vector<Stats> time_interleaved(cudaStream_t stream, const std::vector<std::function<void()>>& variants, int warmup,
                                    int reps, double gap_ms);

}  // namespace tessera::bench::gemm
