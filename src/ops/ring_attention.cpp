// Ring attention over zig-zag shards (ring_attention.hpp describes the plan,
// the strategies and the flag protocol).
#include "tessera/ops/ring_attention.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <set>
#include <vector>

#include "scratch.hpp"
#include "seq_parallel_detail.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/kernels/attention_merge.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/signals.hpp"
#include "tessera/runtime/symmetric_heap.hpp"

namespace tessera::ops {

struct RingAttnContext::Impl {
  explicit Impl(runtime::ProcessGroup& g) : pg(g) {
    TESSERA_CHECK(pg.world() <= runtime::kMaxPeers, "ring_attention: world {} > {}", pg.world(), runtime::kMaxPeers);
    TESSERA_CHECK(pg.comm_stream_count() >= 1, "ring_attention: the process group has no communication stream");
    lsa = pg.world() > 1 && pg.lsa_reachable();
    if (lsa) {
      data = std::make_unique<runtime::Signals>(pg, 1);
      control = std::make_unique<runtime::Signals>(pg, 1);
    }
    TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&ev_ready, cudaEventDisableTiming));
  }
  ~Impl() {
    if (ev_ready) cudaEventDestroy(ev_ready);
    for (cudaEvent_t ev : ev_push) cudaEventDestroy(ev);
    for (cudaEvent_t ev : ev_attend) cudaEventDestroy(ev);
  }

  runtime::ProcessGroup& pg;
  bool lsa = false;                           ///< R > 1 and every rank load/store reachable
  int ring_world = 0;                         ///< the ring size of the calls so far (0: none yet)
  std::unique_ptr<runtime::Signals> data;     ///< from rank r+1: shard of step j landed (stamp)
  std::unique_ptr<runtime::Signals> control;  ///< from rank r-1: done with step j's slot (stamp)
  runtime::SymBuffer<unsigned char> ws;       ///< lsa: 2 slots of (K, V) shards
  /// Accumulator, partial result; without lsa the slots too.
  detail::ScratchBuffer scratch{"ring_attention: scratch growth"};
  std::uint64_t epoch = 0;
  cudaEvent_t ev_ready = nullptr;
  std::vector<cudaEvent_t> ev_push;             ///< per step: its forward is done
  std::vector<cudaEvent_t> ev_attend;           ///< per step: its attention is done (overlapped without lsa)
  std::set<detail::ZigzagSignature> validated;  ///< shapes and strategies already checked across ranks

  void ensure_events(int n) {
    for (std::vector<cudaEvent_t>* evs : {&ev_push, &ev_attend})
      while (static_cast<int>(evs->size()) < n) {
        cudaEvent_t ev = nullptr;
        TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        evs->push_back(ev);
      }
  }
};

RingAttnContext::RingAttnContext(runtime::ProcessGroup& pg) : impl_(std::make_unique<Impl>(pg)) {}
RingAttnContext::~RingAttnContext() = default;

namespace {

std::size_t align256(std::size_t n) { return (n + 255) / 256 * 256; }

/// Byte sizes of one call's buffers (rank-independent).
struct Sizes {
  std::size_t kv_shard;  ///< one of K, V: [B, 2C, Hkv, D]
  std::size_t o_acc;     ///< float32 [B, 2C, Hq, D]
  std::size_t lse;       ///< float32 [B, Hq, 2C]
  std::size_t o_part;    ///< dtype [B, 2C, Hq, D]
  std::size_t slots() const { return 4 * kv_shard; }
  std::size_t scratch(bool with_slots) const {
    return align256(o_acc) + 2 * align256(lse) + align256(o_part) + (with_slots ? align256(slots()) : 0);
  }
};

Sizes sizes(const RingAttnArgs& a, int world) {
  const std::int64_t L = a.seq / world;
  const std::size_t es = dtype_size(a.dtype);
  Sizes s{};
  s.kv_shard = static_cast<std::size_t>(a.batch * L * a.heads_kv * a.head_dim) * es;
  s.o_acc = static_cast<std::size_t>(a.batch * L * a.heads_q * a.head_dim) * 4;
  s.lse = static_cast<std::size_t>(a.batch * a.heads_q * L) * 4;
  s.o_part = static_cast<std::size_t>(a.batch * L * a.heads_q * a.head_dim) * es;
  return s;
}

}  // namespace

