// src/ops/sp_attention/sp_attention.hpp — what sp_attention's strategies
// share (sp_attention.cpp): the context, one call's geometry over the
// gathered-KV workspace, the attention parts and the end of a call. Each
// strategy's launcher is in its own file here and registered in
// sp_attention.cpp; ring, ulysses and two_level run their own operators
// through contexts made on first use. sp_attention.hpp describes the plan
// and the flag protocol. Internal to src/ops.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "../scratch.hpp"
#include "../seq_parallel_detail.hpp"
#include "../strategy_registry.hpp"
#include "../tuning.hpp"
#include "tessera/ops/ring_attention.hpp"
#include "tessera/ops/sp_attention.hpp"
#include "tessera/ops/two_level_attention.hpp"
#include "tessera/ops/ulysses_attention.hpp"
#include "tessera/runtime/signals.hpp"
#include "tessera/runtime/symmetric_heap.hpp"

namespace tessera::ops {

struct SpAttnContext::Impl {
  explicit Impl(runtime::ProcessGroup& g);
  ~Impl();

  /// Data flags per source: slot `group` = "the heads of `group` of both my
  /// chunks landed" (value = epoch; groups: Call::head_groups).
  static constexpr int kSlots = kSpMaxHeadGroups;
  runtime::ProcessGroup& pg;
  std::unique_ptr<runtime::Signals> data;     ///< per-source chunk flags
  std::unique_ptr<runtime::Signals> control;  ///< slot 0: "my workspace is free again" (value = epoch)
  runtime::SymBuffer<unsigned char> ws;       ///< gathered K, then V: 2 x [B, S, Hkv, D] (detail::grow_symmetric)
  /// sequential: NCCL's [R][B, 2C, Hkv, D] for K, then V.
  detail::ScratchBuffer staging{"sp_attention: staging growth"};
  std::uint64_t epoch = 0;
  cudaEvent_t ev_ready = nullptr, ev_comm_done = nullptr;
  /// Device tables (kv_arrival_order, sp_kv_flag_table) per key (a tag,
  /// then what the table depends on); kept for the context's life.
  std::map<std::vector<std::int64_t>, std::int32_t*> tables;
  std::set<detail::ZigzagSignature> validated;  ///< shapes and strategies already checked across ranks
  /// CUDA graphs (sequential and fused_ce), as TpContext: `captured` once a
  /// call ran inside a capture of pg.stream(); the capture's first call and
  /// every eager call after a capture reset the flags first (begin_call), so
  /// a replay starts again at epoch 1. Workspaces replaced after a capture
  /// are kept in `replaced` (a graph may hold their addresses).
  bool captured = false;
  unsigned long long reset_capture = 0;
  std::vector<runtime::SymBuffer<unsigned char>> replaced;
  detail::TuneState tune;  ///< automatic's choices and cache
  /// The ring, Ulysses and two-level strategies' own contexts, made by their
  /// first call (collective: every rank runs the same strategy, checked beforehand).
  std::unique_ptr<RingAttnContext> ring;
  std::unique_ptr<UlyssesAttnContext> ulysses;
  std::unique_ptr<TwoLevelAttnContext> two_level;
  /// The last fused_ce call (sp_attention_diag_fused_kernel): its epoch,
  /// arguments and wait.
  struct LastFused {
    std::uint64_t epoch = 0;
    SpAttnArgs args;
    bool table_wait = false;
  } last_fused;

