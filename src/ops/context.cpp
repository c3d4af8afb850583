// TpContext: workspaces, agreement checks, the tuner, and the public
// operator entry points (validation → strategy → implementation).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "context_impl.hpp"
#include "device_ops.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/ops/tuner.hpp"
#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/wait_diagnostics.hpp"

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
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  TESSERA_CUDA_CHECK(cudaStreamIsCapturing(pg.stream(), &st));
  TESSERA_CHECK(st == cudaStreamCaptureStatusNone,
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

tune::MachineId TpContext::machine() const {
  // Choices made with and without load/store reach never share a key.
  return tune::MachineId{pg_->device_properties().name,
                         topology_key(env::get("TESSERA_TOPOLOGY"), pg_->lsa_reachable()), pg_->world()};
}

namespace {

ShapeSignature signature(const AgGemmArgs& a, Strategy s) {
  return ShapeSignature{1,
                        static_cast<std::int32_t>(a.dtype),
                        static_cast<std::int32_t>(s),
                        (a.swiglu ? 1 : 0) | (a.gathered_a ? 2 : 0),
                        a.m,
                        a.n,
                        a.k};
}
ShapeSignature signature(const GemmRsArgs& a, Strategy s, RsReduce r, int channels) {
  // rs_reduce picks the counter layout, channels the ring's flag values:
  // every rank must use the same.
  return ShapeSignature{2,
                        static_cast<std::int32_t>(a.dtype),
                        static_cast<std::int32_t>(s),
                        static_cast<std::int32_t>(r) | (channels << 4),
                        a.m,
                        a.n,
                        a.k};
}

ShapeSignature signature(const GemmArArgs& a, Strategy s) {
  return ShapeSignature{4, static_cast<std::int32_t>(a.dtype), static_cast<std::int32_t>(s), 0, a.m, a.n, a.k};
}

/// cuBLASLt GEMMs queued before every timed sample (sixteen 4096³ bf16
/// GEMMs, ~3.3 ms, on pseudo-random operands: 96 MiB, freed after tuning),
/// so that each candidate runs in the clock state of a loop that keeps the
/// GPU busy (the power cap), on a busy GPU with the whole call queued. The
/// GPU's clocks follow its load of the last few ms: after the idle gap
/// between samples, a 0.5 ms candidate ran at boost clocks, where cuBLASLt
/// is ~6 % faster than the engine's fused tile and decomposition wins MLP-1's
/// AG+GEMM near-tie that fused_ce wins at the cap (session 8: the load GEMMs
/// ran at 748 TFLOP/s with 3 of them, 697 with 8 — decomposition still
/// chosen — and 662 with 16, close to bench mlp's 620-660, where the tuner's
/// order matched bench mlp's; a 1.5 s warm-up before sampling changed nothing).
/// TESSERA_TUNE_LOAD=n runs n GEMMs instead (0: none).
class TunerLoad {
 public:
  explicit TunerLoad(cudaStream_t s) {
    if (gemms_ <= 0) return;
    for (int i = 0; i < 3; ++i) {
      TESSERA_CUDA_CHECK(cudaMalloc(&buf_[i], kBytes));
      detail::launch_fill_bf16(buf_[i], kN * kN, 0x5EEDu + i, s);
    }
  }
  ~TunerLoad() {
    for (void* p : buf_)
      if (p) cudaFree(p);  // cudaFree synchronizes the device: no GEMM still reads it
  }
  TunerLoad(const TunerLoad&) = delete;
  TunerLoad& operator=(const TunerLoad&) = delete;
  bool active() const { return buf_[0] != nullptr; }
  void run(cudaStream_t s) const {
    if (!buf_[0]) return;
    for (int i = 0; i < gemms_; ++i) {
      kernels::GemmArgs g{buf_[0], buf_[1], buf_[2], kN,          kN,          kN,
                          kN,      kN,      kN,      DType::bf16, DType::bf16, kernels::BLayout::NK};
      kernels::cublaslt_gemm(g, s);
    }
  }

 private:
  static constexpr std::int64_t kN = 4096;
  static constexpr std::size_t kBytes = kN * kN * 2;
  void* buf_[3] = {};
  int gemms_ = static_cast<int>(env::get_int("TESSERA_TUNE_LOAD", 16, 0, 256));
};

/// Median over `reps` of one call (after `warmup`), max over ranks.
/// Times every candidate run by run (repetition i runs each once, in order,
/// after a drain, a barrier, the TunerLoad GEMMs and a one-element
/// all-reduce that starts the ranks together — the barrier alone releases
/// them tens of µs apart, and that skew would count against every strategy
/// in proportion to how early it waits for a peer), so clock drift hits all
/// alike; returns the median of each, max over ranks.
/// `load_ms` (optional) receives the median time of the load GEMMs of each
/// sample (max over ranks): the clock state the candidates were timed in.
template <class Run>
std::map<Strategy, double> time_candidates(TpContext::Impl& c, const std::vector<Strategy>& candidates, Run&& run,
                                           int warmup, int reps, double* load_ms = nullptr) {
  cudaStream_t s = c.pg.stream();
  const TunerLoad load(s);
  std::vector<double> load_t;
  for (int i = 0; i < warmup; ++i)
    for (Strategy k : candidates) {
      load.run(s);
      run(k);
    }
  std::map<Strategy, std::vector<double>> t;
  cudaEvent_t e0, e1;
  TESSERA_CUDA_CHECK(cudaEventCreate(&e0));
  TESSERA_CUDA_CHECK(cudaEventCreate(&e1));
  cudaEvent_t l0, l1;
  TESSERA_CUDA_CHECK(cudaEventCreate(&l0));
  TESSERA_CUDA_CHECK(cudaEventCreate(&l1));
  for (int i = 0; i < reps; ++i)
    for (Strategy k : candidates) {
      c.drain("ops tuner");
      c.pg.barrier();
      TESSERA_CUDA_CHECK(cudaEventRecord(l0, s));
      load.run(s);
      TESSERA_CUDA_CHECK(cudaEventRecord(l1, s));
      c.pg.align_streams(s);
      TESSERA_CUDA_CHECK(cudaEventRecord(e0, s));
      run(k);
      TESSERA_CUDA_CHECK(cudaEventRecord(e1, s));
      c.drain("ops tuner");
      float ms = 0;
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      t[k].push_back(ms);
      if (load.active()) {
        TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, l0, l1));
        load_t.push_back(ms);
      }
    }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaEventDestroy(l0);
  cudaEventDestroy(l1);
  if (load_ms) {
    std::sort(load_t.begin(), load_t.end());
    *load_ms = c.pg.allreduce_max(load_t.empty() ? 0.0 : load_t[load_t.size() / 2]);
  }
  std::map<Strategy, double> out;
  for (auto& [k, v] : t) {
    std::sort(v.begin(), v.end());
    out[k] = c.pg.allreduce_max(v[v.size() / 2]);
  }
  return out;
}

