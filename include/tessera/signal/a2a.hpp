// tessera/signal/a2a.hpp — All-to-All reorder (seed §3.3, "sub-tokens"):
// every output row (token) of a rank's GEMM has one destination rank
// (uneven, MoE-like routing). A sub-token is a row's BN-wide piece inside
// one tile. Each destination d gets a pool, contiguous in the send buffer;
// inside pool d the sub-tokens for d are in execution order (tile by tile,
// rows ascending inside a tile), so every wave group is one contiguous span
// per pool: grouped ncclSend/ncclRecv move group g's spans as soon as it is
// done. Sub-tokens of edge-column tiles are padded to BN.
//
// Receive side (rank s): for each group g, for each source q, a contiguous
// span of recv_count(g, q) elements. The un-reorder restores the
// non-overlapped reference layout: rows from source 0, then source 1, ...,
// each source's rows for s in ascending row order, all N columns.
//
// Device views (A2aSendMap, A2aRecvMap) only hold pointers to tables that
// A2aPlan builds on the host; copy the vectors to the device for kernels.
// Every rank builds the same A2aPlan from the global routing (all ranks'
// destinations), as MoE dispatch/combine already exchanges it.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/signal/group_plan.hpp"
#include "tessera/runtime/host_device.hpp"
#include "tessera/signal/reorder.hpp"
#include "tessera/signal/wave_model.hpp"

namespace tessera::signal {

/// Pre-communication map of one source rank (epilogue side).
struct A2aSendMap {
  TileOrder order;
  int bm = 0, bn = 0, ranks = 1;
  const int* dest = nullptr;      ///< [M] destination of each row
  const int* row_slot = nullptr;  ///< [M] index of the row among its tile-row's rows with the same destination
  const std::int64_t* tile_pool_offset = nullptr;  ///< [T*R] start of tile b's sub-tokens for d inside pool d
  const std::int64_t* pool_base = nullptr;         ///< [R] start of pool d in the send buffer

  TESSERA_HD std::int64_t offset(std::int64_t i, std::int64_t j) const {
    const int b = order.index_of(static_cast<int>(i / bm), static_cast<int>(j / bn));
    const int d = dest[i];
    return pool_base[d] + tile_pool_offset[std::int64_t(b) * ranks + d] + std::int64_t(row_slot[i]) * bn + (j % bn);
  }
};

/// Post-communication gather view of one destination rank.
struct A2aRecvMap {
  std::int64_t out_rows = 0, n = 0;
  int bn = 0;
  const std::int64_t* chunk_src = nullptr;  ///< [out_rows * tiles_n]

  TESSERA_HD std::int64_t rows() const { return out_rows; }
  TESSERA_HD std::int64_t cols() const { return n; }
  TESSERA_HD int chunk_width() const { return bn; }
  TESSERA_HD std::int64_t chunk_offset(std::int64_t row, int c) const {
    const int tn = (static_cast<int>(n) + bn - 1) / bn;  // 32-bit: N < 2^31 (unreorder checks)
    return chunk_src[row * tn + c];
  }
};

/// Source (rank, row) of an output row on the receiving side.
struct RowSource {
  int rank = 0;
  std::int64_t row = 0;
};

class A2aPlan {
 public:
  /// rows_per_rank[q] = M_q; dest[q][i] in [0, R); waves_per_group[q]: the
  /// partition of rank q's waves (every rank the same number of groups).
  /// All ranks share N, the tile shape, the SM budget and the tile order.
  A2aPlan(std::int64_t n, int bm, int bn, int sms, int swizzle, Raster raster, std::vector<std::vector<int>> dest,
          const std::vector<std::vector<int>>& waves_per_group);

  int ranks() const { return static_cast<int>(dest_.size()); }
  int groups() const { return groups_; }
  const WaveModel& model(int q) const { return models_.at(q); }
  const GroupPlan& plan(int q) const { return plans_.at(q); }

  // --- send side of rank q -------------------------------------------------
  std::int64_t send_elems(int q) const { return send_total_.at(q); }
  /// Offset in q's send buffer of group g's span for destination d, and its length.
  std::int64_t send_offset(int q, int g, int d) const { return send_off_.at(q).at(std::size_t(g) * ranks() + d); }
  std::int64_t send_count(int q, int g, int d) const { return send_cnt_.at(q).at(std::size_t(g) * ranks() + d); }
  A2aSendMap send_map(int q) const;  ///< views the host tables

  // --- receive side of rank s ----------------------------------------------
  std::int64_t recv_elems(int s) const { return recv_total_.at(s); }
  std::int64_t recv_offset(int s, int g, int q) const { return recv_off_.at(s).at(std::size_t(g) * ranks() + q); }
  std::int64_t recv_count(int s, int g, int q) const { return send_count(q, g, s); }
  std::int64_t out_rows(int s) const { return static_cast<std::int64_t>(out_src_.at(s).size()); }
  RowSource out_row_source(int s, std::int64_t o) const { return out_src_.at(s).at(o); }
  A2aRecvMap recv_map(int s) const;  ///< views the host tables

  // Tables to copy to the device (views above point at them).
  const std::vector<int>& dest(int q) const { return dest_.at(q); }
  const std::vector<int>& row_slot(int q) const { return row_slot_.at(q); }
  const std::vector<std::int64_t>& tile_pool_offset(int q) const { return tile_pool_off_.at(q); }
  const std::vector<std::int64_t>& pool_base(int q) const { return pool_base_.at(q); }
  const std::vector<std::int64_t>& chunk_src(int s) const { return chunk_src_.at(s); }

 private:
  std::int64_t n_;
  int bm_, bn_, groups_ = 0;
  std::vector<WaveModel> models_;
  std::vector<GroupPlan> plans_;
  std::vector<std::vector<int>> dest_, row_slot_;
  std::vector<std::vector<std::int64_t>> tile_pool_off_, pool_base_, send_off_, send_cnt_, recv_off_, chunk_src_;
  std::vector<std::int64_t> send_total_, recv_total_;
  std::vector<std::vector<RowSource>> out_src_;
};

/// Host constructors that validate the shape: ArMap / RsMap for a model.
ArMap make_ar_map(const WaveModel& model);
/// Throws unless tile_m % ranks == 0 (sub-tiles must be whole rows).
RsMap make_rs_map(const WaveModel& model, int ranks);

}  // namespace tessera::signal
