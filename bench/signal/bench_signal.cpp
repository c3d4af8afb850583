// `tessera bench signal` — signal-based overlap (FlashOverlap) of the GEMM
// engine with NCCL AllReduce / ReduceScatter, per GEMM size and per op:
//   GEMM alone (cuBLASLt), collective alone (NCCL), non-overlap (cuBLASLt
//   then NCCL), decomposition (4 row chunks, cuBLASLt + NCCL pipelined on two
//   streams), the predictive choice (the search's partition, or "no
//   overlap" when the model says that is faster) with its speedup, Tessera =
//   the verified choice (the searched partition and non-overlap are timed in
//   one interleaved loop; the partition is kept only when it measured
//   faster by --verdict-margin-pct, tune::keep_overlap, the rule of
//   SignalTuner::record_measured; --store-profile stores these verdicts in
//   the signal_plans cache), the searched overlapped partition measured even
//   when not chosen (for the predictor error), the seed's §6.4 bound, speedup,
//   fraction of bound; on shapes with few waves every partition is measured
//   (exhaustive) and compared with the searched one.
// Communicators (docs/design/signal.md): the overlapped groups, the
// offline curve and the per-group overhead run on signal::OverlapComm, a
// split of the process group's communicator with maxCTAs = --nccl-sms and
// no thread-block clusters (--nccl-comm split, the default), so that each
// group's NCCL kernel fits on the SMs the persistent GEMM leaves free. The
// baselines (comm, non-overlap, decomposition) keep the process group's
// communicator (NCCL defaults on sm_90: up to 32 CTAs in clusters of 4).
// On the default communicator the groups' collectives cannot start beside
// the persistent GEMM (nothing overlaps), so the searched plan also runs
// there ("overlap def comm") for a comparison in one run.
// Second table per op, "where the time goes": engine GEMM plain vs with the
// group epilogue, collective alone on each communicator, the plan's group
// collectives alone, a concurrency probe (engine GEMM || whole collective on
// unrelated data, each communicator), the GEMM's end inside the overlapped
// run, and the "nothing overlaps" model beside the overlap model.
// The prediction is the library's (tune::signal_overlap_cost on a
// tune::MachineProfile of the offline stage): the overlap model charges the
// GEMM a penalty per group launched beside it (signal::OverlapCost::
// gemm_penalty_per_group, learned from the shapes measured before each one,
// or --gemm-penalty-us), prices the slower collectives beside the GEMM
// (--comm-slowdown-pct), and predicts "no overlap" with an offline curve on
// the default communicator, so SignalTuner predicts exactly what this bench
// predicts from the stored profile. The summary reports the no-overlap
// prediction error and that curve against each shape's measured collective.
// --comm-slowdown-pct and --gemm-penalty-us default to 0 / learned; the
// fitted values for H200 x2 with 16 NCCL SMs are in docs/design/signal.md.
// Measured top-k refinement: the k best predicted overlapped
// partitions (--top-k, default 3; signal::PredictiveSearch::top_overlapped,
// exact) are timed with non-overlap in one interleaved loop (same warm-up and
// repetitions each); the verified choice is the fastest of them if it beats
// non-overlap by the verdict margin (SignalTuner::record_measured_candidates
// stores it). --top-k 1 is the session-5 behaviour; the table also shows the
// top-1 verdict from the same run, which candidate won and whether the top-k
// changed the choice, and a table of every candidate (predicted, measured).
// Its results (head to head against the sweep's best) are in
// bench/RESULTS-archive.md.
// Rows: the MLP down-projection shapes of WORKLOADS.md with TP = 2 (M = S,
// N = H, K = I/2: MLP-1..6, the >= 1.25x GEMM+AllReduce target) first, then
// 56 sweep sizes (M*N 16M..256M, K 2K..16K) in an interleaved order, so a
// run cut by the budget still spans the range.
// Offline stage per op first: NCCL bandwidth curve at dense sizes and the
// per-group wait+launch overhead (both wait modes); optionally stored as a
// tune::MachineProfile.
//   tessera run -n 2 -- tessera bench signal [--op ar,rs] [--budget-s 200]
//       [--shapes MxNxK,...] [--markdown FILE]
//
// Every GPU wait here is bounded (TESSERA_WAIT_TIMEOUT_MS, default 5 s, x4):
// a repetition that does not finish names the phase, the shape and, for the
// overlapped runs, the wave groups whose counters are short (CommDriver::
// synchronize), then throws; every rank prints the error and exits at once
// (no cudaFree / communicator teardown behind a stuck stream: that would
// hang and hide the diagnostic). Progress lines are flushed after every
// offline sub-step and shape. NCCL_RUNTIME_CONNECT defaults to 0 here so
// NCCL connects at init, never inside an enqueue behind a stream wait.
// Wall-clock budget (--budget-s): split evenly over the ops still to run;
// no new shape starts after an op's share is spent; tables and summaries
// are printed for what was measured.
//
// `tessera bench signal-kernels` — one GPU: plain RMSNorm vs RMSNorm fused
// with the post-communication un-reorder (AR tiles, RS sub-tiles, A2A
// sub-tokens), and the plain un-reorder copy; overhead in % (seed Table 5).
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "command.hpp"
#include "common/gpu_sleep.hpp"
#include "common/timing.hpp"
#include "signal/signal_bench_kernels.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"
#include "tessera/runtime/wait_diagnostics.hpp"
#include "tessera/signal/a2a.hpp"
#include "tessera/signal/comm_driver.hpp"
#include "tessera/signal/epilogue_tables.hpp"
#include "tessera/signal/overlap_comm.hpp"
#include "tessera/signal/predictive_search.hpp"
#include "tessera/signal/unreorder.hpp"
#include "tessera/tune/machine_profile.hpp"
#include "tessera/tune/signal_tuner.hpp"

namespace tessera::bench::signalb {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<std::string> ops{"ar", "rs"};
  std::vector<std::string> shapes;
  bool mlp = true;
  bool sweep = true;
  int nccl_sms = 16;
  std::string nccl_comm = "split";  ///< split: signal::OverlapComm; default: the process group's
  int nccl_cga = 0;                 ///< cgaClusterSize of the split communicator
  bool compare_default = true;      ///< also run the searched plan on the default communicator
  int reps = 10;
  int warmup = 3;
  int exh_reps = 5;
  int exh_max_waves = 9;
  /// Re-time the sweep's best against the choices head to head (row fields h2h_*).
  bool exh_confirm = true;
  int exh_confirm_reps = 20;
  double exh_cap_s = 2.0;
  double budget_s = 200;
  /// GEMM penalty per group (µs) for the model; < 0: learn it from the shapes
  /// measured so far (median of their in-run slowdowns; 0 for the first).
  double gemm_penalty_us = -1;
  /// Also run equal partitions of 1, 2, 3, 4, 6, 9 groups on every shape and
  /// record the GEMM's in-run slowdown per group count (docs/design/signal.md).
  bool group_sweep = false;
  /// The tuner overlaps only when predicted at least this much faster (%).
  double min_gain_pct = 3;
  /// The model's slowdown of a group collective beside the running GEMM (%;
  /// signal::OverlapCost::comm_slowdown_beside_gemm; 0 = the curve as is).
  double comm_slowdown_pct = 0;
  /// The measured verdict keeps an overlap only when it measured at least
  /// this much faster than non-overlap (%; tune::keep_overlap).
  double verdict_margin_pct = 1;
  /// Measured top-k refinement: the k best predicted overlapped partitions
  /// are timed beside non-overlap; the verified choice is the fastest of
  /// them (if it beats non-overlap by the verdict margin). 1: the searched
  /// partition only (the session-4/5 behaviour).
  int top_k = 3;
  std::string wait = "memop";
  bool store_profile = false;
  std::string topology = "NV18";
  std::string markdown;
};

struct Shape {
  std::int64_t m, n, k;
  std::string label;
};

std::vector<Shape> mlp_shapes() {
  // WORKLOADS.md Table 4 with TP = 2: the down projection [S, I/2] x [I/2, H].
  return {{8192, 4096, 5504, "MLP-1"},  {8192, 4096, 7168, "MLP-2"},  {8192, 3584, 7168, "MLP-3"},
          {8192, 4608, 18432, "MLP-4"}, {8192, 8192, 14336, "MLP-5"}, {8192, 8192, 14784, "MLP-6"}};
}

std::vector<Shape> sweep_shapes() {
  // M*N from 16M to 256M elements, K from 2K to 16K: 14 (M, N) x 4 K = 56,
  // visited with stride 17 (coprime with 56) so any prefix spans sizes and K.
  std::vector<Shape> s;
  for (std::int64_t m : {2048, 4096, 6144, 8192, 16384})
    for (std::int64_t n : {4096, 8192, 16384})
      if (m * n >= (16ll << 20) && m * n <= (256ll << 20))
        for (std::int64_t k : {2048, 4096, 8192, 16384}) s.push_back({m, n, k, ""});
  std::vector<Shape> order;
  for (std::size_t i = 0; i < s.size(); ++i) order.push_back(s[(i * 17) % s.size()]);
  return order;
}

Shape parse_shape(const std::string& t) {
  char x1 = 0, x2 = 0;
  long long m = 0, n = 0, k = 0;
  TESSERA_CHECK(std::sscanf(t.c_str(), "%lld%c%lld%c%lld", &m, &x1, &n, &x2, &k) == 5 && x1 == 'x' && x2 == 'x' &&
                    m > 0 && n > 0 && k > 0,
                "bench signal: shape '{}' is not MxNxK", t);
  return {m, n, k, ""};
}

struct DevMem {
  void* p = nullptr;
  explicit DevMem(std::size_t bytes) { TESSERA_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 256))); }
  // cudaFree synchronizes the device: while an exception unwinds (a stuck
  // wait) it would hang before the error is printed, so leak instead.
  ~DevMem() {
    if (std::uncaught_exceptions() == 0) cudaFree(p);
  }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Owned CUDA events (destroyed on every path, also when a wait throws).
struct Event {
  cudaEvent_t e = nullptr;
  explicit Event(unsigned flags = cudaEventDisableTiming) { TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&e, flags)); }
  ~Event() {
    if (e) cudaEventDestroy(e);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

// Progress lines (rank 0) with seconds since the command started, flushed.
struct Progress {
  Clock::time_point t0 = Clock::now();
  bool on = false;
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }
  template <class... A>
  void operator()(fmt::format_string<A...> f, A&&... a) const {
    if (!on) return;
    fmt::print("[{:7.1f} s] {}\n", elapsed(), fmt::format(f, std::forward<A>(a)...));
    std::fflush(stdout);  // a later hang must not swallow the lines that locate it
  }
};

std::uint64_t bench_timeout_ns() { return runtime::wait_timeout_ns() * 4; }

// Waits for `ev` by polling (never blocks in the driver), bounded by
// bench_timeout_ns(); checks NCCL's asynchronous error meanwhile. On
// timeout calls `stuck` (which may throw a better diagnostic, e.g. the short
// counters), then throws naming `what`.
// The split communicator of the overlapped runs (signal::OverlapComm), when
// there is one: its asynchronous errors are checked by every wait too.
ncclComm_t g_overlap_comm = nullptr;

void bounded_wait(cudaEvent_t ev, ncclComm_t comm, const std::string& what, const std::function<void()>& stuck) {
  const auto deadline = Clock::now() + std::chrono::nanoseconds(bench_timeout_ns());
  for (;;) {
    const cudaError_t rc = cudaEventQuery(ev);
    if (rc == cudaSuccess) return;
    if (rc != cudaErrorNotReady) TESSERA_CUDA_CHECK(rc);
    for (ncclComm_t c : {comm, g_overlap_comm}) {
      if (c == nullptr) continue;
      ncclResult_t async = ncclSuccess;
      TESSERA_NCCL_CHECK(ncclCommGetAsyncError(c, &async));
      TESSERA_CHECK(async == ncclSuccess, "bench signal: {}: NCCL asynchronous error {} ({})", what, int(async),
                    ncclGetErrorString(async));
    }
    if (Clock::now() > deadline) {
      if (stuck) stuck();
      TESSERA_FAIL(
          "bench signal: {} did not finish within {} ms (TESSERA_WAIT_TIMEOUT_MS x 4); GPU work is stuck "
          "or far slower than expected",
          what, bench_timeout_ns() / 1000000);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

// Median ms of `body` on `stream` over `reps` after `warmup`, max over ranks
// (all ranks call it together; a barrier and a rank alignment before every
// repetition). With
// `mid` (an event `body` records, e.g. after the GEMM), *mid_ms receives the
// median (max over ranks) of start -> mid.
double timed(runtime::ProcessGroup& pg, cudaStream_t stream, const std::function<void()>& body, int warmup, int reps,
             const std::string& what, const std::function<void()>& stuck = {}, cudaEvent_t mid = nullptr,
             double* mid_ms = nullptr) {
  Event start(cudaEventDefault), stop(cudaEventDefault);
  for (int i = 0; i < warmup; ++i) {
    pg.barrier();
    body();
  }
  TESSERA_CUDA_CHECK(cudaEventRecord(stop.e, stream));
  bounded_wait(stop.e, pg.nccl(), what + " (warm-up)", stuck);
  std::vector<double> t, tm;
  for (int i = 0; i < reps; ++i) {
    pg.barrier();
    pg.align_streams(stream);  // the ranks start each run together
    TESSERA_CUDA_CHECK(cudaEventRecord(start.e, stream));
    body();
    TESSERA_CUDA_CHECK(cudaEventRecord(stop.e, stream));
    bounded_wait(stop.e, pg.nccl(), what, stuck);
    float ms = 0;
    TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e, stop.e));
    t.push_back(ms);
    if (mid != nullptr) {
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e, mid));
      tm.push_back(ms);
    }
  }
  if (mid != nullptr && mid_ms != nullptr) *mid_ms = pg.allreduce_max(summarize(tm).median_ms);
  return pg.allreduce_max(summarize(t).median_ms);
}

