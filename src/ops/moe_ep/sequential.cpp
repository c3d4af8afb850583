// moe_ep sequential: the dispatch with every peer in one NCCL group, the
// experts slab by slab, then the return (docs/design/moe_ep.md).
#include "moe_ep.hpp"

namespace tessera::ops::moeep {

// Sequential: dispatch (counts and slabs with every peer, one NCCL group),
// the experts slab by slab, then the return.
void EpCall::run_sequential() const {
  if (R > 1) {
    TESSERA_NCCL_CHECK(ncclGroupStart());
    for (int q = 0; q < R; ++q) {
      if (q == rank) continue;
      TESSERA_NCCL_CHECK(ncclSend(l.block_counts + q * El, static_cast<std::size_t>(El), ncclInt32, q, pg.nccl(), s));
      TESSERA_NCCL_CHECK(ncclRecv(recv_counts + q * El, static_cast<std::size_t>(El), ncclInt32, q, pg.nccl(), s));
      TESSERA_NCCL_CHECK(ncclSend(slab(send, q, H), slab_h, dt, q, pg.nccl(), s));
      TESSERA_NCCL_CHECK(ncclRecv(slab(recv, q, H), slab_h, dt, q, pg.nccl(), s));
    }
    TESSERA_NCCL_CHECK(ncclGroupEnd());
  }
  for (int q = 0; q < R; ++q) {
    gemm(q, false, false);
    gemm(q, true, false);
  }
  if (R > 1) {
    TESSERA_NCCL_CHECK(ncclGroupStart());
    for (int q = 0; q < R; ++q) {
      if (q == rank) continue;
      TESSERA_NCCL_CHECK(ncclSend(slab(yexp, q, H), slab_h, dt, q, pg.nccl(), s));
      TESSERA_NCCL_CHECK(ncclRecv(slab(ret, q, H), slab_h, dt, q, pg.nccl(), s));
    }
    TESSERA_NCCL_CHECK(ncclGroupEnd());
  }
}

namespace {

void run(MoeEpContext& ctx, const MoeEpArgs& a, const MoeEpOptions& o, MoeTransport) {
  EpCall call(ctx.group(), ctx.impl(), a, o, moe_ep_capacity(a));
  call.route();
  call.run_sequential();
  call.combine();
}

}  // namespace

const Entry sequential{.strategy = Strategy::sequential, .needs = {}, .launch = &run};

}  // namespace tessera::ops::moeep
