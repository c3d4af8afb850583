// tessera/ops/fused_policies.cuh — the GEMM-engine policies of the fused TP
// operators (see tessera/kernels/gemm/{prologue,epilogue}.cuh for the
// concepts). Device code here is call-free (no printf): a call anywhere in
// the GEMM kernel serializes its wgmma.
//
// Each policy is its own device Params: `Arguments` (fused_arguments.hpp) is
// what the operator knows, and `to_params(problem, options, arguments)`
// makes the policy once on the host, CUTLASS-3 style; problem and options
// are the launch's GemmArgs and GemmOptions.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include <string>

#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/gemm/epilogue.cuh"
#include "tessera/kernels/gemm/host_detail.hpp"
#include "tessera/kernels/gemm/prologue.cuh"
#include "tessera/link/device_primitives.cuh"
#include "tessera/link/tile_map.hpp"
#include "tessera/ops/diag.hpp"
#include "tessera/ops/fused_arguments.hpp"
#include "tessera/runtime/symmetric_heap.hpp"
#include "tessera/runtime/wait_diagnostics.hpp"

namespace tessera::ops::detail {

/// Where a fused prologue's wait is, for its diagnostic: GEMM tile t,
/// flag `flag_id` (from rank `peer`, -1: any) of rank `rank`.
__device__ __forceinline__ link::WaitSite tile_flag_site(const kernels::engine::TileInfo& t, int rank, int flag_id,
                                                         int peer = -1) {
  return link::WaitSite{runtime::WaitKind::tile_flag, rank, -1, t.m, t.n, flag_id, peer};
}

/// The runtime's limit on a policy's flag waits: the timeout, and the
/// process's record a timed-out wait fills (wait_diagnostics.hpp).
struct WaitLimitParams {
  std::uint64_t timeout_ns = 0;
  runtime::WaitRecord* diag = nullptr;
};
inline WaitLimitParams runtime_wait_limit() {
  return {runtime::wait_timeout_ns(), runtime::process_wait_diagnostics().device_record()};
}

/// The fields the owner-adding GEMM+RS epilogues (RsOwnerEpilogue,
/// RsStageEpilogue) take from the shard geometry: this rank's output rows,
/// the slabs' rows and row stride, the rank and the world.
template <class Epi>
void set_owner_rows(Epi& p, const RsShardArguments& a) {
  p.d = static_cast<decltype(p.d)>(a.d);
  p.ldd = a.ldd;
  p.per_rank = a.per_rank;
  p.ld = a.ld_recv;
  p.rank = a.rank;
  p.world = a.world;
}

/// Whether a tile starting at global row row0 is rank's own (fused_ce: the
/// shards lie on tile rows, so its first row decides): a range compare, no
/// division on the tile boundary (a 64-bit division per tile here costs
/// ~1 point of the GEMM+RS kernel; docs/design/operators.md).
__device__ __forceinline__ bool own_tile(std::int64_t row0, int rank, std::int64_t per_rank) {
  const std::int64_t lo = static_cast<std::int64_t>(rank) * per_rank;
  return row0 >= lo && row0 < lo + per_rank;
}

/// The owner's sum of one 8-wide row segment (RsOwnerEpilogue,
/// RsStageEpilogue): peer s's partial is the 8 values at slab + s *
/// slab_stride; this rank's is its f32 accumulator. Summed in rank order
/// 0..R-1 (fixed: deterministic, one rounding at the store). Slab rows are
/// ld >= N rounded up to 8, so a full 16-byte load stays in bounds in the last
/// tile column. ld.global.cg: the slabs were written by another GPU or the
/// copy engine, never through this SM's L1. skip_peers (diagnostics only,
/// ops::kDiagSkipOwnerAdd) leaves the peers out.
///
/// Why the rank loop is not unrolled (`unroll 1`) and the epilogues end in
/// ONE store: the kernel inlines store8 at each of a thread's 16 call sites
/// per tile. Unrolled over R, with a store per path, a ping-pong RS kernel
/// grows to ~4.5x the plain kernel's instructions, and
/// a ping-pong consumer's epilogue runs beside the other consumer's main
/// loop on the same SM sub-partitions, so its code competes with the main
/// loop's for the instruction caches (docs/design/operators.md).
template <class OutT>
__device__ __forceinline__ void owner_sum8(const OutT* slab, std::int64_t slab_stride, int world, int rank,
                                           bool skip_peers, const float (&acc)[8], float (&v)[8],
                                           int preloaded_peer = -1, uint4 preloaded = {}) {
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = 0.f;
#pragma unroll 1
  for (int s = 0; s < world; ++s) {
    if (s == rank) {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] += acc[i];
    } else if (!skip_peers) {
      const uint4 u = s == preloaded_peer ? preloaded : __ldcg(reinterpret_cast<const uint4*>(slab + s * slab_stride));
      float x[8];
      kernels::engine::OutConv<OutT>::load8(reinterpret_cast<const OutT*>(&u), x);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] += x[i];
    }
  }
}

