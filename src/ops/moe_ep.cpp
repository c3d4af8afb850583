// The expert-parallel MoE layer (tessera/ops/moe_ep.hpp): sequential and
// pipelined strategies over fixed per-rank slabs.
#include "tessera/ops/moe_ep.hpp"

#include <fmt/format.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moe_scratch.hpp"
#include "tessera/kernels/grouped_gemm.hpp"
#include "tessera/kernels/moe_routing.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/signals.hpp"
#include "tessera/runtime/symmetric_heap.hpp"
#include "tessera/signal/overlap_comm.hpp"

namespace tessera::ops {

using detail::Scratch;

namespace {

constexpr std::int64_t kMaxDim = detail::kMoeMaxDim;
constexpr int kStatusBase = 4;  // flags: [0] invalid ids, [1] rows left out, [2] largest slab, [3] unused

/// Status words of slab q's gate/up (second = false) or down GEMM.
int status_index(int q, bool down) { return kStatusBase + (2 * q + (down ? 1 : 0)) * kernels::kGroupedStatusInts; }

/// Compared byte for byte across ranks: all 64-bit, so no padding.
struct EpShape {
  std::int64_t hidden, inter, capacity, experts, topk, dtype, strategy, comm_ctas, transport;
};

/// The transport a pipelined call of `o` uses (the same on every rank).
MoeTransport resolve_ep_transport(runtime::ProcessGroup& pg, const MoeEpOptions& o) {
  if (o.transport != MoeTransport::automatic) return o.transport;
  return pg.lsa_reachable() && !runtime::stream_capturing(pg.stream()) ? MoeTransport::copy_engine : MoeTransport::nccl;
}

/// Flag slots of the copy-engine transport (value = the call's epoch).
constexpr int kSlotDispatch = 0;  ///< a peer's slab and counts for me landed
constexpr int kSlotReturn = 1;    ///< a peer returned my slab's expert output

}  // namespace

struct MoeEpContext::Impl {
  Scratch offsets, sorted, rows, permute_ws, block_counts, slots, recv_counts, send, recv, inter, yexp, ret, flags;
  std::int32_t* flags_ptr = nullptr;  ///< see kStatusBase and status_index
  int last_world = 0;
  bool last_gemms = false;  ///< the last call launched its GEMMs (their status words are valid)
  std::int64_t last_capacity = 0;

  // pipelined: the split communicator and the per-step events.
  detail::PipelineComm pipe;
  // The copy-engine transport: flags, the slabs peers push into, the call's epoch.
  std::unique_ptr<runtime::Signals> data;     ///< kSlotDispatch / kSlotReturn (= epoch)
  std::unique_ptr<runtime::Signals> control;  ///< slot 0: my receive slabs are free again (= epoch)
  runtime::SymBuffer<unsigned char> sym;      ///< [recv slabs | return slabs | recv counts]
  std::uint64_t epoch = 0;
  cudaEvent_t ev_packed = nullptr, ev_ret = nullptr;
  std::vector<cudaEvent_t> ev_recv, ev_done;

  ~Impl() {
    for (cudaEvent_t e : {ev_packed, ev_ret})
      if (e) cudaEventDestroy(e);
    for (auto* v : {&ev_recv, &ev_done})
      for (cudaEvent_t e : *v) cudaEventDestroy(e);
  }

