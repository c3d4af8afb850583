// tessera/ops/two_level_attention.hpp — two-level sequence-parallel
// attention (USP / LoongTrain): Ulysses inside groups of u ranks, ring
// across the R / u groups, over the zig-zag shards of sp_attention.hpp (rank
// g holds global chunks g and 2R-1-g of C = S / (2R) tokens).
//
// Mesh. R = u x r ranks; rank g = o·u + i is inner index i of group o
// (groups of consecutive ranks: on a multi-node machine a group is inside a
// node when u divides the GPUs per node). Ulysses group o: ranks o·u .. o·u +
// u-1; ring i: ranks i, u + i, 2u + i, ...
//
// Why it composes without a new layout. Group o's 2u zig-zag chunks are
// chunks o·u .. o·u + u-1 and their mirrors: super-chunks o and 2r-1-o of
// the sequence cut into 2r super-chunks of u·C tokens, i.e. exactly the
// zig-zag shard of rank o in a ring of r ranks. Ulysses' all-to-all among
// the u ranks of the group (ulysses_attention.hpp, with the group's S / r
// tokens as its sequence) places member p's chunk 0 at row p·C and its chunk
// 1 at row (2u-1-p)·C: the group's tokens in that ring shard's order, with
// H / u heads (K and V Hkv / u, so GQA keeps its mapping). Ring attention
// (ring_attention.hpp) then runs over ring i on these head shards — the
// ranks of one ring hold the same heads — with its KV shards shifted peer to
// peer, the next transfer overlapped with the current step's attention and
// the partial results merged through the LSE; the all-to-all back returns O
// and LSE to the zig-zag sequence shards.
//
//   u = 1: the ring over all R ranks (no all-to-all);
//   u = R: Ulysses over all R ranks (a ring of one: one causal call).
//
// Per call, on the compute stream: pack, all-to-all in (NCCL send / receive
// to the group's global ranks), ring (its pushes on the communication
// stream, flags of the global ranks), all-to-all out, unpack.
//
// Requires heads_q and heads_kv multiples of u (and the kernel's limits on
// heads_q / u, heads_kv / u), seq a multiple of 2R; checked before launch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/ops/ring_attention.hpp"
#include "tessera/ops/sp_attention.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::ops {

/// One rank's place on the u x r mesh (pure host logic, CPU-tested).
struct TwoLevelPlan {
  int world = 1, rank = 0;
  int inner = 1;                    ///< u: the Ulysses degree (ranks per group)
  int outer = 1;                    ///< r = R / u: the ring degree (groups)
  int group = 0;                    ///< o = rank / u
  int index = 0;                    ///< i = rank % u
  std::int64_t seq = 0, chunk = 0;  ///< S, C = S / (2R)
  std::vector<int> group_ranks;     ///< global ranks of my Ulysses group, by inner index
  std::vector<int> ring_ranks;      ///< global ranks of my ring, by group
  /// The global chunk at row block m (C rows) of this rank's head shard
  /// (2u blocks: the ring shard of rank `group` in a ring of r).
  int head_shard_chunk(int m) const;
};

/// Throws tessera::Error unless world >= 1, 0 <= rank < world, inner >= 1
/// divides world, and seq is a positive multiple of 2·world.
TwoLevelPlan plan_two_level_attention(std::int64_t seq, int world, int rank, int inner);

/// The Ulysses degrees u that `a` allows at `world`: divisors of world with
/// heads_q % u == 0 and heads_kv % u == 0, ascending (1 always).
std::vector<int> two_level_inner_degrees(const SpAttnArgs& a, int world);

/// The Ulysses degree a call uses: `requested` if it is one of
/// two_level_inner_degrees (a clear error naming two_level_inner and the
/// failed condition otherwise); 0 picks the smallest u > 1 with u < world
/// that the heads allow, else 1 (the plain ring). Why the smallest: each
/// ring step then computes u times the attention of the plain ring's steps
/// for the same KV bytes moved (so more of the transfer hides), while the
/// all-to-all, which is not overlapped, moves (u-1)/u of Q, K, V and O.
int two_level_inner_degree(const SpAttnArgs& a, int world, int requested = 0);

/// Device memory per rank beyond the input and output shards (bytes): the
/// Ulysses head shard and staging (u > 1), and the ring's slots and
/// accumulators on the head shard (r > 1).
std::size_t two_level_attention_workspace_bytes(const SpAttnArgs& a, int world, int inner);

/// Per process group: the head shard and staging, and one ring context per
/// ring size used (each with its symmetric slots and flags, made collectively
/// by the first call of that size).
class TwoLevelAttnContext {
 public:
  explicit TwoLevelAttnContext(runtime::ProcessGroup& pg);
  ~TwoLevelAttnContext();
  TwoLevelAttnContext(const TwoLevelAttnContext&) = delete;
  TwoLevelAttnContext& operator=(const TwoLevelAttnContext&) = delete;
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

/// Two-level attention with Ulysses degree `inner` (0: two_level_inner_degree's
/// choice) and the ring's strategy `ring`. Collective, stream-ordered on
/// pg.stream(). Bad input (seq, dtype, head_dim, heads not divisible by the
/// degree or for GQA, a degree not dividing the world, shapes or degrees that
/// differ between ranks, a CUDA-graph capture) throws tessera::Error before
/// any launch.
void two_level_attention(TwoLevelAttnContext& ctx, const SpAttnArgs& a, int inner = 0,
                         RingStrategy ring = RingStrategy::overlapped);

}  // namespace tessera::ops