/// AG+GEMM prologue: before tile t's first A load, wait until every REMOTE
/// channel its rows [row0, min(row0 + bm, M)) touch has flag >= epoch.
/// Flags: flags[src * flag_stride + c] = the value rank src last stored for
/// its channel c (rank_notify or the SM pusher: release at .sys scope);
/// read with ld.acquire.sys. Own channels are not waited for: this rank's
/// shard is either copied into the workspace on the GEMM's stream before
/// launch, or (local_hi > local_lo) read in place from the caller's A through
/// `local_a`: a_source() points every tile inside [local_lo, local_hi) at it.
/// The host enables that only when the shard starts on a tile row and ends on
/// one or at M, so no tile straddles the caller's A and the workspace.
struct AgPrologue {
  static constexpr bool kActive = true;
  using Arguments = AgPrologueArguments;
  link::AllGatherTileMap map;
  const std::uint64_t* flags = nullptr;
  int flag_stride = 0;
  int rank = 0;
  std::uint64_t epoch = 0;
  std::uint64_t timeout_ns = 0;
  runtime::WaitRecord* diag = nullptr;
  std::int64_t local_lo = 0, local_hi = 0;  // own rows in gathered coordinates; empty: off
  CUtensorMap local_a;                      // the own shard [m_local, K] in the caller's A (same box and swizzle)

  /// The own shard's TMA map has the problem's box (BM rows of the tile
  /// options.tile) and swizzle; its rows must lie on tile rows (or end at M).
  static AgPrologue to_params(const kernels::GemmArgs& problem, const kernels::GemmOptions& options,
                              const Arguments& args) {
    AgPrologue p;
    p.map = args.map;
    p.flags = args.flags.flags;
    p.flag_stride = args.flags.flag_stride;
    p.rank = args.rank;
    p.epoch = args.flags.epoch;
    const WaitLimitParams lim = runtime_wait_limit();
    p.timeout_ns = lim.timeout_ns;
    p.diag = lim.diag;
    if (args.local && args.local_rows > 0) {
      const int bm = kernels::tile_shape(options.tile).bm;
      if (!rows_on_tiles(args.local_lo, args.local_rows, problem.m, bm))
        kernels::detail::fail("ag_gemm: the own shard read in place must start on a tile row and end on one or at M");
      kernels::GemmArgs l = problem;
      l.a = args.local;
      l.m = args.local_rows;
      l.lda = args.local_lda;
      kernels::detail::make_tma_a(l, bm, &p.local_a);
      p.local_lo = args.local_lo;
      p.local_hi = args.local_lo + args.local_rows;
    }
    return p;
  }

  __device__ __forceinline__ void a_source(const CUtensorMap*& m, int& row) const {
    if (row >= local_lo && row < local_hi) {
      m = &local_a;
      row = static_cast<int>(row - local_lo);
    }
  }

