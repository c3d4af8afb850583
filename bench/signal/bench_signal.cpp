// `tessera bench signal` — signal-based overlap (FlashOverlap) of the GEMM
// engine with NCCL AllReduce / ReduceScatter, per GEMM size:
//   GEMM alone (cuBLASLt), collective alone (NCCL), sequential (cuBLASLt
//   then NCCL), decomposition (4 row chunks, cuBLASLt + NCCL pipelined on two
//   streams), Tessera (engine GEMM writing wave groups + counters, NCCL per
//   group on the communication stream, partition from the predictive
//   search), the seed's §6.4 bound, speedup, fraction of bound, predictor
//   error; partitions "one group per wave" and "2 equal groups" are measured
//   too and the searched one is compared with the best measured.
// Offline stage first: NCCL bandwidth curves at dense sizes and the
// per-group wait+launch overhead; optionally stored as a tune::MachineProfile.
//   tessera run -n 2 -- tessera bench signal [--op ar|rs] [--shapes MxNxK,...]
//
// `tessera bench signal-kernels` — one GPU: plain RMSNorm vs RMSNorm fused
// with the post-communication un-reorder (AR tiles, RS sub-tiles, A2A
// sub-tokens), and the plain un-reorder copy; overhead in % (seed Table 5).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "command.hpp"
#include "common/timing.hpp"
#include "signal/signal_bench_kernels.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"
#include "tessera/signal/a2a.hpp"
#include "tessera/signal/comm_driver.hpp"
#include "tessera/signal/epilogue_tables.hpp"
#include "tessera/signal/predictive_search.hpp"
#include "tessera/signal/unreorder.hpp"
#include "tessera/tune/machine_profile.hpp"

