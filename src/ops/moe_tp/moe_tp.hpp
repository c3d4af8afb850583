// src/ops/moe_tp/moe_tp.hpp — what moe_tp's strategies share (moe.cpp): the
// context, one call's buffers and kernels (Call), the copy-engine
// transport's layout, and the strategy registry's types. Each strategy's
// launcher is in its own file here (sequential.cpp, pipelined.cpp) and
// registered in moe.cpp, which dispatches through the registry and takes
// the tuner's candidates from it. Internal to src/ops.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <tuple>
#include <vector>

#include "../moe_scratch.hpp"
#include "../strategy_registry.hpp"
#include "../tuning.hpp"
#include "tessera/kernels/grouped_gemm.hpp"
#include "tessera/kernels/moe_routing.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/ops/moe.hpp"
#include "tessera/ops/plan.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/signals.hpp"
#include "tessera/runtime/symmetric_heap.hpp"
#include "tessera/signal/overlap_comm.hpp"

namespace tessera::ops {

namespace moetp {

inline constexpr int kStatusBase = 2;  // flags: [0] invalid ids, [1] unused

/// Status words of shard q's gate/up (down = false) or down GEMM; the
/// sequential strategy uses q = 0.
inline int status_index(int q, bool down) {
  return kStatusBase + (2 * q + (down ? 1 : 0)) * kernels::kGroupedStatusInts;
}

/// Compared byte for byte across ranks: all 64-bit, so no padding.
struct TpShape {
  std::int64_t tokens_local, hidden, inter_local, experts, topk, dtype, strategy, comm_ctas, rs_chunks, transport;
  bool operator<(const TpShape& o) const {
    return std::tie(tokens_local, hidden, inter_local, experts, topk, dtype, strategy, comm_ctas, rs_chunks,
                    transport) < std::tie(o.tokens_local, o.hidden, o.inter_local, o.experts, o.topk, o.dtype,
                                          o.strategy, o.comm_ctas, o.rs_chunks, o.transport);
  }
};

inline constexpr int kMaxChunks = kMoeMaxRsChunks;  ///< the copy-engine transport's partial-chunk flags

/// A pipelined call's transport and part-2 column chunks, resolved once
/// (the same on every rank: reachability is a property of the group,
/// capture of the call).
struct PipelineChoice {
  MoeTransport transport;
  int chunks;
};
PipelineChoice resolve_pipeline(runtime::ProcessGroup& pg, const MoeTpArgs& a, const MoeTpOptions& o);

}  // namespace moetp

struct MoeContext::Impl {
  detail::Scratch x_full, ids_full, w_full, offsets, counts, sorted, rows, permute_ws, gathered, inter, expert_out,
      partial, recv, flags;
  std::int32_t* flags_ptr = nullptr;  ///< see kStatusBase and status_index
  int last_status_shards = 0;         ///< shards whose GEMM status words the last call wrote (0: none)
  detail::TuneState tune;             ///< automatic's choices and cache
  std::set<moetp::TpShape> agreed;    ///< signatures every rank has confirmed (one host exchange each)

  // pipelined: the split communicator and the per-step events.
  detail::PipelineComm pipe;
  cudaEvent_t ev_start = nullptr;
  std::vector<cudaEvent_t> ev_x;     ///< [R]: AG step d's tokens and routing have arrived (NCCL)
  std::vector<cudaEvent_t> ev_part;  ///< [R * chunks]: step d's partial chunk c is combined
  std::vector<cudaEvent_t> ev_rs;    ///< [chunks]: chunk c of every peer's partial has arrived
  cudaEvent_t ev_comm_done = nullptr;
  cudaEvent_t ev_remote_part1 = nullptr;  ///< copy engine: the side stream's remote sorts and gate/ups are done

  // The copy-engine transport: flags, the buffers peers push into, the call's epoch.
  std::unique_ptr<runtime::Signals> data;     ///< slot 0: a step's tokens landed; 1 + c: partial chunk c (= epoch)
  std::unique_ptr<runtime::Signals> control;  ///< slot 0: my receive buffers are free again (= epoch)
  runtime::SymBuffer<unsigned char> sym;      ///< [x_full | ids_full | w_full | receive slabs], SymLayout
  std::uint64_t epoch = 0;                    ///< copy-engine calls so far (the same on every rank)