// One body of an interleaved timing: what it runs, its name, the diagnostic
// for a stuck wait, and optionally an event it records (e.g. GEMM finished).
struct Timed {
  std::function<void()> body;
  std::string what;
  std::function<void()> stuck;
  cudaEvent_t mid = nullptr;
};
struct TimedResult {
  double ms = 0;      ///< median start -> end (max over ranks)
  double mid_ms = 0;  ///< median start -> mid, when the body has a mid event
};

// Several bodies timed in one interleaved loop, every body `reps` times; the
// order rotates every repetition (2 bodies: a b, b a, ...), so that clock
// and power drift hit all alike: the verdict "overlap vs no overlap"
// compares these medians (non-overlap and the top-k candidates). Same device
// time per body as timing each alone with `reps`.
std::vector<TimedResult> timed_interleaved(runtime::ProcessGroup& pg, cudaStream_t stream,
                                           const std::vector<Timed>& bodies, int warmup, int reps) {
  const std::size_t n = bodies.size();
  Event start(cudaEventDefault), stop(cudaEventDefault);
  std::string all;
  for (const Timed& b : bodies) all += (all.empty() ? "" : " / ") + b.what;
  for (int i = 0; i < warmup; ++i)
    for (const Timed& b : bodies) {
      pg.barrier();
      b.body();
    }
  TESSERA_CUDA_CHECK(cudaEventRecord(stop.e, stream));
  bounded_wait(stop.e, pg.nccl(), all + " (warm-up)", [&] {
    for (const Timed& b : bodies)
      if (b.stuck) b.stuck();
  });
  std::vector<std::vector<double>> t(n), tm(n);
  for (int i = 0; i < reps; ++i)
    for (std::size_t r = 0; r < n; ++r) {
      const Timed& b = bodies[(i + r) % n];
      pg.barrier();
      pg.align_streams(stream);
      TESSERA_CUDA_CHECK(cudaEventRecord(start.e, stream));
      b.body();
      TESSERA_CUDA_CHECK(cudaEventRecord(stop.e, stream));
      bounded_wait(stop.e, pg.nccl(), b.what, b.stuck);
      float ms = 0;
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e, stop.e));
      t[(i + r) % n].push_back(ms);
      if (b.mid != nullptr) {
        TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e, b.mid));
        tm[(i + r) % n].push_back(ms);
      }
    }
  std::vector<TimedResult> out(n);
  for (std::size_t r = 0; r < n; ++r) {
    out[r].ms = pg.allreduce_max(summarize(t[r]).median_ms);
    if (bodies[r].mid != nullptr) out[r].mid_ms = pg.allreduce_max(summarize(tm[r]).median_ms);
  }
  return out;
}

// Runs one collective of `elems` bf16 elements (op: ar or rs) from `send` into `recv`.
void collective(bool ar, const void* send, void* recv, std::int64_t elems, int world, ncclComm_t comm, cudaStream_t s) {
  if (ar)
    TESSERA_NCCL_CHECK(ncclAllReduce(send, recv, size_t(elems), ncclBfloat16, ncclSum, comm, s));
  else
    TESSERA_NCCL_CHECK(ncclReduceScatter(send, recv, size_t(elems / world), ncclBfloat16, ncclSum, comm, s));
}

// ---- offline stage: bandwidth curve and per-group overhead -----------------
// On `comm`: the communicator the overlapped groups use (the split one), so
// the predictor sees the bandwidth NCCL reaches on its reserved SMs.
tune::BandwidthCurve measure_curve(runtime::ProcessGroup& pg, ncclComm_t comm, bool ar, std::int64_t max_bytes,
                                   const Options& o, const Progress& progress) {
  const std::int64_t max_elems = max_bytes / 2;
  DevMem a(max_bytes), b(max_bytes);
  cudaStream_t s = pg.comm_stream(0);
  // Real values (uninitialized memory may hold NaNs/denormals).
  fill_random_bf16(a.p, max_elems, 3000 + pg.rank(), s);
  TESSERA_CUDA_CHECK(cudaGetLastError());
  std::vector<tune::BandwidthCurve::Point> pts;
  double prev = 0;
  for (double bytes = 64 * 1024; bytes <= double(max_bytes) * 1.0001; bytes *= std::sqrt(2.0)) {
    std::int64_t elems = static_cast<std::int64_t>(bytes / 2) / (8 * pg.world()) * (8 * pg.world());
    elems = std::min(elems, max_elems);
    const double ms = timed(
        pg, s, [&] { collective(ar, a.p, b.p, elems, pg.world(), comm, s); }, o.warmup, o.reps,
        fmt::format("offline curve, {} bytes", elems * 2));
    // A measured curve can wiggle by noise; keep time non-decreasing.
    prev = std::max(prev, ms * 1e-3);
    if (pts.empty() || double(elems * 2) > pts.back().bytes) pts.push_back({double(elems * 2), prev});
    if (pts.size() % 8 == 1)
      progress("  curve: {:.0f} KiB in {:.1f} us ({:.1f} GB/s)", double(elems * 2) / 1024, ms * 1e3,
               double(elems * 2) / (ms * 1e-3) * 1e-9);
  }
  const auto& last = pts.back();
  progress("  curve done: {} points, {:.0f} KiB {:.1f} us .. {:.0f} MiB {:.3f} ms ({:.1f} GB/s)", pts.size(),
           pts.front().bytes / 1024, pts.front().seconds * 1e6, last.bytes / (1 << 20), last.seconds * 1e3,
           last.bytes / last.seconds * 1e-9);
  return tune::BandwidthCurve(pts);
}

// Cost of one extra group: G waits (already satisfied) + G collectives of
// bytes/G against the curve's time for the pieces. Every call is epoch 1
// and each counter holds exactly its epoch-1 target, stored once from the
// counters' private stream before anything waits: the wait test is cyclic
// (comm_driver.hpp), so a sentinel such as 0xFFFFFFFF would never pass.
double measure_group_overhead(runtime::ProcessGroup& pg, ncclComm_t comm, bool ar, signal::WaitMode mode,
                              const tune::BandwidthCurve& curve, const Options& o) {
  const int G = 8;
  const std::int64_t tile = 128 * 128;
  const signal::WaveModel wm(signal::GemmTiling{128ll * 8 * G, 128 * 16, 128, 128}, 16);  // 8 tiles per row of waves
  const signal::GroupPlan plan = signal::GroupPlan::equal(wm, G);
  const std::int64_t elems = wm.tiles() * tile;
  DevMem buf(elems * 2), recv(elems * 2);
  signal::GroupCounters counters(G);
  signal::CommDriver drv(comm, pg.comm_stream(0), mode);
  for (int g = 0; g < G; ++g) counters.store(g, plan.counter_target(g, 1), runtime::wait_timeout_ns());
  const signal::ArMap am = signal::make_ar_map(wm);
  const signal::RsMap rm = signal::make_rs_map(wm, pg.world());
  const double ms = timed(
      pg, pg.comm_stream(0),
      [&] {
        if (ar)
          drv.all_reduce(plan, am, buf.p, DType::bf16, counters, 1);
        else
          drv.reduce_scatter(plan, rm, buf.p, recv.p, DType::bf16, counters, 1);
      },
      o.warmup, o.reps, fmt::format("offline per-group overhead ({})", signal::wait_mode_name(mode)),
      [&] { drv.synchronize(plan, counters, 1); });
  double pieces = 0;
  for (int g = 0; g < G; ++g) pieces += curve.time(double(plan.tiles_in(g)) * tile * 2);
  return std::max(0.0, (ms * 1e-3 - pieces) / G);
}

// ---- per-shape measurement --------------------------------------------------
struct Row {
  Shape shape;
  int waves = 0;
  std::string choice;    ///< tuner's final choice: partition or "no overlap"
  std::string searched;  ///< the searched overlapped partition
  double gemm = 0, comm = 0, seq = 0, decomp = 0, tessera = 0, bound = 0;
  double overlap_meas = 0, overlap_pred = 0, seq_pred = 0, chosen_pred = 0;
  bool overlap = false;             ///< the predictive choice overlaps
  bool verified_overlap = false;    ///< the measured verdict keeps the fastest top-k candidate
  bool verified1_overlap = false;   ///< what the verdict on the searched partition alone (top-1) would keep
  std::string verified;             ///< the verified choice: partition or "no overlap"
  std::vector<int> verified_waves;  ///< its partition (the fastest measured candidate)
  double verified_meas = 0;         ///< its measured time (ms)
  // The top-k candidates (index 0 = the searched partition): partition,
  // prediction and measurement (ms, interleaved with non-overlap).
  std::vector<std::vector<int>> cand_waves;
  std::vector<std::string> cand_str;
  std::vector<double> cand_pred, cand_meas;
  int fastest = 0;        ///< index of the fastest measured candidate
  double predictive = 0;  ///< the predictive choice, measured (ms)
  std::vector<int> searched_waves;
  signal::Raster raster = signal::Raster::AlongN;
  double rel_err = -1;
  // Exhaustive (measured) comparison, when run.
  bool exhaustive = false;
  int exh_count = 0;
  std::string exh_best;
  double exh_best_ms = 0, exh_searched_ms = 0;  ///< the predictive choice in the sweep
  double exh_verified_ms = 0;                   ///< the verified (top-k) choice in the sweep
  double exh_verified1_ms = 0;                  ///< the top-1 verified choice in the sweep
  std::vector<int> exh_best_waves;              ///< the sweep's best partition (empty: no overlap)
  // Head to head (--exhaustive-confirm): the sweep's best, the predictive,
  // verified and top-1 verified choices re-timed in one interleaved loop
  // (ms; 0 = not run). The sweep's minimum over 2^(W-1) noisy medians is
  // biased low (the winner's curse), so these are the fair comparison.
  double h2h_exh_ms = 0, h2h_searched_ms = 0, h2h_verified_ms = 0, h2h_verified1_ms = 0;
  double seconds = 0;
  tune::GemmTiming timing;  ///< for the stored machine profile
  tune::SignalQuery query;  ///< this shape as the library's tuner sees it
  // Where the time goes (all ms, medians, max over ranks):
  double engine_plain = 0;   ///< engine GEMM, plain epilogue, budgeted SMs, the overlap's tile
  double engine_epi = 0;     ///< the same with the group epilogue (reorder store + counter), 1 group
  double comm_ov = 0;        ///< whole collective alone on the overlap communicator
  double groups_alone = 0;   ///< the searched plan's group collectives alone (waits pre-satisfied)
  double beside_ov = 0;      ///< engine GEMM || whole collective (independent data), overlap comm
  double beside_def = 0;     ///< the same on the process group's (default) communicator
  double ov_gemm_end = 0;    ///< in the overlapped run: start -> GEMM finished
  double penalty_used = 0;   ///< GEMM penalty per group in this shape's model (ms)
  double penalty_seen = -1;  ///< (ov_gemm_end - engine_epi) / (groups - 1) (ms); -1 with one group
  struct SweepPoint {
    int groups;
    double overlap, gemm_end;  ///< ms
  };
  std::vector<SweepPoint> group_sweep;  ///< --group-sweep: equal partitions
  double overlap_def = -1;              ///< the searched plan overlapped on the default communicator (session-2 path)
  double serial_model = 0;              ///< engine_epi + sum of the groups' curve times: "nothing overlaps"
};

struct Problem {
  const Options& o;
  runtime::ProcessGroup& pg;
  bool ar;
  Shape sh;
  kernels::GemmArgs args;
  kernels::GemmOptions gopts;
  ncclComm_t ocomm;  ///< the overlapped groups' communicator (split, or pg.nccl())
};

std::string shape_name(const Shape& s) {
  return fmt::format("{}{}x{}x{}", s.label.empty() ? "" : s.label + " ", s.m, s.n, s.k);
}

