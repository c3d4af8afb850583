// Multi-rank GPU test of the signal communication driver: a fake producer
// kernel publishes wave groups in random order with random delays (bumping
// the per-group counters tile by tile, release), the driver waits per group
// (stream memory operation or spinning kernel) and runs NCCL AllReduce /
// ReduceScatter / grouped send-recv on each group's span; the un-reordered
// result must equal the non-overlapped reference exactly (f32, small
// integers). Three back-to-back calls per case: counters are never reset.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "support/test_support.hpp"
#include "tessera/runtime/process_group.hpp"
#include "tessera/signal/comm_driver.hpp"
#include "tessera/signal/device.cuh"
#include "tessera/signal/unreorder.hpp"

using namespace tessera;
using namespace tessera::signal;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

namespace {

runtime::ProcessGroup* group() {
  static std::unique_ptr<runtime::ProcessGroup> pg = runtime::ProcessGroup::from_environment();
  return pg.get();
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
      while (clock64() < until) {}
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

template <class T>
T* dev_copy(const std::vector<T>& v) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<std::size_t>(v.size(), 1) * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}

struct Spans {
  std::vector<long long> begin{0}, off, len;
  void add_group(const std::vector<std::pair<std::int64_t, std::int64_t>>& s) {
    for (auto [o, l] : s) { off.push_back(o); len.push_back(l); }
    begin.push_back(static_cast<long long>(off.size()));
  }
};

// The producer of one call. Everything is allocated and copied in the
// constructor, BEFORE the driver enqueues its waits: an allocation that
// synchronized the device while the communication stream waits on counters
// only this producer can bump would deadlock.
struct Producer {
  float* staging = nullptr;
  int *order = nullptr, *delay = nullptr, *tiles = nullptr;
  long long *b = nullptr, *o = nullptr, *l = nullptr;
  int groups = 0;

