// Multi-rank stress of every link primitive, with random tile orders and
// random delays, over many epochs without any reset. Payloads depend on the
// epoch, so an early signal shows up as stale data and a lost one as a wait
// timeout (which traps with a diagnostic and fails the test).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "support/gpu_group.hpp"
#include "tessera/link/device_primitives.cuh"
#include "tessera/link/host_primitives.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/signals.hpp"
#include "tessera/runtime/symmetric_heap.hpp"

using namespace tessera;
using link::AllGatherTileMap;
using runtime::PeerPtrs;
using runtime::SignalView;

namespace {

constexpr int kThreads = 256;
constexpr int kBlocks = 4;

__host__ __device__ inline std::uint32_t payload(std::uint64_t epoch, std::int64_t row, std::int64_t col) {
  std::uint32_t h = static_cast<std::uint32_t>(epoch) * 0x9E3779B1u ^ static_cast<std::uint32_t>(row) * 0x85EBCA77u ^
                    static_cast<std::uint32_t>(col) * 0xC2B2AE3Du;
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  return h ^ (h >> 12);
}

__device__ inline void random_delay(std::uint64_t epoch, int tile) {
  const std::uint32_t d = payload(epoch, tile, 7) % 3000u;
  if (d > 1500) __nanosleep(d);
}

struct ErrorLog {
  unsigned long long count;
  long long row, col;
  unsigned got, want;
};

__device__ void record_error(ErrorLog* log, std::int64_t row, std::int64_t col, unsigned got, unsigned want) {
  if (atomicAdd(&log->count, 1ull) == 0) {
    log->row = row;
    log->col = col;
    log->got = got;
    log->want = want;
  }
}

// The by-address primitives on one GPU: every CTA of the producer writes
// its slice and counts itself on `counter`; the last CTA to arrive
// (last_cta_arrive) sets `flag` to the epoch. The consumer (one CTA,
// launched first on another stream) waits for both, then checks every word.
constexpr int kWords = 1 << 16;
constexpr int kProducerCtas = 8;

__global__ void by_address_produce(std::uint32_t* data, unsigned int* done, std::uint64_t* flag, std::uint64_t* counter,
                                   std::uint64_t epoch) {
  random_delay(epoch, static_cast<int>(blockIdx.x));
  const int per = kWords / kProducerCtas;
  for (int i = threadIdx.x; i < per; i += blockDim.x) {
    const int w = static_cast<int>(blockIdx.x) * per + i;
    data[w] = payload(epoch, w, 0);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    link::counter_notify<link::Scope::gpu>(counter, std::uint64_t{1});
    if (link::last_cta_arrive<link::Scope::gpu>(done, gridDim.x)) link::flag_notify<link::Scope::gpu>(flag, epoch);
  }
}

__global__ void by_address_consume(const std::uint32_t* data, const std::uint64_t* flag, const std::uint64_t* counter,
                                   std::uint64_t epoch, link::WaitLimit limit, ErrorLog* log) {
  if (threadIdx.x == 0) {
    const link::WaitSite site{runtime::WaitKind::peer_tile, 0, 0, -1, -1, 0, 0};
    link::flag_wait<link::Scope::gpu>(flag, epoch, limit, site);
    link::flag_wait<link::Scope::gpu>(counter, epoch * kProducerCtas, limit, site);
  }
  __syncthreads();
  for (int w = threadIdx.x; w < kWords; w += blockDim.x) {
    const std::uint32_t want = payload(epoch, w, 0);
    if (data[w] != want) record_error(log, w, 0, data[w], want);
  }
}

// Every consumer tile of `gathered` (local) after its channels complete.
// The last block to finish acknowledges the epoch to every rank.
__global__ void consume_kernel(SignalView sv, AllGatherTileMap map, const std::uint32_t* gathered, int cols,
                               std::uint64_t epoch, const int* order, unsigned* done, int ack_slot, ErrorLog* log) {
  for (int i = blockIdx.x; i < map.num_consumer_tiles(); i += gridDim.x) {
    const int u = order[i];
    if (threadIdx.x == 0) link::consumer_tile_wait(sv, map, u, epoch);
    __syncthreads();
    const auto rr = map.consumer_rows(u);
    for (std::int64_t k = threadIdx.x; k < rr.size() * cols; k += blockDim.x) {
      const std::int64_t row = rr.lo + k / cols, col = k % cols;
      const unsigned got = gathered[row * cols + col], want = payload(epoch, row, col);
      if (got != want) record_error(log, row, col, got, want);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    // Release this block's reads before counting it done (acq_rel fence +
    // atomic), so the last block's release to peers covers every block.
    __threadfence();
    if (atomicAdd(done, 1u) == gridDim.x - 1) {
      __threadfence();
      for (int r = 0; r < sv.world; ++r) link::peer_tile_notify(sv, ack_slot, r, epoch);
    }
  }
}

// Push mode: write my tiles into a local staging shard, push each to every
// rank's gathered buffer, notify (broadcast once, or per destination).
__global__ void push_kernel(SignalView sv, AllGatherTileMap map, std::uint32_t* staging,
                            PeerPtrs<std::uint32_t> gathered, int cols, std::uint64_t epoch, const int* order,
                            int ack_slot, bool broadcast) {
  if (threadIdx.x == 0) {
    for (int r = 0; r < sv.world; ++r) link::peer_tile_wait(sv, ack_slot, r, epoch - 1);  // readers done with e-1
  }
  __syncthreads();
  const int per_rank = map.C * map.tiles_per_channel;
  const int first = sv.rank * per_rank;
  const std::int64_t shard_lo = sv.rank * map.m_per_rank;
  for (int i = blockIdx.x; i < per_rank; i += gridDim.x) {
    const int t = first + order[i];
    const auto rr = map.shape(t);
    if (rr.empty()) continue;
    random_delay(epoch, t);
    for (std::int64_t k = threadIdx.x; k < rr.size() * cols; k += blockDim.x) {
      const std::int64_t row = rr.lo + k / cols, col = k % cols;
      staging[(row - shard_lo) * cols + col] = payload(epoch, row, col);
    }
    __syncthreads();
    for (int j = 0; j < sv.world; ++j) {
      const int dst = (sv.rank + 1 + j + t) % sv.world;  // a different destination order per tile
      link::tile_push_data(gathered.peer(dst), cols, rr.lo, staging, cols, rr.lo - shard_lo, rr.size(), cols,
                           threadIdx.x, blockDim.x);
      if (!broadcast) {
        __syncthreads();
        if (threadIdx.x == 0) link::producer_tile_notify_to(sv, map, t, dst);
      }
    }
    __syncthreads();
    if (broadcast && threadIdx.x == 0) link::producer_tile_notify(sv, map, t, link::NotifyMode::broadcast);
  }
}

// Pull mode, owner side: write my shard tile by tile, flag each tile to
// every rank (peer_tile_notify; flag slot = tile index within my shard).
__global__ void write_shard_kernel(SignalView sv, AllGatherTileMap map, std::uint32_t* shard, int cols,
                                   std::uint64_t epoch, const int* order, int ack_slot) {
  if (threadIdx.x == 0) {
    for (int r = 0; r < sv.world; ++r) link::peer_tile_wait(sv, ack_slot, r, epoch - 1);
  }
  __syncthreads();
  const int per_rank = map.C * map.tiles_per_channel;
  const std::int64_t shard_lo = sv.rank * map.m_per_rank;
  for (int i = blockIdx.x; i < per_rank; i += gridDim.x) {
    const int j = order[i];
    const auto rr = map.shape(sv.rank * per_rank + j);
    random_delay(epoch, j);
    for (std::int64_t k = threadIdx.x; k < rr.size() * cols; k += blockDim.x) {
      const std::int64_t row = rr.lo + k / cols, col = k % cols;
      shard[(row - shard_lo) * cols + col] = payload(epoch, row, col);
    }
    __syncthreads();
    if (threadIdx.x == 0)
      for (int r = 0; r < sv.world; ++r) link::peer_tile_notify(sv, j, r, epoch);
  }
}

// Pull mode, reader side: wait for each owner's tile flag, pull the tile
// into my gathered buffer, notify my own consumer (.gpu scope).
__global__ void pull_kernel(SignalView sv, AllGatherTileMap map, PeerPtrs<std::uint32_t> shard, std::uint32_t* gathered,
                            int cols, std::uint64_t epoch, const int* order) {
  const int per_rank = map.C * map.tiles_per_channel;
  for (int i = blockIdx.x; i < map.num_tiles(); i += gridDim.x) {
    const int t = order[i];
    const int owner = map.rank(t), j = t - owner * per_rank;
    const auto rr = map.shape(t);
    if (threadIdx.x == 0) link::peer_tile_wait(sv, j, owner, epoch);
    __syncthreads();
    if (rr.empty()) continue;
    link::tile_pull_data(gathered, cols, rr.lo, shard.peer(owner), cols, map.shard_offset(t), rr.size(), cols,
                         threadIdx.x, blockDim.x);
    __syncthreads();
    if (threadIdx.x == 0) link::producer_tile_notify_to(sv, map, t, sv.rank);
  }
}

// Copy-engine path: check the whole gathered buffer for this epoch.
__global__ void check_all_kernel(const std::uint32_t* gathered, std::int64_t rows, int cols, std::uint64_t epoch,
                                 ErrorLog* log) {
  for (std::int64_t k = blockIdx.x * blockDim.x + threadIdx.x; k < rows * cols; k += gridDim.x * blockDim.x) {
    const std::int64_t row = k / cols, col = k % cols;
    const unsigned got = gathered[k], want = payload(epoch, row, col);
    if (got != want) record_error(log, row, col, got, want);
  }
}

__global__ void fill_shard_kernel(std::uint32_t* shard, std::int64_t row0, std::int64_t rows, int cols,
                                  std::uint64_t epoch) {
  for (std::int64_t k = blockIdx.x * blockDim.x + threadIdx.x; k < rows * cols; k += gridDim.x * blockDim.x)
    shard[k] = payload(epoch, row0 + k / cols, k % cols);
}

std::vector<int> permutation(int n, std::mt19937& rng) {
  std::vector<int> p(n);
  std::iota(p.begin(), p.end(), 0);
  std::shuffle(p.begin(), p.end(), rng);
  return p;
}

struct DeviceInts {
  int* ptr = nullptr;
  explicit DeviceInts(const std::vector<int>& v) {
    TESSERA_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(1, v.size()) * sizeof(int)));
    TESSERA_CUDA_CHECK(cudaMemcpy(ptr, v.data(), v.size() * sizeof(int), cudaMemcpyHostToDevice));
  }
  ~DeviceInts() { cudaFree(ptr); }
};

