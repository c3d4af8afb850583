// tessera/signal/device.cuh — the device side of the wave-group signal:
// what a kernel calls once a tile of a group is stored.
//
// Memory-order contract (producer = epilogue, consumer = the NCCL kernel
// launched on the communication stream after the group's wait):
//  1. every thread of the CTA has issued its generic-proxy stores of the
//     tile into the group buffer (if the epilogue stores with TMA, i.e. the
//     async proxy, it must first wait for the bulk stores to complete:
//     cp.async.bulk.wait_group 0 — not the .read variant);
//  2. signal_tile_done() runs __syncthreads() (CTA-scope ordering of all
//     threads' stores before thread 0) and thread 0 then does a
//     red.release.gpu add of 1 to the group's counter (link::counter_notify);
//     release is cumulative, so all the CTA's stores are visible at GPU
//     scope before the counter can be seen incremented;
//  3. the waiter (cuStreamWaitValue32, or the spinning waiter's
//     link::wait_until at Scope::gpu) observes counter >= target; the NCCL
//     kernel is a later kernel in stream order and reads the data from
//     L2/memory.
// Counters are epoch based (target = epoch * tiles of the group); never reset.
#pragma once

#include <cstdint>

#include "tessera/link/device_primitives.cuh"

namespace tessera::signal {

/// Called by every thread of the CTA after its stores of one tile of `group`.
__device__ __forceinline__ void signal_tile_done(std::uint32_t* counters, int group) {
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0)
    link::counter_notify<link::Scope::gpu>(counters + group);
}

}  // namespace tessera::signal