template <class Args, class Run>
Strategy tune_choice(TpContext& ctx, const Args& a, const OpOptions& o, const std::string& op,
                     const std::vector<std::int64_t>& shape, const std::vector<Strategy>& candidates, Run&& run,
                     TuneReport* report) {
  auto& c = ctx.impl();
  const std::string key = choice_key(ctx.machine(), a.dtype, op, shape);
  if (auto it = c.memo.find(key); it != c.memo.end()) {
    if (report) report->chosen = it->second, report->from_cache = true;
    return it->second;
  }
  if (auto it = c.guessed.find(key); !o.tune_on_miss && it != c.guessed.end()) {
    if (report) report->chosen = it->second, report->from_cache = true;
    return it->second;
  }
  if (candidates.size() == 1) {  // e.g. no load/store reach: nothing to measure
    c.memo[key] = candidates.front();
    if (report) report->chosen = candidates.front(), report->from_cache = false;
    return candidates.front();
  }
  // Version 2: GEMM+RS on the ping-pong tile and fused_ce (choices timed on
  // the older kernels are not reused).
  if (o.use_cache && !c.cache) c.cache = std::make_unique<tune::Cache>("ops", 2);
  int cached = -1;
  if (o.use_cache) {
    if (auto j = c.cache->get(key))
      if (auto s = choice_from_json(*j))  // a strategy that is not a candidate here is ignored
        if (std::find(candidates.begin(), candidates.end(), *s) != candidates.end()) cached = static_cast<int>(*s);
  }
  const std::vector<int> all = c.pg.allgather(cached);
  if (cached > 0 && std::all_of(all.begin(), all.end(), [&](int v) { return v == cached; })) {
    const auto s = static_cast<Strategy>(cached);
    c.memo[key] = s;
    if (report) report->chosen = s, report->from_cache = true;
    return s;
  }
  if (!o.tune_on_miss) {
    // The nearest measured shape's choice (this process's or the cache's),
    // else sequential; a host exchange makes every rank take the same one.
    nlohmann::json pool = c.measured;
    if (o.use_cache) pool.update(c.cache->entries());
    const auto nb = nearest_choice(pool, tune::key_prefix(ctx.machine(), a.dtype, "ops." + op), shape, 3, candidates);
    const int mine = static_cast<int>(nb.value_or(Strategy::sequential));
    const std::vector<int> votes = c.pg.allgather(mine);
    const bool agree = std::all_of(votes.begin(), votes.end(), [&](int v) { return v == mine; });
    const Strategy s = agree ? static_cast<Strategy>(mine) : Strategy::sequential;
    c.guessed[key] = s;
    if (report) report->chosen = s, report->from_cache = agree && nb.has_value();
    return s;
  }
  double load_ms = 0;
  const std::map<Strategy, double> times = time_candidates(c, candidates, run, 2, 11, &load_ms);
  const Strategy best = choose_strategy(times);
  c.memo[key] = best;
  c.measured[key] = choice_to_json(best, times, shape);
  if (o.use_cache) c.cache->put(key, c.measured[key]);
  if (report) report->times_ms = times, report->chosen = best, report->from_cache = false, report->load_ms = load_ms;
  return best;
}

}  // namespace

