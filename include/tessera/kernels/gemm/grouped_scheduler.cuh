// tessera/kernels/gemm/grouped_scheduler.cuh — the tile schedule of the
// grouped GEMM (grouped_kernel.cuh): G problems D_g[M_g, N] = A_g · op(B_g)
// whose row counts M_g live in DEVICE memory (routing computed on the GPU).
//
// Layout: the groups' A rows are stacked, group g at rows
// [row_start[g], row_start[g] + M_g) of one [max_rows, K] matrix, with
// row_start the exclusive prefix sum of M_g (tokens sorted by expert); D the
// same with N columns. Group g has tiles_m(g) = ceil(M_g / BM) tile rows and
// tiles_n tile columns; its tiles occupy schedule positions
// [tile_start[g], tile_start[g + 1]) with tile_start the prefix sum of
// tiles_m(g) * tiles_n, in the order GroupedRaster gives inside the group.
// Groups with M_g = 0 have no tiles.
//
// Every CTA builds the table (row_start, tile_start) in shared memory from
// the device row counts at kernel start (build_grouped_table: one block-wide
// scan, one global read per group), so no prologue kernel, no workspace and
// no host sync sit between the routing and the GEMM. Producer, waiter,
// notifier and consumers then walk positions blockIdx.x + i * gridDim.x
// < tile_start[G] each with their own GroupCursor; a cursor only moves
// forward (positions increase), so finding a tile's group costs O(G + tiles)
// smem reads per CTA over the whole launch, not a search per tile.
//
// Device-side validation: a negative M_g, or a total above max_rows (the
// host's upper bound, which sized A, D and the grid), makes every CTA compute
// NOTHING (tile_start[G] = 0) and CTA 0 records the first offence in the
// status words (GroupedStatus below); the host reads them after the call
// (kernels::grouped_gemm_status). A valid table records kOk, so the status
// words need no reset between calls.
#pragma once

#include <cstdint>

#include "tessera/kernels/gemm/fast_divmod.cuh"
#include "tessera/kernels/gemm/grouped_raster.hpp"
#include "tessera/kernels/gemm/tile.cuh"

namespace tessera::kernels::engine {

/// Largest G the shared-memory table holds (2 x (G + 1) ints = 8 KiB).
constexpr int kGroupedMaxGroups = 1024;

/// What a grouped kernel tells its policies about a tile. The TileInfo base
/// is in the coordinates of the STACKED matrices, so engine policies written
/// for TileInfo keep their meaning per group:
///   m, n      tile row inside the group, tile column;
///   pos       schedule position = global tile id (unique over all groups);
///   row0      first stacked row of the tile (group_row0 + m * bm);
///   col0      first column;
///   tiles_m   the group's tile rows; tiles_n;
///   M         END row of the group (group_row0 + group_rows): rows < M are
///             the group's; the tile's rows >= M belong to the next group
///             (computed with the wrong weights, never stored); N.
/// E.g. FlagWait with rows_per_flag waits for the stacked rows the tile reads
/// (clipped at the group's end): TileLink's per-expert-tile wait on gathered
/// token chunks.
struct GroupedTileInfo : TileInfo {
  int group;       ///< g
  int group_row0;  ///< row_start[g]
  int group_rows;  ///< M_g
};

/// The status words (int[kGroupedStatusWords], device memory) CTA 0 writes
/// every launch: code, group, value (64-bit, low word first).
enum GroupedStatusCode : int {
  kGroupedOk = 0,
  kGroupedNegativeRows = 1,   ///< group's M_g < 0 (value = M_g)
  kGroupedRowsOverBound = 2,  ///< sum of M_g > max_rows (group = G, value = the sum)
};
constexpr int kGroupedStatusWords = 4;

/// Shared-memory table: row_start[kGroupedMaxGroups + 1],
/// tile_start[kGroupedMaxGroups + 1], then scan scratch.
struct GroupedTable {
  static constexpr int kWarpsMax = 32;
  static constexpr int kTableBytes = (2 * (kGroupedMaxGroups + 1) * 4 + 7) / 8 * 8;
  static constexpr int kBytes = kTableBytes + kWarpsMax * 8 + kWarpsMax * 4 + 16;
  int* row_start;
  int* tile_start;
  long long* warp_rows;
  int* warp_tiles;
  int* warp_bad;  // [0]: first bad group (or INT_MAX)

