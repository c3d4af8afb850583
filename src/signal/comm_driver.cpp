#include "tessera/signal/comm_driver.hpp"

#include <fmt/format.h>

#include <chrono>
#include <exception>
#include <string>
#include <thread>

#include "tessera/runtime/driver_api.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::signal {
namespace {

using Clock = std::chrono::steady_clock;

// Polls `stream` until it is idle or `deadline` passes (cudaErrorNotReady),
// never blocking in the driver; with `comm`, an asynchronous NCCL error
// (e.g. a peer that aborted) is thrown as soon as it is seen.
cudaError_t wait_idle(cudaStream_t stream, Clock::time_point deadline, ncclComm_t comm = nullptr) {
  for (;;) {
    const cudaError_t rc = cudaStreamQuery(stream);
    if (rc != cudaErrorNotReady) return rc;
    if (comm) {
      ncclResult_t async = ncclSuccess;
      TESSERA_NCCL_CHECK(ncclCommGetAsyncError(comm, &async));
      TESSERA_NCCL_CHECK(async);
    }
    if (Clock::now() > deadline) return cudaErrorNotReady;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

template <class P>
P* at(P* base, std::int64_t elems, DType t) {
  using B = std::conditional_t<std::is_const_v<P>, const char, char>;
  return reinterpret_cast<P*>(reinterpret_cast<B*>(base) + elems * static_cast<std::int64_t>(dtype_size(t)));
}

}  // namespace

const char* wait_mode_name(WaitMode m) { return m == WaitMode::StreamMemOp ? "stream_memop" : "spin_kernel"; }

void ensure_loaded(const void* fn, const char* name) {
  TESSERA_CHECK(fn != nullptr, "signal::ensure_loaded: null kernel address for {}", name);
  cudaFuncAttributes attr{};
  const cudaError_t rc = cudaFuncGetAttributes(&attr, fn);
  TESSERA_CHECK(rc == cudaSuccess, "signal::ensure_loaded: cannot load kernel {}: {} ({})", name, cudaGetErrorName(rc),
                cudaGetErrorString(rc));
}

GroupCounters::GroupCounters(int groups) : groups_(groups) {
  TESSERA_CHECK(groups > 0, "GroupCounters: group count must be positive, got {}", groups);
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  TESSERA_CUDA_CHECK(cudaMalloc(&counters_, sizeof(std::uint32_t) * groups));
  TESSERA_CUDA_CHECK(
      cudaHostAlloc(reinterpret_cast<void**>(&host_), sizeof(std::uint32_t) * groups, cudaHostAllocDefault));
  // Zeroed on the private stream, not with a device-wide synchronization:
  // other streams may already be waiting on other counters.
  TESSERA_CUDA_CHECK(cudaMemsetAsync(counters_, 0, sizeof(std::uint32_t) * groups, side_));
  const cudaError_t rc = wait_idle(side_, Clock::now() + std::chrono::nanoseconds(runtime::wait_timeout_ns()));
  TESSERA_CHECK(rc != cudaErrorNotReady, "GroupCounters: zeroing {} counters did not finish within {} ms", groups,
                runtime::wait_timeout_ns() / 1000000);
  TESSERA_CUDA_CHECK(rc);
}

GroupCounters::~GroupCounters() {
  if (side_) (void)cudaStreamDestroy(side_);  // returns at once; released when idle
  // cudaFree / cudaFreeHost synchronize the device: while an exception
  // unwinds (typically a stuck wait on these counters) that would hang
  // before the error is reported, so the memory is leaked instead.
  if (std::uncaught_exceptions() > 0) return;
  if (counters_) (void)cudaFree(counters_);
  if (host_) (void)cudaFreeHost(host_);
}

std::vector<std::uint32_t> GroupCounters::read(std::uint64_t timeout_ns) const {
  // Pinned target: a truly asynchronous copy on the private stream, polled
  // with a deadline (never a blocking synchronize).
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(host_, counters_, sizeof(std::uint32_t) * groups_, cudaMemcpyDeviceToHost, side_));
  const cudaError_t rc = wait_idle(side_, Clock::now() + std::chrono::nanoseconds(timeout_ns));
  TESSERA_CHECK(rc != cudaErrorNotReady, "GroupCounters::read: reading {} counters did not finish within {} ms",
                groups_, timeout_ns / 1000000);
  TESSERA_CUDA_CHECK(rc);
  return std::vector<std::uint32_t>(host_, host_ + groups_);
}

void GroupCounters::store(int g, std::uint32_t value, std::uint64_t timeout_ns) const {
  TESSERA_CHECK(g >= 0 && g < groups_, "GroupCounters::store: group {} outside [0, {})", g, groups_);
  runtime::driver::stream_write_u32(side_, counters_ + g, value);
  const cudaError_t rc = wait_idle(side_, Clock::now() + std::chrono::nanoseconds(timeout_ns));
  TESSERA_CHECK(rc != cudaErrorNotReady, "GroupCounters::store: storing counter {} did not finish within {} ms", g,
                timeout_ns / 1000000);
  TESSERA_CUDA_CHECK(rc);
}

CommDriver::CommDriver(ncclComm_t comm, cudaStream_t stream, WaitMode mode, std::uint64_t timeout_ns)
    : comm_(comm), stream_(stream), mode_(mode), timeout_ns_(timeout_ns) {
  TESSERA_CHECK(comm != nullptr, "signal::CommDriver: null NCCL communicator");
  TESSERA_CHECK(timeout_ns > 0, "signal::CommDriver: timeout must be positive");
  TESSERA_NCCL_CHECK(ncclCommUserRank(comm, &rank_));
  TESSERA_NCCL_CHECK(ncclCommCount(comm, &world_));
  if (mode == WaitMode::SpinKernel) {
    diag_ = std::make_unique<runtime::WaitDiagnostics>();
    // Loaded now: launched later behind NCCL work and next to the producer,
    // its first launch must not wait for an idle device (lazy loading).
    ensure_loaded(detail::spin_wait_kernel_address(), "signal spin_wait_kernel");
  }
}

CommDriver::~CommDriver() {
  if (std::uncaught_exceptions() > 0) (void)diag_.release();  // see GroupCounters::~GroupCounters
}

void CommDriver::check_counters(const GroupPlan& plan, const GroupCounters& counters, const char* op) const {
  TESSERA_CHECK(counters.groups() >= plan.groups(), "{}: plan {} has {} groups but only {} counters", op, plan.str(),
                plan.groups(), counters.groups());
}

void CommDriver::wait_group(const GroupPlan& plan, const GroupCounters& counters, int g, std::uint64_t epoch) {
  TESSERA_CHECK(g >= 0 && g < plan.groups(), "signal::CommDriver::wait_group: group {} outside [0, {})", g,
                plan.groups());
  check_counters(plan, counters, "signal::CommDriver::wait_group");
  const std::uint32_t target = plan.counter_target(g, epoch);
  std::uint32_t* addr = counters.device() + g;
  if (mode_ == WaitMode::StreamMemOp) {
    runtime::driver::stream_wait_geq_u32(stream_, addr, target);
  } else {
    TESSERA_CUDA_CHECK(detail::launch_spin_wait(addr, target, timeout_ns_, rank_, g, diag_->device_record(), stream_));
  }
}

void CommDriver::all_reduce(const GroupPlan& plan, const ArMap& map, void* buffer, DType dtype,
                            const GroupCounters& counters, std::uint64_t epoch) {
  TESSERA_CHECK(buffer != nullptr, "signal::CommDriver::all_reduce: null buffer");
  TESSERA_CHECK(plan.tiles() == map.order.tiles(), "signal::CommDriver::all_reduce: plan has {} tiles, map {}",
                plan.tiles(), map.order.tiles());
  check_counters(plan, counters, "signal::CommDriver::all_reduce");
  for (int g = 0; g < plan.groups(); ++g) {
    wait_group(plan, counters, g, epoch);
    void* span = at(buffer, plan.tile_begin(g) * map.tile_elems(), dtype);
    TESSERA_NCCL_CHECK(ncclAllReduce(span, span, static_cast<size_t>(plan.tiles_in(g) * map.tile_elems()),
                                     runtime::nccl_dtype(dtype), ncclSum, comm_, stream_));
  }
}

void CommDriver::reduce_scatter(const GroupPlan& plan, const RsMap& map, const void* send, void* recv, DType dtype,
                                const GroupCounters& counters, std::uint64_t epoch) {
  TESSERA_CHECK(send != nullptr && recv != nullptr, "signal::CommDriver::reduce_scatter: null buffer");
  TESSERA_CHECK(map.ranks == world_, "signal::CommDriver::reduce_scatter: map is for {} ranks, communicator has {}",
                map.ranks, world_);
  TESSERA_CHECK(plan.tiles() == map.order.tiles(), "signal::CommDriver::reduce_scatter: plan has {} tiles, map {}",
                plan.tiles(), map.order.tiles());
  check_counters(plan, counters, "signal::CommDriver::reduce_scatter");
  for (int g = 0; g < plan.groups(); ++g) {
    wait_group(plan, counters, g, epoch);
    TESSERA_NCCL_CHECK(ncclReduceScatter(
        at(send, plan.tile_begin(g) * map.tile_elems(), dtype), at(recv, plan.tile_begin(g) * map.sub_elems(), dtype),
        static_cast<size_t>(plan.tiles_in(g) * map.sub_elems()), runtime::nccl_dtype(dtype), ncclSum, comm_, stream_));
  }
}

void CommDriver::all_to_all(const A2aPlan& plan, const void* send, void* recv, DType dtype,
                            const GroupCounters& counters, std::uint64_t epoch) {
  TESSERA_CHECK(send != nullptr && recv != nullptr, "signal::CommDriver::all_to_all: null buffer");
  TESSERA_CHECK(plan.ranks() == world_, "signal::CommDriver::all_to_all: plan is for {} ranks, communicator has {}",
                plan.ranks(), world_);
  const GroupPlan& mine = plan.plan(rank_);
  check_counters(mine, counters, "signal::CommDriver::all_to_all");
  const ncclDataType_t t = runtime::nccl_dtype(dtype);
  for (int g = 0; g < plan.groups(); ++g) {
    wait_group(mine, counters, g, epoch);
    TESSERA_NCCL_CHECK(ncclGroupStart());
    for (int d = 0; d < world_; ++d) {
      const std::int64_t n = plan.send_count(rank_, g, d);
      if (n > 0)
        TESSERA_NCCL_CHECK(ncclSend(at(send, plan.send_offset(rank_, g, d), dtype), size_t(n), t, d, comm_, stream_));
    }
    for (int q = 0; q < world_; ++q) {
      const std::int64_t n = plan.recv_count(rank_, g, q);
      if (n > 0)
        TESSERA_NCCL_CHECK(ncclRecv(at(recv, plan.recv_offset(rank_, g, q), dtype), size_t(n), t, q, comm_, stream_));
    }
    TESSERA_NCCL_CHECK(ncclGroupEnd());
  }
}

void CommDriver::synchronize(const GroupPlan& plan, const GroupCounters& counters, std::uint64_t epoch) const {
  check_counters(plan, counters, "signal::CommDriver::synchronize");
  const auto timeout = std::chrono::nanoseconds(timeout_ns_);
  const cudaError_t rc = wait_idle(stream_, Clock::now() + timeout, comm_);
  if (rc == cudaSuccess) return;
  if (rc != cudaErrorNotReady) {
    if (diag_) diag_->check("signal::CommDriver::synchronize");
    TESSERA_CUDA_CHECK(rc);
  }
  // Stuck. Name the short counters, then release their waits (store the
  // target from the counters' private stream: a stream memory operation, no
  // kernel launch that lazy loading could block) so the stream can drain
  // instead of hanging every later device-wide synchronization (cudaFree,
  // stream destruction, ncclCommFinalize). The collectives behind the waits
  // then run on incomplete data; the caller gets the error below.
  const std::vector<std::uint32_t> seen = counters.read(timeout_ns_);
  std::string shortfall;
  for (int g = 0; g < plan.groups(); ++g) {
    const std::uint32_t want = plan.counter_target(g, epoch);
    if (counter_reached(seen[g], want)) continue;  // the waits' own (cyclic) test
    shortfall += fmt::format(" group {}: expected >= {}, seen {};", g, want, seen[g]);
    counters.store(g, want, timeout_ns_);
  }
  // Peers that time out on their own counters release theirs within about
  // the same timeout, so one more timeout is enough for the collectives.
  const cudaError_t after = wait_idle(stream_, Clock::now() + timeout, comm_);
  if (after != cudaSuccess && after != cudaErrorNotReady && diag_) diag_->check("signal::CommDriver::synchronize");
  const std::string outcome =
      after == cudaSuccess ? std::string(shortfall.empty() ? " the stream drained late (a peer was behind)"
                                                           : " released the short waits; the stream drained")
      : after == cudaErrorNotReady
          ? fmt::format(
                " the stream is still busy {} ms later: an NCCL collective is waiting for a peer that did "
                "not post it or is behind (abort the communicator before freeing its buffers)",
                timeout_ns_ / 1000000)
          : fmt::format(" CUDA error {} ({}) while draining", cudaGetErrorName(after), cudaGetErrorString(after));
  TESSERA_FAIL("signal::CommDriver::synchronize: rank {} ({} waits, epoch {}) not done after {} ms:{}{}", rank_,
               wait_mode_name(mode_), epoch, timeout_ns_ / 1000000,
               shortfall.empty() ? std::string(" every counter reached its target; an NCCL collective is stuck "
                                               "(a peer missing or behind);")
                                 : shortfall,
               outcome);
}

}  // namespace tessera::signal
