// AG+GEMM fused_ce: the engine GEMM with per-tile waits on the channels'
// flags, my shard pushed to every peer on the copy engine. With a packed A
// whose shard starts on a tile row the kernel reads my rows in place through
// a second TMA map (AgPrologue::a_source) and the pushes read A, so no
// copy-in precedes them; TESSERA_AG_LOCAL_A=0 keeps the copy-in (an A/B
// switch). OpOptions::diag_kernel_only replays the last fused_ce epoch with
// no communication at all (tp_mlp.hpp).
#include "../tp_launchers.hpp"
#include "ag_gemm.hpp"
#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops::ag {

namespace {

void run(TpContext::Impl& c, const AgGemmArgs& a, const OpOptions& o) {
  Call k = begin(c, a, o.channels);
  const bool kernel_only = o.diag_kernel_only;
  TESSERA_CHECK(!kernel_only || (c.ag_ce_epoch > 0 && c.ag_ce_channels == k.plan.channels),
                "ag_gemm: diag_kernel_only needs strategy fused_ce after a normal fused_ce call with the same "
                "channels (last fused_ce epoch {}, channels {} vs {})",
                c.ag_ce_epoch, k.plan.channels, c.ag_ce_channels);
  k.epoch = kernel_only ? c.ag_ce_epoch : ++c.ag_epoch;
  if (!kernel_only) {
    c.ag_ce_epoch = k.epoch;
    c.ag_ce_channels = k.plan.channels;
  }
  static const bool local_a_on = env::find_int("TESSERA_AG_LOCAL_A", 0, 1).value_or(1) != 0;
  const bool from_input = k.lda == a.k && local_a_on && detail::ag_local_rows_on_tiles(k.lo, a.m_local, a.m);
  stage_shard(k, from_input);
  fork_comm(k);
  if (!kernel_only) push_copy_engine(k, from_input ? static_cast<const unsigned char*>(a.a) : k.my_rows());
  launch_fused(k, 0, from_input);
  finish(k, {.from_input = from_input, .join_comm = true, .notify = !kernel_only});
}

}  // namespace

const TpStrategy<AgGemmArgs> fused_ce{
    .strategy = Strategy::fused_ce, .needs = {.lsa = true}, .launch = &run, .diag_kernel_only = true};

}  // namespace tessera::ops::ag
