// The TP MoE layer (tessera/ops/moe.hpp): sequential and pipelined
// strategies, and automatic through the ops tuner. Design:
// docs/design/moe_tp.md.
#include "tessera/ops/moe.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "moe_scratch.hpp"
#include "tessera/kernels/grouped_gemm.hpp"
#include "tessera/kernels/moe_routing.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/ops/plan.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/signals.hpp"
#include "tessera/runtime/symmetric_heap.hpp"
#include "tessera/signal/overlap_comm.hpp"
#include "tessera/tune/key.hpp"
#include "tuning.hpp"

namespace tessera::ops {

using detail::Scratch;

namespace {

constexpr std::int64_t kMaxDim = detail::kMoeMaxDim;
constexpr int kStatusBase = 2;  // flags: [0] invalid ids, [1] unused

/// Status words of shard q's gate/up (down = false) or down GEMM; the
/// sequential strategy uses q = 0.
int status_index(int q, bool down) { return kStatusBase + (2 * q + (down ? 1 : 0)) * kernels::kGroupedStatusInts; }

/// Compared byte for byte across ranks: all 64-bit, so no padding.
struct TpShape {
  std::int64_t tokens_local, hidden, inter_local, experts, topk, dtype, strategy, comm_ctas, rs_chunks, transport;
  bool operator<(const TpShape& o) const {
    return std::tie(tokens_local, hidden, inter_local, experts, topk, dtype, strategy, comm_ctas, rs_chunks,
                    transport) < std::tie(o.tokens_local, o.hidden, o.inter_local, o.experts, o.topk, o.dtype,
                                          o.strategy, o.comm_ctas, o.rs_chunks, o.transport);
  }
};

constexpr int kMaxChunks = kMoeMaxRsChunks;  ///< the copy-engine transport's partial-chunk flags

/// The transport a call of `o` uses (the same on every rank: reachability
/// is a property of the group, capture of the call).
MoeTransport resolve_transport(runtime::ProcessGroup& pg, const MoeTpOptions& o) {
  if (o.transport != MoeTransport::automatic) return o.transport;
  return pg.lsa_reachable() && !runtime::stream_capturing(pg.stream()) ? MoeTransport::copy_engine : MoeTransport::nccl;
}

/// A pipelined call's transport and part-2 column chunks, resolved once.
struct PipelineChoice {
  MoeTransport transport;
  int chunks;
};
PipelineChoice resolve_pipeline(runtime::ProcessGroup& pg, const MoeTpArgs& a, const MoeTpOptions& o) {
  const MoeTransport t = resolve_transport(pg, o);
  return {t, moe_rs_chunks(a.hidden, o.rs_chunks, t == MoeTransport::copy_engine)};
}

const char* transport_name(MoeTransport t) {
  switch (t) {
    case MoeTransport::automatic:
      return "automatic";
    case MoeTransport::nccl:
      return "nccl";
    case MoeTransport::copy_engine:
      return "copy_engine";
  }
  return "?";
}

}  // namespace

struct MoeContext::Impl {
  Scratch x_full, ids_full, w_full, offsets, counts, sorted, rows, permute_ws, gathered, inter, expert_out, partial,
      recv, flags;
  std::int32_t* flags_ptr = nullptr;  ///< see kStatusBase and status_index
  int last_status_shards = 0;         ///< shards whose GEMM status words the last call wrote (0: none)
  detail::TuneState tune;             ///< automatic's choices and cache
  std::set<TpShape> agreed;           ///< signatures every rank has confirmed (one host exchange each)

  // pipelined: the split communicator and the per-step events.
  detail::PipelineComm pipe;
  cudaEvent_t ev_start = nullptr;
  std::vector<cudaEvent_t> ev_x;     ///< [R]: AG step d's tokens and routing have arrived
  std::vector<cudaEvent_t> ev_part;  ///< [R * chunks]: step d's partial chunk c is combined
  std::vector<cudaEvent_t> ev_rs;    ///< [chunks]: chunk c of every peer's partial has arrived
  cudaEvent_t ev_comm_done = nullptr;

  // The copy-engine transport: flags, the buffers peers push into, the call's epoch.
  std::unique_ptr<runtime::Signals> data;     ///< slot 0: a step's tokens landed; 1 + c: partial chunk c (= epoch)
  std::unique_ptr<runtime::Signals> control;  ///< slot 0: my receive buffers are free again (= epoch)
  runtime::SymBuffer<unsigned char> sym;      ///< [x_full | ids_full | w_full | receive slabs], SymLayout
  std::uint64_t epoch = 0;                    ///< copy-engine calls so far (the same on every rank)

