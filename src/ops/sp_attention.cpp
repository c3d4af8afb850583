// Sequence-parallel attention: AllGather-KV + attention over zig-zag shards
// (sp_attention.hpp describes the plan and the protocol).
#include "tessera/ops/sp_attention.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <array>
#include <map>
#include <tuple>
#include <set>

#include "seq_parallel_detail.hpp"
#include "sp_attention_kernels.hpp"
#include "tuning.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/ops/ring_attention.hpp"
#include "tessera/ops/two_level_attention.hpp"
#include "tessera/ops/ulysses_attention.hpp"
#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/signals.hpp"
#include "tessera/runtime/symmetric_heap.hpp"

namespace tessera::ops {

struct SpAttnContext::Impl {
  explicit Impl(runtime::ProcessGroup& g) : pg(g) {
    TESSERA_CHECK(pg.world() <= runtime::kMaxPeers, "sp_attention: world {} > {}", pg.world(), runtime::kMaxPeers);
    TESSERA_CHECK(pg.lsa_reachable(), "sp_attention: not every rank is load/store reachable (lsa size {} of {})",
                  pg.lsa_size(), pg.world());
    TESSERA_CHECK(pg.comm_stream_count() >= 1, "sp_attention: the process group has no communication stream");
    data = std::make_unique<runtime::Signals>(pg, kSlots);
    control = std::make_unique<runtime::Signals>(pg, 1);
    TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&ev_ready, cudaEventDisableTiming));
    TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&ev_comm_done, cudaEventDisableTiming));
  }
  ~Impl() {
    for (auto& [key, table] : orders) cudaFree(table);
    if (ev_ready) cudaEventDestroy(ev_ready);
    if (ev_comm_done) cudaEventDestroy(ev_comm_done);
    if (staging) cudaFree(staging);
  }

  static constexpr int kSlots = 2;  ///< data flags: my chunk 0 / 1 landed (value = epoch)
  runtime::ProcessGroup& pg;
  std::unique_ptr<runtime::Signals> data;     ///< per-source chunk flags
  std::unique_ptr<runtime::Signals> control;  ///< slot 0: "my workspace is free again" (value = epoch)
  runtime::SymBuffer<unsigned char> ws;       ///< gathered K, then V: 2 x [B, S, Hkv, D]
  void* staging = nullptr;                    ///< sequential: NCCL's [R][B, 2C, Hkv, D] for K, then V
  std::size_t staging_bytes = 0;
  std::uint64_t epoch = 0;
  cudaEvent_t ev_ready = nullptr, ev_comm_done = nullptr;
  /// kv_arrival_order tables on the device, per (rank's plan, kv_len, block rows); kept for the context's life.
  std::map<std::tuple<std::int64_t, int, int, std::int64_t, int>, std::int32_t*> orders;

  /// The device table of kv_arrival_order(plan, kv_len, block_rows), made once.
  const std::int32_t* arrival_order(const SpAttnPlan& plan, std::int64_t kv_len, int block_rows) {
    const auto key = std::make_tuple(plan.seq, plan.world, plan.rank, kv_len, block_rows);
    if (auto it = orders.find(key); it != orders.end()) return it->second;
    const std::vector<std::int32_t> host = kv_arrival_order(plan, kv_len, block_rows);
    std::int32_t* dev = nullptr;
    TESSERA_CUDA_CHECK(cudaMalloc(&dev, host.size() * sizeof(std::int32_t)));
    orders[key] = dev;
    // Synchronous: once per shape, before the kernel that reads it is queued.
    TESSERA_CUDA_CHECK(cudaMemcpy(dev, host.data(), host.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
    return dev;
  }
  std::set<detail::ZigzagSignature> validated;  ///< shapes and strategies already checked across ranks
  detail::TuneState tune;                       ///< automatic's choices and cache
  /// The ring and Ulysses strategies' own contexts, made by their first call
  /// (collective: every rank runs the same strategy, checked beforehand).
  std::unique_ptr<RingAttnContext> ring;
  std::unique_ptr<UlyssesAttnContext> ulysses;
  std::unique_ptr<TwoLevelAttnContext> two_level;

  void drain(const char* what) {
    const std::initializer_list<const runtime::Signals*> all{data.get(), control.get()};
    link::synchronize(pg.stream(), all, what);
    for (int i = 0; i < pg.comm_stream_count(); ++i) link::synchronize(pg.comm_stream(i), all, what);
  }
  void ensure_ws(std::size_t bytes) {
    if (!ws.empty() && ws.bytes() >= bytes) return;
    drain("sp_attention: workspace growth");
    pg.barrier();  // no peer still pushes into or reads the old workspace
    ws = runtime::SymBuffer<unsigned char>();
    ws = runtime::SymBuffer<unsigned char>(pg, bytes);
  }
  void* ensure_staging(std::size_t bytes) {
    if (bytes <= staging_bytes) return staging;
    pg.synchronize(pg.stream(), "sp_attention: staging growth");  // bounded: a dead peer is reported
    if (staging) TESSERA_CUDA_CHECK(cudaFree(staging));
    staging = nullptr;
    TESSERA_CUDA_CHECK(cudaMalloc(&staging, bytes));
    staging_bytes = bytes;
    return staging;
  }
};

SpAttnContext::SpAttnContext(runtime::ProcessGroup& pg) : impl_(std::make_unique<Impl>(pg)) {}
SpAttnContext::~SpAttnContext() = default;

namespace {

/// Copies chunk `i` (C rows) of a shard [B, 2C, H, D] to rows [g0, g0 + C) of
/// a [B, S, H, D] tensor (any address of the symmetric heap or local memory).
void copy_chunk(cudaStream_t s, void* dst, const void* src, int i, std::int64_t g0, std::int64_t B, std::int64_t C,
                std::int64_t S, std::size_t row_bytes) {
  TESSERA_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<unsigned char*>(dst) + g0 * row_bytes, S * row_bytes,
                                       static_cast<const unsigned char*>(src) + i * C * row_bytes, 2 * C * row_bytes,
                                       C * row_bytes, B, cudaMemcpyDefault, s));
}