// Tessera's overlapped GEMM + collective for one partition, set up once:
// body() enqueues one run (epoch + 1) on P.pg.stream(); stuck() names the
// short counters (and releases them) or the stuck collective, then throws;
// finish() waits for the last run's counters. `comm`: the communicator of
// the group collectives (nullptr: P.ocomm). `buf` / `recv` receive the data
// of the last run (AR: reordered buffer; RS: recv).
struct OverlapRun {
  Problem& P;
  signal::GroupPlan plan;
  signal::ArMap am;
  signal::RsMap rm;
  signal::DeviceEpilogueTables dt;
  signal::GroupCounters counters;
  signal::CommDriver drv;
  void *buf, *recv;
  Event fork, join, gemm_end{cudaEventDefault};
  std::uint64_t epoch = 0;

  OverlapRun(Problem& p, const signal::WaveModel& wm, const signal::GroupPlan& pl, signal::WaitMode mode, void* b,
             void* r, ncclComm_t comm = nullptr)
      : P(p),
        plan(pl),
        am(signal::make_ar_map(wm)),
        rm(signal::make_rs_map(wm, p.pg.world())),
        dt(p.ar ? signal::epilogue_tables(wm, plan, am) : signal::epilogue_tables(wm, plan, rm)),
        counters(plan.groups()),
        drv(comm != nullptr ? comm : p.ocomm, p.pg.comm_stream(0), mode),
        buf(b),
        recv(r) {}

  void body() {
    cudaStream_t cs = P.pg.stream(), ms = P.pg.comm_stream(0);
    ++epoch;
    TESSERA_CUDA_CHECK(cudaEventRecord(fork.e, cs));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(ms, fork.e));
    if (P.ar)
      drv.all_reduce(plan, am, buf, DType::bf16, counters, epoch);
    else
      drv.reduce_scatter(plan, rm, buf, recv, DType::bf16, counters, epoch);
    gemm_into_groups(P.args, P.gopts, {buf, &dt, counters.device()}, cs);
    TESSERA_CUDA_CHECK(cudaEventRecord(gemm_end.e, cs));
    TESSERA_CUDA_CHECK(cudaEventRecord(join.e, ms));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, join.e));
  }
  void stuck() { drv.synchronize(plan, counters, epoch); }
  void finish() { drv.synchronize(plan, counters, epoch); }
  std::string what() const {
    return fmt::format("{} overlap {} of {}", P.ar ? "ar" : "rs", plan.str(), shape_name(P.sh));
  }
};

// One overlapped partition timed alone; returns median ms (max over ranks).
// `gemm_end_ms`: when given, receives the median start -> GEMM finished.
double run_overlap(Problem& P, const signal::WaveModel& wm, const signal::GroupPlan& plan, signal::WaitMode mode,
                   void* buf, void* recv, int warmup, int reps, ncclComm_t comm = nullptr,
                   double* gemm_end_ms = nullptr) {
  OverlapRun run(P, wm, plan, mode, buf, recv, comm);
  const double t_ms = timed(
      P.pg, P.pg.stream(), [&] { run.body(); }, warmup, reps, run.what(), [&] { run.stuck(); },
      gemm_end_ms != nullptr ? run.gemm_end.e : nullptr, gemm_end_ms);
  run.finish();
  return t_ms;
}

// The plan's group collectives alone on P.ocomm (no GEMM): every call is
// epoch 1 and each counter holds exactly its epoch-1 target (stored once,
// see measure_group_overhead), so the waits pass at once.
double groups_alone(Problem& P, const signal::WaveModel& wm, const signal::GroupPlan& plan, void* buf, void* recv) {
  signal::GroupCounters counters(plan.groups());
  for (int g = 0; g < plan.groups(); ++g) counters.store(g, plan.counter_target(g, 1), runtime::wait_timeout_ns());
  signal::CommDriver drv(P.ocomm, P.pg.comm_stream(0), signal::WaitMode::StreamMemOp);
  const signal::ArMap am = signal::make_ar_map(wm);
  const signal::RsMap rm = signal::make_rs_map(wm, P.pg.world());
  return timed(
      P.pg, P.pg.comm_stream(0),
      [&] {
        if (P.ar)
          drv.all_reduce(plan, am, buf, DType::bf16, counters, 1);
        else
          drv.reduce_scatter(plan, rm, buf, recv, DType::bf16, counters, 1);
      },
      P.o.warmup, P.o.reps, fmt::format("group collectives alone {} of {}", plan.str(), shape_name(P.sh)),
      [&] { drv.synchronize(plan, counters, 1); });
}

// Relative error (RMS) of the last overlapped run against cuBLASLt + NCCL
// (different GEMM kernels: bf16-level agreement), rows sampled every 7th.
double check_result(Problem& P, const signal::WaveModel& wm, void* buf, void* recv, void* D, void* C) {
  runtime::ProcessGroup& pg = P.pg;
  const Shape sh = P.sh;
  const int R = pg.world();
  const std::int64_t mn = sh.m * sh.n;
  cudaStream_t cs = pg.stream();
  kernels::cublaslt_gemm(P.args, cs);
  // The reference is the full reduced matrix (RS rows are block-cyclic).
  TESSERA_NCCL_CHECK(ncclAllReduce(D, C, size_t(mn), ncclBfloat16, ncclSum, pg.nccl(), cs));
  const signal::ArMap am = signal::make_ar_map(wm);
  const signal::RsMap rm = signal::make_rs_map(wm, R);
  const std::int64_t rows_out = P.ar ? sh.m : rm.rows_of(pg.rank());
  DevMem out(rows_out * sh.n * 2);
  if (P.ar)
    signal::unreorder(am, buf, out.p, sh.n, DType::bf16, cs);
  else
    signal::unreorder(signal::RsShard{rm, pg.rank()}, recv, out.p, sh.n, DType::bf16, cs);
  Event done;
  TESSERA_CUDA_CHECK(cudaEventRecord(done.e, cs));
  bounded_wait(done.e, pg.nccl(), "correctness reference of " + shape_name(sh), {});
  std::vector<std::uint16_t> got(rows_out * sh.n), ref(mn);
  TESSERA_CUDA_CHECK(cudaMemcpy(got.data(), out.p, got.size() * 2, cudaMemcpyDeviceToHost));
  TESSERA_CUDA_CHECK(cudaMemcpy(ref.data(), C, ref.size() * 2, cudaMemcpyDeviceToHost));
  const auto f = [](std::uint16_t h) {
    const std::uint32_t u = std::uint32_t(h) << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return double(x);
  };
  double num = 0, den = 0;
  for (std::int64_t l = 0; l < rows_out; l += 7) {
    const std::int64_t i = P.ar ? l : rm.global_row(pg.rank(), l);
    for (std::int64_t j = 0; j < sh.n; ++j) {
      const double g = f(got[l * sh.n + j]), r = f(ref[i * sh.n + j]);
      num += (g - r) * (g - r);
      den += r * r;
    }
  }
  const double err = std::isfinite(num) && den > 0 ? std::sqrt(num / den) : INFINITY;
  return pg.allreduce_max(err);
}

// One shape's operands, baselines' buffers and timing settings: what every
// step of measure() shares.
struct ShapeData {
  Problem& P;
  const Options& o;
  runtime::ProcessGroup& pg;
  const Shape sh;
  const bool ar;
  const int R;
  const signal::WaitMode mode;
  const tune::MachineProfile& model;
  const tune::Collective coll;
  const tune::BandwidthCurve& curve;
  const std::string name;
  const std::int64_t mn;
  DevMem A, B, D, C;
  kernels::GemmArgs args;
  cudaStream_t cs, ms;
  const int W, N;  ///< warm-up and timed repetitions

  ShapeData(Problem& p, const tune::MachineProfile& m, signal::WaitMode wait)
      : P(p),
        o(p.o),
        pg(p.pg),
        sh(p.sh),
        ar(p.ar),
        R(p.pg.world()),
        mode(wait),
        model(m),
        coll(p.ar ? tune::Collective::AllReduce : tune::Collective::ReduceScatter),
        curve(m.curve(coll)),
        name(fmt::format("{} {}", p.ar ? "ar" : "rs", shape_name(p.sh))),
        mn(p.sh.m * p.sh.n),
        A(sh.m * sh.k * 2),
        B(sh.n * sh.k * 2),
        D(mn * 2),
        C(mn * 2),
        cs(pg.stream()),
        ms(pg.comm_stream(0)),
        W(o.warmup),
        N(o.reps) {
    fill_random_bf16(A.p, sh.m * sh.k, 1000 + pg.rank(), pg.stream());
    fill_random_bf16(B.p, sh.n * sh.k, 2000 + pg.rank(), pg.stream());
    TESSERA_CUDA_CHECK(cudaGetLastError());
    args.a = A.p;
    args.b = B.p;
    args.d = D.p;
    args.m = sh.m;
    args.n = sh.n;
    args.k = sh.k;
  }

  /// The non-overlapped baseline: cuBLASLt, then NCCL.
  void non_overlap() const {
    kernels::cublaslt_gemm(args, cs);
    collective(ar, D.p, C.p, mn, R, pg.nccl(), cs);
  }
};

// The overlapped GEMM's set-up: SMs minus NCCL's, the engine's tile for that
// budget (stored in P.args / P.gopts), its wave model and the reordered
// buffers the group collectives run on.
struct OverlapSetup {
  kernels::TileShape ts;
  signal::WaveModel wm;
  signal::ArMap am;
  DevMem buf, recv;

  explicit OverlapSetup(ShapeData& d)
      : ts(configure(d)),
        wm(signal::GemmTiling{d.sh.m, d.sh.n, ts.bm, ts.bn}, d.P.gopts.max_ctas, d.P.gopts.raster_group,
           d.P.gopts.raster_along_m ? signal::Raster::AlongM : signal::Raster::AlongN),
        am(check_and_map(d, wm, ts)),
        buf(am.buffer_elems() * 2),
        recv(am.buffer_elems() * 2 / d.R + 256) {}

  double bytes_per_tile() const { return double(ts.bm) * ts.bn * 2; }

 private:
  static kernels::TileShape configure(ShapeData& d) {
    d.P.args = d.args;
    d.P.gopts = kernels::GemmOptions{};
    d.P.gopts.max_ctas = d.pg.sm_count() - d.o.nccl_sms;
    d.P.gopts.tile = kernels::resolve_tile(d.args, d.P.gopts);
    return kernels::tile_shape(d.P.gopts.tile);
  }
  static signal::ArMap check_and_map(const ShapeData& d, const signal::WaveModel& wm, const kernels::TileShape& ts) {
    TESSERA_CHECK(d.ar || ts.bm % d.R == 0, "bench signal: tile height {} not divisible by {} ranks", ts.bm, d.R);
    return signal::make_ar_map(wm);
  }
};

// cuBLASLt alone, NCCL alone, and the decomposition baseline (4 row chunks,
// each one's collective on the comm stream behind its GEMM).
void measure_baselines(ShapeData& d, Row& row) {
  runtime::ProcessGroup& pg = d.pg;
  const Shape& sh = d.sh;
  cudaStream_t cs = d.cs, ms = d.ms;
  row.gemm = timed(
      pg, cs, [&] { kernels::cublaslt_gemm(d.args, cs); }, d.W, d.N, d.name + ": cuBLASLt GEMM");
  row.comm = timed(
      pg, cs, [&] { collective(d.ar, d.D.p, d.C.p, d.mn, d.R, pg.nccl(), cs); }, d.W, d.N, d.name + ": NCCL");
  const int chunks = 4;
  std::vector<std::unique_ptr<Event>> ev;
  for (int c = 0; c < chunks; ++c) ev.push_back(std::make_unique<Event>());
  Event fork, join;
  const std::int64_t rows = (sh.m / chunks + 127) / 128 * 128;
  const int R = d.R;
  const bool ar = d.ar;
  row.decomp = timed(
      pg, cs,
      [&] {
        TESSERA_CUDA_CHECK(cudaEventRecord(fork.e, cs));
        TESSERA_CUDA_CHECK(cudaStreamWaitEvent(ms, fork.e));
        for (int c = 0; c < chunks; ++c) {
          const std::int64_t r0 = c * rows, r1 = std::min(sh.m, r0 + rows);
          if (r0 >= r1) break;
          kernels::GemmArgs part = d.args;
          part.a = static_cast<const char*>(d.args.a) + r0 * sh.k * 2;
          part.d = static_cast<char*>(d.args.d) + r0 * sh.n * 2;
          part.m = r1 - r0;
          kernels::cublaslt_gemm(part, cs);
          TESSERA_CUDA_CHECK(cudaEventRecord(ev[c]->e, cs));
          TESSERA_CUDA_CHECK(cudaStreamWaitEvent(ms, ev[c]->e));
          const std::int64_t e = (r1 - r0) * sh.n / (ar ? 1 : R) * (ar ? 1 : R);
          collective(ar, part.d, static_cast<char*>(d.C.p) + r0 * sh.n * 2 / (ar ? 1 : R), e, R, pg.nccl(), ms);
        }
        TESSERA_CUDA_CHECK(cudaEventRecord(join.e, ms));
        TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, join.e));
      },
      d.W, d.N, d.name + ": decomposition");
}

