// Ulysses attention over zig-zag shards (ulysses_attention.hpp).
#include "tessera/ops/ulysses_attention.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "scratch.hpp"
#include "seq_parallel_detail.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops {

struct UlyssesAttnContext::Impl {
  explicit Impl(runtime::ProcessGroup& g) : pg(g) {
    TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&ev_ready, cudaEventDisableTiming));
    TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&ev_done, cudaEventDisableTiming));
  }
  ~Impl() {
    for (cudaEvent_t ev : ev_in) cudaEventDestroy(ev);
    for (cudaEvent_t ev : ev_attn) cudaEventDestroy(ev);
    if (ev_ready) cudaEventDestroy(ev_ready);
    if (ev_done) cudaEventDestroy(ev_done);
  }

  runtime::ProcessGroup& pg;
  /// Head-shard Q, K, V, O, LSE; send and receive staging. The pipelined
  /// strategy's exchanges run on the communication stream.
  detail::ScratchBuffer scratch{"ulysses_attention: scratch growth", detail::ScratchBuffer::Drain::all_streams};
  cudaEvent_t ev_ready = nullptr, ev_done = nullptr;
  std::vector<cudaEvent_t> ev_in, ev_attn;  ///< per head group: inputs unpacked / attention done
  std::set<detail::UlyssesSignature> validated;

  void ensure_events(int groups) {
    while (static_cast<int>(ev_in.size()) < groups) {
      cudaEvent_t a = nullptr, b = nullptr;
      TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&a, cudaEventDisableTiming));
      ev_in.push_back(a);
      TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&b, cudaEventDisableTiming));
      ev_attn.push_back(b);
    }
  }
};

UlyssesAttnContext::UlyssesAttnContext(runtime::ProcessGroup& pg) : impl_(std::make_unique<Impl>(pg)) {}
UlyssesAttnContext::~UlyssesAttnContext() = default;

namespace {

std::size_t align256(std::size_t n) { return (n + 255) / 256 * 256; }

void check_heads(const UlyssesAttnArgs& a, int world) {
  TESSERA_CHECK(a.heads_kv >= 1 && a.heads_q % a.heads_kv == 0,
                "ulysses_attention: heads_q = {} is not a multiple of heads_kv = {} (GQA needs whole query groups)",
                a.heads_q, a.heads_kv);
  TESSERA_CHECK(a.heads_q >= 1 && a.heads_q % world == 0,
                "ulysses_attention: heads_q = {} is not a multiple of world = {} (heads are sharded over ranks)",
                a.heads_q, world);
  TESSERA_CHECK(a.heads_kv >= 1 && a.heads_kv % world == 0,
                "ulysses_attention: heads_kv = {} is not a multiple of world = {} (GQA: the KV heads are sharded "
                "over ranks too)",
                a.heads_kv, world);
}

void validate(UlyssesAttnContext::Impl& c, const UlyssesAttnArgs& a, int groups) {
  const int R = c.pg.world();
  // Not captured: the staging buffers grow on demand and the streams fork
  // and join per call; capture is left to a later change with its test.
  TESSERA_CHECK(!runtime::stream_capturing(c.pg.stream()),
                "ulysses_attention: cannot be captured into a CUDA graph yet; call it eagerly");
  TESSERA_CHECK(a.seq >= 2 * R && a.seq % (2 * R) == 0,
                "ulysses_attention: seq = {} must be a positive multiple of 2 x world = {} (zig-zag chunks)", a.seq,
                2 * R);
  check_heads(a, R);
  kernels::AttentionArgs k;  // the kernel's checks on the head-shard problem
  k.q = a.q;
  k.k = a.k;
  k.v = a.v;
  k.o = a.o;
  k.batch = a.batch;
  k.seqlen_q = k.seqlen_k = a.seq;
  k.heads_q = a.heads_q / R / groups;
  k.heads_kv = a.heads_kv / R / groups;
  k.head_dim = a.head_dim;
  k.dtype = a.dtype;
  k.causal = a.causal;
  k.softmax_scale = a.softmax_scale;
  kernels::validate(k, "ulysses_attention");
  detail::agree_ulysses(a, groups, c.validated, [&c](const std::string& what, const void* data, std::size_t n) {
    c.pg.check_same_on_all_ranks(what, data, n);
  });
}

}  // namespace

