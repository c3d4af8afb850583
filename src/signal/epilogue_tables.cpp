#include "tessera/signal/epilogue_tables.hpp"

#include <cuda_runtime_api.h>

#include <exception>

#include "tessera/runtime/error.hpp"

namespace tessera::signal {
namespace {
void check_same(const WaveModel& model, const GroupPlan& plan, const TileOrder& order, const char* op) {
  TESSERA_CHECK(plan.tiles() == model.tiles() && order.tiles() == model.tiles() &&
                    order.tiles_n == model.order().tiles_n && order.swizzle == model.order().swizzle &&
                    order.raster == model.order().raster,
                "{}: model ({} tiles), plan ({} tiles) and map ({} tiles) disagree", op, model.tiles(), plan.tiles(),
                order.tiles());
}
}  // namespace

EpilogueTables epilogue_tables(const WaveModel& model, const GroupPlan& plan, const ArMap& map) {
  check_same(model, plan, map.order, "signal::epilogue_tables(AllReduce)");
  const int T = model.tiles(), Nt = map.order.tiles_n;
  EpilogueTables t;
  t.tile_base.resize(T);
  t.seg_stride.assign(T, 0);
  t.tile_group.resize(T);
  t.sub_rows = map.bm;
  t.tile_n = map.bn;
  for (int b = 0; b < T; ++b) {
    const TileCoord c = map.order.tile_at(b);
    t.tile_base[c.m * Nt + c.n] = b * map.tile_elems();
    t.tile_group[c.m * Nt + c.n] = plan.group_of_tile(b);
  }
  return t;
}

EpilogueTables epilogue_tables(const WaveModel& model, const GroupPlan& plan, const RsMap& map) {
  check_same(model, plan, map.order, "signal::epilogue_tables(ReduceScatter)");
  const int T = model.tiles(), Nt = map.order.tiles_n;
  EpilogueTables t;
  t.tile_base.resize(T);
  t.seg_stride.resize(T);
  t.tile_group.resize(T);
  t.sub_rows = map.sub_rows();
  t.tile_n = map.bn;
  for (int b = 0; b < T; ++b) {
    const TileCoord c = map.order.tile_at(b);
    const int g = plan.group_of_tile(b), s = plan.tile_begin(g);
    const int lin = c.m * Nt + c.n;
    t.tile_base[lin] = s * map.tile_elems() + (b - s) * map.sub_elems();
    t.seg_stride[lin] = plan.tiles_in(g) * map.sub_elems();
    t.tile_group[lin] = g;
  }
  return t;
}

std::vector<int> tile_groups(const WaveModel& model, const GroupPlan& plan) {
  TESSERA_CHECK(plan.tiles() == model.tiles(), "signal::tile_groups: model has {} tiles, plan {}", model.tiles(),
                plan.tiles());
  std::vector<int> g(model.tiles());
  for (int b = 0; b < model.tiles(); ++b) {
    const TileCoord c = model.order().tile_at(b);
    g[c.m * model.order().tiles_n + c.n] = plan.group_of_tile(b);
  }
  return g;
}

DeviceEpilogueTables::DeviceEpilogueTables(const EpilogueTables& t) : sub_rows_(t.sub_rows), tile_n_(t.tile_n) {
  TESSERA_CHECK(
      !t.tile_base.empty() && t.tile_base.size() == t.seg_stride.size() && t.tile_base.size() == t.tile_group.size(),
      "DeviceEpilogueTables: inconsistent table sizes {}, {}, {}", t.tile_base.size(), t.seg_stride.size(),
      t.tile_group.size());
  // GroupEpilogue finds a row's segment with a shift (signal/epilogue.cuh).
  TESSERA_CHECK(t.sub_rows > 0 && (t.sub_rows & (t.sub_rows - 1)) == 0,
                "DeviceEpilogueTables: {} rows per segment is not a power of two (tile rows / ranks)", t.sub_rows);
  const std::size_t n = t.tile_base.size();
  TESSERA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&tile_base_), n * sizeof(std::int64_t)));
  TESSERA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&seg_stride_), n * sizeof(std::int64_t)));
  TESSERA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&tile_group_), n * sizeof(int)));
  TESSERA_CUDA_CHECK(cudaMemcpy(tile_base_, t.tile_base.data(), n * sizeof(std::int64_t), cudaMemcpyHostToDevice));
  TESSERA_CUDA_CHECK(cudaMemcpy(seg_stride_, t.seg_stride.data(), n * sizeof(std::int64_t), cudaMemcpyHostToDevice));
  TESSERA_CUDA_CHECK(cudaMemcpy(tile_group_, t.tile_group.data(), n * sizeof(int), cudaMemcpyHostToDevice));
}

DeviceEpilogueTables::~DeviceEpilogueTables() {
  // cudaFree synchronizes the device; while an exception unwinds (e.g. a
  // stuck overlapped run whose GEMM reads these tables) leak instead of hang.
  if (std::uncaught_exceptions() > 0) return;
  cudaFree(tile_base_);
  cudaFree(seg_stride_);
  cudaFree(tile_group_);
}

}  // namespace tessera::signal