// Compute alone under overlap conditions (budgeted SMs, group epilogue, one
// group; row.engine_epi). Also loads the GEMM kernel's module before any
// stream wait. Beside it: the plain engine GEMM (same tile, same SMs, its
// standard epilogue), so the group epilogue's own cost shows (engine+epi /
// plain), the whole collective alone on the overlap communicator, and the
// concurrency probes.
void measure_compute_alone(ShapeData& d, OverlapSetup& ov, Row& row) {
  runtime::ProcessGroup& pg = d.pg;
  Problem& P = d.P;
  cudaStream_t cs = d.cs, ms = d.ms;
  const signal::GroupPlan one = signal::GroupPlan::single(ov.wm);
  const signal::DeviceEpilogueTables dt(signal::epilogue_tables(ov.wm, one, ov.am));
  signal::GroupCounters cnt(1);
  const auto engine_one_group = [&] { gemm_into_groups(P.args, P.gopts, {ov.buf.p, &dt, cnt.device()}, cs); };
  row.engine_epi = timed(pg, cs, engine_one_group, d.W, d.N, d.name + ": engine GEMM on the budgeted SMs");
  kernels::GemmArgs plain = d.args;  // writes D (row-major), the baselines' buffer
  row.engine_plain = timed(
      pg, cs, [&] { kernels::gemm(plain, P.gopts, cs); }, d.W, d.N, d.name + ": engine GEMM, plain epilogue");
  // The whole collective on the overlap communicator, alone.
  row.comm_ov = timed(
      pg, cs, [&] { collective(d.ar, d.D.p, d.C.p, d.mn, d.R, P.ocomm, cs); }, d.W, d.N,
      d.name + ": NCCL on the overlap communicator");
  // Concurrency probe: the engine GEMM and a whole collective on unrelated
  // data, on two streams, no waits. ~max(GEMM, comm) when NCCL runs beside
  // the GEMM on the free SMs; ~GEMM + comm when it cannot start until the
  // GEMM's CTAs retire (what the default communicator shows).
  const auto beside = [&](ncclComm_t comm, const char* which) {
    Event f, j;
    return timed(
        pg, cs,
        [&] {
          TESSERA_CUDA_CHECK(cudaEventRecord(f.e, cs));
          TESSERA_CUDA_CHECK(cudaStreamWaitEvent(ms, f.e));
          engine_one_group();  // first, as in the overlapped run: the GEMM holds its SMs when NCCL launches
          collective(d.ar, d.D.p, d.C.p, d.mn, d.R, comm, ms);
          TESSERA_CUDA_CHECK(cudaEventRecord(j.e, ms));
          TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, j.e));
        },
        d.W, d.N, fmt::format("{}: engine GEMM beside NCCL ({} communicator)", d.name, which));
  };
  row.beside_ov = beside(P.ocomm, "overlap");
  row.beside_def = P.ocomm == pg.nccl() ? row.beside_ov : beside(pg.nccl(), "default");
}

// Predict and search (online stage) with the library's model, from the
// profile that --store-profile stores (so SignalTuner predicts the same).
// "No overlap" runs its collective on the process group's (default)
// communicator, not on the split one: it is predicted with the default
// communicator's offline curve (the split curve biased the search towards
// overlap; docs/design/signal.md). Returns the searched partition's plan.
signal::GroupPlan predict(const ShapeData& d, const OverlapSetup& ov, Row& row) {
  const signal::WaveModel& wm = ov.wm;
  const kernels::GemmOptions& g = d.P.gopts;
  row.timing = {d.sh.m,         d.sh.n,         d.sh.k,     ov.ts.bm,
                ov.ts.bn,       g.raster_group, g.max_ctas, row.engine_epi * 1e-3 / wm.waves(),
                row.gemm * 1e-3};
  row.query = tune::SignalQuery{d.coll, d.sh.m, d.sh.n, d.sh.k, ov.ts.bm, ov.ts.bn, g.raster_group, wm.order().raster};
  const signal::OverlapCost cost = tune::signal_overlap_cost(d.model, row.query, row.timing);
  row.penalty_used = d.model.gemm_penalty_per_group * 1e3;
  const signal::PredictiveSearch search(cost, d.o.min_gain_pct / 100);
  // The k best overlapped partitions by prediction; candidate 0 is the
  // searched one (best_overlapped(), tested in signal_search_test).
  const std::vector<signal::Prediction> cands = search.top_overlapped(d.o.top_k);
  const signal::Prediction& searched = cands.front();
  const signal::Prediction final_choice = search.best();
  const signal::GroupPlan searched_plan(wm, searched.waves_per_group);
  row.overlap = final_choice.overlap;
  row.searched = searched_plan.str();
  row.searched_waves = searched.waves_per_group;
  row.raster = wm.order().raster;
  row.choice = row.overlap ? row.searched : "no overlap";
  row.overlap_pred = searched.latency * 1e3;
  row.seq_pred = search.predict_sequential() * 1e3;
  row.chosen_pred = final_choice.latency * 1e3;
  for (const signal::Prediction& c : cands) {
    row.cand_waves.push_back(c.waves_per_group);
    row.cand_str.push_back(signal::GroupPlan(wm, c.waves_per_group).str());
    row.cand_pred.push_back(c.latency * 1e3);
  }
  return searched_plan;
}

// Non-overlap and the given partitions in one interleaved loop, every one
// with the same warm-up and `reps` repetitions. The runs stay set up (and
// finished) so that one can run again; t[0] is non-overlap's.
struct InterleavedPartitions {
  std::vector<std::unique_ptr<OverlapRun>> runs;
  std::vector<TimedResult> t;

  InterleavedPartitions(ShapeData& d, OverlapSetup& ov, const std::vector<std::vector<int>>& parts,
                        const std::string& non_overlap_name, bool gemm_end, int reps) {
    std::vector<Timed> bodies{{[&d] { d.non_overlap(); }, d.name + non_overlap_name, {}, nullptr}};
    for (const auto& w : parts) {
      runs.push_back(
          std::make_unique<OverlapRun>(d.P, ov.wm, signal::GroupPlan(ov.wm, w), d.mode, ov.buf.p, ov.recv.p));
      OverlapRun* r = runs.back().get();
      bodies.push_back({[r] { r->body(); }, r->what(), [r] { r->stuck(); }, gemm_end ? r->gemm_end.e : nullptr});
    }
    t = timed_interleaved(d.pg, d.cs, bodies, d.W, reps);
    for (auto& r : runs) r->finish();
  }
};

// The searched partition is measured in every case (predictor error): first
// on the default communicator (for comparison), then with the other top-k
// candidates on the overlap one, whose fastest result is checked.
void measure_candidates(ShapeData& d, OverlapSetup& ov, const signal::GroupPlan& searched_plan, Row& row) {
  if (d.o.compare_default && d.P.ocomm != d.pg.nccl())
    row.overlap_def = run_overlap(d.P, ov.wm, searched_plan, d.mode, ov.buf.p, ov.recv.p, d.W, d.N, d.pg.nccl());
  // The measured verdict (tune::keep_overlap, as SignalTuner::record_measured
  // of the candidates) compares these medians.
  InterleavedPartitions m(d, ov, row.cand_waves, ": non-overlap", true, d.N);
  row.seq = m.t[0].ms;
  for (std::size_t c = 0; c < m.runs.size(); ++c) {
    row.cand_meas.push_back(m.t[c + 1].ms);
    if (m.t[c + 1].ms < row.cand_meas[row.fastest]) row.fastest = static_cast<int>(c);  // ties: better predicted
  }
  row.overlap_meas = row.cand_meas[0];
  row.ov_gemm_end = m.t[1].mid_ms;
  // The result checked is the fastest candidate's: one more run of it (the
  // interleaved loop's last run may be another partition; they all write the
  // same layout, but the check must be of the chosen one).
  m.runs[row.fastest]->body();
  m.runs[row.fastest]->finish();
  row.rel_err = check_result(d.P, ov.wm, ov.buf.p, ov.recv.p, d.D.p, d.C.p);
}

// Where the time goes: the GEMM's slowdown per group launched beside it, the
// group collectives alone, the equal-partition sweep, the serial model.
void measure_diagnostics(ShapeData& d, OverlapSetup& ov, const signal::GroupPlan& searched_plan, Row& row) {
  const signal::WaveModel& wm = ov.wm;
  // What each group launched during the GEMM cost it in this run: the slowdown
  // of the GEMM inside the overlapped run over its groups but the last.
  if (searched_plan.groups() > 1)
    row.penalty_seen = std::max(0.0, row.ov_gemm_end - row.engine_epi) / (searched_plan.groups() - 1);
  row.groups_alone = groups_alone(d.P, wm, searched_plan, ov.buf.p, ov.recv.p);
  if (d.o.group_sweep)
    for (int G : {1, 2, 3, 4, 6, 9}) {
      if (G > wm.waves()) break;
      std::vector<int> parts;  // W waves in G nearly equal groups, larger ones first
      for (int g = 0; g < G; ++g) parts.push_back(wm.waves() / G + (g < wm.waves() % G ? 1 : 0));
      double end_ms = 0;
      const double t =
          run_overlap(d.P, wm, signal::GroupPlan(wm, parts), d.mode, ov.buf.p, ov.recv.p, d.W, d.N, nullptr, &end_ms);
      row.group_sweep.push_back({G, t, end_ms});
    }
  double sum = 0;
  for (int g = 0; g < searched_plan.groups(); ++g)
    sum += d.model.per_group_overhead + d.curve.time(double(searched_plan.tiles_in(g)) * ov.bytes_per_tile());
  row.serial_model = row.engine_epi + sum * 1e3;
}

// The predictive choice, measured; then the verified one: the fastest
// measured top-k candidate is kept only when it measured faster than
// non-overlap by the verdict margin (tune::keep_overlap, as SignalTuner::
// record_measured); verified1: the same rule on the searched partition
// alone (what --top-k 1 decides, from the same measurements).
void verdict(const Options& o, Row& row) {
  row.predictive = row.overlap ? row.overlap_meas : row.seq;
  row.verified_meas = row.cand_meas[row.fastest];
  row.verified_waves = row.cand_waves[row.fastest];
  row.verified_overlap = tune::keep_overlap(row.verified_meas, row.seq, o.verdict_margin_pct / 100);
  row.verified1_overlap = tune::keep_overlap(row.overlap_meas, row.seq, o.verdict_margin_pct / 100);
  row.verified = row.verified_overlap ? row.cand_str[row.fastest] : "no overlap";
  row.tessera = row.verified_overlap ? row.verified_meas : row.seq;
}

// Head to head (--exhaustive-confirm): every distinct partition among
// {sweep's best, searched, verified} and non-overlap, interleaved with equal
// warm-up and repetitions; each choice then reads its partition's median (or
// non-overlap's).
void exhaustive_confirm(ShapeData& d, OverlapSetup& ov, Row& row) {
  std::vector<std::vector<int>> parts;
  const auto index_of = [&](const std::vector<int>& w) -> int {
    if (w.empty()) return -1;  // no overlap
    for (std::size_t i = 0; i < parts.size(); ++i)
      if (parts[i] == w) return static_cast<int>(i);
    parts.push_back(w);
    return static_cast<int>(parts.size()) - 1;
  };
  const int i_exh = index_of(row.exh_best_waves);
  const int i_searched = index_of(row.overlap ? row.searched_waves : std::vector<int>{});
  const int i_verified = index_of(row.verified_overlap ? row.verified_waves : std::vector<int>{});
  const int i_verified1 = index_of(row.verified1_overlap ? row.searched_waves : std::vector<int>{});
  const InterleavedPartitions m(d, ov, parts, ": non-overlap (head to head)", false, d.o.exh_confirm_reps);
  const auto ms_of = [&](int i) { return m.t[static_cast<std::size_t>(i + 1)].ms; };  // -1 -> non-overlap
  row.h2h_exh_ms = ms_of(i_exh);
  row.h2h_searched_ms = ms_of(i_searched);
  row.h2h_verified_ms = ms_of(i_verified);
  row.h2h_verified1_ms = ms_of(i_verified1);
}

