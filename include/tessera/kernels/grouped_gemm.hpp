// tessera/kernels/grouped_gemm.hpp — host entry point of the grouped GEMM:
// G problems with their own row counts in ONE persistent launch, the row
// counts read from DEVICE memory (routing computed on the GPU; the host
// never syncs to learn them).
//
//   for g in [0, G):  D_g[M_g, N] = A_g[M_g, K] · op(B_g)      (f32 accumulation)
//
// Layout (the MoE expert case, tokens sorted by expert):
//   A: stacked rows [max_rows, K], row stride lda; group g's rows start at
//      row_start[g] = M_0 + ... + M_{g-1} (no padding between groups).
//   B: [G, N, K] (BLayout::NK, nn.Linear weights) or [G, K, N] (BLayout::KN),
//      row stride ldb, group stride stride_b (elements; 0 = packed).
//   D: stacked [max_rows, N] (N/2 with the SwiGLU epilogue), row stride ldd.
//      Rows >= sum M_g are not written.
//   Row gather (optional, a_gather set): A is then any [a_rows, K] matrix
//      (row stride lda) and stacked row i reads its row a_gather[i] /
//      a_gather_div, so the MoE dispatch (tokens -> rows sorted by expert)
//      happens inside the loads instead of in a gather kernel. Only the
//      first sum(M_g) entries of a_gather are read; an index outside
//      [0, a_rows · a_gather_div) reads a zero row. bf16, B as NK and the
//      SwiGLU epilogue (the gate/up GEMM) only.
//   group_rows: device int[G], M_g >= 0, sum <= max_rows. Empty groups are
//      fine (no tiles).
//   status: device int[4] (kGroupedStatusWords); the kernel writes it on
//      every launch: code 0 = ok; 1 = some M_g < 0; 2 = sum M_g > max_rows.
//      On 1 or 2 NOTHING is computed (D untouched): a wrong table is
//      reported, never half applied. Read it after the call with
//      grouped_gemm_status() / check_grouped_gemm_status() (these sync the
//      stream; the launch itself does not).
//
// Host upper bound: max_rows sizes the TMA map of A, D and the persistent
// grid (at most floor(max_rows / BM) + G tile rows); the kernel reads the
// actual M_g. Same N and K for all groups (per-group N/K: not supported).
//
// Limits (validate() throws tessera::Error before any launch, naming the
// argument and value): 1 <= G <= kGroupedMaxGroups (1024, the size of the
// kernel's shared-memory table); 0 <= max_rows < 2^31; N >= 1, K >= 8, both
// < 2^31, K % 8 == 0; bf16 in and out (f16 only through the templated entry
// point, grouped_launch.cuh); A, B, D
// 16-byte aligned; group_rows and status 4-byte aligned and non-null;
// lda, ldb, stride_b multiples of 8 elements, ldd rows a multiple of 16
// bytes; SwiGLU needs N even; sm_90 device.
//
// Policies (per-tile waits, per-expert notification) are reached through the
// templated entry point in tessera/kernels/gemm/grouped_launch.cuh; the
// hooks receive engine::GroupedTileInfo (grouped_scheduler.cuh), which
// carries the group.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "tessera/kernels/gemm.hpp"
#include "tessera/runtime/dtype.hpp"

namespace tessera::kernels {

/// Largest group count (the kernel's shared-memory table).
constexpr int64_t kGroupedMaxGroups = 1024;
/// Size of the status buffer (ints).
constexpr int kGroupedStatusInts = 4;

struct GroupedGemmArgs {
  const void* a = nullptr;          ///< stacked [max_rows, K], row stride lda
  const void* b = nullptr;          ///< [G, N, K] (NK) or [G, K, N] (KN)
  void* d = nullptr;                ///< stacked [max_rows, N] (N/2 with SwiGLU)
  const int* group_rows = nullptr;  ///< device int[G]: M_g
  int* status = nullptr;            ///< device int[kGroupedStatusInts]
  int64_t groups = 0;               ///< G
  int64_t n = 0, k = 0;
  int64_t max_rows = 0;               ///< host upper bound of sum M_g
  int64_t lda = 0, ldb = 0, ldd = 0;  ///< elements; 0 = packed
  int64_t stride_b = 0;               ///< elements between groups of B; 0 = packed
  DType in = DType::bf16;
  DType out = DType::bf16;
  BLayout b_layout = BLayout::NK;
  const int32_t* a_gather = nullptr;  ///< device [max_rows] or nullptr (see "Row gather" above)
  int64_t a_gather_div = 1;           ///< a_gather[i] / a_gather_div is the row of A
  int64_t a_rows = 0;                 ///< rows of A when gathering

