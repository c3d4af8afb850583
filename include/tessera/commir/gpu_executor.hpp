// tessera/commir/gpu_executor.hpp — runs a lowered GEMM Plan on GPUs with
// NCCL (one process per rank) and cuBLASLt for the local kernels.
//
// Data: inputs bf16, accumulators/outputs f32 (row-major blocks, one device
// allocation per block). Communication of step t is one NCCL group on the
// communication stream, issued before compute t-1 finishes whenever its data
// is ready, so transfers overlap the previous step's GEMM; the compute stream
// waits on an event before the step that needs the data. Partial
// accumulators (ring reduce-scatter) are sent after the compute that produced them.
//
// The local kernel is one function (local_gemm in gpu_executor.cpp) so that
// Tessera's own GEMM engine can replace cuBLASLt there.
//
// Limits (checked, tessera::Error before anything is launched): GEMM plans
// only; one-level meshes whose size equals the communicator's; collectives
// need equal, contiguous row blocks (extents divisible by the world size).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <map>
#include <memory>
#include <vector>

#include "tessera/commir/plan.hpp"

namespace tessera::commir {

class GpuExecutor {
 public:
  /// `comm` and the streams belong to the caller; `rank` is this process's rank.
  GpuExecutor(const Plan& plan, int rank, ncclComm_t comm, cudaStream_t compute, cudaStream_t comm_stream);
  ~GpuExecutor();
  GpuExecutor(const GpuExecutor&) = delete;
  GpuExecutor& operator=(const GpuExecutor&) = delete;

  /// Uploads this rank's initial region of input `name` from the full
  /// row-major host tensor (float values, converted to bf16).
  void set_input(const std::string& name, const std::vector<float>& full);
  /// Issues every step of this rank's plan (asynchronous on the streams).
  void run();
  /// Waits for completion and returns this rank's required final region of
  /// output `name` as (box, row-major values) pairs.
  std::vector<std::pair<Box, std::vector<float>>> output(const std::string& name);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::commir
