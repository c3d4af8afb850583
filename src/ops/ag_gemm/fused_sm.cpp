// AG+GEMM fused_sm: the fused_ce kernel, my shard (copied into the
// workspace) pushed to every peer by comm_ctas CTAs of the push kernel,
// channel by channel, each followed by a flag store.
#include "../tp_launchers.hpp"
#include "ag_gemm.hpp"
#include "tessera/link/host_primitives.hpp"

namespace tessera::ops::ag {

namespace {

void run(TpContext::Impl& c, const AgGemmArgs& a, const OpOptions& o) {
  Call k = begin(c, a, o.channels);
  k.epoch = ++c.ag_epoch;
  stage_shard(k, false);
  fork_comm(k);
  cudaStream_t cs = c.comm();
  detail::PushLaunch p;
  for (int r = 0; r < k.world; ++r) p.ws[r] = c.ag_ws.peer(r);
  p.lo = k.lo;
  p.rows = a.m_local;
  p.row_bytes = k.row_bytes;
  p.channels = k.plan.channels;
  p.rows_per_channel = k.plan.map.m_per_channel;
  p.steps = static_cast<int>(k.plan.push_to.size());
  for (int j = 0; j < p.steps; ++j) {
    p.push_to[j] = k.plan.push_to[j];
    if (k.epoch > 1) link::rank_wait(cs, *c.control, k.plan.push_to[j], kAgFree, k.epoch - 1);
  }
  p.sv = c.ag_flags->view();
  p.epoch = k.epoch;
  p.done = static_cast<unsigned*>(c.push_done.get());
  // The pusher is launched before the GEMM and the GEMM leaves it
  // comm_ctas SMs, so both are resident whatever the launch order.
  detail::launch_push(p, o.comm_ctas, cs);
  launch_fused(k, c.pg.sm_count() - o.comm_ctas, false);
  finish(k, {.from_input = false, .join_comm = true, .notify = true});
}

}  // namespace

const TpStrategy<AgGemmArgs> fused_sm{.strategy = Strategy::fused_sm, .needs = {.lsa = true}, .launch = &run};

}  // namespace tessera::ops::ag