  static cudaEvent_t make_event() {
    cudaEvent_t e = nullptr;
    TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  /// Collective (every rank's first pipelined call, or a new comm_ctas or
  /// transport): the split communicator (nccl) or the flags (copy_engine),
  /// and the per-step events.
  void ensure_pipeline(runtime::ProcessGroup& pg, int ctas, MoeTransport transport) {
    const int R = pg.world();
    if (transport == MoeTransport::nccl) {
      pipe.ensure(pg, ctas, "moe_ep: new pipeline communicator");
    } else {
      TESSERA_CHECK(!runtime::stream_capturing(pg.stream()),
                    "moe_ep: the copy-engine transport cannot be captured into a CUDA graph (its flags carry a "
                    "per-call epoch); use MoeTransport::nccl or automatic");
      TESSERA_CHECK(pg.lsa_reachable(),
                    "moe_ep: the copy-engine transport needs every rank load/store reachable (lsa size {} of {}); "
                    "use MoeTransport::nccl or automatic",
                    pg.lsa_size(), R);
      if (!data) {
        data = std::make_unique<runtime::Signals>(pg, 2);
        control = std::make_unique<runtime::Signals>(pg, 1);
      }
    }
    if (!ev_packed) ev_packed = make_event();
    if (!ev_ret) ev_ret = make_event();
    while (static_cast<int>(ev_recv.size()) < R) ev_recv.push_back(make_event());
    while (static_cast<int>(ev_done.size()) < R) ev_done.push_back(make_event());
  }

  /// Collective: `bytes` of symmetric slabs on every rank (the shapes were
  /// agreed). Growth waits until no peer reads or pushes.
  void ensure_sym(runtime::ProcessGroup& pg, std::size_t bytes) {
    if (!sym.empty() && sym.bytes() >= bytes) return;
    const std::initializer_list<const runtime::Signals*> all{data.get(), control.get()};
    link::synchronize(pg.stream(), all, "moe_ep: symmetric slab growth");
    link::synchronize(pg.comm_stream(0), all, "moe_ep: symmetric slab growth");
    pg.barrier();
    sym = runtime::SymBuffer<unsigned char>();
    sym = runtime::SymBuffer<unsigned char>(pg, bytes);
  }
};

MoeEpContext::MoeEpContext(runtime::ProcessGroup& pg) : pg_(&pg), impl_(std::make_unique<Impl>()) {}
MoeEpContext::~MoeEpContext() {
  // After a peer failure the group is aborted; finalizing the split
  // communicator collectively would then wait for the dead peer.
  if (impl_->pipe.comm && pg_->aborted()) impl_->pipe.comm->abort();
}

std::string_view moe_ep_strategy_name(MoeEpStrategy s) {
  switch (s) {
    case MoeEpStrategy::automatic:
      return "auto";
    case MoeEpStrategy::sequential:
      return "sequential";
    case MoeEpStrategy::pipelined:
      return "pipelined";
  }
  return "?";
}

MoeEpStrategy parse_moe_ep_strategy(std::string_view name) {
  if (name == "auto" || name == "automatic") return MoeEpStrategy::automatic;
  if (name == "sequential") return MoeEpStrategy::sequential;
  if (name == "pipelined") return MoeEpStrategy::pipelined;
  TESSERA_FAIL("moe_ep: unknown strategy '{}' (auto, sequential, pipelined)", name);
}

std::int64_t moe_ep_capacity(const MoeEpArgs& a) { return a.capacity > 0 ? a.capacity : a.tokens_local * a.topk; }

void validate(const MoeEpArgs& a, int world) {
  detail::validate_moe_sizes("moe_ep", world, a.dtype, a.tokens_local, a.hidden, "inter", a.inter, a.experts,
                             kernels::moe::kMaxExperts, a.topk, kernels::moe::kMaxTopK);
  TESSERA_CHECK(a.experts % world == 0, "moe_ep: experts = {} is not a multiple of the world size {}", a.experts,
                world);
  TESSERA_CHECK(a.tokens_local * a.topk < kMaxDim, "moe_ep: tokens_local ({}) * topk ({}) must stay below 2^31",
                a.tokens_local, a.topk);
  TESSERA_CHECK(a.capacity >= 0, "moe_ep: capacity = {} must be >= 0 (0: tokens_local * topk)", a.capacity);
  const std::int64_t cap = moe_ep_capacity(a);
  TESSERA_CHECK(cap < kMaxDim / world, "moe_ep: capacity ({}) * world ({}) must stay below 2^31", cap, world);
  TESSERA_CHECK(cap * world <= (std::int64_t{1} << 60) / (2 * a.hidden + 2 * a.inter),
                "moe_ep: the slabs of {} rows x (2 x hidden {} + 2 x inter {}) overflow 64-bit sizes", cap * world,
                a.hidden, a.inter);
  TESSERA_CHECK(a.x_shard != nullptr && a.out_shard != nullptr, "moe_ep: x_shard and out_shard must be non-null");
  TESSERA_CHECK(a.expert_ids != nullptr && a.weights != nullptr, "moe_ep: expert_ids and weights must be non-null");
  TESSERA_CHECK(a.w_gate_up != nullptr && a.w_down != nullptr, "moe_ep: w_gate_up and w_down must be non-null");
  for (const void* p : {a.x_shard, a.w_gate_up, a.w_down, static_cast<const void*>(a.out_shard)})
    TESSERA_CHECK((reinterpret_cast<std::uintptr_t>(p) & 15u) == 0, "moe_ep: pointer {} is not 16-byte aligned", p);
}

namespace {

// One moe_ep call's pieces: the routing tables, the slabs and the steps
// (route, dispatch, experts, return, combine) both strategies run.
struct EpCall {
  runtime::ProcessGroup& pg;
  MoeEpContext::Impl& m;
  const MoeEpArgs& a;
  const MoeEpOptions& o;
  const int R, rank;
  const cudaStream_t s;
  const std::int64_t cap, H, I, E, El, entries;
  const std::size_t es;
  const ncclDataType_t dt;
  const std::size_t slab_h;  ///< elements of one hidden-wide slab
  kernels::moe::BlockLayoutArgs l;
  unsigned char *send = nullptr, *recv = nullptr, *inter = nullptr, *yexp = nullptr, *ret = nullptr;
  std::int32_t* recv_counts = nullptr;