/// The Ulysses degree of two_level for `a` under `o`: checked when two_level
/// runs or is a candidate (an explicit degree the shape cannot take is an
/// error naming two_level_inner either way).
int two_level_degree(const SpAttnArgs& a, int world, const SpAttnOptions& o) {
  return two_level_inner_degree(a, world, o.two_level_inner);
}

/// two_level is a schedule of its own (not the ring or Ulysses) at this degree.
bool two_level_distinct(int u, int world) { return u > 1 && u < world; }

void validate(SpAttnContext::Impl& c, const SpAttnArgs& a, SpStrategy strategy, int u) {
  TESSERA_CHECK(accepts(OpKind::sp_attention, static_cast<Strategy>(strategy)),
                "sp_attention: strategy code {} (automatic 0, sequential 1, fused_ce 3, ring 5, ulysses 6 or "
                "two_level 8)",
                static_cast<int>(strategy));
  // two_level's degree is part of what the ranks must agree on.
  const int code = static_cast<int>(strategy) + (strategy == SpStrategy::two_level ? 256 * u : 0);
  detail::validate_zigzag(c.pg, a, "sp_attention", code, sp_strategy_name(strategy), c.validated);
  if (strategy == SpStrategy::ulysses) {
    const int R = c.pg.world();
    TESSERA_CHECK(a.heads_q % R == 0 && a.heads_kv % R == 0,
                  "sp_attention: strategy ulysses needs heads_q = {} and heads_kv = {} to be multiples of the world "
                  "size {}",
                  a.heads_q, a.heads_kv, R);
  }
}

bool heads_divide(const SpAttnArgs& a, int world) { return a.heads_q % world == 0 && a.heads_kv % world == 0; }

