// tessera/ops/fused_arguments.hpp — what the fused TP operators know about
// one launch of their GEMM-engine policies (host only). Each policy of
// fused_policies.cuh names one of these as its `Arguments` and makes its
// device Params from it once (`to_params`, CUTLASS-3 style), so an operator
// fills one launch Arguments and nothing copies fields in between.
#pragma once

#include <cstdint>

#include "tessera/link/tile_map.hpp"
#include "tessera/runtime/symmetric_heap.hpp"

namespace tessera::ops::detail {

/// A prologue's wait on flag rows: flags[src * flag_stride + slot] >= epoch,
/// one row per source rank (this rank's rows of a Signals object). The
/// timeout and the diagnostic record are the runtime's (to_params).
struct FlagRowsArguments {
  const std::uint64_t* flags = nullptr;
  int flag_stride = 0;  ///< slots per source row
  std::uint64_t epoch = 0;
};

/// Whether rows [lo, lo + rows) of M start on a row of tile_m-row tiles and
/// end on one or at M, so no tile straddles them and the rows around them.
inline bool rows_on_tiles(std::int64_t lo, std::int64_t rows, std::int64_t m, int tile_m) {
  return lo % tile_m == 0 && (rows % tile_m == 0 || lo + rows == m);
}

/// AgPrologue: per-tile waits on the AllGather's channel flags.
struct AgPrologueArguments {
  link::AllGatherTileMap map;  ///< channels = flag slots per source
  FlagRowsArguments flags;
  int rank = 0;
  /// Optional: the own shard read in place ([local_rows, K], row stride
  /// local_lda, rows local_lo.. in gathered coordinates) instead of from the
  /// workspace. Requires local_lo and local_rows on tile rows (or the shard
  /// ending at M).
  const void* local = nullptr;
  std::int64_t local_lo = 0, local_rows = 0, local_lda = 0;
};

/// The GEMM+RS shard geometry every RS policy reads (RsEpilogue,
/// RsOwnerEpilogue, RsOwnerPrologue): row r goes to owner r / per_rank's
/// receive slab, block [rank].
struct RsShardArguments {
  void* recv[runtime::kMaxPeers] = {};               ///< each owner's slab base ([world][per_rank][ld_recv])
  std::uint64_t* counters[runtime::kMaxPeers] = {};  ///< each owner's counter array
  std::int64_t per_rank = 0, ld_recv = 0;
  int rank = 0, world = 1;
  /// Owner-adding policies: this rank's output rows (row stride ldd).
  void* d = nullptr;
  std::int64_t ldd = 0;
};

/// RsStageEpilogue + RsBandPrologue (Strategy::fused_ce): remote rows go to
/// the local `stage` slabs, counted per band of GemmOptions::raster_group
/// tile rows on band_count; own tiles wait for the peers' band flags and add
/// shards.recv[rank]'s slabs.
struct RsStageArguments {
  RsShardArguments shards;
  void* stage = nullptr;
  std::uint64_t* band_count = nullptr;
  FlagRowsArguments band_flags;
  unsigned diag_skip = 0;  ///< OpOptions::diag_skip (kernel-only runs only)
  /// GEMM+AR: own tiles are counted on band_count too (shards.d then points
  /// at this rank's rows of the full output).
  bool count_own = false;
};

}  // namespace tessera::ops::detail