namespace tessera::bench::signalb {
namespace {

struct Options {
  std::string op = "ar";
  std::vector<std::string> shapes;
  int nccl_sms = 16;
  int reps = 20;
  int warmup = 5;
  std::string wait = "memop";
  bool store_profile = false;
  std::string topology = "NV18";
  std::string markdown;
};

struct Shape {
  std::int64_t m, n, k;
};

std::vector<Shape> default_shapes() {
  // M*N from 16M to 256M elements, K from 2K to 16K: 14 (M, N) x 4 K = 56.
  std::vector<Shape> s;
  for (std::int64_t m : {2048, 4096, 6144, 8192, 16384})
    for (std::int64_t n : {4096, 8192, 16384})
      if (m * n >= (16ll << 20) && m * n <= (256ll << 20))
        for (std::int64_t k : {2048, 4096, 8192, 16384}) s.push_back({m, n, k});
  return s;
}

Shape parse_shape(const std::string& t) {
  Shape s{};
  char x1 = 0, x2 = 0;
  long long m = 0, n = 0, k = 0;
  TESSERA_CHECK(std::sscanf(t.c_str(), "%lld%c%lld%c%lld", &m, &x1, &n, &x2, &k) == 5 && x1 == 'x' && x2 == 'x' &&
                    m > 0 && n > 0 && k > 0,
                "bench signal: shape '{}' is not MxNxK", t);
  s = {m, n, k};
  return s;
}

struct DevMem {
  void* p = nullptr;
  explicit DevMem(std::size_t bytes) { TESSERA_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 256))); }
  ~DevMem() { cudaFree(p); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

ncclDataType_t bf16() { return ncclBfloat16; }

// Median ms of `body` on `stream`, max over ranks (all ranks call it together).
double timed(runtime::ProcessGroup& pg, cudaStream_t stream, const std::function<void()>& body, const Options& o) {
  const Stats s = time_on_stream(stream, body, o.warmup, o.reps, [&] { pg.barrier(); });
  return pg.allreduce_max(s.median_ms);
}

// Runs one collective of `elems` bf16 elements (op: ar or rs) from `send` into `recv`.
void collective(const std::string& op, const void* send, void* recv, std::int64_t elems, int world, ncclComm_t comm,
                cudaStream_t s) {
  if (op == "ar")
    TESSERA_NCCL_CHECK(ncclAllReduce(send, recv, size_t(elems), bf16(), ncclSum, comm, s));
  else
    TESSERA_NCCL_CHECK(ncclReduceScatter(send, recv, size_t(elems / world), bf16(), ncclSum, comm, s));
}

// ---- offline stage: bandwidth curve and per-group overhead -----------------
tune::BandwidthCurve measure_curve(runtime::ProcessGroup& pg, const std::string& op, std::int64_t max_bytes,
                                   const Options& o) {
  const std::int64_t max_elems = max_bytes / 2;
  DevMem a(max_bytes), b(max_bytes);
  cudaStream_t s = pg.comm_stream(0);
  std::vector<tune::BandwidthCurve::Point> pts;
  double prev = 0;
  for (double bytes = 64 * 1024; bytes <= double(max_bytes) * 1.0001; bytes *= std::sqrt(2.0)) {
    std::int64_t elems = static_cast<std::int64_t>(bytes / 2) / (8 * pg.world()) * (8 * pg.world());
    elems = std::min(elems, max_elems);
    const double ms = timed(pg, s, [&] { collective(op, a.p, b.p, elems, pg.world(), pg.nccl(), s); }, o);
    // A measured curve can wiggle by noise; keep time non-decreasing.
    prev = std::max(prev, ms * 1e-3);
    if (pts.empty() || double(elems * 2) > pts.back().bytes) pts.push_back({double(elems * 2), prev});
  }
  return tune::BandwidthCurve(pts);
}

// Cost of one extra group: G waits (already satisfied) + G collectives of
// bytes/G against one collective of `bytes`, using the curve for the pieces.
double measure_group_overhead(runtime::ProcessGroup& pg, const std::string& op, signal::WaitMode mode,
                              const tune::BandwidthCurve& curve, const Options& o) {
  const int G = 8;
  const std::int64_t tile = 128 * 128;
  const signal::WaveModel wm(signal::GemmTiling{128ll * 8 * G, 128 * 16, 128, 128}, 16);  // 8 tiles per row of waves
  const signal::GroupPlan plan = signal::GroupPlan::equal(wm, G);
  const std::int64_t elems = wm.tiles() * tile;
  DevMem buf(elems * 2), recv(elems * 2);
  signal::GroupCounters counters(G);
  signal::CommDriver drv(pg.nccl(), pg.comm_stream(0), mode);
  set_counters(counters.device(), G, 0xFFFFFFFFu, pg.comm_stream(0));  // every epoch's wait passes
  TESSERA_CUDA_CHECK(cudaGetLastError());
  const signal::ArMap am = signal::make_ar_map(wm);
  const signal::RsMap rm = signal::make_rs_map(wm, pg.world());
  const double ms = timed(
      pg, pg.comm_stream(0),
      [&] {
        if (op == "ar")
          drv.all_reduce(plan, am, buf.p, DType::bf16, counters, 1);
        else
          drv.reduce_scatter(plan, rm, buf.p, recv.p, DType::bf16, counters, 1);
      },
      o);
  double pieces = 0;
  for (int g = 0; g < G; ++g) pieces += curve.time(double(plan.tiles_in(g)) * tile * 2);
  return std::max(0.0, (ms * 1e-3 - pieces) / G);
}

// ---- per-shape measurement --------------------------------------------------
struct Row {
  Shape shape;
  int waves = 0;
  std::string plan;
  double gemm = 0, comm = 0, seq = 0, decomp = 0, tessera = 0, predicted = 0, bound = 0;
  double per_wave_meas = 0, equal2_meas = 0;
  double rel_err = 0;
  bool overlap = false;
  tune::GemmTiming timing;  ///< for the stored machine profile
};

struct Problem {
  const Options& o;
  runtime::ProcessGroup& pg;
  Shape sh;
  kernels::GemmArgs args;
  kernels::GemmOptions gopts;
};

// Tessera's overlapped GEMM + collective for one partition; returns median ms.
// `out` receives the final data of the last run (AR: reordered buffer; RS: recv).
double run_overlap(Problem& P, const signal::WaveModel& wm, const signal::GroupPlan& plan, signal::WaitMode mode,
                   void* buf, void* recv) {
  const bool ar = P.o.op == "ar";
  const signal::ArMap am = signal::make_ar_map(wm);
  const signal::RsMap rm = signal::make_rs_map(wm, P.pg.world());
  const signal::EpilogueTables t = ar ? signal::epilogue_tables(wm, plan, am) : signal::epilogue_tables(wm, plan, rm);
  const signal::DeviceEpilogueTables dt(t);
  signal::GroupCounters counters(plan.groups());
  signal::CommDriver drv(P.pg.nccl(), P.pg.comm_stream(0), mode);
  cudaStream_t cs = P.pg.stream(), ms = P.pg.comm_stream(0);
  cudaEvent_t fork, join;
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  std::uint64_t epoch = 0;
  const auto body = [&] {
    ++epoch;
    TESSERA_CUDA_CHECK(cudaEventRecord(fork, cs));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(ms, fork));
    if (ar)
      drv.all_reduce(plan, am, buf, DType::bf16, counters, epoch);
    else
      drv.reduce_scatter(plan, rm, buf, recv, DType::bf16, counters, epoch);
    gemm_into_groups(P.args, P.gopts, buf, dt.tile_base(), dt.seg_stride(), dt.tile_group(), dt.sub_rows(),
                     dt.tile_n(), counters.device(), cs);
    TESSERA_CUDA_CHECK(cudaEventRecord(join, ms));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, join));
  };
  const double t_ms = timed(P.pg, cs, body, P.o);
  drv.synchronize(plan, counters, epoch);
  TESSERA_CUDA_CHECK(cudaEventDestroy(fork));
  TESSERA_CUDA_CHECK(cudaEventDestroy(join));
  return t_ms;
}

