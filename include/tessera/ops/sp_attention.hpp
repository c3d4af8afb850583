// tessera/ops/sp_attention.hpp — sequence-parallel attention: the zig-zag
// sharding and the KV all-gather schedule (pure host logic, CPU-tested).
//
// The global sequence of S tokens is cut into 2R chunks of C = S / (2R)
// tokens. Rank r holds chunks r and 2R-1-r of Q, K and V (its shard: local
// rows [0, C) = chunk r, [C, 2C) = chunk 2R-1-r), so under a causal mask
// every rank has the same number of admitted (query, key) pairs
// (C²·(2R-1) + C·(C+1)): the load balance of zig-zag ring / context-parallel
// attention.
//
// K and V are all-gathered into each rank's workspace [B, S, Hkv, D], in
// GLOBAL order (sequential, and fused_ce when causal) or in the shard
// layout (fused_ce, non-causal; below). Rank r pushes its two chunks to
// rank (r - j) mod R for j = 1..R-1 (so its j-th source is rank (r + j) mod
// R), head group by head group across the peers, each group's rows of both
// chunks followed by one flag (the owner's slot `group`, value = epoch).
// The attention kernel's producer waits per KV block for the flags of the
// chunks the block covers (attention/kv_wait.cuh), its own chunks visited
// first.
//
// Causal: chunk c of the local Q has q_offset = c·C (its first global
// position) and needs the gathered-KV prefix of (c+1)·C keys; both chunks run
// in one launch when C is a multiple of 128 (AttentionArgs::q_split), else
// one launch each. Non-causal: one call, all 2C rows against all S keys.
//
// The operator (sp_attention below), per call with epoch e:
//   sequential: NCCL all-gather of the K and V shards into staging, reordered
//     into global order by copies, then the plain kernel (causal: one
//     launch or one per chunk, as above).
//   fused_ce: on the communication stream the chunks are pushed to every
//     peer's workspace on the copy engine (after that peer said its
//     workspace is free: control flag >= e - 1), each head group followed by
//     a flag (link::rank_notify, value e); the kernel waits per KV block for
//     the pieces it covers, in one of two ways:
//     - the TABLE WAIT (ops/sp_kv_table_wait.cuh), where chunks are at
//       least a KV block: the own data copied in, blocks in the kernel's
//       default descending order, a slim wait per block whose timeout the
//       host owns. Non-causal, where the key order does not matter, in the
//       SHARD LAYOUT (sp_shard_slot): each rank's shard whole, own shard
//       last, so the descending order visits it first and the peers'
//       shards as they land. Causal in global order at R = 2, where
//       descending (the own diagonal chunk first) is the arrival order;
//     - the CHUNK WALK otherwise: global order, the own chunks read in
//       place, blocks visited in arrival order (kv_arrival_order), the
//       waits KvFlagWait-style (.sys acquire with the engine's timeout
//       diagnostic).
// At the end of every call, either strategy, once its kernels and its pushes
// are done, a rank sets its control flag on every peer to e. A fused push
// into a peer waits for that peer's flag >= e - 1 (it no longer reads its
// workspace); the sequential reorder waits for every peer's flag >= e - 1
// before it overwrites its own workspace (no push of a causal call, which
// may skip chunks it does not read, is still landing there).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/ops/tuner.hpp"
#include "tessera/runtime/dtype.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::ops {

struct SpAttnPlan {
  int rank = 0, world = 1;
  std::int64_t seq = 0;    ///< global tokens S
  std::int64_t chunk = 0;  ///< C = S / (2R)
  bool causal = false;
  int chunks[2] = {0, 0};  ///< this rank's global chunks: local rows [0, C), [C, 2C)

  /// One attention call over local Q rows [local_row0, local_row0 + rows)
  /// against the first kv_len keys of the gathered KV (global order).
  struct Part {
    std::int64_t local_row0 = 0, rows = 0;
    std::int64_t q_offset = 0;  ///< causal: the rows' first global position
    std::int64_t kv_len = 0;
  };
  std::vector<Part> parts;

