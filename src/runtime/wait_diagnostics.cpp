#include "tessera/runtime/wait_diagnostics.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "tessera/runtime/capture_mode.hpp"
#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::runtime {

const char* wait_kind_name(WaitKind k) {
  switch (k) {
    case WaitKind::consumer_tile:
      return "consumer_tile_wait";
    case WaitKind::peer_tile:
      return "peer_tile_wait";
    case WaitKind::counter:
      return "counter wait";
    case WaitKind::host_rank:
      return "rank_wait";
    case WaitKind::bad_id:
      return "id check";
    case WaitKind::tile_flag:
      return "tile flag wait";
    case WaitKind::none:
      break;
  }
  return "wait";
}

WaitDiagnostics::WaitDiagnostics() {
  // The process's record is made by the first operator call that waits,
  // which may come inside a graph capture.
  RelaxedCaptureMode relaxed;
  TESSERA_CUDA_CHECK(
      cudaHostAlloc(reinterpret_cast<void**>(&host_), sizeof(WaitRecord), cudaHostAllocMapped | cudaHostAllocPortable));
  *host_ = WaitRecord{};
  TESSERA_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0));
}

WaitDiagnostics::~WaitDiagnostics() {
  if (host_) (void)cudaFreeHost(host_);
}

std::string describe_wait(const WaitRecord& r) {
  const auto kind = static_cast<WaitKind>(r.kind);
  if (kind == WaitKind::bad_id)
    return fmt::format("rank {}: tile {} maps to id {} outside [0, {})", r.rank, r.tile,
                       static_cast<std::int64_t>(r.seen), r.expected);
  const std::string who = r.peer >= 0 ? fmt::format(" from rank {}", r.peer) : std::string();
  if (kind == WaitKind::tile_flag) {
    const std::string where = r.rank >= 0 ? fmt::format("rank {}: ", r.rank) : std::string();
    return fmt::format(
        "{}{} timed out after {} ns: block {} waiting for tile ({}, {}): flag[{}]{} expected >= {}, seen {}", where,
        wait_kind_name(kind), r.timeout_ns, r.block, r.tile_m, r.tile_n, r.channel, who, r.expected, r.seen);
  }
  return fmt::format("{} timed out on rank {}: tile {} channel {}{} expected >= {} but saw {} after {} ms",
                     wait_kind_name(kind), r.rank, r.tile, r.channel, who, r.expected, r.seen, r.timeout_ns / 1000000);
}

std::optional<std::string> WaitDiagnostics::describe() const {
  // The device wrote the record with system-scope stores followed by a
  // system fence before trapping; an acquire load of `claimed` orders the
  // reads of the other fields after it.
  const unsigned claimed = std::atomic_ref<unsigned>(host_->claimed).load(std::memory_order_acquire);
  if (claimed != 1) return std::nullopt;
  return describe_wait(*host_);
}

void WaitDiagnostics::clear() { *host_ = WaitRecord{}; }

WaitDiagnostics& process_wait_diagnostics() {
  static WaitDiagnostics* d = new WaitDiagnostics();  // never freed: kernels may hold it until exit
  return *d;
}

void WaitDiagnostics::check(const char* context) const {
  if (auto d = describe()) TESSERA_FAIL("{}: {}", context, *d);
}

std::uint64_t wait_timeout_ns() {
  static const std::uint64_t ns =
      static_cast<std::uint64_t>(env::get_int("TESSERA_WAIT_TIMEOUT_MS", 5000, 1, 24LL * 3600 * 1000)) * 1000000ull;
  return ns;
}

void synchronize(cudaStream_t stream, const WaitDiagnostics* diag, const char* context) {
  bounded_sync({stream}, context, nullptr, diag);
}

PollState poll_until(const std::function<PollState()>& poll, std::chrono::nanoseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  auto nap = std::chrono::microseconds(20);
  for (;;) {
    const PollState s = poll();
    if (s != PollState::waiting) return s;
    if (Clock::now() >= deadline) return PollState::waiting;
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(1));
  }
}

