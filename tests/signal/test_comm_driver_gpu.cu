// Multi-rank GPU test of the signal communication driver: a fake producer
// kernel publishes wave groups in random order with random delays (bumping
// the per-group counters tile by tile, release), the driver waits per group
// (stream memory operation or spinning kernel) and runs NCCL AllReduce /
// ReduceScatter / grouped send-recv on each group's span; the un-reordered
// result must equal the non-overlapped reference exactly (f32, small
// integers). Three back-to-back calls per case: counters are never reset.
//
// Hang safety (a hang is a bug, in the test too):
//  - the fake producer's module is loaded before any stream waits (lazy
//    loading would make its first launch wait for the blocked device), and
//    NCCL is warmed up (its lazy connection setup must not run while the
//    communication stream waits);
//  - every host wait on a stream is bounded (drain_or_die); a stream that
//    cannot drain means a stuck wait or collective, after which any cudaFree
//    would hang, so the rank reports and ends (tessera run stops the others);
//  - a per-test watchdog ends the process if a test outlives its limit;
//  - every epoch ends with an exchange of every rank's outcome over the
//    bootstrap (bounded by its timeout), so that all ranks leave a failing
//    test at the same point and keep issuing NCCL calls in the same order.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/test_support.hpp"
#include "tessera/runtime/process_group.hpp"
#include "tessera/signal/comm_driver.hpp"
#include "tessera/signal/overlap_comm.hpp"
#include "tessera/signal/device.cuh"
#include "tessera/signal/unreorder.hpp"

using namespace tessera;
using namespace tessera::signal;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

namespace {

void drain_or_die(cudaStream_t s, const char* what);

// One unblocked call of each NCCL pattern the tests use (AllReduce and
// ReduceScatter at a few sizes, grouped send/recv with every peer) on the
// communication stream, so that NCCL's lazy connection setup (and anything
// it synchronizes) happens here, not while the stream waits on counters.
void warm_up_nccl(runtime::ProcessGroup& pg, ncclComm_t comm) {
  const int R = pg.world();
  const std::size_t max_elems = std::size_t(1) << 22;
  float* buf = nullptr;
  if (cudaMalloc(&buf, 2 * max_elems * R * sizeof(float)) != cudaSuccess) return;  // the tests will report it
  cudaStream_t s = pg.comm_stream(0);
  ncclResult_t rc = ncclSuccess;
  auto ok = [&](ncclResult_t r) { return (rc = r) == ncclSuccess; };
  for (std::size_t n : {std::size_t(1024), std::size_t(1) << 16, max_elems}) {
    if (!ok(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm, s))) break;
    if (!ok(ncclReduceScatter(buf, buf + n * R, n, ncclFloat32, ncclSum, comm, s))) break;
    if (!ok(ncclGroupStart())) break;
    for (int p = 0; p < R && rc == ncclSuccess; ++p)
      if (ok(ncclSend(buf, n, ncclFloat32, p, comm, s))) ok(ncclRecv(buf + n * R + p * n, n, ncclFloat32, p, comm, s));
    if (!ok(ncclGroupEnd())) break;
  }
  if (rc != ncclSuccess) std::fprintf(stderr, "NCCL warm-up failed: %s\n", ncclGetErrorString(rc));
  drain_or_die(s, "NCCL warm-up");
  cudaFree(buf);
}

runtime::ProcessGroup* group() {
  static std::unique_ptr<runtime::ProcessGroup> pg = [] {
    auto p = runtime::ProcessGroup::from_environment();
    warm_up_nccl(*p, p->nccl());
    return p;
  }();
  return pg.get();
}

// The split communicator of the overlapped path (8 CTAs, no clusters),
// created once by all ranks after the group, and warmed up like it.
OverlapComm* overlap_comm() {
  static std::unique_ptr<OverlapComm> c = [] {
    auto* pg = group();
    auto o = std::make_unique<OverlapComm>(pg->nccl(), OverlapCommConfig{8, 0, 0});
    warm_up_nccl(*pg, o->get());
    return o;
  }();
  return c.get();
}

