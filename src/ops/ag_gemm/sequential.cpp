// AG+GEMM sequential: ncclAllGather into the workspace, then one cuBLASLt
// GEMM (with swiglu: then the SiLU·up kernel). The only strategy without
// load/store reach.
#include <nccl.h>

#include "ag_gemm.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops::ag {

namespace {

void run(TpContext::Impl& c, const AgGemmArgs& a, const OpOptions& o) {
  Call k = begin(c, a, o.channels);
  k.epoch = ++c.ag_epoch;
  // Equal, packed shards: NCCL gathers straight from A (no copy-in; every
  // rank sends per_rank rows, so every shard must be full).
  const bool direct_gather = k.lda == a.k && a.m % k.world == 0;
  stage_shard(k, direct_gather);
  const void* send = direct_gather ? a.a : static_cast<const void*>(k.my_rows());
  TESSERA_NCCL_CHECK(ncclAllGather(send, k.ws, static_cast<std::size_t>(k.plan.shards.per_rank * a.k),
                                   runtime::nccl_dtype(a.dtype), c.pg.nccl(), k.st));
  local_gemm(a, k.ws, a.m, a.d, k.tmp, k.st);
  finish(k, {.from_input = false, .join_comm = false, .notify = true});
}

}  // namespace

const TpStrategy<AgGemmArgs> sequential{.strategy = Strategy::sequential, .needs = {}, .launch = &run};

}  // namespace tessera::ops::ag
