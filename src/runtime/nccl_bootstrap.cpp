// NcclBootstrap (runtime/nccl_bootstrap.hpp): Bootstrap's host-side
// exchanges over an NCCL communicator, each bounded by the timeout.
#include "tessera/runtime/nccl_bootstrap.hpp"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "tessera/runtime/error.hpp"

namespace tessera::runtime {

namespace {

enum : std::uint32_t { kBroadcast = 1, kAllgather = 2, kBarrier = 3, kCheckSame = 4 };

const char* kind_name(std::uint32_t k) {
  switch (k) {
    case kBroadcast:
      return "broadcast";
    case kAllgather:
      return "allgather";
    case kBarrier:
      return "barrier";
    case kCheckSame:
      return "check_same";
    default:
      return "unknown exchange";
  }
}

constexpr std::size_t kAlign = 256;
std::size_t round_up(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Makes `device` current for the scope (exchanges may be called from a thread
// whose current device is another one).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    TESSERA_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) TESSERA_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { (void)cudaSetDevice(prev_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

}  // namespace

NcclBootstrap::NcclBootstrap(ncclComm_t comm, int rank, int world, int device, std::chrono::milliseconds timeout)
    : Bootstrap(rank, world, "nccl", timeout), comm_(comm), device_(device) {
  TESSERA_CHECK(world >= 1 && rank >= 0 && rank < world, "NcclBootstrap: rank {} of world {}", rank, world);
  TESSERA_CHECK(comm != nullptr || world == 1, "NcclBootstrap: null communicator for world {}", world);
  TESSERA_CHECK(timeout.count() >= 1, "NcclBootstrap: timeout {} ms (must be >= 1)", timeout.count());
  DeviceGuard g(device_);
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
}

NcclBootstrap::~NcclBootstrap() {
  // A broken exchange may still sit in the stream (a peer never joined):
  // freeing its buffers would synchronize on it. Leak them instead.
  if (broken_) return;
  int prev = 0;
  (void)cudaGetDevice(&prev);
  (void)cudaSetDevice(device_);
  if (dev_) (void)cudaFree(dev_);
  if (host_) (void)cudaFreeHost(host_);
  if (done_) (void)cudaEventDestroy(done_);
  if (stream_) (void)cudaStreamDestroy(stream_);
  (void)cudaSetDevice(prev);
}

void NcclBootstrap::fail(const std::string& msg) {
  broken_ = true;
  TESSERA_FAIL("{}", msg);
}

void NcclBootstrap::reserve(std::size_t device_bytes, std::size_t host_bytes) {
  if (device_bytes > dev_bytes_) {
    if (dev_) TESSERA_CUDA_CHECK(cudaFree(dev_));
    dev_ = nullptr;
    dev_bytes_ = 0;
    TESSERA_CUDA_CHECK(cudaMalloc(&dev_, device_bytes));
    dev_bytes_ = device_bytes;
  }
  if (host_bytes > host_bytes_) {
    if (host_) TESSERA_CUDA_CHECK(cudaFreeHost(host_));
    host_ = nullptr;
    host_bytes_ = 0;
    TESSERA_CUDA_CHECK(cudaMallocHost(&host_, host_bytes));
    host_bytes_ = host_bytes;
  }
}

void NcclBootstrap::wait(const char* what, std::size_t bytes) {
  TESSERA_CUDA_CHECK(cudaEventRecord(done_, stream_));
  const auto deadline = std::chrono::steady_clock::now() + timeout();
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    const cudaError_t e = cudaEventQuery(done_);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) {
      (void)cudaGetLastError();
      fail(fmt::format("NcclBootstrap {} ({} bytes, rank {} of {}): CUDA error {}", what, bytes, rank(), world(),
                       cudaGetErrorString(e)));
    }
    ncclResult_t async = ncclSuccess;
    if (comm_ != nullptr && ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      fail(fmt::format("NcclBootstrap {} ({} bytes, rank {} of {}): NCCL reported {}", what, bytes, rank(), world(),
                       ncclGetErrorString(async)));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      fail(
          fmt::format("NcclBootstrap {} ({} bytes, rank {} of {}) did not complete within {} ms: a rank of the "
                      "group did not take part (exited, hung, or called another collective on this "
                      "communicator); abort the process group (TESSERA_BOOTSTRAP_TIMEOUT_MS sets the bound)",
                      what, bytes, rank(), world(), timeout().count()));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
}

void NcclBootstrap::order_before_exchange() {
  if (before_exchange_) before_exchange_(stream_);
}

void NcclBootstrap::raw_allgather(const void* in, void* out, std::size_t bytes, const char* what) {
  if (bytes == 0) return;
  if (world() == 1) {
    std::memmove(out, in, bytes);
    return;
  }
  const std::size_t send = round_up(bytes);
  const std::size_t total = bytes * static_cast<std::size_t>(world());
  reserve(send + round_up(total), std::max(send, total));
  std::memcpy(host_, in, bytes);
  order_before_exchange();
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(dev_, host_, bytes, cudaMemcpyHostToDevice, stream_));
  TESSERA_NCCL_CHECK(ncclAllGather(dev_, dev_ + send, bytes, ncclUint8, comm_, stream_));
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(host_, dev_ + send, total, cudaMemcpyDeviceToHost, stream_));
  wait(what, bytes);
  std::memcpy(out, host_, total);
}

void NcclBootstrap::agree(std::uint32_t kind, std::size_t bytes, int root) {
  TESSERA_CHECK(!broken_, "NcclBootstrap {}: an earlier exchange failed; the process group must be aborted",
                kind_name(kind));
  Header me{kind, seq_++, bytes, root, rank()};
  if (world() == 1) return;
  std::vector<Header> all(world());
  DeviceGuard g(device_);
  raw_allgather(&me, all.data(), sizeof(Header), kind_name(kind));
  std::string bad;
  for (int r = 0; r < world(); ++r) {
    const Header& h = all[r];
    if (h.kind != me.kind || h.seq != me.seq || h.bytes != me.bytes || h.root != me.root) {
      bad += fmt::format("{}rank {} called {} #{} ({} bytes, root {})", bad.empty() ? "" : "; ", r, kind_name(h.kind),
                         h.seq, h.bytes, h.root);
    }
  }
  if (!bad.empty()) {
    fail(fmt::format("NcclBootstrap: rank {} called {} #{} ({} bytes, root {}) but {}", rank(), kind_name(kind), me.seq,
                     bytes, root, bad));
  }
}

void NcclBootstrap::broadcast(void* data, std::size_t bytes, int root) {
  TESSERA_CHECK(root >= 0 && root < world(), "NcclBootstrap broadcast: root {} of world {}", root, world());
  agree(kBroadcast, bytes, root);
  if (world() == 1 || bytes == 0) return;
  DeviceGuard g(device_);
  reserve(round_up(bytes), bytes);
  order_before_exchange();
  if (rank() == root) std::memcpy(host_, data, bytes);
  if (rank() == root) TESSERA_CUDA_CHECK(cudaMemcpyAsync(dev_, host_, bytes, cudaMemcpyHostToDevice, stream_));
  TESSERA_NCCL_CHECK(ncclBroadcast(dev_, dev_, bytes, ncclUint8, root, comm_, stream_));
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(host_, dev_, bytes, cudaMemcpyDeviceToHost, stream_));
  wait("broadcast", bytes);
  std::memcpy(data, host_, bytes);
}

void NcclBootstrap::allgather(const void* in, void* out, std::size_t bytes_per_rank) {
  agree(kAllgather, bytes_per_rank, 0);
  DeviceGuard g(device_);
  raw_allgather(in, out, bytes_per_rank, "allgather");
}

void NcclBootstrap::barrier() {
  // Agreeing on the header is itself a barrier: it completes only once every
  // rank contributed.
  agree(kBarrier, 0, 0);
}

void NcclBootstrap::check_same(const void* data, std::size_t bytes, const std::string& what) {
  agree(kCheckSame, bytes, 0);
  if (world() == 1 || bytes == 0) return;
  std::vector<unsigned char> all(bytes * static_cast<std::size_t>(world()));
  {
    DeviceGuard g(device_);
    raw_allgather(data, all.data(), bytes, "check_same");
  }
  std::string differ;
  for (int r = 1; r < world(); ++r) {
    if (std::memcmp(all.data(), all.data() + r * bytes, bytes) != 0)
      differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  }
  TESSERA_CHECK(differ.empty(), "nccl bootstrap: {} differs between ranks: rank(s) {} disagree with rank 0", what,
                differ);
}

}  // namespace tessera::runtime
