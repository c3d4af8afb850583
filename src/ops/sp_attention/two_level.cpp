// sp_attention two_level: Ulysses inside groups of u ranks, the ring across
// the R / u groups (two_level_attention.hpp, ring overlapped), through the
// context's TwoLevelAttnContext. The tuner measures it only where 1 < u < R
// (at u = 1 or u = R it is the ring or Ulysses), so from R = 4.
#include "sp_attention.hpp"

namespace tessera::ops::sp {

namespace {

void run(SpAttnContext::Impl& c, const SpAttnArgs& a, int u) {
  if (!c.two_level) c.two_level = std::make_unique<TwoLevelAttnContext>(c.pg);
  two_level_attention(*c.two_level, a, u, RingStrategy::overlapped);
}

std::size_t workspace(const SpAttnArgs& a, int world, int u) {
  return two_level_attention_workspace_bytes(a, world, u);
}

}  // namespace

const SpStrategyEntry two_level{.strategy = Strategy::two_level,
                                .needs = {.min_world = 4, .lsa = true, .two_level_mesh = true},
                                .launch = &run,
                                .info = {.workspace = &workspace}};

}  // namespace tessera::ops::sp
