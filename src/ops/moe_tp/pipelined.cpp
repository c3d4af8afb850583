// moe_tp pipelined: per-token-shard grouped GEMMs beside the all-gather
// and reduce-scatter steps, over NCCL or the copy engine
// (docs/design/moe_tp.md).
#include <nccl.h>

#include <algorithm>

#include "moe_tp.hpp"
#include "tessera/ops/plan.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops::moetp {

namespace {

/// Pipelined (plan_moe_tp): table slot q = shard q; see the header comment.
/// Part 2 runs in `chunks` column chunks of hidden (Hc columns each): a
/// remote shard's partial is laid out chunk-major ([chunks][T_l][Hc], so
/// each chunk is one contiguous message) and so is each receive slab.
/// `sym` (copy_engine): the layout of m.sym, where peers push; nullptr: NCCL.
void run_pipelined(Call& c, int comm_ctas, int chunks, const SymLayout* sym) {
  const MoeTpArgs& a = c.a;
  runtime::ProcessGroup& pg = c.pg;
  MoeContext::Impl& m = c.m;
  const int R = c.R, rank = c.rank;
  const bool ce = sym != nullptr;
  const MoeTpPlan plan = plan_moe_tp(c.Tl, a.topk, R, rank);
  const cudaStream_t s = c.s, cs = pg.comm_stream(0);
  const ncclComm_t comm = ce ? nullptr : m.pipe.get();
  const ncclDataType_t dt = runtime::nccl_dtype(a.dtype);
  const std::size_t shard_elems = static_cast<std::size_t>(c.Tl * c.H), shard_bytes = shard_elems * c.es;
  const std::int64_t Hc = c.H / chunks;
  const std::size_t chunk_elems = static_cast<std::size_t>(c.Tl * Hc), chunk_bytes = chunk_elems * c.es;
  const std::size_t route_bytes = static_cast<std::size_t>(c.per) * 4;
  // The copy engine takes no SM: GEMMs beside its transfers keep them all.
  const int beside_ctas = ce ? 0 : pg.sm_count() - comm_ctas;
  const std::uint64_t e = ce ? ++m.epoch : 0;
  auto x_of = [&](int q) -> const void* {
    return q == rank ? a.x_shard : static_cast<const void*>(c.x_full + static_cast<std::size_t>(q) * shard_bytes);
  };
  auto ids_of = [&](int q) { return q == rank ? a.expert_ids : c.ids_full + q * c.per; };
  auto w_of = [&](int q) { return q == rank ? a.weights : c.w_full + q * c.per; };
  auto partial_chunk = [&](int q, int ch) { return c.partial + q * shard_bytes + ch * chunk_bytes; };
  // RS slabs 0..R-2, chunk-major; with the copy engine they are where peers push.
  unsigned char* recv =
      ce ? m.sym.local() + sym->recv : static_cast<unsigned char*>(m.recv.get((R - 1) * shard_bytes + 16, pg));
  auto recv_chunk = [&](unsigned char* base, int slab, int ch) { return base + slab * shard_bytes + ch * chunk_bytes; };

  // Communication stream, part 1: step d's tokens and their routing. It
  // starts after the caller's inputs (ev_start). Over the copy engine, the
  // host enqueues the own shard's sort and gate/up before anything on the
  // communication stream, its wait for ev_start included: the start of a
  // call is host-bound, and the token push (shorter than the own gate/up
  // where pipelining pays) still lands before the gate/up ends.
  TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_start, s));
  if (!ce) TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, m.ev_start, 0));
  // `to` said it no longer reads what I pushed in the last call; then my
  // shard into its slot `rank`.
  auto push_tokens = [&](int to) {
    if (e > 1) link::rank_wait(cs, *m.control, to, 0, e - 1);
    link::rank_copy_data(cs, m.sym.peer(to) + sym->x + rank * shard_bytes, a.x_shard, shard_bytes);
  };
  auto push_routing = [&](int to) {
    unsigned char* peer = m.sym.peer(to);
    link::rank_copy_data(cs, peer + sym->ids + rank * route_bytes, a.expert_ids, route_bytes);
    link::rank_copy_data(cs, peer + sym->w + rank * route_bytes, a.weights, route_bytes);
    link::rank_notify(cs, *m.data, to, 0, e);
  };
  for (int d = 1; d < R && !ce; ++d) {  // NCCL: every step's send/recv here
    const int to = plan.send_to[d - 1], from = plan.recv_from[d - 1];
    TESSERA_NCCL_CHECK(ncclGroupStart());
    TESSERA_NCCL_CHECK(ncclSend(a.expert_ids, static_cast<std::size_t>(c.per), ncclInt32, to, comm, cs));
    TESSERA_NCCL_CHECK(ncclRecv(c.ids_full + from * c.per, static_cast<std::size_t>(c.per), ncclInt32, from, comm, cs));
    TESSERA_NCCL_CHECK(ncclSend(a.weights, static_cast<std::size_t>(c.per), ncclFloat32, to, comm, cs));
    TESSERA_NCCL_CHECK(ncclRecv(c.w_full + from * c.per, static_cast<std::size_t>(c.per), ncclFloat32, from, comm, cs));
    TESSERA_NCCL_CHECK(ncclSend(a.x_shard, shard_elems, dt, to, comm, cs));
    TESSERA_NCCL_CHECK(ncclRecv(const_cast<void*>(x_of(from)), shard_elems, dt, from, comm, cs));
    TESSERA_NCCL_CHECK(ncclGroupEnd());
    TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_x[d], cs));
  }

  // Compute stream, part 1: the own shard at once, beside the transfers,
  // then each remote shard as it arrives.
  c.permute(a.expert_ids, c.Tl, rank);
  c.gate_up(a.x_shard, c.Tl, rank, c.per, plan.gate_up[0].beside_comm ? beside_ctas : 0);
  if (ce) TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, m.ev_start, 0));
  for (int d = 1; d < R && ce; ++d) {  // copy engine: every step's tokens and routing
    push_tokens(plan.send_to[d - 1]);
    push_routing(plan.send_to[d - 1]);
  }
  // Copy engine: each remote shard's part 1 (sort, gate/up) runs on a
  // stream of its own once the shard landed, with its own workspace part:
  // its sort beside the own gate/up, its gate/up's CTAs taking SMs as the
  // own gate/up's last tiles drain (on one stream it would wait for the
  // whole kernel to end). Part 2 waits for the last of them; the earlier
  // ones are done by then (one stream).
  const bool side_part1 = ce && pg.comm_stream_count() > 1;
  if (side_part1) {
    const cudaStream_t ss = pg.comm_stream(1);
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(ss, m.ev_start, 0));
    for (int j = 1; j < R; ++j) {
      const MoeTpStep& st = plan.gate_up[j];
      link::rank_wait(ss, *m.data, st.shard, 0, e);
      c.permute(ids_of(st.shard), c.Tl, st.shard, ss);
      c.gate_up(x_of(st.shard), c.Tl, st.shard, c.per, 0, ss);
    }
    TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_remote_part1, ss));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, m.ev_remote_part1, 0));
  }
  for (int j = 1; j < R && !side_part1; ++j) {
    const MoeTpStep& st = plan.gate_up[j];
    if (ce)
      link::rank_wait(s, *m.data, st.shard, 0, e);
    else
      TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, m.ev_x[st.comm_step], 0));
    c.permute(ids_of(st.shard), c.Tl, st.shard);
    c.gate_up(x_of(st.shard), c.Tl, st.shard, c.per, st.beside_comm ? beside_ctas : 0);
  }

  // Part 2: down + combine per shard in owner order, chunk by chunk; each
  // remote partial chunk leaves at its step while the next chunk computes.
  int last_step = 0;
  for (const MoeTpStep& st : plan.down) last_step = std::max(last_step, st.comm_step);
  for (const MoeTpStep& st : plan.down) {
    if (st.shard == rank) {  // the own shard is last: combined below with the received partials
      c.down(rank, c.per, st.beside_comm ? beside_ctas : 0);
      break;
    }
    const int d = st.comm_step, to = plan.send_to[d - 1];
    for (int ch = 0; ch < chunks; ++ch) {
      c.down(st.shard, c.per, st.beside_comm || ch > 0 ? beside_ctas : 0, ch * Hc, Hc);
      c.combine_columns(st.shard, c.Tl, w_of(st.shard), ch * Hc, Hc, partial_chunk(st.shard, ch), Hc, nullptr, 0, Hc,
                        0);
      cudaEvent_t done = m.ev_part[d * chunks + ch];
      TESSERA_CUDA_CHECK(cudaEventRecord(done, s));
      TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, done, 0));
      if (ce) {
        // Into `to`'s slab for this step (rs_slab(d) there: I am its r - d).
        link::rank_copy_data(cs, recv_chunk(m.sym.peer(to) + sym->recv, plan.rs_slab(d), ch),
                             partial_chunk(st.shard, ch), chunk_bytes);
        link::rank_notify(cs, *m.data, to, 1 + ch, e);
        continue;
      }
      TESSERA_NCCL_CHECK(ncclGroupStart());
      TESSERA_NCCL_CHECK(ncclSend(partial_chunk(st.shard, ch), chunk_elems, dt, to, comm, cs));
      TESSERA_NCCL_CHECK(
          ncclRecv(recv_chunk(recv, plan.rs_slab(d), ch), chunk_elems, dt, plan.recv_from[d - 1], comm, cs));
      TESSERA_NCCL_CHECK(ncclGroupEnd());
      // The last step's chunk ch completes chunk ch of every slab (the
      // communication stream runs the steps in order).
      if (d == last_step) TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_rs[ch], cs));
    }
  }
  // The own shard's combine per chunk, once every peer's chunk arrived.
  for (int ch = 0; ch < chunks; ++ch) {
    if (ce) {
      for (int d = 1; d < R; ++d) link::rank_wait(s, *m.data, plan.recv_from[d - 1], 1 + ch, e);
    } else {
      TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, m.ev_rs[ch], 0));
    }
    c.combine_columns(rank, c.Tl, a.weights, ch * Hc, Hc, static_cast<unsigned char*>(a.out_shard) + ch * Hc * c.es,
                      c.H, recv_chunk(recv, 0, ch), R - 1, Hc, static_cast<std::int64_t>(shard_elems));
  }
  // Join the communication stream; then (copy engine) tell every peer that
  // my receive buffers are free for its next call's pushes.
  TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_comm_done, cs));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, m.ev_comm_done, 0));
  if (ce)
    for (int p = 0; p < R; ++p)
      if (p != rank) link::rank_notify(s, *m.control, p, 0, e);
  m.last_status_shards = c.per > 0 ? R : 0;
}

void run(MoeContext& ctx, const MoeTpArgs& a, const MoeTpOptions& o) {
  runtime::ProcessGroup& pg = ctx.group();
  MoeContext::Impl& m = ctx.impl();
  const int R = pg.world();
  // Nothing to overlap at R = 1 or without tokens.
  if (R == 1 || a.tokens_local == 0) {
    Call c(pg, m, a, o);
    run_sequential(c);
    return;
  }
  const auto [transport, chunks] = resolve_pipeline(pg, a, o);
  m.ensure_pipeline(pg, o.comm_ctas, chunks, transport);
  if (transport == MoeTransport::copy_engine) {
    const SymLayout layout(R, a.tokens_local, a.hidden, a.topk, dtype_size(a.dtype));
    m.ensure_sym(pg, layout.bytes);
    Call c(pg, m, a, o, &layout);
    run_pipelined(c, o.comm_ctas, chunks, &layout);
  } else {
    Call c(pg, m, a, o);
    run_pipelined(c, o.comm_ctas, chunks, nullptr);
  }
}

}  // namespace

const Entry pipelined{.strategy = Strategy::pipelined, .needs = {.min_world = 2}, .launch = &run};

}  // namespace tessera::ops::moetp