Row measure(Problem& P, const tune::BandwidthCurve& curve, double overhead, signal::WaitMode mode) {
  const Options& o = P.o;
  runtime::ProcessGroup& pg = P.pg;
  const Shape sh = P.sh;
  const bool ar = o.op == "ar";
  const int R = pg.world();
  Row row;
  row.shape = sh;
  const std::int64_t mn = sh.m * sh.n;
  DevMem A(sh.m * sh.k * 2), B(sh.n * sh.k * 2), D(mn * 2), C(mn * 2);
  fill_random_bf16(A.p, sh.m * sh.k, 1000 + pg.rank(), pg.stream());
  fill_random_bf16(B.p, sh.n * sh.k, 2000 + pg.rank(), pg.stream());
  TESSERA_CUDA_CHECK(cudaGetLastError());
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(pg.stream()));
  kernels::GemmArgs args;
  args.a = A.p;
  args.b = B.p;
  args.d = D.p;
  args.m = sh.m;
  args.n = sh.n;
  args.k = sh.k;
  cudaStream_t cs = pg.stream(), ms = pg.comm_stream(0);

  // Baselines.
  row.gemm = timed(pg, cs, [&] { kernels::cublaslt_gemm(args, cs); }, o);
  row.comm = timed(pg, cs, [&] { collective(o.op, D.p, C.p, mn, R, pg.nccl(), cs); }, o);
  row.seq = timed(pg, cs, [&] { kernels::cublaslt_gemm(args, cs); collective(o.op, D.p, C.p, mn, R, pg.nccl(), cs); }, o);
  {
    const int chunks = 4;
    std::vector<cudaEvent_t> ev(chunks);
    for (auto& e : ev) TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    cudaEvent_t fork, join;
    TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    const std::int64_t rows = (sh.m / chunks + 127) / 128 * 128;
    row.decomp = timed(pg, cs, [&] {
      TESSERA_CUDA_CHECK(cudaEventRecord(fork, cs));
      TESSERA_CUDA_CHECK(cudaStreamWaitEvent(ms, fork));
      for (int c = 0; c < chunks; ++c) {
        const std::int64_t r0 = c * rows, r1 = std::min(sh.m, r0 + rows);
        if (r0 >= r1) break;
        kernels::GemmArgs part = args;
        part.a = static_cast<const char*>(args.a) + r0 * sh.k * 2;
        part.d = static_cast<char*>(args.d) + r0 * sh.n * 2;
        part.m = r1 - r0;
        kernels::cublaslt_gemm(part, cs);
        TESSERA_CUDA_CHECK(cudaEventRecord(ev[c], cs));
        TESSERA_CUDA_CHECK(cudaStreamWaitEvent(ms, ev[c]));
        const std::int64_t e = (r1 - r0) * sh.n / (ar ? 1 : R) * (ar ? 1 : R);
        collective(o.op, part.d, static_cast<char*>(C.p) + r0 * sh.n * 2 / (ar ? 1 : R), e, R, pg.nccl(), ms);
      }
      TESSERA_CUDA_CHECK(cudaEventRecord(join, ms));
      TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, join));
    }, o);
    for (auto& e : ev) TESSERA_CUDA_CHECK(cudaEventDestroy(e));
    TESSERA_CUDA_CHECK(cudaEventDestroy(fork));
    TESSERA_CUDA_CHECK(cudaEventDestroy(join));
  }

  // The overlapped GEMM: SMs minus NCCL's, the engine's tile for that budget.
  P.args = args;
  P.gopts = kernels::GemmOptions{};
  P.gopts.max_ctas = pg.sm_count() - o.nccl_sms;
  P.gopts.tile = kernels::resolve_tile(args, P.gopts);
  const kernels::TileShape ts = kernels::tile_shape(P.gopts.tile);
  const signal::WaveModel wm(signal::GemmTiling{sh.m, sh.n, ts.bm, ts.bn}, P.gopts.max_ctas, P.gopts.raster_group,
                             P.gopts.raster_along_m ? signal::Raster::AlongM : signal::Raster::AlongN);
  row.waves = wm.waves();
  TESSERA_CHECK(ar || ts.bm % R == 0, "bench signal: tile height {} not divisible by {} ranks", ts.bm, R);
  const signal::ArMap am = signal::make_ar_map(wm);
  DevMem buf(am.buffer_elems() * 2), recv(am.buffer_elems() * 2 / R + 256);
  // Compute alone under overlap conditions (budgeted SMs, group epilogue, one group).
  double gemm_budget_ms = 0;
  {
    const signal::GroupPlan one = signal::GroupPlan::single(wm);
    const signal::DeviceEpilogueTables dt(signal::epilogue_tables(wm, one, am));
    signal::GroupCounters cnt(1);
    gemm_budget_ms = timed(pg, cs, [&] {
      gemm_into_groups(P.args, P.gopts, buf.p, dt.tile_base(), dt.seg_stride(), dt.tile_group(), dt.sub_rows(),
                       dt.tile_n(), cnt.device(), cs);
    }, o);
  }
  row.timing = {sh.m, sh.n, sh.k, ts.bm, ts.bn, P.gopts.raster_group, P.gopts.max_ctas,
                gemm_budget_ms * 1e-3 / wm.waves(), row.gemm * 1e-3};
  // Predict and search.
  const double bytes_per_tile = double(ts.bm) * ts.bn * 2;
  signal::OverlapCost cost = signal::OverlapCost::from_tiles(
      wm, signal::WaveTimes::from_gemm_time(wm.waves(), gemm_budget_ms * 1e-3), row.gemm * 1e-3, bytes_per_tile,
      [&curve](double b) { return curve.time(b); }, overhead);
  const signal::PredictiveSearch search(cost);
  const signal::Prediction best = search.best();
  row.overlap = best.overlap;
  row.predicted = best.latency * 1e3;
  row.plan = best.overlap ? signal::GroupPlan(wm, best.waves_per_group).str() : "no overlap";
  if (best.overlap) {
    row.tessera = run_overlap(P, wm, signal::GroupPlan(wm, best.waves_per_group), mode, buf.p, recv.p);
    // Correctness of the last run against cuBLASLt + NCCL (different GEMM kernels: bf16-level agreement).
    kernels::cublaslt_gemm(args, cs);
    collective(o.op, D.p, C.p, mn, R, pg.nccl(), cs);
    DevMem out(mn * 2);
    if (ar) {
      signal::unreorder(am, buf.p, out.p, sh.n, DType::bf16, cs);
    } else {
      signal::unreorder(signal::RsShard{signal::make_rs_map(wm, R), pg.rank()}, recv.p, out.p, sh.n, DType::bf16, cs);
    }
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(cs));
    const std::int64_t rows_out = ar ? sh.m : signal::make_rs_map(wm, R).rows_of(pg.rank());
    std::vector<std::uint16_t> got(rows_out * sh.n), ref(ar ? mn : mn / R);
    TESSERA_CUDA_CHECK(cudaMemcpy(got.data(), out.p, got.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<double> g, r;
    if (ar) {
      TESSERA_CUDA_CHECK(cudaMemcpy(ref.data(), C.p, ref.size() * 2, cudaMemcpyDeviceToHost));
    } else {
      // Reference rows of this rank under the block-cyclic assignment: the full
      // reduced matrix is needed, so all-reduce D instead.
      ref.resize(mn);
      TESSERA_NCCL_CHECK(ncclAllReduce(D.p, C.p, size_t(mn), bf16(), ncclSum, pg.nccl(), cs));
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(cs));
      TESSERA_CUDA_CHECK(cudaMemcpy(ref.data(), C.p, ref.size() * 2, cudaMemcpyDeviceToHost));
    }
    const auto f = [](std::uint16_t h) {
      std::uint32_t u = std::uint32_t(h) << 16;
      float x;
      std::memcpy(&x, &u, 4);
      return double(x);
    };
    const signal::RsMap rm = signal::make_rs_map(wm, R);
    for (std::int64_t l = 0; l < rows_out; l += 7)
      for (std::int64_t j = 0; j < sh.n; ++j) {
        const std::int64_t i = ar ? l : rm.global_row(pg.rank(), l);
        g.push_back(f(got[l * sh.n + j]));
        r.push_back(f(ref[i * sh.n + j]));
      }
    double num = 0, den = 0;
    for (std::size_t x = 0; x < g.size(); ++x) {
      num += (g[x] - r[x]) * (g[x] - r[x]);
      den += r[x] * r[x];
    }
    row.rel_err = std::isfinite(num) && den > 0 ? std::sqrt(num / den) : INFINITY;
    row.rel_err = pg.allreduce_max(row.rel_err);
  } else {
    row.tessera = row.seq;  // the tuner chose cuBLASLt then NCCL
  }
  // Two fixed partitions for comparison with the searched one.
  row.per_wave_meas = run_overlap(P, wm, signal::GroupPlan::per_wave(wm), mode, buf.p, recv.p);
  row.equal2_meas = wm.waves() >= 2 ? run_overlap(P, wm, signal::GroupPlan::equal(wm, 2), mode, buf.p, recv.p) : 0;
  // Seed §6.4 bound from the measured standalone times.
  const signal::WaveModel full = wm.with_sms(pg.sm_count());
  const double first_wave = row.gemm / full.waves();
  const double last_wave_comm = curve.time(double(full.tiles_in_wave(full.waves() - 1)) * bytes_per_tile) * 1e3;
  row.bound = row.gemm >= row.comm ? row.gemm + last_wave_comm : first_wave + row.comm;
  return row;
}