std::chrono::milliseconds wait_timeout() { return std::chrono::milliseconds(runtime::wait_timeout_ns() / 1000000); }

// Waits for `s` to drain, at most twice the wait timeout. A stream that does
// not drain holds a stuck wait or collective; every later device-wide
// synchronization (cudaFree, the communicator's finalize) would hang, so the
// rank reports it and ends the process — `tessera run` then stops the others.
void drain_or_die(cudaStream_t s, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + 2 * wait_timeout();
  for (;;) {
    const cudaError_t rc = cudaStreamQuery(s);
    if (rc == cudaSuccess) return;
    if (rc != cudaErrorNotReady) {
      std::fprintf(stderr, "%s: CUDA error %s; ending the process\n", what, cudaGetErrorName(rc));
      std::fflush(stderr);
      std::_Exit(1);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "%s: stream still busy after %lld ms (stuck wait or collective); ending the process\n", what,
                   static_cast<long long>(2 * wait_timeout().count()));
      std::fflush(stderr);
      std::_Exit(1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// Ends the process if the current test runs longer than `limit`: the last
// line of defence against a hang nobody foresaw (a ctest timeout would
// report nothing useful and hold the other ranks).
class Watchdog {
 public:
  explicit Watchdog(std::chrono::milliseconds limit)
      : thread_([this, limit] {
          std::unique_lock lk(mu_);
          if (cv_.wait_for(lk, limit, [this] { return done_; })) return;
          const auto* t = ::testing::UnitTest::GetInstance()->current_test_info();
          std::fprintf(stderr, "test %s.%s still running after %lld ms; ending the process\n",
                       t ? t->test_suite_name() : "?", t ? t->name() : "?", static_cast<long long>(limit.count()));
          std::fflush(stderr);
          std::_Exit(1);
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// What one rank saw in one step of a test; exchanged so all ranks agree.
struct Outcome {
  std::int64_t bad = 0;  // wrong elements
  int threw = 0;         // an exception (first 200 characters below)
  char what[200] = {};
};

// Every rank learns every rank's outcome (bootstrap allgather, bounded by its
// timeout). Returns "" when all ranks passed, else a description of each
// failing rank; all ranks get the same verdict and leave the test together.
std::string agree(std::int64_t bad, const std::string& error) {
  Outcome mine;
  mine.bad = bad;
  mine.threw = !error.empty();
  std::snprintf(mine.what, sizeof(mine.what), "%s", error.c_str());
  std::string verdict;
  const auto all = group()->allgather(mine);
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    if (all[r].threw)
      verdict += "rank " + std::to_string(r) + " threw: " + all[r].what + "\n";
    else if (all[r].bad != 0)
      verdict += "rank " + std::to_string(r) + ": " + std::to_string(all[r].bad) + " wrong elements\n";
  }
  return verdict;
}

// Copies each group's spans from `staging` to `dst` in the order given,
// sleeping delay_us[k] before group order[k], then bumps the group's counter
// once per tile (signal_tile_done: barrier + release add).
__global__ void fake_producer(const float* staging, float* dst, const int* order, const int* delay_us,
                              const long long* span_begin, const long long* span_off, const long long* span_len,
                              const int* tiles, int groups, std::uint32_t* counters) {
  for (int k = 0; k < groups; ++k) {
    const int g = order[k];
    if (threadIdx.x == 0) {
      const long long until = clock64() + 1700LL * delay_us[k];  // ~1 us per 1.7k cycles
      while (clock64() < until) {
      }
    }
    __syncthreads();
    for (long long s = span_begin[g]; s < span_begin[g + 1]; ++s)
      for (long long e = threadIdx.x; e < span_len[s]; e += blockDim.x) dst[span_off[s] + e] = staging[span_off[s] + e];
    for (int t = 0; t < tiles[g]; ++t) signal_tile_done(counters, g);
  }
}

float value(int rank, int epoch, std::int64_t i, std::int64_t j) {
  return float(((rank + 1) * 7 + epoch * 13 + i * 31 + j * 17) % 1001 - 500);
}

// Device copy of `v`, uploaded on stream `s` (stream-ordered before the
// kernels that read it there; pageable source, so the call returns once the
// data is staged).
template <class T>
T* dev_copy(const std::vector<T>& v, cudaStream_t s) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<std::size_t>(v.size(), 1) * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s), cudaSuccess);
  return p;
}

struct Spans {
  std::vector<long long> begin{0}, off, len;
  void add_group(const std::vector<std::pair<std::int64_t, std::int64_t>>& s) {
    for (auto [o, l] : s) {
      off.push_back(o);
      len.push_back(l);
    }
    begin.push_back(static_cast<long long>(off.size()));
  }
};

// The producer of one call. Everything is allocated and copied in the
// constructor, BEFORE the driver enqueues its waits: an allocation that
// synchronized the device while the communication stream waits on counters
// only this producer can bump would deadlock. Runs on stream `s`.
struct Producer {
  float* staging = nullptr;
  int *order = nullptr, *delay = nullptr, *tiles = nullptr;
  long long *b = nullptr, *o = nullptr, *l = nullptr;
  int groups = 0;

  cudaStream_t stream;

  Producer(const std::vector<float>& staging_host, const Spans& spans, const GroupPlan& plan, std::mt19937_64& g,
           cudaStream_t s)
      : groups(plan.groups()), stream(s) {
    std::vector<int> ord(groups), del(groups), til(groups);
    std::iota(ord.begin(), ord.end(), 0);
    std::shuffle(ord.begin(), ord.end(), g);
    for (auto& d : del) d = std::uniform_int_distribution<int>(0, 200)(g);
    for (int k = 0; k < groups; ++k) til[k] = plan.tiles_in(k);
    staging = dev_copy(staging_host, s);
    order = dev_copy(ord, s);
    delay = dev_copy(del, s);
    tiles = dev_copy(til, s);
    b = dev_copy(spans.begin, s);
    o = dev_copy(spans.off, s);
    l = dev_copy(spans.len, s);
    drain_or_die(s, "producer upload");
  }
  // The kernel only bumps counters (it waits on nothing), so its stream drains.
  void launch(float* dst, GroupCounters& counters) {
    fake_producer<<<1, 256, 0, stream>>>(staging, dst, order, delay, b, o, l, tiles, groups, counters.device());
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    drain_or_die(stream, "fake producer");
  }
  ~Producer() {
    for (void* p : {(void*)staging, (void*)order, (void*)delay, (void*)tiles, (void*)b, (void*)o, (void*)l})
      cudaFree(p);
  }
};

bool skip_unless_two_ranks() {
  return tessera::testing::launched_world_size() < 2 || tessera::testing::visible_gpus() < 1;
}

// Copies n floats to the host on stream `s` (after the work enqueued there).
std::vector<float> download(const float* d, std::int64_t n, cudaStream_t s) {
  std::vector<float> h(n);
  if (n > 0) EXPECT_EQ(cudaMemcpyAsync(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, s), cudaSuccess);
  drain_or_die(s, "download");
  return h;
}

// Frees device memory at scope exit; only ever reached with drained streams
// (drain_or_die ends the process otherwise), so cudaFree cannot hang.
struct DeviceBuffers {
  std::vector<void*> ptrs;
  template <class T>
  T* alloc(std::int64_t elems) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, std::max<std::int64_t>(elems, 1) * sizeof(T)), cudaSuccess);
    ptrs.push_back(p);
    return static_cast<T*>(p);
  }
  ~DeviceBuffers() {
    for (void* p : ptrs) cudaFree(p);
  }
};

