// TpContext: workspaces, agreement checks, the tuner, and the public
// operator entry points (validation → strategy → the operator's registry).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <utility>
#include <vector>

#include "context_impl.hpp"
#include "tp_launchers.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/ops/tuner.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/wait_diagnostics.hpp"
#include "tuning.hpp"

namespace tessera::ops {

LocalBuffer::~LocalBuffer() {
  if (p_) cudaFree(p_);  // destructor: nothing to report to
}

void* LocalBuffer::ensure(std::size_t bytes, cudaStream_t sync_stream) {
  if (bytes <= bytes_) return p_;
  if (p_) {
    // cudaFree waits for the whole device: every stream that may hold a
    // collective is drained first, with a bound (a dead peer is an error, not a hang).
    if (owner)
      owner->before_growth("ops: local workspace growth");
    else
      runtime::bounded_sync(sync_stream, "ops: local workspace growth");
    if (owner && owner->captured)
      owner->retired_local.push_back(p_);  // a CUDA graph may hold it
    else
      TESSERA_CUDA_CHECK(cudaFree(p_));
    p_ = nullptr;
    bytes_ = 0;
  }
  TESSERA_CUDA_CHECK(cudaMalloc(&p_, bytes));
  bytes_ = bytes;
  return p_;
}

TpContext::Impl::Impl(runtime::ProcessGroup& g) : pg(g), lsa(g.lsa_reachable()) {
  TESSERA_CHECK(pg.world() <= runtime::kMaxPeers, "TpContext: world {} > {}", pg.world(), runtime::kMaxPeers);
  TESSERA_CHECK(pg.comm_stream_count() >= 1, "TpContext: the process group has no communication stream");
  for (LocalBuffer* b : {&staging, &rs_out, &hidden, &push_done, &ag_local}) b->owner = this;
  // Without load/store reach: no symmetric memory, no Signals; the
  // operators run their NCCL-based strategy only (check_reach below).
  if (lsa) {
    ag_flags = std::make_unique<runtime::Signals>(pg, kMaxChannels);
    control = std::make_unique<runtime::Signals>(pg, kControlSlots);
    rs_counters = std::make_unique<runtime::Signals>(pg, 64);
    rs_bands = std::make_unique<runtime::Signals>(pg, 64);
    pg.prepare_align_streams();  // reset_flags may run inside a capture
  }
  rs_band_total.assign(64, 0);
  const std::size_t done_bytes = sizeof(unsigned) * kMaxChannels * runtime::kMaxPeers;
  TESSERA_CUDA_CHECK(cudaMemset(push_done.ensure(done_bytes, pg.stream()), 0, done_bytes));
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&ev_ready, cudaEventDisableTiming));
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&ev_comm_done, cudaEventDisableTiming));
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&ev_rx_done, cudaEventDisableTiming));
  int least = 0, greatest = 0;
  TESSERA_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  TESSERA_CUDA_CHECK(cudaStreamCreateWithPriority(&ring_stream, cudaStreamNonBlocking, greatest));
  detail::preload_kernels();
  // Bounded, not cudaDeviceSynchronize: the group's streams may hold a
  // collective of the caller's whose peer is gone.
  runtime::bounded_sync({cudaStreamLegacy, pg.stream(), ring_stream}, "TpContext: set-up", &pg);
  for (int i = 0; i < pg.comm_stream_count(); ++i) runtime::bounded_sync(pg.comm_stream(i), "TpContext: set-up", &pg);
}

TpContext::Impl::~Impl() {
  // The members' cudaFree (and the symmetric buffers' collective
  // deregistration) must not wait on a dead peer: drain with a bound first
  // (on failure the group is aborted, which ends its NCCL kernels).
  if (broken.empty()) {
    try {
      drain("TpContext teardown");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
    }
  }
  if (ev_ready) cudaEventDestroy(ev_ready);
  if (ev_comm_done) cudaEventDestroy(ev_comm_done);
  if (ev_rx_done) cudaEventDestroy(ev_rx_done);
  if (ring_stream) cudaStreamDestroy(ring_stream);
  for (void* p : retired_local) cudaFree(p);
}

