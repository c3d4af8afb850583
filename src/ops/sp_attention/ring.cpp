// sp_attention ring: ring attention (ring_attention.hpp, overlapped) on the
// same shards, through the context's RingAttnContext.
#include "sp_attention.hpp"

namespace tessera::ops::sp {

namespace {

void run(SpAttnContext::Impl& c, const SpAttnArgs& a, int /*u*/) {
  if (!c.ring) c.ring = std::make_unique<RingAttnContext>(c.pg);
  ring_attention(*c.ring, a, RingStrategy::overlapped);
}

std::size_t workspace(const SpAttnArgs& a, int world, int /*u*/) { return ring_attention_workspace_bytes(a, world); }

}  // namespace

const SpStrategyEntry ring{.strategy = Strategy::ring,
                           .needs = {.min_world = 2, .lsa = true},
                           .launch = &run,
                           .info = {.workspace = &workspace}};

}  // namespace tessera::ops::sp