  bool ce = false;  ///< copy-engine transport: recv, ret and recv_counts live in m.sym

  EpCall(runtime::ProcessGroup& g, MoeEpContext::Impl& impl, const MoeEpArgs& args, const MoeEpOptions& opts,
         std::int64_t capacity)
      : pg(g),
        m(impl),
        a(args),
        o(opts),
        R(g.world()),
        rank(g.rank()),
        s(g.stream()),
        cap(capacity),
        H(args.hidden),
        I(args.inter),
        E(args.experts),
        El(args.experts / g.world()),
        entries(args.tokens_local * args.topk),
        es(dtype_size(args.dtype)),
        dt(runtime::nccl_dtype(args.dtype)),
        slab_h(static_cast<std::size_t>(capacity * args.hidden)) {}

  unsigned char* slab(unsigned char* base, int q, std::int64_t cols) const {
    return base + static_cast<std::size_t>(q) * static_cast<std::size_t>(cap * cols) * es;
  }

  // The copy-engine transport's symmetric buffer: R receive slabs, R return
  // slabs (hidden wide, slot q = rank q's), then R x El receive counts.
  static std::size_t up256(std::size_t v) { return (v + 255) / 256 * 256; }
  std::size_t slabs_bytes() const { return up256(static_cast<std::size_t>(R) * slab_h * es); }
  std::size_t sym_recv() const { return 0; }
  std::size_t sym_ret() const { return slabs_bytes(); }
  std::size_t sym_counts() const { return 2 * slabs_bytes(); }
  std::size_t sym_bytes() const { return sym_counts() + up256(static_cast<std::size_t>(E) * 4) + 256; }

  // 1. Routing: expert sort, slab layout, send slabs.
  void route() {
    const int flag_words = kStatusBase + 2 * R * kernels::kGroupedStatusInts;
    m.flags_ptr = m.flags.get<std::int32_t>(flag_words, pg);
    TESSERA_CUDA_CHECK(cudaMemsetAsync(m.flags_ptr, 0, static_cast<std::size_t>(flag_words) * 4, s));
    kernels::moe::PermuteArgs p;
    p.expert_ids = a.expert_ids;
    p.tokens = a.tokens_local;
    p.experts = a.experts;
    p.k = a.topk;
    p.expert_offsets = m.offsets.get<std::int32_t>(E + 1, pg);
    p.sorted_entry = m.sorted.get<std::int32_t>(entries, pg);
    p.entry_row = m.rows.get<std::int32_t>(entries, pg);
    p.invalid = m.flags_ptr;
    p.workspace_bytes = kernels::moe::permute_workspace_bytes(entries, a.experts);
    p.workspace = m.permute_ws.get(p.workspace_bytes + 16, pg);
    kernels::moe::permute(p, s);

    l.expert_ids = a.expert_ids;
    l.expert_offsets = p.expert_offsets;
    l.entry_row = p.entry_row;
    l.tokens = a.tokens_local;
    l.experts = a.experts;
    l.k = a.topk;
    l.blocks = R;
    l.capacity = cap;
    l.block_counts = m.block_counts.get<std::int32_t>(E, pg);
    l.entry_slot = m.slots.get<std::int32_t>(entries, pg);
    l.overflow = m.flags_ptr + 1;
    kernels::moe::block_layout(l, s);

    const std::int64_t slab_rows = cap * R;
    send = static_cast<unsigned char*>(m.send.get(static_cast<std::size_t>(slab_rows * H) * es + 16, pg));
    inter = static_cast<unsigned char*>(m.inter.get(static_cast<std::size_t>(slab_rows * I) * es + 16, pg));
    yexp = static_cast<unsigned char*>(m.yexp.get(static_cast<std::size_t>(slab_rows * H) * es + 16, pg));
    if (ce) {
      unsigned char* base = m.sym.local();
      recv = base + sym_recv();
      ret = base + sym_ret();
      recv_counts = reinterpret_cast<std::int32_t*>(base + sym_counts());
    } else {
      recv = static_cast<unsigned char*>(m.recv.get(static_cast<std::size_t>(slab_rows * H) * es + 16, pg));
      ret = static_cast<unsigned char*>(m.ret.get(static_cast<std::size_t>(slab_rows * H) * es + 16, pg));
      recv_counts = m.recv_counts.get<std::int32_t>(E, pg);
    }
    kernels::moe::ScatterArgs sc;
    sc.x = a.x_shard;
    sc.ldx = H;
    sc.dst = send;
    sc.ldd = H;
    sc.cols = H;
    sc.entry_slot = l.entry_slot;
    sc.entries = entries;
    sc.k = a.topk;
    sc.dtype = a.dtype;
    kernels::moe::scatter_rows(sc, s);
  }

