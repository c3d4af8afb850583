// tessera/kernels/gemm/wait_diag.hpp — the record a timed-out device wait
// leaves behind before it traps, in host-mapped memory so the host can still
// read it after the CUDA context is lost.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::kernels {
namespace engine {

/// Zero-initialised; the first timeout wins. magic == kMagic marks a record.
struct WaitDiag {
  static constexpr uint32_t kMagic = 0x7E55E7A0u;
  uint32_t magic;
  int block, tile_m, tile_n, flag;
  uint64_t expected, seen, timeout_ns;
};

}  // namespace engine

/// The process-wide record (pinned, mapped; valid on every device through
/// UVA). Pass it as FlagWait::diag.
engine::WaitDiag* wait_diagnostics();
/// "" if no wait timed out; otherwise a message naming the block, tile, flag
/// index, expected and seen values and the timeout.
std::string last_wait_timeout();
/// Clears the record (before reusing it in a fresh context).
void clear_wait_timeout();

}  // namespace tessera::kernels