  ~Impl() {
    if (ev_start) cudaEventDestroy(ev_start);
    if (ev_comm_done) cudaEventDestroy(ev_comm_done);
    for (auto* v : {&ev_x, &ev_part, &ev_rs})
      for (cudaEvent_t e : *v) cudaEventDestroy(e);
  }

  static cudaEvent_t make_event() {
    cudaEvent_t e = nullptr;
    TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  /// Collective (every rank's first pipelined call, or a new comm_ctas /
  /// transport): the split communicator (PipelineComm, nccl) or the flags
  /// (copy_engine); and the per-step events.
  void ensure_pipeline(runtime::ProcessGroup& pg, int ctas, int chunks, MoeTransport transport) {
    const int R = pg.world();
    if (transport == MoeTransport::nccl) {
      TESSERA_CHECK(pipe.ready(ctas) || !runtime::stream_capturing(pg.stream()),
                    "moe_tp: the pipelined strategy builds its communicator on its first call; run it once eagerly "
                    "(same comm_ctas) before capturing it into a CUDA graph");
      pipe.ensure(pg, ctas, "moe_tp: new pipeline communicator");
    } else {
      TESSERA_CHECK(!runtime::stream_capturing(pg.stream()),
                    "moe_tp: the copy-engine transport cannot be captured into a CUDA graph (its flags carry a "
                    "per-call epoch that a replay would repeat); use MoeTransport::nccl or automatic");
      TESSERA_CHECK(pg.lsa_reachable(),
                    "moe_tp: the copy-engine transport needs every rank load/store reachable "
                    "(lsa size {} of {}); use MoeTransport::nccl or automatic",
                    pg.lsa_size(), R);
      if (!data) {
        data = std::make_unique<runtime::Signals>(pg, 1 + kMaxChunks);
        control = std::make_unique<runtime::Signals>(pg, 1);
      }
    }
    if (!ev_start) ev_start = make_event();
    if (!ev_comm_done) ev_comm_done = make_event();
    while (static_cast<int>(ev_x.size()) < R) ev_x.push_back(make_event());
    while (static_cast<int>(ev_part.size()) < R * chunks) ev_part.push_back(make_event());
    while (static_cast<int>(ev_rs.size()) < chunks) ev_rs.push_back(make_event());
  }

  /// Collective: `bytes` of symmetric buffers on every rank (same size: the
  /// shapes were agreed). Growth waits until no peer reads or pushes.
  void ensure_sym(runtime::ProcessGroup& pg, std::size_t bytes) {
    if (!sym.empty() && sym.bytes() >= bytes) return;
    drain(pg, "moe_tp: symmetric buffer growth");
    pg.barrier();
    sym = runtime::SymBuffer<unsigned char>();
    sym = runtime::SymBuffer<unsigned char>(pg, bytes);
  }

  /// Bounded wait for every stream a call uses (the tuner's drain); with
  /// flags, a stuck stream wait is reported by name and released.
  void drain(runtime::ProcessGroup& pg, const char* what) {
    if (data) {
      const std::initializer_list<const runtime::Signals*> all{data.get(), control.get()};
      link::synchronize(pg.stream(), all, what);
      link::synchronize(pg.comm_stream(0), all, what);
      return;
    }
    pg.synchronize(pg.stream(), what);
    pg.synchronize(pg.comm_stream(0), what);
  }
};

namespace {

/// Byte offsets of the copy-engine transport's symmetric buffer: the
/// gathered tokens, ids and weights (shard s at s x its size, as in the
/// sequential all-gather's layout) and the R - 1 receive slabs.
struct SymLayout {
  std::size_t x = 0, ids = 0, w = 0, recv = 0, bytes = 0;
  SymLayout(int R, std::int64_t tokens_local, std::int64_t hidden, std::int64_t topk, std::size_t es) {
    auto up = [](std::size_t v) { return (v + 255) / 256 * 256; };
    const std::size_t shard = static_cast<std::size_t>(tokens_local * hidden) * es;
    const std::size_t route = static_cast<std::size_t>(R * tokens_local * topk) * 4;
    ids = up(R * shard);
    w = ids + up(route);
    recv = w + up(route);
    bytes = recv + up(static_cast<std::size_t>(R - 1) * shard) + 256;
  }
};

}  // namespace

MoeContext::MoeContext(runtime::ProcessGroup& pg) : pg_(&pg), impl_(std::make_unique<Impl>()) {}
MoeContext::~MoeContext() {
  // After a peer failure the group is aborted; finalizing the split
  // communicator collectively would then wait for the dead peer.
  if (impl_->pipe.comm && pg_->aborted()) impl_->pipe.comm->abort();
}

void validate(const MoeTpArgs& a, int world) {
  detail::validate_moe_sizes(
      "moe_tp", world, a.dtype, a.tokens_local, a.hidden, "inter_local", a.inter_local, a.experts,
      static_cast<int>(std::min<std::int64_t>(kernels::moe::kMaxExperts, kernels::kGroupedMaxGroups)), a.topk,
      kernels::moe::kMaxTopK);
  const std::int64_t tokens = a.tokens_local * world;
  TESSERA_CHECK(tokens * a.topk < kMaxDim, "moe_tp: tokens ({}) * topk ({}) must stay below 2^31", tokens, a.topk);
  TESSERA_CHECK(tokens * a.topk <= (std::int64_t{1} << 60) / (a.hidden + 2 * a.inter_local),
                "moe_tp: the expert buffers of {} rows x (hidden {} + 2 x inter_local {}) overflow 64-bit sizes",
                tokens * a.topk, a.hidden, a.inter_local);
  TESSERA_CHECK(a.x_shard != nullptr && a.out_shard != nullptr, "moe_tp: x_shard and out_shard must be non-null");
  TESSERA_CHECK(a.expert_ids != nullptr && a.weights != nullptr, "moe_tp: expert_ids and weights must be non-null");
  TESSERA_CHECK(a.w_gate_up != nullptr && a.w_down != nullptr, "moe_tp: w_gate_up and w_down must be non-null");
  for (const void* p : {a.x_shard, a.w_gate_up, a.w_down, static_cast<const void*>(a.out_shard)})
    TESSERA_CHECK((reinterpret_cast<std::uintptr_t>(p) & 15u) == 0, "moe_tp: pointer {} is not 16-byte aligned", p);
}

void validate(const MoeTpOptions& o, int sms) {
  TESSERA_CHECK(accepts(OpKind::moe_tp, o.strategy),
                "moe_tp: strategy {} is not a TP MoE strategy (automatic, sequential, pipelined)",
                strategy_name(o.strategy));
  TESSERA_CHECK(o.comm_ctas >= 1 && o.comm_ctas <= 64 && o.comm_ctas < sms,
                "moe_tp: comm_ctas = {} out of range [1, min(64, SMs - 1 = {})]", o.comm_ctas, sms - 1);
}

namespace {

/// The per-call buffers and the kernels both strategies share.
struct Call {
  runtime::ProcessGroup& pg;
  MoeContext::Impl& m;
  const MoeTpArgs& a;
  cudaStream_t s;
  int R, rank;
  std::int64_t Tl, k, H, I, E, per;  ///< per = Tl * k: routed entries of one shard
  std::size_t es;
  unsigned char *x_full, *gathered, *inter, *expert_out, *partial;
  std::int32_t *ids_full, *offsets, *counts, *sorted, *rows;
  float* w_full;
  void* permute_ws;
  std::size_t permute_ws_bytes;