  // 3. Slab q's grouped GEMMs (gate/up or down); the own slab is read from
  // the send buffer and its output written straight into the return buffer.
  void gemm(int q, bool down, bool beside_comm) const {
    if (cap == 0) return;
    kernels::GroupedGemmArgs g;
    g.group_rows = q == rank ? l.block_counts + rank * El : recv_counts + q * El;
    g.status = m.flags_ptr + status_index(q, down);
    g.groups = El;
    g.max_rows = cap;
    kernels::GroupedGemmOptions go;
    go.max_ctas = beside_comm && !ce ? pg.sm_count() - o.comm_ctas : 0;  // the copy engine takes no SM
    if (!down) {
      g.a = slab(q == rank ? send : recv, q, H);
      g.b = a.w_gate_up;
      g.d = slab(inter, q, I);
      g.n = 2 * I;
      g.k = H;
      go.epilogue = kernels::GroupedEpilogueKind::SwiGLU;
    } else {
      g.a = slab(inter, q, I);
      g.b = a.w_down;
      g.d = slab(q == rank ? ret : yexp, q, H);
      g.n = H;
      g.k = I;
    }
    kernels::grouped_gemm(g, go, s);
  }

  // One exchange step with `to` (sends) and `from` (receives); `data_to` /
  // `data_from` are the slabs, counts_* the per-expert counts (or null).
  void exchange(ncclComm_t comm, cudaStream_t st, int to, const void* data_to, const std::int32_t* counts_to, int from,
                void* data_from, std::int32_t* counts_from) const {
    TESSERA_NCCL_CHECK(ncclGroupStart());
    if (counts_to) TESSERA_NCCL_CHECK(ncclSend(counts_to, static_cast<std::size_t>(El), ncclInt32, to, comm, st));
    if (counts_from) TESSERA_NCCL_CHECK(ncclRecv(counts_from, static_cast<std::size_t>(El), ncclInt32, from, comm, st));
    TESSERA_NCCL_CHECK(ncclSend(data_to, slab_h, dt, to, comm, st));
    TESSERA_NCCL_CHECK(ncclRecv(data_from, slab_h, dt, from, comm, st));
    TESSERA_NCCL_CHECK(ncclGroupEnd());
  }

  // Sequential: dispatch (counts and slabs with every peer, one NCCL group),
  // the experts slab by slab, then the return.
  void run_sequential() const {
    if (R > 1) {
      TESSERA_NCCL_CHECK(ncclGroupStart());
      for (int q = 0; q < R; ++q) {
        if (q == rank) continue;
        TESSERA_NCCL_CHECK(ncclSend(l.block_counts + q * El, static_cast<std::size_t>(El), ncclInt32, q, pg.nccl(), s));
        TESSERA_NCCL_CHECK(ncclRecv(recv_counts + q * El, static_cast<std::size_t>(El), ncclInt32, q, pg.nccl(), s));
        TESSERA_NCCL_CHECK(ncclSend(slab(send, q, H), slab_h, dt, q, pg.nccl(), s));
        TESSERA_NCCL_CHECK(ncclRecv(slab(recv, q, H), slab_h, dt, q, pg.nccl(), s));
      }
      TESSERA_NCCL_CHECK(ncclGroupEnd());
    }
    for (int q = 0; q < R; ++q) {
      gemm(q, false, false);
      gemm(q, true, false);
    }
    if (R > 1) {
      TESSERA_NCCL_CHECK(ncclGroupStart());
      for (int q = 0; q < R; ++q) {
        if (q == rank) continue;
        TESSERA_NCCL_CHECK(ncclSend(slab(yexp, q, H), slab_h, dt, q, pg.nccl(), s));
        TESSERA_NCCL_CHECK(ncclRecv(slab(ret, q, H), slab_h, dt, q, pg.nccl(), s));
      }
      TESSERA_NCCL_CHECK(ncclGroupEnd());
    }
  }

