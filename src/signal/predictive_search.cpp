#include "tessera/signal/predictive_search.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "tessera/runtime/error.hpp"

namespace tessera::signal {

OverlapCost OverlapCost::from_tiles(const WaveModel& model, WaveTimes overlapped, double sequential_gemm,
                                    double bytes_per_tile, std::function<double(double bytes)> comm_time,
                                    double per_group_overhead, double gemm_penalty_per_group) {
  TESSERA_CHECK(overlapped.waves() == model.waves(), "OverlapCost::from_tiles: {} wave times for a model of {} waves",
                overlapped.waves(), model.waves());
  TESSERA_CHECK(bytes_per_tile > 0, "OverlapCost::from_tiles: bytes per tile must be > 0, got {}", bytes_per_tile);
  OverlapCost c;
  c.overlapped = std::move(overlapped);
  c.sequential_gemm = sequential_gemm;
  c.comm_all = comm_time(model.tiles() * bytes_per_tile);
  c.per_group_overhead = per_group_overhead;
  c.gemm_penalty_per_group = gemm_penalty_per_group;
  c.group_comm = [model, bytes_per_tile, comm_time](int first, int end) {
    return comm_time((model.wave_begin(end) - model.wave_begin(first)) * bytes_per_tile);
  };
  return c;
}

PredictiveSearch::PredictiveSearch(OverlapCost cost, double min_gain) : min_gain_(min_gain), cost_(std::move(cost)) {
  TESSERA_CHECK(std::isfinite(min_gain) && min_gain >= 0 && min_gain < 1,
                "PredictiveSearch: minimum gain {} outside [0, 1)", min_gain);
  cost_.overlapped.validate("PredictiveSearch");
  TESSERA_CHECK(cost_.group_comm, "PredictiveSearch: no group communication model");
  TESSERA_CHECK(std::isfinite(cost_.sequential_gemm) && cost_.sequential_gemm > 0,
                "PredictiveSearch: sequential GEMM time must be > 0, got {}", cost_.sequential_gemm);
  TESSERA_CHECK(std::isfinite(cost_.comm_all) && cost_.comm_all >= 0,
                "PredictiveSearch: whole-output communication time must be >= 0, got {}", cost_.comm_all);
  TESSERA_CHECK(std::isfinite(cost_.per_group_overhead) && cost_.per_group_overhead >= 0,
                "PredictiveSearch: per-group overhead must be >= 0, got {}", cost_.per_group_overhead);
  TESSERA_CHECK(std::isfinite(cost_.comm_slowdown_beside_gemm) && cost_.comm_slowdown_beside_gemm >= 0,
                "PredictiveSearch: comm slowdown beside the GEMM must be >= 0, got {}",
                cost_.comm_slowdown_beside_gemm);
  TESSERA_CHECK(std::isfinite(cost_.gemm_penalty_per_group) && cost_.gemm_penalty_per_group >= 0,
                "PredictiveSearch: GEMM penalty per group must be >= 0, got {}", cost_.gemm_penalty_per_group);
}

double PredictiveSearch::predict(const std::vector<int>& waves_per_group) const {
  double end = 0;
  int done = 0, g = 0;
  for (int w : waves_per_group) {
    TESSERA_CHECK(w > 0, "PredictiveSearch::predict: group of {} waves in [{}]", w, fmt::join(waves_per_group, ","));
    const int next = done + w;
    TESSERA_CHECK(next <= cost_.waves(), "PredictiveSearch::predict: [{}] covers more than {} waves",
                  fmt::join(waves_per_group, ","), cost_.waves());
    end = std::max(cost_.overlapped.done(next) + g * cost_.gemm_penalty_per_group, end) + cost_.per_group_overhead +
          cost_.group_time(done, next);
    done = next;
    ++g;
  }
  TESSERA_CHECK(done == cost_.waves(), "PredictiveSearch::predict: [{}] covers {} of {} waves",
                fmt::join(waves_per_group, ","), done, cost_.waves());
  return end;
}

Prediction PredictiveSearch::finish(Prediction p) const {
  const double seq = predict_sequential();
  if (seq * (1 - min_gain_) <= p.latency) {
    p.waves_per_group = {cost_.waves()};
    p.latency = seq;
    p.overlap = false;
  }
  return p;
}

Prediction PredictiveSearch::best() const { return finish(best_overlapped()); }

Prediction PredictiveSearch::best_overlapped() const {
  const int W = cost_.waves();
  const double inf = std::numeric_limits<double>::infinity();
  if (cost_.gemm_penalty_per_group == 0) {
    // The group count does not matter: one earliest end per wave boundary.
    std::vector<double> end(W + 1, inf);
    std::vector<int> from(W + 1, -1);
    end[0] = 0;
    for (int k = 1; k <= W; ++k)
      for (int j = 0; j < k; ++j) {
        const double e = std::max(cost_.overlapped.done(k), end[j]) + cost_.per_group_overhead + cost_.group_time(j, k);
        if (e < end[k]) {
          end[k] = e;
          from[k] = j;
        }
      }
    Prediction p;
    for (int k = W; k > 0; k = from[k]) p.waves_per_group.insert(p.waves_per_group.begin(), k - from[k]);
    p.latency = end[W];
    p.candidates = static_cast<long long>(W) * (W + 1) / 2;
    return p;
  }
  // end[g][k]: earliest end of group g (1-based) when it ends at wave
  // boundary k; from[g][k]: the boundary where that group starts.
  std::vector<std::vector<double>> end(W + 1, std::vector<double>(W + 1, inf));
  std::vector<std::vector<int>> from(W + 1, std::vector<int>(W + 1, -1));
  end[0][0] = 0;
  long long evaluated = 0;
  for (int g = 1; g <= W; ++g) {
    const double delay = (g - 1) * cost_.gemm_penalty_per_group;
    for (int k = g; k <= W; ++k)
      for (int j = g - 1; j < k; ++j) {
        if (end[g - 1][j] == inf) continue;
        const double e = std::max(cost_.overlapped.done(k) + delay, end[g - 1][j]) + cost_.per_group_overhead +
                         cost_.group_time(j, k);
        ++evaluated;
        if (e < end[g][k]) {
          end[g][k] = e;
          from[g][k] = j;
        }
      }
  }
  int best_g = 1;
  for (int g = 2; g <= W; ++g)
    if (end[g][W] < end[best_g][W]) best_g = g;
  Prediction p;
  for (int g = best_g, k = W; g > 0; k = from[g][k], --g)
    p.waves_per_group.insert(p.waves_per_group.begin(), k - from[g][k]);
  p.latency = end[best_g][W];
  p.candidates = evaluated;
  return p;
}

namespace {
// One of the k earliest ends kept at a DP state: the end, and the state and
// rank within that state of the previous group's end (-1: none).
struct Kept {
  double end;
  int from, rank;
};

// Inserts (end, from, rank) into `list` (sorted by end, at most k long)
// after every entry with an equal end: for k = 1 the first candidate
// reaching the minimum stays, as in best_overlapped()'s strict `<`.
void keep_k(std::vector<Kept>& list, int k, Kept c) {
  const auto pos = std::upper_bound(list.begin(), list.end(), c.end, [](double e, const Kept& x) { return e < x.end; });
  if (pos - list.begin() >= k) return;
  list.insert(pos, c);
  if (static_cast<int>(list.size()) > k) list.pop_back();
}
}  // namespace

std::vector<Prediction> PredictiveSearch::top_overlapped(int k) const {
  TESSERA_CHECK(k >= 1, "PredictiveSearch::top_overlapped: k must be >= 1, got {}", k);
  const int W = cost_.waves();
  long long evaluated = 0;
  std::vector<Prediction> out;
  if (cost_.gemm_penalty_per_group == 0) {
    // One state per wave boundary (the group count does not matter).
    std::vector<std::vector<Kept>> at(W + 1);
    at[0].push_back({0.0, -1, -1});
    for (int b = 1; b <= W; ++b)
      for (int j = 0; j < b; ++j) {
        // Summed in best_overlapped()'s order ((max + overhead) + comm), so
        // that k = 1 reproduces its values and ties bit for bit.
        const double ready = cost_.overlapped.done(b), comm = cost_.group_time(j, b);
        for (int r = 0; r < static_cast<int>(at[j].size()); ++r) {
          ++evaluated;
          keep_k(at[b], k, {std::max(ready, at[j][r].end) + cost_.per_group_overhead + comm, j, r});
        }
      }
    for (int r = 0; r < static_cast<int>(at[W].size()); ++r) {
      Prediction p;
      for (int b = W, rr = r; b > 0;) {
        const Kept& x = at[b][rr];
        p.waves_per_group.insert(p.waves_per_group.begin(), b - x.from);
        b = x.from;
        rr = x.rank;
      }
      p.latency = at[W][r].end;
      out.push_back(std::move(p));
    }
  } else {
    // at[g][b]: the k earliest ends of group g (1-based) ending at boundary b.
    std::vector<std::vector<std::vector<Kept>>> at(W + 1, std::vector<std::vector<Kept>>(W + 1));
    at[0][0].push_back({0.0, -1, -1});
    for (int g = 1; g <= W; ++g) {
      const double delay = (g - 1) * cost_.gemm_penalty_per_group;
      for (int b = g; b <= W; ++b)
        for (int j = g - 1; j < b; ++j) {
          const std::vector<Kept>& prev = at[g - 1][j];
          if (prev.empty()) continue;
          const double ready = cost_.overlapped.done(b) + delay;
          const double comm = cost_.group_time(j, b);
          for (int r = 0; r < static_cast<int>(prev.size()); ++r) {
            ++evaluated;
            keep_k(at[g][b], k, {std::max(ready, prev[r].end) + cost_.per_group_overhead + comm, j, r});
          }
        }
    }
    // Merge the group counts (fewer groups first among equal ends).
    std::vector<Kept> last;  // from = group count, rank = rank in at[g][W]
    for (int g = 1; g <= W; ++g)
      for (int r = 0; r < static_cast<int>(at[g][W].size()); ++r) keep_k(last, k, {at[g][W][r].end, g, r});
    for (const Kept& f : last) {
      Prediction p;
      for (int g = f.from, b = W, rr = f.rank; g > 0; --g) {
        const Kept& x = at[g][b][rr];
        p.waves_per_group.insert(p.waves_per_group.begin(), b - x.from);
        b = x.from;
        rr = x.rank;
      }
      p.latency = f.end;
      out.push_back(std::move(p));
    }
  }
  for (Prediction& p : out) p.candidates = evaluated;
  return out;
}

namespace {
// Enumerates partitions of W waves as bitmasks of "a group ends after wave
// i" (i = 1 .. W-1); calls f(groups) for those `keep` accepts.
template <class Keep, class F>
long long enumerate(int W, Keep keep, F f) {
  std::vector<int> groups;
  long long n = 0;
  for (unsigned long long mask = 0; mask < (1ull << (W - 1)); ++mask) {
    groups.clear();
    int last = 0;
    for (int i = 1; i < W; ++i)
      if (mask >> (i - 1) & 1) {
        groups.push_back(i - last);
        last = i;
      }
    groups.push_back(W - last);
    if (!keep(groups)) continue;
    ++n;
    f(groups);
  }
  return n;
}
}  // namespace

Prediction PredictiveSearch::pruned(int max_first, int max_last) const {
  const int W = cost_.waves();
  TESSERA_CHECK(W <= 26, "PredictiveSearch::pruned: {} waves is too many to enumerate (limit 26); use best()", W);
  TESSERA_CHECK(max_first > 0 && max_last > 0, "PredictiveSearch::pruned: bounds must be >= 1, got {} and {}",
                max_first, max_last);
  Prediction p;
  p.latency = std::numeric_limits<double>::infinity();
  p.candidates = enumerate(
      W, [&](const std::vector<int>& g) { return g.front() <= max_first && g.back() <= max_last; },
      [&](const std::vector<int>& g) {
        const double t = predict(g);
        if (t < p.latency) {
          p.latency = t;
          p.waves_per_group = g;
        }
      });
  return finish(p);
}

Prediction PredictiveSearch::exhaustive() const {
  const int W = cost_.waves();
  TESSERA_CHECK(W <= 24, "PredictiveSearch::exhaustive: {} waves is too many to enumerate (limit 24)", W);
  Prediction p;
  p.latency = std::numeric_limits<double>::infinity();
  p.candidates = enumerate(
      W, [](const std::vector<int>&) { return true; },
      [&](const std::vector<int>& g) {
        const double t = predict(g);
        if (t < p.latency) {
          p.latency = t;
          p.waves_per_group = g;
        }
      });
  return finish(p);
}

}  // namespace tessera::signal