  /// `sym`: the gathered tokens and routing live in m.sym (the copy-engine
  /// transport's pushes land there); nullptr: in scratch memory.
  Call(runtime::ProcessGroup& g, MoeContext::Impl& mi, const MoeTpArgs& args, const SymLayout* sym = nullptr)
      : pg(g), m(mi), a(args), s(g.stream()), R(g.world()), rank(g.rank()) {
    Tl = a.tokens_local;
    k = a.topk;
    H = a.hidden;
    I = a.inter_local;
    E = a.experts;
    per = Tl * k;
    es = dtype_size(a.dtype);
    const std::int64_t T = Tl * R, entries = T * k;
    // Shard-major layouts (shard s at s * Tl tokens, s * per entries): the
    // sequential all-gather writes the same layout in one collective.
    if (sym) {
      unsigned char* base = m.sym.local();
      x_full = base + sym->x;
      ids_full = reinterpret_cast<std::int32_t*>(base + sym->ids);
      w_full = reinterpret_cast<float*>(base + sym->w);
    } else {
      x_full = static_cast<unsigned char*>(m.x_full.get(static_cast<std::size_t>(T * H) * es + 16, pg));
      ids_full = m.ids_full.get<std::int32_t>(entries, pg);
      w_full = m.w_full.get<float>(entries, pg);
    }
    offsets = m.offsets.get<std::int32_t>(R * (E + 1), pg);
    counts = m.counts.get<std::int32_t>(R * E, pg);
    sorted = m.sorted.get<std::int32_t>(entries, pg);
    rows = m.rows.get<std::int32_t>(entries, pg);
    // The permute of one shard (pipelined) needs no more than that of all.
    permute_ws_bytes = kernels::moe::permute_workspace_bytes(entries, a.experts);
    permute_ws = m.permute_ws.get(permute_ws_bytes + 16, pg);
    gathered = static_cast<unsigned char*>(m.gathered.get(static_cast<std::size_t>(entries * H) * es + 16, pg));
    inter = static_cast<unsigned char*>(m.inter.get(static_cast<std::size_t>(entries * I) * es + 16, pg));
    expert_out = static_cast<unsigned char*>(m.expert_out.get(static_cast<std::size_t>(entries * H) * es + 16, pg));
    partial = static_cast<unsigned char*>(m.partial.get(static_cast<std::size_t>(T * H) * es + 16, pg));
    const int flag_words = kStatusBase + 2 * R * kernels::kGroupedStatusInts;
    m.flags_ptr = m.flags.get<std::int32_t>(flag_words, pg);
    TESSERA_CUDA_CHECK(cudaMemsetAsync(m.flags_ptr, 0, static_cast<std::size_t>(flag_words) * 4, s));
  }