namespace detail {

void agree_ulysses(const UlyssesAttnArgs& a, int groups, std::set<UlyssesSignature>& agreed,
                   const CheckSameOnAllRanks& check_same) {
  static_assert(std::has_unique_object_representations_v<UlyssesSignature>, "compared byte-wise across ranks");
  const UlyssesSignature sig{
      a.batch, a.seq, a.heads_q, a.heads_kv, a.head_dim, static_cast<int>(a.dtype) * 2 + a.causal, groups};
  if (agreed.count(sig)) return;
  check_same(fmt::format("ulysses_attention: shapes (batch {}, seq {}, heads {}/{}, head_dim {}, dtype {}, causal {}, "
                         "head groups {})",
                         a.batch, a.seq, a.heads_q, a.heads_kv, a.head_dim, dtype_name(a.dtype), a.causal, groups),
             sig.data(), sizeof sig);
  agreed.insert(sig);
}

}  // namespace detail

int ulysses_head_groups(const UlyssesAttnArgs& a, int world, UlyssesStrategy s, int requested) {
  check_heads(a, world);
  const std::int64_t kv_local = a.heads_kv / world;
  if (s == UlyssesStrategy::sequential) return 1;
  if (requested > 0) {
    TESSERA_CHECK(kv_local % requested == 0,
                  "ulysses_attention: head_groups = {} does not divide heads_kv / world = {}", requested, kv_local);
    return requested;
  }
  TESSERA_CHECK(requested == 0, "ulysses_attention: head_groups = {} must be >= 0", requested);
  for (int g = 4; g > 1; --g)
    if (kv_local % g == 0) return g;
  return 1;
}

std::size_t ulysses_attention_workspace_bytes(const UlyssesAttnArgs& a, int world, int groups) {
  if (world <= 1) return 0;
  check_heads(a, world);
  return detail::ulysses_rank(a, world, 0, groups).layout().total;
}

void ulysses_attention(UlyssesAttnContext& ctx, const UlyssesAttnArgs& a, UlyssesStrategy strategy, int head_groups) {
  UlyssesAttnContext::Impl& c = ctx.impl();
  const int R = c.pg.world(), rank = c.pg.rank();
  const int G = ulysses_head_groups(a, R, strategy, head_groups);
  validate(c, a, G);
  cudaStream_t st = c.pg.stream();
  if (R == 1) {  // the shard is the whole sequence in order
    kernels::AttentionArgs k;
    k.q = a.q;
    k.k = a.k;
    k.v = a.v;
    k.o = a.o;
    k.lse = a.lse;
    k.batch = a.batch;
    k.seqlen_q = k.seqlen_k = a.seq;
    k.heads_q = a.heads_q;
    k.heads_kv = a.heads_kv;
    k.head_dim = a.head_dim;
    k.dtype = a.dtype;
    k.causal = a.causal;
    k.softmax_scale = a.softmax_scale;
    kernels::attention(k, st);
    return;
  }

  detail::UlyssesRank u = detail::ulysses_rank(a, R, rank, G);
  u.place(c.scratch.get(u.layout().total, c.pg));
  c.ensure_events(G);

  std::vector<int> all(static_cast<std::size_t>(R));  // the all-to-all's group: every rank
  for (int p = 0; p < R; ++p) all[static_cast<std::size_t>(p)] = p;
  auto exchange = [&](const std::vector<detail::UlyssesRank::Transfer>& ts, cudaStream_t s) {
    detail::ulysses_exchange(c.pg.nccl(), ts, all, s);
  };
  auto all_to_all_in = [&](int g, cudaStream_t s) {
    const detail::Copy2d copy = detail::stream_copy2d(s);
    detail::ulysses_pack_in(u, a, g, copy);
    exchange(u.transfers_in(g), s);
    detail::ulysses_unpack_in(u, g, copy);
  };
  auto all_to_all_out = [&](int g, cudaStream_t s) {
    const detail::Copy2d copy = detail::stream_copy2d(s);
    detail::ulysses_pack_out(u, a, g, copy);
    exchange(u.transfers_out(g, a.lse != nullptr), s);
    detail::ulysses_unpack_out(u, a, g, copy);
  };

  if (G == 1) {  // sequential (always one group), or nothing to pipeline
    all_to_all_in(0, st);
    detail::ulysses_attend(u, a, 0, st);
    all_to_all_out(0, st);
    return;
  }
  // Pipelined: the communication stream runs in(0), then per g in(g+1) and
  // out(g) (after attend(g)); the compute stream attends group g once in(g)
  // is unpacked. The staging buffers are reused in that stream's order.
  cudaStream_t cs = c.pg.comm_stream(0);
  TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_ready, st));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, c.ev_ready, 0));
  all_to_all_in(0, cs);
  TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_in[0], cs));
  for (int g = 0; g < G; ++g) {
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(st, c.ev_in[g], 0));
    detail::ulysses_attend(u, a, g, st);
    TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_attn[g], st));
    if (g + 1 < G) {
      all_to_all_in(g + 1, cs);
      TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_in[g + 1], cs));
    }
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, c.ev_attn[g], 0));
    all_to_all_out(g, cs);
  }
  TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_done, cs));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(st, c.ev_done, 0));
}