void TpContext::Impl::check_agreement(const ShapeSignature& sig, const char* op) {
  if (validated.count(sig)) return;
  pg.check_same_on_all_ranks(fmt::format("{}: shape/dtype/strategy (M {}, N {}, K {}, dtype {}, strategy {})", op,
                                         sig.m, sig.n, sig.k, sig.dtype, sig.strategy),
                             sig);
  validated.insert(sig);
}

void TpContext::Impl::before_growth(const char* what) {
  TESSERA_CHECK(!runtime::stream_capturing(pg.stream()),
                "{}: the workspace must grow inside a CUDA-graph capture; run the same call once eagerly before "
                "capturing it",
                what);
  drain(what);
}

void TpContext::Impl::retire(runtime::SymBuffer<unsigned char>& b) {
  if (captured && !b.empty())
    retired_buffers.push_back(std::move(b));
  else
    b = runtime::SymBuffer<unsigned char>();
}

void TpContext::Impl::retire(std::unique_ptr<runtime::Signals>& s) {
  if (captured && s)
    retired_signals.push_back(std::move(s));
  else
    s.reset();  // collective free, same order on every rank
}

void TpContext::Impl::drain(const char* what) {
  check_usable(what);
  try {
    if (lsa) {
      // Every Signals whose flags a stream of ours may rank_wait on.
      const std::initializer_list<const runtime::Signals*> all{control.get(), ag_flags.get(), rs_bands.get()};
      link::synchronize(pg.stream(), all, what);
      for (int i = 0; i < pg.comm_stream_count(); ++i) link::synchronize(pg.comm_stream(i), all, what);
      if (ring_stream) link::synchronize(ring_stream, all, what);
    } else {
      runtime::bounded_sync(pg.stream(), what, &pg);
      for (int i = 0; i < pg.comm_stream_count(); ++i) runtime::bounded_sync(pg.comm_stream(i), what, &pg);
      if (ring_stream) runtime::bounded_sync(ring_stream, what, &pg);
    }
  } catch (const Error& e) {
    // A stuck wait was released by storing its expected value: for a flag
    // that is harmless, but a counter (fused_ce's band tiles) then runs ahead
    // of the host's totals, and later waits would pass early; and a
    // collective that a peer never joined stays queued. Nothing in this
    // context can be trusted any more, and the communicator is aborted so
    // that no later call (or the teardown) waits for the missing peer.
    broken = e.what();
    pg.abort();
    throw;
  }
}

void TpContext::Impl::begin_call() {
  const CallStart st =
      flag_call_start(lsa, lsa ? runtime::capture_id(pg.stream()) : std::nullopt, captured, reset_capture);
  captured = st.captured;
  reset_capture = st.reset_capture;
  if (st.reset) reset_flags();
}

void TpContext::Impl::reset_flags() {
  cudaStream_t s = pg.stream();
  // Every call joins its side streams back into the compute stream, so a
  // barrier there follows all of this rank's earlier work.
  pg.align_streams(s);
  for (const runtime::Signals* sg : {ag_flags.get(), control.get(), rs_counters.get(), rs_bands.get()})
    sg->zero_local(s);
  pg.align_streams(s);
  ag_epoch = rs_epoch = 0;
  ag_ce_epoch = rs_ce_epoch = 0;  // the kernel-only diagnostics need a fused call first again
  std::fill(rs_band_total.begin(), rs_band_total.end(), 0);
}

void TpContext::Impl::check_usable(const char* what) const {
  TESSERA_CHECK(broken.empty(),
                "{}: this TpContext stopped at a failed synchronize ({}); its signal counters may be inconsistent — "
                "create a new TpContext",
                what, broken);
}