  /// Expert sort of `tokens` tokens' routing `ids` into table slot q
  /// (offsets/counts q, rows from q * per).
  void permute(const std::int32_t* ids, std::int64_t tokens, int q) {
    kernels::moe::PermuteArgs p;
    p.expert_ids = ids;
    p.tokens = tokens;
    p.experts = a.experts;
    p.k = a.topk;
    p.expert_offsets = offsets + q * (E + 1);
    p.expert_counts = counts + q * E;
    p.sorted_entry = sorted + q * per;
    p.entry_row = rows + q * per;
    p.invalid = m.flags_ptr;
    p.workspace_bytes = kernels::moe::permute_workspace_bytes(tokens * k, a.experts);
    p.workspace = permute_ws;
    kernels::moe::permute(p, s);
  }

  /// Rows of `x` (tokens of table slot q) gathered into the sorted rows from q * per.
  void gather(const void* x, int q, std::int64_t max_rows) {
    kernels::moe::GatherArgs g;
    g.x = x;
    g.ldx = H;
    g.gathered = gathered + static_cast<std::size_t>(q * per * H) * es;
    g.ldg = H;
    g.cols = H;
    g.sorted_entry = sorted + q * per;
    g.expert_offsets = offsets + q * (E + 1);
    g.experts = a.experts;
    g.k = a.topk;
    g.max_rows = max_rows;
    g.dtype = a.dtype;
    kernels::moe::gather_rows(g, s);
  }

  /// The gate/up (down = false) or down grouped GEMM over table slot q's
  /// rows (at most max_rows); max_ctas 0 = all SMs. The down GEMM computes
  /// output columns [col0, col0 + cols) of hidden (cols 0: all).
  void gemm(int q, bool down, std::int64_t max_rows, int max_ctas, std::int64_t col0 = 0, std::int64_t cols = 0) {
    if (max_rows == 0) return;
    kernels::GroupedGemmArgs g;
    g.group_rows = counts + q * E;
    g.status = m.flags_ptr + status_index(q, down);
    g.groups = E;
    g.max_rows = max_rows;
    kernels::GroupedGemmOptions go;
    go.max_ctas = max_ctas;
    if (!down) {
      g.a = gathered + static_cast<std::size_t>(q * per * H) * es;
      g.b = a.w_gate_up;
      g.d = inter + static_cast<std::size_t>(q * per * I) * es;
      g.n = 2 * I;
      g.k = H;
      go.epilogue = kernels::GroupedEpilogueKind::SwiGLU;
    } else {
      // Expert e's rows [col0, col0 + cols) of w_down [E, H, I]: B's groups
      // stay H x I apart; D keeps hidden's row stride.
      g.a = inter + static_cast<std::size_t>(q * per * I) * es;
      g.b = static_cast<const unsigned char*>(a.w_down) + static_cast<std::size_t>(col0 * I) * es;
      g.d = expert_out + static_cast<std::size_t>(q * per * H + col0) * es;
      g.n = cols > 0 ? cols : H;
      g.k = I;
      g.ldd = H;
      g.stride_b = H * I;
    }
    kernels::grouped_gemm(g, go, s);
  }