  /// The channels [c0, c1] acquired for the CTA's previous tile (a memo:
  /// consecutive tiles of a CTA mostly lie in the same channels).
  struct State {
    int c0 = 1, c1 = 0;  // empty
  };

  /// Stateful form (prologue.cuh): returns whether it acquired a flag, so the
  /// waiter fences (fence.proxy.async.global) only then. Tiles of the own
  /// shard acquire nothing (their rows are written before the kernel, in
  /// stream order). A tile whose channels all lie in the previous tile's
  /// acquired range acquires nothing either: that acquire and its fence
  /// preceded an earlier ready arrive, which the TMA thread acquired before
  /// this tile's loads (kernel.cuh, the waiter's memory-order argument).
  __device__ __forceinline__ bool wait(const kernels::engine::TileInfo& t, State& s) const {
    const std::int64_t lo = t.row0;
    const std::int64_t hi = t.row0 + t.bm < t.M ? t.row0 + t.bm : t.M;
    if (hi <= lo) return false;
    const int c0 = map.channel_of_row(lo), c1 = map.channel_of_row(hi - 1);
    if (c0 >= s.c0 && c1 <= s.c1) return false;
    bool acquired = false;
    for (int ch = c0; ch <= c1; ++ch) {
      const int src = ch / map.C;
      if (src == rank) continue;
      link::flag_wait<link::Scope::sys>(flags + static_cast<std::int64_t>(src) * flag_stride + (ch - src * map.C),
                                        epoch, link::WaitLimit{timeout_ns, diag}, tile_flag_site(t, rank, ch, src));
      acquired = true;
    }
    s.c0 = c0;
    s.c1 = c1;
    return acquired;
  }
};

/// GEMM+RS epilogue: every 8-wide row segment of the partial goes to the
/// receive slab of the row's owner o, block [rank] (rows local to o); a
/// finished tile adds 1 (red.release.sys, after the kernel's notifier
/// fence.acq_rel.sys over the tile's stores) to counters[o][tile_m] on every
/// owner its rows touch.
template <class OutT>
struct RsEpilogue {
  static constexpr bool kNotify = true;
  static constexpr bool kSysScope = true;
  using Arguments = RsShardArguments;
  OutT* recv[runtime::kMaxPeers];
  std::uint64_t* counters[runtime::kMaxPeers];
  std::int64_t per_rank = 0, ld = 0;
  int rank = 0;

  static RsEpilogue to_params(const kernels::GemmArgs&, const kernels::GemmOptions&, const Arguments& args) {
    RsEpilogue p;
    for (int r = 0; r < runtime::kMaxPeers; ++r) {
      p.recv[r] = static_cast<OutT*>(args.recv[r]);
      p.counters[r] = args.counters[r];
    }
    p.per_rank = args.per_rank;
    p.ld = args.ld_recv;
    p.rank = args.rank;
    return p;
  }

  __device__ __forceinline__ void store8(const kernels::engine::TileInfo&, int row, int col, const float (&acc)[8],
                                         int valid) const {
    const int o = static_cast<int>(row / per_rank);
    kernels::engine::store_first8(
        recv[o] + (static_cast<std::int64_t>(rank) * per_rank + (row - o * per_rank)) * ld + col, acc, valid);
  }

  __device__ __forceinline__ void tile_done(const kernels::engine::TileInfo& t) const {
    const int last_row = (t.row0 + t.bm < t.M ? t.row0 + t.bm : t.M) - 1;
    const int o0 = static_cast<int>(t.row0 / per_rank), o1 = static_cast<int>(last_row / per_rank);
    for (int o = o0; o <= o1; ++o) link::counter_notify<link::Scope::sys>(counters[o] + t.m);
  }
};

