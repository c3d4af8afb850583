// sp_attention ulysses: Ulysses attention (ulysses_attention.hpp, sequential)
// on the same shards, through the context's UlyssesAttnContext; heads_q and
// heads_kv must be multiples of the world size.
#include "sp_attention.hpp"

namespace tessera::ops::sp {

namespace {

void run(SpAttnContext::Impl& c, const SpAttnArgs& a, int /*u*/) {
  if (!c.ulysses) c.ulysses = std::make_unique<UlyssesAttnContext>(c.pg);
  ulysses_attention(*c.ulysses, a, UlyssesStrategy::sequential);
}

std::size_t workspace(const SpAttnArgs& a, int world, int /*u*/) {
  return ulysses_attention_workspace_bytes(a, world, 1);
}

}  // namespace

const SpStrategyEntry ulysses{.strategy = Strategy::ulysses,
                              .needs = {.min_world = 2, .lsa = true, .heads_divide = true},
                              .launch = &run,
                              .info = {.workspace = &workspace}};

}  // namespace tessera::ops::sp
