#include "tessera/signal/wave_model.hpp"

#include <cmath>
#include <limits>

#include "tessera/runtime/error.hpp"

namespace tessera::signal {

void GemmTiling::validate(const char* what) const {
  TESSERA_CHECK(m > 0 && n > 0, "{}: GEMM output shape must be positive, got M={} N={}", what, m, n);
  TESSERA_CHECK(tile_m > 0 && tile_n > 0, "{}: tile shape must be positive, got {}x{}", what, tile_m, tile_n);
  const std::int64_t tm = (m + tile_m - 1) / tile_m, tn = (n + tile_n - 1) / tile_n;
  TESSERA_CHECK(tm * tn < std::numeric_limits<int>::max(), "{}: {}x{} tiles of {}x{} exceed 2^31 tiles", what, tm, tn,
                tile_m, tile_n);
}

WaveModel::WaveModel(GemmTiling tiling, int sms, int swizzle, Raster raster) : tiling_(tiling), sms_(sms) {
  tiling_.validate("WaveModel");
  TESSERA_CHECK(sms > 0, "WaveModel: worker CTA count must be positive, got {}", sms);
  TESSERA_CHECK(swizzle > 0, "WaveModel: swizzle must be >= 1, got {}", swizzle);
  order_ = TileOrder{tiling_.tiles_m(), tiling_.tiles_n(), swizzle, raster};
}

int WaveModel::wave_begin(int w) const {
  TESSERA_CHECK(w >= 0 && w <= waves(), "WaveModel::wave_begin: wave {} outside [0, {}]", w, waves());
  const std::int64_t b = std::int64_t(w) * sms_;
  return b < tiles() ? static_cast<int>(b) : tiles();
}

WaveTimes WaveTimes::uniform(int waves, double per_wave) {
  TESSERA_CHECK(waves > 0, "WaveTimes::uniform: wave count must be positive, got {}", waves);
  TESSERA_CHECK(std::isfinite(per_wave) && per_wave > 0, "WaveTimes::uniform: per-wave time must be > 0, got {}",
                per_wave);
  WaveTimes t;
  t.finish.resize(waves);
  for (int k = 0; k < waves; ++k) t.finish[k] = per_wave * (k + 1);
  return t;
}

WaveTimes WaveTimes::from_gemm_time(int waves, double gemm_seconds) {
  TESSERA_CHECK(waves > 0, "WaveTimes::from_gemm_time: wave count must be positive, got {}", waves);
  return uniform(waves, gemm_seconds / waves);
}

void WaveTimes::validate(const char* what) const {
  TESSERA_CHECK(!finish.empty(), "{}: no wave times", what);
  double prev = 0;
  for (size_t k = 0; k < finish.size(); ++k) {
    TESSERA_CHECK(std::isfinite(finish[k]) && finish[k] > 0 && finish[k] >= prev,
                  "{}: wave {} finish time {} is not finite, positive and >= the previous {}", what, k, finish[k],
                  prev);
    prev = finish[k];
  }
}

}  // namespace tessera::signal
