// tessera/tune/graph_timing.hpp — GPU-only timing of short work, for the
// GEMM tuner and the benchmarks.
//
// Event pairs recorded by the host around a call measure the GPU time only
// when the host keeps the queue ahead. A call whose GPU time is below its
// enqueue cost (a few µs for one kernel launch, ~7 µs for cuBLASLt) leaves
// the GPU idle between calls, and the idle time is counted. Here every body
// is captured once into a CUDA graph as `calls` back-to-back calls between
// two event-record nodes (cudaEventRecordExternal): the events are recorded
// by the GPU when the graph reaches them, so the interval holds the calls'
// GPU time and none of the host's. The graphs of all bodies are launched
// interleaved, one round after another (warm-up rounds first), so drift in
// clocks and temperature hits every body alike; each round starts with an
// untimed graph (the GPU has idled while the host waited for the previous
// round) and the order rotates round by round, so no body is always first.
//
// Bodies must be capturable (no synchronization, no host reads of device
// data); call `i` of the graph may choose its inputs by i (rotating buffer
// sets). Stream-ordered allocations become the graph's allocation nodes.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

namespace tessera::tune {

struct GraphTimingOptions {
  int warmup = 3;  ///< untimed rounds
  int reps = 10;   ///< timed rounds
  int calls = 1;   ///< calls of a body per graph (per timed interval)
};

struct GraphTimes {
  std::vector<std::vector<double>> us;  ///< per body (in order), the reps' µs per call
  /// False when a body could not be captured and every body was timed by
  /// host-recorded events instead (`why` says what failed): then a short
  /// call's time may include its enqueue cost.
  bool gpu_only = true;
  std::string why;
};

/// Times the bodies as above. `stream` must not be the legacy default stream
/// (it cannot be captured). When a capture fails, the stream is taken out of
/// capture mode and the bodies are timed the old way (events recorded by the
/// host around each call, interleaved), reported in GraphTimes. Other
/// failures throw tessera::Error naming `what`.
GraphTimes time_graphs_interleaved(cudaStream_t stream, const std::vector<std::function<void(int call)>>& bodies,
                                   const GraphTimingOptions& opt, const std::string& what);

/// The median of a list of times (NaN when empty).
double median_of(std::vector<double> v);

}  // namespace tessera::tune