  // Pipelined, step d: send slab to rank + d, receive from rank - d (whose
  // GEMMs run at step d here); the return of step d goes the other way.
  void run_pipelined() const {
    const cudaStream_t cs = pg.comm_stream(0);
    const ncclComm_t comm = m.pipe.get();
    TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_packed, s));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, m.ev_packed, 0));
    for (int d = 1; d < R; ++d) {
      const int to = (rank + d) % R, from = (rank - d + R) % R;
      exchange(comm, cs, to, slab(send, to, H), l.block_counts + to * El, from, slab(recv, from, H),
               recv_counts + from * El);
      TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_recv[d], cs));
    }
    gemm(rank, false, true);  // beside the dispatch
    for (int d = 1; d < R; ++d) {
      const int to = (rank + d) % R, from = (rank - d + R) % R;
      TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, m.ev_recv[d], 0));
      // Alone on the GPU only at R = 2 (the dispatch is done, no return started).
      const bool beside = R > 2;
      gemm(from, false, beside);
      gemm(from, true, beside);
      TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_done[d], s));
      TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, m.ev_done[d], 0));
      exchange(comm, cs, from, slab(yexp, from, H), nullptr, to, slab(ret, to, H), nullptr);
    }
    gemm(rank, true, true);  // beside the last return
    TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_ret, cs));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, m.ev_ret, 0));
  }

  // Pipelined over the copy engine: the same steps as run_pipelined, each
  // transfer a push into the peer's symmetric slab followed by a flag its
  // compute stream waits on. A rank pushes into a peer only after the peer's
  // control flag says it finished the previous call (it reads its receive and
  // return slabs until its combine); every push into a rank in call e is
  // waited on by that rank within call e.
  void run_pipelined_copy_engine() const {
    const cudaStream_t cs = pg.comm_stream(0);
    const std::uint64_t e = ++m.epoch;
    TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_packed, s));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, m.ev_packed, 0));
    for (int d = 1; d < R; ++d) {
      const int to = (rank + d) % R;
      if (e > 1) link::rank_wait(cs, *m.control, to, 0, e - 1);
      unsigned char* peer = m.sym.peer(to);
      link::rank_copy_data(cs, peer + sym_counts() + static_cast<std::size_t>(rank * El) * 4, l.block_counts + to * El,
                           static_cast<std::size_t>(El) * 4);
      link::rank_copy_data(cs, slab(peer + sym_recv(), rank, H), slab(send, to, H), slab_h * es);
      link::rank_notify(cs, *m.data, to, kSlotDispatch, e);
    }
    gemm(rank, false, true);  // beside the dispatch
    for (int d = 1; d < R; ++d) {
      const int from = (rank - d + R) % R;
      link::rank_wait(s, *m.data, from, kSlotDispatch, e);
      gemm(from, false, true);
      gemm(from, true, true);
      TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_done[d], s));
      TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, m.ev_done[d], 0));
      // The expert output of `from`'s slab goes back into its return slab `rank`.
      link::rank_copy_data(cs, slab(m.sym.peer(from) + sym_ret(), rank, H), slab(yexp, from, H), slab_h * es);
      link::rank_notify(cs, *m.data, from, kSlotReturn, e);
    }
    gemm(rank, true, true);  // beside the last return
    for (int d = 1; d < R; ++d) link::rank_wait(s, *m.data, (rank + d) % R, kSlotReturn, e);
    TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_ret, cs));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, m.ev_ret, 0));  // joins the communication stream
  }

  // After the combine (copy engine): my receive and return slabs are free.
  void release_slabs() const {
    for (int p = 0; p < R; ++p)
      if (p != rank) link::rank_notify(s, *m.control, p, 0, m.epoch);
  }

  // 4. Top-k weighted combine from the returned slabs.
  void combine() const {
    kernels::moe::CombineArgs c;
    c.y = ret;
    c.ldy = H;
    c.entry_row = l.entry_slot;
    c.weights = a.weights;
    c.out = a.out_shard;
    c.ldo = H;
    c.tokens = a.tokens_local;
    c.cols = H;
    c.k = a.topk;
    c.dtype = a.dtype;
    kernels::moe::combine(c, s);
  }
};

}  // namespace