// Every test: the fake producer loaded before any stream waits, and a
// watchdog.
class Guarded : public ::testing::Test {
 protected:
  void SetUp() override {
    watchdog_ =
        std::make_unique<Watchdog>(std::max<std::chrono::milliseconds>(std::chrono::seconds(60), 10 * wait_timeout()));
    if (tessera::testing::visible_gpus() > 0)
      ensure_loaded(reinterpret_cast<const void*>(&fake_producer), "fake_producer");
  }
  void TearDown() override { watchdog_.reset(); }

 private:
  std::unique_ptr<Watchdog> watchdog_;
};

}  // namespace

class CommDriverGpu : public Guarded, public ::testing::WithParamInterface<WaitMode> {};

// One epoch of a case: `body` enqueues, produces, synchronizes and returns
// the number of wrong elements; exceptions are caught so that every rank
// reaches the outcome exchange (agree) and all ranks stop together.
template <class Body>
std::string run_epoch(Body&& body) {
  std::int64_t bad = 0;
  std::string error;
  try {
    bad = body();
  } catch (const std::exception& e) {
    error = e.what();
  }
  return agree(bad, error);
}

TEST_P(CommDriverGpu, AllReduceGroupsInRandomOrder) {
  if (skip_unless_two_ranks()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto* pg = group();
  std::mt19937_64 g(std::random_device{}());
  const WaveModel wm(GemmTiling{1000, 776, 128, 64}, 9, 2);
  const ArMap map = make_ar_map(wm);
  for (const GroupPlan& plan :
       {GroupPlan::single(wm), GroupPlan::per_wave(wm), GroupPlan(wm, {1, 3, wm.waves() - 4})}) {
    GroupCounters counters(plan.groups());
    CommDriver drv(pg->nccl(), pg->comm_stream(0), GetParam());
    DeviceBuffers mem;
    float* buf = mem.alloc<float>(map.buffer_elems());
    float* out = mem.alloc<float>(1000 * 776);
    Spans spans;
    for (int k = 0; k < plan.groups(); ++k)
      spans.add_group({{plan.tile_begin(k) * map.tile_elems(), plan.tiles_in(k) * map.tile_elems()}});
    for (int epoch = 1; epoch <= 3; ++epoch) {
      const std::string verdict = run_epoch([&]() -> std::int64_t {
        std::vector<float> staging(map.buffer_elems(), 0.f);
        for (std::int64_t i = 0; i < 1000; ++i)
          for (std::int64_t j = 0; j < 776; ++j) staging[map.offset(i, j)] = value(pg->rank(), epoch, i, j);
        Producer prod(staging, spans, plan, g, pg->stream());
        drv.all_reduce(plan, map, buf, DType::f32, counters, epoch);  // enqueued before the producer runs
        prod.launch(buf, counters);
        drv.synchronize(plan, counters, epoch);
        unreorder(map, buf, out, 776, DType::f32, pg->comm_stream(0));
        const auto got = download(out, 1000 * 776, pg->comm_stream(0));
        std::int64_t bad = 0;
        for (std::int64_t i = 0; i < 1000; ++i)
          for (std::int64_t j = 0; j < 776; ++j) {
            float ref = 0;
            for (int r = 0; r < pg->world(); ++r) ref += value(r, epoch, i, j);
            bad += !(got[i * 776 + j] == ref);  // NaN counts as wrong
          }
        return bad;
      });
      ASSERT_EQ(verdict, "") << "epoch " << epoch << " plan " << plan.str() << " " << wait_mode_name(GetParam());
    }
  }
}

TEST_P(CommDriverGpu, ReduceScatterGroupsInRandomOrder) {
  if (skip_unless_two_ranks()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto* pg = group();
  std::mt19937_64 g(std::random_device{}());
  const std::int64_t M = 1000, N = 520;
  const WaveModel wm(GemmTiling{M, N, 128, 64}, 7, 3, Raster::AlongM);
  const RsMap map = make_rs_map(wm, pg->world());
  for (const GroupPlan& plan : {GroupPlan::single(wm), GroupPlan::equal(wm, 4)}) {
    GroupCounters counters(plan.groups());
    CommDriver drv(pg->nccl(), pg->comm_stream(0), GetParam());
    DeviceBuffers mem;
    float* send = mem.alloc<float>(map.send_elems());
    float* recv = mem.alloc<float>(map.recv_elems());
    float* out = mem.alloc<float>(M * N);
    Spans spans;
    for (int k = 0; k < plan.groups(); ++k)
      spans.add_group({{plan.tile_begin(k) * map.tile_elems(), plan.tiles_in(k) * map.tile_elems()}});
    const RsShard shard{map, pg->rank()};
    for (int epoch = 1; epoch <= 3; ++epoch) {
      const std::string verdict = run_epoch([&]() -> std::int64_t {
        std::vector<float> staging(map.send_elems(), 0.f);
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t j = 0; j < N; ++j)
            staging[map.send_offset(i, j, plan.host_view())] = value(pg->rank(), epoch, i, j);
        Producer prod(staging, spans, plan, g, pg->stream());
        drv.reduce_scatter(plan, map, send, recv, DType::f32, counters, epoch);
        prod.launch(send, counters);
        drv.synchronize(plan, counters, epoch);
        unreorder(shard, recv, out, N, DType::f32, pg->comm_stream(0));
        const auto got = download(out, shard.rows() * N, pg->comm_stream(0));
        std::int64_t bad = 0;
        for (std::int64_t l = 0; l < shard.rows(); ++l)
          for (std::int64_t j = 0; j < N; ++j) {
            float ref = 0;
            for (int r = 0; r < pg->world(); ++r) ref += value(r, epoch, map.global_row(pg->rank(), l), j);
            bad += !(got[l * N + j] == ref);
          }
        return bad;
      });
      ASSERT_EQ(verdict, "") << "epoch " << epoch << " plan " << plan.str() << " " << wait_mode_name(GetParam());
    }
  }
}

TEST_P(CommDriverGpu, AllToAllUnevenRoutingInRandomOrder) {
  if (skip_unless_two_ranks()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto* pg = group();
  const int R = pg->world();
  // Every rank builds the same routing from rank 0's seed.
  const auto seeds = pg->allgather(static_cast<unsigned long long>(std::random_device{}()));
  std::mt19937_64 g(seeds[0]);
  const std::int64_t N = 264;
  std::vector<std::vector<int>> dest(R), parts(R);
  for (int q = 0; q < R; ++q) {
    dest[q].resize(600 + 150 * q);
    for (auto& d : dest[q]) d = std::uniform_int_distribution<int>(0, 3)(g) == 0 ? 0 : R - 1;  // skewed
  }
  int G = 1 << 30;
  for (int q = 0; q < R; ++q)
    G = std::min(G, WaveModel(GemmTiling{std::int64_t(dest[q].size()), N, 64, 64}, 9).waves());
  G = std::min(G, 3);
  for (int q = 0; q < R; ++q)
    parts[q] = GroupPlan::equal(WaveModel(GemmTiling{std::int64_t(dest[q].size()), N, 64, 64}, 9), G).waves_per_group();
  const A2aPlan plan(N, 64, 64, 9, 1, Raster::AlongN, dest, parts);
  const int me = pg->rank();
  const GroupPlan& mine = plan.plan(me);
  GroupCounters counters(plan.groups());
  CommDriver drv(pg->nccl(), pg->comm_stream(0), GetParam());
  DeviceBuffers mem;
  float* send = mem.alloc<float>(plan.send_elems(me));
  float* recv = mem.alloc<float>(plan.recv_elems(me));
  float* out = mem.alloc<float>(plan.out_rows(me) * N);
  const std::vector<std::int64_t> chunk_src = plan.chunk_src(me);
  std::int64_t* table = mem.alloc<std::int64_t>(static_cast<std::int64_t>(chunk_src.size()));
  CUDA_OK(cudaMemcpyAsync(table, chunk_src.data(), chunk_src.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice,
                          pg->comm_stream(0)));
  drain_or_die(pg->comm_stream(0), "routing table upload");
  A2aRecvMap rmap = plan.recv_map(me);
  rmap.chunk_src = table;
  Spans spans;
  for (int k = 0; k < plan.groups(); ++k) {
    std::vector<std::pair<std::int64_t, std::int64_t>> s;
    for (int d = 0; d < R; ++d) s.push_back({plan.send_offset(me, k, d), plan.send_count(me, k, d)});
    spans.add_group(s);
  }
  const A2aSendMap smap = plan.send_map(me);
  for (int epoch = 1; epoch <= 3; ++epoch) {
    const std::string verdict = run_epoch([&]() -> std::int64_t {
      std::vector<float> staging(plan.send_elems(me), 0.f);
      for (std::int64_t i = 0; i < std::int64_t(dest[me].size()); ++i)
        for (std::int64_t j = 0; j < N; ++j) staging[smap.offset(i, j)] = value(me, epoch, i, j);
      Producer prod(staging, spans, mine, g, pg->stream());
      drv.all_to_all(plan, send, recv, DType::f32, counters, epoch);
      prod.launch(send, counters);
      drv.synchronize(mine, counters, epoch);
      if (plan.out_rows(me) > 0) unreorder(rmap, recv, out, N, DType::f32, pg->comm_stream(0));
      const auto got = download(out, plan.out_rows(me) * N, pg->comm_stream(0));
      std::int64_t bad = 0;
      for (std::int64_t o = 0; o < plan.out_rows(me); ++o) {
        const RowSource src = plan.out_row_source(me, o);
        for (std::int64_t j = 0; j < N; ++j) bad += !(got[o * N + j] == value(src.rank, epoch, src.row, j));
      }
      return bad;
    });
    ASSERT_EQ(verdict, "") << "epoch " << epoch << " " << wait_mode_name(GetParam());
  }
}

// The driver on the split communicator (signal::OverlapComm: maxCTAs 8, no
// clusters): per-wave AllReduce and ReduceScatter groups over 2 epochs,
// exact results.
TEST_P(CommDriverGpu, GroupsOnOverlapComm) {
  if (skip_unless_two_ranks()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto* pg = group();
  ncclComm_t comm = overlap_comm()->get();
  std::mt19937_64 g(std::random_device{}());
  const int M = 1000, N = 776;
  const WaveModel wm(GemmTiling{M, N, 128, 64}, 9, 2);
  const GroupPlan plan = GroupPlan::per_wave(wm);
  const ArMap am = make_ar_map(wm);
  const RsMap rm = make_rs_map(wm, pg->world());
  GroupCounters ar_counters(plan.groups()), rs_counters(plan.groups());
  CommDriver drv(comm, pg->comm_stream(0), GetParam());
  DeviceBuffers mem;
  float* buf = mem.alloc<float>(am.buffer_elems());
  float* send = mem.alloc<float>(rm.send_elems());
  float* recv = mem.alloc<float>(rm.recv_elems());
  float* out = mem.alloc<float>(std::int64_t(M) * N);
  Spans ar_spans, rs_spans;
  for (int k = 0; k < plan.groups(); ++k) {
    ar_spans.add_group({{plan.tile_begin(k) * am.tile_elems(), plan.tiles_in(k) * am.tile_elems()}});
    rs_spans.add_group({{plan.tile_begin(k) * rm.tile_elems(), plan.tiles_in(k) * rm.tile_elems()}});
  }
  const RsShard shard{rm, pg->rank()};
  for (int epoch = 1; epoch <= 2; ++epoch) {
    std::string verdict = run_epoch([&]() -> std::int64_t {
      std::vector<float> staging(am.buffer_elems(), 0.f);
      for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) staging[am.offset(i, j)] = value(pg->rank(), epoch, i, j);
      Producer prod(staging, ar_spans, plan, g, pg->stream());
      drv.all_reduce(plan, am, buf, DType::f32, ar_counters, epoch);
      prod.launch(buf, ar_counters);
      drv.synchronize(plan, ar_counters, epoch);
      unreorder(am, buf, out, N, DType::f32, pg->comm_stream(0));
      const auto got = download(out, std::int64_t(M) * N, pg->comm_stream(0));
      std::int64_t bad = 0;
      for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) {
          float ref = 0;
          for (int r = 0; r < pg->world(); ++r) ref += value(r, epoch, i, j);
          bad += !(got[i * N + j] == ref);  // NaN counts as wrong
        }
      return bad;
    });
    ASSERT_EQ(verdict, "") << "AllReduce epoch " << epoch << " " << wait_mode_name(GetParam());
    verdict = run_epoch([&]() -> std::int64_t {
      std::vector<float> staging(rm.send_elems(), 0.f);
      for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j)
          staging[rm.send_offset(i, j, plan.host_view())] = value(pg->rank(), epoch, i, j);
      Producer prod(staging, rs_spans, plan, g, pg->stream());
      drv.reduce_scatter(plan, rm, send, recv, DType::f32, rs_counters, epoch);
      prod.launch(send, rs_counters);
      drv.synchronize(plan, rs_counters, epoch);
      unreorder(shard, recv, out, N, DType::f32, pg->comm_stream(0));
      const auto got = download(out, shard.rows() * N, pg->comm_stream(0));
      std::int64_t bad = 0;
      for (std::int64_t l = 0; l < shard.rows(); ++l)
        for (std::int64_t j = 0; j < N; ++j) {
          float ref = 0;
          for (int r = 0; r < pg->world(); ++r) ref += value(r, epoch, rm.global_row(pg->rank(), l), j);
          bad += !(got[l * N + j] == ref);
        }
      return bad;
    });
    ASSERT_EQ(verdict, "") << "ReduceScatter epoch " << epoch << " " << wait_mode_name(GetParam());
  }
}

