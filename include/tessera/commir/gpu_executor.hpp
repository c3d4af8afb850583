// tessera/commir/gpu_executor.hpp — runs a lowered GEMM Plan on GPUs with
// NCCL (one process per rank) and cuBLASLt for the local kernels.
//
// The construction translates this rank's plan into a program of device ops
// (commir/gpu_program.hpp: which blocks exist, where each step reads and
// writes, issue order, stream events) — the same bookkeeping that
// simulate_gpu_programs runs on the host in the CPU tests — and allocates
// every block. run() only issues that program: each step's point-to-point
// transfers as one NCCL group on the communication stream, issued before
// the previous step's GEMM so that they overlap it; partial accumulators
// (ring reduce-scatter) after the compute that produced them; collectives
// where the plan puts them; the compute stream waits on events.
//
// Data: inputs bf16, accumulators/outputs f32 (row-major blocks, one device
// allocation per block, all freed at destruction).
//
// The local kernel is one function (local_gemm in gpu_executor.cpp) so that
// Tessera's own GEMM engine can replace cuBLASLt there.
//
// Limits (checked, tessera::Error before anything is allocated or launched):
// GEMM plans only; one-level meshes whose size equals the communicator's;
// collectives need equal, contiguous, full-width row blocks in rank order
// (extents divisible by the world size); no AllToAll. output() and the
// destructor wait at most TESSERA_WAIT_TIMEOUT_MS (an NCCL call whose peer
// never issues it is reported, not waited for forever).
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
  /// Issues every step of this rank's plan (asynchronous on the streams); once.
  void run();
  /// Waits for completion and returns this rank's required final region of
  /// output `name` as (box, row-major values) pairs.
  std::vector<std::pair<Box, std::vector<float>>> output(const std::string& name);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::commir
