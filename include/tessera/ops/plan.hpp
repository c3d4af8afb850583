// tessera/ops/plan.hpp — how the overlapped operators schedule their
// communication and tiles (pure host logic, CPU-tested).
//
// AllGather+GEMM (push, TileLink §3.1: communication and computation choose
// their own tile sizes and orders):
//   step j = 1..R-1: rank r pushes its shard to rank (r - j) mod R, cut into
//   C channels of ceil(shard/C) rows, each followed by a flag store; so rank
//   r RECEIVES, at step j, the shard of rank (r + j) mod R. The GEMM walks
//   tile rows starting at its own shard and wrapping (RasterScheduler
//   rotate_m = first tile row of shard r): own rows first, then shards in
//   the order they arrive. Its prologue waits, per tile, for the flags of
//   every channel the tile's rows touch (remote channels only).
// GEMM+ReduceScatter (push):
//   rows owned by rank o are [o*ceil(M/R), ...). The GEMM walks tile rows
//   starting at shard (r + 1) mod R: remotely-owned tiles first, own last.
//   Each 8-wide row segment is stored into its owner's receive slab
//   recv[src = r] (rows local to the owner); a finished tile adds 1 to
//   counter[tile_m] on every owner its rows touch. Each owner reduces its rows
//   once counter[tile_m] reaches R·tiles_n, summing slabs in rank order 0..R-1
//   (fixed order: deterministic), then subtracts R·tiles_n (consumes).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "tessera/kernels/gemm.hpp"
#include "tessera/link/tile_map.hpp"
#include "tessera/ops/args.hpp"