namespace detail {

namespace {

/// Global chunk of peer p's local chunk i.
std::int64_t chunk_of(const UlyssesRank& u, int p, int i) { return i == 0 ? p : 2 * u.world - 1 - p; }

/// The three input tensors of a group: source shard, head shard, heads.
struct InTensor {
  const void* src;
  unsigned char* full;
  std::int64_t heads, local, group;
  std::size_t off, blk;  ///< staging: the tensor's first block, bytes per peer
};

}  // namespace

void ulysses_exchange(ncclComm_t comm, const std::vector<UlyssesRank::Transfer>& ts, const std::vector<int>& peers,
                      cudaStream_t s) {
  TESSERA_NCCL_CHECK(ncclGroupStart());
  for (const UlyssesRank::Transfer& t : ts) {
    const int peer = peers.at(static_cast<std::size_t>(t.peer));
    TESSERA_NCCL_CHECK(ncclSend(t.send, t.bytes, ncclUint8, peer, comm, s));
    TESSERA_NCCL_CHECK(ncclRecv(t.recv, t.bytes, ncclUint8, peer, comm, s));
  }
  TESSERA_NCCL_CHECK(ncclGroupEnd());
}

Copy2d stream_copy2d(cudaStream_t s) {
  return [s](void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width, std::size_t rows) {
    if (rows == 0 || width == 0) return;
    TESSERA_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault, s));
  };
}

UlyssesRank ulysses_rank(const UlyssesAttnArgs& a, int world, int rank, int groups) {
  UlyssesRank u;
  u.world = world;
  u.rank = rank;
  u.groups = groups;
  u.B = a.batch;
  u.S = a.seq;
  u.C = a.seq / (2 * world);
  u.L = 2 * u.C;
  u.D = a.head_dim;
  u.H = a.heads_q;
  u.Hkv = a.heads_kv;
  u.Hl = u.H / world;
  u.Hkvl = u.Hkv / world;
  u.Hg = u.Hl / groups;
  u.Hkvg = u.Hkvl / groups;
  u.hrow = static_cast<std::size_t>(u.D) * dtype_size(a.dtype);
  u.blk_q = static_cast<std::size_t>(u.B * u.L * u.Hg) * u.hrow;
  u.blk_kv = static_cast<std::size_t>(u.B * u.L * u.Hkvg) * u.hrow;
  u.blk_lse = static_cast<std::size_t>(u.B * u.Hg * u.L) * 4;
  return u;
}

namespace {

/// Staging offsets: the in direction holds Q, K, V blocks of every peer, the
/// out direction O and LSE blocks.
struct Staging {
  std::size_t in_k, in_v, in_end, out_lse, out_end;
};
Staging staging(const UlyssesRank& u) {
  Staging s{};
  s.in_k = align256(u.world * u.blk_q);
  s.in_v = s.in_k + align256(u.world * u.blk_kv);
  s.in_end = s.in_v + align256(u.world * u.blk_kv);
  s.out_lse = align256(u.world * u.blk_q);
  s.out_end = s.out_lse + align256(u.world * u.blk_lse);
  return s;
}

/// Group g of a group-major head-shard tensor with n heads per group.
unsigned char* group_base(const UlyssesRank& u, unsigned char* full, std::int64_t n, int g) {
  return full + static_cast<std::size_t>(g * u.B * u.S * n) * u.hrow;
}

}  // namespace

