// moe_tp sequential: one all-gather, one expert sort of all tokens, one
// grouped GEMM pair, one combine, one reduce-scatter (docs/design/moe_tp.md).
#include <nccl.h>

#include "moe_tp.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops::moetp {

/// Sequential: one all-gather, one expert sort of all R·T_l tokens, one
/// grouped GEMM pair, one combine, one reduce-scatter.
void run_sequential(Call& c) {
  const MoeTpArgs& a = c.a;
  const std::int64_t T = c.Tl * c.R, entries = T * c.k;
  runtime::ProcessGroup& pg = c.pg;
  // One NCCL group: the three all-gathers are one launch.
  TESSERA_NCCL_CHECK(ncclGroupStart());
  TESSERA_NCCL_CHECK(ncclAllGather(a.x_shard, c.x_full, static_cast<std::size_t>(c.Tl * c.H),
                                   runtime::nccl_dtype(a.dtype), pg.nccl(), c.s));
  TESSERA_NCCL_CHECK(
      ncclAllGather(a.expert_ids, c.ids_full, static_cast<std::size_t>(c.per), ncclInt32, pg.nccl(), c.s));
  TESSERA_NCCL_CHECK(ncclAllGather(a.weights, c.w_full, static_cast<std::size_t>(c.per), ncclFloat32, pg.nccl(), c.s));
  TESSERA_NCCL_CHECK(ncclGroupEnd());
  // Table slot 0 holds the whole layer's sort (rows 0 .. T·k).
  c.permute(c.ids_full, T, 0);
  c.gate_up(c.x_full, T, 0, entries, 0);
  c.down(0, entries, 0);
  c.combine(0, T, c.w_full, c.partial);
  TESSERA_NCCL_CHECK(ncclReduceScatter(c.partial, a.out_shard, static_cast<std::size_t>(c.Tl * c.H),
                                       runtime::nccl_dtype(a.dtype), ncclSum, pg.nccl(), c.s));
  c.m.last_status_shards = entries > 0 ? 1 : 0;
}

namespace {

void run(MoeContext& ctx, const MoeTpArgs& a, const MoeTpOptions& o) {
  Call c(ctx.group(), ctx.impl(), a, o);
  run_sequential(c);
}

}  // namespace

const Entry sequential{.strategy = Strategy::sequential, .needs = {}, .launch = &run};

}  // namespace tessera::ops::moetp