namespace tessera::ops {

/// Signal slots used by the operators (control Signals object).
enum ControlSlot : int {
  kAgFree = 0,    ///< "my gathered-A workspace is free again" (value = AG epoch)
  kRsFree = 1,    ///< "my receive slabs are free again" (value = RS epoch)
  kRsData = 2,    ///< decomposition RS: "my partial for you has landed" (value = RS epoch)
  kRingData = 3,  ///< ring RS: running-sum chunks landed (value = RingRsPlan::flag_value, monotonic)
  kControlSlots = 4,
};

/// Most channels per shard (AG data flags are one Signals slot per channel).
inline constexpr int kMaxChannels = 32;

struct AgPlan {
  int rank = 0, world = 1;
  link::AllGatherTileMap map;  ///< producer = channel chunks, consumer = GEMM tile rows
  ShardRows shards;
  int channels = 1;
  int tile_m = 128;            ///< GEMM tile rows
  int rotate_m = 0;            ///< first tile row of this rank's shard
  std::vector<int> push_to;    ///< push_to[j-1] = destination at step j
  std::vector<int> recv_from;  ///< recv_from[j] = source whose shard the GEMM reads j-th (j=0: self)
};
/// channels in [1, kMaxChannels]; throws tessera::Error on bad parameters.
AgPlan plan_ag(std::int64_t m, int world, int rank, int channels, int tile_m);

/// The fused GEMM+RS tile (the engine's ping-pong 64x256) and its rows: the
/// owner-add strategies (fused_sm with RsReduce::epilogue, fused_ce) need
/// ceil(M/R) to be a multiple of them.
inline constexpr kernels::GemmTile kRsFusedTile = kernels::GemmTile::T64x256;
inline constexpr int kRsFusedTileRows = kernels::tile_shape(kRsFusedTile).bm;

struct RsPlan {
  int rank = 0, world = 1;
  ShardRows shards;
  int tile_m = 128, tile_n = 256;
  int tiles_m = 0, tiles_n = 0;
  int rotate_m = 0;          ///< first tile row of shard (rank + 1) mod R
  std::int64_t ld_recv = 0;  ///< row stride of a receive slab (N rounded up to 8)
  /// Tile rows whose rows this rank owns (the reduce kernel's work list).
  int own_tile_lo = 0, own_tile_hi = 0;
  /// Per-tile-row notifications an owner waits for per call.
  std::uint64_t expected_per_tile_row() const { return static_cast<std::uint64_t>(world) * tiles_n; }
  /// Every shard boundary falls on a tile-row boundary (no tile has two
  /// owners): required by the owner-add-in-epilogue GEMM+RS.
  bool shards_on_tile_rows() const { return world == 1 || shards.per_rank % tile_m == 0; }
  /// Raster band height (tile rows, <= 8) for the owner-epilogue GEMM: a
  /// divisor of the tile rows per shard and of tiles_m, so no band mixes
  /// remotely-owned and own tile rows and every remote tile precedes every
  /// own tile in the schedule. That is what makes the per-tile waits
  /// deadlock-free: a persistent CTA blocks only at an own tile, after
  /// which it has only own tiles left, so every rank finishes all tiles its
  /// peers wait for. Requires shards_on_tile_rows().
  int owner_raster_group() const;
  /// Owners whose rows tile row t touches: [first, last].
  int first_owner(int t) const;
  int last_owner(int t, std::int64_t m) const;
};
RsPlan plan_rs(std::int64_t m, std::int64_t n, int world, int rank, int tile_m, int tile_n);

/// fused_ce GEMM+RS: how many consecutive raster bands of one owner one
/// copy-engine copy carries (the receiver still sees one flag per band).
/// Each copy and its flag operations cost microseconds on the comm stream,
/// so one copy per band left the copies, not the GEMM, on the critical path
/// where bands are small (a band is one 64-row tile row when a shard's tile
/// rows are odd). The fewest bands whose bytes reach `target_bytes`, at
/// most `owner_bands` (the owner's bands), at least 1; `target_bytes` 0
/// gives one band per copy.
int rs_copy_chunk_bands(std::size_t band_bytes, int owner_bands, std::size_t target_bytes);
/// rs_copy_chunk_bands' default target (TESSERA_RS_COPY_CHUNK_KB sets another).
inline constexpr std::size_t kRsCopyChunkBytes = std::size_t{2} << 20;

// Ring GEMM+ReduceScatter (TileLink §5, Fig. 4), Strategy::ring:
//   at step j = 0..R-1 rank r computes the partial of shard (r + j + 1) mod R
//   (its own shard last). For j > 0 it adds, in f32, the running sum that
//   rank r+1 pushed at its step j-1 for the same shard (received x first,
//   own partial y second: out = x + y, rounded to the dtype), and for
//   j < R-1 pushes the result to rank r-1 (send_to), which continues it at
//   step j+1. The last step lands the full sum of shard r in D. Shard s is
//   therefore summed in the fixed order s-1, s-2, ..., s+1, s (mod R):
//   deterministic run to run (R-1 roundings to the dtype on the way).
//   Data: what is received at step j lands in this rank's receive slab j
//   (slabs 1..R-1, rows local to the shard, row stride ld_recv), cut into
//   `channels` row chunks; after each chunk the sender stores
//   flag_value(epoch, j, c) into its kRingData flag on the receiver. The
//   values grow strictly within and across calls (sender's stream order), so
//   one monotonic flag per sender suffices: waiting for >= v means every
//   chunk up to v has landed. Reuse: the sender writes into send_to's slabs
//   only after send_to announced kRsFree >= epoch-1 (done with the previous
//   call).
inline constexpr int kRingMaxWorld = 16;
inline constexpr std::uint64_t kRingEpochStride = static_cast<std::uint64_t>(kRingMaxWorld) * kMaxChannels;

struct RingRsStep {
  int shard = 0;          ///< shard whose partial this rank computes at this step
  bool receives = false;  ///< step > 0: add the running sum received from recv_from (slab `step`)
  bool sends = false;     ///< step < R-1: push the running sum to send_to's slab step+1
};

struct RingRsPlan {
  int rank = 0, world = 1, channels = 1;
  std::int64_t m = 0;
  ShardRows shards;
  std::int64_t ld_recv = 0;       ///< row stride of a receive slab (N rounded up to 8)
  int send_to = 0;                ///< rank r-1: who continues my running sums
  int recv_from = 0;              ///< rank r+1: whose running sums I continue
  std::vector<RingRsStep> steps;  ///< R entries; steps.back().shard == rank
  /// Rows [chunk_lo, chunk_lo + chunk_rows) of shard s (relative to the shard)
  /// form channel c: ceil(rows/channels) rows each, the last ones shorter,
  /// possibly empty (a short ragged shard); an empty chunk is still notified.
  std::int64_t chunk_rows_max(int s) const;
  std::int64_t chunk_lo(int s, int c) const;
  std::int64_t chunk_rows(int s, int c) const;
  /// The kRingData value that says chunk c of receive step j (1..R-1) of
  /// call `epoch` (>= 1) has landed: epoch·kRingEpochStride + (j-1)·kMaxChannels + c + 1.
  static std::uint64_t flag_value(std::uint64_t epoch, int step, int channel);
  /// Flag stores each rank receives per call: ·channels.
  int notifications_per_call() const { return (world - 1) * channels; }
};
/// world in [1, kRingMaxWorld], channels in [1, kMaxChannels]; throws tessera::Error.
RingRsPlan plan_ring_rs(std::int64_t m, std::int64_t n, int world, int rank, int channels);

// TP MoE layer, pipelined strategy (ops::moe_tp, docs/design/moe_tp.md).
//   Every rank holds T_l tokens (shard s = tokens [s·T_l, (s+1)·T_l)) and
//   all E experts' I/R slice. The routed entries (token, slot) are ordered
//   by (source shard, expert): shard s's T_l·k entries own the sorted rows
//   [s·T_l·k, (s+1)·T_l·k) of the expert buffers (row_base), expert-major
//   inside (kernels::moe::permute of that shard's routing alone). The
//   region's size is known on the host, its per-expert split only on the
//   device: no host sync.
//   Part 1 (all-gather + gate/up): step d = 1..R-1 sends the own shard to
//   r+d and receives shard r-d; gate/up runs in arrival order r, r-1, ...,
//   r-R+1. Part 2 (down + combine + reduce-scatter): shards in owner order
//   r+1, r+2, ..., r (own last); the partial of shard r+d is sent to its
//   owner at step d, and rank r-d's partial of shard r is received then.
//   Part 1's last shard is part 2's first (r+1), so its down GEMM follows its
//   gate/up directly.
struct MoeTpStep {
  int shard = 0;             ///< whose tokens (part 1) or whose output rows (part 2)
  int comm_step = 0;         ///< ring step d of its transfer (0: none, the own shard)
  bool beside_comm = false;  ///< a transfer may run beside this GEMM: leave comm_ctas SMs free
};

struct MoeTpPlan {
  int rank = 0, world = 1, topk = 1;
  std::int64_t tokens_local = 0;
  std::vector<MoeTpStep> gate_up;  ///< R entries: part 1's order (gate_up[0].shard == rank)
  std::vector<MoeTpStep> down;     ///< R entries: part 2's order (down.back().shard == rank)
  std::vector<int> send_to;        ///< send_to[d-1] = r+d: AG step d's and RS step d's destination
  std::vector<int> recv_from;      ///< recv_from[d-1] = r-d: AG step d's and RS step d's source
  /// First sorted row of shard s's entries; entries of the whole layer: R·T_l·k.
  std::int64_t row_base(int s) const { return static_cast<std::int64_t>(s) * tokens_local * topk; }
  std::int64_t rows_per_shard() const { return tokens_local * topk; }
  /// Receive slab (0..R-2) that holds rank recv_from[d-1]'s partial of the own shard: d-1.
  int rs_slab(int step) const { return step - 1; }
};
/// world in [1, 1024], rank in [0, world), tokens_local >= 0, topk >= 1;
/// throws tessera::Error.
MoeTpPlan plan_moe_tp(std::int64_t tokens_local, int topk, int world, int rank);

/// The order of the routed entries under the pipelined strategy, on the
/// host (the CPU reference of what the per-shard permutes produce): for the
/// routing of all R·T_l tokens (expert_ids [R·T_l, k], ids outside [0, E)
/// dropped), sorted_entry[p] = the global entry t·k + s at sorted row p, in
/// (source shard, expert, entry) order; rows past a shard's valid entries
/// (dropped ids) are -1. group_rows[s·E + e] = rows of expert e in shard s.
struct MoeShardOrder {
  std::vector<std::int32_t> sorted_entry;  ///< [R·T_l·k]
  std::vector<std::int32_t> entry_row;     ///< [R·T_l·k]: sorted row of each entry, -1 if dropped
  std::vector<std::int32_t> group_rows;    ///< [R·E]
};
MoeShardOrder moe_shard_expert_order(const std::vector<std::int32_t>& expert_ids, std::int64_t tokens_local, int world,
                                     int experts, int topk);

/// Column chunks of the pipelined TP MoE layer's part 2 for `hidden`
/// columns: `requested` if > 0 (it must divide hidden into multiples of 8
/// columns; throws tessera::Error otherwise). Else one chunk over the copy
/// engine, whose transfer hides behind the own shard's down GEMM (measured:
/// 2 or 4 chunks lost 2-7 % there); over NCCL's 16-CTA send/recv, the most
/// chunks in {4, 2, 1} that leave each at least 1024 columns and a multiple
/// of 64 (512-column chunks lost 2-5 % against one chunk on H = 2048,
/// 1024-column chunks gained 3-4 % on H = 4096).
int moe_rs_chunks(std::int64_t hidden, int requested, bool copy_engine);
/// rs_chunks' upper bound (the copy-engine transport keeps a flag per chunk).
inline constexpr int kMoeMaxRsChunks = 16;

/// Strategies moe_tp's tuner measures, read from its strategy registry:
/// sequential and pipelined (R > 1), sequential alone at R = 1.
std::vector<Strategy> moe_tp_candidates(int world);

/// How a call of a context with epoch flags starts (TpContext's and
/// SpAttnContext's begin_call): whether it restarts the epochs by zeroing the
/// flags between two stream barriers. The flags'
/// epochs are baked into what the host enqueues, and a replayed graph
/// repeats its own, so: never without flags (no load/store reach); at the
/// first call of each capture (`capture`: its id, nullopt when the stream is
/// not being captured), enqueued into the graph; on every eager call once
/// the context has been captured (a replay may have run since). `captured`
/// and `reset_capture` are the context's state, returned updated.
struct CallStart {
  bool reset = false;
  bool captured = false;
  unsigned long long reset_capture = 0;
};
CallStart flag_call_start(bool has_flags, std::optional<unsigned long long> capture, bool captured,
                          unsigned long long reset_capture);

}  // namespace tessera::ops
