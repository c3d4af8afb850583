// Ulysses attention over zig-zag shards (ulysses_attention.hpp).
#include "tessera/ops/ulysses_attention.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <array>
#include <set>
#include <vector>

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

/// Byte layout of the scratch buffer for one call.
struct Layout {
  std::size_t q, kv, lse;  ///< head shard: Q (and O) [B, S, H/R, D], K (and V), LSE [B, H/R, S]
  std::size_t stage;       ///< one of send / receive staging: one group, every peer
  std::size_t off_k, off_v, off_o, off_lse, off_send, off_recv, total;
};

Layout layout(const UlyssesAttnArgs& a, int world, int groups) {
  const std::size_t es = dtype_size(a.dtype);
  const std::int64_t Hl = a.heads_q / world, Hkvl = a.heads_kv / world;
  const std::int64_t Hg = Hl / groups, Hkvg = Hkvl / groups;
  const std::int64_t tokens = a.batch * a.seq;  // = R peers x [B, 2C]
  Layout l{};
  l.q = static_cast<std::size_t>(tokens * Hl * a.head_dim) * es;
  l.kv = static_cast<std::size_t>(tokens * Hkvl * a.head_dim) * es;
  l.lse = static_cast<std::size_t>(tokens * Hl) * 4;
  const std::size_t in = static_cast<std::size_t>(tokens * (Hg + 2 * Hkvg) * a.head_dim) * es;
  const std::size_t out =
      static_cast<std::size_t>(tokens * Hg * a.head_dim) * es + static_cast<std::size_t>(tokens * Hg) * 4 + 256;
  l.stage = align256(std::max(in, out) + 512);
  l.off_k = align256(l.q);
  l.off_v = l.off_k + align256(l.kv);
  l.off_o = l.off_v + align256(l.kv);
  l.off_lse = l.off_o + align256(l.q);
  l.off_send = l.off_lse + align256(l.lse);
  l.off_recv = l.off_send + l.stage;
  l.total = l.off_recv + l.stage;
  return l;
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

/// cudaMemcpy2DAsync in bytes: `rows` rows of `width` bytes.
void copy2d(cudaStream_t s, void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
            std::size_t rows) {
  if (rows == 0 || width == 0) return;
  TESSERA_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault, s));
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
  return layout(a, world, groups).total;
}