  Producer(const std::vector<float>& staging_host, const Spans& spans, const GroupPlan& plan, std::mt19937_64& g)
      : groups(plan.groups()) {
    std::vector<int> ord(groups), del(groups), til(groups);
    std::iota(ord.begin(), ord.end(), 0);
    std::shuffle(ord.begin(), ord.end(), g);
    for (auto& d : del) d = std::uniform_int_distribution<int>(0, 200)(g);
    for (int k = 0; k < groups; ++k) til[k] = plan.tiles_in(k);
    staging = dev_copy(staging_host);
    order = dev_copy(ord);
    delay = dev_copy(del);
    tiles = dev_copy(til);
    b = dev_copy(spans.begin);
    o = dev_copy(spans.off);
    l = dev_copy(spans.len);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  void launch(cudaStream_t s, float* dst, GroupCounters& counters) {
    fake_producer<<<1, 256, 0, s>>>(staging, dst, order, delay, b, o, l, tiles, groups, counters.device());
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  }
  ~Producer() {
    for (void* p : {(void*)staging, (void*)order, (void*)delay, (void*)tiles, (void*)b, (void*)o, (void*)l}) cudaFree(p);
  }
};

__global__ void set_u32(std::uint32_t* p, int n, std::uint32_t v) {
  if (int(threadIdx.x) < n) p[threadIdx.x] = v;
}

bool skip_unless_two_ranks() {
  return tessera::testing::launched_world_size() < 2 || tessera::testing::visible_gpus() < 1;
}

std::vector<float> download(const float* d, std::int64_t n) {
  std::vector<float> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

}  // namespace

class CommDriverGpu : public ::testing::TestWithParam<WaitMode> {};

TEST_P(CommDriverGpu, AllReduceGroupsInRandomOrder) {
  if (skip_unless_two_ranks()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto* pg = group();
  std::mt19937_64 g(std::random_device{}());
  const WaveModel wm(GemmTiling{1000, 776, 128, 64}, 9, 2);
  const ArMap map = make_ar_map(wm);
  for (const GroupPlan& plan : {GroupPlan::single(wm), GroupPlan::per_wave(wm), GroupPlan(wm, {1, 3, wm.waves() - 4})}) {
    GroupCounters counters(plan.groups());
    CommDriver drv(pg->nccl(), pg->comm_stream(0), GetParam());
    float* buf = nullptr;
    float* out = nullptr;
    CUDA_OK(cudaMalloc(&buf, map.buffer_elems() * sizeof(float)));
    CUDA_OK(cudaMalloc(&out, 1000 * 776 * sizeof(float)));
    Spans spans;
    for (int k = 0; k < plan.groups(); ++k)
      spans.add_group({{plan.tile_begin(k) * map.tile_elems(), plan.tiles_in(k) * map.tile_elems()}});
    for (int epoch = 1; epoch <= 3; ++epoch) {
      std::vector<float> staging(map.buffer_elems(), 0.f);
      for (std::int64_t i = 0; i < 1000; ++i)
        for (std::int64_t j = 0; j < 776; ++j) staging[map.offset(i, j)] = value(pg->rank(), epoch, i, j);
      Producer prod(staging, spans, plan, g);
      drv.all_reduce(plan, map, buf, DType::f32, counters, epoch);  // enqueued before the producer runs
      prod.launch(pg->stream(), buf, counters);
      drv.synchronize(plan, counters, epoch);
      unreorder(map, buf, out, 776, DType::f32, pg->comm_stream(0));
      CUDA_OK(cudaStreamSynchronize(pg->comm_stream(0)));
      const auto got = download(out, 1000 * 776);
      std::int64_t bad = 0;
      for (std::int64_t i = 0; i < 1000; ++i)
        for (std::int64_t j = 0; j < 776; ++j) {
          float ref = 0;
          for (int r = 0; r < pg->world(); ++r) ref += value(r, epoch, i, j);
          bad += got[i * 776 + j] != ref;
        }
      ASSERT_EQ(bad, 0) << "epoch " << epoch << " plan " << plan.str() << " " << wait_mode_name(GetParam());
    }
    cudaFree(buf);
    cudaFree(out);
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
    float *send = nullptr, *recv = nullptr, *out = nullptr;
    CUDA_OK(cudaMalloc(&send, map.send_elems() * sizeof(float)));
    CUDA_OK(cudaMalloc(&recv, map.recv_elems() * sizeof(float)));
    CUDA_OK(cudaMalloc(&out, M * N * sizeof(float)));
    Spans spans;
    for (int k = 0; k < plan.groups(); ++k)
      spans.add_group({{plan.tile_begin(k) * map.tile_elems(), plan.tiles_in(k) * map.tile_elems()}});
    const RsShard shard{map, pg->rank()};
    for (int epoch = 1; epoch <= 3; ++epoch) {
      std::vector<float> staging(map.send_elems(), 0.f);
      for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j)
          staging[map.send_offset(i, j, plan.host_view())] = value(pg->rank(), epoch, i, j);
      Producer prod(staging, spans, plan, g);
      drv.reduce_scatter(plan, map, send, recv, DType::f32, counters, epoch);
      prod.launch(pg->stream(), send, counters);
      drv.synchronize(plan, counters, epoch);
      unreorder(shard, recv, out, N, DType::f32, pg->comm_stream(0));
      CUDA_OK(cudaStreamSynchronize(pg->comm_stream(0)));
      const auto got = download(out, shard.rows() * N);
      std::int64_t bad = 0;
      for (std::int64_t l = 0; l < shard.rows(); ++l)
        for (std::int64_t j = 0; j < N; ++j) {
          float ref = 0;
          for (int r = 0; r < pg->world(); ++r) ref += value(r, epoch, map.global_row(pg->rank(), l), j);
          bad += got[l * N + j] != ref;
        }
      ASSERT_EQ(bad, 0) << "epoch " << epoch << " plan " << plan.str() << " " << wait_mode_name(GetParam());
    }
    cudaFree(send);
    cudaFree(recv);
    cudaFree(out);
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
  for (int q = 0; q < R; ++q) G = std::min(G, WaveModel(GemmTiling{std::int64_t(dest[q].size()), N, 64, 64}, 9).waves());
  G = std::min(G, 3);
  for (int q = 0; q < R; ++q)
    parts[q] = GroupPlan::equal(WaveModel(GemmTiling{std::int64_t(dest[q].size()), N, 64, 64}, 9), G).waves_per_group();
  const A2aPlan plan(N, 64, 64, 9, 1, Raster::AlongN, dest, parts);
  const int me = pg->rank();
  const GroupPlan& mine = plan.plan(me);
  GroupCounters counters(plan.groups());
  CommDriver drv(pg->nccl(), pg->comm_stream(0), GetParam());
  float *send = nullptr, *recv = nullptr, *out = nullptr;
  CUDA_OK(cudaMalloc(&send, std::max<std::int64_t>(plan.send_elems(me), 1) * sizeof(float)));
  CUDA_OK(cudaMalloc(&recv, std::max<std::int64_t>(plan.recv_elems(me), 1) * sizeof(float)));
  CUDA_OK(cudaMalloc(&out, std::max<std::int64_t>(plan.out_rows(me), 1) * N * sizeof(float)));
  std::int64_t* table = dev_copy(plan.chunk_src(me));
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
    std::vector<float> staging(plan.send_elems(me), 0.f);
    for (std::int64_t i = 0; i < std::int64_t(dest[me].size()); ++i)
      for (std::int64_t j = 0; j < N; ++j) staging[smap.offset(i, j)] = value(me, epoch, i, j);
    Producer prod(staging, spans, mine, g);
    drv.all_to_all(plan, send, recv, DType::f32, counters, epoch);
    prod.launch(pg->stream(), send, counters);
    drv.synchronize(mine, counters, epoch);
    if (plan.out_rows(me) > 0) unreorder(rmap, recv, out, N, DType::f32, pg->comm_stream(0));
    CUDA_OK(cudaStreamSynchronize(pg->comm_stream(0)));
    const auto got = download(out, plan.out_rows(me) * N);
    std::int64_t bad = 0;
    for (std::int64_t o = 0; o < plan.out_rows(me); ++o) {
      const RowSource src = plan.out_row_source(me, o);
      for (std::int64_t j = 0; j < N; ++j) bad += got[o * N + j] != value(src.rank, epoch, src.row, j);
    }
    ASSERT_EQ(bad, 0) << "epoch " << epoch << " " << wait_mode_name(GetParam());
  }
  cudaFree(send);
  cudaFree(recv);
  cudaFree(out);
  cudaFree(table);
}

INSTANTIATE_TEST_SUITE_P(Waits, CommDriverGpu, ::testing::Values(WaitMode::StreamMemOp, WaitMode::SpinKernel),
                         [](const auto& info) { return std::string(wait_mode_name(info.param)); });

// A counter that never arrives: the host-side bound names the group; then
// the counter is released from the host so the stream (and NCCL) drain.
TEST(CommDriverGpuTimeout, StreamWaitTimeoutNamesTheGroup) {
  if (skip_unless_two_ranks()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto* pg = group();
  const WaveModel wm(GemmTiling{256, 256, 128, 128}, 2);
  const GroupPlan plan(wm, {1, 1});
  const ArMap map = make_ar_map(wm);
  GroupCounters counters(plan.groups());
  CommDriver drv(pg->nccl(), pg->comm_stream(0), WaitMode::StreamMemOp, 300'000'000ull);
  float* buf = nullptr;
  CUDA_OK(cudaMalloc(&buf, map.buffer_elems() * sizeof(float)));
  cudaStream_t side;  // created before the communication stream blocks
  CUDA_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  drv.all_reduce(plan, map, buf, DType::f32, counters, 1);
  try {
    drv.synchronize(plan, counters, 1);
    ADD_FAILURE() << "synchronize returned although no counter was bumped";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("group 0: expected >= 2, seen 0"), std::string::npos) << e.what();
  }
  set_u32<<<1, 32, 0, side>>>(counters.device(), 2, 2u);  // release both groups
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamSynchronize(side));
  drv.synchronize(plan, counters, 1);
  CUDA_OK(cudaStreamDestroy(side));
  cudaFree(buf);
}
