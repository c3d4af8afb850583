// tessera/runtime/capture_mode.hpp — one-time set-up that may run while
// the caller captures a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include "tessera/runtime/error.hpp"

namespace tessera::runtime {

/// This thread's stream-capture mode set to relaxed for the scope's life,
/// then the caller's restored. Why: the first call of an operator may come
/// inside a capture (a CUDA graph of a training step), and its one-time
/// set-up (a memory pool, a workspace, mapped host memory) uses calls that
/// are not stream operations but that global capture mode forbids on
/// every thread. Use it only around such set-up, never around work that
/// belongs in the graph.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { TESSERA_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode_)); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }  // restores; cannot fail for a valid mode
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace tessera::runtime