namespace {
/// fused_ce GEMM+RS adds in the owner's epilogue: every shard boundary must
/// fall on a tile row of the RS tile (no tile with two owners).
bool rs_tile_row_shards(std::int64_t m, int world) {
  return world == 1 || shard_rows(m, world).per_rank % detail::kRsTileM == 0;
}
void check_fused_ce_rs(std::int64_t m, int world, const OpOptions& o) {
  TESSERA_CHECK(o.strategy != Strategy::fused_ce || rs_tile_row_shards(m, world),
                "gemm_rs: strategy fused_ce needs each rank's {} rows (ceil(M/R), M = {}, R = {}) to be a multiple "
                "of the {}-row tile; use fused_sm or automatic",
                shard_rows(m, world).per_rank, m, world, detail::kRsTileM);
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
  TESSERA_CHECK(o.strategy != Strategy::ring, "ag_gemm: strategy ring exists only for gemm_rs (ring reduce-scatter)");
  check_reach(c, o.strategy, "ag_gemm");
  c.check_agreement(signature(a, o.strategy), "ag_gemm");
}

/// The same for gemm_rs.
void check_gemm_rs(TpContext::Impl& c, const GemmRsArgs& a, const OpOptions& o) {
  c.check_usable("gemm_rs");
  validate(a, c.pg.rank(), c.pg.world());
  TESSERA_CHECK(o.comm_ctas >= 1 && o.comm_ctas < c.pg.sm_count(), "gemm_rs: comm_ctas = {} outside [1, {})",
                o.comm_ctas, c.pg.sm_count());
  check_fused_ce_rs(a.m, c.pg.world(), o);
  TESSERA_CHECK(o.channels >= 1 && o.channels <= kMaxChannels, "gemm_rs: channels (ring) = {} outside [1, {}]",
                o.channels, kMaxChannels);
  check_reach(c, o.strategy, "gemm_rs");
  c.check_agreement(signature(a, o.strategy, o.rs_reduce, o.channels), "gemm_rs");
}

/// The same for gemm_ar.
void check_gemm_ar(TpContext::Impl& c, const GemmArArgs& a, const OpOptions& o) {
  c.check_usable("gemm_ar");
  validate(a, c.pg.rank(), c.pg.world());
  TESSERA_CHECK(
      o.strategy == Strategy::automatic || o.strategy == Strategy::sequential || o.strategy == Strategy::fused_ce,
      "gemm_ar: strategy {} is not implemented for GEMM+AllReduce (sequential, fused_ce or automatic)",
      strategy_name(o.strategy));
  TESSERA_CHECK(o.strategy != Strategy::fused_ce || rs_tile_row_shards(a.m, c.pg.world()),
                "gemm_ar: strategy fused_ce needs each rank's {} rows (ceil(M/R), M = {}, R = {}) to be a multiple "
                "of the {}-row tile; use sequential or automatic",
                shard_rows(a.m, c.pg.world()).per_rank, a.m, c.pg.world(), detail::kRsTileM);
  TESSERA_CHECK(!o.diag_kernel_only && o.diag_skip == 0,
                "gemm_ar: diag_kernel_only / diag_skip are gemm_rs diagnostics");
  check_reach(c, o.strategy, "gemm_ar");
  c.check_agreement(signature(a, o.strategy), "gemm_ar");
}

}  // namespace