namespace detail {

void ring_attend(const RingAttnArgs& a, int world, const RingAttnPlan::Step& s, const void* k, const void* v, void* o,
                 float* lse, cudaStream_t stream) {
  const std::int64_t L = a.seq / world;
  const std::size_t q_row = static_cast<std::size_t>(a.heads_q * a.head_dim) * dtype_size(a.dtype);
  kernels::AttentionArgs ka;
  ka.q = static_cast<const unsigned char*>(a.q) + s.row0 * q_row;
  ka.o = static_cast<unsigned char*>(o) + s.row0 * q_row;
  ka.k = k;
  ka.v = v;
  ka.batch = a.batch;
  ka.seqlen_q = s.rows;
  ka.seqlen_k = s.kv_len;
  ka.heads_q = a.heads_q;
  ka.heads_kv = a.heads_kv;
  ka.head_dim = a.head_dim;
  ka.q_stride = ka.o_stride = {L * a.heads_q * a.head_dim, a.heads_q * a.head_dim, a.head_dim};
  ka.k_stride = ka.v_stride = {L * a.heads_kv * a.head_dim, a.heads_kv * a.head_dim, a.head_dim};
  ka.dtype = a.dtype;
  ka.causal = s.causal;
  ka.q_offset = 0;
  ka.softmax_scale = a.softmax_scale;
  if (lse) {
    ka.lse = lse + s.row0;
    ka.lse_batch_stride = a.heads_q * L;
    ka.lse_head_stride = L;
  }
  kernels::attention(ka, stream);
}

void ring_merge(const RingAttnArgs& a, const RingAttnPlan& plan, int j, float* o_acc, float* lse_acc,
                const void* o_part, const float* lse_part, cudaStream_t stream) {
  const RingAttnPlan::Step& s = plan.steps[j];
  const std::int64_t L = 2 * plan.chunk;
  const bool last = j == plan.world - 1;
  kernels::AttentionMergeArgs m;
  m.o_acc = o_acc;
  m.lse_acc = lse_acc;
  m.o_part = o_part;
  m.lse_part = lse_part;
  m.init = j == 0;
  m.write_acc = !last;
  m.o_out = last ? a.o : nullptr;
  m.lse_out = last ? a.lse : nullptr;
  m.batch = a.batch;
  m.seq = L;
  m.heads = a.heads_q;
  m.head_dim = a.head_dim;
  m.row0 = s.row0;
  m.rows = s.rows;
  m.dtype = a.dtype;
  kernels::attention_merge(m, stream);
  if (last) {  // rows this step did not see: the accumulator, rounded once
    m.o_part = nullptr;
    m.lse_part = nullptr;
    m.row0 = 0;
    m.rows = s.row0;
    kernels::attention_merge(m, stream);
    m.row0 = s.row0 + s.rows;
    m.rows = L - m.row0;
    kernels::attention_merge(m, stream);
  }
}

}  // namespace detail

std::size_t ring_attention_workspace_bytes(const RingAttnArgs& a, int world) {
  if (world <= 1) return 0;
  return sizes(a, world).scratch(true);
}

void ring_attention(RingAttnContext& ctx, const RingAttnArgs& a, RingStrategy strategy) {
  RingAttnContext::Impl& c = ctx.impl();
  TESSERA_CHECK(strategy == RingStrategy::sequential || strategy == RingStrategy::overlapped,
                "ring_attention: strategy code {} (sequential or overlapped)", static_cast<int>(strategy));
  detail::validate_zigzag(c.pg, a, "ring_attention", static_cast<int>(strategy),
                          strategy == RingStrategy::sequential ? "sequential" : "overlapped", c.validated);
  std::vector<int> all(static_cast<std::size_t>(c.pg.world()));
  for (int p = 0; p < c.pg.world(); ++p) all[static_cast<std::size_t>(p)] = p;
  detail::ring_attention_among(ctx, a, strategy, all);
}