void ulysses_attention(UlyssesAttnContext& ctx, const UlyssesAttnArgs& a, UlyssesStrategy strategy, int head_groups) {
  UlyssesAttnContext::Impl& c = ctx.impl();
  const int R = c.pg.world(), rank = c.pg.rank();
  const int G = ulysses_head_groups(a, R, strategy, head_groups);
  validate(c, a, G);
  cudaStream_t st = c.pg.stream();
  const std::int64_t B = a.batch, S = a.seq, C = S / (2 * R), L = 2 * C, D = a.head_dim;
  const std::int64_t H = a.heads_q, Hkv = a.heads_kv, Hl = H / R, Hkvl = Hkv / R, Hg = Hl / G, Hkvg = Hkvl / G;
  const std::size_t es = dtype_size(a.dtype);

  if (R == 1) {  // the shard is the whole sequence in order
    kernels::AttentionArgs k;
    k.q = a.q;
    k.k = a.k;
    k.v = a.v;
    k.o = a.o;
    k.lse = a.lse;
    k.batch = B;
    k.seqlen_q = k.seqlen_k = S;
    k.heads_q = H;
    k.heads_kv = Hkv;
    k.head_dim = D;
    k.dtype = a.dtype;
    k.causal = a.causal;
    k.softmax_scale = a.softmax_scale;
    kernels::attention(k, st);
    return;
  }

  const Layout lay = layout(a, R, G);
  unsigned char* base = static_cast<unsigned char*>(c.ensure_scratch(lay.total));
  unsigned char* fq = base;
  unsigned char* fk = base + lay.off_k;
  unsigned char* fv = base + lay.off_v;
  unsigned char* fo = base + lay.off_o;
  float* flse = reinterpret_cast<float*>(base + lay.off_lse);
  unsigned char* send = base + lay.off_send;
  unsigned char* recv = base + lay.off_recv;
  c.ensure_events(G);

  // Global chunk of peer p's local chunk i.
  auto chunk_of = [&](int p, int i) -> std::int64_t { return i == 0 ? p : 2 * R - 1 - p; };
  const std::size_t hrow = static_cast<std::size_t>(D) * es;              // one head of one token
  const std::size_t blk_q = static_cast<std::size_t>(B * L * Hg) * hrow;  // per peer, staging
  const std::size_t blk_kv = static_cast<std::size_t>(B * L * Hkvg) * hrow;
  const std::size_t blk_lse = static_cast<std::size_t>(B * Hg * L) * 4;

  // Sequence shard -> head shard for group g, on stream s.
  auto all_to_all_in = [&](int g, cudaStream_t s) {
    struct T {
      const void* src;
      unsigned char* full;
      std::int64_t heads, local, group;
      std::size_t blk, off;
    };
    const T ts[3] = {{a.q, fq, H, Hl, Hg, blk_q, 0},
                     {a.k, fk, Hkv, Hkvl, Hkvg, blk_kv, static_cast<std::size_t>(R) * blk_q},
                     {a.v, fv, Hkv, Hkvl, Hkvg, blk_kv, static_cast<std::size_t>(R) * (blk_q + blk_kv)}};
    for (const T& t : ts)  // pack: peer p gets my rows of its group-g heads
      for (int p = 0; p < R; ++p)
        copy2d(s, send + t.off + p * t.blk, t.group * hrow,
               static_cast<const unsigned char*>(t.src) + (p * t.local + g * t.group) * hrow, t.heads * hrow,
               t.group * hrow, B * L);
    TESSERA_NCCL_CHECK(ncclGroupStart());
    for (const T& t : ts)
      for (int p = 0; p < R; ++p) {
        TESSERA_NCCL_CHECK(ncclSend(send + t.off + p * t.blk, t.blk, ncclUint8, p, c.pg.nccl(), s));
        TESSERA_NCCL_CHECK(ncclRecv(recv + t.off + p * t.blk, t.blk, ncclUint8, p, c.pg.nccl(), s));
      }
    TESSERA_NCCL_CHECK(ncclGroupEnd());
    for (const T& t : ts)  // unpack: peer p's two chunks to their global rows
      for (int p = 0; p < R; ++p)
        for (int i = 0; i < 2; ++i)
          for (std::int64_t b = 0; b < B; ++b)
            copy2d(s, t.full + ((b * S + chunk_of(p, i) * C) * t.local + g * t.group) * hrow, t.local * hrow,
                   recv + t.off + p * t.blk + (b * L + i * C) * t.group * hrow, t.group * hrow, t.group * hrow, C);
  };

  // Head shard -> sequence shard for group g's O and LSE, on stream s.
  auto all_to_all_out = [&](int g, cudaStream_t s) {
    const std::size_t off_lse = static_cast<std::size_t>(R) * blk_q;
    for (int p = 0; p < R; ++p)
      for (int i = 0; i < 2; ++i)
        for (std::int64_t b = 0; b < B; ++b) {
          copy2d(s, send + p * blk_q + (b * L + i * C) * Hg * hrow, Hg * hrow,
                 fo + ((b * S + chunk_of(p, i) * C) * Hl + g * Hg) * hrow, Hl * hrow, Hg * hrow, C);
          if (a.lse)
            copy2d(s, send + off_lse + p * blk_lse + ((b * Hg) * L + i * C) * 4, L * 4,
                   flse + (b * Hl + g * Hg) * S + chunk_of(p, i) * C, S * 4, C * 4, Hg);
        }
    TESSERA_NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < R; ++p) {
      TESSERA_NCCL_CHECK(ncclSend(send + p * blk_q, blk_q, ncclUint8, p, c.pg.nccl(), s));
      TESSERA_NCCL_CHECK(ncclRecv(recv + p * blk_q, blk_q, ncclUint8, p, c.pg.nccl(), s));
      if (a.lse) {
        TESSERA_NCCL_CHECK(ncclSend(send + off_lse + p * blk_lse, blk_lse, ncclUint8, p, c.pg.nccl(), s));
        TESSERA_NCCL_CHECK(ncclRecv(recv + off_lse + p * blk_lse, blk_lse, ncclUint8, p, c.pg.nccl(), s));
      }
    }
    TESSERA_NCCL_CHECK(ncclGroupEnd());
    for (int p = 0; p < R; ++p) {  // peer p's heads of my rows
      copy2d(s, static_cast<unsigned char*>(a.o) + (p * Hl + g * Hg) * hrow, H * hrow, recv + p * blk_q, Hg * hrow,
             Hg * hrow, B * L);
      if (a.lse)
        copy2d(s, a.lse + (p * Hl + g * Hg) * L, H * L * 4, recv + off_lse + p * blk_lse, Hg * L * 4, Hg * L * 4, B);
    }
  };

  auto attend = [&](int g) {
    kernels::AttentionArgs k;
    k.q = fq + g * Hg * hrow;
    k.k = fk + g * Hkvg * hrow;
    k.v = fv + g * Hkvg * hrow;
    k.o = fo + g * Hg * hrow;
    k.batch = B;
    k.seqlen_q = k.seqlen_k = S;
    k.heads_q = Hg;
    k.heads_kv = Hkvg;
    k.head_dim = D;
    k.q_stride = k.o_stride = {S * Hl * D, Hl * D, D};
    k.k_stride = k.v_stride = {S * Hkvl * D, Hkvl * D, D};
    k.dtype = a.dtype;
    k.causal = a.causal;
    k.q_offset = 0;
    k.softmax_scale = a.softmax_scale;
    if (a.lse) {
      k.lse = flse + g * Hg * S;
      k.lse_batch_stride = Hl * S;
      k.lse_head_stride = S;
    }
    kernels::attention(k, st);
  };

  if (strategy == UlyssesStrategy::sequential || G == 1) {
    all_to_all_in(0, st);
    for (int g = 0; g < G; ++g) attend(g);
    for (int g = 0; g < G; ++g) all_to_all_out(g, st);
    return;
  }
  // Pipelined: the communication stream runs in(0), then per g in(g+1) and
  // out(g) (after attend(g)); the compute stream attends group g once in(g)
  // is unpacked. The staging buffers are reused in the stream's order.
  cudaStream_t cs = c.pg.comm_stream(0);
  TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_ready, st));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, c.ev_ready, 0));
  all_to_all_in(0, cs);
  TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_in[0], cs));
  for (int g = 0; g < G; ++g) {
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(st, c.ev_in[g], 0));
    attend(g);
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
  (void)rank;
}

}  // namespace tessera::ops
