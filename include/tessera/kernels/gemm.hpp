// tessera/kernels/gemm.hpp — host entry point of Tessera's Hopper GEMM engine.
//
//   D[M, N] = A[M, K] · op(B)        (f32 accumulation)
//
// A is row-major [M, K] (leading dimension lda, in elements). B is either
// [N, K] row-major (BLayout::NK, the nn.Linear weight layout: D = A·Bᵀ) or
// [K, N] row-major (BLayout::KN: D = A·B), leading dimension ldb. D is
// row-major [M, N] with leading dimension ldd. Inputs bf16 or f16 (A and B the
// same type); output bf16, f16 or f32.
//
// The kernel is a persistent, warp-specialized sm_90a kernel: one producer
// warpgroup loads tiles with TMA into a multi-stage shared-memory ring guarded
// by mbarriers, two consumer warpgroups multiply them with wgmma. Tile shape
// is chosen per problem (choose_tile) unless GemmOptions::tile fixes it.
//
// Limits (checked by validate(), which throws tessera::Error before any
// launch): M, N, K >= 1 and < 2^31 (any tails: TMA zero-fills them); lda and
// ldb multiples of 8 elements and >= the row length, A and B 16-byte aligned
// (TMA needs 16-byte aligned bases and row strides; a packed K or N that is
// not a multiple of 8 therefore needs a padded lda / ldb); ldd >= N, D
// aligned to its element (rows that are not 16-byte multiples go through an
// aligned staging buffer and a 2-D copy); the running device must be sm_90
// (Hopper). The policy entry points (launch.cuh) store through their
// epilogue and keep the 16-byte rule for it.
//
// One entry point: gemm(args, options, stream). GemmArgs states the problem
// (pointers, shape, strides, input and output types, B's layout);
// GemmOptions states how to run it: tile, schedule (ping_pong), cluster,
// K splits, the persistent grid's cap and raster order, and where the plan
// comes from when the options name none (plan_source: the model, or the
// measured override of gemm_plan.hpp). plan_gemm(a, resolve_options(a, o))
// is the plan gemm(a, o) runs.
//
// Policies (a per-tile wait before the main loop, epilogue variants that
// add a partial, store through a reorder map, notify flags, fuse bias or
// SiLU(gate)·up, and explicit tile orders) are device hooks: they are
// reached through the templated entry points in
// tessera/kernels/gemm/launch.cuh, which fix the kernel at compile time;
// this header's gemm() is the plain, policy-free GEMM.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "tessera/runtime/dtype.hpp"

namespace tessera::kernels {

enum class BLayout {
  NK,  ///< B is [N, K] row-major (K contiguous): D = A · Bᵀ
  KN,  ///< B is [K, N] row-major (N contiguous): D = A · B
};

struct GemmArgs {
  const void* a = nullptr;  ///< [M, K], row stride lda
  const void* b = nullptr;  ///< [N, K] (NK) or [K, N] (KN), row stride ldb
  void* d = nullptr;        ///< [M, N], row stride ldd
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;  ///< in elements; 0 means "packed"
  DType in = DType::bf16;             ///< type of A and B: bf16 or f16
  DType out = DType::bf16;            ///< type of D: bf16, f16 or f32
  BLayout b_layout = BLayout::NK;