  std::vector<int> push_to;    ///< push_to[j-1]: destination at step j
  std::vector<int> recv_from;  ///< recv_from[j]: whose chunks arrive at step j (j = 0: own)

  /// Owner rank of global chunk c, and which of its two chunks it is
  /// (0: chunk r, 1: chunk 2R-1-r): c < R ? (c, 0) : (2R-1-c, 1).
  static int owner(int c, int world) { return c < world ? c : 2 * world - 1 - c; }
  static int slot(int c, int world) { return c < world ? 0 : 1; }
  /// Global row of local shard row i.
  std::int64_t global_row(std::int64_t i) const { return chunks[i / chunk] * chunk + i % chunk; }
  /// The step at which chunk c is on this rank (0: own).
  int arrival_step(int c) const { return (owner(c, world) - rank + world) % world; }
  /// Admitted (query, key) pairs of this rank's parts.
  std::int64_t pairs() const;
};

/// Throws tessera::Error unless world >= 1, 0 <= rank < world, seq >= 2·world
/// and seq % (2·world) == 0.
SpAttnPlan plan_sp_attention(std::int64_t seq, int world, int rank, bool causal);

/// The order in which the fused kernel's CTAs visit the KV blocks of a part
/// with kv_len keys in blocks of block_rows, as the table its KV hook reads:
/// for every n in [1, ceil(kv_len / block_rows)] (a CTA's causal prefix of n
/// blocks) entries [n(n-1)/2, n(n+1)/2) are a permutation of [0, n). Blocks
/// come in the order their data lands: by the arrival step of the latest
/// chunk they cover (own chunks first, then rank r+1's, r+2's, ..., a rank's
/// first chunk before its second), descending within one step. The default
/// descending order can make a CTA wait for a chunk that lands late while
/// chunks that have landed wait behind it. The fused strategy's default;
/// TESSERA_SP_ARRIVAL_ORDER=0 restores the descending order.
std::vector<std::int32_t> kv_arrival_order(const SpAttnPlan& plan, std::int64_t kv_len, int block_rows);

/// The global row ranges [first, second) of an own chunk (global rows
/// [start, start + chunk)) that the fused kernel reads from the gathered KV
/// although the rank owns them, when it reads its own chunks in place: the
/// rows of KV blocks (block_rows rows, aligned to multiples of it) that also
/// cover another chunk. At most the chunk's head and tail; the whole chunk
/// when no block lies inside it. The other rows are exactly those of blocks
/// inside the chunk, which the kernel loads from the caller's K and V.
std::vector<std::pair<std::int64_t, std::int64_t>> sp_own_edge_rows(std::int64_t start, std::int64_t chunk,
                                                                    std::int64_t block_rows);

/// Non-causal fused_ce's shard layout: the slot (in shards of 2C rows) that
/// `owner`'s shard takes in rank `dst`'s workspace [B, S, Hkv, D]:
/// R - 1 - ((owner - dst) mod R). The own shard is last, so the kernel's
/// default descending block order visits it first, then the peers' shards in
/// the order they arrive (dst + 1's first). With no block order and no
/// in-place reads, the kernel's waiter is the slim one of
/// ops/sp_kv_table_wait.cuh. Throws unless 0 <= dst, owner < world.
int sp_shard_slot(int world, int dst, int owner);

/// Where fused_ce gathers K and V: in global order (causal), or in the
/// shard layout (non-causal; sp_shard_slot).
enum class SpKvLayout { global, shard };

/// Whether the table wait (ops/sp_kv_table_wait.cuh) serves `plan` in
/// `layout`, read in KV blocks of block_rows: R > 1, shard layout only for
/// a non-causal plan, and the units a block can straddle (chunks of C rows
/// in global order, shards of 2C) at least a block long, so a block covers
/// at most two of them (the table has room for two flags).
bool sp_kv_table_fits(const SpAttnPlan& plan, SpKvLayout layout, int block_rows);

