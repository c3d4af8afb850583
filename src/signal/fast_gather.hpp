// Internal: the kernels' form of the post-communication gather maps
// (reorder.hpp): the same offsets (each map's chunk_offset_at and
// TileOrder::index_of_with), with the divisions by the map's constants —
// tile height, sub-tile height, swizzle panel — made on the host as
// kernels::engine::FastDivmod multiply-shifts. The fused RMSNorm computes
// chunk offsets per row on its critical path, where a 32-bit division by a
// runtime divisor is ~20 dependent instructions: with the RS shard's three
// per offset, the first row of every CTA (2-4 rows per CTA at N <= 2048) cost
// it +14..19 % over the plain kernel, against +2..6 % for the same shard read
// through a precomputed table (docs/design/signal.md). CPU test:
// tests/signal/test_maps.cpp (equal to chunk_offset). No memory-order
// content: pure index math.
#pragma once

#include <cstdint>

#include "tessera/kernels/gemm/fast_divmod.cuh"
#include "tessera/signal/a2a.hpp"
#include "tessera/runtime/host_device.hpp"
#include "tessera/signal/reorder.hpp"

namespace tessera::signal::detail {

using kernels::engine::FastDivmod;

/// TileOrder::index_of_with's panel division, precomputed.
struct FastPanelDivide {
  FastDivmod by_panel;
  explicit FastPanelDivide(const TileOrder& o)
      : by_panel(FastDivmod::make(static_cast<std::uint32_t>(o.panel_width()))) {}
  TESSERA_HD int operator()(int a, int) const { return static_cast<int>(by_panel.div(static_cast<std::uint32_t>(a))); }
};

/// ArMap's gather interface (rows, cols, chunk_width, chunk_offset).
struct FastArGather {
  ArMap map;
  FastDivmod by_bm;
  FastPanelDivide panel;

  explicit FastArGather(const ArMap& m)
      : map(m), by_bm(FastDivmod::make(static_cast<std::uint32_t>(m.bm))), panel(m.order) {}
  TESSERA_HD std::int64_t rows() const { return map.rows(); }
  TESSERA_HD std::int64_t cols() const { return map.cols(); }
  TESSERA_HD int chunk_width() const { return map.chunk_width(); }
  TESSERA_HD std::int64_t chunk_offset(std::int64_t row, int c) const {
    const int r = static_cast<int>(row);
    const int tm = static_cast<int>(by_bm.div(static_cast<std::uint32_t>(r)));
    return map.chunk_offset_at(map.order.index_of_with(tm, c, panel), r - tm * map.bm);
  }
};

/// RsShard's gather interface.
struct FastRsGather {
  RsShard shard;
  // shard.rows() and shard.map.sub_rows() divide (rows() in 64 bits): made
  // once here, not at every kernel's start.
  std::int64_t rows_;
  int sub_rows;
  FastDivmod by_sub;
  FastPanelDivide panel;

  explicit FastRsGather(const RsShard& s)
      : shard(s),
        rows_(s.rows()),
        sub_rows(s.map.sub_rows()),
        by_sub(FastDivmod::make(static_cast<std::uint32_t>(sub_rows))),
        panel(s.map.order) {}
  TESSERA_HD std::int64_t rows() const { return rows_; }
  TESSERA_HD std::int64_t cols() const { return shard.cols(); }
  TESSERA_HD int chunk_width() const { return shard.chunk_width(); }
  TESSERA_HD std::int64_t chunk_offset(std::int64_t l, int c) const {
    const int li = static_cast<int>(l);
    const int q = static_cast<int>(by_sub.div(static_cast<std::uint32_t>(li)));
    return shard.chunk_offset_at(shard.map.order.index_of_with(q, c, panel), li - q * sub_rows, sub_rows);
  }
};

/// The gather the kernels run for a map: the fast form where one exists.
inline FastArGather fast_gather(const ArMap& m) { return FastArGather(m); }
inline FastRsGather fast_gather(const RsShard& m) { return FastRsGather(m); }
inline const A2aRecvMap& fast_gather(const A2aRecvMap& m) { return m; }
inline const RowMajorMap& fast_gather(const RowMajorMap& m) { return m; }

}  // namespace tessera::signal::detail
