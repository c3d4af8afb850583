#include "tessera/tune/graph_timing.hpp"

#include <algorithm>
#include <cmath>
#include <exception>

#include "tessera/runtime/error.hpp"

namespace tessera::tune {

namespace {

// One body's graph: start event, `calls` calls, stop event.
struct TimedGraph {
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TimedGraph() = default;
  TimedGraph(const TimedGraph&) = delete;
  TimedGraph& operator=(const TimedGraph&) = delete;
  ~TimedGraph() {
    if (exec) (void)cudaGraphExecDestroy(exec);
    if (graph) (void)cudaGraphDestroy(graph);
    if (start) (void)cudaEventDestroy(start);
    if (stop) (void)cudaEventDestroy(stop);
  }
};

void capture(TimedGraph& g, cudaStream_t stream, const std::function<void(int)>& body, int calls,
             const std::string& what, size_t index) {
  TESSERA_CUDA_CHECK(cudaEventCreate(&g.start));
  TESSERA_CUDA_CHECK(cudaEventCreate(&g.stop));
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    TESSERA_CUDA_CHECK(cudaEventRecordWithFlags(g.start, stream, cudaEventRecordExternal));
    for (int i = 0; i < calls; ++i) body(i);
    TESSERA_CUDA_CHECK(cudaEventRecordWithFlags(g.stop, stream, cudaEventRecordExternal));
  } catch (const std::exception& e) {
    cudaGraph_t broken = nullptr;
    (void)cudaStreamEndCapture(stream, &broken);
    if (broken) (void)cudaGraphDestroy(broken);
    (void)cudaGetLastError();
    TESSERA_FAIL("{}: capturing body {} into a CUDA graph failed: {}", what, index, e.what());
  }
  const cudaError_t rc = cudaStreamEndCapture(stream, &g.graph);
  TESSERA_CHECK(rc == cudaSuccess, "{}: capturing body {} into a CUDA graph failed: {}", what, index,
                cudaGetErrorString(rc));
  TESSERA_CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
}

}  // namespace

double median_of(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

// The fallback: each call bracketed by host-recorded events, bodies
// interleaved call by call.
std::vector<std::vector<double>> time_on_stream(cudaStream_t stream,
                                                const std::vector<std::function<void(int)>>& bodies,
                                                const GraphTimingOptions& opt) {
  const size_t nb = bodies.size();
  for (int r = 0; r < opt.warmup; ++r)
    for (int c = 0; c < opt.calls; ++c)
      for (const auto& b : bodies) b(c);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const size_t n = nb * static_cast<size_t>(opt.reps) * opt.calls;
  std::vector<cudaEvent_t> ev(2 * n);
  for (auto& e : ev) TESSERA_CUDA_CHECK(cudaEventCreate(&e));
  size_t i = 0;
  for (int r = 0; r < opt.reps; ++r)
    for (int c = 0; c < opt.calls; ++c)
      for (const auto& b : bodies) {
        TESSERA_CUDA_CHECK(cudaEventRecord(ev[2 * i], stream));
        b(c);
        TESSERA_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], stream));
        ++i;
      }
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<std::vector<double>> us(nb, std::vector<double>(opt.reps, 0.0));
  i = 0;
  for (int r = 0; r < opt.reps; ++r)
    for (int c = 0; c < opt.calls; ++c)
      for (size_t b = 0; b < nb; ++b, ++i) {
        float ms = 0;
        TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
        us[b][r] += 1e3 * ms / opt.calls;
      }
  for (auto& e : ev) TESSERA_CUDA_CHECK(cudaEventDestroy(e));
  return us;
}

}  // namespace

GraphTimes time_graphs_interleaved(cudaStream_t stream, const std::vector<std::function<void(int call)>>& bodies,
                                   const GraphTimingOptions& opt, const std::string& what) {
  TESSERA_CHECK(stream != nullptr,
                "{}: graph timing needs a created stream (the legacy default stream cannot be captured)", what);
  TESSERA_CHECK(!bodies.empty(), "{}: graph timing needs at least one body", what);
  TESSERA_CHECK(opt.reps > 0 && opt.warmup >= 0 && opt.calls > 0,
                "{}: graph timing: reps = {}, warmup = {}, calls = {} (reps, calls > 0, warmup >= 0)", what, opt.reps,
                opt.warmup, opt.calls);
  GraphTimes out;
  std::vector<TimedGraph> graphs(bodies.size());
  try {
    for (size_t b = 0; b < bodies.size(); ++b) capture(graphs[b], stream, bodies[b], opt.calls, what, b);
  } catch (const Error& e) {
    out.gpu_only = false;
    out.why = e.what();
    graphs.clear();
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    out.us = time_on_stream(stream, bodies, opt);
    return out;
  }
  out.us.resize(bodies.size());
  const size_t n = graphs.size();
  for (int r = 0; r < opt.warmup + opt.reps; ++r) {
    // Every body once per round; the events inside each graph time it, so
    // the round is waited for once. The GPU idles while the host waits, and
    // the first graph after that ran ~4 % slower (GEMMs of 30-600 us; clock
    // ramp or cold state, not told apart), so the round starts with an
    // untimed launch of its last graph, and the order rotates by one each
    // round: no body always follows the idle gap.
    const size_t first = static_cast<size_t>(r) % n;
    TESSERA_CUDA_CHECK(cudaGraphLaunch(graphs[(first + n - 1) % n].exec, stream));
    for (size_t i = 0; i < n; ++i) TESSERA_CUDA_CHECK(cudaGraphLaunch(graphs[(first + i) % n].exec, stream));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (r < opt.warmup) continue;
    for (size_t b = 0; b < graphs.size(); ++b) {
      float ms = 0;
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, graphs[b].start, graphs[b].stop));
      out.us[b].push_back(1e3 * ms / opt.calls);
    }
  }
  return out;
}

}  // namespace tessera::tune
