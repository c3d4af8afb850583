// Two-level attention: Ulysses inside groups, ring across them
// (two_level_attention.hpp describes the mesh and why the layouts compose).
#include "tessera/ops/two_level_attention.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <map>
#include <set>
#include <vector>

#include "scratch.hpp"
#include "seq_parallel_detail.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops {

int TwoLevelPlan::head_shard_chunk(int m) const {
  // Row block m < u: chunk o·u + m of super-chunk o; m >= u: chunk m - u of
  // super-chunk 2r-1-o.
  return m < inner ? group * inner + m : (2 * outer - 1 - group) * inner + (m - inner);
}

TwoLevelPlan plan_two_level_attention(std::int64_t seq, int world, int rank, int inner) {
  TESSERA_CHECK(world >= 1 && rank >= 0 && rank < world, "two_level_attention: rank {} of world {}", rank, world);
  TESSERA_CHECK(inner >= 1 && world % inner == 0,
                "two_level_attention: two_level_inner = {} must be a divisor of the world size {} (R = u x r)", inner,
                world);
  TESSERA_CHECK(seq >= 2 * world && seq % (2 * world) == 0,
                "two_level_attention: seq = {} must be a positive multiple of 2 x world = {} (zig-zag chunks)", seq,
                2 * world);
  TwoLevelPlan p;
  p.world = world;
  p.rank = rank;
  p.inner = inner;
  p.outer = world / inner;
  p.group = rank / inner;
  p.index = rank % inner;
  p.seq = seq;
  p.chunk = seq / (2 * world);
  for (int i = 0; i < inner; ++i) p.group_ranks.push_back(p.group * inner + i);
  for (int o = 0; o < p.outer; ++o) p.ring_ranks.push_back(o * inner + p.index);
  return p;
}

std::vector<int> two_level_inner_degrees(const SpAttnArgs& a, int world) {
  std::vector<int> v;
  for (int u = 1; u <= world; ++u)
    if (world % u == 0 && a.heads_q % u == 0 && a.heads_kv % u == 0) v.push_back(u);
  return v;
}

int two_level_inner_degree(const SpAttnArgs& a, int world, int requested) {
  TESSERA_CHECK(world >= 1, "two_level_attention: world {}", world);
  TESSERA_CHECK(a.heads_q >= 1 && a.heads_kv >= 1 && a.heads_q % a.heads_kv == 0,
                "two_level_attention: heads_q = {} is not a multiple of heads_kv = {} (GQA needs whole query groups)",
                a.heads_q, a.heads_kv);
  TESSERA_CHECK(requested >= 0, "two_level_attention: two_level_inner = {} must be >= 0 (0: chosen)", requested);
  if (requested > 0) {
    TESSERA_CHECK(world % requested == 0,
                  "two_level_attention: two_level_inner = {} must be a divisor of the world size {} (R = u x r)",
                  requested, world);
    TESSERA_CHECK(a.heads_q % requested == 0,
                  "two_level_attention: heads_q = {} is not a multiple of two_level_inner = {} (the Ulysses group "
                  "shards the query heads)",
                  a.heads_q, requested);
    TESSERA_CHECK(a.heads_kv % requested == 0,
                  "two_level_attention: heads_kv = {} is not a multiple of two_level_inner = {} (GQA: the Ulysses "
                  "group shards the KV heads too)",
                  a.heads_kv, requested);
    return requested;
  }
  for (int u : two_level_inner_degrees(a, world))
    if (u > 1 && u < world) return u;
  return 1;
}

namespace {

/// The Ulysses problem of one group: the group's S / r tokens as its sequence.
SpAttnArgs group_args(const SpAttnArgs& a, const TwoLevelPlan& p) {
  SpAttnArgs g = a;
  g.seq = a.seq / p.outer;
  return g;
}

}  // namespace

std::size_t two_level_attention_workspace_bytes(const SpAttnArgs& a, int world, int inner) {
  const int u = two_level_inner_degree(a, world, inner);
  if (world <= 1) return 0;
  const TwoLevelPlan p = plan_two_level_attention(a.seq, world, 0, u);
  if (u == 1) return ring_attention_workspace_bytes(a, world);
  std::size_t bytes = detail::ulysses_rank(group_args(a, p), u, 0, 1).layout().total;
  SpAttnArgs h = a;  // the ring's problem: head shards of H / u heads
  h.heads_q = a.heads_q / u;
  h.heads_kv = a.heads_kv / u;
  if (p.outer > 1) bytes += ring_attention_workspace_bytes(h, p.outer);
  return bytes;
}