  /// Top-k combine of `tokens` tokens of table slot q (weights `w`) into
  /// `out` [tokens, H], adding `addends` blocks of [tokens, H] from `addend`.
  void combine(int q, std::int64_t tokens, const float* w, void* out, const void* addend = nullptr, int addends = 0) {
    combine_columns(q, tokens, w, 0, H, out, H, addend, addends, H, tokens * H);
  }

  /// Columns [col0, col0 + cols) of the combine: `out` and each addend
  /// block point at the chunk's first column (row strides ldo, ld_add;
  /// addend_stride elements between addend blocks).
  void combine_columns(int q, std::int64_t tokens, const float* w, std::int64_t col0, std::int64_t cols, void* out,
                       std::int64_t ldo, const void* addend, int addends, std::int64_t ld_add,
                       std::int64_t addend_stride) {
    kernels::moe::CombineArgs c;
    c.y = expert_out + static_cast<std::size_t>(q * per * H + col0) * es;
    c.ldy = H;
    c.entry_row = rows + q * per;
    c.weights = w;
    c.out = out;
    c.ldo = ldo;
    c.tokens = tokens;
    c.cols = cols;
    c.k = a.topk;
    c.dtype = a.dtype;
    c.addend = addend;
    c.addends = addends;
    c.ld_add = ld_add;
    c.addend_stride = addend_stride;
    kernels::moe::combine(c, s);
  }
};

/// Sequential: one all-gather, one expert sort of all R·T_l tokens, one
/// grouped GEMM pair, one combine, one reduce-scatter.
void run_sequential(Call& c) {
  const MoeTpArgs& a = c.a;
  const std::int64_t T = c.Tl * c.R, entries = T * c.k;
  runtime::ProcessGroup& pg = c.pg;
  // One NCCL group: the three all-gathers are one launch.
  TESSERA_NCCL_CHECK(ncclGroupStart());
  TESSERA_NCCL_CHECK(ncclAllGather(a.x_shard, c.x_full, static_cast<std::size_t>(c.Tl * c.H),
                                   runtime::nccl_dtype(a.dtype), pg.nccl(), c.s));
  TESSERA_NCCL_CHECK(
      ncclAllGather(a.expert_ids, c.ids_full, static_cast<std::size_t>(c.per), ncclInt32, pg.nccl(), c.s));
  TESSERA_NCCL_CHECK(ncclAllGather(a.weights, c.w_full, static_cast<std::size_t>(c.per), ncclFloat32, pg.nccl(), c.s));
  TESSERA_NCCL_CHECK(ncclGroupEnd());
  // Table slot 0 holds the whole layer's sort (rows 0 .. T·k).
  c.permute(c.ids_full, T, 0);
  c.gather(c.x_full, 0, entries);
  c.gemm(0, false, entries, 0);
  c.gemm(0, true, entries, 0);
  c.combine(0, T, c.w_full, c.partial);
  TESSERA_NCCL_CHECK(ncclReduceScatter(c.partial, a.out_shard, static_cast<std::size_t>(c.Tl * c.H),
                                       runtime::nccl_dtype(a.dtype), ncclSum, pg.nccl(), c.s));
  c.m.last_status_shards = entries > 0 ? 1 : 0;
}

/// Pipelined (plan_moe_tp): table slot q = shard q; see the header comment.
/// Part 2 runs in `chunks` column chunks of hidden (Hc columns each): a
/// remote shard's partial is laid out chunk-major ([chunks][T_l][Hc], so
/// each chunk is one contiguous message) and so is each receive slab.
/// `sym` (copy_engine): the layout of m.sym, where peers push; nullptr: NCCL.
void run_pipelined(Call& c, int comm_ctas, int chunks, const SymLayout* sym) {
  const MoeTpArgs& a = c.a;
  runtime::ProcessGroup& pg = c.pg;
  MoeContext::Impl& m = c.m;
  const int R = c.R, rank = c.rank;
  const bool ce = sym != nullptr;
  const MoeTpPlan plan = plan_moe_tp(c.Tl, a.topk, R, rank);
  const cudaStream_t s = c.s, cs = pg.comm_stream(0);
  const ncclComm_t comm = ce ? nullptr : m.pipe.get();
  const ncclDataType_t dt = runtime::nccl_dtype(a.dtype);
  const std::size_t shard_elems = static_cast<std::size_t>(c.Tl * c.H), shard_bytes = shard_elems * c.es;
  const std::int64_t Hc = c.H / chunks;
  const std::size_t chunk_elems = static_cast<std::size_t>(c.Tl * Hc), chunk_bytes = chunk_elems * c.es;
  const std::size_t route_bytes = static_cast<std::size_t>(c.per) * 4;
  // The copy engine takes no SM: GEMMs beside its transfers keep them all.
  const int beside_ctas = ce ? 0 : pg.sm_count() - comm_ctas;
  const std::uint64_t e = ce ? ++m.epoch : 0;
  auto x_of = [&](int q) -> const void* {
    return q == rank ? a.x_shard : static_cast<const void*>(c.x_full + static_cast<std::size_t>(q) * shard_bytes);
  };
  auto ids_of = [&](int q) { return q == rank ? a.expert_ids : c.ids_full + q * c.per; };
  auto w_of = [&](int q) { return q == rank ? a.weights : c.w_full + q * c.per; };
  auto partial_chunk = [&](int q, int ch) { return c.partial + q * shard_bytes + ch * chunk_bytes; };
  // RS slabs 0..R-2, chunk-major; with the copy engine they are where peers push.
  unsigned char* recv =
      ce ? m.sym.local() + sym->recv : static_cast<unsigned char*>(m.recv.get((R - 1) * shard_bytes + 16, pg));
  auto recv_chunk = [&](unsigned char* base, int slab, int ch) { return base + slab * shard_bytes + ch * chunk_bytes; };

  // Communication stream, part 1: step d's tokens and their routing. It
  // starts after the caller's inputs.
  TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_start, s));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, m.ev_start, 0));
  for (int d = 1; d < R; ++d) {
    const int to = plan.send_to[d - 1], from = plan.recv_from[d - 1];
    if (ce) {
      // `to` said it no longer reads what I pushed in the last call; then
      // my shard into its slot `rank`, and the flag.
      if (e > 1) link::rank_wait(cs, *m.control, to, 0, e - 1);
      unsigned char* peer = m.sym.peer(to);
      link::rank_copy_data(cs, peer + sym->x + rank * shard_bytes, a.x_shard, shard_bytes);
      link::rank_copy_data(cs, peer + sym->ids + rank * route_bytes, a.expert_ids, route_bytes);
      link::rank_copy_data(cs, peer + sym->w + rank * route_bytes, a.weights, route_bytes);
      link::rank_notify(cs, *m.data, to, 0, e);
      continue;
    }
    TESSERA_NCCL_CHECK(ncclGroupStart());
    TESSERA_NCCL_CHECK(ncclSend(a.expert_ids, static_cast<std::size_t>(c.per), ncclInt32, to, comm, cs));
    TESSERA_NCCL_CHECK(ncclRecv(c.ids_full + from * c.per, static_cast<std::size_t>(c.per), ncclInt32, from, comm, cs));
    TESSERA_NCCL_CHECK(ncclSend(a.weights, static_cast<std::size_t>(c.per), ncclFloat32, to, comm, cs));
    TESSERA_NCCL_CHECK(ncclRecv(c.w_full + from * c.per, static_cast<std::size_t>(c.per), ncclFloat32, from, comm, cs));
    TESSERA_NCCL_CHECK(ncclSend(a.x_shard, shard_elems, dt, to, comm, cs));
    TESSERA_NCCL_CHECK(ncclRecv(const_cast<void*>(x_of(from)), shard_elems, dt, from, comm, cs));
    TESSERA_NCCL_CHECK(ncclGroupEnd());
    TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_x[d], cs));
  }

  // Compute stream, part 1: the own shard at once, beside the transfers,
  // then each remote shard as it arrives.
  c.permute(a.expert_ids, c.Tl, rank);
  c.gather(a.x_shard, rank, c.per);
  c.gemm(rank, false, c.per, plan.gate_up[0].beside_comm ? beside_ctas : 0);
  for (int j = 1; j < R; ++j) {
    const MoeTpStep& st = plan.gate_up[j];
    if (ce)
      link::rank_wait(s, *m.data, st.shard, 0, e);
    else
      TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, m.ev_x[st.comm_step], 0));
    c.permute(ids_of(st.shard), c.Tl, st.shard);
    c.gather(x_of(st.shard), st.shard, c.per);
    c.gemm(st.shard, false, c.per, st.beside_comm ? beside_ctas : 0);
  }

  // Part 2: down + combine per shard in owner order, chunk by chunk; each
  // remote partial chunk leaves at its step while the next chunk computes.
  int last_step = 0;
  for (const MoeTpStep& st : plan.down) last_step = std::max(last_step, st.comm_step);
  for (const MoeTpStep& st : plan.down) {
    if (st.shard == rank) {  // the own shard is last: combined below with the received partials
      c.gemm(rank, true, c.per, st.beside_comm ? beside_ctas : 0);
      break;
    }
    const int d = st.comm_step, to = plan.send_to[d - 1];
    for (int ch = 0; ch < chunks; ++ch) {
      c.gemm(st.shard, true, c.per, st.beside_comm || ch > 0 ? beside_ctas : 0, ch * Hc, Hc);
      c.combine_columns(st.shard, c.Tl, w_of(st.shard), ch * Hc, Hc, partial_chunk(st.shard, ch), Hc, nullptr, 0, Hc,
                        0);
      cudaEvent_t done = m.ev_part[d * chunks + ch];
      TESSERA_CUDA_CHECK(cudaEventRecord(done, s));
      TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, done, 0));
      if (ce) {
        // Into `to`'s slab for this step (rs_slab(d) there: I am its r - d).
        link::rank_copy_data(cs, recv_chunk(m.sym.peer(to) + sym->recv, plan.rs_slab(d), ch),
                             partial_chunk(st.shard, ch), chunk_bytes);
        link::rank_notify(cs, *m.data, to, 1 + ch, e);
        continue;
      }
      TESSERA_NCCL_CHECK(ncclGroupStart());
      TESSERA_NCCL_CHECK(ncclSend(partial_chunk(st.shard, ch), chunk_elems, dt, to, comm, cs));
      TESSERA_NCCL_CHECK(
          ncclRecv(recv_chunk(recv, plan.rs_slab(d), ch), chunk_elems, dt, plan.recv_from[d - 1], comm, cs));
      TESSERA_NCCL_CHECK(ncclGroupEnd());
      // The last step's chunk ch completes chunk ch of every slab (the
      // communication stream runs the steps in order).
      if (d == last_step) TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_rs[ch], cs));
    }
  }
  // The own shard's combine per chunk, once every peer's chunk arrived.
  for (int ch = 0; ch < chunks; ++ch) {
    if (ce) {
      for (int d = 1; d < R; ++d) link::rank_wait(s, *m.data, plan.recv_from[d - 1], 1 + ch, e);
    } else {
      TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, m.ev_rs[ch], 0));
    }
    c.combine_columns(rank, c.Tl, a.weights, ch * Hc, Hc, static_cast<unsigned char*>(a.out_shard) + ch * Hc * c.es,
                      c.H, recv_chunk(recv, 0, ch), R - 1, Hc, static_cast<std::int64_t>(shard_elems));
  }
  // Join the communication stream; then (copy engine) tell every peer that
  // my receive buffers are free for its next call's pushes.
  TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_comm_done, cs));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, m.ev_comm_done, 0));
  if (ce)
    for (int p = 0; p < R; ++p)
      if (p != rank) link::rank_notify(s, *m.control, p, 0, e);
  m.last_status_shards = c.per > 0 ? R : 0;
}