/// GEMM+RS with the owner's add in the epilogue (OpOptions::rs_reduce =
/// epilogue). Needs every shard boundary on a tile-row boundary, so a tile's
/// rows have exactly one owner o:
///  * o != rank: each 8-wide row segment goes to o's receive slab, block
///    [rank] (as RsEpilogue); tile_done adds 1 (red.release.sys, after the
///    notifier's fence.acq_rel.sys) to counters[o][tile] (per-TILE counters).
///  * o == rank: the producer (RsOwnerPrologue) has waited until
///    counters[rank][tile] >= R-1 (every peer stored its partial of this
///    tile); the consumers then sum, in rank order 0..R-1 (fixed:
///    deterministic), the peers' slab values and their own f32 accumulator,
///    and store the result into D (this rank's output rows). tile_done then
///    consumes the R-1 notifications (relaxed: the next call's peers store
///    only after this rank's kRsFree, which follows this kernel in stream
///    order).
/// Visibility of the peers' slab data to the consumer threads: peer stores →
/// peer fence.sys + red.release.sys → producer ld.acquire.sys (the wait) →
/// producer's mbarrier arrive (release.cta) for the tile's first k-block →
/// consumer's mbarrier wait (acquire.cta) → consumer loads (causality order is
/// transitive). The loads use ld.global.cg (L2), never a stale L1 line.
template <class OutT>
struct RsOwnerEpilogue {
  static constexpr bool kNotify = true;
  static constexpr bool kSysScope = true;
  using Arguments = RsShardArguments;
  OutT* recv[runtime::kMaxPeers];
  std::uint64_t* counters[runtime::kMaxPeers];  ///< each owner's per-tile counters
  OutT* d = nullptr;                            ///< this rank's output rows [m_local, N]
  std::int64_t ldd = 0;
  std::int64_t per_rank = 0, ld = 0;
  int rank = 0, world = 1;

  static RsOwnerEpilogue to_params(const kernels::GemmArgs&, const kernels::GemmOptions&, const Arguments& args) {
    RsOwnerEpilogue p;
    for (int r = 0; r < runtime::kMaxPeers; ++r) {
      p.recv[r] = static_cast<OutT*>(args.recv[r]);
      p.counters[r] = args.counters[r];
    }
    set_owner_rows(p, args);
    return p;
  }

  __device__ __forceinline__ void store8(const kernels::engine::TileInfo&, int row, int col, const float (&acc)[8],
                                         int valid) const {
    const int o = static_cast<int>(row / per_rank);
    const std::int64_t lr = row - static_cast<std::int64_t>(o) * per_rank;  // row local to its owner
    OutT* dst;
    float v[8];
    if (o != rank) {
      dst = recv[o] + (static_cast<std::int64_t>(rank) * per_rank + lr) * ld + col;
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = acc[i];
    } else {
      dst = d + lr * ldd + col;
      owner_sum8(recv[rank] + lr * ld + col, per_rank * ld, world, rank, false, acc, v);
    }
    kernels::engine::store_first8(dst, v, valid);  // one store site (owner_sum8 says why)
  }

  __device__ __forceinline__ void tile_done(const kernels::engine::TileInfo& t) const {
    const int o = static_cast<int>(t.row0 / per_rank);
    if (o != rank)
      link::counter_notify<link::Scope::sys>(counters[o] + t.linear());
    else if (world > 1)
      atomicAdd(reinterpret_cast<unsigned long long*>(counters[rank] + t.linear()),
                0ull - static_cast<unsigned long long>(world - 1));
  }
};

/// The producer side of RsOwnerEpilogue: before an own tile's first load,
/// wait until counters[tile] >= R-1 (ld.acquire.sys; timeout → diagnostic +
/// trap). Remote-owned tiles do not wait.
struct RsOwnerPrologue {
  static constexpr bool kActive = true;
  using Arguments = RsShardArguments;
  const std::uint64_t* counters = nullptr;  ///< this rank's per-tile counters
  std::int64_t per_rank = 0;
  int rank = 0;
  std::uint64_t expected = 0;  ///< R - 1
  std::uint64_t timeout_ns = 0;
  runtime::WaitRecord* diag = nullptr;