void TpContext::Impl::ensure_ag_ws(std::size_t bytes) {
  if (!lsa) {
    ag_local.ensure(bytes, pg.stream());
    return;
  }
  if (!ag_ws.empty() && ag_ws.bytes() >= bytes) return;
  before_growth("ag_gemm: workspace growth");
  pg.barrier();  // no peer still pushes into or reads the old workspace
  retire(ag_ws);
  ag_ws = runtime::SymBuffer<unsigned char>(pg, bytes);
}

void TpContext::Impl::ensure_rs(std::size_t recv_bytes, int tile_rows) {
  const bool grow_recv = rs_recv.empty() || rs_recv.bytes() < recv_bytes;
  const bool grow_counters = rs_counters->slots() < tile_rows;
  if (!grow_recv && !grow_counters) return;
  before_growth("gemm_rs: workspace growth");
  pg.barrier();
  if (grow_recv) {
    retire(rs_recv);
    rs_recv = runtime::SymBuffer<unsigned char>(pg, recv_bytes);
  }
  if (grow_counters) {
    retire(rs_counters);
    rs_counters = std::make_unique<runtime::Signals>(pg, std::max(tile_rows, 64));
  }
}

void TpContext::Impl::ensure_rs_bands(int bands) {
  if (rs_bands->slots() >= bands) return;
  before_growth("gemm_rs: band signal growth");
  pg.barrier();
  retire(rs_bands);
  rs_bands = std::make_unique<runtime::Signals>(pg, std::max(bands, 64));
  rs_band_total.assign(static_cast<std::size_t>(rs_bands->slots()), 0);
  rs_ce_epoch = 0;  // the new flags hold no epoch
}

void TpContext::Impl::ensure_ar(std::size_t recv_bytes) {
  if (!ar_recv.empty() && ar_recv.bytes() >= recv_bytes) return;
  before_growth("gemm_ar: workspace growth");
  pg.barrier();
  retire(ar_recv);
  ar_recv = runtime::SymBuffer<unsigned char>(pg, recv_bytes);
}

unsigned char* TpContext::Impl::ag_workspace() const {
  return lsa ? ag_ws.local() : static_cast<unsigned char*>(ag_local.get());
}

std::string_view rs_reduce_name(RsReduce r) { return r == RsReduce::kernel ? "kernel" : "epilogue"; }

TpContext::TpContext(runtime::ProcessGroup& pg) : pg_(&pg), impl_(std::make_unique<Impl>(pg)) {}
TpContext::~TpContext() = default;

tune::MachineId TpContext::machine() const { return detail::machine_id(*pg_); }

namespace {

ShapeSignature signature(const AgGemmArgs& a, Strategy s) {
  return ShapeSignature{1,
                        static_cast<std::int32_t>(a.dtype),
                        static_cast<std::int32_t>(s),
                        (a.swiglu ? 1 : 0) | (a.gathered_a ? 2 : 0) | (a.b_kn ? 4 : 0),
                        a.m,
                        a.n,
                        a.k};
}
ShapeSignature signature(const GemmRsArgs& a, Strategy s, RsReduce r, int channels) {
  // rs_reduce picks the counter layout, channels the ring's flag values,
  // b_kn the kernel: every rank must use the same.
  return ShapeSignature{2,
                        static_cast<std::int32_t>(a.dtype),
                        static_cast<std::int32_t>(s),
                        static_cast<std::int32_t>(r) | (a.b_kn ? 8 : 0) | (channels << 4),
                        a.m,
                        a.n,
                        a.k};
}

ShapeSignature signature(const GemmArArgs& a, Strategy s) {
  return ShapeSignature{4, static_cast<std::int32_t>(a.dtype), static_cast<std::int32_t>(s), 0, a.m, a.n, a.k};
}

/// The tuner's question for operator `op` ("ops.<op>" keys). M, N, K are
/// compared by ratio for a neighbour's choice; the rest are flags.
detail::TuneQuery tune_query(TpContext& ctx, DType dtype, const std::string& op, const std::vector<std::int64_t>& shape,
                             const OpOptions& o) {
  return detail::TuneQuery{tune::key_prefix(ctx.machine(), dtype, "ops." + op), shape, 3, o.use_cache, o.tune_on_miss};
}

template <class Args, class Run>
Strategy tune_choice(TpContext& ctx, const Args& a, const OpOptions& o, const std::string& op,
                     const std::vector<std::int64_t>& shape, const std::vector<Strategy>& candidates, Run&& run,
                     TuneReport* report) {
  auto& c = ctx.impl();
  const detail::TuneHooks hooks{[&](const char* what) { c.drain(what); }, std::forward<Run>(run)};
  return detail::tune_choice(c.pg, c.tune, tune_query(ctx, a.dtype, op, shape, o), candidates, hooks, report);
}

}  // namespace

