// tessera/signal/reorder.hpp — where each element of a GEMM's M x N output
// goes in the wave-group buffer that NCCL communicates (pre-communication
// reorder, done by the GEMM epilogue), and where the post-communication
// un-reorder reads it back (seed §3.3). Header-only, TESSERA_HD: the same
// functions run in the epilogue, in the un-reorder kernels and in tests.
//
// Common layout: every tile gets a full BM x BN slot, row-major inside the
// slot, slots in execution order (TileOrder). Edge tiles are padded: padded
// elements are never written by the epilogue and never read back (NCCL sums
// whatever is there; it is discarded). The padding costs
// (tiles*BM*BN - M*N) / (M*N) extra bytes on the wire.
//
// Post-communication "gather" interface shared by every map (what the
// un-reorder kernels are templated on):
//   rows(), cols(), chunk_width() = BN,
//   chunk_offset(row, c): element offset, in the received buffer, of output
//   element (row, c*BN); the chunk's min(BN, cols - c*BN) elements follow it
//   contiguously. Callers keep row < 2^31 (the maps use 32-bit row math).
//
// No memory-order content: pure index math.
#pragma once

#include <cstdint>

#include "tessera/signal/group_plan.hpp"
#include "tessera/runtime/host_device.hpp"
#include "tessera/signal/tile_order.hpp"

namespace tessera::signal {

/// Result of an inverse map: the output element stored at a buffer offset,
/// or valid == false for a padding slot.
struct Element {
  std::int64_t i = 0, j = 0;
  bool valid = false;
};

/// AllReduce: tile slots in execution order. A group is the contiguous span
/// [tile_begin(g), tile_begin(g+1)) * BM*BN; ncclAllReduce runs in place on it
/// and the reduced buffer is read back through the same offsets.
struct ArMap {
  TileOrder order;
  std::int64_t m = 0, n = 0;
  int bm = 0, bn = 0;

  TESSERA_HD std::int64_t tile_elems() const { return std::int64_t(bm) * bn; }
  TESSERA_HD std::int64_t buffer_elems() const { return order.tiles() * tile_elems(); }

  /// Pre-communication: offset of output element (i, j) in the group buffer.
  TESSERA_HD std::int64_t offset(std::int64_t i, std::int64_t j) const {
    const int b = order.index_of(static_cast<int>(i / bm), static_cast<int>(j / bn));
    return b * tile_elems() + (i % bm) * bn + (j % bn);
  }
  /// Inverse of offset().
  TESSERA_HD Element element_at(std::int64_t off) const {
    const int b = static_cast<int>(off / tile_elems());
    const std::int64_t e = off - b * tile_elems();
    const TileCoord t = order.tile_at(b);
    Element el{std::int64_t(t.m) * bm + e / bn, std::int64_t(t.n) * bn + e % bn, false};
    el.valid = el.i < m && el.j < n;
    return el;
  }

  // Post-communication gather interface (output = the full M x N matrix).
  TESSERA_HD std::int64_t rows() const { return m; }
  TESSERA_HD std::int64_t cols() const { return n; }
  TESSERA_HD int chunk_width() const { return bn; }
  /// = offset(row, c * bn), in 32-bit index math (row < 2^31, as every
  /// gather caller guarantees): the fused RMSNorm computes it per row and
  /// chunk on its critical path, where a 64-bit division costs ~70
  /// instructions.
  TESSERA_HD std::int64_t chunk_offset(std::int64_t row, int c) const {
    const int r = static_cast<int>(row);
    const int tm = r / bm;
    return chunk_offset_at(order.index_of(tm, c), r - tm * bm);
  }
  /// chunk_offset's layout, given the chunk's tile b = order.index_of(tm, c)
  /// and the row's index li inside the tile (the kernels' fast form computes
  /// b and li without divisions: src/signal/fast_gather.hpp).
  TESSERA_HD std::int64_t chunk_offset_at(int b, int li) const {
    return std::int64_t(b) * tile_elems() + std::int64_t(li) * bn;
  }
};

/// ReduceScatter over R ranks: every tile is cut by rows into R sub-tiles of
/// BM/R rows; sub-tile r of every tile ends on rank r, so rank r owns whole
/// output rows {i : (i mod BM) / (BM/R) == r} (a block-cyclic row
/// permutation of the standard contiguous split; an AllGather that follows
/// restores the order with the inverse permutation, see global_row()).
///
/// Send buffer (T*BM*BN elements): group g starts at s*BM*BN (s =
/// tile_begin(g), n_g = tiles_in(g)); inside it, segment r (n_g*SUB
/// elements, SUB = BM/R*BN) holds sub-tile r of the group's tiles in
/// execution order. ncclReduceScatter(send + s*BM*BN, recv + s*SUB,
/// n_g*SUB) then leaves on rank r, at recv offset b*SUB, sub-tile r of
/// tile b: the receive buffer (T*SUB elements) is in execution order.
/// Requires BM % R == 0.
struct RsMap {
  TileOrder order;
  std::int64_t m = 0, n = 0;
  int bm = 0, bn = 0;
  int ranks = 1;

