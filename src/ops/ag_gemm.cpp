// AllGather + GEMM: the registry of its strategies (src/ops/ag_gemm/, one
// file each; plan.hpp describes the protocol) and the steps they share.
// (Tried and not kept: the fused copy-in on the communication stream, chunk
// by chunk behind own-row flags, to take its ~20 us off the critical path:
// a same-GPU device-to-device copy may run as a kernel, which the fused_ce
// GEMM holding every SM would block.)
#include "ag_gemm/ag_gemm.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "tp_launchers.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops {

const TpRegistry<AgGemmArgs>& ag_gemm_registry() {
  static const TpRegistry<AgGemmArgs> r(OpKind::ag_gemm, "ag_gemm",
                                        {&ag::sequential, &ag::decomposition, &ag::fused_ce, &ag::fused_sm});
  return r;
}

void run_ag_gemm(TpContext::Impl& c, const AgGemmArgs& a, Strategy s, const OpOptions& o) {
  const TpStrategy<AgGemmArgs>& entry = ag_gemm_registry().find(s);
  TESSERA_CHECK(!o.diag_kernel_only || entry.diag_kernel_only,
                "ag_gemm: diag_kernel_only needs strategy fused_ce, not {}", strategy_name(s));
  c.begin_call();
  entry.launch(c, a, o);
}

namespace ag {

Call begin(TpContext::Impl& c, const AgGemmArgs& a, int channels) {
  Call k{c, a, plan_ag(a.m, c.pg.world(), c.pg.rank(), channels, detail::kAgTileM)};
  k.world = c.pg.world();
  k.rank = c.pg.rank();
  k.st = c.pg.stream();
  k.es = static_cast<std::int64_t>(dtype_size(a.dtype));
  k.row_bytes = a.k * k.es;
  c.ensure_ag_ws(static_cast<std::size_t>(k.world * k.plan.shards.per_rank * k.row_bytes));
  k.lo = k.plan.shards.lo(k.rank);
  k.n_out = a.swiglu ? a.n / 2 : a.n;
  k.ldd = a.ldd ? a.ldd : k.n_out;
  k.lda = a.lda ? a.lda : a.k;
  k.ws = c.ag_workspace();  // local memory without load/store reach (sequential only)
  return k;
}

void copy_in(const Call& k) {
  detail::launch_copy_rows(k.my_rows(), k.row_bytes, k.a.a, k.lda * k.es, k.row_bytes, k.a.m_local, k.st);
}

std::int64_t swiglu_tmp_ld(std::int64_t n) { return (n + 7) / 8 * 8; }

kernels::BLayout b_layout(const AgGemmArgs& a) { return a.b_kn ? kernels::BLayout::KN : kernels::BLayout::NK; }

std::int64_t b_ld(const AgGemmArgs& a) { return a.ldb ? a.ldb : (a.b_kn ? a.n : a.k); }

void stage_shard(Call& k, bool skip_copy_in) {
  if (!skip_copy_in) copy_in(k);
  if (k.a.swiglu) k.tmp = k.c.staging.ensure(static_cast<std::size_t>(k.a.m * swiglu_tmp_ld(k.a.n) * k.es), k.st);
}

void local_gemm(const AgGemmArgs& a, const void* a_rows, std::int64_t rows, void* d_rows, void* tmp, cudaStream_t s) {
  if (rows <= 0) return;
  kernels::GemmArgs g{};
  g.a = a_rows;
  g.b = a.b;
  g.m = rows;
  g.n = a.n;
  g.k = a.k;
  g.lda = a.k;
  g.ldb = b_ld(a);
  g.in = a.dtype;
  g.out = a.dtype;
  g.b_layout = b_layout(a);
  const std::int64_t n_out = a.swiglu ? a.n / 2 : a.n;
  const std::int64_t ldd = a.ldd ? a.ldd : n_out;
  if (!a.swiglu) {
    g.d = d_rows;
    g.ldd = ldd;
    kernels::cublaslt_gemm(g, s);
  } else {
    g.d = tmp;
    g.ldd = swiglu_tmp_ld(a.n);
    kernels::cublaslt_gemm(g, s);
    detail::launch_swiglu(tmp, g.ldd, d_rows, ldd, rows, n_out, a.dtype, s);
  }
}

void fork_comm(const Call& k) {
  TESSERA_CUDA_CHECK(cudaEventRecord(k.c.ev_ready, k.st));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(k.c.comm(), k.c.ev_ready, 0));
}

void push_copy_engine(const Call& k, const unsigned char* src) {
  TpContext::Impl& c = k.c;
  cudaStream_t cs = c.comm();
  const std::int64_t per_ch = k.plan.map.m_per_channel, my_rows = k.a.m_local, row_bytes = k.row_bytes;
  for (int dst : k.plan.push_to) {
    if (k.epoch > 1) link::rank_wait(cs, *c.control, dst, kAgFree, k.epoch - 1);
    for (int ch = 0; ch < k.plan.channels; ++ch) {
      const std::int64_t r0 = std::min<std::int64_t>(ch * per_ch, my_rows);
      const std::int64_t r1 = std::min<std::int64_t>(r0 + per_ch, my_rows);
      const std::size_t off = static_cast<std::size_t>((k.lo + r0) * row_bytes);
      link::rank_copy_data(cs, static_cast<unsigned char*>(c.ag_ws.peer(dst)) + off, src + r0 * row_bytes,
                           static_cast<std::size_t>((r1 - r0) * row_bytes));
      link::rank_notify(cs, *c.ag_flags, dst, ch, k.epoch);
    }
  }
}

void launch_fused(const Call& k, int max_ctas, bool from_input) {
  const AgGemmArgs& a = k.a;
  detail::AgGemmArguments g;
  g.problem.a = k.ws;
  g.problem.b = a.b;
  g.problem.d = a.d;
  g.problem.m = a.m;
  g.problem.n = a.n;
  g.problem.k = a.k;
  g.problem.lda = a.k;
  g.problem.ldb = b_ld(a);
  g.problem.ldd = k.ldd;
  g.problem.in = g.problem.out = a.dtype;
  g.problem.b_layout = b_layout(a);
  // Own shard first, then shards in arrival order (plan.hpp).
  g.options = detail::fused_options(detail::kAgTile, k.plan.rotate_m, max_ctas);
  g.prologue.map = k.plan.map;
  const runtime::SignalView v = k.c.ag_flags->view();
  g.prologue.flags = {v.flag_from(0, 0), v.slots, k.epoch};
  g.prologue.rank = k.rank;
  if (from_input) {
    g.prologue.local = a.a;
    g.prologue.local_lo = k.lo;
    g.prologue.local_rows = a.m_local;
    g.prologue.local_lda = k.lda;
  }
  g.swiglu = a.swiglu;
  detail::launch_ag_gemm(g, k.st);
}

void finish(const Call& k, const Finish& f) {
  TpContext::Impl& c = k.c;
  if (k.a.gathered_a) {
    if (f.from_input) copy_in(k);
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(k.a.gathered_a, k.ws, static_cast<std::size_t>(k.a.m * k.row_bytes),
                                       cudaMemcpyDeviceToDevice, k.st));
  }
  if (f.join_comm) {
    // The compute stream's later work (and the caller) sees the pushes done.
    TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_comm_done, c.comm()));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(k.st, c.ev_comm_done, 0));
  }
  if (!f.notify || !c.lsa) return;  // no peer writes into ws without lsa
  for (int p = 0; p < k.world; ++p)
    if (p != k.rank) link::rank_notify(k.st, *c.control, p, kAgFree, k.epoch);
}

}  // namespace ag
}  // namespace tessera::ops