  static RsOwnerPrologue to_params(const kernels::GemmArgs&, const kernels::GemmOptions&, const Arguments& args) {
    RsOwnerPrologue p;
    p.counters = args.counters[args.rank];
    p.per_rank = args.per_rank;
    p.rank = args.rank;
    p.expected = static_cast<std::uint64_t>(args.world - 1);
    const WaitLimitParams lim = runtime_wait_limit();
    p.timeout_ns = lim.timeout_ns;
    p.diag = lim.diag;
    return p;
  }

  __device__ __forceinline__ void wait(const kernels::engine::TileInfo& t) const {
    if (static_cast<int>(t.row0 / per_rank) != rank || expected == 0) return;
    link::flag_wait<link::Scope::sys>(counters + t.linear(), expected, link::WaitLimit{timeout_ns, diag},
                                      tile_flag_site(t, rank, t.linear()));
  }
};

/// fused_ce's bands are the raster bands (options.raster_group tile rows,
/// RsPlan::owner_raster_group()): a power of two, so the kernel finds a
/// tile's band with a shift; returns that shift.
inline int band_shift_of(const kernels::GemmOptions& options) {
  const int band_rows = options.raster_group;
  if (band_rows < 1 || (band_rows & (band_rows - 1)) != 0)
    kernels::detail::fail("gemm_rs fused_ce: raster band of " + std::to_string(band_rows) +
                          " tile rows is not a power of two");
  int shift = 0;
  while ((1 << shift) < band_rows) ++shift;
  return shift;
}

/// GEMM+RS on the copy engine (Strategy::fused_ce). Shards on tile rows
/// (as RsOwnerEpilogue); tile rows grouped in bands of 2^band_shift tile rows
/// (RsPlan::owner_raster_group: the raster band, so a band is one owner's
/// and completes as a unit of the schedule):
///  * o != rank: each 8-wide row segment goes to this rank's LOCAL staging
///    slab [o] (plain HBM stores: no NVLink traffic from the SMs);
///    tile_done adds 1 to band_count[band] (this rank's own flag row of the
///    band Signals: red.relaxed after the notifier's fence.acq_rel over the
///    tile's stores = a release, which this GPU's stream wait
///    (cuStreamWaitValue64 >= band tiles) observes before this GPU's copy
///    engine reads the band: the host then copies the band into o's
///    receive slab [rank] and rank_notify's epoch into o's band flag).
///    Scope .gpu: every observer is an agent of this GPU (its stream front
///    end, then its copy engine), which reads this GPU's memory through its
///    L2, the point of coherence a .gpu release orders the stores at. The
///    signal layer's group counters (FlashOverlap's epilogue) rely on the
///    same contract with the same stream wait. A .sys release measures the
///    same (bench/RESULTS-archive.md, "the fused_ce cost split").
///  * o == rank: the producer (RsBandPrologue) has waited until every peer's
///    band flag >= epoch (the peer's copy of this band landed); the
///    consumers add the peers' slab values and their own f32 accumulator in
///    rank order 0..R-1 (deterministic, one rounding) and store into D.
///    Visibility as in RsOwnerEpilogue: copy engine writes → peer stream's
///    system fence + flag write → producer ld.acquire.sys → mbarrier
///    (release/acquire.cta) → consumers' ld.global.cg. With count_own
///    (GEMM+AR), tile_done counts the own tile on its band as for o != rank,
///    and the host copies each complete band of D to every peer.
/// Deadlock freedom: as RsOwnerEpilogue (remote bands precede own bands in
/// every rank's schedule); the copies need no SM.
template <class OutT>
struct RsStageEpilogue {
  static constexpr bool kNotify = true;
  static constexpr bool kSysScope = false;
  using Arguments = RsStageArguments;
  OutT* stage = nullptr;                ///< local [world][per_rank][ld] staging slabs
  const OutT* recv = nullptr;           ///< this rank's receive slabs [world][per_rank][ld]
  std::uint64_t* band_count = nullptr;  ///< this rank's own band counters (by band)
  OutT* d = nullptr;                    ///< this rank's output rows [m_local, N]
  std::int64_t ldd = 0;
  std::int64_t per_rank = 0, ld = 0;
  int rank = 0, world = 1;
  int band_shift = 0;      ///< a band is 2^band_shift tile rows (RsPlan::owner_raster_group: 1, 2, 4 or 8)
  unsigned diag_skip = 0;  ///< ops::DiagSkip bits (kernel-only diagnostics; 0 otherwise)
  /// GEMM+AR (gemm_ar fused_ce): own tiles are counted on their band too
  /// (same release as the remote ones), so the copy stream can send each
  /// finished band of reduced rows to the peers.
  bool count_own = false;

