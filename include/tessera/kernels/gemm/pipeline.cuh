// tessera/kernels/gemm/pipeline.cuh — a position in the GEMM kernel's smem
// ring (mainloop.cuh): the slot (stage) and the parity of its current fill.
// Host-compilable, like barriers.cuh.
#pragma once

#include <cuda_runtime.h>  // __host__ / __device__ in host compilers too

#include <cstdint>

namespace tessera::kernels::engine {

/// The ring of kStages slots is filled in order; fill i (the ring index,
/// counted from 0 over the whole kernel) uses slot i % kStages and is that
/// slot's (i / kStages)-th fill. An mbarrier parity wait tells fills apart by
/// the parity of that count, so a state is the slot and that parity bit:
///   producer: wait empty[stage] with parity phase ^ 1 (the slot's previous
///             fill was consumed; passes at once on the first round), fill it;
///   consumer: wait full[stage] with parity phase, read it, release it.
/// Producer and consumers each hold a state and advance() it once per slot;
/// the ping-pong consumers jump to a tile's first ring index with at().
/// `phase` is declared before `stage`: with this order the kernels compile
/// to the same SASS as with two separate locals (docs/design/gemm-engine.md).
template <int kStages>
struct PipelineState {
  uint32_t phase = 0;
  int stage = 0;

  /// The state of ring index `index`.
  __host__ __device__ static constexpr PipelineState at(int64_t index) {
    PipelineState s;
    s.stage = static_cast<int>(index % kStages);
    s.phase = static_cast<uint32_t>((index / kStages) & 1);
    return s;
  }
  /// The next slot; the phase flips each time the slot index wraps.
  __host__ __device__ constexpr void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

}  // namespace tessera::kernels::engine
