#include "tessera/runtime/signals.hpp"

#include <fmt/format.h>

#include "tessera/runtime/driver_api.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::runtime {

Signals::Signals(ProcessGroup& pg, int slots) : pg_(&pg), slots_(slots) {
  TESSERA_CHECK(slots > 0 && slots <= (1 << 24), "Signals: slot count {} out of range [1, 2^24]", slots);
  buf_ = SymBuffer<std::uint64_t>(pg, static_cast<std::size_t>(slots) * (1 + pg.world()));
  diag_ = std::make_unique<WaitDiagnostics>();
  TESSERA_CUDA_CHECK(cudaMemsetAsync(buf_.local(), 0, buf_.bytes(), pg.stream()));
  pg.synchronize(pg.stream(), "Signals: zeroing the flags");  // bounded: the stream may hold a peer's collective
  pg.barrier();
  pg.register_signals(this);
}

Signals::~Signals() { pg_->unregister_signals(this); }

SignalView Signals::view() const {
  SignalView v{};
  for (int r = 0; r < pg_->world(); ++r) v.base[r] = buf_.peer(r);
  v.rank = pg_->rank();
  v.world = pg_->world();
  v.slots = slots_;
  v.timeout_ns = wait_timeout_ns();
  v.diag = diag_->device_record();
  return v;
}

void Signals::note_host_wait(const HostWait& w) const {
  std::lock_guard lock(waits_mutex_);
  PendingWait& v = host_waits_[{w.stream, w.src, w.slot}];
  if (w.value > v.value) v = {w.value, w.what};
}

std::vector<Signals::HostWait> Signals::host_waits(cudaStream_t stream) const {
  std::lock_guard lock(waits_mutex_);
  std::vector<HostWait> out;
  for (const auto& [k, v] : host_waits_) {
    if (std::get<0>(k) == stream) out.push_back({stream, std::get<1>(k), std::get<2>(k), v.value, v.what});
  }
  return out;
}

void Signals::zero_local(cudaStream_t stream) const {
  TESSERA_CUDA_CHECK(cudaMemsetAsync(buf_.local(), 0, buf_.bytes(), stream));
  std::lock_guard lock(waits_mutex_);
  host_waits_.clear();
}

void Signals::clear_host_waits(cudaStream_t stream) const {
  std::lock_guard lock(waits_mutex_);
  for (auto it = host_waits_.begin(); it != host_waits_.end();) {
    it = std::get<0>(it->first) == stream ? host_waits_.erase(it) : std::next(it);
  }
}

std::string Signals::release_host_waits(cudaStream_t side, std::optional<cudaStream_t> stream) const {
  std::vector<HostWait> waits;
  {
    std::lock_guard lock(waits_mutex_);
    for (auto it = host_waits_.begin(); it != host_waits_.end();) {
      const auto& [s, src, slot] = it->first;
      if (stream && s != *stream) {
        ++it;
        continue;
      }
      waits.push_back({s, src, slot, it->second.value, it->second.what});
      it = host_waits_.erase(it);
    }
  }
  std::string released;
  for (const HostWait& w : waits) {
    const std::uint64_t seen = read_flag_from(w.src, w.slot, side);
    if (seen >= w.value) continue;
    released += fmt::format("{}{} on rank {}: slot {} from rank {} expected >= {} but saw {}",
                            released.empty() ? "" : "; ", w.what, pg_->rank(), w.slot, w.src, w.value, seen);
    driver::stream_write_u64(side, view().flag_from(w.src, w.slot), w.value);
  }
  return released;
}

std::uint64_t Signals::read_counter(int slot, cudaStream_t stream) const {
  TESSERA_CHECK(slot >= 0 && slot < slots_, "read_counter: slot {} out of range [0, {})", slot, slots_);
  std::uint64_t v = 0;
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(&v, view().counter(slot), sizeof(v), cudaMemcpyDeviceToHost, stream));
  bounded_sync(stream, "Signals::read_counter");
  return v;
}

std::uint64_t Signals::read_flag_from(int src, int slot, cudaStream_t stream) const {
  TESSERA_CHECK(slot >= 0 && slot < slots_ && src >= 0 && src < pg_->world(),
                "read_flag_from: (rank {}, slot {}) out of range", src, slot);
  std::uint64_t v = 0;
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(&v, view().flag_from(src, slot), sizeof(v), cudaMemcpyDeviceToHost, stream));
  bounded_sync(stream, "Signals::read_flag_from");
  return v;
}

}  // namespace tessera::runtime
