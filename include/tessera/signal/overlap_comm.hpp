// tessera/signal/overlap_comm.hpp — the NCCL communicator the signal-based
// overlap runs its per-group collectives on: a split of the process group's
// communicator whose kernels fit on the SMs the persistent GEMM leaves free.
//
// Why (docs/design/signal.md): NCCL 2.28's defaults on sm_90 are up to 32
// CTAs per collective (maxCTAs 32) launched as thread-block clusters of 4
// (cgaClusterSize 4). A persistent GEMM holding sms - nccl_sms SMs with one
// CTA each (≈ all shared memory) leaves nccl_sms SMs free, scattered over
// the GPCs; a 4-CTA cluster needs 4 free SMs in one GPC and 32 CTAs need 32
// SMs, so the group collectives cannot start (or not all their channels)
// until the GEMM's CTAs retire, and the overlapped time is then the engine
// GEMM plus the sum of every group's collective.
// This communicator has maxCTAs = nccl_sms and no clusters
// (cgaClusterSize 0), so each group's collective fits beside the GEMM.
//
// Collective: every rank of `parent` must construct it together, in the same
// order relative to other NCCL calls on `parent` (ncclCommSplit). Set
// NCCL_RUNTIME_CONNECT=0 before creating the parent (or call warm() on the
// pattern before overlapping) so no channel connects lazily inside an
// enqueue that sits behind a counter wait (comm_driver.hpp).
// Destruction: ncclCommFinalize + ncclCommDestroy (abort on failure); while
// an exception unwinds (a stuck wait), the communicator is aborted instead
// (finalize could wait forever on a stuck stream).
#pragma once

#include <nccl.h>

namespace tessera::signal {

struct OverlapCommConfig {
  /// Maximum CTAs (channels) of one collective: the SMs left to NCCL.
  int max_ctas = 16;
  /// Minimum CTAs; 0 leaves NCCL's default (1).
  int min_ctas = 0;
  /// Thread-block cluster size of NCCL's kernels; 0 = no clusters.
  int cga_cluster_size = 0;
};

class OverlapComm {
 public:
  /// Splits `parent` (all ranks, same key order) with `cfg`. Throws
  /// tessera::Error on a bad config (max_ctas outside [1, 64], min_ctas >
  /// max_ctas, cluster size outside [0, 8]) before any NCCL call.
  OverlapComm(ncclComm_t parent, const OverlapCommConfig& cfg);
  ~OverlapComm();
  OverlapComm(const OverlapComm&) = delete;
  OverlapComm& operator=(const OverlapComm&) = delete;

  ncclComm_t get() const { return comm_; }
  /// ncclCommAbort now (after a peer failure, when the parent was aborted):
  /// the destructor's collective finalize would wait for the dead peer.
  void abort();
  const OverlapCommConfig& config() const { return cfg_; }

 private:
  ncclComm_t comm_ = nullptr;
  OverlapCommConfig cfg_;
};

}  // namespace tessera::signal