namespace {
/// gemm_rs's tuner key shape. The fused candidate's speed depends on where
/// it reduces and on B's layout: part of the key (rs_reduce, plus 2 for B as
/// [K, N]; an NK key is as before).
std::vector<std::int64_t> rs_key_shape(const GemmRsArgs& a, const OpOptions& o) {
  return {a.m, a.n, a.k, static_cast<std::int64_t>(o.rs_reduce) | (a.b_kn ? 2 : 0)};
}

/// fused_ce GEMM+RS adds in the owner's epilogue: every shard boundary must
/// fall on a tile row of the RS tile (no tile with two owners).
bool rs_tile_row_shards(std::int64_t m, int world) {
  return world == 1 || shard_rows(m, world).per_rank % detail::kRsTileM == 0;
}
/// A strategy whose protocol needs tile-row shards (StrategyNeeds) is
/// refused on other shapes before anything launches; `instead` names what runs.
template <class Args>
void check_tile_row_shards(const TpRegistry<Args>& r, Strategy s, std::int64_t m, int world, const char* instead) {
  if (s == Strategy::automatic || !r.find(s).needs.tile_row_shards) return;
  TESSERA_CHECK(rs_tile_row_shards(m, world),
                "{}: strategy {} needs each rank's {} rows (ceil(M/R), M = {}, R = {}) to be a multiple of the {}-row "
                "tile; use {} or automatic",
                r.name(), strategy_name(s), shard_rows(m, world).per_rank, m, world, detail::kRsTileM, instead);
}
void check_rs_tile_rows(std::int64_t m, int world, const OpOptions& o) {
  check_tile_row_shards(gemm_rs_registry(), o.strategy, m, world, "fused_sm");
}

/// Without load/store reach only the NCCL-based strategy runs.
void check_reach(const TpContext::Impl& c, Strategy s, const char* op) {
  TESSERA_CHECK(c.lsa || !needs_lsa(s),
                "{}: strategy {} needs every rank load/store reachable, but only {} of {} ranks are (different "
                "nodes, no peer access, or TESSERA_NO_LSA=1 / TESSERA_TOPOLOGY=net); use sequential (NCCL) or "
                "automatic",
                op, strategy_name(s), c.pg.lsa_size(), c.pg.world());
}

/// Everything ag_gemm checks before it launches: usable context, arguments,
/// options, and (once per shape) the same call on every rank.
void check_ag_gemm(TpContext::Impl& c, const AgGemmArgs& a, const OpOptions& o) {
  c.check_usable("ag_gemm");
  validate(a, c.pg.rank(), c.pg.world());
  TESSERA_CHECK(o.channels >= 1 && o.channels <= kMaxChannels, "ag_gemm: channels = {} outside [1, {}]", o.channels,
                kMaxChannels);
  TESSERA_CHECK(o.comm_ctas >= 1 && o.comm_ctas < c.pg.sm_count(), "ag_gemm: comm_ctas = {} outside [1, {})",
                o.comm_ctas, c.pg.sm_count());
  TESSERA_CHECK(accepts(OpKind::ag_gemm, o.strategy), "ag_gemm: strategy {} is not an AG+GEMM strategy{}",
                strategy_name(o.strategy),
                o.strategy == Strategy::ring ? " (ring is gemm_rs's ring reduce-scatter)" : "");
  check_reach(c, o.strategy, "ag_gemm");
  c.check_agreement(signature(a, o.strategy), "ag_gemm");
}

/// The same for gemm_rs.
void check_gemm_rs(TpContext::Impl& c, const GemmRsArgs& a, const OpOptions& o) {
  c.check_usable("gemm_rs");
  validate(a, c.pg.rank(), c.pg.world());
  TESSERA_CHECK(o.comm_ctas >= 1 && o.comm_ctas < c.pg.sm_count(), "gemm_rs: comm_ctas = {} outside [1, {})",
                o.comm_ctas, c.pg.sm_count());
  check_rs_tile_rows(a.m, c.pg.world(), o);
  TESSERA_CHECK(o.channels >= 1 && o.channels <= kMaxChannels, "gemm_rs: channels (ring) = {} outside [1, {}]",
                o.channels, kMaxChannels);
  check_reach(c, o.strategy, "gemm_rs");
  c.check_agreement(signature(a, o.strategy, o.rs_reduce, o.channels), "gemm_rs");
}

/// The same for gemm_ar.
void check_gemm_ar(TpContext::Impl& c, const GemmArArgs& a, const OpOptions& o) {
  c.check_usable("gemm_ar");
  validate(a, c.pg.rank(), c.pg.world());
  TESSERA_CHECK(accepts(OpKind::gemm_ar, o.strategy),
                "gemm_ar: strategy {} is not implemented for GEMM+AllReduce (sequential, fused_ce or automatic)",
                strategy_name(o.strategy));
  check_tile_row_shards(gemm_ar_registry(), o.strategy, a.m, c.pg.world(), "sequential");
  TESSERA_CHECK(!o.diag_kernel_only && o.diag_skip == 0,
                "gemm_ar: diag_kernel_only / diag_skip are gemm_rs diagnostics");
  check_reach(c, o.strategy, "gemm_ar");
  c.check_agreement(signature(a, o.strategy), "gemm_ar");
}

}  // namespace