/// One call with a concrete strategy; `a` is validated; `u`: two_level's degree.
void run_sp_attention(SpAttnContext::Impl& c, const SpAttnArgs& a, SpStrategy strategy, int u) {
  if (strategy == SpStrategy::two_level) {
    if (!c.two_level) c.two_level = std::make_unique<TwoLevelAttnContext>(c.pg);
    two_level_attention(*c.two_level, a, u, RingStrategy::overlapped);
    return;
  }
  if (strategy == SpStrategy::ring) {
    if (!c.ring) c.ring = std::make_unique<RingAttnContext>(c.pg);
    ring_attention(*c.ring, a, RingStrategy::overlapped);
    return;
  }
  if (strategy == SpStrategy::ulysses) {
    if (!c.ulysses) c.ulysses = std::make_unique<UlyssesAttnContext>(c.pg);
    ulysses_attention(*c.ulysses, a, UlyssesStrategy::sequential);
    return;
  }
  const int R = c.pg.world(), rank = c.pg.rank();
  const SpAttnPlan plan = plan_sp_attention(a.seq, R, rank, a.causal);
  const std::int64_t B = a.batch, C = plan.chunk, S = a.seq, L = 2 * C;
  const std::size_t es = dtype_size(a.dtype);
  const std::size_t kv_row = static_cast<std::size_t>(a.heads_kv * a.head_dim) * es;
  const std::size_t kv_bytes = static_cast<std::size_t>(B * S) * kv_row;  // one gathered tensor
  c.ensure_ws(2 * kv_bytes);
  const std::uint64_t e = ++c.epoch;
  cudaStream_t st = c.pg.stream();
  unsigned char* ws_k = c.ws.local();
  unsigned char* ws_v = ws_k + kv_bytes;

  auto run_parts = [&](bool hooked) {
    const std::size_t q_row = static_cast<std::size_t>(a.heads_q * a.head_dim) * es;
    detail::SpKvFlags f;
    f.flags = c.data->view().flag_from(0, 0);
    f.slots = SpAttnContext::Impl::kSlots;
    f.world = R;
    f.rank = rank;
    f.chunk = C;
    f.epoch = e;
    static const bool arrival = env::find_int("TESSERA_SP_ARRIVAL_ORDER", 0, 1).value_or(1) != 0;
    const int block_rows = detail::sp_attention_kv_block_rows(static_cast<int>(a.head_dim));
    for (const SpAttnPlan::Part& part : plan.parts) {
      f.order = hooked && R > 1 && arrival ? c.arrival_order(plan, part.kv_len, block_rows) : nullptr;
      kernels::AttentionArgs k;
      k.q = static_cast<const unsigned char*>(a.q) + part.local_row0 * q_row;
      k.o = static_cast<unsigned char*>(a.o) + part.local_row0 * q_row;
      k.k = ws_k;
      k.v = ws_v;
      k.batch = B;
      k.seqlen_q = part.rows;
      k.seqlen_k = part.kv_len;
      k.heads_q = a.heads_q;
      k.heads_kv = a.heads_kv;
      k.head_dim = a.head_dim;
      k.q_stride = k.o_stride = {L * a.heads_q * a.head_dim, a.heads_q * a.head_dim, a.head_dim};
      k.k_stride = k.v_stride = {S * a.heads_kv * a.head_dim, a.heads_kv * a.head_dim, a.head_dim};
      k.dtype = a.dtype;
      k.causal = a.causal;
      k.q_offset = part.q_offset;
      k.softmax_scale = a.softmax_scale;
      if (a.lse) {
        k.lse = a.lse + part.local_row0;
        k.lse_batch_stride = a.heads_q * L;
        k.lse_head_stride = L;
      }
      if (hooked && R > 1)
        detail::launch_sp_attention_part(k, f, st);
      else
        kernels::attention(k, st);
    }
  };

  // Waits on `s` until every peer finished call e - 1: its kernels no longer
  // read, and its pushes no longer write, any workspace.
  auto wait_peers_done = [&](cudaStream_t s) {
    if (e > 1)
      for (int p = 0; p < R; ++p)
        if (p != rank) link::rank_wait(s, *c.control, p, 0, e - 1);
  };

  // This rank's chunks into its own rows of the workspace (both strategies:
  // the kernel reads them there).
  auto copy_own = [&](cudaStream_t s) {
    for (int i = 0; i < 2; ++i) {
      copy_chunk(s, ws_k, a.k, i, plan.chunks[i] * C, B, C, S, kv_row);
      copy_chunk(s, ws_v, a.v, i, plan.chunks[i] * C, B, C, S, kv_row);
    }
  };

  switch (strategy) {
    case SpStrategy::sequential: {
      const std::size_t shard = static_cast<std::size_t>(B * L) * kv_row;
      unsigned char* stg = static_cast<unsigned char*>(c.ensure_staging(2 * R * shard));
      // NCCL gathers whole shards (rank s at s * shard); B > 1 shards are
      // [B, 2C] blocks, so the reorder below walks (rank, chunk) pairs.
      TESSERA_NCCL_CHECK(ncclGroupStart());
      TESSERA_NCCL_CHECK(ncclAllGather(a.k, stg, shard, ncclUint8, c.pg.nccl(), st));
      TESSERA_NCCL_CHECK(ncclAllGather(a.v, stg + R * shard, shard, ncclUint8, c.pg.nccl(), st));
      TESSERA_NCCL_CHECK(ncclGroupEnd());
      wait_peers_done(st);  // no push of an earlier fused call still lands in the workspace
      for (int s = 0; s < R; ++s) {
        const SpAttnPlan ps = plan_sp_attention(a.seq, R, s, a.causal);
        for (int i = 0; i < 2; ++i) {
          copy_chunk(st, ws_k, stg + s * shard, i, ps.chunks[i] * C, B, C, S, kv_row);
          copy_chunk(st, ws_v, stg + (R + s) * shard, i, ps.chunks[i] * C, B, C, S, kv_row);
        }
      }
      run_parts(false);
      break;
    }
    case SpStrategy::automatic:
      TESSERA_FAIL("sp_attention: automatic reached the implementation unresolved");
    case SpStrategy::ring:
    case SpStrategy::ulysses:
    case SpStrategy::two_level:
      TESSERA_FAIL("sp_attention: {} is run by its own operator above", sp_strategy_name(strategy));
    case SpStrategy::fused_ce: {
      copy_own(st);
      if (R > 1) {
        // Pushes on the communication stream, after the inputs are ready.
        cudaStream_t cs = c.pg.comm_stream(0);
        TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_ready, st));
        TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, c.ev_ready, 0));
        for (int dst : plan.push_to) {
          if (e > 1) link::rank_wait(cs, *c.control, dst, 0, e - 1);  // dst is done with the last call's KV
          unsigned char* pk = c.ws.peer(dst);
          unsigned char* pv = pk + kv_bytes;
          for (int i = 0; i < 2; ++i) {
            copy_chunk(cs, pk, a.k, i, plan.chunks[i] * C, B, C, S, kv_row);
            copy_chunk(cs, pv, a.v, i, plan.chunks[i] * C, B, C, S, kv_row);
            link::rank_notify(cs, *c.data, dst, i, e);
          }
        }
        TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_comm_done, cs));
      }
      run_parts(true);
      if (R > 1) TESSERA_CUDA_CHECK(cudaStreamWaitEvent(st, c.ev_comm_done, 0));
      break;
    }
  }
  // Control flag = e: my kernels of this call are done with my workspace,
  // and every push I made in it has landed. Both strategies say it, so the
  // next call may follow either one.
  if (R > 1)
    for (int p = 0; p < R; ++p)
      if (p != rank) link::rank_notify(st, *c.control, p, 0, e);
}

}  // namespace

