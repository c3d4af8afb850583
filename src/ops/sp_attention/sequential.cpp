// sp_attention sequential: NCCL all-gathers the K and V shards into staging,
// copies reorder them into global order in the workspace, then the plain
// kernel runs per part.
#include <nccl.h>

#include "sp_attention.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops::sp {

namespace {

void run(SpAttnContext::Impl& c, const SpAttnArgs& a, int /*u*/) {
  const Call k = begin(c, a);
  const int R = k.world;
  const std::size_t shard = static_cast<std::size_t>(k.B * k.L) * k.kv_row;
  unsigned char* stg = static_cast<unsigned char*>(c.staging.get(2 * R * shard, c.pg));
  // NCCL gathers whole shards (rank s at s * shard); B > 1 shards are
  // [B, 2C] blocks, so the reorder below walks (rank, chunk) pairs.
  TESSERA_NCCL_CHECK(ncclGroupStart());
  TESSERA_NCCL_CHECK(ncclAllGather(a.k, stg, shard, ncclUint8, c.pg.nccl(), k.st));
  TESSERA_NCCL_CHECK(ncclAllGather(a.v, stg + R * shard, shard, ncclUint8, c.pg.nccl(), k.st));
  TESSERA_NCCL_CHECK(ncclGroupEnd());
  wait_peers_done(k, k.st);  // no push of an earlier fused call still lands in the workspace
  for (int s = 0; s < R; ++s) {
    const SpAttnPlan ps = plan_sp_attention(a.seq, R, s, a.causal);
    for (int i = 0; i < 2; ++i) {
      copy_chunk(k.st, k.ws_k, stg + s * shard, i, ps.chunks[i] * k.C, k.B, k.C, k.S, k.kv_row);
      copy_chunk(k.st, k.ws_v, stg + (R + s) * shard, i, ps.chunks[i] * k.C, k.B, k.C, k.S, k.kv_row);
    }
  }
  run_parts(k, false);
  finish(k);
}

/// The gathered K and V, and NCCL's staging of both.
std::size_t workspace(const SpAttnArgs& a, int /*world*/, int /*u*/) { return 4 * gathered_kv_bytes(a); }

}  // namespace

const SpStrategyEntry sequential{
    .strategy = Strategy::sequential, .needs = {}, .launch = &run, .info = {.workspace = &workspace}};

}  // namespace tessera::ops::sp