INSTANTIATE_TEST_SUITE_P(Waits, CommDriverGpu, ::testing::Values(WaitMode::StreamMemOp, WaitMode::SpinKernel),
                         [](const auto& info) { return std::string(wait_mode_name(info.param)); });

// Counters that never arrive (no producer at all): synchronize() must name
// the short groups within the timeout, release the waits itself so that the
// stream (and the NCCL AllReduces behind the waits, which every rank
// enqueued) drain, and throw. Nothing is launched by the test while the
// stream waits: the release is the driver's own stream memory operation.
class CommDriverGpuTimeout : public Guarded {};

TEST_F(CommDriverGpuTimeout, StreamWaitTimeoutNamesTheGroupAndReleasesIt) {
  if (skip_unless_two_ranks()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto* pg = group();
  const WaveModel wm(GemmTiling{256, 256, 128, 128}, 2);
  const GroupPlan plan(wm, {1, 1});
  const ArMap map = make_ar_map(wm);
  GroupCounters counters(plan.groups());
  constexpr std::uint64_t timeout_ns = 300'000'000ull;
  CommDriver drv(pg->nccl(), pg->comm_stream(0), WaitMode::StreamMemOp, timeout_ns);
  DeviceBuffers mem;
  float* buf = mem.alloc<float>(map.buffer_elems());
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  drv.all_reduce(plan, map, buf, DType::f32, counters, 1);
  try {
    drv.synchronize(plan, counters, 1);
  } catch (const std::exception& e) {
    error = e.what();
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // The stream must be idle now, without any help from the test.
  const cudaError_t idle = cudaStreamQuery(pg->comm_stream(0));
  drain_or_die(pg->comm_stream(0), "communication stream after the released timeout");
  std::string local;
  if (error.empty()) local += "synchronize returned although no counter was bumped; ";
  for (const char* want : {"group 0: expected >= 2, seen 0", "group 1: expected >= 2, seen 0", "the stream drained"})
    if (error.find(want) == std::string::npos) local += std::string("message lacks '") + want + "'; ";
  if (idle != cudaSuccess)
    local += std::string("stream not idle after synchronize threw: ") + cudaGetErrorName(idle) + "; ";
  // Two timeouts at most (the wait, then the drain), plus slack.
  if (ms > 3 * timeout_ns / 1e6 + 2000) local += "took " + std::to_string(ms) + " ms; ";
  if (!local.empty()) ADD_FAILURE() << local << "message: " << error;
  const std::string verdict = agree(0, local.empty() ? "" : local + "message: " + error);
  ASSERT_EQ(verdict, "");
  // Released: the counters hold the targets, and a second synchronize returns.
  const auto seen = counters.read();
  EXPECT_EQ(seen, (std::vector<std::uint32_t>{2, 2}));
  EXPECT_NO_THROW(drv.synchronize(plan, counters, 1));
}