  static RsStageEpilogue to_params(const kernels::GemmArgs&, const kernels::GemmOptions& options,
                                   const Arguments& args) {
    RsStageEpilogue p;
    p.stage = static_cast<OutT*>(args.stage);
    p.recv = static_cast<const OutT*>(args.shards.recv[args.shards.rank]);
    p.band_count = args.band_count;
    set_owner_rows(p, args.shards);
    p.band_shift = band_shift_of(options);
    p.diag_skip = args.diag_skip;
    p.count_own = args.count_own;
    return p;
  }

  /// One tile's epilogue (kernels/gemm/epilogue.cuh: per-tile binding). Shards
  /// lie on tile rows (fused_ce's precondition), so the tile's first row
  /// tells whether all its rows are this rank's (own_tile). bind() returns an
  /// EitherBound, so the ping-pong kernel runs one
  /// store loop per kind of tile, neither carrying the other's branch:
  ///  * RemoteBound: the plain store into the staging slab (the plain
  ///    kernel's loop, with the slab's row stride);
  ///  * OwnBound: the owner's sum, with load-ahead: the kernel loads the
  ///    lowest peer's slab values of kLoadAhead column blocks before their
  ///    stores, so a thread waits for 4 batches of loads instead of 16 loads
  ///    in sequence. Other peers (R > 2) are loaded in the sum (owner_sum8:
  ///    rank order).
  struct RemoteBound {
    OutT* stage;  // staging slabs; a global row r lands in row r (slab o = r / per_rank)
    std::int64_t ld;
    __device__ __forceinline__ void store8(int row, int col, const float (&acc)[8], int valid) const {
      kernels::engine::store_first8(stage + row * ld + col, acc, valid);
    }
  };
  struct OwnBound {
    static constexpr int kLoadAhead = 4;
    using Loaded = uint4;
    OutT* d;               // this rank's output rows
    std::int64_t ldd;      // its row stride
    std::int64_t row_off;  // global row of d's row 0: rank * per_rank
    const OutT* slab;      // this rank's receive slabs, block [0]
    std::int64_t ld, slab_stride;
    int world, rank, first_peer;
    bool skip_peers;

    __device__ __forceinline__ Loaded load(int row, int col) const {
      if (skip_peers) return Loaded{};
      return __ldcg(reinterpret_cast<const uint4*>(slab + (row - row_off) * ld + col + first_peer * slab_stride));
    }
    __device__ __forceinline__ void store8(int row, int col, const float (&acc)[8], int valid, const Loaded& l) const {
      float v[8];
      owner_sum8(slab + (row - row_off) * ld + col, slab_stride, world, rank, skip_peers, acc, v, first_peer, l);
      kernels::engine::store_first8(d + (row - row_off) * ldd + col, v, valid);
    }
    __device__ __forceinline__ void store8(int row, int col, const float (&acc)[8], int valid) const {
      store8(row, col, acc, valid, load(row, col));
    }
  };
  using Bound = kernels::engine::EitherBound<RemoteBound, OwnBound>;
  __device__ __forceinline__ Bound bind(const kernels::engine::TileInfo& t) const {
    const std::int64_t own_row0 = static_cast<std::int64_t>(rank) * per_rank;
    return Bound{RemoteBound{stage, ld},
                 OwnBound{d, ldd, own_row0, recv, ld, per_rank * ld, world, rank, rank == 0 ? 1 : 0,
                          (diag_skip & kDiagSkipOwnerAdd) != 0},
                 own_tile(t.row0, rank, per_rank)};
  }