  /// The device table of kv_arrival_order(plan, kv_len, block_rows), made once.
  const std::int32_t* arrival_order(const SpAttnPlan& plan, std::int64_t kv_len, int block_rows);
  /// The device table of sp_kv_flag_table(plan, layout, block_rows, heads_kv, head_groups, kSlots), made once.
  const std::int32_t* flag_table(const SpAttnPlan& plan, SpKvLayout layout, int block_rows, std::int64_t heads_kv,
                                 int head_groups);
  /// Bounded waits for every stream of the group; a stuck flag wait is reported and released.
  void drain(const char* what);
  /// Before every launch: resets the flags where a capture needs it (see `captured`).
  void begin_call();
  /// Enqueued on pg.stream(): an all-reduce (every rank's earlier work done),
  /// the zeroing of data and control, another all-reduce; epoch restarts at 0.
  void reset_flags();
};

/// sp_attention's strategy launcher: enqueues one call on pg.stream(); `a`
/// is validated and agreed on by every rank; `u`: two_level's Ulysses degree.
using SpLaunch = void (*)(SpAttnContext::Impl& c, const SpAttnArgs& a, int u);
/// What sp_attention asks of a strategy beyond its launcher.
struct SpStrategyInfo {
  /// Workspace bytes per rank for `a` at world size `world`
  /// (sp_attention_workspace_bytes; `u`: two_level's degree, 0: chosen).
  std::size_t (*workspace)(const SpAttnArgs& a, int world, int u) = nullptr;
};
using SpRegistry = detail::StrategyRegistry<SpLaunch, SpStrategyInfo>;
using SpStrategyEntry = detail::StrategyEntry<SpLaunch, SpStrategyInfo>;

/// sp_attention's registry (sp_attention.cpp).
const SpRegistry& sp_attention_registry();

namespace sp {

/// One gathered-KV call (sequential, fused_ce): the plan, the sizes and the
/// workspace (grown by begin()), and the call's epoch.
struct Call {
  SpAttnContext::Impl& c;
  const SpAttnArgs& a;
  SpAttnPlan plan;
  int world = 1, rank = 0;
  cudaStream_t st = nullptr;
  std::int64_t B = 0, C = 0, S = 0, L = 0;  ///< batch, chunk rows, global rows, shard rows (2C)
  std::size_t kv_row = 0;                   ///< bytes of one token's K (or V) heads
  std::size_t kv_bytes = 0;                 ///< one gathered tensor [B, S, Hkv, D]
  int head_groups = 1;                      ///< fused_ce's pieces per chunk (sp_attention_head_groups)
  unsigned char *ws_k = nullptr, *ws_v = nullptr;
  std::uint64_t epoch = 0;
  /// fused_ce: the hooked kernel reads blocks inside the own chunks from the
  /// caller's K and V (SpKvFlags::own_k); the workspace holds only the own
  /// rows of the other blocks (copy_own_edges).
  bool own_in_place = false;
  /// fused_ce: the hooked kernel visits its KV blocks in the order their
  /// chunks land (kv_arrival_order), else descending (the kernel's default).
  bool arrival_order = true;
  /// fused_ce: the hooked kernel waits through the table wait
  /// (ops/sp_kv_table_wait.cuh: descending order, own data copied into the
  /// workspace, the timeout the host's) instead of the chunk walk (arrival
  /// order, own chunks in place, the engine's timed wait); non-causal in the
  /// shard layout, causal in global order (choose_fused_layout).
  bool table_wait = false;
  /// The workspace in the shard layout (sp_shard_slot) instead of global
  /// order: the table wait of a non-causal call.
  bool shard_layout() const { return table_wait && !a.causal; }
};

/// Bytes of one gathered tensor [B, S, Hkv, D] (K or V).
std::size_t gathered_kv_bytes(const SpAttnArgs& a);
/// The plan, the workspace grown to the gathered K and V, and a new epoch.
Call begin(SpAttnContext::Impl& c, const SpAttnArgs& a);
/// Copies rows [r0, r0 + rows) of chunk `i` (C rows) of a shard [B, 2C, H, D]
/// to rows [g0 + r0, g0 + r0 + rows) of a [B, S, H, D] tensor (any address of
/// the symmetric heap or local memory); row_bytes is one token's H x D.
void copy_chunk_rows(cudaStream_t s, void* dst, const void* src, int i, std::int64_t g0, std::int64_t B, std::int64_t C,
                     std::int64_t S, std::size_t row_bytes, std::int64_t r0, std::int64_t rows);
/// The whole chunk: copy_chunk_rows with rows [0, C).
void copy_chunk(cudaStream_t s, void* dst, const void* src, int i, std::int64_t g0, std::int64_t B, std::int64_t C,
                std::int64_t S, std::size_t row_bytes);
/// This rank's chunks into its own rows of the workspace (its slot in the
/// shard layout).
void copy_own(const Call& k, cudaStream_t s);
/// The own rows that the hooked kernel, reading its own chunks in place,
/// still reads from the workspace (sp_own_edge_rows for its KV blocks).
void copy_own_edges(const Call& k, cudaStream_t s);
/// Chooses fused_ce's layout and wait for call k (read per call, A/B knobs):
/// non-causal, the shard layout with the table wait where it fits, unless
/// TESSERA_SP_SHARD_LAYOUT=0; causal at R = 2, the table wait in global
/// order where it fits, unless TESSERA_SP_TABLE_WAIT=0 (=2: at any R); else
/// the chunk walk (global order, in-place own chunks unless
/// TESSERA_SP_OWN_IN_PLACE=0).
void choose_fused_layout(Call& k);
/// Copies head group `g` (of k.head_groups) of this rank's shard `src_shard`
/// (K or V) into rank `dst`'s gathered tensor `dst_base`, in the call's
/// layout: in global order both chunks to rows k.plan.chunks[i] x C (a 3D
/// copy per batch entry, the chunks the depth); in the shard layout the
/// shard whole to its slot (sp_shard_slot; one 3D copy, the batch the depth).
void copy_heads(const Call& k, cudaStream_t s, void* dst_base, const void* src_shard, int dst, int g);
/// Waits on `s` until every peer finished call epoch - 1: its kernels no
/// longer read, and its pushes no longer write, any workspace.
void wait_peers_done(const Call& k, cudaStream_t s);
/// The attention kernel per part of the plan over the workspace; `hooked`:
/// with per-block waits on the chunks' flags (R > 1).
void run_parts(const Call& k, bool hooked);
/// Control flag = epoch on every peer: my kernels of this call are done with
/// my workspace and every push I made in it has landed. Both gathered-KV
/// strategies end with it, so the next call may follow either one.
void finish(const Call& k);

/// The strategies (one file each).
extern const SpStrategyEntry sequential;
extern const SpStrategyEntry fused_ce;
extern const SpStrategyEntry ring;
extern const SpStrategyEntry ulysses;
extern const SpStrategyEntry two_level;

}  // namespace sp
}  // namespace tessera::ops