void moe_ep(MoeEpContext& ctx, const MoeEpArgs& a, const MoeEpOptions& o) {
  runtime::ProcessGroup& pg = ctx.group();
  const int R = pg.world();
  validate(a, R);
  TESSERA_CHECK(o.comm_ctas >= 1 && o.comm_ctas <= 64 && o.comm_ctas < pg.sm_count(),
                "moe_ep: comm_ctas = {} out of range [1, min(64, SMs - 1 = {})]", o.comm_ctas, pg.sm_count() - 1);
  MoeEpStrategy strategy = o.strategy;
  if (strategy == MoeEpStrategy::automatic) strategy = R > 1 ? MoeEpStrategy::pipelined : MoeEpStrategy::sequential;
  const std::int64_t cap = moe_ep_capacity(a);
  const MoeTransport transport = resolve_ep_transport(pg, o);
  const EpShape shape{a.hidden,
                      a.inter,
                      cap,
                      a.experts,
                      a.topk,
                      static_cast<std::int64_t>(a.dtype),
                      static_cast<std::int64_t>(strategy),
                      o.comm_ctas,
                      static_cast<std::int64_t>(transport)};
  pg.check_same_on_all_ranks(
      fmt::format("moe_ep: shape (hidden {}, inter {}, capacity {}, experts {}, topk {}, strategy {}, comm_ctas {}, "
                  "transport {})",
                  a.hidden, a.inter, cap, a.experts, a.topk, moe_ep_strategy_name(strategy), o.comm_ctas,
                  transport == MoeTransport::copy_engine ? "copy_engine" : "nccl"),
      shape);

  MoeEpContext::Impl& m = ctx.impl();
  const bool pipelined = strategy == MoeEpStrategy::pipelined && R > 1;
  const bool ce = pipelined && transport == MoeTransport::copy_engine;
  if (pipelined) m.ensure_pipeline(pg, o.comm_ctas, transport);
  EpCall call(pg, m, a, o, cap);
  call.ce = ce;
  if (ce) m.ensure_sym(pg, call.sym_bytes());
  call.route();
  if (ce)
    call.run_pipelined_copy_engine();
  else if (pipelined)
    call.run_pipelined();
  else
    call.run_sequential();
  call.combine();
  if (ce) call.release_slabs();
  m.last_world = R;
  m.last_gemms = cap > 0;
  m.last_capacity = cap;
}

void MoeEpContext::check_status() {
  Impl& m = *impl_;
  if (m.flags_ptr == nullptr) return;
  const cudaStream_t s = pg_->stream();
  std::int32_t f[3] = {0, 0, 0};
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(f, m.flags_ptr, sizeof(f), cudaMemcpyDeviceToHost, s));
  pg_->synchronize(s, "moe_ep: check_status");
  std::string problems;
  if (f[0] != 0)
    problems += fmt::format("; {} routed entries had an expert id outside [0, experts) and were left out", f[0]);
  if (f[1] != 0)
    problems += fmt::format(
        "; capacity overflow: {} routed rows did not fit the capacity of {} rows per destination rank (the largest "
        "destination got {}) and were left out of the output; pass capacity >= {}",
        f[1], m.last_capacity, f[2], f[2]);
  TESSERA_CHECK(problems.empty(), "moe_ep: rank {}{}", pg_->rank(), problems);
  if (m.last_gemms) {
    for (int q = 0; q < m.last_world; ++q) {
      const std::string what = fmt::format("moe_ep: slab {} ", q);
      kernels::check_grouped_gemm_status(m.flags_ptr + status_index(q, false), s, (what + "gate/up GEMM").c_str());
      kernels::check_grouped_gemm_status(m.flags_ptr + status_index(q, true), s, (what + "down GEMM").c_str());
    }
  }
}

}  // namespace tessera::ops
