#include "tessera/signal/group_plan.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "tessera/runtime/error.hpp"

namespace tessera::signal {

GroupPlan::GroupPlan(const WaveModel& model, std::vector<int> waves_per_group) : waves_(std::move(waves_per_group)) {
  TESSERA_CHECK(!waves_.empty(), "GroupPlan: needs at least one group");
  wave_start_.assign(1, 0);
  tile_start_.assign(1, 0);
  for (size_t g = 0; g < waves_.size(); ++g) {
    TESSERA_CHECK(waves_[g] > 0, "GroupPlan: group {} has {} waves; every group needs >= 1", g, waves_[g]);
    wave_start_.push_back(wave_start_.back() + waves_[g]);
    TESSERA_CHECK(wave_start_.back() <= model.waves(), "GroupPlan: groups {} cover more than the model's {} waves",
                  fmt::join(waves_, ","), model.waves());
    tile_start_.push_back(model.wave_begin(wave_start_.back()));
  }
  TESSERA_CHECK(wave_start_.back() == model.waves(), "GroupPlan: groups [{}] cover {} waves, the model has {}",
                fmt::join(waves_, ","), wave_start_.back(), model.waves());
}

GroupPlan GroupPlan::per_wave(const WaveModel& model) { return GroupPlan(model, std::vector<int>(model.waves(), 1)); }

GroupPlan GroupPlan::equal(const WaveModel& model, int groups) {
  TESSERA_CHECK(groups > 0 && groups <= model.waves(), "GroupPlan::equal: {} groups for {} waves", groups,
                model.waves());
  std::vector<int> w(groups, model.waves() / groups);
  for (int i = 0; i < model.waves() % groups; ++i) w[groups - 1 - i] += 1;
  return GroupPlan(model, std::move(w));
}

int GroupPlan::group_of_tile(int b) const {
  TESSERA_CHECK(b >= 0 && b < tiles(), "GroupPlan::group_of_tile: tile {} outside [0, {})", b, tiles());
  return host_view().group_of(b);
}

std::uint32_t GroupPlan::counter_target(int g, std::uint64_t epoch) const {
  TESSERA_CHECK(epoch >= 1, "GroupPlan::counter_target: epochs start at 1, got {}", epoch);
  const std::uint64_t t = epoch * std::uint64_t(tiles_in(g));
  TESSERA_CHECK(t <= std::numeric_limits<std::uint32_t>::max(),
                "GroupPlan::counter_target: epoch {} x {} tiles of group {} overflows the 32-bit counter; reset the "
                "counters and restart at epoch 1",
                epoch, tiles_in(g), g);
  return static_cast<std::uint32_t>(t);
}

GroupPlan GroupPlan::rescaled(const WaveModel& model) const {
  const int w_new = model.waves();
  const double scale = double(w_new) / waves();
  std::vector<int> bounds;  // interior boundaries, strictly increasing in (0, w_new)
  for (int g = 1; g < groups(); ++g) {
    const int b = static_cast<int>(std::lround(wave_start_[g] * scale));
    if (b > 0 && b < w_new && (bounds.empty() || b > bounds.back())) bounds.push_back(b);
  }
  std::vector<int> w;
  int prev = 0;
  for (int b : bounds) {
    w.push_back(b - prev);
    prev = b;
  }
  w.push_back(w_new - prev);
  return GroupPlan(model, std::move(w));
}

std::string GroupPlan::str() const { return fmt::format("[{}]", fmt::join(waves_, ",")); }

}  // namespace tessera::signal
