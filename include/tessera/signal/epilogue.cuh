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
// red.relaxed.gpu add of 1 on counters[group] (GroupEpilogue; the fence
// before it makes it a release) or a red.release.gpu (A2aEpilogue) — the
// producer side of the contract in signal/device.cuh. Edge tiles: only valid elements are
// written; padding in the buffer is left as is. Vector stores need BN a
// multiple of 8 and a 16-byte (f32: 32-byte) aligned buffer.
#pragma once

#include <cstdint>

#include "tessera/kernels/gemm.hpp"
#include "tessera/link/device_primitives.cuh"
#include "tessera/kernels/gemm/epilogue.cuh"
#include "tessera/kernels/gemm/ptx.cuh"
#include "tessera/kernels/gemm/tile.cuh"
#include "tessera/signal/a2a.hpp"
#include "tessera/signal/epilogue_tables.hpp"

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
  std::uint32_t* counters = nullptr;  ///< GroupCounters::device()
  int sub_rows = 1;
  int tile_n = 1;

  /// CUTLASS-3 style: the caller's Arguments (epilogue_tables.hpp) make the
  /// policy once on the host.
  using Arguments = GroupEpilogueArguments;
  static GroupEpilogue to_params(const kernels::GemmArgs&, const kernels::GemmOptions&, const Arguments& a) {
    GroupEpilogue p;
    p.buffer = static_cast<OutT*>(a.buffer);
    p.tile_base = a.tables->tile_base();
    p.seg_stride = a.tables->seg_stride();
    p.tile_group = a.tables->tile_group();
    p.counters = a.counters;
    p.sub_rows = a.tables->sub_rows();
    p.tile_n = a.tables->tile_n();
    return p;
  }

  /// One tile's destination: its span in the group buffer, looked up once
  /// per tile (kernels/gemm/epilogue.cuh, "per-tile binding"). Row li of the
  /// tile lies in segment r = li >> shift (li / sub_rows) at base + r * seg +
  /// (li & (sub_rows - 1)) * tile_n. sub_rows is BM or BM / R, a power of two
  /// (DeviceEpilogueTables checks it on the host): the store has no division
  /// and no branch. (A division fallback beside the shift, written out at
  /// every store8 site, measured +1.2 / +1.7 % for this epilogue.)
  struct Bound {
    OutT* base;
    std::int64_t seg;
    int row0, col0, shift, tile_n;
    __device__ __forceinline__ void store8(int row, int col, const float (&v)[8], int valid) const {
      const int li = row - row0;
      const int r = li >> shift;
      const std::int64_t off = r * seg + std::int64_t(li - (r << shift)) * tile_n + (col - col0);
      kernels::engine::store_first8(base + off, v, valid);
    }
  };
  __device__ __forceinline__ Bound bind(const kernels::engine::TileInfo& t) const {
    const int lin = t.linear();
    return Bound{buffer + tile_base[lin], seg_stride[lin], t.row0, t.col0, __ffs(sub_rows) - 1, tile_n};
  }

  /// Relaxed add: the engine's notifier executes fence.acq_rel.gpu after the
  /// tile's stores and before this call, which together make it a release
  /// (kernels/gemm/epilogue.cuh, visibility contract); a red.release would
  /// execute a second fence per tile.
  __device__ __forceinline__ void tile_done(const kernels::engine::TileInfo& t) const {
    link::counter_notify_fenced<link::Scope::gpu>(counters + tile_group[t.linear()]);
  }
};

template <class OutT>
struct A2aEpilogue {
  static constexpr bool kNotify = true;
  static constexpr bool kSysScope = false;
  using Conv = kernels::engine::OutConv<OutT>;

  OutT* buffer = nullptr;           ///< the pools (send buffer)
  A2aSendMap map;                   ///< with device pointers
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
    link::counter_notify<link::Scope::gpu>(counters + tile_group[t.linear()]);
  }
};

}  // namespace tessera::signal