UlyssesRank::Layout UlyssesRank::layout() const {
  const std::size_t tokens = static_cast<std::size_t>(B * S);  // = world peers x [B, 2C]
  const std::size_t q = tokens * Hl * hrow, kv = tokens * Hkvl * hrow, lse = tokens * Hl * 4;
  const Staging st = staging(*this);
  const std::size_t stage = std::max(st.in_end, st.out_end);
  Layout l{};
  l.off_k = align256(q);
  l.off_v = l.off_k + align256(kv);
  l.off_o = l.off_v + align256(kv);
  l.off_lse = l.off_o + align256(q);
  l.off_send = l.off_lse + align256(lse);
  l.off_recv = l.off_send + stage;
  l.total = l.off_recv + stage;
  return l;
}

void UlyssesRank::place(void* base) {
  unsigned char* b = static_cast<unsigned char*>(base);
  const Layout l = layout();
  fq = b;
  fk = b + l.off_k;
  fv = b + l.off_v;
  fo = b + l.off_o;
  flse = reinterpret_cast<float*>(b + l.off_lse);
  send = b + l.off_send;
  recv = b + l.off_recv;
}

std::vector<UlyssesRank::Transfer> UlyssesRank::transfers_in(int g) const {
  const Staging st = staging(*this);
  struct T {
    std::size_t off, blk;
    unsigned char* full;
    std::int64_t n;
  };
  const T ts[3] = {{0, blk_q, fq, Hg}, {st.in_k, blk_kv, fk, Hkvg}, {st.in_v, blk_kv, fv, Hkvg}};
  std::vector<Transfer> out;
  for (const T& t : ts)
    for (int p = 0; p < world; ++p) {
      const unsigned char* blk = send + t.off + p * t.blk;
      if (direct()) {  // each chunk of p straight to its global rows
        const std::size_t chunk = static_cast<std::size_t>(C * t.n) * hrow;
        for (int i = 0; i < 2; ++i)
          out.push_back({p, blk + i * chunk, group_base(*this, t.full, t.n, g) + chunk_of(*this, p, i) * chunk, chunk});
      } else {
        out.push_back({p, blk, recv + t.off + p * t.blk, t.blk});
      }
    }
  return out;
}

std::vector<UlyssesRank::Transfer> UlyssesRank::transfers_out(int g, bool lse) const {
  const Staging st = staging(*this);
  std::vector<Transfer> out;
  for (int p = 0; p < world; ++p) {
    if (direct()) {  // p's two chunks of my heads straight from the head shard
      const std::size_t chunk = static_cast<std::size_t>(C * Hg) * hrow;
      for (int i = 0; i < 2; ++i)
        out.push_back(
            {p, group_base(*this, fo, Hg, g) + chunk_of(*this, p, i) * chunk, recv + p * blk_q + i * chunk, chunk});
    } else {
      out.push_back({p, send + p * blk_q, recv + p * blk_q, blk_q});
    }
    if (lse) out.push_back({p, send + st.out_lse + p * blk_lse, recv + st.out_lse + p * blk_lse, blk_lse});
  }
  return out;
}

void ulysses_pack_in(const UlyssesRank& u, const UlyssesAttnArgs& a, int g, const Copy2d& copy) {
  const Staging st = staging(u);
  const InTensor ts[3] = {{a.q, u.fq, u.H, u.Hl, u.Hg, 0, u.blk_q},
                          {a.k, u.fk, u.Hkv, u.Hkvl, u.Hkvg, st.in_k, u.blk_kv},
                          {a.v, u.fv, u.Hkv, u.Hkvl, u.Hkvg, st.in_v, u.blk_kv}};
  for (const InTensor& t : ts)  // peer p gets my rows of its group-g heads
    for (int p = 0; p < u.world; ++p)
      copy(u.send + t.off + p * t.blk, t.group * u.hrow,
           static_cast<const unsigned char*>(t.src) + (p * t.local + g * t.group) * u.hrow, t.heads * u.hrow,
           t.group * u.hrow, u.B * u.L);
}