  __device__ static GroupedTable at(uint8_t* p) {
    GroupedTable t;
    t.row_start = reinterpret_cast<int*>(p);
    t.tile_start = t.row_start + kGroupedMaxGroups + 1;
    t.warp_rows = reinterpret_cast<long long*>(p + kTableBytes);
    t.warp_tiles = reinterpret_cast<int*>(t.warp_rows + kWarpsMax);
    t.warp_bad = t.warp_tiles + kWarpsMax;
    return t;
  }
};

/// Builds the table from rows[0 .. groups) (device memory). Every thread of
/// the CTA (kThreads) calls it; it ends with __syncthreads. groups <=
/// kGroupedMaxGroups, tile counts fit in int (the host checked the bound).
/// Thread t owns the contiguous groups [t * P, (t + 1) * P), P =
/// ceil(groups / kThreads): a serial sum, a warp shuffle scan, a scan of the
/// warp totals, then the writes.
template <int kThreads, int BM>
__device__ __forceinline__ void build_grouped_table(const GroupedTable& tab, const int* __restrict__ rows, int groups,
                                                    int tiles_n, int max_rows, int* status) {
  static_assert(kThreads % 32 == 0 && kThreads / 32 <= GroupedTable::kWarpsMax, "scan scratch");
  constexpr int kWarps = kThreads / 32;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int per = (groups + kThreads - 1) / kThreads;
  const int g0 = min(tid * per, groups), g1 = min(g0 + per, groups);
  long long my_rows = 0;
  int my_tiles = 0, my_bad = 0x7fffffff, my_bad_value = 0;
  for (int g = g0; g < g1; ++g) {
    const int r = __ldg(rows + g);
    if (r < 0 && my_bad == 0x7fffffff) {
      my_bad = g;
      my_bad_value = r;
    }
    const int rr = r < 0 ? 0 : r;
    my_rows += rr;
    my_tiles += ((rr + BM - 1) / BM) * tiles_n;
  }
  // Inclusive warp scan.
  long long inc_rows = my_rows;
  int inc_tiles = my_tiles;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const long long r = __shfl_up_sync(0xffffffffu, inc_rows, d);
    const int t = __shfl_up_sync(0xffffffffu, inc_tiles, d);
    if (lane >= d) {
      inc_rows += r;
      inc_tiles += t;
    }
  }
  int bad = my_bad;
#pragma unroll
  for (int d = 16; d >= 1; d /= 2) bad = min(bad, __shfl_xor_sync(0xffffffffu, bad, d));
  if (lane == 31) {
    tab.warp_rows[warp] = inc_rows;
    tab.warp_tiles[warp] = inc_tiles;
  }
  if (tid == 0) tab.warp_bad[0] = 0x7fffffff;
  __syncthreads();
  if (lane == 0 && bad != 0x7fffffff) atomicMin(tab.warp_bad, bad);
  long long base_rows = 0;
  int base_tiles = 0;
  long long total_rows = 0;
  int total_tiles = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const long long wr = tab.warp_rows[w];
    const int wt = tab.warp_tiles[w];
    if (w < warp) {
      base_rows += wr;
      base_tiles += wt;
    }
    total_rows += wr;
    total_tiles += wt;
  }
  base_rows += inc_rows - my_rows;
  base_tiles += inc_tiles - my_tiles;
  __syncthreads();  // warp_bad complete
  const int first_bad = *tab.warp_bad;
  const bool ok = first_bad == 0x7fffffff && total_rows <= max_rows;
  long long rs = base_rows;
  int ts = base_tiles;
  for (int g = g0; g < g1; ++g) {
    const int r = max(__ldg(rows + g), 0);
    tab.row_start[g] = static_cast<int>(rs);
    tab.tile_start[g] = ok ? ts : 0;
    rs += r;
    ts += ((r + BM - 1) / BM) * tiles_n;
  }
  if (tid == 0) {
    tab.row_start[groups] = static_cast<int>(total_rows < max_rows ? total_rows : max_rows);
    tab.tile_start[groups] = ok ? total_tiles : 0;
  }
  if (blockIdx.x == 0 && status != nullptr) {
    // The first offence: a negative count (lowest group), else the bound.
    if (my_bad == first_bad && first_bad != 0x7fffffff) {
      status[1] = first_bad;
      status[2] = my_bad_value;
      status[3] = my_bad_value < 0 ? -1 : 0;
      __threadfence();
      status[0] = kGroupedNegativeRows;
    } else if (tid == 0 && first_bad == 0x7fffffff) {
      status[1] = groups;
      status[2] = static_cast<int>(static_cast<unsigned long long>(total_rows) & 0xffffffffu);
      status[3] = static_cast<int>(static_cast<unsigned long long>(total_rows) >> 32);
      status[0] = total_rows <= max_rows ? kGroupedOk : kGroupedRowsOverBound;
    }
  }
  __syncthreads();
}

/// A forward-only walk over the schedule (one per role; positions must not
/// decrease between calls).
template <int BM, int BN>
struct GroupCursor {
  int g = 0;
  __device__ __forceinline__ GroupedTileInfo at(const GroupedTable& tab, int pos, const GroupedRaster& raster, int N) {
    while (tab.tile_start[g + 1] <= pos) ++g;
    const int local = pos - tab.tile_start[g];
    const int r0 = tab.row_start[g];
    const int rows = tab.row_start[g + 1] - r0;
    const int tiles_m = (rows + BM - 1) / BM;
    int tm, tn;
    raster.at(local, tiles_m, tm, tn);
    GroupedTileInfo t;
    t.m = tm;
    t.n = tn;
    t.pos = pos;
    t.row0 = r0 + tm * BM;
    t.col0 = tn * BN;
    t.bm = BM;
    t.bn = BN;
    t.tiles_m = tiles_m;
    t.tiles_n = raster.tiles_n;
    t.M = r0 + rows;
    t.N = N;
    t.group = g;
    t.group_row0 = r0;
    t.group_rows = rows;
    return t;
  }
};

}  // namespace tessera::kernels::engine