// Inside a CUDA-graph capture every strategy runs: the capture's first call
// resets the flags inside the graph (Impl::begin_call), so each replay
// starts from epoch 1. What cannot run there: tuning (automatic takes the
// measured choice of this shape or its nearest measured neighbour, else
// sequential, as with tune_on_miss off) and the kernel-only diagnostics.
namespace {

/// The options a call resolves with: inside a capture of the context's
/// stream, no tuning and no diagnostics (an error before anything is
/// enqueued); marks the context as captured.
OpOptions capture_options(TpContext::Impl& c, const OpOptions& o, const char* op) {
  if (!runtime::stream_capturing(c.pg.stream())) return o;
  c.captured = true;
  TESSERA_CHECK(!o.diag_kernel_only && o.diag_skip == 0,
                "{}: diag_kernel_only / diag_skip cannot be captured into a CUDA graph (they replay the flags of "
                "the last eager call)",
                op);
  OpOptions q = o;
  q.tune_on_miss = false;
  return q;
}

}  // namespace

// resolve() checks what the operator would (it may launch every candidate),
// so a bad call fails before anything runs; ag_gemm/gemm_rs check once and
// then resolve (check_agreement is cached per shape, so the second check
// costs no collective).
Strategy TpContext::resolve(const AgGemmArgs& a, const OpOptions& o, TuneReport* report) {
  check_ag_gemm(*impl_, a, o);
  const OpOptions q = capture_options(*impl_, o, "ag_gemm");
  if (q.strategy != Strategy::automatic) return q.strategy;
  // Flags: swiglu (1) and B's layout (2: [K, N]); an NK key is as before.
  const std::vector<std::int64_t> shape{a.m, a.n, a.k, (a.swiglu ? 1 : 0) | (a.b_kn ? 2 : 0)};
  return tune_choice(
      *this, a, q, "ag_gemm", shape, ag_gemm_candidates(impl_->pg.world(), impl_->lsa),
      [&](Strategy s) { run_ag_gemm(*impl_, a, s, o); }, report);
}

