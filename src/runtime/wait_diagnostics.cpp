#include "tessera/runtime/wait_diagnostics.hpp"

#include <fmt/format.h>

#include <atomic>

#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::runtime {

const char* wait_kind_name(WaitKind k) {
  switch (k) {
    case WaitKind::consumer_tile: return "consumer_tile_wait";
    case WaitKind::peer_tile: return "peer_tile_wait";
    case WaitKind::counter: return "counter wait";
    case WaitKind::host_rank: return "rank_wait";
    case WaitKind::bad_id: return "id check";
    case WaitKind::none: break;
  }
  return "wait";
}

WaitDiagnostics::WaitDiagnostics() {
  TESSERA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_), sizeof(WaitRecord), cudaHostAllocMapped));
  *host_ = WaitRecord{};
  TESSERA_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0));
}

WaitDiagnostics::~WaitDiagnostics() {
  if (host_) (void)cudaFreeHost(host_);
}

std::optional<std::string> WaitDiagnostics::describe() const {
  // The device wrote the record with system-scope stores followed by a
  // system fence before trapping; an acquire load of `claimed` orders the
  // reads of the other fields after it.
  const unsigned claimed = std::atomic_ref<unsigned>(host_->claimed).load(std::memory_order_acquire);
  if (claimed != 1) return std::nullopt;
  const WaitRecord& r = *host_;
  if (static_cast<WaitKind>(r.kind) == WaitKind::bad_id)
    return fmt::format("rank {}: tile {} maps to id {} outside [0, {})", r.rank, r.tile,
                       static_cast<std::int64_t>(r.seen), r.expected);
  std::string who = r.peer >= 0 ? fmt::format(" from rank {}", r.peer) : std::string();
  return fmt::format("{} timed out on rank {}: tile {} channel {}{} expected >= {} but saw {} after {} ms",
                     wait_kind_name(static_cast<WaitKind>(r.kind)), r.rank, r.tile, r.channel, who, r.expected,
                     r.seen, r.timeout_ns / 1000000);
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
  const cudaError_t err = cudaStreamSynchronize(stream);
  if (err == cudaSuccess) return;
  if (diag) diag->check(context);
  TESSERA_FAIL("{}: CUDA error {} ({})", context, cudaGetErrorName(err), cudaGetErrorString(err));
}

}  // namespace tessera::runtime
