// tessera/signal/tile_order.hpp — the execution order of a GEMM's output
// tiles: execution index b (0 .. tiles-1) <-> tile coordinates (tm, tn).
//
// A persistent GEMM with S worker CTAs hands out execution indices in
// increasing order (CTA c takes b = c, c+S, c+2S, ...), so tile b finishes in
// wave b / S. The GEMM scheduler and every signal:: map share this one
// function so that "which tiles form a wave" is the same on both sides.
//
// Order: tiles are grouped into panels of `swizzle` tile-rows (raster along
// N) or tile-columns (raster along M). Inside a panel the order walks down
// the panel's short side first, then across:
//   raster N, swizzle s: panel p = b / (s*Nt); r = b % (s*Nt);
//       h = min(s, Mt - p*s); tn = r / h; tm = p*s + r % h.
//   swizzle 1 is plain row-major raster. Raster M swaps the roles of M and N.
// Only the last panel may be short (h < s). Header-only, no dependencies, so
// a kernel scheduler may include it. No memory-order content: pure index math.
#pragma once

#include <cstdint>

#include "tessera/runtime/host_device.hpp"

namespace tessera::signal {

enum class Raster : int { AlongN = 0, AlongM = 1 };

struct TileCoord {
  int m = 0;  ///< tile row
  int n = 0;  ///< tile column
};

struct TileOrder {
  int tiles_m = 1;  ///< Mt = ceil(M / BM)
  int tiles_n = 1;  ///< Nt = ceil(N / BN)
  int swizzle = 1;  ///< panel width in tiles, >= 1
  Raster raster = Raster::AlongN;

  TESSERA_HD int tiles() const { return tiles_m * tiles_n; }

  /// Tile coordinates of execution index b (0 <= b < tiles()).
  TESSERA_HD TileCoord tile_at(int b) const {
    // "major" = the dimension panels are cut from; "minor" = walked across.
    const int major = raster == Raster::AlongN ? tiles_m : tiles_n;
    const int minor = raster == Raster::AlongN ? tiles_n : tiles_m;
    const int s = panel_width();
    const int panel = b / (s * minor);
    const int r = b - panel * s * minor;
    const int left = major - panel * s;
    const int h = s < left ? s : left;
    const int a = panel * s + r % h;  // along the major dimension
    const int c = r / h;              // along the minor dimension
    return raster == Raster::AlongN ? TileCoord{a, c} : TileCoord{c, a};
  }

  /// Panel width in tiles: swizzle, capped at the major dimension's tiles.
  TESSERA_HD int panel_width() const {
    const int major = raster == Raster::AlongN ? tiles_m : tiles_n;
    return swizzle < major ? swizzle : major;
  }

  /// Execution index of tile (tm, tn): the inverse of tile_at.
  TESSERA_HD int index_of(int tm, int tn) const { return index_of_with(tm, tn, PlainDivide{}); }

  /// index_of with its one division, a / panel_width(), done by
  /// `panel_of(a, panel_width())`: the un-reorder kernels pass a divider
  /// precomputed on the host (src/signal/fast_gather.hpp).
  template <class PanelOf>
  TESSERA_HD int index_of_with(int tm, int tn, const PanelOf& panel_of) const {
    const int major = raster == Raster::AlongN ? tiles_m : tiles_n;
    const int minor = raster == Raster::AlongN ? tiles_n : tiles_m;
    const int a = raster == Raster::AlongN ? tm : tn;
    const int c = raster == Raster::AlongN ? tn : tm;
    const int s = panel_width();
    const int panel = panel_of(a, s);
    const int left = major - panel * s;
    const int h = s < left ? s : left;
    return panel * s * minor + c * h + (a - panel * s);
  }

  struct PlainDivide {
    TESSERA_HD int operator()(int a, int s) const { return a / s; }
  };
};

}  // namespace tessera::signal