/// The table wait's table (SpKvTableWait::flags_of_block) for `plan`'s rank
/// in `layout`: for KV head h and block b (block_rows rows of the S keys),
/// entries [2 (h n_blocks + b)] and [.. + 1] name the flags to acquire as
/// index + 1 into the rank's per-source flag rows (owner * slots + the head
/// group's slot), 0 for none: one per peer chunk (or shard) the block
/// covers, none for its own. heads_kv / head_groups KV heads share a group.
/// Throws unless sp_kv_table_fits.
std::vector<std::int32_t> sp_kv_flag_table(const SpAttnPlan& plan, SpKvLayout layout, int block_rows,
                                           std::int64_t heads_kv, int head_groups, int slots);

/// Most head groups sp_attention_head_groups() returns (flags per source).
inline constexpr int kSpMaxHeadGroups = 8;

/// The head groups fused_ce splits each pushed KV chunk into, one flag per
/// (source, group): the kernel's CTAs run head-major, so a CTA needs only its
/// own KV head's rows and the first wave only the first heads'. With one
/// flag per chunk, every CTA of the first wave waits for the whole remote
/// chunk (all heads) while it could have worked on the heads that landed.
/// The largest of 8, 4, 2 that divides heads_kv and leaves pieces of at least
/// 1 KiB per row (measured: 1 KiB pieces gain, 512-byte pieces lose to one
/// flag per chunk: the copy engine's narrow 2D rows cost more than the
/// stall they save); else 1.
int sp_attention_head_groups(std::int64_t heads_kv, std::int64_t head_dim, std::size_t elem_bytes);

/// One rank's shard: Q, K, V, O packed [batch, 2C, heads, head_dim] (local
/// rows [0, C) = global chunk r, [C, 2C) = chunk 2R-1-r), LSE packed
/// [batch, heads_q, 2C] float32 or null. Same shapes on every rank (checked).
struct SpAttnArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  std::int64_t batch = 1, seq = 0;  ///< seq: GLOBAL tokens S (the shard has S / R)
  std::int64_t heads_q = 0, heads_kv = 0, head_dim = 0;
  DType dtype = DType::bf16;
  bool causal = true;
  float softmax_scale = 0.f;  ///< 0: 1 / sqrt(head_dim)
  bool operator==(const SpAttnArgs&) const = default;
};

/// How sp_attention runs; the codes are ops::Strategy's (and the C API's).
///  sequential — NCCL all-gather of the K/V shards, then the plain kernel
///  fused_ce   — copy-engine pushes, the kernel waiting per KV block
///  ring       — ring attention (ring_attention.hpp, overlapped): KV shards
///               passed rank to rank, partial results merged by LSE; a
///               workspace of two shards instead of the whole sequence
///  ulysses    — Ulysses (ulysses_attention.hpp, sequential): all-to-all
///               from sequence to head shards and back; heads_q and
///               heads_kv must be multiples of R
///  two_level  — Ulysses inside groups of u ranks, ring across the R / u
///               groups (two_level_attention.hpp); u from
///               SpAttnOptions::two_level_inner; heads_q and heads_kv must be
///               multiples of u
///  automatic  — the ops tuner's choice for the shape (tuner.hpp): every
///               candidate (sp_attention_candidates) measured on first use
///               (max over ranks, so every rank agrees), cached under
///               "ops.sp_attention", never one slower than sequential;
///               sequential alone at R = 1; without tune_on_miss, a
///               neighbour's choice (SpAttnOptions)
enum class SpStrategy : int { automatic = 0, sequential = 1, fused_ce = 3, ring = 5, ulysses = 6, two_level = 8 };

std::string_view sp_strategy_name(SpStrategy s);

