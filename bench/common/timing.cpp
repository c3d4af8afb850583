#include "common/timing.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "tessera/runtime/error.hpp"

namespace tessera::bench {

Stats summarize(std::vector<double> t) {
  Stats s;
  s.reps = static_cast<int>(t.size());
  if (t.empty()) return s;
  std::sort(t.begin(), t.end());
  const size_t n = t.size();
  s.median_ms = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
  s.min_ms = t.front();
  s.max_ms = t.back();
  return s;
}

namespace {

/// The one timing loop: warm-up rounds, then `reps` rounds; each round runs
/// every body once in order, each after `between`, bracketed by its own
/// events and waited for before the next.
std::vector<Stats> time_rounds(cudaStream_t stream, const std::vector<const std::function<void()>*>& bodies, int warmup,
                               int reps, const std::function<void()>& between) {
  TESSERA_CHECK(reps > 0, "bench timing: reps = {} must be positive", reps);
  for (int i = 0; i < warmup; ++i)
    for (const auto* body : bodies) {
      if (between) between();
      (*body)();
    }
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  TESSERA_CUDA_CHECK(cudaEventCreate(&start));
  TESSERA_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<std::vector<double>> times(bodies.size());
  for (int r = 0; r < reps; ++r)
    for (std::size_t k = 0; k < bodies.size(); ++k) {
      if (between) between();
      TESSERA_CUDA_CHECK(cudaEventRecord(start, stream));
      (*bodies[k])();
      TESSERA_CUDA_CHECK(cudaEventRecord(stop, stream));
      TESSERA_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      times[k].push_back(ms);
    }
  TESSERA_CUDA_CHECK(cudaEventDestroy(start));
  TESSERA_CUDA_CHECK(cudaEventDestroy(stop));
  std::vector<Stats> out;
  for (auto& t : times) out.push_back(summarize(std::move(t)));
  return out;
}

}  // namespace

Stats time_on_stream(cudaStream_t stream, const std::function<void()>& body, int warmup, int reps,
                     const std::function<void()>& between) {
  return time_rounds(stream, {&body}, warmup, reps, between)[0];
}

void InterleavedTimer::run(const std::function<double(double)>& combine) {
  std::vector<const std::function<void()>*> bodies;
  for (const Item& it : items_) bodies.push_back(&it.body);
  const std::vector<Stats> st = time_rounds(stream_, bodies, warmup_, reps_, between_);
  for (std::size_t k = 0; k < items_.size(); ++k) *items_[k].out = combine ? combine(st[k].median_ms) : st[k].median_ms;
  items_.clear();
}

static std::vector<size_t> widths(const std::vector<std::string>& h,
                                  const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(h.size());
  for (size_t i = 0; i < h.size(); ++i) w[i] = h[i].size();
  for (auto& r : rows)
    for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  return w;
}

std::string Table::str() const {
  auto w = widths(header_, rows_);
  std::string out;
  auto line = [&](const std::vector<std::string>& r) {
    for (size_t i = 0; i < w.size(); ++i) out += fmt::format("{:>{}}  ", i < r.size() ? r[i] : "", w[i]);
    out += '\n';
  };
  line(header_);
  for (auto& r : rows_) line(r);
  return out;
}

std::string Table::markdown() const {
  std::string out = "|";
  for (auto& h : header_) out += " " + h + " |";
  out += "\n|";
  for (size_t i = 0; i < header_.size(); ++i) out += "---|";
  out += "\n";
  for (auto& r : rows_) {
    out += "|";
    for (size_t i = 0; i < header_.size(); ++i) out += " " + (i < r.size() ? r[i] : std::string()) + " |";
    out += "\n";
  }
  return out;
}

}  // namespace tessera::bench