template <class T>
struct DeviceZero {
  T* ptr = nullptr;
  explicit DeviceZero(size_t n = 1) {
    TESSERA_CUDA_CHECK(cudaMalloc(&ptr, n * sizeof(T)));
    TESSERA_CUDA_CHECK(cudaMemset(ptr, 0, n * sizeof(T)));
  }
  ~DeviceZero() { cudaFree(ptr); }
  T host() const {
    T h;
    TESSERA_CUDA_CHECK(cudaMemcpy(&h, ptr, sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// Ragged on purpose: M not a multiple of R * C * tile, tile sizes differ
// between communication (32 rows) and computation (96 rows).
constexpr std::int64_t kRows = 8037;
constexpr int kCols = 64;
constexpr int kChannels = 3;
constexpr int kEpochs = 24;

struct Fixture {
  runtime::ProcessGroup& pg = tessera::testing::group();
  AllGatherTileMap map = AllGatherTileMap::make(kRows, pg.world(), kChannels, 32, 96);
  int per_rank = map.C * map.tiles_per_channel;
  int ack_slot = std::max(map.num_channels(), per_rank);
  runtime::Signals sig{pg, ack_slot + 1};
  runtime::SymBuffer<std::uint32_t> gathered{pg, static_cast<size_t>(kRows) * kCols};
  runtime::SymBuffer<std::uint32_t> shard{pg, static_cast<size_t>(map.m_per_rank) * kCols};
  std::mt19937 rng{static_cast<unsigned>(1000 + pg.rank())};
  cudaStream_t prod = pg.comm_stream(0), cons = pg.stream();

  Fixture() {
    // Poison: 0xFFFFFFFF never equals a payload of epoch >= 1 by chance here.
    TESSERA_CUDA_CHECK(cudaMemset(gathered.local(), 0xFF, gathered.bytes()));
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    pg.barrier();
  }
  void expect_clean(const ErrorLog& log, const char* what) {
    EXPECT_EQ(log.count, 0ull) << what << ": first bad element row " << log.row << " col " << log.col << " got "
                               << log.got << " want " << log.want;
  }
};

}  // namespace

TEST(LinkPrimitives, PushNotifyConsumeStress) {
  TESSERA_REQUIRE_WORLD_GPUS(2);
  Fixture f;
  DeviceZero<ErrorLog> log;
  DeviceZero<unsigned> done(kEpochs + 1);
  std::vector<std::unique_ptr<DeviceInts>> keep;
  long long notifies = 0;
  for (int e = 1; e <= kEpochs; ++e) {
    keep.push_back(std::make_unique<DeviceInts>(permutation(f.per_rank, f.rng)));
    const int* porder = keep.back()->ptr;
    keep.push_back(std::make_unique<DeviceInts>(permutation(f.map.num_consumer_tiles(), f.rng)));
    const int* corder = keep.back()->ptr;
    const bool broadcast = e % 2 == 0;
    push_kernel<<<kBlocks, kThreads, 0, f.prod>>>(f.sig.view(), f.map, f.shard.local(), f.gathered.peers(), kCols, e,
                                                  porder, f.ack_slot, broadcast);
    TESSERA_CUDA_CHECK(cudaGetLastError());
    consume_kernel<<<kBlocks, kThreads, 0, f.cons>>>(f.sig.view(), f.map, f.gathered.local(), kCols, e, corder,
                                                     done.ptr + e, f.ack_slot, log.ptr);
    TESSERA_CUDA_CHECK(cudaGetLastError());
    notifies += static_cast<long long>(f.per_rank) * f.pg.world();
  }
  link::synchronize(f.prod, f.sig, "push stress (producer)");
  link::synchronize(f.cons, f.sig, "push stress (consumer)");
  f.expect_clean(log.host(), "push + producer_tile_notify + consumer_tile_wait");
  // Every channel counted exactly epochs * tiles_in_channel notifications.
  for (int c = 0; c < f.map.num_channels(); ++c)
    EXPECT_EQ(f.sig.read_counter(c, f.cons), static_cast<std::uint64_t>(kEpochs) * f.map.tiles_in_channel(c)) << c;
  const auto total = f.pg.allgather(notifies);
  EXPECT_GE(std::accumulate(total.begin(), total.end(), 0LL), 10000);
  f.pg.barrier();
}

TEST(LinkPrimitives, PullWithPeerFlagsStress) {
  TESSERA_REQUIRE_WORLD_GPUS(2);
  Fixture f;
  DeviceZero<ErrorLog> log;
  DeviceZero<unsigned> done(kEpochs + 1);
  cudaStream_t writer = f.pg.comm_stream(1);
  std::vector<std::unique_ptr<DeviceInts>> keep;
  for (int e = 1; e <= kEpochs; ++e) {
    for (int k = 0; k < 3; ++k)
      keep.push_back(std::make_unique<DeviceInts>(permutation(k == 0   ? f.per_rank
                                                              : k == 1 ? f.map.num_tiles()
                                                                       : f.map.num_consumer_tiles(),
                                                              f.rng)));
    const int* worder = keep[keep.size() - 3]->ptr;
    const int* porder = keep[keep.size() - 2]->ptr;
    const int* corder = keep[keep.size() - 1]->ptr;
    write_shard_kernel<<<kBlocks, kThreads, 0, writer>>>(f.sig.view(), f.map, f.shard.local(), kCols, e, worder,
                                                         f.ack_slot);
    pull_kernel<<<kBlocks, kThreads, 0, f.prod>>>(f.sig.view(), f.map, f.shard.peers(), f.gathered.local(), kCols, e,
                                                  porder);
    consume_kernel<<<kBlocks, kThreads, 0, f.cons>>>(f.sig.view(), f.map, f.gathered.local(), kCols, e, corder,
                                                     done.ptr + e, f.ack_slot, log.ptr);
    TESSERA_CUDA_CHECK(cudaGetLastError());
  }
  link::synchronize(writer, f.sig, "pull stress (writer)");
  link::synchronize(f.prod, f.sig, "pull stress (puller)");
  link::synchronize(f.cons, f.sig, "pull stress (consumer)");
  f.expect_clean(log.host(), "peer_tile_notify + tile_pull_data + consumer_tile_wait");
  for (int r = 0; r < f.pg.world(); ++r)
    for (int j = 0; j < f.per_rank; ++j) ASSERT_EQ(f.sig.read_flag_from(r, j, f.cons), std::uint64_t(kEpochs));
  f.pg.barrier();
}

TEST(LinkPrimitives, CopyEngineWithStreamSignals) {
  TESSERA_REQUIRE_WORLD_GPUS(2);
  Fixture f;
  DeviceZero<ErrorLog> log;
  const int R = f.pg.world(), me = f.pg.rank();
  const int data_slot = 0, ack_slot = 1;
  const std::int64_t row0 = me * f.map.m_per_rank;
  const std::int64_t rows = std::min<std::int64_t>(f.map.m_per_rank, kRows - row0);
  for (int e = 1; e <= 50; ++e) {
    // Producer stream: wait until every reader is done with e-1, refill the
    // shard, copy it to every rank on the copy engine, then flag each.
    for (int q = 0; q < R; ++q) link::rank_wait(f.prod, f.sig, q, ack_slot, e - 1);
    fill_shard_kernel<<<64, 256, 0, f.prod>>>(f.shard.local(), row0, rows, kCols, e);
    for (int j = 0; j < R; ++j) {
      const int dst = (me + j) % R;
      link::rank_copy_data(f.prod, f.gathered.peer(dst) + row0 * kCols, f.shard.local(), rows * kCols * 4);
      link::rank_notify(f.prod, f.sig, dst, data_slot, e);
    }
    // Consumer stream: wait for every rank's data, check, acknowledge.
    for (int q = 0; q < R; ++q) link::rank_wait(f.cons, f.sig, q, data_slot, e);
    check_all_kernel<<<64, 256, 0, f.cons>>>(f.gathered.local(), kRows, kCols, e, log.ptr);
    for (int q = 0; q < R; ++q) link::rank_notify(f.cons, f.sig, q, ack_slot, e);
  }
  link::synchronize(f.prod, f.sig, "copy engine (producer)");
  link::synchronize(f.cons, f.sig, "copy engine (consumer)");
  f.expect_clean(log.host(), "rank_copy_data + rank_notify + rank_wait");
  f.pg.barrier();
}

TEST(LinkPrimitives, ByAddressNotifyAndWaitOnOneGpu) {
  TESSERA_REQUIRE_WORLD_GPUS(1);
  auto& pg = tessera::testing::group();
  // Both kernels are loaded before the consumer spins: a lazily loaded
  // producer would wait for the running consumer.
  cudaFuncAttributes attr{};
  TESSERA_CUDA_CHECK(cudaFuncGetAttributes(&attr, by_address_produce));
  TESSERA_CUDA_CHECK(cudaFuncGetAttributes(&attr, by_address_consume));
  std::uint32_t* data = nullptr;
  unsigned int* done = nullptr;
  std::uint64_t* words = nullptr;  // [0] flag, [1] counter
  ErrorLog* log = nullptr;
  TESSERA_CUDA_CHECK(cudaMalloc(&data, kWords * sizeof(std::uint32_t)));
  TESSERA_CUDA_CHECK(cudaMalloc(&done, sizeof(unsigned int)));
  TESSERA_CUDA_CHECK(cudaMalloc(&words, 2 * sizeof(std::uint64_t)));
  TESSERA_CUDA_CHECK(cudaMallocManaged(&log, sizeof(ErrorLog)));
  TESSERA_CUDA_CHECK(cudaMemset(data, 0xFF, kWords * sizeof(std::uint32_t)));  // poison
  TESSERA_CUDA_CHECK(cudaMemset(done, 0, sizeof(unsigned int)));
  TESSERA_CUDA_CHECK(cudaMemset(words, 0, 2 * sizeof(std::uint64_t)));
  *log = ErrorLog{};
  cudaStream_t prod = nullptr, cons = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&prod, cudaStreamNonBlocking));
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&cons, cudaStreamNonBlocking));
  auto& diag = runtime::process_wait_diagnostics();
  const link::WaitLimit limit{runtime::wait_timeout_ns(), diag.device_record()};
  for (std::uint64_t epoch = 1; epoch <= 20; ++epoch) {
    by_address_consume<<<1, kThreads, 0, cons>>>(data, words, words + 1, epoch, limit, log);
    TESSERA_CUDA_CHECK(cudaGetLastError());
    by_address_produce<<<kProducerCtas, kThreads, 0, prod>>>(data, done, words, words + 1, epoch);
    TESSERA_CUDA_CHECK(cudaGetLastError());
    runtime::synchronize(cons, &diag, "by-address consumer");
    runtime::synchronize(prod, &diag, "by-address producer");
  }
  EXPECT_EQ(log->count, 0ull) << "word " << log->row << ": got " << log->got << " want " << log->want;
  cudaStreamDestroy(prod);
  cudaStreamDestroy(cons);
  cudaFree(data);
  cudaFree(done);
  cudaFree(words);
  cudaFree(log);
}