void run_moe_tp(MoeContext& ctx, const MoeTpArgs& a, Strategy strategy, const MoeTpOptions& o) {
  runtime::ProcessGroup& pg = ctx.group();
  MoeContext::Impl& m = ctx.impl();
  const int R = pg.world();
  // Pipelined has nothing to overlap at R = 1 or without tokens.
  const bool pipelined = strategy == Strategy::pipelined && R > 1 && a.tokens_local > 0;
  if (!pipelined) {
    Call c(pg, m, a);
    run_sequential(c);
    return;
  }
  const auto [transport, chunks] = resolve_pipeline(pg, a, o);
  m.ensure_pipeline(pg, o.comm_ctas, chunks, transport);
  if (transport == MoeTransport::copy_engine) {
    const SymLayout layout(R, a.tokens_local, a.hidden, a.topk, dtype_size(a.dtype));
    m.ensure_sym(pg, layout.bytes);
    Call c(pg, m, a, &layout);
    run_pipelined(c, o.comm_ctas, chunks, &layout);
  } else {
    Call c(pg, m, a);
    run_pipelined(c, o.comm_ctas, chunks, nullptr);
  }
}

}  // namespace

namespace {

/// Every rank calls with the same shape, dtype, requested strategy and
/// comm_ctas (before the tuner runs anything collective): one host exchange
/// per new signature, as TpContext does, so a steady-state call has none.
void check_agreement(runtime::ProcessGroup& pg, std::set<TpShape>& agreed, const MoeTpArgs& a, const MoeTpOptions& o) {
  const PipelineChoice pc = resolve_pipeline(pg, a, o);
  const TpShape shape{a.tokens_local,
                      a.hidden,
                      a.inter_local,
                      a.experts,
                      a.topk,
                      static_cast<std::int64_t>(a.dtype),
                      static_cast<std::int64_t>(o.strategy),
                      o.comm_ctas,
                      pc.chunks,
                      static_cast<std::int64_t>(pc.transport)};
  if (agreed.count(shape)) return;
  pg.check_same_on_all_ranks(
      fmt::format("moe_tp: shape (tokens_local {}, hidden {}, inter_local {}, experts {}, topk {}, strategy {}, "
                  "comm_ctas {}, rs_chunks {}, transport {})",
                  a.tokens_local, a.hidden, a.inter_local, a.experts, a.topk, strategy_name(o.strategy), o.comm_ctas,
                  shape.rs_chunks, transport_name(static_cast<MoeTransport>(shape.transport))),
      shape);
  agreed.insert(shape);
}

}  // namespace

