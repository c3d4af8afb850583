// src/ops/tp_launchers.hpp — launchers of the TP-MLP operators' device code
// (compiled in the .cu files of src/ops; no fmt here: nvcc 13 cannot compile
// it, so these only report errors through kernels::detail::fail/cuda_check).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/link/tile_map.hpp"
#include "tessera/runtime/dtype.hpp"
#include "tessera/runtime/signals.hpp"

namespace tessera::ops::detail {

/// Output tiles of the fused TP GEMMs.
/// AG+GEMM: the engine's ping-pong 64x256 kernel (GemmOptions::
/// ping_pong): one consumer warpgroup stores its tile while the other
/// runs its main loop; measured 0.988x cuBLASLt (median) against 1.019x for
/// the cooperative 128x256 on the MLP shapes (nvidia-h200-x2, 0e9d5cb).
/// GEMM+RS: the same ping-pong 64x256, so the owner tiles' epilogue (the
/// add of the peers' slabs) runs while the other consumer's main loop runs.
/// (Its earlier device wait timeout on small shapes, da267a3, was the notify
/// handshake race fixed in c8a72a0 / 465e829; the cooperative 128x256 was
/// used until that fix was verified, 72b5420.)
/// Plans (plan_ag / plan_rs) use the same rows and columns.
inline constexpr int kAgTileM = 64;
inline constexpr int kRsTileM = 64;  // = ops::kRsFusedTileRows (plan.hpp; checked in gemm_rs.cpp)
inline constexpr int kRsTileN = 256;

/// Fused AG+GEMM: D = A_gathered · Bᵀ (or SiLU·up with swiglu) with the
/// Tessera engine (kAgTileM x 256 ping-pong tile), per-tile waits on the AG data flags.
struct AgGemmLaunch {
  const void* a = nullptr;  ///< gathered A [M, K], packed (the symmetric workspace)
  /// Optional: the own shard read in place ([local_rows, K], row stride
  /// local_lda, rows local_lo.. in gathered coordinates) instead of from the
  /// workspace. Requires local_lo and local_rows on tile rows (or the shard
  /// ending at M).
  const void* local = nullptr;
  std::int64_t local_lo = 0, local_rows = 0, local_lda = 0;
  const void* b = nullptr;
  void* d = nullptr;
  std::int64_t m = 0, n = 0, k = 0, ldb = 0, ldd = 0;
  DType dtype = DType::bf16;
  bool swiglu = false;
  link::AllGatherTileMap map;            ///< channels = flag slots per source
  const std::uint64_t* flags = nullptr;  ///< this rank's per-source flag rows (Signals base + slots)
  int flag_stride = 0;                   ///< slots per source row
  int rank = 0;
  std::uint64_t epoch = 0;
  int rotate_m = 0;
  int max_ctas = 0;
};
void launch_ag_gemm(const AgGemmLaunch& p, cudaStream_t s);
/// Whether own rows [lo, lo + rows) of M can be read in place (AgGemmLaunch::local):
/// they start on a tile row and end on one or at M, so no tile straddles A and the workspace.
inline bool ag_local_rows_on_tiles(std::int64_t lo, std::int64_t rows, std::int64_t m) {
  return lo % kAgTileM == 0 && (rows % kAgTileM == 0 || lo + rows == m);
}

/// Fused GEMM+RS: partial = A · Bᵀ; each row goes to its owner's receive
/// slab row block [rank][...]; tile_done adds 1 to counter[tile_m] on each owner.
struct GemmRsLaunch {
  const void* a = nullptr;
  const void* b = nullptr;
  std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0;
  DType dtype = DType::bf16;
  void* recv[runtime::kMaxPeers] = {};               ///< each owner's slab base ([world][per_rank][ld_recv])
  std::uint64_t* counters[runtime::kMaxPeers] = {};  ///< each owner's counter array (by tile row)
  std::int64_t per_rank = 0, ld_recv = 0;
  int rank = 0, world = 1;
  int rotate_m = 0;
  int max_ctas = 0;
  /// Owner add in the epilogue (RsOwnerEpilogue): counters are per TILE, own
  /// tiles are reduced into d (this rank's rows, row stride ldd) instead of
  /// going to the own slab.
  bool owner_epilogue = false;
  int raster_group = 8;  ///< RasterScheduler band height (see RsPlan::owner_raster_group)
  void* d = nullptr;
  std::int64_t ldd = 0;
  /// Copy-engine variant (RsStageEpilogue / RsBandPrologue, Strategy::
  /// fused_ce): remote rows to the local `stage` slabs, counted per band of
  /// raster_group tile rows on band_count; own tiles wait for the peers'
  /// band flags (band_flags[src * flag_stride + band] >= epoch) and add
  /// recv[rank]'s slabs. Needs owner_epilogue's tile-row shards.
  bool stage_ce = false;
  void* stage = nullptr;
  std::uint64_t* band_count = nullptr;
  const std::uint64_t* band_flags = nullptr;
  int flag_stride = 0;
  std::uint64_t epoch = 0;
  unsigned diag_skip = 0;  ///< OpOptions::diag_skip (kernel-only runs only)
  /// fused_ce for GEMM+AR: own tiles are counted on band_count too (d then
  /// points at this rank's rows of the full output).
  bool count_own = false;
};
void launch_gemm_rs(const GemmRsLaunch& p, cudaStream_t s);

/// Owner's reduction: out[r, :] = Σ_{s=0..R-1} slab[s][r, :] in rank order,
/// for its rows, tile row by tile row; when `counters` is set, waits for
/// counters[t] >= expected first and then subtracts expected (consumes).
struct ReduceLaunch {
  const void* slabs = nullptr;  ///< this rank's slab base
  std::int64_t per_rank = 0, ld_recv = 0;
  std::int64_t rows = 0, n = 0;  ///< this rank's rows, columns
  std::int64_t row0 = 0;         ///< global row of this rank's first row
  int world = 1;
  void* out = nullptr;
  std::int64_t ldo = 0;
  DType dtype = DType::bf16;
  std::uint64_t* counters = nullptr;  ///< null: no waits (stream-ordered data)
  std::uint64_t expected = 0;
  int tile_m = 128;
  runtime::SignalView sv{};  ///< for the wait's timeout and diagnostics
};
void launch_reduce(const ReduceLaunch& p, int ctas, cudaStream_t s);

/// SM push of this rank's shard (rows [lo, lo+rows) of the packed gathered
/// workspace, row bytes row_bytes) to every peer's workspace, channel by
/// channel in step order, each channel followed by a .sys release store
/// flag_at(dst, c) = epoch by the last CTA to finish it. `done` is a local
/// int array of kMaxChannels·kMaxPeers counters, zero between calls (the
/// last CTA resets it).
struct PushLaunch {
  void* ws[runtime::kMaxPeers] = {};
  std::int64_t lo = 0, rows = 0, row_bytes = 0;
  int channels = 1;
  std::int64_t rows_per_channel = 0;
  int push_to[runtime::kMaxPeers] = {};
  int steps = 0;
  runtime::SignalView sv{};
  std::uint64_t epoch = 0;
  unsigned int* done = nullptr;
};
void launch_push(const PushLaunch& p, int ctas, cudaStream_t s);

/// out[r, j] = SiLU(in[r, 2j]) * in[r, 2j+1] (the sequential path's activation).
void launch_swiglu(const void* in, std::int64_t ld_in, void* out, std::int64_t ld_out, std::int64_t rows,
                   std::int64_t n_out, DType dtype, cudaStream_t s);

/// dst rows (pitch dst_pitch bytes) = src rows (pitch src_pitch): `rows` rows
/// of `row_bytes` bytes, all three multiples of 16. An SM copy: the AG
/// copy-in of a rank's shard, which as a 2D memcpy ran on a copy engine at
/// ~1 TB/s (measured: taking it off the decomposition path saved 50-70 us
/// per 32-64 MiB shard).
void launch_copy_rows(void* dst, std::int64_t dst_pitch, const void* src, std::int64_t src_pitch,
                      std::int64_t row_bytes, std::int64_t rows, cudaStream_t s);

/// p[0, count) = pseudo-random bf16 in [-1, 1) (the tuner's load GEMM operands).
void launch_fill_bf16(void* p, std::int64_t count, std::uint32_t seed, cudaStream_t s);

/// Loads every ops kernel's module now (lazy loading would otherwise load a
/// module at first launch and wait for running kernels — a deadlock when a
/// GEMM is spinning on data that kernel should push).
void preload_kernels();

}  // namespace tessera::ops::detail
