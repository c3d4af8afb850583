// tessera/signal/wave_model.hpp — a GEMM's output tiles grouped into waves.
//
// A persistent GEMM given `sms` worker CTAs (the GPU's SMs minus the SMs an
// NCCL collective running beside it occupies) finishes its tiles in waves of
// `sms` tiles: tile with execution index b (TileOrder) belongs to wave b/sms.
// The last wave may be partial. Wave times come from measurement
// (WaveTimes): the model never invents a figure.
//
// Limits: tiles() < 2^31; one CTA per SM; all tiles cost the same (edge
// tiles are counted as full tiles, which they are for a tensor-core GEMM).
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/signal/tile_order.hpp"

namespace tessera::signal {

/// Output shape of a GEMM and its tile shape. Edge tiles may be partial.
struct GemmTiling {
  std::int64_t m = 0, n = 0;       ///< output rows, columns
  int tile_m = 128, tile_n = 128;  ///< BM, BN

  int tiles_m() const { return static_cast<int>((m + tile_m - 1) / tile_m); }
  int tiles_n() const { return static_cast<int>((n + tile_n - 1) / tile_n); }
  std::int64_t tile_elems() const { return std::int64_t(tile_m) * tile_n; }
  /// Throws tessera::Error naming `what` on a non-positive or too-large shape.
  void validate(const char* what) const;
};

class WaveModel {
 public:
  /// `sms`: worker CTAs of the GEMM (> 0). `swizzle`/`raster`: see TileOrder.
  WaveModel(GemmTiling tiling, int sms, int swizzle = 1, Raster raster = Raster::AlongN);

  const GemmTiling& tiling() const { return tiling_; }
  const TileOrder& order() const { return order_; }
  int sms() const { return sms_; }
  int tiles() const { return order_.tiles(); }
  int waves() const { return (tiles() + sms_ - 1) / sms_; }

  int wave_of(int b) const { return b / sms_; }
  /// First execution index of wave w; wave_begin(waves()) == tiles().
  int wave_begin(int w) const;
  int tiles_in_wave(int w) const { return wave_begin(w + 1) - wave_begin(w); }

  /// The same GEMM with a different number of worker CTAs (e.g. full GPU).
  WaveModel with_sms(int sms) const { return WaveModel(tiling_, sms, order_.swizzle, order_.raster); }

 private:
  GemmTiling tiling_;
  TileOrder order_;
  int sms_;
};

/// Cumulative finish time of each wave: finish[k-1] = time at which the
/// first k waves are done, in seconds, measured from the GEMM's start.
struct WaveTimes {
  std::vector<double> finish;

  int waves() const { return static_cast<int>(finish.size()); }
  /// Time at which `k` waves are done (k = 0 -> 0).
  double done(int k) const { return k == 0 ? 0.0 : finish.at(k - 1); }

  /// Every wave takes `per_wave` seconds (a measured figure).
  static WaveTimes uniform(int waves, double per_wave);
  /// A measured GEMM time spread evenly over its waves; a partial last wave
  /// counts as a full one (it takes as long: its tiles run in parallel).
  static WaveTimes from_gemm_time(int waves, double gemm_seconds);
  /// Throws unless finish times are finite, positive and non-decreasing.
  void validate(const char* what) const;
};

}  // namespace tessera::signal
