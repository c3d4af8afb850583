// sp_attention fused_ce. The kernel is queued first; then, on the
// communication stream, this rank's shard is pushed into each peer's
// workspace on the copy engine (after that peer said its workspace is
// free), head group by head group, each piece followed by its flag; the
// kernel waits per KV block for the pieces of its head that the block
// covers. choose_fused_layout picks how (sp_attention.hpp):
//   table wait (the default where the chunks are at least a KV block): the
//     own data copied into the workspace on the compute stream, the blocks
//     in the kernel's descending order, ops/sp_kv_table_wait.cuh's waits;
//     non-causal in the shard layout (own shard last: visited first),
//     causal in global order (descending visits the own diagonal chunk
//     first, then the chunks below it as their owners' pushes arrive);
//   chunk walk (short chunks, or the A/B knobs): global order, the own
//     chunks read in place from the caller's K and V except the rows of KV
//     blocks that straddle another chunk (TESSERA_SP_OWN_IN_PLACE=0: the
//     whole chunks copied), blocks in arrival order, the engine's timed
//     flag wait.
#include "sp_attention.hpp"
#include "../sp_attention_kernels.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops::sp {

namespace {

void run(SpAttnContext::Impl& c, const SpAttnArgs& a, int /*u*/) {
  Call k = begin(c, a);
  static const bool arrival = env::find_int("TESSERA_SP_ARRIVAL_ORDER", 0, 1).value_or(1) != 0;
  k.arrival_order = arrival;
  choose_fused_layout(k);  // per call: tests switch its knobs between calls
  const std::uint64_t e = k.epoch;
  // The pushes wait for the inputs, not for the own copy below. The own
  // copy stays stream-ordered before the kernel: flagged beside it, a local
  // pitched copy may run on SMs and starve behind a grid spinning on its
  // flags (the kernel's flag wait then times out).
  TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_ready, k.st));
  if (k.own_in_place)
    copy_own_edges(k, k.st);
  else
    copy_own(k, k.st);
  // The kernel is queued before the pushes: their host calls (two copies and
  // a flag per head group and peer) would otherwise delay
  // its launch whenever the GPU is not behind the host. It waits only for
  // the peers' pushes, and pushes and flags need no SM (copy engine, stream
  // memory operations), so it cannot hold back its own rank's.
  run_parts(k, true);
  if (k.world > 1) {
    // Pushes on the communication stream, after the inputs are ready and
    // after each peer is done with the last call's KV. Head group by head
    // group across the peers: the kernel's CTAs run head-major, so every
    // peer's first group lands first. (A stream per peer, copies to the
    // peers at once, measured slower: docs/design/attention.md.)
    cudaStream_t cs = c.pg.comm_stream(0);
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, c.ev_ready, 0));
    if (e > 1)
      for (int dst : k.plan.push_to) link::rank_wait(cs, *c.control, dst, 0, e - 1);
    for (int g = 0; g < k.head_groups; ++g)
      for (int dst : k.plan.push_to) {
        unsigned char* pk = c.ws.peer(dst);
        copy_heads(k, cs, pk, a.k, dst, g);
        copy_heads(k, cs, pk + k.kv_bytes, a.v, dst, g);
        link::rank_notify(cs, *c.data, dst, detail::sp_kv_flag_slot(g), e);
      }
    TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_comm_done, cs));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(k.st, c.ev_comm_done, 0));
  }
  finish(k);
  c.last_fused = {k.epoch, a, k.table_wait};
}

/// The gathered K and V.
std::size_t workspace(const SpAttnArgs& a, int /*world*/, int /*u*/) { return 2 * gathered_kv_bytes(a); }

}  // namespace

const SpStrategyEntry fused_ce{.strategy = Strategy::fused_ce,
                               .needs = {.min_world = 2, .lsa = true},
                               .launch = &run,
                               .info = {.workspace = &workspace}};

}  // namespace tessera::ops::sp

namespace tessera::ops {

void sp_attention_diag_fused_kernel(SpAttnContext& ctx, const SpAttnArgs& a, unsigned variant) {
  SpAttnContext::Impl& c = ctx.impl();
  const auto& [epoch, last, table_wait] = c.last_fused;
  const bool same = epoch != 0 && epoch == c.epoch && last == a;
  TESSERA_CHECK(same && c.pg.world() > 1,
                "sp_attention_diag_fused_kernel: the context's last call was not fused_ce with these arguments at "
                "world > 1 (its flags and gathered KV are what the kernel re-reads)");
  TESSERA_CHECK(!runtime::stream_capturing(c.pg.stream()),
                "sp_attention_diag_fused_kernel cannot be captured into a CUDA graph (it replays the flags of the last "
                "eager call)");
  TESSERA_CHECK((variant & ~(kSpDiagDescending | kSpDiagOwnFromWorkspace | kSpDiagPlainKernel)) == 0,
                "sp_attention_diag_fused_kernel: unknown variant bits {:#x}", variant);
  // begin() starts a new epoch; the replay keeps the last one, whose flags
  // are set on this rank and whose workspace no peer writes until every rank
  // starts its next call.
  sp::Call k = sp::begin(c, a);
  k.epoch = --c.epoch;
  k.table_wait = table_wait;
  k.own_in_place = !table_wait && (variant & kSpDiagOwnFromWorkspace) == 0;
  k.arrival_order = (variant & kSpDiagDescending) == 0;
  sp::run_parts(k, (variant & kSpDiagPlainKernel) == 0);
}

}  // namespace tessera::ops
