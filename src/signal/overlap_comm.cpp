#include "tessera/signal/overlap_comm.hpp"

#include <exception>

#include "tessera/runtime/error.hpp"

namespace tessera::signal {

OverlapComm::OverlapComm(ncclComm_t parent, const OverlapCommConfig& cfg) : cfg_(cfg) {
  TESSERA_CHECK(cfg.max_ctas >= 1 && cfg.max_ctas <= 64, "signal::OverlapComm: max_ctas {} outside [1, 64]",
                cfg.max_ctas);
  TESSERA_CHECK(cfg.min_ctas >= 0 && cfg.min_ctas <= cfg.max_ctas,
                "signal::OverlapComm: min_ctas {} outside [0, max_ctas = {}]", cfg.min_ctas, cfg.max_ctas);
  TESSERA_CHECK(cfg.cga_cluster_size >= 0 && cfg.cga_cluster_size <= 8,
                "signal::OverlapComm: cga_cluster_size {} outside [0, 8]", cfg.cga_cluster_size);
  TESSERA_CHECK(parent != nullptr, "signal::OverlapComm: null parent communicator");
  int rank = 0;
  TESSERA_NCCL_CHECK(ncclCommUserRank(parent, &rank));
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 1;
  c.maxCTAs = cfg.max_ctas;
  // NCCL rejects minCTAs > maxCTAs; its default minimum is 1.
  c.minCTAs = cfg.min_ctas > 0 ? cfg.min_ctas : 1;
  c.cgaClusterSize = cfg.cga_cluster_size;
  // Own channels and buffers: sharing the parent's would share its (32) channels.
  c.splitShare = 0;
  TESSERA_NCCL_CHECK(ncclCommSplit(parent, /*color=*/0, /*key=*/rank, &comm_, &c));
  TESSERA_CHECK(comm_ != nullptr, "signal::OverlapComm: ncclCommSplit returned no communicator for rank {}", rank);
}

void OverlapComm::abort() {
  if (comm_ != nullptr) (void)ncclCommAbort(comm_);
  comm_ = nullptr;
}

OverlapComm::~OverlapComm() {
  if (comm_ == nullptr) return;
  if (std::uncaught_exceptions() > 0) {
    (void)ncclCommAbort(comm_);
    return;
  }
  if (ncclCommFinalize(comm_) != ncclSuccess || ncclCommDestroy(comm_) != ncclSuccess) (void)ncclCommAbort(comm_);
}

}  // namespace tessera::signal
