// bench/common/timing.hpp — how every Tessera benchmark times GPU work.
//
// CUDA events around each repetition on one stream, warm-up first, the
// median (and spread) of the repetitions. Multi-rank benchmarks take the max
// over ranks of each statistic (see runtime::ProcessGroup::allreduce_max).
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

namespace tessera::bench {

struct Stats {
  double median_ms = 0;
  double min_ms = 0;
  double max_ms = 0;
  int reps = 0;
};

/// Summary of a list of per-repetition times (ms).
Stats summarize(std::vector<double> times_ms);

/// Times `body` (which enqueues work on `stream`) `reps` times after `warmup`
/// untimed runs; each repetition is bracketed by its own pair of events.
/// `between`, if given, runs untimed before each repetition (e.g. a barrier).
Stats time_on_stream(cudaStream_t stream, const std::function<void()>& body, int warmup, int reps,
                     const std::function<void()>& between = {});

/// Times several bodies run by run: every repetition runs each body once, in
/// registration order (each after `between`, bracketed by its own events), so
/// slow drifts of clocks and temperature hit all bodies alike — comparisons
/// between them are fair. Warm-up runs are interleaved the same way.
class InterleavedTimer {
 public:
  InterleavedTimer(cudaStream_t stream, int warmup, int reps, std::function<void()> between = {})
      : stream_(stream), warmup_(warmup), reps_(reps), between_(std::move(between)) {}
  /// Registers `body`; run() stores its median (ms) in *median_ms.
  void add(double* median_ms, std::function<void()> body) { items_.push_back({median_ms, std::move(body)}); }
  /// Runs everything registered since the last run(), then forgets it.
  /// `combine`, if given, maps each median before it is stored (e.g. the max
  /// over ranks; every rank must then register the same bodies in order).
  void run(const std::function<double(double)>& combine = {});

 private:
  struct Item {
    double* out;
    std::function<void()> body;
  };
  cudaStream_t stream_;
  int warmup_, reps_;
  std::function<void()> between_;
  std::vector<Item> items_;
};

/// A plain text table printed with aligned columns.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string str() const;
  /// Markdown form for bench/RESULTS.md.
  std::string markdown() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace tessera::bench
