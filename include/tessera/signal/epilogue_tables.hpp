// tessera/signal/epilogue_tables.hpp — the per-tile tables a GEMM epilogue
// needs to write tiles straight into wave-group buffers (GroupEpilogue in
// signal/epilogue.cuh), built on the host from a WaveModel, a GroupPlan and
// the primitive's map, indexed by the linear tile id m * tiles_n + n.
//
// For every output element (i, j) of tile (m, n) with li = i - m*BM,
// lj = j - n*BN, r = li / sub_rows:
//   offset = tile_base[t] + r * seg_stride[t] + (li - r*sub_rows) * BN + lj
// which equals ArMap::offset (sub_rows = BM, seg_stride = 0) or
// RsMap::send_offset (sub_rows = BM/R). tile_group[t] is the counter the
// tile bumps. The GEMM must run the TileOrder the tables were built for
// (kernels::engine::RasterScheduler{swizzle, raster == AlongM}: same order)
// with at most model.sms() CTAs.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/signal/group_plan.hpp"
#include "tessera/signal/reorder.hpp"
#include "tessera/signal/wave_model.hpp"

namespace tessera::signal {

struct EpilogueTables {
  std::vector<std::int64_t> tile_base;   ///< [T]
  std::vector<std::int64_t> seg_stride;  ///< [T]
  std::vector<int> tile_group;           ///< [T]
  int sub_rows = 0;
  int tile_n = 0;
};

EpilogueTables epilogue_tables(const WaveModel& model, const GroupPlan& plan, const ArMap& map);
EpilogueTables epilogue_tables(const WaveModel& model, const GroupPlan& plan, const RsMap& map);
/// tile_group alone (linear tile id -> group), e.g. for A2aEpilogue.
std::vector<int> tile_groups(const WaveModel& model, const GroupPlan& plan);

/// The same tables in device memory (owning). Build once per shape and plan.
class DeviceEpilogueTables {
 public:
  explicit DeviceEpilogueTables(const EpilogueTables& t);
  ~DeviceEpilogueTables();
  DeviceEpilogueTables(const DeviceEpilogueTables&) = delete;
  DeviceEpilogueTables& operator=(const DeviceEpilogueTables&) = delete;

  const std::int64_t* tile_base() const { return tile_base_; }
  const std::int64_t* seg_stride() const { return seg_stride_; }
  const int* tile_group() const { return tile_group_; }
  int sub_rows() const { return sub_rows_; }
  int tile_n() const { return tile_n_; }

 private:
  std::int64_t* tile_base_ = nullptr;
  std::int64_t* seg_stride_ = nullptr;
  int* tile_group_ = nullptr;
  int sub_rows_ = 0, tile_n_ = 0;
};

/// What a GroupEpilogue launch knows (GroupEpilogue<OutT>::Arguments,
/// signal/epilogue.cuh): the group (send) buffer, the group plan's device
/// tables (they outlive the launch) and the counters (GroupCounters::device()).
struct GroupEpilogueArguments {
  void* buffer = nullptr;
  const DeviceEpilogueTables* tables = nullptr;
  std::uint32_t* counters = nullptr;
};

}  // namespace tessera::signal
