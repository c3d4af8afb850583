// Ulysses attention over zig-zag shards (ulysses_attention.hpp).
#include "tessera/ops/ulysses_attention.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <set>
#include <vector>

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
    if (scratch) cudaFree(scratch);
  }

  runtime::ProcessGroup& pg;
  void* scratch = nullptr;  ///< head-shard Q, K, V, O, LSE; send and receive staging
  std::size_t scratch_bytes = 0;
  cudaEvent_t ev_ready = nullptr, ev_done = nullptr;
  std::vector<cudaEvent_t> ev_in, ev_attn;  ///< per head group: inputs unpacked / attention done
  std::set<std::array<std::int64_t, 7>> validated;

  void* ensure_scratch(std::size_t bytes) {
    if (bytes <= scratch_bytes) return scratch;
    pg.synchronize_all("ulysses_attention: scratch growth");  // bounded: a dead peer is reported
    if (scratch) TESSERA_CUDA_CHECK(cudaFree(scratch));
    scratch = nullptr;
    scratch_bytes = 0;
    TESSERA_CUDA_CHECK(cudaMalloc(&scratch, bytes));
    scratch_bytes = bytes;
    return scratch;
  }
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
  const std::array<std::int64_t, 7> sig{
      a.batch, a.seq, a.heads_q, a.heads_kv, a.head_dim, static_cast<int>(a.dtype) * 2 + a.causal, groups};
  if (!c.validated.count(sig)) {
    c.pg.check_same_on_all_ranks(
        fmt::format("ulysses_attention: shapes (batch {}, seq {}, heads {}/{}, head_dim {}, dtype {}, causal {}, "
                    "head groups {})",
                    a.batch, a.seq, a.heads_q, a.heads_kv, a.head_dim, dtype_name(a.dtype), a.causal, groups),
        sig);
    c.validated.insert(sig);
  }
}

}  // namespace

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
  u.place(c.ensure_scratch(u.layout().total));
  c.ensure_events(G);

  // One NCCL group: segment i of peer p from send to p, into recv from p.
  auto exchange = [&](const detail::UlyssesRank::Segments& sg, cudaStream_t s) {
    TESSERA_NCCL_CHECK(ncclGroupStart());
    for (int i = 0; i < sg.n; ++i)
      for (int p = 0; p < R; ++p) {
        const std::size_t off = sg.off[i] + p * sg.bytes[i];
        TESSERA_NCCL_CHECK(ncclSend(u.send + off, sg.bytes[i], ncclUint8, p, c.pg.nccl(), s));
        TESSERA_NCCL_CHECK(ncclRecv(u.recv + off, sg.bytes[i], ncclUint8, p, c.pg.nccl(), s));
      }
    TESSERA_NCCL_CHECK(ncclGroupEnd());
  };
  auto all_to_all_in = [&](int g, cudaStream_t s) {
    const detail::Copy2d copy = detail::stream_copy2d(s);
    detail::ulysses_pack_in(u, a, g, copy);
    exchange(u.segments_in(), s);
    detail::ulysses_unpack_in(u, g, copy);
  };
  auto all_to_all_out = [&](int g, cudaStream_t s) {
    const detail::Copy2d copy = detail::stream_copy2d(s);
    detail::ulysses_pack_out(u, a, g, copy);
    exchange(u.segments_out(a.lse != nullptr), s);
    detail::ulysses_unpack_out(u, a, g, copy);
  };

  if (strategy == UlyssesStrategy::sequential || G == 1) {
    all_to_all_in(0, st);
    for (int g = 0; g < G; ++g) detail::ulysses_attend(u, a, g, st);
    for (int g = 0; g < G; ++g) all_to_all_out(g, st);
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
};

}  // namespace

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