struct SpAttnOptions {
  SpStrategy strategy = SpStrategy::automatic;
  bool use_cache = true;  ///< automatic: read/write the on-disk choice cache
  /// automatic, for a shape never measured: true measures both strategies
  /// now (collective); false takes the nearest measured shape's choice (seq,
  /// batch and heads within a factor 2; head_dim and causal equal), or
  /// sequential (OpOptions::tune_on_miss).
  bool tune_on_miss = true;
  /// Workspace bytes per rank the call may use beyond its shards (0: no
  /// limit). automatic considers only the strategies within it (the first
  /// that fits, in sp_attention_candidates' order, is its baseline); an
  /// explicit strategy over it, or a shape no strategy fits, throws before
  /// any launch. Workspaces already grown by earlier calls are not freed.
  std::size_t workspace_limit_bytes = 0;
  /// two_level: the Ulysses degree u (ranks per group; the ring runs over
  /// R / u groups), a divisor of R that divides heads_q and heads_kv. 0: the
  /// smallest such u with 1 < u < R, else 1 (two_level_inner_degree). Under
  /// automatic it is the two_level candidate's degree (a candidate only when
  /// 1 < u < R: otherwise it is the ring or Ulysses).
  int two_level_inner = 0;
};

/// Workspace bytes per rank that strategy `s` (not automatic) needs for `a`
/// at world size `world`, beyond the input and output shards: the gathered
/// K and V (sequential: plus NCCL's staging), ring's two shard slots and
/// accumulators, Ulysses' head shard and staging, two_level's head shard,
/// staging and ring workspace (Ulysses degree `two_level_inner`, 0: chosen).
std::size_t sp_attention_workspace_bytes(const SpAttnArgs& a, int world, SpStrategy s, int two_level_inner = 0);

/// Per process group: the gathered-KV workspace (symmetric), flags, epochs.
class SpAttnContext {
 public:
  explicit SpAttnContext(runtime::ProcessGroup& pg);
  ~SpAttnContext();
  SpAttnContext(const SpAttnContext&) = delete;
  SpAttnContext& operator=(const SpAttnContext&) = delete;
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

/// Sequence-parallel attention over the zig-zag shards. Collective, stream-
/// ordered on pg.stream(). Bad input (shapes, GQA divisibility, a strategy
/// out of range, shapes or strategies that differ between ranks) throws
/// tessera::Error before any launch.
void sp_attention(SpAttnContext& ctx, const SpAttnArgs& a, const SpAttnOptions& o);
void sp_attention(SpAttnContext& ctx, const SpAttnArgs& a, SpStrategy s = SpStrategy::automatic);

/// The strategy sp_attention runs for `a` under `o` (automatic: tunes if
/// needed, which launches every candidate; collective). Checks what
/// sp_attention checks first. `report` (optional) receives the measurements.
SpStrategy resolve_sp_attention(SpAttnContext& ctx, const SpAttnArgs& a, const SpAttnOptions& o = {},
                                TuneReport* report = nullptr);

/// Variants of sp_attention_diag_fused_kernel (bits). After a call with the
/// table wait (fused_ce's default where chunks are at least a KV block) the
/// first two change nothing: that kernel visits its blocks descending and
/// reads its own data from the workspace, which also makes the plain
/// kernel's output valid.
enum SpDiagKernel : unsigned {
  kSpDiagDescending = 1u << 0,        ///< blocks in the kernel's default order, not their chunks' arrival order
  kSpDiagOwnFromWorkspace = 1u << 1,  ///< own chunks read from the workspace, not in place (its own rows are stale)
  kSpDiagPlainKernel = 1u << 2,       ///< the plain kernel (no hook) over the workspace (its own rows are stale)
};

/// Diagnostics (bench sp-attention --diag): fused_ce's hooked kernel alone,
/// re-run over the KV the context's last call gathered, with no pushes and
/// no new epoch, so its flag waits pass at once: the kernel's cost beside
/// the plain kernel's. Valid only right after a fused_ce call with the same
/// `a` (checked; throws otherwise), and only until any rank starts its next
/// sp_attention call. Not collective; after a chunk-walk call the output is
/// timing only when kSpDiagOwnFromWorkspace or kSpDiagPlainKernel is set.
void sp_attention_diag_fused_kernel(SpAttnContext& ctx, const SpAttnArgs& a, unsigned variant = 0);

}  // namespace tessera::ops