namespace detail {

void ring_attention_among(RingAttnContext& ctx, const RingAttnArgs& a, RingStrategy strategy,
                          const std::vector<int>& ring) {
  RingAttnContext::Impl& c = ctx.impl();
  const int R = static_cast<int>(ring.size());
  const auto me = std::find(ring.begin(), ring.end(), c.pg.rank());
  TESSERA_CHECK(R >= 1 && me != ring.end(), "ring_attention: rank {} is not in its ring of {} ranks", c.pg.rank(), R);
  // Stamps count steps of this ring's size: one context serves one ring size.
  TESSERA_CHECK(c.ring_world == 0 || c.ring_world == R,
                "ring_attention: a context used for rings of {} ranks cannot run a ring of {} (one context per ring "
                "size)",
                c.ring_world, R);
  c.ring_world = R;
  const int rank = static_cast<int>(me - ring.begin());
  const RingAttnPlan plan = plan_ring_attention(a.seq, R, rank, a.causal);
  const int send_to = ring[static_cast<std::size_t>(plan.send_to)];  // global ranks of the ring neighbours
  const int recv_from = ring[static_cast<std::size_t>(plan.recv_from)];
  cudaStream_t st = c.pg.stream();

  if (R == 1) {  // one step, nothing to merge
    detail::ring_attend(a, R, plan.steps[0], a.k, a.v, a.o, a.lse, st);
    return;
  }

  const Sizes sz = sizes(a, R);
  // NCCL receives (sequential, or overlapped without load/store reach) land
  // in local scratch slots, never in the symmetric window: a window buffer
  // is registered with NCCL, and point-to-point receives into one from
  // unregistered send buffers are not a path this operator relies on. Only
  // the copy-engine pushes of overlapped use the window.
  const bool window_slots = c.lsa && strategy == RingStrategy::overlapped;
  unsigned char* scr = static_cast<unsigned char*>(c.scratch.get(sz.scratch(!window_slots), c.pg));
  float* o_acc = reinterpret_cast<float*>(scr);
  float* lse_acc = reinterpret_cast<float*>(scr + align256(sz.o_acc));
  float* lse_part = reinterpret_cast<float*>(scr + align256(sz.o_acc) + align256(sz.lse));
  void* o_part = scr + align256(sz.o_acc) + 2 * align256(sz.lse);
  unsigned char* slots = nullptr;
  if (window_slots) {
    detail::grow_symmetric(c.ws, sz.slots(), c.pg, {c.data.get(), c.control.get()}, "ring_attention: workspace growth");
    slots = c.ws.local();
  } else {
    slots = scr + align256(sz.o_acc) + 2 * align256(sz.lse) + align256(sz.o_part);
  }
  const std::uint64_t e = ++c.epoch;
  // Slot s holds K at slot_k(s), V right after it; step j >= 1 reads slot j % 2.
  auto slot_k = [&](unsigned char* base, int s) { return base + static_cast<std::size_t>(s) * 2 * sz.kv_shard; };
  auto held_k = [&](int j) -> const void* { return j == 0 ? a.k : slot_k(slots, j % 2); };
  auto held_v = [&](int j) -> const void* { return j == 0 ? a.v : slot_k(slots, j % 2) + sz.kv_shard; };

  cudaStream_t cs = c.pg.comm_stream(0);
  c.ensure_events(R);
  for (const detail::RingOp& op : detail::ring_schedule(plan, strategy, e, c.lsa)) {
    cudaStream_t s = op.comm ? cs : st;
    const int j = op.step;
    switch (op.kind) {
      case detail::RingOp::record_ready:
        TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_ready, s));
        break;
      case detail::RingOp::wait_ready:
        TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, c.ev_ready, 0));
        break;
      case detail::RingOp::wait_data:
        link::rank_wait(s, *c.data, recv_from, 0, op.value);
        break;
      case detail::RingOp::wait_control:
        link::rank_wait(s, *c.control, send_to, 0, op.value);
        break;
      case detail::RingOp::push: {
        unsigned char* dst = slot_k(c.ws.peer(send_to), (j + 1) % 2);
        link::rank_copy_data(s, dst, held_k(j), sz.kv_shard);
        link::rank_copy_data(s, dst + sz.kv_shard, held_v(j), sz.kv_shard);
        break;
      }
      case detail::RingOp::notify_data:
        link::rank_notify(s, *c.data, send_to, 0, op.value);
        break;
      case detail::RingOp::record_push:
        TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_push[j], s));
        break;
      case detail::RingOp::wait_push:
        TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, c.ev_push[j], 0));
        break;
      case detail::RingOp::exchange: {  // the held shard to rank r-1, the next one from rank r+1
        unsigned char* next = slot_k(slots, (j + 1) % 2);
        TESSERA_NCCL_CHECK(ncclGroupStart());
        TESSERA_NCCL_CHECK(ncclSend(held_k(j), sz.kv_shard, ncclUint8, send_to, c.pg.nccl(), s));
        TESSERA_NCCL_CHECK(ncclSend(held_v(j), sz.kv_shard, ncclUint8, send_to, c.pg.nccl(), s));
        TESSERA_NCCL_CHECK(ncclRecv(next, sz.kv_shard, ncclUint8, recv_from, c.pg.nccl(), s));
        TESSERA_NCCL_CHECK(ncclRecv(next + sz.kv_shard, sz.kv_shard, ncclUint8, recv_from, c.pg.nccl(), s));
        TESSERA_NCCL_CHECK(ncclGroupEnd());
        break;
      }
      case detail::RingOp::attend:
        detail::ring_attend(a, R, plan.steps[j], held_k(j), held_v(j), o_part, lse_part, s);
        detail::ring_merge(a, plan, j, o_acc, lse_acc, o_part, lse_part, s);
        break;
      case detail::RingOp::notify_control:
        link::rank_notify(s, *c.control, recv_from, 0, op.value);
        break;
      case detail::RingOp::record_attend:
        TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_attend[j], s));
        break;
      case detail::RingOp::wait_attend:
        TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, c.ev_attend[j], 0));
        break;
    }
  }
}

}  // namespace detail

}  // namespace tessera::ops