// Inside a CUDA-graph capture only the NCCL strategy runs: the others pair
// flags with a per-call epoch that a replay would repeat, and tuning cannot
// run there. automatic captures sequential; another explicit strategy is an
// error before anything is enqueued.
namespace {

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  TESSERA_CUDA_CHECK(cudaStreamIsCapturing(stream, &st));
  return st != cudaStreamCaptureStatusNone;
}

Strategy captured_strategy(Strategy s, const char* op) {
  TESSERA_CHECK(s == Strategy::automatic || s == Strategy::sequential,
                "{}: strategy {} cannot be captured into a CUDA graph (its flags carry a per-call epoch that a replay "
                "would repeat); capture sequential or automatic, which captures sequential",
                op, strategy_name(s));
  return Strategy::sequential;
}

}  // namespace

// resolve() checks what the operator would (it may launch every candidate),
// so a bad call fails before anything runs; ag_gemm/gemm_rs check once and
// then resolve (check_agreement is cached per shape, so the second check
// costs no collective).
Strategy TpContext::resolve(const AgGemmArgs& a, const OpOptions& o, TuneReport* report) {
  check_ag_gemm(*impl_, a, o);
  if (capturing(impl_->pg.stream())) {
    impl_->captured = true;
    return captured_strategy(o.strategy, "ag_gemm");
  }
  if (o.strategy != Strategy::automatic) return o.strategy;
  const std::vector<std::int64_t> shape{a.m, a.n, a.k, a.swiglu ? 1 : 0};
  return tune_choice(
      *this, a, o, "ag_gemm", shape, ag_gemm_candidates(impl_->pg.world(), impl_->lsa),
      [&](Strategy s) { run_ag_gemm(*impl_, a, s, o); }, report);
}

Strategy TpContext::resolve(const GemmRsArgs& a, const OpOptions& o, TuneReport* report) {
  check_gemm_rs(*impl_, a, o);
  if (capturing(impl_->pg.stream())) {
    impl_->captured = true;
    return captured_strategy(o.strategy, "gemm_rs");
  }
  if (o.strategy != Strategy::automatic) return o.strategy;
  // The fused candidate's speed depends on where it reduces: part of the key.
  const std::vector<std::int64_t> shape{a.m, a.n, a.k, static_cast<std::int64_t>(o.rs_reduce)};
  return tune_choice(
      *this, a, o, "gemm_rs", shape,
      gemm_rs_candidates(impl_->pg.world(), rs_tile_row_shards(a.m, impl_->pg.world()), impl_->lsa),
      [&](Strategy s) { run_gemm_rs(*impl_, a, s, o); }, report);
}

Strategy TpContext::resolve(const GemmArArgs& a, const OpOptions& o, TuneReport* report) {
  check_gemm_ar(*impl_, a, o);
  if (capturing(impl_->pg.stream())) {
    impl_->captured = true;
    return captured_strategy(o.strategy, "gemm_ar");
  }
  if (o.strategy != Strategy::automatic) return o.strategy;
  const std::vector<std::int64_t> shape{a.m, a.n, a.k};
  return tune_choice(
      *this, a, o, "gemm_ar", shape,
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

void mlp(TpContext& ctx, const MlpArgs& a, const OpOptions& ag, const OpOptions& rs) {
  auto& c = ctx.impl();
  c.check_usable("mlp");
  validate(a, c.pg.rank(), c.pg.world());
  if (capturing(c.pg.stream())) {  // both halves refused before the first is enqueued
    c.captured = true;
    captured_strategy(ag.strategy, "mlp (all-gather half)");
    captured_strategy(rs.strategy, "mlp (reduce-scatter half)");
  }
  check_fused_ce_rs(a.m, c.pg.world(), rs);  // before the AG half launches
  const std::size_t hidden_bytes = static_cast<std::size_t>(a.m) * a.i_local * dtype_size(a.dtype);
  void* hidden = c.hidden.ensure(hidden_bytes, c.pg.stream());
  AgGemmArgs g;
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
  ag_gemm(ctx, g, ag);
  GemmRsArgs r;
  r.a = hidden;
  r.b = a.w_down;
  r.d = a.out;
  r.m = a.m;
  r.m_local = a.m_local;
  r.n = a.h;
  r.k = a.i_local;
  r.dtype = a.dtype;
  gemm_rs(ctx, r, rs);
}

}  // namespace tessera::ops
