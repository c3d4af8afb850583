// src/ops/moe_ep/moe_ep.hpp — what moe_ep's strategies share (moe_ep.cpp):
// the context, one call's pieces (EpCall: routing, slabs, the expert GEMMs,
// the combine) and the strategy registry's types. Each strategy is in its
// own file here (sequential.cpp, pipelined.cpp) and registered in
// moe_ep.cpp, which dispatches through the registry. Internal to src/ops.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "../moe_scratch.hpp"
#include "../strategy_registry.hpp"
#include "tessera/kernels/grouped_gemm.hpp"
#include "tessera/kernels/moe_routing.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/ops/moe_ep.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/signals.hpp"
#include "tessera/runtime/symmetric_heap.hpp"
#include "tessera/signal/overlap_comm.hpp"

namespace tessera::ops {

namespace moeep {

inline constexpr int kStatusBase = 4;  // flags: [0] invalid ids, [1] rows left out, [2] largest slab, [3] unused

/// Status words of slab q's gate/up (second = false) or down GEMM.
inline int status_index(int q, bool down) {
  return kStatusBase + (2 * q + (down ? 1 : 0)) * kernels::kGroupedStatusInts;
}

/// Flag slots of the copy-engine transport (value = the call's epoch).
inline constexpr int kSlotDispatch = 0;  ///< a peer's slab and counts for me landed
inline constexpr int kSlotReturn = 1;    ///< a peer returned my slab's expert output

}  // namespace moeep

struct MoeEpContext::Impl {
  detail::Scratch offsets, sorted, rows, permute_ws, block_counts, slots, recv_counts, send, recv, inter, yexp, ret,
      flags;
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
    TESSERA_CHECK(pg.comm_stream_count() >= 1,
                  "moe_ep: the pipelined strategy needs a communication stream (the process group has none)");
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

namespace moeep {
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
  // the experts slab by slab, then the return (moe_ep/sequential.cpp).
  void run_sequential() const;
  // Pipelined, over NCCL and over the copy engine (moe_ep/pipelined.cpp).
  void run_pipelined() const;
  void run_pipelined_copy_engine() const;

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

/// moe_ep's strategy launcher: enqueues one call on the group's stream;
/// arguments and options validated and agreed on by every rank, `transport`
/// resolved (the pipelined strategy's).
using Launch = void (*)(MoeEpContext& ctx, const MoeEpArgs& a, const MoeEpOptions& o, MoeTransport transport);
using Entry = detail::StrategyEntry<Launch>;
using Registry = detail::StrategyRegistry<Launch>;

/// The strategies (one file each).
extern const Entry sequential;
extern const Entry pipelined;

}  // namespace moeep

/// moe_ep's registry (moe_ep.cpp).
const moeep::Registry& moe_ep_registry();

}  // namespace tessera::ops