// Exhaustive (measured) partition search, on shapes with few waves: every
// one of the 2^(W-1) partitions timed alone.
void measure_exhaustive(ShapeData& d, OverlapSetup& ov, Row& row) {
  const int waves = ov.wm.waves();
  const double exh_cost_s = std::ldexp(1.0, waves - 1) * (d.o.exh_reps + 1) * (row.engine_epi + 0.3) * 1e-3;
  if (waves > d.o.exh_max_waves || exh_cost_s > d.o.exh_cap_s) return;
  row.exhaustive = true;
  row.exh_best_ms = row.seq;  // "no overlap" is a candidate too
  row.exh_best = "no overlap";
  for (unsigned long long mask = 0; mask < (1ull << (waves - 1)); ++mask) {
    std::vector<int> groups;
    int last = 0;
    for (int i = 1; i < waves; ++i)
      if (mask >> (i - 1) & 1) {
        groups.push_back(i - last);
        last = i;
      }
    groups.push_back(waves - last);
    const signal::GroupPlan plan(ov.wm, groups);
    const double t = run_overlap(d.P, ov.wm, plan, d.mode, ov.buf.p, ov.recv.p, 1, d.o.exh_reps);
    ++row.exh_count;
    if (groups == row.searched_waves) row.exh_searched_ms = row.exh_verified1_ms = t;
    if (groups == row.verified_waves) row.exh_verified_ms = t;
    if (t < row.exh_best_ms) {
      row.exh_best_ms = t;
      row.exh_best = plan.str();
      row.exh_best_waves = groups;
    }
  }
  if (!row.overlap) row.exh_searched_ms = row.seq;  // the predictive choice was "no overlap"
  if (!row.verified_overlap) row.exh_verified_ms = row.seq;
  if (!row.verified1_overlap) row.exh_verified1_ms = row.seq;
  if (d.o.exh_confirm) exhaustive_confirm(d, ov, row);
}

// `model`: the offline stage's profile (both curves, per-group overhead,
// comm slowdown) with this shape's GEMM penalty; the prediction is
// tune::signal_overlap_cost() on it, the library's model.
Row measure(Problem& P, const tune::MachineProfile& model, signal::WaitMode mode, const Progress& progress) {
  const auto t_start = Clock::now();
  ShapeData d(P, model, mode);
  Row row;
  row.shape = d.sh;
  measure_baselines(d, row);
  OverlapSetup ov(d);
  row.waves = ov.wm.waves();
  measure_compute_alone(d, ov, row);
  const signal::GroupPlan searched_plan = predict(d, ov, row);
  measure_candidates(d, ov, searched_plan, row);
  measure_diagnostics(d, ov, searched_plan, row);
  verdict(P.o, row);
  measure_exhaustive(d, ov, row);
  // Seed §6.4 bound from the measured standalone times.
  const signal::WaveModel full = ov.wm.with_sms(d.pg.sm_count());
  const double first_wave = row.gemm / full.waves();
  const double last_wave_comm = d.curve.time(double(full.tiles_in_wave(full.waves() - 1)) * ov.bytes_per_tile()) * 1e3;
  row.bound = row.gemm >= row.comm ? row.gemm + last_wave_comm : first_wave + row.comm;
  row.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  (void)progress;
  return row;
}

std::string f3(double x) { return fmt::format("{:.3f}", x); }

struct OpResult {
  std::string text, markdown;
};

// The offline stage of one op: the NCCL bandwidth curves and the per-group
// overhead, as the tune::MachineProfile the model predicts with (stored by
// --store-profile): the same curve on the default communicator predicts "no
// overlap" (what a non-overlapped run uses; < 1 s of device time per op).
tune::MachineProfile offline_stage(runtime::ProcessGroup& pg, ncclComm_t ocomm, const Options& o, bool ar,
                                   signal::WaitMode mode, std::int64_t max_bytes, const Progress& progress) {
  const std::string op = ar ? "ar" : "rs";
  progress("{}: offline stage: NCCL bandwidth curve up to {} MiB", op, max_bytes >> 20);
  const tune::BandwidthCurve curve = measure_curve(pg, ocomm, ar, max_bytes, o, progress);
  progress("{}: offline stage: per-group overhead, stream memop waits ...", op);
  const double ovh_memop = measure_group_overhead(pg, ocomm, ar, signal::WaitMode::StreamMemOp, curve, o);
  progress("{}: offline stage: per-group overhead, stream memop {:.2f} us; spinning-kernel waits ...", op,
           ovh_memop * 1e6);
  const double ovh_spin = measure_group_overhead(pg, ocomm, ar, signal::WaitMode::SpinKernel, curve, o);
  const double overhead = mode == signal::WaitMode::StreamMemOp ? ovh_memop : ovh_spin;
  progress("{}: per-group overhead: stream memop {:.2f} us, spinning kernel {:.2f} us (using {})", op, ovh_memop * 1e6,
           ovh_spin * 1e6, o.wait);
  const tune::Collective coll = ar ? tune::Collective::AllReduce : tune::Collective::ReduceScatter;
  tune::MachineProfile model;
  model.machine = {pg.device_properties().name, o.topology, pg.world()};
  model.dtype = DType::bf16;
  model.sm_count = pg.sm_count();
  model.nccl_sms = o.nccl_sms;
  model.per_group_overhead = overhead;
  model.comm_slowdown_beside_gemm = o.comm_slowdown_pct / 100;
  model.curves[coll] = curve;
  if (ocomm != pg.nccl()) {
    progress("{}: offline stage: NCCL bandwidth curve on the default communicator (no-overlap prediction)", op);
    model.no_overlap_curves[coll] = measure_curve(pg, pg.nccl(), ar, max_bytes, o, progress);
  } else {
    model.no_overlap_curves[coll] = curve;
  }
  model.validate();
  return model;
}

// One op's figures over its shapes: the per-shape tables and the sums the
// summaries report.
struct OpStats {
  double serial_err_sum = 0, beside_sum = 0, beside_def_sum = 0, epi_sum = 0;
  double err_sum = 0, err_all_sum = 0, seq_err_sum = 0, seq_err_signed_sum = 0, comm_curve_err_sum = 0;
  int err_n = 0, err_all_n = 0, slower = 0, slower_pred = 0, exh_n = 0, exh_ok = 0, exh_ok_verified = 0, done = 0;
  int exh_ok_verified1 = 0;  // the top-1 verified choice >= 99 % of exhaustive
  int h2h_n = 0, h2h_ok = 0, h2h_ok_verified = 0, h2h_ok_verified1 = 0;   // the same, head to head
  double h2h_sum_s = 0, h2h_sum_v = 0, h2h_min_s = 1e9, h2h_min_v = 1e9;  // mean / worst head-to-head ratio
  int topk_changed = 0;      // the top-k verified choice differs from the top-1 one
  int topk_changed_on = 0;   // ... of which top-1 said no overlap
  int topk_changed_off = 0;  // ... of which top-1 overlapped and top-k does not (never: its fastest is faster)
  int topk_not_first = 0;    // the fastest measured candidate is not the searched one
  int slower1 = 0;           // top-1 verified choice slower than non-overlap
  double cand_err_sum = 0;   // predictor error over every measured candidate
  int cand_err_n = 0;
  double speedup1_sum = 0;
  double speedup_pred_sum = 0, speedup_sum = 0;
  int flipped_off = 0, flipped_on = 0;  // verdict vs prediction
};

// One shape's ratios against the exhaustive sweep and the head to head
// (0: not run), and its top-1 verified choice.
struct ShapeRatios {
  std::string verified1;
  bool changed = false;  ///< the top-k changed the verified choice
  double err = 0;        ///< predictor error of the searched partition (%)
  double exh = 0, exh_v = 0, exh_v1 = 0;
  double h2h_s = 0, h2h_v = 0, h2h_v1 = 0;
};

// One op (AR or RS): offline stage, every shape within the deadline,
// tables, summaries, and the stored profile.
class OpRun {
 public:
  OpRun(runtime::ProcessGroup& pg, ncclComm_t ocomm, const Options& o, bool ar, const Progress& progress)
      : pg_(pg),
        ocomm_(ocomm),
        o_(o),
        ar_(ar),
        op_(ar ? "ar" : "rs"),
        mode_(o.wait == "memop" ? signal::WaitMode::StreamMemOp : signal::WaitMode::SpinKernel),
        coll_(ar ? tune::Collective::AllReduce : tune::Collective::ReduceScatter),
        progress_(progress) {}