  ~Impl() {
    if (ev_start) cudaEventDestroy(ev_start);
    if (ev_comm_done) cudaEventDestroy(ev_comm_done);
    if (ev_remote_part1) cudaEventDestroy(ev_remote_part1);
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
    TESSERA_CHECK(pg.comm_stream_count() >= 1,
                  "moe_tp: the pipelined strategy needs a communication stream (the process group has none)");
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
        data = std::make_unique<runtime::Signals>(pg, 1 + moetp::kMaxChunks);
        control = std::make_unique<runtime::Signals>(pg, 1);
      }
    }
    if (!ev_start) ev_start = make_event();
    if (!ev_comm_done) ev_comm_done = make_event();
    if (!ev_remote_part1) ev_remote_part1 = make_event();
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
      if (pg.comm_stream_count() > 1) link::synchronize(pg.comm_stream(1), all, what);
      return;
    }
    pg.synchronize(pg.stream(), what);
    pg.synchronize(pg.comm_stream(0), what);
  }
};

namespace moetp {

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

/// The per-call buffers and the kernels both strategies share.
struct Call {
  runtime::ProcessGroup& pg;
  MoeContext::Impl& m;
  const MoeTpArgs& a;
  bool fused_gather;  ///< MoeTpOptions::fused_gather
  cudaStream_t s;
  int R, rank;
  std::int64_t Tl, k, H, I, E, per;  ///< per = Tl * k: routed entries of one shard
  std::size_t es;
  unsigned char *x_full, *gathered, *inter, *expert_out, *partial;
  std::int32_t *ids_full, *offsets, *counts, *sorted, *rows;
  float* w_full;
  void* permute_ws;
  std::size_t permute_ws_bytes, shard_ws_bytes;  ///< all of it; shard q's part at q * shard_ws_bytes

  /// `sym`: the gathered tokens and routing live in m.sym (the copy-engine
  /// transport's pushes land there); nullptr: in scratch memory.
  Call(runtime::ProcessGroup& g, MoeContext::Impl& mi, const MoeTpArgs& args, const MoeTpOptions& o,
       const SymLayout* sym = nullptr)
      : pg(g), m(mi), a(args), fused_gather(o.fused_gather), s(g.stream()), R(g.world()), rank(g.rank()) {
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
    // One workspace per shard (the pipelined strategy sorts remote shards on
    // a stream of their own), or one for all of them (sequential).
    shard_ws_bytes = (kernels::moe::permute_workspace_bytes(per, a.experts) + 255) / 256 * 256;
    permute_ws_bytes = std::max(kernels::moe::permute_workspace_bytes(entries, a.experts), R * shard_ws_bytes);
    permute_ws = m.permute_ws.get(permute_ws_bytes + 16, pg);
    gathered = fused_gather
                   ? nullptr
                   : static_cast<unsigned char*>(m.gathered.get(static_cast<std::size_t>(entries * H) * es + 16, pg));
    inter = static_cast<unsigned char*>(m.inter.get(static_cast<std::size_t>(entries * I) * es + 16, pg));
    expert_out = static_cast<unsigned char*>(m.expert_out.get(static_cast<std::size_t>(entries * H) * es + 16, pg));
    partial = static_cast<unsigned char*>(m.partial.get(static_cast<std::size_t>(T * H) * es + 16, pg));
    const int flag_words = kStatusBase + 2 * R * kernels::kGroupedStatusInts;
    m.flags_ptr = m.flags.get<std::int32_t>(flag_words, pg);
    TESSERA_CUDA_CHECK(cudaMemsetAsync(m.flags_ptr, 0, static_cast<std::size_t>(flag_words) * 4, s));
  }

  /// `stream`, or the call's stream where it is null.
  cudaStream_t on(cudaStream_t stream) const { return stream ? stream : s; }

  /// Expert sort of `tokens` tokens' routing `ids` into table slot q
  /// (offsets/counts q, rows from q * per), on `stream` (default: the call's).
  /// Slot q's sort uses the workspace from part q: one shard's fits its
  /// part, so sorts of different shards may run at once; a sort of all
  /// shards (slot 0) uses all of it.
  void permute(const std::int32_t* ids, std::int64_t tokens, int q, cudaStream_t stream = nullptr) {
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
    p.workspace = static_cast<unsigned char*>(permute_ws) + q * shard_ws_bytes;
    kernels::moe::permute(p, on(stream));
  }

