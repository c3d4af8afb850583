// tessera/kernels/gemm/grouped_raster.hpp — the order of one group's tiles
// in the grouped GEMM's schedule (grouped_scheduler.cuh). Host-compilable
// (cuda_runtime_api.h defines __host__ / __device__ there), so
// tests/kernels/grouped_gemm_host_test.cpp checks on the CPU that it is a
// bijection onto the group's tiles with the very code the kernel runs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/kernels/gemm/fast_divmod.cuh"

namespace tessera::kernels::engine {

/// The order of a group's tiles (host-made, like RasterScheduler's):
///  * band == 0: row-major, tile column fastest (concurrent CTAs share the
///    group's A row panel and sweep its B);
///  * band > 0: the group's tile rows are cut into bands of `band` rows; a
///    band is walked down its rows first, then one tile column right
///    (concurrent CTAs share `band` A panels and few B column panels: the
///    engine's grouped raster).
struct GroupedRaster {
  int tiles_n = 1;
  int band = 0;
  FastDivmod tiles_n_div;   ///< tiles_n
  FastDivmod per_band_div;  ///< band * tiles_n
  FastDivmod band_div;      ///< band

  static GroupedRaster make(int tiles_n, int band) {
    GroupedRaster r;
    r.tiles_n = tiles_n;
    r.band = band;
    r.tiles_n_div = FastDivmod::make(static_cast<uint32_t>(tiles_n));
    const int b = band > 0 ? band : 1;
    r.per_band_div = FastDivmod::make(static_cast<uint32_t>(b * tiles_n));
    r.band_div = FastDivmod::make(static_cast<uint32_t>(b));
    return r;
  }
  /// (tile row, tile column) of the group's local-th tile; tiles_m = the group's tile rows.
  __host__ __device__ __forceinline__ void at(int local, int tiles_m, int& tm, int& tn) const {
    if (band <= 0) {
      tm = static_cast<int>(tiles_n_div.div(static_cast<uint32_t>(local)));
      tn = local - tm * tiles_n;
      return;
    }
    const int b = static_cast<int>(per_band_div.div(static_cast<uint32_t>(local)));
    const int first = b * band;
    const int in_band = local - b * band * tiles_n;
    const int width = tiles_m - first < band ? tiles_m - first : band;
    tn = width == band ? static_cast<int>(band_div.div(static_cast<uint32_t>(in_band))) : in_band / width;
    tm = first + in_band - tn * width;
  }
};

}  // namespace tessera::kernels::engine