  OpResult run(const std::vector<Shape>& shapes, Clock::time_point deadline) {
    std::int64_t max_bytes = 0;
    for (const Shape& s : shapes) max_bytes = std::max(max_bytes, s.m * s.n * 2);
    model_ = offline_stage(pg_, ocomm_, o_, ar_, mode_, max_bytes, progress_);
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      // Every rank must take the same decision: rank 0's clock decides.
      double out_of_time = Clock::now() >= deadline ? 1.0 : 0.0;
      out_of_time = pg_.allreduce_max(out_of_time);
      if (out_of_time > 0) {
        progress_("{}: budget spent: {} of {} shapes measured, stopping", op_, st_.done, shapes.size());
        break;
      }
      progress_("{}: shape {}/{} {} ...", op_, i + 1, shapes.size(), shape_name(shapes[i]));
      measure_shape(shapes[i]);
    }
    OpResult res = result(shapes.size());
    if (o_.store_profile && pg_.rank() == 0) store_profile();
    return res;
  }

 private:
  struct Verdict {
    tune::SignalQuery q;
    std::vector<tune::MeasuredPartition> measured;  // every top-k candidate
    double sequential_s;
  };

  static std::string label(const Shape& s) { return s.label.empty() ? "-" : s.label; }

  /// The median of the in-run GEMM slowdowns per group of the shapes so far (ms).
  double learned_penalty() const {
    if (penalties_seen_.empty()) return 0.0;
    std::vector<double> v = penalties_seen_;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  }

  void measure_shape(const Shape& s) {
    Problem P{o_, pg_, ar_, s, {}, {}, ocomm_};
    // The model's GEMM penalty: given, or learned from earlier shapes only
    // (never from the shape being predicted). Every rank uses rank 0's value.
    double penalty_ms = o_.gemm_penalty_us >= 0 ? o_.gemm_penalty_us * 1e-3 : learned_penalty();
    penalty_ms = pg_.allreduce_max(pg_.rank() == 0 ? penalty_ms : 0.0);
    model_.gemm_penalty_per_group = penalty_ms * 1e-3;
    const Row r = measure(P, model_, mode_, progress_);
    ++st_.done;
    if (r.penalty_seen >= 0) penalties_seen_.push_back(pg_.allreduce_max(r.penalty_seen));
    for (const auto& q : r.group_sweep) {
      const double slow = q.gemm_end - r.engine_epi;
      sweep_.add({label(s), std::to_string(s.m), std::to_string(s.n), std::to_string(s.k), std::to_string(q.groups),
                  f3(q.overlap), f3(q.gemm_end), f3(slow),
                  q.groups > 1 ? fmt::format("{:.1f} us", slow / (q.groups - 1) * 1e3) : "-"});
    }
    timings_.push_back(r.timing);
    Verdict v{r.query, {}, r.seq * 1e-3};
    for (std::size_t c = 0; c < r.cand_waves.size(); ++c)
      v.measured.push_back({r.cand_waves[c], r.cand_meas[c] * 1e-3});
    verdicts_.push_back(std::move(v));
    const ShapeRatios x = record(s, r);
    add_rows(s, r, x);
    report_shape(s, r, x);
  }

  /// Adds the shape to the sums and the candidate table.
  ShapeRatios record(const Shape& s, const Row& r) {
    ShapeRatios x;
    // The top-k candidates, and how the top-k changed the verified choice.
    x.verified1 = r.verified1_overlap ? r.searched : "no overlap";
    x.changed = r.verified != x.verified1;
    st_.topk_changed += x.changed;
    st_.topk_changed_on += x.changed && !r.verified1_overlap;
    st_.topk_changed_off += x.changed && !r.verified_overlap;
    st_.topk_not_first += r.fastest != 0;
    const double tessera1 = r.verified1_overlap ? r.overlap_meas : r.seq;
    st_.slower1 += tessera1 > r.seq * 1.005;
    st_.speedup1_sum += r.seq / tessera1;
    for (std::size_t c = 0; c < r.cand_waves.size(); ++c) {
      const double e = (r.cand_pred[c] / r.cand_meas[c] - 1) * 100;
      st_.cand_err_sum += std::abs(e);
      ++st_.cand_err_n;
      cand_table_.add({label(s), std::to_string(s.m), std::to_string(s.n), std::to_string(s.k),
                       fmt::format("{}{}", c + 1, int(c) == r.fastest ? "*" : ""), r.cand_str[c], f3(r.cand_pred[c]),
                       f3(r.cand_meas[c]), fmt::format("{:+.1f}", e),
                       fmt::format("{:+.1f}", (r.cand_pred[c] / r.cand_pred[0] - 1) * 100),
                       fmt::format("{:+.1f}", (r.cand_meas[c] / r.cand_meas[0] - 1) * 100),
                       fmt::format("{:.3f}x", r.seq / r.cand_meas[c])});
    }
    // The no-overlap prediction against its measurement, and the default
    // communicator's curve against this shape's own collective timing.
    st_.seq_err_sum += std::abs(r.seq_pred - r.seq) / r.seq * 100;
    st_.seq_err_signed_sum += (r.seq_pred / r.seq - 1) * 100;
    st_.comm_curve_err_sum +=
        std::abs(model_.no_overlap_curve(coll_).time(double(s.m) * double(s.n) * 2) * 1e3 - r.comm) / r.comm * 100;
    // Predictor error of the searched overlapped partition (always measured).
    x.err = std::abs(r.overlap_pred - r.overlap_meas) / r.overlap_meas * 100;
    st_.err_sum += x.err;
    ++st_.err_n;
    // Error of the predictive choice's prediction against its measurement.
    st_.err_all_sum += std::abs(r.chosen_pred - r.predictive) / r.predictive * 100;
    ++st_.err_all_n;
    st_.slower += r.tessera > r.seq * 1.005;
    st_.slower_pred += r.predictive > r.seq * 1.005;
    st_.speedup_sum += r.seq / r.tessera;
    st_.speedup_pred_sum += r.seq / r.predictive;
    st_.flipped_off += r.overlap && !r.verified_overlap;
    st_.flipped_on += !r.overlap && r.verified_overlap;
    record_exhaustive(r, x);
    return x;
  }

  void record_exhaustive(const Row& r, ShapeRatios& x) {
    if (r.exhaustive && r.exh_searched_ms > 0) {
      x.exh = r.exh_best_ms / r.exh_searched_ms;
      ++st_.exh_n;
      st_.exh_ok += x.exh >= 0.99;
      if (r.exh_verified_ms > 0) {
        x.exh_v = r.exh_best_ms / r.exh_verified_ms;
        st_.exh_ok_verified += x.exh_v >= 0.99;
      }
      if (r.exh_verified1_ms > 0) {
        x.exh_v1 = r.exh_best_ms / r.exh_verified1_ms;
        st_.exh_ok_verified1 += x.exh_v1 >= 0.99;
      }
    }
    const auto h2h = [&](double choice_ms) {
      return r.h2h_exh_ms > 0 && choice_ms > 0 ? r.h2h_exh_ms / choice_ms : 0.0;
    };
    x.h2h_s = h2h(r.h2h_searched_ms);
    x.h2h_v = h2h(r.h2h_verified_ms);
    x.h2h_v1 = h2h(r.h2h_verified1_ms);
    if (r.exhaustive && r.h2h_exh_ms > 0) {
      ++st_.h2h_n;
      st_.h2h_sum_s += x.h2h_s;
      st_.h2h_sum_v += x.h2h_v;
      st_.h2h_min_s = std::min(st_.h2h_min_s, x.h2h_s);
      st_.h2h_min_v = std::min(st_.h2h_min_v, x.h2h_v);
      st_.h2h_ok += x.h2h_s >= 0.99;
      st_.h2h_ok_verified += x.h2h_v >= 0.99;
      st_.h2h_ok_verified1 += x.h2h_v1 >= 0.99;
    }
  }

  /// The shape's rows of the main and the diagnostic tables, and the diagnostic sums.
  void add_rows(const Shape& s, const Row& r, const ShapeRatios& x) {
    const auto pct = [&](double v) {
      return r.exhaustive && v > 0 ? fmt::format("{:.1f}%", v * 100) : std::string("-");
    };
    table_.add({label(s),
                std::to_string(s.m),
                std::to_string(s.n),
                std::to_string(s.k),
                std::to_string(r.waves),
                r.choice,
                fmt::format("{:.3f}", r.seq / r.predictive),
                r.verified,
                x.verified1,
                fmt::format("#{} of {}{}", r.fastest + 1, r.cand_waves.size(), x.changed ? " (changed)" : ""),
                f3(r.gemm),
                f3(r.comm),
                f3(r.seq),
                f3(r.decomp),
                f3(r.tessera),
                fmt::format("{:.3f}", r.seq / r.tessera),
                f3(r.bound),
                fmt::format("{:.2f}", r.bound / r.tessera),
                f3(r.overlap_meas),
                f3(r.overlap_pred),
                fmt::format("{:.1f}", x.err),
                r.exhaustive ? fmt::format("{} {} ({} meas.)", f3(r.exh_best_ms), r.exh_best, r.exh_count) : "-",
                r.exhaustive ? fmt::format("{:.1f}%", x.exh * 100) : "-",
                r.exhaustive && x.exh_v > 0 ? fmt::format("{:.1f}%", x.exh_v * 100) : "-",
                r.exhaustive && x.exh_v1 > 0 ? fmt::format("{:.1f}%", x.exh_v1 * 100) : "-",
                pct(x.h2h_s),
                pct(x.h2h_v),
                pct(x.h2h_v1),
                fmt::format("{:.1e}", r.rel_err)});
    const int groups = static_cast<int>(std::count(r.searched.begin(), r.searched.end(), ',')) + 1;
    diag_.add({label(s), std::to_string(s.m), std::to_string(s.n), std::to_string(s.k), std::to_string(groups),
               f3(r.engine_plain), f3(r.engine_epi), fmt::format("{:+.1f}", (r.engine_epi / r.engine_plain - 1) * 100),
               f3(r.comm), f3(r.comm_ov), f3(r.groups_alone), f3(r.beside_ov), f3(r.beside_def), f3(r.ov_gemm_end),
               f3(r.overlap_meas), r.overlap_def >= 0 ? f3(r.overlap_def) : "-", f3(r.serial_model),
               f3(r.overlap_pred)});
    st_.serial_err_sum += std::abs(r.serial_model - r.overlap_meas) / r.overlap_meas * 100;
    // Concurrency of GEMM || comm: 0 = fully serialized (sum), 1 = perfect (max).
    const auto concurrency = [&](double both, double comm) {
      const double lo = std::max(r.engine_epi, comm), hi = r.engine_epi + comm;
      return hi > lo ? std::clamp((hi - both) / (hi - lo), -1.0, 2.0) : 1.0;
    };
    st_.beside_sum += concurrency(r.beside_ov, r.comm_ov);
    st_.beside_def_sum += concurrency(r.beside_def, r.comm);
    st_.epi_sum += (r.engine_epi / r.engine_plain - 1) * 100;
  }

  void report_shape(const Shape& s, const Row& r, const ShapeRatios& x) {
    progress_(
        "{}: {} done in {:.1f} s: tessera (verified) {:.3f} ms ({}), predicted choice {}, speedup {:.3f}, "
        "non-overlap {:.3f}, verified speedup {:.3f}, searched overlap "
        "{:.3f} ms predicted {:.3f} ({:+.1f}%, GEMM penalty {:.1f} us/group; seen {}), rel err {:.1e}{}",
        op_, shape_name(s), r.seconds, r.tessera,
        fmt::format("{}, candidate #{} of {}{}", r.verified, r.fastest + 1, r.cand_waves.size(),
                    x.changed ? ", changed by the top-k" : ""),
        r.choice, r.seq / r.predictive, r.seq, r.seq / r.tessera, r.overlap_meas, r.overlap_pred,
        (r.overlap_pred / r.overlap_meas - 1) * 100, r.penalty_used * 1e3,
        r.penalty_seen >= 0 ? fmt::format("{:.1f} us", r.penalty_seen * 1e3) : std::string("- (one group)"), r.rel_err,
        r.exhaustive ? fmt::format(", exhaustive best {:.3f} ms of {} ({:.1f}% of searched)", r.exh_best_ms,
                                   r.exh_count, x.exh * 100)
                     : "");
    if (!s.label.empty())
      mlp_lines_.push_back(
          fmt::format("{} {}: {:.3f}x over cuBLASLt+NCCL sequential ({:.3f} vs {:.3f} ms; verified "
                      "choice {}, predictive choice {} at {:.3f}x){}",
                      s.label, op_, r.seq / r.tessera, r.tessera, r.seq, r.verified, r.choice, r.seq / r.predictive,
                      ar_ ? (r.seq / r.tessera >= 1.25 ? " — meets 1.25x" : " — below 1.25x") : ""));
  }

  std::string summary(std::size_t shapes) const {
    const Options& o = o_;
    const OpStats& s = st_;
    const int done = s.done;
    return fmt::format(
        "op {} on {} ranks, wait {}, NCCL SMs reserved {}: {} of {} shapes measured; mean predictor error {:.2f}% "
        "(searched overlapped partition, {} shapes), {:.2f}% (predictive choice); slower than non-overlap "
        "(> 0.5%): predictive choice on {} of {}, verified choice on {} of {} (verdict margin {:.1f}%: {} predicted "
        "overlaps dropped, {} rejected partitions kept); mean speedup predictive {:.3f}, verified {:.3f}; searched "
        ">= 99% of exhaustive (measured, shapes with <= {} waves and <= {} s of sweep) on {} of {} (verified top-{} "
        "choice: {} of {}; verified top-1 choice: {} of {}; head to head, the sweep's best re-timed interleaved with "
        "the choices ({} reps): searched {} of {}, verified {} of {}, top-1 verified {} of {}; mean ratio searched "
        "{:.2f}%, verified {:.2f}%, worst {:.2f}% / {:.2f}%); top-{} refinement: the fastest measured candidate was "
        "not the searched one on {} of {} shapes, the verified choice changed on {} ({} from no overlap to an "
        "overlap, {} to no overlap), top-1 verified choice slower than non-overlap on {}, mean verified speedup "
        "top-1 {:.3f}, predictor error over every candidate {:.2f}% mean ({} runs); model: comm beside the GEMM "
        "+{:.0f}%, non-overlap predicted with the default communicator's curve: non-overlap prediction error "
        "{:.2f}% mean (signed {:+.2f}%), that curve vs each shape's measured collective {:.2f}% mean",
        op_, pg_.world(), o.wait, o.nccl_sms, done, shapes, s.err_n ? s.err_sum / s.err_n : 0.0, s.err_n,
        s.err_all_n ? s.err_all_sum / s.err_all_n : 0.0, s.slower_pred, done, s.slower, done, o.verdict_margin_pct,
        s.flipped_off, s.flipped_on, done ? s.speedup_pred_sum / done : 0.0, done ? s.speedup_sum / done : 0.0,
        o.exh_max_waves, o.exh_cap_s, s.exh_ok, s.exh_n, o.top_k, s.exh_ok_verified, s.exh_n, s.exh_ok_verified1,
        s.exh_n, o.exh_confirm_reps, s.h2h_ok, s.h2h_n, s.h2h_ok_verified, s.h2h_n, s.h2h_ok_verified1, s.h2h_n,
        s.h2h_n ? s.h2h_sum_s / s.h2h_n * 100 : 0.0, s.h2h_n ? s.h2h_sum_v / s.h2h_n * 100 : 0.0,
        s.h2h_n ? s.h2h_min_s * 100 : 0.0, s.h2h_n ? s.h2h_min_v * 100 : 0.0, o.top_k, s.topk_not_first, done,
        s.topk_changed, s.topk_changed_on, s.topk_changed_off, s.slower1, done ? s.speedup1_sum / done : 0.0,
        s.cand_err_n ? s.cand_err_sum / s.cand_err_n : 0.0, s.cand_err_n, o.comm_slowdown_pct,
        done ? s.seq_err_sum / done : 0.0, done ? s.seq_err_signed_sum / done : 0.0,
        done ? s.comm_curve_err_sum / done : 0.0);
  }

  std::string diag_summary() const {
    const Options& o = o_;
    const OpStats& s = st_;
    const int done = s.done;
    return fmt::format(
        "where the time goes ({} shapes, overlap communicator: {}): group epilogue costs {:+.1f}% of the engine GEMM "
        "(mean); GEMM||comm concurrency (0 = serialized, 1 = full overlap) {:.2f} on the overlap communicator, {:.2f} "
        "on the default one; mean |error| of the overlapped run against the 'nothing overlaps' model (engine+epi + "
        "sum of group curve times) {:.1f}% vs the overlap model's {:.1f}%; GEMM penalty per group: {} (median of "
        "the in-run slowdowns per group: {:.1f} us over {} shapes)",
        done,
        ocomm_ == pg_.nccl() ? "default (process group)"
                             : fmt::format("split, maxCTAs {}, cgaClusterSize {}", o.nccl_sms, o.nccl_cga),
        done ? s.epi_sum / done : 0.0, done ? s.beside_sum / done : 0.0, done ? s.beside_def_sum / done : 0.0,
        done ? s.serial_err_sum / done : 0.0, s.err_n ? s.err_sum / s.err_n : 0.0,
        o.gemm_penalty_us >= 0 ? fmt::format("{:.1f} us (given)", o.gemm_penalty_us)
                               : std::string("learned from the earlier shapes"),
        learned_penalty() * 1e3, penalties_seen_.size());
  }

  OpResult result(std::size_t shapes) const {
    const std::string sum = summary(shapes), dsum = diag_summary();
    OpResult res;
    res.text = fmt::format("\n{}\n{}\n\n{}\n{}\n", table_.str(), sum, diag_.str(), dsum);
    res.text += fmt::format("\nTop-{} candidates (* = fastest measured; medians of the interleaved loop, ms):\n{}\n",
                            o_.top_k, cand_table_.str());
    if (o_.group_sweep)
      res.text += fmt::format(
          "\nGEMM slowdown against the group count (equal partitions; slowdown = ov GEMM end - "
          "engine+epi, ms):\n{}\n",
          sweep_.str());
    for (const auto& l : mlp_lines_) res.text += l + "\n";
    res.markdown = fmt::format(
        "### bench signal --op {} (ms; tessera = the verified choice)\n\n{}\n{}\n\n"
        "Where the time goes (ms):\n\n{}\n{}\n\n",
        op_, table_.markdown(), sum, diag_.markdown(), dsum);
    res.markdown +=
        fmt::format("Top-{} candidates (* = fastest measured; ms):\n\n{}\n", o_.top_k, cand_table_.markdown());
    for (const auto& l : mlp_lines_) res.markdown += "- " + l + "\n";
    return res;
  }

  // The model as used (both curves, overhead, comm slowdown), the penalty
  // given or learned over every shape, and this op's GEMM timings; the other
  // op's curves and timings already stored are kept. The overhead, penalty
  // and slowdown are one per profile: the last op stored wins. Then the
  // measured verdicts: later SignalTuner::choose() calls get them (source
  // "verified") for these shapes and their neighbours.
  void store_profile() const {
    if (o_.comm_slowdown_pct == 0)
      progress_(
          "{}: note: the stored profile has comm slowdown beside the GEMM 0 (the curve as measured); the fit "
          "for H200 x2 with 16 NCCL SMs is --comm-slowdown-pct 25 --gemm-penalty-us 20 (docs/design/signal.md)",
          op_);
    tune::MachineProfile prof = model_;
    prof.gemm_penalty_per_group = (o_.gemm_penalty_us >= 0 ? o_.gemm_penalty_us * 1e-3 : learned_penalty()) * 1e-3;
    prof.gemms = timings_;
    tune::Cache cache("machine_profile", tune::MachineProfile::kCacheVersion);
    if (auto old = tune::MachineProfile::load(cache, prof.machine, prof.dtype)) {
      for (const auto& [c, cv] : old->curves)
        if (!prof.curves.count(c)) prof.curves[c] = cv;
      for (const auto& [c, cv] : old->no_overlap_curves)
        if (!prof.no_overlap_curves.count(c)) prof.no_overlap_curves[c] = cv;
      for (const auto& g : old->gemms)
        if (!prof.find_gemm(g.m, g.n, g.k, g.tile_m, g.tile_n)) prof.gemms.push_back(g);
    }
    prof.store(cache);
    progress_("stored machine profile in {}", cache.file().string());
    tune::Cache plans("signal_plans", tune::SignalTuner::kCacheVersion);
    tune::SignalTuner tuner(prof, plans, o_.min_gain_pct / 100);
    for (const Verdict& v : verdicts_)
      tuner.record_measured_candidates(v.q, v.measured, v.sequential_s, o_.verdict_margin_pct / 100);
    progress_("stored {} measured verdicts in {}", verdicts_.size(), plans.file().string());
  }

  runtime::ProcessGroup& pg_;
  ncclComm_t ocomm_;
  const Options& o_;
  const bool ar_;
  const std::string op_;
  const signal::WaitMode mode_;
  const tune::Collective coll_;
  const Progress& progress_;
  tune::MachineProfile model_;
  OpStats st_;
  // "predicted choice": the predictive search (min-gain margin); "verified":
  // the measured verdict on the fastest of the top-k candidates (tessera =
  // the verified choice, measured); "top-1 verified": the verdict on the
  // searched partition alone; "pick": which candidate was fastest.
  Table table_{{"shape",
                "M",
                "N",
                "K",
                "waves",
                "predicted choice",
                "pred. speedup",
                "verified",
                "top-1 verified",
                "pick",
                "GEMM",
                "comm",
                "non-overlap",
                "decomp",
                "tessera",
                "speedup",
                "bound",
                "of bound",
                "searched overlap",
                "predicted",
                "pred err %",
                "exhaustive best",
                "searched/exh",
                "verified/exh",
                "top-1 verified/exh",
                "h2h searched/exh",
                "h2h verified/exh",
                "h2h top-1/exh",
                "rel err"}};
  // Every measured top-k candidate (same interleaved loop as non-overlap).
  Table cand_table_{{"shape", "M", "N", "K", "#", "partition", "predicted", "measured", "pred err %", "vs #1 pred %",
                     "vs #1 meas %", "vs non-overlap"}};
  // Where the time of the searched overlapped plan goes.
  Table diag_{{"shape", "M", "N", "K", "groups", "engine plain", "engine+epi", "epi %", "comm", "comm@ov",
               "groups alone", "GEMM||comm ov", "GEMM||comm def", "ov GEMM end", "overlap", "overlap def comm",
               "serial model", "overlap model"}};
  Table sweep_{{"shape", "M", "N", "K", "groups", "overlap", "ov GEMM end", "GEMM slowdown", "per extra group"}};
  std::vector<std::string> mlp_lines_;
  std::vector<tune::GemmTiming> timings_;
  std::vector<Verdict> verdicts_;       // for the stored plan cache (--store-profile)
  std::vector<double> penalties_seen_;  // ms, from the shapes measured so far
};