namespace {

/// Shared body of the bounded waits: `query` returns cudaSuccess when done,
/// cudaErrorNotReady while busy.
void bounded_wait(const std::function<cudaError_t()>& query, const char* what, ProcessGroup* pg,
                  const WaitDiagnostics* diag, std::optional<std::chrono::nanoseconds> timeout) {
  const auto limit = timeout.value_or(std::chrono::nanoseconds(wait_timeout_ns()));
  cudaError_t cuda = cudaSuccess;
  ncclResult_t nccl = ncclSuccess;
  const auto state = poll_until(
      [&] {
        cuda = query();
        if (cuda == cudaSuccess) return PollState::done;
        if (cuda != cudaErrorNotReady) return PollState::failed;
        if (pg != nullptr && !pg->aborted() && pg->nccl() != nullptr) {
          ncclResult_t async = ncclSuccess;
          const ncclResult_t rc = ncclCommGetAsyncError(pg->nccl(), &async);
          nccl = rc != ncclSuccess ? rc : async;
          if (nccl != ncclSuccess && nccl != ncclInProgress) return PollState::failed;
          nccl = ncclSuccess;
        }
        return PollState::waiting;
      },
      limit);
  if (state == PollState::done) return;
  const int rank = pg != nullptr ? pg->rank() : -1;
  const std::string who = rank >= 0 ? fmt::format("rank {}", rank) : std::string("this rank");
  if (state == PollState::failed && cuda != cudaSuccess && cuda != cudaErrorNotReady) {
    if (diag) diag->check(what);
    if (pg) pg->abort();
    TESSERA_FAIL("{}: {}: CUDA error {} ({})", what, who, cudaGetErrorName(cuda), cudaGetErrorString(cuda));
  }
  if (diag) diag->check(what);  // a device wait that trapped names itself
  const bool had_comm = pg != nullptr && !pg->aborted() && pg->nccl() != nullptr;
  // Stream waits for a missing peer's flag never end by themselves: release
  // them so the device drains, then abort, which ends the NCCL kernels that
  // wait for the peer (and whose cudaFree needs a drained device).
  const std::string released = pg ? pg->release_host_waits() : std::string();
  if (pg) pg->abort();
  if (state == PollState::failed)
    TESSERA_FAIL(
        "{}: {}: NCCL reported an asynchronous error while waiting: {} (a peer failed or aborted); the "
        "communicator was aborted",
        what, who, ncclGetErrorString(nccl));
  TESSERA_FAIL(
      "{}: {} waited {} ms (TESSERA_WAIT_TIMEOUT_MS) and the work is not done: a peer is dead, stopped or "
      "behind{}{}{}",
      what, who, std::chrono::duration_cast<std::chrono::milliseconds>(limit).count(),
      had_comm ? "; the NCCL communicator was aborted (create a new process group)"
      : pg     ? ""
               : " (no communicator to abort here: the caller must abort it)",
      released.empty() ? "" : "; released: ", released);
}

}  // namespace

void bounded_sync(std::initializer_list<cudaStream_t> streams, const char* what, ProcessGroup* pg,
                  const WaitDiagnostics* diag, std::optional<std::chrono::nanoseconds> timeout) {
  const std::vector<cudaStream_t> list(streams);
  bounded_wait(
      [&]() -> cudaError_t {
        for (cudaStream_t s : list) {
          const cudaError_t q = cudaStreamQuery(s);
          if (q != cudaSuccess) return q;
        }
        return cudaSuccess;
      },
      what, pg, diag, timeout);
}

void bounded_sync(cudaStream_t stream, const char* what, ProcessGroup* pg, const WaitDiagnostics* diag,
                  std::optional<std::chrono::nanoseconds> timeout) {
  bounded_sync({stream}, what, pg, diag, timeout);
}

void bounded_event_sync(cudaEvent_t event, const char* what, ProcessGroup* pg,
                        std::optional<std::chrono::nanoseconds> timeout) {
  bounded_wait([&] { return cudaEventQuery(event); }, what, pg, nullptr, timeout);
}

}  // namespace tessera::runtime