  int64_t lda_or_packed() const { return lda ? lda : k; }
  int64_t ldb_or_packed() const { return ldb ? ldb : (b_layout == BLayout::NK ? k : n); }
  int64_t stride_b_or_packed() const {
    return stride_b ? stride_b : ldb_or_packed() * (b_layout == BLayout::NK ? n : k);
  }
};

/// Kernel configurations (tile of D per CTA step; BK = 64; no clusters).
/// Cooperative: both consumer warpgroups share one tile. Ping-pong: each
/// consumer takes alternate tiles, so one's stores overlap the other's
/// main loop (short K).
enum class GroupedTile { Auto, Coop128x256, Coop128x128, PingPong128x128, PingPong64x256 };
std::string grouped_tile_name(GroupedTile t);
TileShape grouped_tile_shape(GroupedTile t);

enum class GroupedEpilogueKind {
  Plain,   ///< D = acc
  SwiGLU,  ///< D[r, j] = SiLU(acc[r, 2j]) * acc[r, 2j + 1] (gate/up interleaved in B's N)
};

struct GroupedGemmOptions {
  GroupedTile tile = GroupedTile::Auto;
  int max_ctas = 0;  ///< cap on the persistent grid; 0 = all SMs
  /// Order of a group's tiles: 0 = row-major (tile column fastest); b > 0 =
  /// bands of b tile rows walked down first, then right (as the engine's
  /// RasterScheduler); -1 = auto: 8 for the 64-row tile (its A panels are
  /// small; measured 1-12 % faster), 0 otherwise. See engine::GroupedRaster.
  int raster_band = -1;
  GroupedEpilogueKind epilogue = GroupedEpilogueKind::Plain;
};

/// Throws tessera::Error naming the offending argument unless `a` (with
/// `o`'s epilogue) is a problem the grouped GEMM accepts.
void validate(const GroupedGemmArgs& a, const GroupedGemmOptions& o = {});

/// The configuration Auto resolves to for this problem.
GroupedTile resolve_grouped_tile(const GroupedGemmArgs& a, const GroupedGemmOptions& o);

/// Upper bound of the tiles for tile shape `s` (grid sizing): (floor(max_rows
/// / bm) + min(G, max_rows)) * ceil(N / bn).
int64_t grouped_max_tiles(const GroupedGemmArgs& a, TileShape s);

/// One launch on `stream`; validates first. No host sync.
void grouped_gemm(const GroupedGemmArgs& a, const GroupedGemmOptions& o = {}, cudaStream_t stream = nullptr);

struct GroupedGemmStatus {
  int code = 0;       ///< 0 ok, 1 negative M_g, 2 sum over max_rows
  int group = 0;      ///< the group (code 1) or G (code 2)
  int64_t value = 0;  ///< the M_g (code 1) or the sum (codes 0, 2)
  bool ok() const { return code == 0; }
  std::string message() const;
};

/// Reads the status words (synchronises `stream`).
GroupedGemmStatus grouped_gemm_status(const int* status, cudaStream_t stream = nullptr);
/// Throws tessera::Error with the status' message unless it is ok.
void check_grouped_gemm_status(const int* status, cudaStream_t stream = nullptr, const char* op = "grouped_gemm");

}  // namespace tessera::kernels
