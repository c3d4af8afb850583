// src/ops/seq_parallel_detail.hpp — the per-rank pieces of ring and Ulysses
// attention (ring_attention.cpp, ulysses_attention.cpp) with every buffer
// explicit, so that a one-GPU test can run R emulated ranks through the same
// code (tests/ops/ring_attention_emulated_test.cpp), with plain copies in
// place of the transfers.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/ops/ring_attention.hpp"
#include "tessera/ops/ulysses_attention.hpp"

namespace tessera::ops::detail {

// ---- shared by sp_attention and ring attention ----

/// Shapes, dtype, causal, strategy and fused_ce's head groups of a zig-zag
/// call, compared across ranks.
using ZigzagSignature = std::array<std::int64_t, 9>;

/// fused_ce's pieces per pushed chunk for `a`: sp_attention_head_groups(),
/// or TESSERA_SP_HEAD_GROUPS (measurement; must divide heads_kv, checked).
/// Part of the cross-rank signature: ranks that split differently would wait
/// on flags nobody writes.
int sp_head_groups(const SpAttnArgs& a);

/// Whether a zig-zag operator may run inside a CUDA-graph capture: only one
/// whose context restarts its epochs there (sp_attention's begin_call).
enum class ZigzagCapture { refused, allowed };

/// The checks of a zig-zag operator (`op`) before it launches anything: not
/// inside a CUDA-graph capture unless `capture` allows it (its flags carry a
/// per-call epoch), then validate_zigzag_shape, then agree_zigzag through
/// the group's check_same_on_all_ranks (inside a capture: only a signature
/// agreed on eagerly before, since the exchange cannot be captured).
void validate_zigzag(runtime::ProcessGroup& pg, const SpAttnArgs& a, const char* op, int strategy,
                     std::string_view strategy_name, std::set<ZigzagSignature>& agreed,
                     ZigzagCapture capture = ZigzagCapture::refused);

/// One rank's checks of a zig-zag call on `world` ranks: seq a positive
/// multiple of 2·world, then the attention kernel's own checks on one
/// shard's shapes (dtype, head dim, heads_q a multiple of heads_kv, null and
/// misaligned pointers, strides), each error naming the argument; the
/// kernel's device check (sm_90) comes last.
void validate_zigzag_shape(const SpAttnArgs& a, int world, const char* op);

/// The cross-rank exchange agree_zigzag uses: throws on every rank, naming
/// `what` and the disagreeing ranks, unless the bytes agree everywhere
/// (ProcessGroup::check_same_on_all_ranks; a Bootstrap's check_same in the
/// CPU tests).
using CheckSameOnAllRanks = std::function<void(const std::string& what, const void* data, std::size_t bytes)>;

/// Once per signature (recorded in `agreed`): the same shapes (batch, seq,
/// head counts, head dim), dtype, causal and strategy on every rank, so that
/// mismatched shapes or head counts are an error on every rank before any
/// launch; ranks on different strategies would wait for transfers and flags
/// that never come.
void agree_zigzag(const SpAttnArgs& a, const char* op, int strategy, std::string_view strategy_name,
                  std::set<ZigzagSignature>& agreed, const CheckSameOnAllRanks& check_same);

// ---- Ulysses ----

/// Shapes, dtype and causal (packed), and the head groups of a Ulysses call,
/// compared across ranks.
using UlyssesSignature = std::array<std::int64_t, 7>;

/// Once per signature (recorded in `agreed`): the same shapes, head counts,
/// dtype, causal and head groups on every rank (the all-to-all's sizes
/// follow from them), so a mismatch is an error on every rank before any
/// launch.
void agree_ulysses(const UlyssesAttnArgs& a, int groups, std::set<UlyssesSignature>& agreed,
                   const CheckSameOnAllRanks& check_same);

/// sp_attention's head-sharded strategies (those whose StrategyNeeds ask
/// heads_divide: ulysses) need heads_q and heads_kv multiples of the world
/// size; throws naming both and the strategy otherwise.
void check_sp_heads(const SpAttnArgs& a, int world, SpStrategy strategy);

// ---- ring ----

/// Step s of a ring plan: local Q rows of `s` against the first kv_len rows
/// of the KV shard at (k, v) (packed [B, 2C, Hkv, D]), into (o, lse) at the
/// same rows (o: [B, 2C, Hq, D] in a.dtype, lse: [B, Hq, 2C] or null).
void ring_attend(const RingAttnArgs& a, int world, const RingAttnPlan::Step& s, const void* k, const void* v, void* o,
                 float* lse, cudaStream_t stream);

/// Merges step j's partial (o_part, lse_part) into the float32 running
/// (o_acc, lse_acc); the last step writes a.o and a.lse instead, every row.
void ring_merge(const RingAttnArgs& a, const RingAttnPlan& plan, int j, float* o_acc, float* lse_acc,
                const void* o_part, const float* lse_part, cudaStream_t stream);

/// One rank's ring call as a host-ordered list of operations, each on the
/// compute or the communication stream: the flag protocol as data, executed
/// by ring_attention() and checked by a model of R ranks in
/// tests/ops/ring_attention_protocol_test.cpp. Flags: `data` (from rank r+1,
/// "the shard of step j is in your slot"), `control` (from rank r-1, "my
/// slot of step j is free"); values are stamps (ring_stamp).
struct RingOp {
  enum Kind {
    record_ready,    ///< compute: event "inputs ready"
    wait_ready,      ///< comm: waits for it
    wait_data,       ///< wait until the data flag from rank r+1 >= value
    wait_control,    ///< wait until the control flag from rank r-1 >= value
    push,            ///< comm: the shard held at `step` into slot (step+1) % 2 of rank r-1 (copy engine)
    notify_data,     ///< data flag on rank r-1 = value
    record_push,     ///< comm: event "push (or exchange) of `step` done"
    wait_push,       ///< compute: waits for that event
    exchange,        ///< NCCL send of the shard held at `step` to r-1, receive of the next from r+1 into
                     ///< local slot (step+1) % 2
    attend,          ///< compute: step's attention and merge (reads the shard held at `step`)
    notify_control,  ///< control flag on rank r+1 = value
    record_attend,   ///< compute: event "attention of `step` done"
    wait_attend,     ///< comm: waits for that event
  };
  Kind kind;
  bool comm = false;  ///< on the communication stream
  int step = 0;
  std::uint64_t value = 0;
};

/// Ring attention among the ranks `ring` of the process group (ring rank j
/// is global rank ring[j]; this rank is one of them), over the zig-zag shards
/// of a.seq / ring.size() rows each; `a` is validated by the caller. The
/// neighbours' flags and workspace slots are the global ranks'; every rank
/// of the process group runs the same call at once (the workspace grows
/// collectively). One context serves rings of one size (the stamps count
/// its steps). ring_attention() is this with every rank in order.
void ring_attention_among(RingAttnContext& ctx, const RingAttnArgs& a, RingStrategy s, const std::vector<int>& ring);

/// Stamp of step j (0..R; R: the call is over) of call `epoch` (1, 2, ...).
inline std::uint64_t ring_stamp(std::uint64_t epoch, int j, int world) {
  return epoch * static_cast<std::uint64_t>(world + 1) + static_cast<std::uint64_t>(j);
}

/// The operations of call `epoch` of a rank with plan `plan` (world > 1);
/// `flags`: the ranks have symmetric memory (the call ends with the control
/// stamp (epoch, R), which the next overlapped call waits for). Overlapped
/// without flags moves the shards by NCCL on the communication stream.
std::vector<RingOp> ring_schedule(const RingAttnPlan& plan, RingStrategy s, std::uint64_t epoch, bool flags);

// ---- Ulysses ----

/// One rank's shapes for `groups` head groups, and where its buffers are.
///
/// The head shard is group-major: tensor X with `n` heads per group holds
/// group g at X + g·B·S·n·hrow as [B, S, n, D] (LSE: [G][B, Hg, S]), so that
/// with batch 1 the rows of one zig-zag chunk of one group are contiguous
/// and NCCL moves them in place (direct(): no unpack of Q, K, V, no pack of
/// O). With batch > 1 everything goes through the staging buffers.
struct UlyssesRank {
  int world = 1, rank = 0, groups = 1;
  std::int64_t B = 0, S = 0, C = 0, L = 0, D = 0, H = 0, Hkv = 0, Hl = 0, Hkvl = 0, Hg = 0, Hkvg = 0;
  std::size_t hrow = 0;                            ///< bytes of one head of one token
  std::size_t blk_q = 0, blk_kv = 0, blk_lse = 0;  ///< per peer, one group, in the staging buffers
  // Buffers: the head shard (all tokens, local heads) and the staging.
  unsigned char *fq = nullptr, *fk = nullptr, *fv = nullptr, *fo = nullptr;
  float* flse = nullptr;
  unsigned char *send = nullptr, *recv = nullptr;