void ulysses_unpack_in(const UlyssesRank& u, int g, const Copy2d& copy) {
  if (u.direct()) return;  // NCCL placed the rows
  const Staging st = staging(u);
  const InTensor ts[3] = {{nullptr, u.fq, u.H, u.Hl, u.Hg, 0, u.blk_q},
                          {nullptr, u.fk, u.Hkv, u.Hkvl, u.Hkvg, st.in_k, u.blk_kv},
                          {nullptr, u.fv, u.Hkv, u.Hkvl, u.Hkvg, st.in_v, u.blk_kv}};
  for (const InTensor& t : ts)  // peer p's two chunks to their global rows
    for (int p = 0; p < u.world; ++p)
      for (int i = 0; i < 2; ++i)
        for (std::int64_t b = 0; b < u.B; ++b) {
          const std::size_t rows = static_cast<std::size_t>(t.group) * u.hrow;  // one token's group heads
          copy(group_base(u, t.full, t.group, g) + (b * u.S + chunk_of(u, p, i) * u.C) * rows, rows,
               u.recv + t.off + p * t.blk + (b * u.L + i * u.C) * rows, rows, rows, u.C);
        }
}

void ulysses_attend(const UlyssesRank& u, const UlyssesAttnArgs& a, int g, cudaStream_t s) {
  kernels::AttentionArgs k;
  k.q = group_base(u, u.fq, u.Hg, g);
  k.k = group_base(u, u.fk, u.Hkvg, g);
  k.v = group_base(u, u.fv, u.Hkvg, g);
  k.o = group_base(u, u.fo, u.Hg, g);
  k.batch = u.B;
  k.seqlen_q = k.seqlen_k = u.S;
  k.heads_q = u.Hg;
  k.heads_kv = u.Hkvg;
  k.head_dim = u.D;
  k.q_stride = k.o_stride = {u.S * u.Hg * u.D, u.Hg * u.D, u.D};
  k.k_stride = k.v_stride = {u.S * u.Hkvg * u.D, u.Hkvg * u.D, u.D};
  k.dtype = a.dtype;
  k.causal = a.causal;
  k.q_offset = 0;
  k.softmax_scale = a.softmax_scale;
  if (a.lse) {
    k.lse = u.flse + g * u.B * u.Hg * u.S;
    k.lse_batch_stride = u.Hg * u.S;
    k.lse_head_stride = u.S;
  }
  kernels::attention(k, s);
}

void ulysses_pack_out(const UlyssesRank& u, const UlyssesAttnArgs& a, int g, const Copy2d& copy) {
  const Staging st = staging(u);
  const std::size_t rows = static_cast<std::size_t>(u.Hg) * u.hrow;  // one token's group heads
  const float* lse_g = u.flse + g * u.B * u.Hg * u.S;
  for (int p = 0; p < u.world; ++p)
    for (int i = 0; i < 2; ++i)
      for (std::int64_t b = 0; b < u.B; ++b) {
        const std::int64_t t0 = chunk_of(u, p, i) * u.C;  // the chunk's first global token
        if (!u.direct())
          copy(u.send + p * u.blk_q + (b * u.L + i * u.C) * rows, rows,
               group_base(u, u.fo, u.Hg, g) + (b * u.S + t0) * rows, rows, rows, u.C);
        if (a.lse)  // [B, Hg, S] -> per peer [B, Hg, 2C]
          copy(u.send + st.out_lse + p * u.blk_lse + (b * u.Hg * u.L + i * u.C) * 4, u.L * 4,
               lse_g + b * u.Hg * u.S + t0, u.S * 4, u.C * 4, u.Hg);
      }
}

void ulysses_unpack_out(const UlyssesRank& u, const UlyssesAttnArgs& a, int g, const Copy2d& copy) {
  const Staging st = staging(u);
  for (int p = 0; p < u.world; ++p) {  // peer p's heads of my rows
    copy(static_cast<unsigned char*>(a.o) + (p * u.Hl + g * u.Hg) * u.hrow, u.H * u.hrow, u.recv + p * u.blk_q,
         u.Hg * u.hrow, u.Hg * u.hrow, u.B * u.L);
    if (a.lse)
      copy(a.lse + (p * u.Hl + g * u.Hg) * u.L, u.H * u.L * 4, u.recv + st.out_lse + p * u.blk_lse, u.Hg * u.L * 4,
           u.Hg * u.L * 4, u.B);
  }
}

}  // namespace detail

}  // namespace tessera::ops