  TESSERA_HD int sub_rows() const { return bm / ranks; }
  TESSERA_HD std::int64_t tile_elems() const { return std::int64_t(bm) * bn; }
  TESSERA_HD std::int64_t sub_elems() const { return std::int64_t(sub_rows()) * bn; }
  TESSERA_HD std::int64_t send_elems() const { return order.tiles() * tile_elems(); }
  TESSERA_HD std::int64_t recv_elems() const { return order.tiles() * sub_elems(); }
  /// The rank that ends up owning output row i.
  TESSERA_HD int owner(std::int64_t i) const { return static_cast<int>((i % bm) / sub_rows()); }

  /// Pre-communication: offset of element (i, j) in the send buffer.
  TESSERA_HD std::int64_t send_offset(std::int64_t i, std::int64_t j, const GroupSpans& groups) const {
    const int b = order.index_of(static_cast<int>(i / bm), static_cast<int>(j / bn));
    const int g = groups.group_of(b);
    const int s = groups.begin(g);
    const std::int64_t li = i % bm;
    const int r = static_cast<int>(li / sub_rows());
    return s * tile_elems() + r * groups.tiles(g) * sub_elems() + (b - s) * sub_elems() +
           (li - std::int64_t(r) * sub_rows()) * bn + (j % bn);
  }
  /// Inverse of send_offset.
  TESSERA_HD Element send_element_at(std::int64_t off, const GroupSpans& groups) const {
    const int g = groups.group_of(static_cast<int>(off / tile_elems()));
    const int s = groups.begin(g);
    const std::int64_t local = off - s * tile_elems();
    const std::int64_t seg = groups.tiles(g) * sub_elems();
    const int r = static_cast<int>(local / seg);
    const std::int64_t rem = local - r * seg;
    const int b = s + static_cast<int>(rem / sub_elems());
    const std::int64_t e = rem % sub_elems();
    const TileCoord t = order.tile_at(b);
    Element el{std::int64_t(t.m) * bm + std::int64_t(r) * sub_rows() + e / bn, std::int64_t(t.n) * bn + e % bn, false};
    el.valid = el.i < m && el.j < n;
    return el;
  }
  /// After the reduce-scatter: offset of (i, j) in rank owner(i)'s receive buffer.
  TESSERA_HD std::int64_t recv_offset(std::int64_t i, std::int64_t j) const {
    const int b = order.index_of(static_cast<int>(i / bm), static_cast<int>(j / bn));
    return b * sub_elems() + (i % sub_rows()) * bn + (j % bn);
  }
  /// Output row i of local row l on rank r (rows in increasing order).
  TESSERA_HD std::int64_t global_row(int r, std::int64_t l) const {
    return (l / sub_rows()) * bm + std::int64_t(r) * sub_rows() + l % sub_rows();
  }
  /// Number of valid output rows rank r owns (padding rows dropped: they are
  /// all at the end of the local order).
  TESSERA_HD std::int64_t rows_of(int r) const {
    const std::int64_t full = (m / bm) * sub_rows();
    std::int64_t tail = m % bm - std::int64_t(r) * sub_rows();
    tail = tail < 0 ? 0 : (tail > sub_rows() ? sub_rows() : tail);
    return full + tail;
  }
};

/// Rank r's post-communication gather view of an RsMap: output = the
/// rows_of(r) x N rows rank r owns, in increasing global-row order.
struct RsShard {
  RsMap map;
  int rank = 0;

  TESSERA_HD std::int64_t rows() const { return map.rows_of(rank); }
  TESSERA_HD std::int64_t cols() const { return map.n; }
  TESSERA_HD int chunk_width() const { return map.bn; }
  /// 32-bit index math (l < 2^31), as ArMap::chunk_offset.
  TESSERA_HD std::int64_t chunk_offset(std::int64_t l, int c) const {
    const int sr = map.sub_rows();
    const int li = static_cast<int>(l);
    const int q = li / sr;
    return chunk_offset_at(map.order.index_of(q, c), li - q * sr, sr);
  }
  /// chunk_offset's layout, given the chunk's tile b = order.index_of(l /
  /// sub_rows, c), the row's index inside its sub-tile and sub_rows itself
  /// (map.sub_rows() is a division: the kernels' fast form passes it
  /// precomputed).
  TESSERA_HD std::int64_t chunk_offset_at(int b, int in_sub, int sub_rows) const {
    return std::int64_t(b) * sub_rows * map.bn + std::int64_t(in_sub) * map.bn;
  }
};

/// The identity gather (a plain row-major M x N matrix with row stride ld):
/// the same un-reorder/RMSNorm kernels without any reorder, as a baseline.
struct RowMajorMap {
  std::int64_t m = 0, n = 0, ld = 0;

  TESSERA_HD std::int64_t rows() const { return m; }
  TESSERA_HD std::int64_t cols() const { return n; }
  TESSERA_HD int chunk_width() const { return static_cast<int>(n); }
  TESSERA_HD std::int64_t chunk_offset(std::int64_t row, int) const { return row * ld; }
};

}  // namespace tessera::signal