UlyssesRank::Layout UlyssesRank::layout() const {
  const std::size_t tokens = static_cast<std::size_t>(B * S);  // = world peers x [B, 2C]
  const std::size_t q = tokens * Hl * hrow, kv = tokens * Hkvl * hrow, lse = tokens * Hl * 4;
  const Segments in = segments_in(), out = segments_out(true);
  const std::size_t stage = align256(std::max(in.off[2] + world * in.bytes[2], out.off[1] + world * out.bytes[1]));
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

UlyssesRank::Segments UlyssesRank::segments_in() const {
  Segments s;
  s.n = 3;
  s.off[0] = 0;
  s.bytes[0] = blk_q;
  s.off[1] = align256(world * blk_q);
  s.bytes[1] = blk_kv;
  s.off[2] = s.off[1] + align256(world * blk_kv);
  s.bytes[2] = blk_kv;
  return s;
}

UlyssesRank::Segments UlyssesRank::segments_out(bool lse) const {
  Segments s;
  s.n = lse ? 2 : 1;
  s.off[0] = 0;
  s.bytes[0] = blk_q;
  s.off[1] = align256(world * blk_q);
  s.bytes[1] = blk_lse;
  return s;
}

void ulysses_pack_in(const UlyssesRank& u, const UlyssesAttnArgs& a, int g, const Copy2d& copy) {
  const UlyssesRank::Segments sg = u.segments_in();
  const InTensor ts[3] = {
      {a.q, u.fq, u.H, u.Hl, u.Hg}, {a.k, u.fk, u.Hkv, u.Hkvl, u.Hkvg}, {a.v, u.fv, u.Hkv, u.Hkvl, u.Hkvg}};
  for (int t = 0; t < 3; ++t)  // peer p gets my rows of its group-g heads
    for (int p = 0; p < u.world; ++p)
      copy(u.send + sg.off[t] + p * sg.bytes[t], ts[t].group * u.hrow,
           static_cast<const unsigned char*>(ts[t].src) + (p * ts[t].local + g * ts[t].group) * u.hrow,
           ts[t].heads * u.hrow, ts[t].group * u.hrow, u.B * u.L);
}

void ulysses_unpack_in(const UlyssesRank& u, int g, const Copy2d& copy) {
  const UlyssesRank::Segments sg = u.segments_in();
  const InTensor ts[3] = {
      {nullptr, u.fq, u.H, u.Hl, u.Hg}, {nullptr, u.fk, u.Hkv, u.Hkvl, u.Hkvg}, {nullptr, u.fv, u.Hkv, u.Hkvl, u.Hkvg}};
  for (int t = 0; t < 3; ++t)  // peer p's two chunks to their global rows
    for (int p = 0; p < u.world; ++p)
      for (int i = 0; i < 2; ++i)
        for (std::int64_t b = 0; b < u.B; ++b)
          copy(ts[t].full + ((b * u.S + chunk_of(u, p, i) * u.C) * ts[t].local + g * ts[t].group) * u.hrow,
               ts[t].local * u.hrow, u.recv + sg.off[t] + p * sg.bytes[t] + (b * u.L + i * u.C) * ts[t].group * u.hrow,
               ts[t].group * u.hrow, ts[t].group * u.hrow, u.C);
}

void ulysses_attend(const UlyssesRank& u, const UlyssesAttnArgs& a, int g, cudaStream_t s) {
  kernels::AttentionArgs k;
  k.q = u.fq + g * u.Hg * u.hrow;
  k.k = u.fk + g * u.Hkvg * u.hrow;
  k.v = u.fv + g * u.Hkvg * u.hrow;
  k.o = u.fo + g * u.Hg * u.hrow;
  k.batch = u.B;
  k.seqlen_q = k.seqlen_k = u.S;
  k.heads_q = u.Hg;
  k.heads_kv = u.Hkvg;
  k.head_dim = u.D;
  k.q_stride = k.o_stride = {u.S * u.Hl * u.D, u.Hl * u.D, u.D};
  k.k_stride = k.v_stride = {u.S * u.Hkvl * u.D, u.Hkvl * u.D, u.D};
  k.dtype = a.dtype;
  k.causal = a.causal;
  k.q_offset = 0;
  k.softmax_scale = a.softmax_scale;
  if (a.lse) {
    k.lse = u.flse + g * u.Hg * u.S;
    k.lse_batch_stride = u.Hl * u.S;
    k.lse_head_stride = u.S;
  }
  kernels::attention(k, s);
}

void ulysses_pack_out(const UlyssesRank& u, const UlyssesAttnArgs& a, int g, const Copy2d& copy) {
  const UlyssesRank::Segments sg = u.segments_out(a.lse != nullptr);
  for (int p = 0; p < u.world; ++p)
    for (int i = 0; i < 2; ++i)
      for (std::int64_t b = 0; b < u.B; ++b) {
        const std::int64_t row = b * u.S + chunk_of(u, p, i) * u.C;  // first global row of the chunk
        copy(u.send + sg.off[0] + p * sg.bytes[0] + (b * u.L + i * u.C) * u.Hg * u.hrow, u.Hg * u.hrow,
             u.fo + (row * u.Hl + g * u.Hg) * u.hrow, u.Hl * u.hrow, u.Hg * u.hrow, u.C);
        if (a.lse)  // [B, Hl, S] -> per peer [B, Hg, 2C]
          copy(u.send + sg.off[1] + p * sg.bytes[1] + (b * u.Hg * u.L + i * u.C) * 4, u.L * 4,
               u.flse + (b * u.Hl + g * u.Hg) * u.S + chunk_of(u, p, i) * u.C, u.S * 4, u.C * 4, u.Hg);
      }
}

void ulysses_unpack_out(const UlyssesRank& u, const UlyssesAttnArgs& a, int g, const Copy2d& copy) {
  const UlyssesRank::Segments sg = u.segments_out(a.lse != nullptr);
  for (int p = 0; p < u.world; ++p) {  // peer p's heads of my rows
    copy(static_cast<unsigned char*>(a.o) + (p * u.Hl + g * u.Hg) * u.hrow, u.H * u.hrow,
         u.recv + sg.off[0] + p * sg.bytes[0], u.Hg * u.hrow, u.Hg * u.hrow, u.B * u.L);
    if (a.lse)
      copy(a.lse + (p * u.Hl + g * u.Hg) * u.L, u.H * u.L * 4, u.recv + sg.off[1] + p * sg.bytes[1], u.Hg * u.L * 4,
           u.Hg * u.L * 4, u.B);
  }
}

}  // namespace detail

}  // namespace tessera::ops