  __device__ __forceinline__ void tile_done(const kernels::engine::TileInfo& t) const {
    if ((count_own || !own_tile(t.row0, rank, per_rank)) && !(diag_skip & kDiagSkipNotify))
      link::counter_notify_fenced<link::Scope::gpu>(band_count + (t.m >> band_shift));
  }
};

/// The producer side of RsStageEpilogue: before an own tile's first load,
/// wait until flags[src * flag_stride + band] >= epoch for every peer src
/// (ld.acquire.sys; timeout → diagnostic + trap). Remote tiles do not wait.
/// Stateful form of the Prologue concept (prologue.cuh): it returns whether
/// it acquired anything, so the waiter's fence.proxy.async.global runs only
/// for own tiles. A remote tile's inputs (A and B) were written before this
/// kernel in stream order, which orders them for the async proxy too; only
/// data published by a flag during the kernel needs the acquire and the
/// proxy fence.
struct RsBandPrologue {
  static constexpr bool kActive = true;
  using State = kernels::engine::detail::NoPrologueState;
  using Arguments = RsStageArguments;
  const std::uint64_t* flags = nullptr;  ///< this rank's per-source band flag rows
  int flag_stride = 0;
  std::int64_t per_rank = 0;
  int rank = 0, world = 1;
  int band_shift = 0;      ///< as RsStageEpilogue::band_shift
  unsigned diag_skip = 0;  ///< ops::DiagSkip bits (kernel-only diagnostics; 0 otherwise)
  std::uint64_t epoch = 0;
  std::uint64_t timeout_ns = 0;
  runtime::WaitRecord* diag = nullptr;

  static RsBandPrologue to_params(const kernels::GemmArgs&, const kernels::GemmOptions& options,
                                  const Arguments& args) {
    RsBandPrologue p;
    p.flags = args.band_flags.flags;
    p.flag_stride = args.band_flags.flag_stride;
    p.per_rank = args.shards.per_rank;
    p.rank = args.shards.rank;
    p.world = args.shards.world;
    p.band_shift = band_shift_of(options);
    p.diag_skip = args.diag_skip;
    p.epoch = args.band_flags.epoch;
    const WaitLimitParams lim = runtime_wait_limit();
    p.timeout_ns = lim.timeout_ns;
    p.diag = lim.diag;
    return p;
  }

  __device__ __forceinline__ bool wait(const kernels::engine::TileInfo& t, State&) const {
    // !own_tile(t.row0, rank, per_rank), written out: through the helper
    // ptxas allocates this waiter compare differently; this form is the one
    // verified on the GPU.
    const std::int64_t lo = static_cast<std::int64_t>(rank) * per_rank;
    if (t.row0 < lo || t.row0 >= lo + per_rank) return false;
    if (diag_skip & kDiagSkipBandWait) return false;  // the replayed epoch's flags are set
    const int band = t.m >> band_shift;
    for (int src = 0; src < world; ++src) {
      if (src == rank) continue;
      link::flag_wait<link::Scope::sys>(flags + static_cast<std::int64_t>(src) * flag_stride + band, epoch,
                                        link::WaitLimit{timeout_ns, diag},
                                        tile_flag_site(t, rank, src * flag_stride + band, src));
    }
    return true;
  }
};

}  // namespace tessera::ops::detail