  /// Rows of `x` (tokens of table slot q) gathered into the sorted rows from q * per.
  void gather(const void* x, int q, std::int64_t max_rows, cudaStream_t stream = nullptr) {
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
    kernels::moe::gather_rows(g, on(stream));
  }

  /// Part 1 of table slot q: the rows of `x` (x_rows tokens) its sort
  /// routed, through the gate/up GEMM and SwiGLU into inter. With
  /// fused_gather the GEMM's loads read them from x through the sort's entry
  /// table (entry / k = token); else a gather kernel writes them first. On
  /// `stream` (default: the call's); slots write disjoint rows, so part 1 of
  /// different slots may run at once.
  void gate_up(const void* x, std::int64_t x_rows, int q, std::int64_t max_rows, int max_ctas,
               cudaStream_t stream = nullptr) {
    if (max_rows == 0) return;
    kernels::GroupedGemmArgs g = table_args(q, false, max_rows);
    if (fused_gather) {
      if (x_rows == 0) return;  // no tokens: the sort routed nothing
      g.a = x;
      g.lda = H;
      g.a_gather = sorted + q * per;
      g.a_gather_div = k;
      g.a_rows = x_rows;
    } else {
      gather(x, q, max_rows, stream);
      g.a = gathered + static_cast<std::size_t>(q * per * H) * es;
    }
    g.b = a.w_gate_up;
    g.d = inter + static_cast<std::size_t>(q * per * I) * es;
    g.n = 2 * I;
    g.k = H;
    kernels::GroupedGemmOptions go;
    go.max_ctas = max_ctas;
    go.epilogue = kernels::GroupedEpilogueKind::SwiGLU;
    kernels::grouped_gemm(g, go, on(stream));
  }

  /// Part 2's GEMM of table slot q: inter through w_down into expert_out,
  /// output columns [col0, col0 + cols) of hidden (cols 0: all), over at
  /// most max_rows rows; max_ctas 0 = all SMs.
  void down(int q, std::int64_t max_rows, int max_ctas, std::int64_t col0 = 0, std::int64_t cols = 0) {
    if (max_rows == 0) return;
    kernels::GroupedGemmArgs g = table_args(q, true, max_rows);
    // Expert e's rows [col0, col0 + cols) of w_down [E, H, I]: B's groups
    // stay H x I apart; D keeps hidden's row stride.
    g.a = inter + static_cast<std::size_t>(q * per * I) * es;
    g.b = static_cast<const unsigned char*>(a.w_down) + static_cast<std::size_t>(col0 * I) * es;
    g.d = expert_out + static_cast<std::size_t>(q * per * H + col0) * es;
    g.n = cols > 0 ? cols : H;
    g.k = I;
    g.ldd = H;
    g.stride_b = H * I;
    kernels::GroupedGemmOptions go;
    go.max_ctas = max_ctas;
    kernels::grouped_gemm(g, go, s);
  }

  /// What both GEMMs of table slot q take from the sort: its per-expert row
  /// counts, its status words, the row bound.
  kernels::GroupedGemmArgs table_args(int q, bool is_down, std::int64_t max_rows) const {
    kernels::GroupedGemmArgs g;
    g.group_rows = counts + q * E;
    g.status = m.flags_ptr + status_index(q, is_down);
    g.groups = E;
    g.max_rows = max_rows;
    return g;
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

/// The sequential strategy's steps (sequential.cpp); pipelined runs them
/// where it has nothing to overlap.
void run_sequential(Call& c);

/// moe_tp's strategy launcher: enqueues one call on the group's stream;
/// arguments and options validated and agreed on by every rank.
using Launch = void (*)(MoeContext& ctx, const MoeTpArgs& a, const MoeTpOptions& o);
using Entry = detail::StrategyEntry<Launch>;
using Registry = detail::StrategyRegistry<Launch>;

/// The strategies (one file each).
extern const Entry sequential;
extern const Entry pipelined;

}  // namespace moetp

/// moe_tp's registry (moe.cpp).
const moetp::Registry& moe_tp_registry();

}  // namespace tessera::ops