struct TwoLevelAttnContext::Impl {
  explicit Impl(runtime::ProcessGroup& g) : pg(g) {}

  runtime::ProcessGroup& pg;
  /// The head shard (Q, K, V, O, LSE) and the all-to-all's staging; growth
  /// drains every stream, the inner ring's communication stream included.
  detail::ScratchBuffer scratch{"two_level_attention: scratch growth", detail::ScratchBuffer::Drain::all_streams};
  std::map<int, std::unique_ptr<RingAttnContext>> rings;  ///< by ring size
  std::set<detail::ZigzagSignature> validated;

  RingAttnContext& ring(int size) {  // collective on first use of a size: every rank runs the same degree
    std::unique_ptr<RingAttnContext>& r = rings[size];
    if (!r) r = std::make_unique<RingAttnContext>(pg);
    return *r;
  }
};

TwoLevelAttnContext::TwoLevelAttnContext(runtime::ProcessGroup& pg) : impl_(std::make_unique<Impl>(pg)) {}
TwoLevelAttnContext::~TwoLevelAttnContext() = default;

void two_level_attention(TwoLevelAttnContext& ctx, const SpAttnArgs& a, int inner, RingStrategy ring) {
  TwoLevelAttnContext::Impl& c = ctx.impl();
  const int R = c.pg.world(), rank = c.pg.rank();
  TESSERA_CHECK(ring == RingStrategy::sequential || ring == RingStrategy::overlapped,
                "two_level_attention: ring strategy code {} (sequential or overlapped)", static_cast<int>(ring));
  // The degree first (its errors name two_level_inner), then the zig-zag
  // checks and the kernel's own on the head-shard problem, all before any
  // launch; the shapes, the degree and the ring strategy agree across ranks.
  const int u = two_level_inner_degree(a, R, inner);
  const TwoLevelPlan p = plan_two_level_attention(a.seq, R, rank, u);
  detail::validate_zigzag(
      c.pg, a, "two_level_attention", static_cast<int>(ring) + 256 * u,
      fmt::format("{}x{}, ring {}", u, p.outer, ring == RingStrategy::sequential ? "sequential" : "overlapped"),
      c.validated);
  SpAttnArgs h = a;  // the ring's problem on the head shard
  h.heads_q = a.heads_q / u;
  h.heads_kv = a.heads_kv / u;
  {
    kernels::AttentionArgs k;
    k.q = a.q;
    k.k = a.k;
    k.v = a.v;
    k.o = a.o;
    k.batch = a.batch;
    k.seqlen_q = k.seqlen_k = a.seq / p.outer;
    k.heads_q = h.heads_q;
    k.heads_kv = h.heads_kv;
    k.head_dim = a.head_dim;
    k.dtype = a.dtype;
    k.causal = a.causal;
    k.softmax_scale = a.softmax_scale;
    kernels::validate(k, "two_level_attention (head shard)");
  }
  cudaStream_t st = c.pg.stream();

  if (u == 1) {  // the ring over every rank, on the inputs themselves
    detail::ring_attention_among(c.ring(R), a, ring, p.ring_ranks);
    return;
  }

  const SpAttnArgs ga = group_args(a, p);
  detail::UlyssesRank ur = detail::ulysses_rank(ga, u, p.index, 1);
  ur.place(c.scratch.get(ur.layout().total, c.pg));
  const detail::Copy2d copy = detail::stream_copy2d(st);

  // All-to-all in among the group: the head shard, in ring-shard order.
  detail::ulysses_pack_in(ur, a, 0, copy);
  detail::ulysses_exchange(c.pg.nccl(), ur.transfers_in(0), p.group_ranks, st);
  detail::ulysses_unpack_in(ur, 0, copy);

  h.q = ur.fq;
  h.k = ur.fk;
  h.v = ur.fv;
  h.o = ur.fo;
  h.lse = a.lse ? ur.flse : nullptr;
  if (p.outer == 1) {  // a ring of one: the whole sequence in order, one causal call
    const RingAttnPlan rp = plan_ring_attention(h.seq, 1, 0, h.causal);
    detail::ring_attend(h, 1, rp.steps[0], h.k, h.v, h.o, h.lse, st);
  } else {
    detail::ring_attention_among(c.ring(p.outer), h, ring, p.ring_ranks);
  }

  // All-to-all out among the group: O and LSE back to the sequence shards.
  detail::ulysses_pack_out(ur, a, 0, copy);
  detail::ulysses_exchange(c.pg.nccl(), ur.transfers_out(0, a.lse != nullptr), p.group_ranks, st);
  detail::ulysses_unpack_out(ur, a, 0, copy);
}

}  // namespace tessera::ops
