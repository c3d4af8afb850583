// tessera/commir/gpu_executor.hpp — runs a lowered GEMM or attention Plan on
// GPUs with NCCL (one process per rank), cuBLASLt for the local GEMMs (what
// the hand-built operators' sequential strategy uses) and Tessera's attention
// kernel (kernels::attention, partial results merged by
// kernels::attention_merge) for attention plans.
//
// The construction translates this rank's plan into a program of device ops
// (commir/gpu_program.hpp: which blocks exist, where each step reads and
// writes, issue order, stream events) — the same bookkeeping that
// simulate_gpu_programs runs on the host in the CPU tests — allocates every
// block and prepares every local op (cuBLASLt descriptors and algorithm,
// chosen once for the actual operand alignments). run() only enqueues that
// program: each step's point-to-point transfers as one NCCL group on the
// communication stream, issued before the step's GEMM so that they overlap
// it; partial accumulators (ring reduce-scatter) after the compute that
// produced them, merged after the next GEMM instead of delaying it;
// collectives where the plan puts them; the streams wait on events only.
//
// Data: inputs bf16; accumulators/outputs in the Grid's dtype — bf16
// (make_gemm's default, as the hand-built operators) or f32 (exact tests) —
// stored, communicated and merged in that dtype. The first GEMM into a block
// overwrites it (no memset). Row-major blocks, one device allocation per
// block, all freed at destruction.
//
// run() may be called any number of times (each run recomputes every
// non-input block from the inputs; it starts after the previous run and the
// uploads on both streams), so a benchmark times run() alone.
//
// Attention plans (gpu_program.hpp, "Attention plans"): every schedule
// `tessera plan attention` lists, on one-level meshes (cp, cp_ag, ring,
// ulysses, tree, tree_rs) and two-level ones (the same over both levels, and
// usp, two_level), the mesh's product equal to the communicator's size. Inputs Q [b, h, q, d], K / V [b, h/g, kv, d]
// (the IR's dimension order, head_dim innermost) are uploaded as bf16; the output O is read back from bf16 whatever the
// Grid's dtype. Every kernel call's arguments are checked by kernels::validate at construction (head_dim 64 or 128,
// sm_90). Non-causal only: the IR has no causal attention.
//
// Limits (checked, tessera::Error before anything is launched, naming
// GpuExecutorOptions::schedule when set): GEMM and attention plans;
// meshes whose size equals the communicator's, one-level for GEMM; GEMM collectives
// need equal, contiguous, full-width row blocks in rank order (extents
// divisible by the world size); no AllToAll; a bf16 partial merge needs row
// widths that are multiples of 8 elements. output() and the destructor wait
// at most TESSERA_WAIT_TIMEOUT_MS (an NCCL call whose peer never issues it
// is reported, not waited for forever).
//
// Overlap: a GEMM issued while NCCL kernels of this rank are in flight (not
// yet waited for by the compute stream) is sized by cuBLASLt for all SMs but
// TESSERA_COMMIR_COMM_SMS (default 8, measured faster than 16 for the AsyncTP
// GEMM+RS plan on nvidia-h200-x2; 0 = all SMs; GpuExecutorOptions::
// comm_sms overrides it), so the communication kernels find free SMs instead
// of waiting for a persistent GEMM to retire.
//
// B layout: by default B's blocks are stored [n, k] (the weight layout the
// hand-built operators take; cuBLASLt "TN", K-major operands) wherever the
// plan never moves B (GpuProgramOptions::b_nk); set_input transposes on upload.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessera/commir/plan.hpp"

namespace tessera::commir {

struct GpuExecutorOptions {
  /// SMs a GEMM leaves to NCCL kernels in flight; -1 = TESSERA_COMMIR_COMM_SMS (default 8).
  int comm_sms = -1;
  /// Store B as [n, k] where the plan allows (see GpuProgramOptions::b_nk).
  bool b_nk = true;
  /// The schedule's name, for messages (GpuProgramOptions::schedule).
  std::string schedule;
};

class GpuExecutor {
 public:
  /// `comm` and the streams belong to the caller; `rank` is this process's rank.
  GpuExecutor(const Plan& plan, int rank, ncclComm_t comm, cudaStream_t compute, cudaStream_t comm_stream,
              const GpuExecutorOptions& opts = {});
  ~GpuExecutor();
  GpuExecutor(const GpuExecutor&) = delete;
  GpuExecutor& operator=(const GpuExecutor&) = delete;

  /// Uploads this rank's initial region of input `name` from the full
  /// row-major host tensor (float values, converted to bf16; attention
  /// buffers [dims..., head_dim]).
  void set_input(const std::string& name, const std::vector<float>& full);
  /// Issues every step of this rank's plan (asynchronous on the streams).
  void run();
  /// Fills every non-input block with NaN (compute stream, after all issued
  /// work): a test's proof that the next run() writes what it reads back.
  void poison();
  /// Device memory of this rank's blocks (the plan's footprint as run here).
  std::int64_t device_bytes() const;
  /// Whether B is stored [n, k] in this run (the option and the plan allow it).
  bool b_nk() const;
  /// Waits for completion and returns this rank's required final region of
  /// output `name` as (box, row-major values) pairs (attention: [box..., head_dim]).
  std::vector<std::pair<Box, std::vector<float>>> output(const std::string& name);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::commir
