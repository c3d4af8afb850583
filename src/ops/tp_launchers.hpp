// src/ops/tp_launchers.hpp — launchers of the TP-MLP operators' device code
// (compiled in the .cu files of src/ops; no fmt here: nvcc 13 cannot compile
// it, so these only report errors through kernels::detail::fail/cuda_check).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/kernels/gemm.hpp"
#include "tessera/link/tile_map.hpp"
#include "tessera/ops/fused_arguments.hpp"
#include "tessera/ops/plan.hpp"
#include "tessera/runtime/dtype.hpp"
#include "tessera/runtime/signals.hpp"

namespace tessera::ops::detail {

/// Output tiles of the fused TP GEMMs: the engine's ping-pong 64x256, one
/// tile for every fused GEMM (one kernel per policy pair keeps the build
/// small). One consumer warpgroup stores its tile while the other runs its
/// main loop: AG+GEMM's plain or SiLU·up store, and GEMM+RS's owner add of
/// the peers' slabs. Plans (plan_ag / plan_rs) use the same rows and columns.
inline constexpr kernels::GemmTile kAgTile = kernels::GemmTile::T64x256;
inline constexpr kernels::GemmTile kRsTile = kRsFusedTile;
inline constexpr int kAgTileM = kernels::tile_shape(kAgTile).bm;
inline constexpr int kRsTileM = kernels::tile_shape(kRsTile).bm;
inline constexpr int kRsTileN = kernels::tile_shape(kRsTile).bn;

/// The options every fused GEMM runs with: its ping-pong tile, the default
/// raster bands, tile rows rotated by rotate_m, at most max_ctas CTAs (0: all).
inline kernels::GemmOptions fused_options(kernels::GemmTile tile, int rotate_m, int max_ctas) {
  kernels::GemmOptions o{};
  o.tile = tile;
  o.ping_pong = true;
  o.rotate_m = rotate_m;
  o.max_ctas = max_ctas;
  return o;
}

/// Fused AG+GEMM: D = A_gathered · Bᵀ (or SiLU·up with swiglu), per-tile
/// waits on the AG data flags (AgPrologue). problem.a is the gathered A
/// (the symmetric workspace), problem.d the output; B is [N, K].
struct AgGemmArguments {
  kernels::GemmArgs problem;
  kernels::GemmOptions options;  ///< fused_options(kAgTile, ...)
  AgPrologueArguments prologue;
  bool swiglu = false;
};
void launch_ag_gemm(const AgGemmArguments& p, cudaStream_t s);
/// Whether own rows [lo, lo + rows) of M can be read in place (AgPrologueArguments::local):
/// they start on a tile row and end on one or at M, so no tile straddles A and the workspace.
inline bool ag_local_rows_on_tiles(std::int64_t lo, std::int64_t rows, std::int64_t m) {
  return rows_on_tiles(lo, rows, m, kAgTileM);
}

/// Which GEMM+RS epilogue a fused launch runs.
enum class RsEpilogueKind {
  /// RsEpilogue: every row to its owner's slab; tile_done adds 1 to
  /// counters[owner][tile_m] (a reduce kernel adds the slabs).
  slabs,
  /// RsOwnerEpilogue + RsOwnerPrologue: per-TILE counters; own tiles are
  /// reduced into shards.d instead of going to the own slab.
  owner_add,
  /// RsStageEpilogue + RsBandPrologue (Strategy::fused_ce): the copy engine
  /// moves the staged rows; needs owner_add's tile-row shards.
  stage_ce,
};

/// Fused GEMM+RS: partial = A · Bᵀ (B [N, K]) through the epilogue `kind`;
/// the fields of `rs` it reads are those its policies name (shards for
/// every kind, the rest for stage_ce). options.raster_group is the raster
/// band (RsPlan::owner_raster_group), which stage_ce counts on.
struct GemmRsArguments {
  kernels::GemmArgs problem;
  kernels::GemmOptions options;  ///< fused_options(kRsTile, ...)
  RsEpilogueKind kind = RsEpilogueKind::slabs;
  RsStageArguments rs;
};
void launch_gemm_rs(const GemmRsArguments& p, cudaStream_t s);

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
/// copy-in of a rank's shard, which as a 2D memcpy runs on a copy engine at
/// ~1 TB/s, several times slower than the SMs copy it, on the decomposition
/// path's critical path.
void launch_copy_rows(void* dst, std::int64_t dst_pitch, const void* src, std::int64_t src_pitch,
                      std::int64_t row_bytes, std::int64_t rows, cudaStream_t s);

/// p[0, count) = pseudo-random bf16 in [-1, 1) (the tuner's load GEMM operands).
void launch_fill_bf16(void* p, std::int64_t count, std::uint32_t seed, cudaStream_t s);

/// Loads every ops kernel's module now (lazy loading would otherwise load a
/// module at first launch and wait for running kernels — a deadlock when a
/// GEMM is spinning on data that kernel should push).
void preload_kernels();

}  // namespace tessera::ops::detail