// One op: offline stage, every shape within `deadline`, table + summary.
OpResult run_op(runtime::ProcessGroup& pg, ncclComm_t ocomm, const Options& o, bool ar,
                const std::vector<Shape>& shapes, Clock::time_point deadline, const Progress& progress) {
  OpRun r(pg, ocomm, o, ar, progress);
  return r.run(shapes, deadline);
}

void run_all(const Options& o);

// Any error (a stuck wait above all) is printed by every rank and the
// process exits at once: destroying the communicator or freeing memory while
// a stream still waits would synchronize the device and hang, hiding the
// diagnostic. The driver reclaims the context at exit.
void run(const Options& o) {
  try {
    run_all(o);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "tessera bench signal: error: {}\n", e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
}

void run_all(const Options& o) {
  // Connect every NCCL channel at init: a lazy connect inside an enqueue
  // behind a stream wait could block the host (comm_driver.hpp).
  ::setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  Progress progress;
  auto pg = runtime::ProcessGroup::from_environment();
  progress.on = pg->rank() == 0;
  for (const auto& op : o.ops)
    TESSERA_CHECK(op == "ar" || op == "rs", "bench signal: --op must be ar and/or rs, got '{}'", op);
  TESSERA_CHECK(!o.ops.empty(), "bench signal: --op is empty");
  TESSERA_CHECK(o.wait == "memop" || o.wait == "spin", "bench signal: --wait must be memop or spin, got '{}'", o.wait);
  TESSERA_CHECK(o.nccl_sms >= 0 && o.nccl_sms < pg->sm_count(), "bench signal: --nccl-sms {} outside [0, {})",
                o.nccl_sms, pg->sm_count());
  TESSERA_CHECK(o.nccl_comm == "split" || o.nccl_comm == "default",
                "bench signal: --nccl-comm must be split or default, got '{}'", o.nccl_comm);
  TESSERA_CHECK(o.nccl_comm == "default" || o.nccl_sms >= 1,
                "bench signal: --nccl-comm split needs --nccl-sms >= 1 (NCCL's maxCTAs), got {}", o.nccl_sms);
  TESSERA_CHECK(o.budget_s > 0, "bench signal: --budget-s must be > 0, got {}", o.budget_s);
  std::vector<Shape> shapes;
  for (const auto& s : o.shapes) shapes.push_back(parse_shape(s));
  if (shapes.empty()) {
    if (o.mlp)
      for (const Shape& s : mlp_shapes()) shapes.push_back(s);
    if (o.sweep)
      for (const Shape& s : sweep_shapes()) shapes.push_back(s);
  }
  TESSERA_CHECK(!shapes.empty(), "bench signal: no shapes (--no-mlp and --no-sweep without --shapes)");
  progress("bench signal: {} ranks, {} shapes per op, ops {}, budget {:.0f} s", pg->world(), shapes.size(),
           fmt::join(o.ops, ","), o.budget_s);
  const auto end = progress.t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.budget_s));
  // The overlapped groups' communicator: NCCL kernels that fit on the SMs
  // the GEMM leaves free (signal/overlap_comm.hpp), or the default one.
  std::unique_ptr<signal::OverlapComm> split;
  if (o.nccl_comm == "split") {
    split = std::make_unique<signal::OverlapComm>(pg->nccl(), signal::OverlapCommConfig{o.nccl_sms, 0, o.nccl_cga});
    g_overlap_comm = split->get();
  }
  const ncclComm_t ocomm = split ? split->get() : pg->nccl();
  progress("overlap communicator: {}", split
                                           ? fmt::format("split, maxCTAs {}, cgaClusterSize {}", o.nccl_sms, o.nccl_cga)
                                           : std::string("default (process group)"));
  std::vector<OpResult> results;
  for (std::size_t i = 0; i < o.ops.size(); ++i) {
    // Equal split of what is left over the ops still to run.
    const auto now = Clock::now();
    const auto share = (end - now) / static_cast<long>(o.ops.size() - i);
    results.push_back(
        run_op(*pg, ocomm, o, o.ops[i] == "ar", shapes, now + std::max(share, Clock::duration::zero()), progress));
    if (pg->rank() == 0) fmt::print("{}", results.back().text);
  }
  if (pg->rank() == 0) {
    progress("bench signal done");
    if (!o.markdown.empty()) {
      std::ofstream md(o.markdown, std::ios::app);
      TESSERA_CHECK(md.good(), "bench signal: cannot open --markdown file '{}'", o.markdown);
      for (const auto& r : results) md << r.markdown << "\n";
    }
  }
}

// ---- signal-kernels: RMSNorm fused with the un-reorder ---------------------
struct KOptions {
  std::vector<std::string> shapes{"4096x4096", "8192x8192", "16384x8192", "2048x16384"};
  int reps = 20, warmup = 5;
  /// TESSERA_RMSNORM_ROWS values to time in turn (0: the library's rule).
  std::vector<int> rows_per_cta{0, 1};
  /// Kernel calls per timed repetition, run back to back behind a GPU sleep.
  int batch = 10;
};

// Restores an environment variable's value (or its absence) on scope exit.
struct ScopedEnvVar {
  std::string name, saved;
  bool had = false;
  explicit ScopedEnvVar(const char* n) : name(n) {
    if (const char* v = std::getenv(n)) had = true, saved = v;
  }
  ~ScopedEnvVar() { had ? ::setenv(name.c_str(), saved.c_str(), 1) : ::unsetenv(name.c_str()); }
  ScopedEnvVar(const ScopedEnvVar&) = delete;
  ScopedEnvVar& operator=(const ScopedEnvVar&) = delete;
};

