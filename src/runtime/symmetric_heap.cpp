#include "tessera/runtime/symmetric_heap.hpp"

#include <bit>

#include "tessera/runtime/error.hpp"

namespace tessera::runtime {

SymAllocation::SymAllocation(ProcessGroup& pg, std::size_t bytes, std::size_t alignment) : pg_(&pg) {
  TESSERA_CHECK(bytes > 0, "symmetric allocation of 0 bytes");
  TESSERA_CHECK(std::has_single_bit(alignment) && alignment <= NCCL_WIN_REQUIRED_ALIGNMENT,
                "symmetric allocation alignment {} is not a power of two <= {}", alignment,
                NCCL_WIN_REQUIRED_ALIGNMENT);
  TESSERA_CHECK(pg.lsa_reachable(),
                "symmetric memory needs every rank load/store reachable, but only {} of {} ranks are in this "
                "rank's NVLink/P2P domain (different nodes or no peer access)",
                pg.lsa_size(), pg.world());
  TESSERA_CHECK(pg.world() <= kMaxPeers, "symmetric memory supports at most {} ranks, world is {}", kMaxPeers,
                pg.world());
  // Round to the window granularity: equal sizes on all ranks are required.
  const std::size_t rounded =
      (bytes + NCCL_WIN_REQUIRED_ALIGNMENT - 1) / NCCL_WIN_REQUIRED_ALIGNMENT * NCCL_WIN_REQUIRED_ALIGNMENT;
  std::size_t free_b = 0, total_b = 0;
  TESSERA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  // Check locally and agree globally before any rank calls the collective
  // registration, so an oversized request fails on every rank, not hangs.
  const std::uint64_t ok = rounded <= free_b ? 1 : 0;
  const auto oks = pg.allgather(ok);
  for (int r = 0; r < pg.world(); ++r) {
    TESSERA_CHECK(oks[r], "symmetric allocation of {} bytes does not fit on rank {} ({} bytes free on rank {})",
                  rounded, r, free_b, pg.rank());
  }
  pg.check_same_on_all_ranks(fmt::format("symmetric allocation size ({} bytes on rank {})", bytes, pg.rank()),
                             static_cast<std::uint64_t>(rounded));

  TESSERA_NCCL_CHECK(ncclMemAlloc(&base_, rounded));
  bytes_ = bytes;
  try {
    TESSERA_NCCL_CHECK(ncclCommWindowRegister(pg.nccl(), base_, rounded, &win_, NCCL_WIN_COLL_SYMMETRIC));
    peers_ = detail::resolve_peer_pointers(win_, pg.world(), pg.stream());
  } catch (...) {
    if (win_) (void)ncclCommWindowDeregister(pg.nccl(), win_);
    (void)ncclMemFree(base_);
    throw;
  }
  // NCCL maps every rank's buffer, this rank's included, into one flat
  // window range: its address for this rank is an alias of base_ (same
  // physical memory). Keep the allocation's own address for local use.
  peers_[pg.rank()] = base_;
}

SymAllocation::~SymAllocation() {
  // Deregistration is collective; after an abort only the memory is freed.
  if (win_ && !pg_->aborted()) (void)ncclCommWindowDeregister(pg_->nccl(), win_);
  if (base_) (void)ncclMemFree(base_);
}

void* SymAllocation::peer(int r) const {
  TESSERA_CHECK(r >= 0 && r < static_cast<int>(peers_.size()), "peer rank {} out of range [0, {})", r, peers_.size());
  return peers_[r];
}

}  // namespace tessera::runtime
