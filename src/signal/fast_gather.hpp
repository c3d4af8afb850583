// Internal: the post-communication gather maps (reorder.hpp) with their
// divisions by runtime constants (tile height, sub-tile height, swizzle
// panel) precomputed on the host as multiply-shift pairs. The fused RMSNorm
// computes chunk offsets per row on its critical path, and a 32-bit integer
// division by a runtime divisor is ~20 dependent instructions: with the AR
// map's two and the RS shard's three per offset, the table fill of the first
// row of every CTA cost the RS shard +14..19 % at N <= 2048, where a CTA has
// only 2-4 rows (the same shard read through a precomputed table: +2..6 %;
// session 9, notes/signal.md). Offsets are exactly those of the maps'
// chunk_offset (CPU test: tests/signal/test_maps.cpp). No memory-order
// content: pure index math.
#pragma once

#include <cstdint>

#include "tessera/signal/a2a.hpp"
#include "tessera/signal/hd.hpp"
#include "tessera/signal/reorder.hpp"

namespace tessera::signal::detail {

/// q = n / d for 0 <= n < 2^31 and 1 <= d < 2^31, as (umulhi(n, mul) + n) >> shift
/// (Granlund-Montgomery; umulhi(n, mul) + n < 2^32 because n < 2^31).
struct FastDiv {
  int d = 1;
  std::uint32_t mul = 1;
  int shift = 0;

  FastDiv() = default;
  explicit FastDiv(int divisor) : d(divisor) {
    int l = 0;
    while ((std::uint64_t(1) << l) < std::uint64_t(divisor)) ++l;  // l = ceil(log2 d)
    shift = l;
    mul = static_cast<std::uint32_t>(((std::uint64_t(1) << 32) * ((std::uint64_t(1) << l) - divisor)) / divisor + 1);
  }
  TESSERA_HD int div(int n) const {
#if defined(__CUDA_ARCH__)
    const std::uint32_t hi = __umulhi(static_cast<std::uint32_t>(n), mul);
#else
    const auto hi = static_cast<std::uint32_t>((std::uint64_t(static_cast<std::uint32_t>(n)) * mul) >> 32);
#endif
    return static_cast<int>((hi + static_cast<std::uint32_t>(n)) >> shift);
  }
};

/// TileOrder::index_of with the panel division precomputed.
struct FastTileOrder {
  TileOrder order;
  int panel = 1;  ///< min(swizzle, major): the panel width in tiles
  FastDiv by_panel;

  FastTileOrder() = default;
  explicit FastTileOrder(const TileOrder& o) : order(o) {
    const int major = o.raster == Raster::AlongN ? o.tiles_m : o.tiles_n;
    panel = o.swizzle < major ? o.swizzle : major;
    by_panel = FastDiv(panel);
  }
  TESSERA_HD int index_of(int tm, int tn) const {
    const bool along_n = order.raster == Raster::AlongN;
    const int major = along_n ? order.tiles_m : order.tiles_n;
    const int minor = along_n ? order.tiles_n : order.tiles_m;
    const int a = along_n ? tm : tn;
    const int c = along_n ? tn : tm;
    const int p = by_panel.div(a);
    const int left = major - p * panel;
    const int h = panel < left ? panel : left;
    return p * panel * minor + c * h + (a - p * panel);
  }
};

/// ArMap's gather interface (rows, cols, chunk_width, chunk_offset).
struct FastArGather {
  FastTileOrder order;
  std::int64_t m = 0, n = 0;
  int bm = 0, bn = 0;
  FastDiv by_bm;

  explicit FastArGather(const ArMap& a) : order(a.order), m(a.m), n(a.n), bm(a.bm), bn(a.bn), by_bm(a.bm) {}
  TESSERA_HD std::int64_t rows() const { return m; }
  TESSERA_HD std::int64_t cols() const { return n; }
  TESSERA_HD int chunk_width() const { return bn; }
  TESSERA_HD std::int64_t chunk_offset(std::int64_t row, int c) const {
    const int r = static_cast<int>(row);
    const int tm = by_bm.div(r);
    return std::int64_t(order.index_of(tm, c)) * bm * bn + std::int64_t(r - tm * bm) * bn;
  }
};

/// RsShard's gather interface.
struct FastRsGather {
  FastTileOrder order;
  std::int64_t rows_ = 0, n = 0;
  int sub_rows = 0, bn = 0;
  FastDiv by_sub;

  explicit FastRsGather(const RsShard& s)
      : order(s.map.order), rows_(s.rows()), n(s.map.n), sub_rows(s.map.sub_rows()), bn(s.map.bn),
        by_sub(s.map.sub_rows()) {}
  TESSERA_HD std::int64_t rows() const { return rows_; }
  TESSERA_HD std::int64_t cols() const { return n; }
  TESSERA_HD int chunk_width() const { return bn; }
  TESSERA_HD std::int64_t chunk_offset(std::int64_t l, int c) const {
    const int li = static_cast<int>(l);
    const int q = by_sub.div(li);
    return std::int64_t(order.index_of(q, c)) * sub_rows * bn + std::int64_t(li - q * sub_rows) * bn;
  }
};

/// The gather the kernels run for a map: the fast form where one exists.
inline FastArGather fast_gather(const ArMap& m) { return FastArGather(m); }
inline FastRsGather fast_gather(const RsShard& m) { return FastRsGather(m); }
inline const A2aRecvMap& fast_gather(const A2aRecvMap& m) { return m; }
inline const RowMajorMap& fast_gather(const RowMajorMap& m) { return m; }

}  // namespace tessera::signal::detail