Strategy resolve_moe_tp(MoeContext& ctx, const MoeTpArgs& a, const MoeTpOptions& o, TuneReport* report) {
  runtime::ProcessGroup& pg = ctx.group();
  const int R = pg.world();
  validate(a, R);
  validate(o, pg.sm_count());
  check_agreement(pg, ctx.impl().agreed, a, o);
  if (o.strategy != Strategy::automatic) return o.strategy;
  // Nothing to hide at R = 1; the tuner cannot run inside a capture.
  if (R == 1 || runtime::stream_capturing(pg.stream())) return Strategy::sequential;
  MoeContext::Impl& m = ctx.impl();
  const detail::TuneHooks hooks{[&](const char* what) { m.drain(pg, what); },
                                [&](Strategy s) { run_moe_tp(ctx, a, s, o); }};
  // tokens, hidden and inter are compared by ratio for a neighbour's choice;
  // experts, topk, comm_ctas, rs_chunks and the transport are flags.
  const PipelineChoice pc = resolve_pipeline(pg, a, o);
  const detail::TuneQuery q{tune::key_prefix(detail::machine_id(pg), a.dtype, "ops.moe_tp"),
                            {a.tokens_local, a.hidden, a.inter_local, a.experts, a.topk, o.comm_ctas, pc.chunks,
                             static_cast<std::int64_t>(pc.transport)},
                            3,
                            o.use_cache,
                            o.tune_on_miss};
  // Collective and agreed across ranks (the times are maxima over ranks).
  return detail::tune_choice(pg, m.tune, q, moe_tp_candidates(R), hooks, report);
}

