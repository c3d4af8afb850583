// sp_attention fused_ce: this rank's chunks copied into its own workspace on
// a second communication stream, flagged piece by piece like a peer's (the
// compute stream when there is only one); on the first, per step, its chunks
// pushed into the destination's workspace on the copy engine (after that
// peer said its workspace is free), in head groups, each piece followed by a
// flag; the kernel per part waits per KV block for the pieces of its head
// that the block covers.
#include "sp_attention.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops::sp {

namespace {

void run(SpAttnContext::Impl& c, const SpAttnArgs& a, int /*u*/) {
  const Call k = begin(c, a);
  const std::uint64_t e = k.epoch;
  // Everything below waits for the inputs and for this rank's last kernel
  // (done reading the workspace), nothing more: the pushes do not wait for
  // the own copy, and the kernel does not wait for either.
  TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_ready, k.st));
  // Own chunks on a second communication stream, piece by piece, each
  // followed by a flag on this rank's own row, so the kernel starts at once
  // and its first wave waits only for its heads' pieces.
  // TESSERA_SP_OWN_FLAGS=0 (measurement): the own copy on the compute stream.
  static const bool own_flags_on = env::find_int("TESSERA_SP_OWN_FLAGS", 0, 1).value_or(1) != 0;
  const bool own_flags = own_flags_on && k.world > 1 && c.pg.comm_stream_count() > 1;
  if (own_flags) {
    cudaStream_t os = c.pg.comm_stream(1);
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(os, c.ev_ready, 0));
    for (int g = 0; g < k.head_groups; ++g)
      for (int i = 0; i < 2; ++i) {
        copy_chunk_heads(k, os, k.ws_k, a.k, i, k.plan.chunks[i] * k.C, g);
        copy_chunk_heads(k, os, k.ws_v, a.v, i, k.plan.chunks[i] * k.C, g);
        link::rank_notify(os, *c.data, k.rank, i * k.head_groups + g, e);
      }
    TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_own_done, os));
  } else {
    copy_own(k, k.st);
  }
  if (k.world > 1) {
    // Pushes on the communication stream, after the inputs are ready.
    cudaStream_t cs = c.pg.comm_stream(0);
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, c.ev_ready, 0));
    for (int dst : k.plan.push_to) {
      if (e > 1) link::rank_wait(cs, *c.control, dst, 0, e - 1);  // dst is done with the last call's KV
      unsigned char* pk = c.ws.peer(dst);
      unsigned char* pv = pk + k.kv_bytes;
      // Head group by head group (the kernel's CTAs run head-major), each
      // group's two chunks before the next group's.
      for (int g = 0; g < k.head_groups; ++g)
        for (int i = 0; i < 2; ++i) {
          copy_chunk_heads(k, cs, pk, a.k, i, k.plan.chunks[i] * k.C, g);
          copy_chunk_heads(k, cs, pv, a.v, i, k.plan.chunks[i] * k.C, g);
          link::rank_notify(cs, *c.data, dst, i * k.head_groups + g, e);
        }
    }
    TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_comm_done, cs));
  }
  run_parts(k, true, own_flags);
  if (k.world > 1) TESSERA_CUDA_CHECK(cudaStreamWaitEvent(k.st, c.ev_comm_done, 0));
  if (own_flags) TESSERA_CUDA_CHECK(cudaStreamWaitEvent(k.st, c.ev_own_done, 0));
  finish(k);
}

/// The gathered K and V.
std::size_t workspace(const SpAttnArgs& a, int /*world*/, int /*u*/) { return 2 * gathered_kv_bytes(a); }

}  // namespace

const SpStrategyEntry fused_ce{.strategy = Strategy::fused_ce,
                               .needs = {.min_world = 2, .lsa = true},
                               .launch = &run,
                               .info = {.workspace = &workspace}};

}  // namespace tessera::ops::sp