void run_kernels(const KOptions& o) {
  int dev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  cudaStream_t s;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // The fused kernel reads TESSERA_RMSNORM_ROWS at every call; one table per
  // value; restored after.
  struct Config {
    int rows;
  };
  std::vector<Config> configs;
  for (int r : o.rows_per_cta) configs.push_back({r});
  const ScopedEnvVar keep_rows("TESSERA_RMSNORM_ROWS");
  std::vector<Table> tables;
  for (std::size_t ki = 0; ki < configs.size(); ++ki)
    tables.emplace_back(std::vector<std::string>{"M", "N", "RMSNorm us", "fused AR us", "AR %", "fused RS us", "RS %",
                                                 "fused A2A us", "A2A %", "copy us", "un-reorder AR us", "un-reorder %",
                                                 "RS by table %"});
  std::vector<std::string> best_lines;
  for (const auto& text : o.shapes) {
    long long m = 0, n = 0;
    char x = 0;
    TESSERA_CHECK(std::sscanf(text.c_str(), "%lld%c%lld", &m, &x, &n) == 3 && x == 'x' && m > 0 && n > 0 && n % 8 == 0,
                  "bench signal-kernels: shape '{}' is not MxN with N % 8 == 0", text);
    const signal::WaveModel wm(signal::GemmTiling{m, n, 128, 128}, 116, 8);
    const signal::ArMap am = signal::make_ar_map(wm);
    const signal::RsShard rs{signal::make_rs_map(wm, 2), 0};
    std::vector<std::vector<int>> dest(2, std::vector<int>(m));
    std::mt19937 g(7);
    for (auto& d : dest)
      for (auto& v : d) v = int(g() % 4 == 0);  // uneven: a quarter goes to rank 1
    std::vector<std::vector<int>> parts(2, std::vector<int>{wm.waves()});
    const signal::A2aPlan a2a(n, 128, 128, 116, 8, signal::Raster::AlongN, dest, parts);
    DevMem in(am.buffer_elems() * 2 * 2), out(m * n * 2 * 2), w(n * 2);
    DevMem table_src(std::max<std::size_t>(a2a.chunk_src(1).size(), 1) * 8);
    TESSERA_CUDA_CHECK(
        cudaMemcpy(table_src.p, a2a.chunk_src(1).data(), a2a.chunk_src(1).size() * 8, cudaMemcpyHostToDevice));
    signal::A2aRecvMap rmap = a2a.recv_map(1);
    rmap.chunk_src = table_src.as<std::int64_t>();
    // Diagnostic: the RS shard's gather read through a precomputed chunk table
    // (the A2A map's mechanism: one global load per chunk instead of index
    // math), same memory access pattern as the RS column: the gap between the
    // two is what the index math costs (measured +14..19 % against +2..6 %
    // at N <= 2048, hence signal/fast_gather.hpp).
    const std::int64_t rs_chunks = (n + 127) / 128;
    std::vector<std::int64_t> rs_src(static_cast<std::size_t>(rs.rows() * rs_chunks));
    for (std::int64_t r = 0; r < rs.rows(); ++r)
      for (std::int64_t c = 0; c < rs_chunks; ++c) rs_src[r * rs_chunks + c] = rs.chunk_offset(r, int(c));
    DevMem rs_table(std::max<std::size_t>(rs_src.size(), 1) * 8);
    TESSERA_CUDA_CHECK(cudaMemcpy(rs_table.p, rs_src.data(), rs_src.size() * 8, cudaMemcpyHostToDevice));
    const signal::A2aRecvMap rs_tabled{rs.rows(), n, 128, rs_table.as<std::int64_t>()};
    fill_random_bf16(in.p, am.buffer_elems() * 2, 1, s);
    fill_random_bf16(w.p, n, 2, s);
    TESSERA_CUDA_CHECK(cudaGetLastError());
    // Every kernel of a shape, for every rows-per-CTA value, in one
    // interleaved loop (clock drift hits them alike). A repetition is a
    // batch of o.batch calls behind a 100 us GPU sleep, so the events time
    // the kernels back to back, not the host's validation and launch path
    // (which a single call bracketed on an idle stream would include: ~5-10 us
    // against 12-30 us kernels).
    InterleavedTimer timer(s, o.warmup, o.reps, [&] { gpu_sleep(100, s); });
    const auto add = [&](double* us, int rows, std::function<void()> f) {
      timer.add(us, [&o, rows, f = std::move(f)] {
        ::setenv("TESSERA_RMSNORM_ROWS", std::to_string(rows).c_str(), 1);
        for (int b = 0; b < o.batch; ++b) f();
      });
    };
    const signal::RowMajorMap plain{m, n, n};
    const signal::RowMajorMap plain_rs{rs.rows(), n, n};
    const signal::RowMajorMap plain_a2a{rmap.rows(), n, n};
    // Fused kernels against the fastest plain RMSNorm over every rows-per-CTA value.
    double best_plain = 1e30, best_plain_rs = 1e30, best_plain_a2a = 1e30;
    std::vector<std::array<double, 3>> fused;
    // t[ki]: plain, plain RS, plain A2A, fused AR, RS, A2A, copy, un-reorder AR, RS through a table (ms per batch).
    std::vector<std::array<double, 9>> t(configs.size());
    for (std::size_t ki = 0; ki < configs.size(); ++ki) {
      const int r = configs[ki].rows;
      add(&t[ki][0], r, [&] { signal::rmsnorm_unreorder(plain, in.p, w.p, out.p, n, 1e-6f, DType::bf16, s); });
      add(&t[ki][1], r, [&] { signal::rmsnorm_unreorder(plain_rs, in.p, w.p, out.p, n, 1e-6f, DType::bf16, s); });
      add(&t[ki][2], r, [&] { signal::rmsnorm_unreorder(plain_a2a, in.p, w.p, out.p, n, 1e-6f, DType::bf16, s); });
      add(&t[ki][3], r, [&] { signal::rmsnorm_unreorder(am, in.p, w.p, out.p, n, 1e-6f, DType::bf16, s); });
      add(&t[ki][4], r, [&] { signal::rmsnorm_unreorder(rs, in.p, w.p, out.p, n, 1e-6f, DType::bf16, s); });
      add(&t[ki][5], r, [&] { signal::rmsnorm_unreorder(rmap, in.p, w.p, out.p, n, 1e-6f, DType::bf16, s); });
      add(&t[ki][8], r, [&] { signal::rmsnorm_unreorder(rs_tabled, in.p, w.p, out.p, n, 1e-6f, DType::bf16, s); });
      if (ki == 0) {  // the copies do not depend on the rows per CTA
        add(&t[ki][6], r, [&] { signal::unreorder(plain, in.p, out.p, n, DType::bf16, s); });
        add(&t[ki][7], r, [&] { signal::unreorder(am, in.p, out.p, n, DType::bf16, s); });
      }
    }
    timer.run();
    for (std::size_t ki = 0; ki < configs.size(); ++ki) {
      const auto per_call = [&](int j) { return t[ki == 0 || j < 6 || j == 8 ? ki : 0][j] * 1e3 / o.batch; };  // us
      const double base = per_call(0), base_rs = per_call(1), base_a2a = per_call(2);
      const double far = per_call(3), frs = per_call(4), fa2a = per_call(5);
      const double copy = per_call(6), uar = per_call(7), frs_table = per_call(8);
      const auto pct = [](double a, double b) { return fmt::format("{:+.1f}", (a / b - 1) * 100); };
      tables[ki].add({std::to_string(m), std::to_string(n), fmt::format("{:.1f}", base), fmt::format("{:.1f}", far),
                      pct(far, base), fmt::format("{:.1f}", frs), pct(frs, base_rs), fmt::format("{:.1f}", fa2a),
                      pct(fa2a, base_a2a), fmt::format("{:.1f}", copy), fmt::format("{:.1f}", uar), pct(uar, copy),
                      pct(frs_table, base_rs)});
      best_plain = std::min(best_plain, base);
      best_plain_rs = std::min(best_plain_rs, base_rs);
      best_plain_a2a = std::min(best_plain_a2a, base_a2a);
      fused.push_back({far, frs, fa2a});
    }
    for (std::size_t ki = 0; ki < configs.size(); ++ki)
      best_lines.push_back(fmt::format(
          "{}x{} rows per CTA {}: AR {:+.1f} %, RS {:+.1f} %, A2A {:+.1f} % against the fastest plain RMSNorm "
          "({:.1f} / {:.1f} / {:.1f} us)",
          m, n, configs[ki].rows, (fused[ki][0] / best_plain - 1) * 100, (fused[ki][1] / best_plain_rs - 1) * 100,
          (fused[ki][2] / best_plain_a2a - 1) * 100, best_plain, best_plain_rs, best_plain_a2a));
  }
  TESSERA_CUDA_CHECK(cudaStreamDestroy(s));
  for (std::size_t ki = 0; ki < configs.size(); ++ki)
    fmt::print("rows per CTA: {}\n{}\n",
               configs[ki].rows == 0 ? std::string("the library's rule (one wave of CTAs)")
                                     : std::to_string(configs[ki].rows) + " (forced)",
               tables[ki].str());
  fmt::print(
      "(bf16; tiles 128x128; RS = rank 0 of 2; A2A = rank 1 receiving an uneven quarter/three-quarter "
      "split; every % is against the plain kernel on the same rows and rows per CTA; GPU time per call: "
      "medians of {} interleaved repetitions, each a batch of {} calls behind a GPU sleep)\n",
      o.reps, o.batch);
  for (const auto& l : best_lines) fmt::print("{}\n", l);
}

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto& bench = tools::subcommand(root, "bench", "Benchmarks (run multi-GPU ones under `tessera run -n N --`)");
  auto opts = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("signal", "Signal-based overlap (FlashOverlap): GEMM + NCCL AR/RS per wave group");
  cmd->add_option("--op", opts->ops, "ar, rs or both (ar,rs; the default), run in that order")->delimiter(',');
  cmd->add_option("--shapes", opts->shapes, "MxNxK list (default: MLP-1..6 down projections, then 56 sweep sizes)")
      ->delimiter(',');
  cmd->add_flag("--mlp,!--no-mlp", opts->mlp, "include the MLP-1..6 down-projection rows (default on)");
  cmd->add_flag("--sweep,!--no-sweep", opts->sweep, "include the 56 sweep sizes (default on)");
  cmd->add_option("--gemm-penalty-us", opts->gemm_penalty_us,
                  "GEMM slowdown per group collective in the model (us); default: learned from the shapes measured "
                  "before each one (median of (ov GEMM end - engine+epi) / (groups - 1); 0 for the first)");
  cmd->add_option("--min-gain-pct", opts->min_gain_pct,
                  "overlap only when predicted at least this % faster than no overlap (default 3: a margin for "
                  "the model's error)")
      ->check(CLI::Range(0.0, 50.0));
  cmd->add_option("--comm-slowdown-pct", opts->comm_slowdown_pct,
                  "model: a group collective that runs beside the GEMM (every group but the last) takes this % longer "
                  "than the curve says (default 0; docs/design/signal.md: fitted 15-35 on H200 x2)")
      ->check(CLI::Range(0.0, 200.0));
  cmd->add_option("--verdict-margin-pct", opts->verdict_margin_pct,
                  "the verified choice keeps the searched overlap only when it measured at least this % faster "
                  "than non-overlap in the interleaved timing (default 1, as the ops tuner)")
      ->check(CLI::Range(0.0, 50.0));
  cmd->add_option("--top-k", opts->top_k,
                  "time the k best predicted overlapped partitions beside non-overlap (same warm-up and repetitions, "
                  "one interleaved loop); the verified choice is the fastest of them if it beats non-overlap by the "
                  "verdict margin (default 3; 1 = the searched partition only)")
      ->check(CLI::Range(1, 16));
  cmd->add_flag("--group-sweep", opts->group_sweep,
                "also time equal partitions of 1, 2, 3, 4, 6, 9 groups per shape: the GEMM's in-run slowdown against "
                "the group count");
  cmd->add_option("--budget-s", opts->budget_s,
                  "wall-clock budget in seconds, split over the ops; no new shape starts once an op's share is spent");
  cmd->add_option("--nccl-sms", opts->nccl_sms,
                  "SMs left to NCCL during overlap (the GEMM gets the rest; the split communicator's maxCTAs)");
  cmd->add_option("--nccl-comm", opts->nccl_comm,
                  "communicator of the overlapped groups: split (maxCTAs = --nccl-sms, cgaClusterSize = --nccl-cga; "
                  "default) or default (the process group's, NCCL's defaults: up to 32 CTAs in clusters of 4)");
  cmd->add_option("--nccl-cga", opts->nccl_cga, "cgaClusterSize of the split communicator (0 = no clusters)")
      ->check(CLI::Range(0, 8));
  cmd->add_flag("--compare-default,!--no-compare-default", opts->compare_default,
                "also run the searched plan on the default communicator (column 'overlap def comm'; default on)");
  cmd->add_option("--wait", opts->wait, "memop (cuStreamWaitValue32) or spin (spinning kernel)");
  cmd->add_option("--reps", opts->reps, "timed repetitions (median)")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", opts->warmup, "warm-up repetitions")->check(CLI::Range(0, 100000));
  cmd->add_option("--exhaustive-reps", opts->exh_reps, "repetitions per partition of the measured exhaustive search")
      ->check(CLI::Range(1, 100000));
  cmd->add_flag("--exhaustive-confirm,!--no-exhaustive-confirm", opts->exh_confirm,
                "re-time the sweep's best partition head to head with the searched and verified choices, "
                "interleaved (the sweep's minimum is biased low; columns 'h2h ...'; default on)");
  cmd->add_option("--exhaustive-confirm-reps", opts->exh_confirm_reps, "repetitions of the head-to-head re-timing")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--exhaustive-max-waves", opts->exh_max_waves,
                  "measure every partition on shapes with at most this many waves")
      ->check(CLI::Range(1, 20));
  cmd->add_option("--exhaustive-cap-s", opts->exh_cap_s,
                  "... and only where the estimated sweep takes at most this many seconds");
  cmd->add_flag("--store-profile", opts->store_profile,
                "store the model's inputs as a tune::MachineProfile (both curves, overhead, GEMM penalty, "
                "--comm-slowdown-pct, GEMM timings) and the measured verdicts");
  cmd->add_option("--topology", opts->topology, "topology label of the stored profile");
  cmd->add_option("--markdown", opts->markdown, "append the tables and summaries as Markdown to this file (rank 0)");
  cmd->callback([opts] { run(*opts); });

  auto kopts = std::make_shared<KOptions>();
  auto* k = bench.add_subcommand("signal-kernels", "RMSNorm fused with the post-communication un-reorder vs plain");
  k->add_option("--shapes", kopts->shapes, "MxN list")->delimiter(',');
  k->add_option("--reps", kopts->reps, "timed repetitions (median)")->check(CLI::Range(1, 100000));
  k->add_option("--warmup", kopts->warmup, "warm-up repetitions")->check(CLI::Range(0, 100000));
  k->add_option("--rows-per-cta", kopts->rows_per_cta,
                "fused-kernel rows per CTA to time in turn, one table each (TESSERA_RMSNORM_ROWS; 0 = the library's "
                "rule; default 0,1)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1 << 20));
  k->add_option("--batch", kopts->batch, "kernel calls per timed repetition, back to back behind a GPU sleep")
      ->check(CLI::Range(1, 1000));
  k->callback([kopts] { run_kernels(*kopts); });
});

}  // namespace
}  // namespace tessera::bench::signalb
