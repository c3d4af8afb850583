// tessera/signal/epilogue.cuh — GEMM epilogue policies of the signal layer
// (the kernels::engine Epilogue concept, see kernels/gemm/epilogue.cuh):
// write each finished tile into its wave group's contiguous span and count
// it on the group's counter.
//
//   GroupEpilogue<OutT>  — AllReduce and ReduceScatter layouts, through
//                          EpilogueTables (signal/epilogue_tables.hpp).
//   A2aEpilogue<OutT>    — All-to-All sub-token pools, through A2aSendMap
//                          (device copies of its tables); needs the schedule
//                          position to be the execution index, i.e. the
//                          engine's RasterScheduler with the model's order.
//
// Memory order: the engine orders the consumers' stores before its notifier
// (named barrier + fence.acq_rel.gpu), which calls tile_done: a
// red.release.gpu add of 1 on counters[group] — the producer side of the
// contract in signal/device.cuh. Edge tiles: only valid elements are
// written; padding in the buffer is left as is. Vector stores need BN a
// multiple of 8 and a 16-byte (f32: 32-byte) aligned buffer.
#pragma once

#include <cstdint>

#include "tessera/kernels/gemm/epilogue.cuh"
#include "tessera/kernels/gemm/ptx.cuh"
#include "tessera/kernels/gemm/tile.cuh"
#include "tessera/signal/a2a.hpp"

namespace tessera::signal {

// Stores go through kernels::engine::store_first8 (offsets are multiples of
// 8 elements: BN and every slot base are).
template <class OutT>
struct GroupEpilogue {
  static constexpr bool kNotify = true;
  static constexpr bool kSysScope = false;
  using Conv = kernels::engine::OutConv<OutT>;

  OutT* buffer = nullptr;                   ///< the group (send) buffer
  const std::int64_t* tile_base = nullptr;  ///< DeviceEpilogueTables
  const std::int64_t* seg_stride = nullptr;
  const int* tile_group = nullptr;
  std::uint32_t* counters = nullptr;        ///< GroupCounters::device()
  int sub_rows = 1;
  int tile_n = 1;

  __device__ __forceinline__ void store8(const kernels::engine::TileInfo& t, int row, int col, const float (&v)[8],
                                         int valid) const {
    const int lin = t.linear();
    const int li = row - t.row0;
    const int r = li / sub_rows;
    const std::int64_t off = tile_base[lin] + r * seg_stride[lin] + std::int64_t(li - r * sub_rows) * tile_n +
                             (col - t.col0);
    kernels::engine::store_first8(buffer + off, v, valid);
  }

  __device__ __forceinline__ void tile_done(const kernels::engine::TileInfo& t) const {
    kernels::engine::ptx::red_release_gpu_add(counters + tile_group[t.linear()], 1u);
  }
};

template <class OutT>
struct A2aEpilogue {
  static constexpr bool kNotify = true;
  static constexpr bool kSysScope = false;
  using Conv = kernels::engine::OutConv<OutT>;

  OutT* buffer = nullptr;      ///< the pools (send buffer)
  A2aSendMap map;              ///< with device pointers
  const int* tile_group = nullptr;  ///< [T] by linear tile id
  std::uint32_t* counters = nullptr;

  __device__ __forceinline__ void store8(const kernels::engine::TileInfo& t, int row, int col, const float (&v)[8],
                                         int valid) const {
    const int d = map.dest[row];
    const std::int64_t off = map.pool_base[d] + map.tile_pool_offset[std::int64_t(t.pos) * map.ranks + d] +
                             std::int64_t(map.row_slot[row]) * map.bn + (col - t.col0);
    kernels::engine::store_first8(buffer + off, v, valid);
  }

  __device__ __forceinline__ void tile_done(const kernels::engine::TileInfo& t) const {
    kernels::engine::ptx::red_release_gpu_add(counters + tile_group[t.linear()], 1u);
  }
};

}  // namespace tessera::signal