std::string_view sp_strategy_name(SpStrategy s) {
  switch (s) {
    case SpStrategy::automatic:
      return "automatic";
    case SpStrategy::sequential:
      return "sequential";
    case SpStrategy::fused_ce:
      return "fused_ce";
    case SpStrategy::ring:
      return "ring";
    case SpStrategy::ulysses:
      return "ulysses";
    case SpStrategy::two_level:
      return "two_level";
  }
  return "unknown";
}

std::size_t sp_attention_workspace_bytes(const SpAttnArgs& a, int world, SpStrategy s, int two_level_inner) {
  TESSERA_CHECK(world >= 1, "sp_attention_workspace_bytes: world {}", world);
  const std::size_t kv_bytes =
      static_cast<std::size_t>(a.batch * a.seq * a.heads_kv * a.head_dim) * dtype_size(a.dtype);  // one gathered tensor
  switch (s) {
    case SpStrategy::sequential:
      return 4 * kv_bytes;  // gathered K and V, and NCCL's staging of both
    case SpStrategy::fused_ce:
      return 2 * kv_bytes;
    case SpStrategy::ring:
      return ring_attention_workspace_bytes(a, world);
    case SpStrategy::ulysses:
      return ulysses_attention_workspace_bytes(a, world, 1);
    case SpStrategy::two_level:
      return two_level_attention_workspace_bytes(a, world, two_level_inner);
    case SpStrategy::automatic:
      break;
  }
  TESSERA_FAIL("sp_attention_workspace_bytes: strategy {} (a concrete strategy)", sp_strategy_name(s));
}

