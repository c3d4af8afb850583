// moe_ep pipelined: per-slab expert GEMMs beside the dispatch and return
// steps, over NCCL or the copy engine (docs/design/moe_ep.md).
#include "moe_ep.hpp"

namespace tessera::ops::moeep {

// Pipelined, step d: send slab to rank + d, receive from rank - d (whose
// GEMMs run at step d here); the return of step d goes the other way.
void EpCall::run_pipelined() const {
  const cudaStream_t cs = pg.comm_stream(0);
  const ncclComm_t comm = m.pipe.get();
  TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_packed, s));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, m.ev_packed, 0));
  for (int d = 1; d < R; ++d) {
    const int to = (rank + d) % R, from = (rank - d + R) % R;
    exchange(comm, cs, to, slab(send, to, H), l.block_counts + to * El, from, slab(recv, from, H),
             recv_counts + from * El);
    TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_recv[d], cs));
  }
  gemm(rank, false, true);  // beside the dispatch
  for (int d = 1; d < R; ++d) {
    const int to = (rank + d) % R, from = (rank - d + R) % R;
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, m.ev_recv[d], 0));
    // Alone on the GPU only at R = 2 (the dispatch is done, no return started).
    const bool beside = R > 2;
    gemm(from, false, beside);
    gemm(from, true, beside);
    TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_done[d], s));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, m.ev_done[d], 0));
    exchange(comm, cs, from, slab(yexp, from, H), nullptr, to, slab(ret, to, H), nullptr);
  }
  gemm(rank, true, true);  // beside the last return
  TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_ret, cs));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, m.ev_ret, 0));
}

// Pipelined over the copy engine: the same steps as run_pipelined, each
// transfer a push into the peer's symmetric slab followed by a flag its
// compute stream waits on. A rank pushes into a peer only after the peer's
// control flag says it finished the previous call (it reads its receive and
// return slabs until its combine); every push into a rank in call e is
// waited on by that rank within call e.
void EpCall::run_pipelined_copy_engine() const {
  const cudaStream_t cs = pg.comm_stream(0);
  const std::uint64_t e = ++m.epoch;
  TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_packed, s));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, m.ev_packed, 0));
  for (int d = 1; d < R; ++d) {
    const int to = (rank + d) % R;
    if (e > 1) link::rank_wait(cs, *m.control, to, 0, e - 1);
    unsigned char* peer = m.sym.peer(to);
    link::rank_copy_data(cs, peer + sym_counts() + static_cast<std::size_t>(rank * El) * 4, l.block_counts + to * El,
                         static_cast<std::size_t>(El) * 4);
    link::rank_copy_data(cs, slab(peer + sym_recv(), rank, H), slab(send, to, H), slab_h * es);
    link::rank_notify(cs, *m.data, to, kSlotDispatch, e);
  }
  gemm(rank, false, true);  // beside the dispatch
  for (int d = 1; d < R; ++d) {
    const int from = (rank - d + R) % R;
    link::rank_wait(s, *m.data, from, kSlotDispatch, e);
    gemm(from, false, true);
    gemm(from, true, true);
    TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_done[d], s));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, m.ev_done[d], 0));
    // The expert output of `from`'s slab goes back into its return slab `rank`.
    link::rank_copy_data(cs, slab(m.sym.peer(from) + sym_ret(), rank, H), slab(yexp, from, H), slab_h * es);
    link::rank_notify(cs, *m.data, from, kSlotReturn, e);
  }
  gemm(rank, true, true);  // beside the last return
  for (int d = 1; d < R; ++d) link::rank_wait(s, *m.data, (rank + d) % R, kSlotReturn, e);
  TESSERA_CUDA_CHECK(cudaEventRecord(m.ev_ret, cs));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, m.ev_ret, 0));  // joins the communication stream
}

namespace {

void run(MoeEpContext& ctx, const MoeEpArgs& a, const MoeEpOptions& o, MoeTransport transport) {
  runtime::ProcessGroup& pg = ctx.group();
  if (pg.world() == 1) return sequential.launch(ctx, a, o, transport);  // nothing to overlap
  MoeEpContext::Impl& m = ctx.impl();
  m.ensure_pipeline(pg, o.comm_ctas, transport);
  EpCall call(pg, m, a, o, moe_ep_capacity(a));
  call.ce = transport == MoeTransport::copy_engine;
  if (call.ce) m.ensure_sym(pg, call.sym_bytes());
  call.route();
  if (call.ce)
    call.run_pipelined_copy_engine();
  else
    call.run_pipelined();
  call.combine();
  if (call.ce) call.release_slabs();
}

}  // namespace

const Entry pipelined{.strategy = Strategy::pipelined, .needs = {.min_world = 2}, .launch = &run};

}  // namespace tessera::ops::moeep
