// tessera/signal/group_plan.hpp — a partition of a GEMM's W waves into G
// contiguous wave groups (seed §3.2). Group g owns the tiles with execution
// index in [tile_start[g], tile_start[g+1]); its communication may start
// once all of them are done.
//
// Counters: one uint32 per group, bumped once per finished tile by the
// producer (release, .gpu scope, after the tile's stores). Epoch based:
// call e (e = 1, 2, ...) waits for counter[g] >= e * tiles_in(g), so nothing
// is reset between calls. Limit: e * tiles_in(g) must stay below 2^32
// (counter_target throws otherwise; reset the counters and restart at 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/runtime/host_device.hpp"
#include "tessera/signal/wave_model.hpp"

namespace tessera::signal {

/// Device-usable view of the group boundaries: tile_start[0..groups].
struct GroupSpans {
  const int* tile_start = nullptr;
  int groups = 0;

  TESSERA_HD int begin(int g) const { return tile_start[g]; }
  TESSERA_HD int tiles(int g) const { return tile_start[g + 1] - tile_start[g]; }
  /// Group of execution index b (binary search; groups is small).
  TESSERA_HD int group_of(int b) const {
    int lo = 0, hi = groups - 1;  // invariant: tile_start[lo] <= b < tile_start[hi+1]
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (tile_start[mid] <= b)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }
};

class GroupPlan {
 public:
  /// waves_per_group: G positive counts summing to model.waves().
  GroupPlan(const WaveModel& model, std::vector<int> waves_per_group);
  /// One group: communication after the whole GEMM (no overlap).
  static GroupPlan single(const WaveModel& model) { return GroupPlan(model, {model.waves()}); }
  /// One group per wave (finest grouping).
  static GroupPlan per_wave(const WaveModel& model);
  /// `groups` groups of (nearly) equal wave counts, larger ones last.
  static GroupPlan equal(const WaveModel& model, int groups);

  int groups() const { return static_cast<int>(waves_.size()); }
  int waves() const { return wave_start_.back(); }
  int tiles() const { return tile_start_.back(); }
  const std::vector<int>& waves_per_group() const { return waves_; }
  int wave_begin(int g) const { return wave_start_.at(g); }
  int tile_begin(int g) const { return tile_start_.at(g); }
  int tiles_in(int g) const { return tile_start_.at(g + 1) - tile_start_.at(g); }
  /// tile_start[0..G]: what GroupSpans views (copy it to the device).
  const std::vector<int>& tile_starts() const { return tile_start_; }
  int group_of_tile(int b) const;
  GroupSpans host_view() const { return GroupSpans{tile_start_.data(), groups()}; }

  /// Counter value meaning "group g done" for call number `epoch` (>= 1).
  std::uint32_t counter_target(int g, std::uint64_t epoch) const;

  /// The same shape of partition for a model with a different wave count:
  /// group boundaries scaled proportionally (rounded, kept strictly
  /// increasing; groups merge if there are fewer waves than groups).
  GroupPlan rescaled(const WaveModel& model) const;

  /// "[2,3,1]"
  std::string str() const;
  bool operator==(const GroupPlan& o) const { return waves_ == o.waves_ && tile_start_ == o.tile_start_; }

 private:
  std::vector<int> waves_;
  std::vector<int> wave_start_;  // G+1
  std::vector<int> tile_start_;  // G+1
};

}  // namespace tessera::signal