std::string f3(double x) { return fmt::format("{:.3f}", x); }

void run(const Options& o) {
  auto pg = runtime::ProcessGroup::from_environment();
  TESSERA_CHECK(o.op == "ar" || o.op == "rs", "bench signal: --op must be ar or rs, got '{}'", o.op);
  TESSERA_CHECK(o.wait == "memop" || o.wait == "spin", "bench signal: --wait must be memop or spin, got '{}'", o.wait);
  TESSERA_CHECK(o.nccl_sms >= 0 && o.nccl_sms < pg->sm_count(), "bench signal: --nccl-sms {} outside [0, {})",
                o.nccl_sms, pg->sm_count());
  const signal::WaitMode mode = o.wait == "memop" ? signal::WaitMode::StreamMemOp : signal::WaitMode::SpinKernel;
  std::vector<Shape> shapes;
  for (const auto& s : o.shapes) shapes.push_back(parse_shape(s));
  if (shapes.empty()) shapes = default_shapes();
  std::int64_t max_bytes = 0;
  for (const Shape& s : shapes) max_bytes = std::max(max_bytes, s.m * s.n * 2);

  // Offline stage.
  const tune::Collective coll = o.op == "ar" ? tune::Collective::AllReduce : tune::Collective::ReduceScatter;
  const tune::BandwidthCurve curve = measure_curve(*pg, o.op, max_bytes, o);
  const double ovh_memop = measure_group_overhead(*pg, o.op, signal::WaitMode::StreamMemOp, curve, o);
  const double ovh_spin = measure_group_overhead(*pg, o.op, signal::WaitMode::SpinKernel, curve, o);
  const double overhead = mode == signal::WaitMode::StreamMemOp ? ovh_memop : ovh_spin;
  if (pg->rank() == 0)
    fmt::print("per-group overhead: stream memop {:.2f} us, spinning kernel {:.2f} us (using {})\n", ovh_memop * 1e6,
               ovh_spin * 1e6, o.wait);

  Table table({"M", "N", "K", "waves", "partition", "GEMM ms", "comm ms", "seq ms", "decomp ms", "tessera ms",
               "predicted ms", "pred err %", "speedup", "bound ms", "of bound", "per-wave ms", "2 groups ms",
               "rel err"});
  double err_sum = 0;
  int err_n = 0, slower = 0, searched_best = 0;
  std::vector<tune::GemmTiming> timings;
  for (const Shape& s : shapes) {
    Problem P{o, *pg, s, {}, {}};
    const Row r = measure(P, curve, overhead, mode);
    timings.push_back(r.timing);
    const double err = r.overlap ? std::abs(r.predicted - r.tessera) / r.tessera * 100 : 0;
    if (r.overlap) { err_sum += err; ++err_n; }
    slower += r.tessera > r.seq * 1.005;
    const double best_fixed = std::min(r.per_wave_meas, r.equal2_meas > 0 ? r.equal2_meas : 1e30);
    searched_best += r.tessera <= best_fixed * 1.01;
    table.add({std::to_string(s.m), std::to_string(s.n), std::to_string(s.k), std::to_string(r.waves), r.plan,
               f3(r.gemm), f3(r.comm), f3(r.seq), f3(r.decomp), f3(r.tessera), f3(r.predicted),
               r.overlap ? fmt::format("{:.1f}", err) : "-", fmt::format("{:.3f}", r.seq / r.tessera), f3(r.bound),
               fmt::format("{:.2f}", r.bound / r.tessera), f3(r.per_wave_meas), f3(r.equal2_meas),
               r.overlap ? fmt::format("{:.1e}", r.rel_err) : "-"});
    if (pg->rank() == 0) fmt::print("{}x{}x{}: tessera {:.3f} ms, seq {:.3f} ms ({})\n", s.m, s.n, s.k, r.tessera, r.seq, r.plan);
  }
  if (pg->rank() == 0) {
    fmt::print("\n{}\n", table.str());
    fmt::print("op {} on {} ranks, wait {}, NCCL SMs reserved {}: mean predictor error {:.2f}% over {} overlapped "
               "shapes; slower than sequential on {} of {}; searched partition within 1% of the best fixed one on "
               "{} of {}\n",
               o.op, pg->world(), o.wait, o.nccl_sms, err_n ? err_sum / err_n : 0.0, err_n, slower, shapes.size(),
               searched_best, shapes.size());
    if (!o.markdown.empty()) {
      std::ofstream md(o.markdown, std::ios::app);
      md << table.markdown() << "\n";
    }
  }
  if (o.store_profile && pg->rank() == 0) {
    tune::MachineProfile prof;
    prof.machine = {pg->device_properties().name, o.topology, pg->world()};
    prof.dtype = DType::bf16;
    prof.sm_count = pg->sm_count();
    prof.nccl_sms = o.nccl_sms;
    prof.per_group_overhead = overhead;
    prof.curves[coll] = curve;
    prof.gemms = timings;
    tune::Cache cache("machine_profile", tune::MachineProfile::kCacheVersion);
    if (auto old = tune::MachineProfile::load(cache, prof.machine, prof.dtype)) {
      for (const auto& [c, cv] : old->curves)
        if (!prof.curves.count(c)) prof.curves[c] = cv;
      for (const auto& g : old->gemms)
        if (!prof.find_gemm(g.m, g.n, g.k, g.tile_m, g.tile_n)) prof.gemms.push_back(g);
    }
    prof.store(cache);
    fmt::print("stored machine profile in {}\n", cache.file().string());
  }
}

