#include "tessera/link/host_primitives.hpp"

#include <chrono>
#include <thread>

#include "tessera/runtime/driver_api.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"
#include "tessera/runtime/wait_diagnostics.hpp"

namespace tessera::link {

namespace {
void check_rank_slot(const runtime::Signals& s, int r, int slot, const char* what) {
  TESSERA_CHECK(r >= 0 && r < s.group().world(), "{}: rank {} outside [0, {})", what, r, s.group().world());
  TESSERA_CHECK(slot >= 0 && slot < s.slots(), "{}: slot {} outside [0, {})", what, slot, s.slots());
}
}  // namespace

void rank_notify(cudaStream_t stream, const runtime::Signals& signals, int dst_rank, int slot, std::uint64_t value) {
  check_rank_slot(signals, dst_rank, slot, "rank_notify");
  runtime::driver::stream_write_u64(stream, signals.view().flag_at(dst_rank, slot), value);
}

void rank_wait(cudaStream_t stream, const runtime::Signals& signals, int src_rank, int slot, std::uint64_t value) {
  check_rank_slot(signals, src_rank, slot, "rank_wait");
  signals.note_host_wait({stream, src_rank, slot, value});
  runtime::driver::stream_wait_geq_u64(stream, signals.view().flag_from(src_rank, slot), value);
}

void rank_copy_data(cudaStream_t stream, void* dst, const void* src, std::size_t bytes) {
  TESSERA_CHECK(dst != nullptr && src != nullptr, "rank_copy_data: null address (dst {}, src {})", dst, src);
  if (bytes == 0) return;
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

void synchronize(cudaStream_t stream, const runtime::Signals& signals, const char* context) {
  synchronize(stream, {&signals}, context);
}

void synchronize(cudaStream_t stream, std::initializer_list<const runtime::Signals*> signals, const char* context) {
  TESSERA_CHECK(signals.size() > 0, "{}: synchronize needs at least one Signals", context);
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::nanoseconds(runtime::wait_timeout_ns());
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess) {
      for (const auto* sg : signals) sg->clear_host_waits(stream);
      return;
    }
    if (q != cudaErrorNotReady) {
      for (const auto* sg : signals) sg->diagnostics().check(context);
      TESSERA_FAIL("{}: CUDA error {} ({})", context, cudaGetErrorName(q), cudaGetErrorString(q));
    }
    if (clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  // Stuck. Report every pending host wait whose flag is still short, then
  // release them (store the expected value locally from another stream) so
  // the stream drains and the process can exit instead of hanging.
  for (const auto* sg : signals) sg->diagnostics().check(context);
  cudaStream_t side;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  std::string pending;
  for (const auto* sg : signals) {
    const std::string r = sg->release_host_waits(side, stream);
    if (!r.empty()) pending += (pending.empty() ? "" : "; ") + r;
  }
  // Bounded: the stream may also sit in an NCCL collective whose peer is
  // gone, which no released flag unblocks; then the communicator is aborted
  // (ncclCommAbort ends those kernels) so that nothing hangs later.
  std::string after;
  try {
    runtime::bounded_sync({side, stream}, context);
  } catch (const Error&) {
    runtime::ProcessGroup& pg = (*signals.begin())->group();
    pg.abort();
    after =
        "; the stream still did not drain after the release (an NCCL collective waits for a peer): the "
        "communicator was aborted";
  }
  (void)cudaStreamDestroy(side);
  for (const auto* sg : signals) sg->clear_host_waits(stream);
  TESSERA_FAIL("{}: rank {}: stream did not drain within {} ms{}{}{}", context, (*signals.begin())->group().rank(),
               runtime::wait_timeout_ns() / 1000000, pending.empty() ? "" : ": ",
               pending.empty() ? std::string("(no pending rank_wait)") : pending, after);
}

}  // namespace tessera::link