  int64_t lda_or_packed() const { return lda ? lda : k; }
  int64_t ldb_or_packed() const { return ldb ? ldb : (b_layout == BLayout::NK ? k : n); }
  int64_t ldd_or_packed() const { return ldd ? ldd : n; }
};

/// Output tile shapes the engine is compiled for (rows x columns of D per
/// tile). All use BK = 64 and two consumer warpgroups. Default (cooperative)
/// schedule: both consumers share one tile per CTA — 128x256, 256x128,
/// 128x128. With GemmOptions::ping_pong each consumer owns
/// a whole tile: 128x128 or 64x256 (64x256 exists only there). 64x64
/// (ping-pong) is compiled for the plain gemm() only, output type == input
/// type or split-K: plan_gemm() considers it where few tiles would leave SMs
/// idle (4x the CTAs of a 128x128 tile loading B, the bound there); the
/// policy entry points reject it. 128x192 (cooperative, no clusters) is
/// compiled for the plain gemm() only, output type == input type: a third
/// column granularity between 128 and 256 for problems whose N or tile count
/// sits badly against 128-wide or 256-wide tiles; the policy entry points
/// reject it. 128x32, 128x64 and 128x96 (cooperative, no clusters) run only
/// with GemmOptions::swap_ab, where the kernel computes D^T = B A^T: their
/// 128 rows are D's columns and their 32 / 64 / 96 columns D's rows, so a
/// small M costs a narrow wgmma N instead of a 64-row atom mostly of
/// padding.
enum class GemmTile { Auto, T128x256, T256x128, T128x128, T64x256, T64x64, T128x192, T128x32, T128x64, T128x96 };

struct TileShape {
  int bm, bn;
};
namespace detail {
/// Throws tessera::Error: GemmTile::Auto has no shape until resolved.
[[noreturn]] void fail_unresolved_tile_shape();
}  // namespace detail
/// The rows and columns of tile `t`: the one statement of each tile's shape
/// (the kernels' tile configurations and the operators' tile constants read it).
constexpr TileShape tile_shape(GemmTile t) {
  switch (t) {
    case GemmTile::T128x256:
      return {128, 256};
    case GemmTile::T256x128:
      return {256, 128};
    case GemmTile::T128x128:
      return {128, 128};
    case GemmTile::T64x256:
      return {64, 256};
    case GemmTile::T64x64:
      return {64, 64};
    case GemmTile::T128x192:
      return {128, 192};
    case GemmTile::T128x32:
      return {128, 32};
    case GemmTile::T128x64:
      return {128, 64};
    case GemmTile::T128x96:
      return {128, 96};
    case GemmTile::Auto:
      break;
  }
  detail::fail_unresolved_tile_shape();
}
std::string tile_name(GemmTile t);
/// The shared-memory pipeline depth (K blocks in flight per CTA) of tile
/// `t`'s kernel, cooperative or (ping_pong) ping-pong: the one statement of
/// it, read by the kernels' configurations (launch.cuh) and the cost model.
/// Each fills the 227 KiB of shared memory with its (BM + BN) x 64 stages.
constexpr int tile_stages(GemmTile t, bool ping_pong) {
  switch (t) {
    case GemmTile::T128x256:
    case GemmTile::T256x128:
      return 4;
    case GemmTile::T128x128:
      return ping_pong ? 7 : 6;
    case GemmTile::T64x256:
    case GemmTile::T128x192:
      return 5;
    case GemmTile::T64x64:
      return 13;
    case GemmTile::T128x32:
      return 11;
    case GemmTile::T128x64:
      return 9;
    case GemmTile::T128x96:
      return 8;
    case GemmTile::Auto:
      break;
  }
  detail::fail_unresolved_tile_shape();
}
/// True for the swapped-operand tiles (128x32, 128x64, 128x96), which run
/// only with GemmOptions::swap_ab.
bool is_swap_tile(GemmTile t);
/// True for the cluster kernels that only the plain gemm() runs (whole K,
/// output type == input type): 128x128 with cluster_m x cluster_n 2x1, 1x2
/// or 2x2, 128x256 with 2x2, 128x192 with 1x2.
bool cluster_kernel_compiled(GemmTile t, int cluster_m, int cluster_n);

/// Where the plain gemm() takes its plan when the options name none (tile
/// Auto, ping_pong off, cluster_m 0, k_splits 0). Options that name a plan
/// run it whatever the source.
enum class GemmPlanSource {
  /// Tuned when TESSERA_GEMM_TUNED=1 (read once per process), else Model.
  Default,
  /// plan_gemm(): the rule measured on the benchmark shapes for large
  /// aligned problems, the cost model (model_gemm_us) elsewhere.
  Model,
  /// The measured plan of the problem's shape bucket from the source the
  /// tune layer installs (gemm_plan.hpp, tune::install_gemm_tuned_plans)
  /// where it holds one, else Model. A tessera::Error when no source is
  /// installed.
  Tuned,
};

struct GemmOptions {
  GemmTile tile = GemmTile::Auto;
  /// Cap on the CTAs (one per SM) the persistent grid uses; 0 = all SMs.
  /// Leaves the remaining SMs free for communication kernels.
  int max_ctas = 0;
  /// RasterScheduler settings used when no explicit scheduler is given.
  int raster_group = 8;
  bool raster_along_m = false;
  int rotate_m = 0;
  /// CTAs per thread-block cluster along M: 1, 2 (B tiles multicast to both
  /// CTAs), or 0 = resolve_cluster(). Clusters apply to the 128x256
  /// and 256x128 tiles with the RasterScheduler; rotate_m must then be even.
  /// The plain gemm() also runs 128x128 with cluster_m 2.
  int cluster_m = 0;
  /// CTAs per cluster along N (plain gemm() only): 2 shares each A tile
  /// between two CTAs (multicast), on 128x128 (cluster_m 1 or 2), 128x256
  /// (cluster_m 2) and 128x192 (cluster_m 1); 0 or 1 = none. Whole K,
  /// cooperative, output type == input type.
  int cluster_n = 0;
  /// Ping-pong schedule: the two consumer warpgroups take alternate tiles, so
  /// one stores its finished tile (epilogue) while the other runs its wgmma
  /// main loop. Tiles 128x128 (Auto) or 64x256; cluster_m must be 0 or 1.
  /// The plain gemm() compiles it for output type == input type only, and
  /// picks it by itself (64x256) where plain_uses_ping_pong() says so; the
  /// policy entry point (gemm_with) runs it only where its kernel set is a
  /// ping-pong one (PingPong, PingPongTiles).
  bool ping_pong = false;
  /// Split-K (plain gemm() only; the policy entry points never split):
  /// 0 = plan_gemm()'s choice, 1 = never split (nor stream-K: K is summed
  /// in one order, whole K per tile), > 1 = that many K splits on
  /// the 128x128 cooperative kernel (with ping_pong: 64x256 ping-pong,
  /// or 64x64 ping-pong when tile is T64x64).
  int k_splits = 0;
  /// Stream-K (plain gemm() only, output type == input type): every CTA
  /// runs an equal share of the last waves' K blocks; a tile split between
  /// CTAs is summed by its last CTA in the same kernel, through the
  /// stream's persistent workspace (kept per stream like cuBLAS's: graphs
  /// captured from one stream must not run concurrently with each other or
  /// with that stream). Runs tile 128x256 (Auto) or 128x128, cooperative,
  /// no cluster, whole K (k_splits 0 or 1). plan_gemm() also picks it by
  /// itself where the model finds it cheapest (docs/design/gemm.md,
  /// "Stream-K").
  bool stream_k = false;
  /// Swapped operands (plain gemm() only, B layout NK): the kernel computes
  /// D^T = B A^T on tile 128x32, 128x64 or 128x96 (Auto: the narrowest
  /// that holds M, at most 96) and stores it transposed into D. Whole K
  /// (output type == input type) or split over k_splits (any output type).
  /// For small M the weight rows fill the 128-row side and M only the
  /// narrow one (docs/design/gemm.md, "Small M: swapped operands").
  bool swap_ab = false;
  /// Where the plan comes from when the fields above name none (plain
  /// gemm() only; the policy entry points run the kernel they are given).
  GemmPlanSource plan_source = GemmPlanSource::Default;
  /// Programmatic dependent launch for the hook-free kernels: their launch
  /// and CTA set-up overlap the previous kernel's tail in the stream. The
  /// plain gemm() uses it where the model estimates under 10 us (longer
  /// problems measured slower with it; docs/design/gemm.md). false: the
  /// stream's full serialization. TESSERA_GEMM_PDL=0 turns it off everywhere.
  bool dependent_launch = true;
};

/// Throws tessera::Error naming `op` and the offending value unless `a` is a
/// problem the engine accepts (see the header comment for the limits).
void validate(const GemmArgs& a, const char* op = "gemm");

/// The tile shape the heuristic picks for this problem on a device with
/// `num_sms` multiprocessors (fewest wasted tile-slots over all waves,
/// larger tiles preferred on ties).
GemmTile choose_tile(const GemmArgs& a, int num_sms);

/// Resolves GemmTile::Auto for the current device; returns `o.tile` otherwise.
/// With o.ping_pong: Auto -> 128x128; 128x128 and 64x256 accepted,
/// any other tile is a tessera::Error. Without it, 64x256 is an Error.
GemmTile resolve_tile(const GemmArgs& a, const GemmOptions& o);

/// True when the plain gemm() runs the ping-pong 64x256 kernel although
/// o.ping_pong is off: tile Auto, cluster_m 0 or 1, output type ==
/// input type, and M·N·K below 4e11. Larger problems run the cooperative tile
/// choose_tile() picks. Why: ping-pong wins where power caps the clock,
/// cooperative on large shapes at boost clocks; this split keeps both clock
/// states close to cuBLASLt on the benchmark shapes, where either kernel
/// alone loses in one of them (docs/design/gemm-engine.md). Ask for an
/// explicit tile to get a particular kernel.
bool plain_uses_ping_pong(const GemmArgs& a, const GemmOptions& o);

/// Cluster size for tile `t`: o.cluster_m if set (checked: 1 or 2), else 1.
/// Always 1 with o.ping_pong (cluster_m = 2 is then an Error).
/// cluster_m = 2 is tested and measured at parity with 1 on H100 (within
/// noise, docs/design/gemm-engine.md), so auto keeps 1.
int resolve_cluster(const GemmArgs& a, const GemmOptions& o, GemmTile t);

/// What the plain gemm() runs for a problem: the kernel (tile, ping-pong or
/// cooperative), the cluster size and the number of K splits (> 1: each split
/// writes an f32 partial, a second kernel sums them into D), or stream-K
/// (GemmOptions::stream_k; k_splits 1, cluster 1).
struct GemmPlan {
  GemmTile tile = GemmTile::T128x256;
  bool ping_pong = false;
  int cluster_m = 1;
  int k_splits = 1;
  bool stream_k = false;
  bool swap_ab = false;  ///< D^T = B A^T on a swapped tile (GemmOptions::swap_ab)
  int cluster_n = 1;     ///< CTAs per cluster along N (GemmOptions::cluster_n)
};

/// The plan gemm() runs under options `o` on the current device when the
/// plan comes from the model (validates o's fields; o.plan_source is not
/// read: gemm() resolves it first, resolve_options in gemm_plan.hpp). With
/// every option at its default: large problems whose rows are 128-byte
/// aligned keep the rule measured on the 13 benchmark shapes
/// (plain_uses_ping_pong, choose_tile); every other problem takes the plan
/// (tile, schedule, cluster, K splits) that model_gemm_us() finds cheapest.
/// Explicit tile / overlap / cluster options run the kernel they name.
GemmPlan plan_gemm(const GemmArgs& a, const GemmOptions& o);

/// True when D's base and row stride are 16-byte multiples (the kernels'
/// vector stores); gemm() stages other outputs.
bool d_rows_aligned(const GemmArgs& a);

/// The largest power of two <= 128 that divides A's and B's base addresses
/// and row strides in bytes (TMA loads slow down below 128).
int row_alignment(const GemmArgs& a);

/// Estimated time (us) of plan p on num_sms SMs: waves of work units, each
/// the slower of wgmma and TMA per K block (TMA bytes per SM falling with
/// row_alignment) plus a fixed tile cost; a DRAM floor; a fixed cost per
/// launch; the split-K partials' traffic and reduce. The constants are fitted
/// to measured timings of every compiled kernel (docs/design/gemm.md).
double model_gemm_us(const GemmArgs& a, int num_sms, const GemmPlan& p);

/// "128x256/c1", "64x256/pp", "128x128/c1/k3", "128x128/c2x2" (clusters
/// along N: cluster_m x cluster_n), ...
std::string plan_name(const GemmPlan& p);

/// D = A · op(B) on `stream`: the plan plan_gemm(a, resolve_options(a, o))
/// (gemm_plan.hpp). Validates first (tessera::Error on bad input, before any
/// launch).
void gemm(const GemmArgs& a, const GemmOptions& o = {}, cudaStream_t stream = nullptr);

/// cuBLASLt reference for the same problem (used by tests and `tessera bench
/// gemm` as the baseline). Keeps one handle and a 32 MiB workspace per
/// device; the algorithm is cuBLASLt's first heuristic choice.
void cublaslt_gemm(const GemmArgs& a, cudaStream_t stream = nullptr);

}  // namespace tessera::kernels