void moe_tp(MoeContext& ctx, const MoeTpArgs& a, const MoeTpOptions& o) {
  const Strategy strategy = resolve_moe_tp(ctx, a, o);  // validates and agrees first
  run_moe_tp(ctx, a, strategy, o);
}

void MoeContext::check_status() {
  Impl& m = *impl_;
  if (m.flags_ptr == nullptr) return;
  const cudaStream_t s = pg_->stream();
  std::int32_t invalid = 0;
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(&invalid, m.flags_ptr, sizeof(invalid), cudaMemcpyDeviceToHost, s));
  pg_->synchronize(s, "moe_tp: check_status");
  TESSERA_CHECK(invalid == 0, "moe_tp: {} routed entries had an expert id outside [0, experts) and were left out",
                invalid);
  for (int q = 0; q < m.last_status_shards; ++q) {
    const std::string what = m.last_status_shards > 1 ? fmt::format("moe_tp: shard {} ", q) : std::string("moe_tp: ");
    kernels::check_grouped_gemm_status(m.flags_ptr + status_index(q, false), s,
                                       (what + "gate/up grouped GEMM").c_str());
    kernels::check_grouped_gemm_status(m.flags_ptr + status_index(q, true), s, (what + "down grouped GEMM").c_str());
  }
}

}  // namespace tessera::ops