namespace {

/// `candidates` within the workspace limit (all when there is none); throws
/// naming each one's need when none fits.
std::vector<Strategy> within_limit(const SpAttnArgs& a, int world, const std::vector<Strategy>& candidates,
                                   std::size_t limit, int u) {
  if (limit == 0) return candidates;
  std::vector<Strategy> fit;
  std::string needs;
  for (Strategy s : candidates) {
    const std::size_t need = sp_attention_workspace_bytes(a, world, static_cast<SpStrategy>(s), u);
    if (need <= limit) fit.push_back(s);
    needs += fmt::format("{}{} {:.3f} GiB", needs.empty() ? "" : ", ", strategy_name(s),
                         static_cast<double>(need) / (1u << 30));
  }
  TESSERA_CHECK(!fit.empty(), "sp_attention: no strategy fits the workspace limit of {:.3f} GiB per rank ({})",
                static_cast<double>(limit) / (1u << 30), needs);
  return fit;
}

}  // namespace

SpStrategy resolve_sp_attention(SpAttnContext& ctx, const SpAttnArgs& a, const SpAttnOptions& o, TuneReport* report) {
  SpAttnContext::Impl& c = ctx.impl();
  const int R = c.pg.world();
  // two_level's degree: checked (before any launch) when it runs or may run.
  const bool explicit_two_level = o.strategy == SpStrategy::two_level;
  int u = explicit_two_level ? two_level_degree(a, R, o) : 1;
  validate(c, a, o.strategy, u);
  if (o.strategy == SpStrategy::automatic) u = two_level_degree(a, R, o);
  if (o.strategy != SpStrategy::automatic) {
    const std::size_t need = sp_attention_workspace_bytes(a, R, o.strategy, u);
    TESSERA_CHECK(o.workspace_limit_bytes == 0 || need <= o.workspace_limit_bytes,
                  "sp_attention: strategy {} needs {:.3f} GiB of workspace per rank, over the limit of {:.3f} GiB",
                  sp_strategy_name(o.strategy), static_cast<double>(need) / (1u << 30),
                  static_cast<double>(o.workspace_limit_bytes) / (1u << 30));
    return o.strategy;
  }
  const bool two_level = two_level_distinct(u, R);
  const std::vector<Strategy> all = sp_attention_candidates(R, c.pg.lsa_reachable(), heads_divide(a, R), two_level);
  const std::vector<Strategy> candidates = within_limit(a, R, all, o.workspace_limit_bytes, u);
  const detail::TuneHooks hooks{[&](const char* what) { c.drain(what); },
                                [&](Strategy s) { run_sp_attention(c, a, static_cast<SpStrategy>(s), u); }};
  // seq, batch and the head counts are compared by ratio for a neighbour's
  // choice; head_dim and causal are flags.
  detail::TuneQuery q{tune::key_prefix(detail::machine_id(c.pg), a.dtype, "ops.sp_attention"),
                      {a.seq, a.batch, a.heads_q, a.heads_kv, a.head_dim, a.causal ? 1 : 0},
                      4,
                      o.use_cache,
                      o.tune_on_miss};
  if (candidates != all) {  // a limit left some out: a choice among fewer is keyed apart
    std::int64_t mask = 0;
    for (Strategy s : candidates) mask |= std::int64_t{1} << static_cast<int>(s);
    q.shape.push_back(mask);
  }
  // A two_level measured at an explicit degree is keyed apart from the
  // chosen degree's (negative: never a mask).
  if (two_level && o.two_level_inner != 0) q.shape.push_back(-u);
  return static_cast<SpStrategy>(detail::tune_choice(c.pg, c.tune, q, candidates, hooks, report));
}