namespace {
/// resolve(GemmRsArgs) after check_gemm_rs (mlp() checks its GEMM+RS half
/// before the all-gather half launches, and resolves it later).
Strategy resolve_checked(TpContext& ctx, const GemmRsArgs& a, const OpOptions& o, TuneReport* report) {
  auto& c = ctx.impl();
  const OpOptions q = capture_options(c, o, "gemm_rs");
  if (q.strategy != Strategy::automatic) return q.strategy;
  return tune_choice(
      ctx, a, q, "gemm_rs", rs_key_shape(a, o),
      gemm_rs_candidates(c.pg.world(), rs_tile_row_shards(a.m, c.pg.world()), c.lsa),
      [&](Strategy s) { run_gemm_rs(c, a, s, o); }, report);
}
}  // namespace

Strategy TpContext::resolve(const GemmRsArgs& a, const OpOptions& o, TuneReport* report) {
  check_gemm_rs(*impl_, a, o);
  return resolve_checked(*this, a, o, report);
}

Strategy TpContext::resolve(const GemmArArgs& a, const OpOptions& o, TuneReport* report) {
  check_gemm_ar(*impl_, a, o);
  const OpOptions q = capture_options(*impl_, o, "gemm_ar");
  if (q.strategy != Strategy::automatic) return q.strategy;
  const std::vector<std::int64_t> shape{a.m, a.n, a.k};
  return tune_choice(
      *this, a, q, "gemm_ar", shape,
      gemm_ar_candidates(impl_->pg.world(), rs_tile_row_shards(a.m, impl_->pg.world()), impl_->lsa),
      [&](Strategy s) { run_gemm_ar(*impl_, a, s, o); }, report);
}

void gemm_ar(TpContext& ctx, const GemmArArgs& a, const OpOptions& o) {
  auto& c = ctx.impl();
  const Strategy s = ctx.resolve(a, o);  // checks everything first
  run_gemm_ar(c, a, s, o);
}

void ag_gemm(TpContext& ctx, const AgGemmArgs& a, const OpOptions& o) {
  auto& c = ctx.impl();
  const Strategy s = ctx.resolve(a, o);  // checks everything first
  run_ag_gemm(c, a, s, o);
}

void gemm_rs(TpContext& ctx, const GemmRsArgs& a, const OpOptions& o) {
  auto& c = ctx.impl();
  const Strategy s = ctx.resolve(a, o);  // checks everything first
  run_gemm_rs(c, a, s, o);
}