TEST(LinkPrimitives, HostWaitTimesOutWithDiagnostic) {
  TESSERA_REQUIRE_WORLD_GPUS(1);
  auto& pg = tessera::testing::group();
  runtime::Signals sig(pg, 4);
  // Nobody ever notifies slot 3 from rank 0 with value 7: the stream wait
  // must be reported (and released), not hang.
  link::rank_wait(pg.stream(), sig, 0, 3, 7);
  try {
    link::synchronize(pg.stream(), sig, "missing notify");
    FAIL() << "no timeout";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("slot 3 from rank 0 expected >= 7 but saw 0"), std::string::npos) << m;
  }
  // The stream drained: later work runs normally.
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(pg.stream()));
  pg.barrier();
}

TEST(LinkPrimitives, BadInputIsRejectedBeforeLaunch) {
  TESSERA_REQUIRE_WORLD_GPUS(2);
  auto& pg = tessera::testing::group();
  // Ranks asking for different symmetric sizes: an error on every rank, no hang.
  try {
    runtime::SymBuffer<float> b(pg, 1024 * (1 + pg.rank()));
    FAIL() << "mismatched symmetric allocation accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("symmetric allocation size"), std::string::npos) << e.what();
  }
  // Larger than the GPU.
  try {
    runtime::SymBuffer<char> b(pg, std::size_t(1) << 50);
    FAIL() << "oversized symmetric allocation accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit"), std::string::npos) << e.what();
  }
  runtime::Signals sig(pg, 2);
  EXPECT_THROW(link::rank_notify(pg.stream(), sig, pg.world(), 0, 1), Error);
  EXPECT_THROW(link::rank_wait(pg.stream(), sig, 0, 2, 1), Error);
  // Shapes that disagree across ranks.
  const long shape[2] = {4096, 1024 + pg.rank()};
  EXPECT_THROW(pg.check_same_on_all_ranks("shape of A", shape), Error);
  pg.barrier();
}