void sp_attention(SpAttnContext& ctx, const SpAttnArgs& a, const SpAttnOptions& o) {
  const SpStrategy s = resolve_sp_attention(ctx, a, o);  // checks everything first
  const int u = s == SpStrategy::two_level ? two_level_degree(a, ctx.impl().pg.world(), o) : 1;
  run_sp_attention(ctx.impl(), a, s, u);
}

void sp_attention(SpAttnContext& ctx, const SpAttnArgs& a, SpStrategy s) {
  SpAttnOptions o;
  o.strategy = s;
  sp_attention(ctx, a, o);
}

namespace detail {

void validate_zigzag(runtime::ProcessGroup& pg, const SpAttnArgs& a, const char* op, int strategy,
                     std::string_view strategy_name, std::set<ZigzagSignature>& agreed) {
  const int R = pg.world();
  TESSERA_CHECK(!runtime::stream_capturing(pg.stream()),
                "{}: cannot be captured into a CUDA graph (its flags carry a per-call epoch that a replay would "
                "repeat); call it eagerly",
                op);
  TESSERA_CHECK(a.seq >= 2 * R && a.seq % (2 * R) == 0,
                "{}: seq = {} must be a positive multiple of 2 x world = {} (zig-zag chunks)", op, a.seq, 2 * R);
  // The kernel's own checks (dtype, head dim, GQA divisibility, pointers)
  // on one shard's shapes.
  kernels::AttentionArgs k;
  k.q = a.q;
  k.k = a.k;
  k.v = a.v;
  k.o = a.o;
  k.batch = a.batch;
  k.seqlen_q = k.seqlen_k = a.seq / R;
  k.heads_q = a.heads_q;
  k.heads_kv = a.heads_kv;
  k.head_dim = a.head_dim;
  k.dtype = a.dtype;
  k.causal = a.causal;
  k.softmax_scale = a.softmax_scale;
  kernels::validate(k, op);
  const ZigzagSignature sig{a.batch,  a.seq,   a.heads_q, a.heads_kv, a.head_dim, static_cast<std::int64_t>(a.dtype),
                            a.causal, strategy};
  if (agreed.count(sig)) return;
  pg.check_same_on_all_ranks(
      fmt::format("{}: shapes and strategy (batch {}, seq {}, heads {}/{}, head_dim {}, dtype "
                  "{}, causal {}, strategy {})",
                  op, a.batch, a.seq, a.heads_q, a.heads_kv, a.head_dim, dtype_name(a.dtype), a.causal, strategy_name),
      sig);
  agreed.insert(sig);
}

}  // namespace detail

}  // namespace tessera::ops