namespace {

/// The GEMM+RS choice an earlier call of this process made for `r`'s key
/// (measured, cached or guessed), without measuring.
std::optional<Strategy> known_choice(TpContext& ctx, const GemmRsArgs& r, const OpOptions& o) {
  return detail::agreed_choice(ctx.impl().tune, tune_query(ctx, r.dtype, "gemm_rs", rs_key_shape(r, o), o));
}

/// Each half's automatic choice is measured alone. Run back to back, an
/// overlapped half can cost its neighbour: its ranks finish apart and the
/// other half's first collective waits that out (bench mlp --random, seed 4:
/// S4422-H576-I15344's layer took 1.039x both halves sequential with a
/// fused_ce AG+GEMM that measured 0.87x alone). So the layer is timed once
/// per shape and pair with the halves' choices (the baseline) against both
/// halves sequential, by the tuner's paired rule: sequential replaces the
/// pair only where it won consistently. The pair is the baseline so that a
/// call that may not tune (OpOptions::tune_on_miss off, a CUDA-graph
/// capture) keeps the halves' choices, or a measured neighbour's verdict.
/// The key's flags hold the pair; its candidate named by the pair's first
/// overlapped half stands for "the halves' own choices", and that is what
/// the cache entry names. True: run both halves sequential.
bool keep_sequential_layer(TpContext& ctx, const MlpArgs& a, const AgGemmArgs& g, const GemmRsArgs& r, Strategy s_ag,
                           Strategy s_rs, const OpOptions& ag, const OpOptions& rs) {
  auto& c = ctx.impl();
  const std::vector<std::int64_t> shape{a.m, a.h, a.i_local, mlp_layer_key_flags(s_ag, s_rs)};
  const OpOptions q = capture_options(c, ag, "mlp");
  const Strategy keep = tune_choice(
      ctx, g, q, "mlp_layer", shape, mlp_layer_candidates(s_ag, s_rs),
      [&](Strategy s) {
        const bool seq = s == Strategy::sequential;
        run_ag_gemm(c, g, seq ? Strategy::sequential : s_ag, ag);
        run_gemm_rs(c, r, seq ? Strategy::sequential : s_rs, rs);
      },
      nullptr);
  return keep == Strategy::sequential;
}

/// What mlp() runs: both halves' arguments and strategies. On the first
/// call of a shape the GEMM+RS half is timed on this call's hidden, so the
/// all-gather half has run already (`ag_ran`).
struct MlpPlan {
  AgGemmArgs g;
  GemmRsArgs r;
  Strategy s_ag = Strategy::sequential, s_rs = Strategy::sequential;
  bool ag_ran = false;
};

MlpPlan plan_mlp(TpContext& ctx, const MlpArgs& a, const OpOptions& ag, const OpOptions& rs) {
  auto& c = ctx.impl();
  c.check_usable("mlp");
  validate(a, c.pg.rank(), c.pg.world());
  // Both halves refused before the first is enqueued.
  capture_options(c, ag, "mlp (all-gather half)");
  capture_options(c, rs, "mlp (reduce-scatter half)");
  const std::size_t hidden_bytes = static_cast<std::size_t>(a.m) * a.i_local * dtype_size(a.dtype);
  void* hidden = c.hidden.ensure(hidden_bytes, c.pg.stream());
  MlpPlan p;
  AgGemmArgs& g = p.g;
  g.a = a.x;
  g.b = a.w_gate_up;
  g.d = hidden;
  g.m = a.m;
  g.m_local = a.m_local;
  g.n = 2 * a.i_local;
  g.k = a.h;
  g.ldd = a.i_local;
  g.dtype = a.dtype;
  g.swiglu = true;
  GemmRsArgs& r = p.r;
  r.a = hidden;
  r.b = a.w_down;
  r.d = a.out;
  r.m = a.m;
  r.m_local = a.m_local;
  r.n = a.h;
  r.k = a.i_local;
  r.dtype = a.dtype;
  check_gemm_rs(c, r, rs);  // before the AG half launches (its tuning runs it)
  p.s_ag = ctx.resolve(g, ag);
  if (rs.strategy == Strategy::automatic && !known_choice(ctx, r, rs)) {
    run_ag_gemm(c, g, p.s_ag, ag);
    p.ag_ran = true;
  }
  p.s_rs = resolve_checked(ctx, r, rs, nullptr);
  const bool overlapped = p.s_ag != Strategy::sequential || p.s_rs != Strategy::sequential;
  if (ag.strategy == Strategy::automatic && rs.strategy == Strategy::automatic && overlapped &&
      keep_sequential_layer(ctx, a, g, r, p.s_ag, p.s_rs, ag, rs))
    p.s_ag = p.s_rs = Strategy::sequential;
  return p;
}

}  // namespace

std::pair<Strategy, Strategy> TpContext::resolve(const MlpArgs& a, const OpOptions& ag, const OpOptions& rs) {
  const MlpPlan p = plan_mlp(*this, a, ag, rs);
  return {p.s_ag, p.s_rs};
}

void mlp(TpContext& ctx, const MlpArgs& a, const OpOptions& ag, const OpOptions& rs) {
  auto& c = ctx.impl();
  const MlpPlan p = plan_mlp(ctx, a, ag, rs);
  if (!p.ag_ran) run_ag_gemm(c, p.g, p.s_ag, ag);
  run_gemm_rs(c, p.r, p.s_rs, rs);
}

}  // namespace tessera::ops