  bool direct() const { return B == 1; }
  /// Byte offset of local head hl (of `n` per group) of token t, batch b, in a head-shard tensor.
  std::size_t head_row(std::int64_t n, std::int64_t b, std::int64_t t, std::int64_t hl) const {
    return static_cast<std::size_t>((((hl / n) * B + b) * S + t) * n + hl % n) * hrow;
  }
  /// Index of local head hl's LSE of token t, batch b, in flse.
  std::int64_t lse_index(std::int64_t b, std::int64_t t, std::int64_t hl) const {
    return (((hl / Hg) * B + b) * Hg + hl % Hg) * S + t;
  }

  /// Scratch layout: offsets of the buffers above in one allocation.
  struct Layout {
    std::size_t off_k, off_v, off_o, off_lse, off_send, off_recv, total;
  };
  Layout layout() const;
  /// Points the buffers into `base` (at least layout().total bytes).
  void place(void* base);

  /// One NCCL send / receive pair with `peer`. Rank r's k-th transfer with
  /// peer p sends what p's k-th transfer with r receives (same bytes).
  struct Transfer {
    int peer;
    const unsigned char* send;
    unsigned char* recv;
    std::size_t bytes;
  };
  std::vector<Transfer> transfers_in(int g) const;
  std::vector<Transfer> transfers_out(int g, bool lse) const;
};

UlyssesRank ulysses_rank(const UlyssesAttnArgs& a, int world, int rank, int groups);

/// One NCCL group of the transfers of a direction on `s`; transfer peer p
/// (an index into the all-to-all's group) is global rank peers[p].
void ulysses_exchange(ncclComm_t comm, const std::vector<UlyssesRank::Transfer>& ts, const std::vector<int>& peers,
                      cudaStream_t s);

/// A 2-D copy in bytes: `rows` rows of `width` bytes, row pitches dpitch /
/// spitch. The operators enqueue cudaMemcpy2DAsync (stream_copy2d); a CPU
/// test moves host memory through the same index arithmetic.
using Copy2d = std::function<void(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                                  std::size_t rows)>;
Copy2d stream_copy2d(cudaStream_t s);

/// Sequence shard -> staging (every peer's heads of group g out of my rows).
void ulysses_pack_in(const UlyssesRank& u, const UlyssesAttnArgs& a, int g, const Copy2d& copy);
/// Staging received -> head shard (every peer's two chunks to their global rows).
void ulysses_unpack_in(const UlyssesRank& u, int g, const Copy2d& copy);
/// The kernel on group g of the head shard.
void ulysses_attend(const UlyssesRank& u, const UlyssesAttnArgs& a, int g, cudaStream_t s);
/// Head shard O / LSE of group g -> staging (each peer's rows).
void ulysses_pack_out(const UlyssesRank& u, const UlyssesAttnArgs& a, int g, const Copy2d& copy);
/// Staging received -> a.o / a.lse (every peer's heads of group g of my rows).
void ulysses_unpack_out(const UlyssesRank& u, const UlyssesAttnArgs& a, int g, const Copy2d& copy);

}  // namespace tessera::ops::detail