// ---- signal-kernels: RMSNorm fused with the un-reorder ---------------------
struct KOptions {
  std::vector<std::string> shapes{"4096x4096", "8192x8192", "16384x8192", "2048x16384"};
  int reps = 20, warmup = 5;
};

void run_kernels(const KOptions& o) {
  int dev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  cudaStream_t s;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Table table({"M", "N", "RMSNorm us", "fused AR us", "AR %", "fused RS us", "RS %", "fused A2A us", "A2A %",
               "copy us", "un-reorder AR us", "un-reorder %"});
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
    for (auto& d : dest) for (auto& v : d) v = int(g() % 4 == 0);  // uneven: a quarter goes to rank 1
    std::vector<std::vector<int>> parts(2, std::vector<int>{wm.waves()});
    const signal::A2aPlan a2a(n, 128, 128, 116, 8, signal::Raster::AlongN, dest, parts);
    DevMem in(am.buffer_elems() * 2 * 2), out(m * n * 2 * 2), w(n * 2);
    DevMem table_src(std::max<std::size_t>(a2a.chunk_src(1).size(), 1) * 8);
    TESSERA_CUDA_CHECK(cudaMemcpy(table_src.p, a2a.chunk_src(1).data(), a2a.chunk_src(1).size() * 8, cudaMemcpyHostToDevice));
    signal::A2aRecvMap rmap = a2a.recv_map(1);
    rmap.chunk_src = table_src.as<std::int64_t>();
    fill_random_bf16(in.p, am.buffer_elems() * 2, 1, s);
    fill_random_bf16(w.p, n, 2, s);
    TESSERA_CUDA_CHECK(cudaGetLastError());
    const auto us = [&](const std::function<void()>& f) { return time_on_stream(s, f, o.warmup, o.reps).median_ms * 1e3; };
    const signal::RowMajorMap plain{m, n, n};
    const signal::RowMajorMap plain_rs{rs.rows(), n, n};
    const signal::RowMajorMap plain_a2a{rmap.rows(), n, n};
    const double base = us([&] { signal::rmsnorm_unreorder(plain, in.p, w.p, out.p, n, 1e-6f, DType::bf16, s); });
    const double base_rs = us([&] { signal::rmsnorm_unreorder(plain_rs, in.p, w.p, out.p, n, 1e-6f, DType::bf16, s); });
    const double base_a2a = us([&] { signal::rmsnorm_unreorder(plain_a2a, in.p, w.p, out.p, n, 1e-6f, DType::bf16, s); });
    const double far = us([&] { signal::rmsnorm_unreorder(am, in.p, w.p, out.p, n, 1e-6f, DType::bf16, s); });
    const double frs = us([&] { signal::rmsnorm_unreorder(rs, in.p, w.p, out.p, n, 1e-6f, DType::bf16, s); });
    const double fa2a = us([&] { signal::rmsnorm_unreorder(rmap, in.p, w.p, out.p, n, 1e-6f, DType::bf16, s); });
    const double copy = us([&] { signal::unreorder(plain, in.p, out.p, n, DType::bf16, s); });
    const double uar = us([&] { signal::unreorder(am, in.p, out.p, n, DType::bf16, s); });
    const auto pct = [](double a, double b) { return fmt::format("{:+.1f}", (a / b - 1) * 100); };
    table.add({std::to_string(m), std::to_string(n), fmt::format("{:.1f}", base), fmt::format("{:.1f}", far),
               pct(far, base), fmt::format("{:.1f}", frs), pct(frs, base_rs), fmt::format("{:.1f}", fa2a),
               pct(fa2a, base_a2a), fmt::format("{:.1f}", copy), fmt::format("{:.1f}", uar), pct(uar, copy)});
  }
  TESSERA_CUDA_CHECK(cudaStreamDestroy(s));
  fmt::print("{}\n(bf16; tiles 128x128; RS = rank 0 of 2; A2A = rank 1 receiving an uneven quarter/three-quarter "
             "split; every % is against the plain kernel on the same rows)\n",
             table.str());
}

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto& bench = tools::subcommand(root, "bench", "Benchmarks (run multi-GPU ones under `tessera run -n N --`)");
  auto opts = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("signal", "Signal-based overlap (FlashOverlap): GEMM + NCCL AR/RS per wave group");
  cmd->add_option("--op", opts->op, "ar or rs");
  cmd->add_option("--shapes", opts->shapes, "MxNxK list (default: 56 sizes, M*N 16M..256M, K 2K..16K)")->delimiter(',');
  cmd->add_option("--nccl-sms", opts->nccl_sms, "SMs left to NCCL during overlap (the GEMM gets the rest)");
  cmd->add_option("--wait", opts->wait, "memop (cuStreamWaitValue32) or spin (spinning kernel)");
  cmd->add_option("--reps", opts->reps, "timed repetitions (median)")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", opts->warmup, "warm-up repetitions")->check(CLI::Range(0, 100000));
  cmd->add_flag("--store-profile", opts->store_profile, "store the measured curve/overhead as a tune::MachineProfile");
  cmd->add_option("--topology", opts->topology, "topology label of the stored profile");
  cmd->add_option("--markdown", opts->markdown, "append the table as Markdown to this file (rank 0)");
  cmd->callback([opts] { run(*opts); });

  auto kopts = std::make_shared<KOptions>();
  auto* k = bench.add_subcommand("signal-kernels", "RMSNorm fused with the post-communication un-reorder vs plain");
  k->add_option("--shapes", kopts->shapes, "MxN list")->delimiter(',');
  k->add_option("--reps", kopts->reps, "timed repetitions (median)")->check(CLI::Range(1, 100000));
  k->add_option("--warmup", kopts->warmup, "warm-up repetitions")->check(CLI::Range(0, 100000));
  k->callback([kopts] { run_kernels(*kopts); });
});

}  // namespace
}  // namespace tessera::bench::signalb
