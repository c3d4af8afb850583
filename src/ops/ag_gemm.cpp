// AllGather + GEMM: the four strategies (plan.hpp describes the protocol).
//
// Every strategy but decomposition on a packed A starts by copying this
// rank's shard into its rows of the symmetric gathered-A workspace (packed,
// row stride K) on the compute stream (decomposition reads and pushes A
// itself); every strategy ends by telling every peer kAgFree = epoch once
// its GEMM has read the workspace; a rank pushes into a peer only after that
// peer's kAgFree reached the previous epoch.
// (Tried and not kept: the fused copy-in on the communication stream, chunk
// by chunk behind own-row flags, to take its ~20 us off the critical path.
// Not kept: a same-GPU device-to-device copy may run as a kernel, which the
// fused_ce GEMM holding every SM would block; unverified either way.)
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "context_impl.hpp"
#include "tp_launchers.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops {

namespace {

/// Leading dimension of the swiglu staging buffer: n rounded up to 8
/// elements, since GEMM outputs need 16-byte rows.
std::int64_t swiglu_tmp_ld(std::int64_t n) { return (n + 7) / 8 * 8; }

/// cuBLASLt D[rows, n] = A[rows, k] · Bᵀ, or with swiglu through `tmp`
/// ([rows, n]) and the SiLU·up kernel into D[rows, n/2].
void local_gemm(TpContext::Impl& c, const AgGemmArgs& a, const void* a_rows, std::int64_t rows, void* d_rows, void* tmp,
                cudaStream_t s) {
  if (rows <= 0) return;
  kernels::GemmArgs g{};
  g.a = a_rows;
  g.b = a.b;
  g.m = rows;
  g.n = a.n;
  g.k = a.k;
  g.lda = a.k;
  g.ldb = a.ldb ? a.ldb : a.k;
  g.in = a.dtype;
  g.out = a.dtype;
  g.b_layout = kernels::BLayout::NK;
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
  (void)c;
}

void notify_free(TpContext::Impl& c, std::uint64_t e) {
  for (int p = 0; p < c.pg.world(); ++p)
    if (p != c.pg.rank()) link::rank_notify(c.pg.stream(), *c.control, p, kAgFree, e);
}

/// Copy-engine pushes of my shard (packed rows from `src`: my rows of the
/// workspace, or A itself) to every peer, channel by channel, each followed
/// by a flag store (value = epoch) on the destination.
void push_copy_engine(TpContext::Impl& c, const AgPlan& plan, const unsigned char* src, std::int64_t row_bytes,
                      std::int64_t my_rows, std::uint64_t e) {
  cudaStream_t cs = c.comm();
  const std::int64_t lo = plan.shards.lo(plan.rank);
  const std::int64_t per_ch = plan.map.m_per_channel;
  for (int dst : plan.push_to) {
    if (e > 1) link::rank_wait(cs, *c.control, dst, kAgFree, e - 1);
    for (int ch = 0; ch < plan.channels; ++ch) {
      const std::int64_t r0 = std::min<std::int64_t>(ch * per_ch, my_rows);
      const std::int64_t r1 = std::min<std::int64_t>(r0 + per_ch, my_rows);
      const std::size_t off = static_cast<std::size_t>((lo + r0) * row_bytes);
      link::rank_copy_data(cs, static_cast<unsigned char*>(c.ag_ws.peer(dst)) + off, src + r0 * row_bytes,
                           static_cast<std::size_t>((r1 - r0) * row_bytes));
      link::rank_notify(cs, *c.ag_flags, dst, ch, e);
    }
  }
}

}  // namespace

void run_ag_gemm(TpContext::Impl& c, const AgGemmArgs& a, Strategy s, const OpOptions& o) {
  TESSERA_CHECK(
      s == Strategy::sequential || s == Strategy::decomposition || s == Strategy::fused_ce || s == Strategy::fused_sm,
      "ag_gemm: strategy {} cannot run here", strategy_name(s));
  const int R = c.pg.world(), rank = c.pg.rank();
  cudaStream_t st = c.pg.stream();
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(a.dtype));
  const std::int64_t row_bytes = a.k * es;
  const AgPlan plan = plan_ag(a.m, R, rank, s == Strategy::decomposition ? 1 : o.channels, detail::kAgTileM);
  const std::int64_t per_rank = plan.shards.per_rank;
  c.ensure_ag_ws(static_cast<std::size_t>(R * per_rank * row_bytes));
  // diag_kernel_only (fused_ce): the previous epoch, whose flags every peer
  // already stored, and no communication at all (tp_mlp.hpp).
  const bool kernel_only = o.diag_kernel_only;
  TESSERA_CHECK(!kernel_only || (s == Strategy::fused_ce && c.ag_ce_epoch > 0 && c.ag_ce_channels == plan.channels),
                "ag_gemm: diag_kernel_only needs strategy fused_ce after a normal fused_ce call with the same "
                "channels (strategy {}, last fused_ce epoch {}, channels {} vs {})",
                strategy_name(s), c.ag_ce_epoch, plan.channels, c.ag_ce_channels);
  const std::uint64_t e = kernel_only ? c.ag_ce_epoch : ++c.ag_epoch;
  if (s == Strategy::fused_ce && !kernel_only) {
    c.ag_ce_epoch = e;
    c.ag_ce_channels = plan.channels;
  }
  const std::int64_t lo = plan.shards.lo(rank);
  const std::int64_t n_out = a.swiglu ? a.n / 2 : a.n;
  const std::int64_t ldd = a.ldd ? a.ldd : n_out;
  const std::int64_t lda = a.lda ? a.lda : a.k;
  unsigned char* ws = c.ag_workspace();  // local memory without load/store reach (sequential only)

  // Sequential with equal, packed shards: NCCL gathers straight from A (no
  // copy-in; every rank sends per_rank rows, so every shard must be full).
  const bool direct_gather = s == Strategy::sequential && lda == a.k && a.m % R == 0;
  // Decomposition and fused_ce with packed A: my rows' GEMM reads A itself
  // (fused_ce: through a second TMA map, so only when my shard starts on a
  // tile row) and the pushes copy from it, so the copy-in (serial before
  // both) is off the critical path; it only fills my rows for gathered_a, at
  // the end. Otherwise the copy-in stays, as an SM copy (~25 us per 32 MiB;
  // as a 2D memcpy it ran on a copy engine, ~60 us).
  // TESSERA_AG_LOCAL_A=0 keeps fused_ce on the copy-in (an A/B switch).
  static const bool local_a_on = env::find_int("TESSERA_AG_LOCAL_A", 0, 1).value_or(1) != 0;
  const bool from_input =
      lda == a.k && (s == Strategy::decomposition ||
                     (s == Strategy::fused_ce && local_a_on && detail::ag_local_rows_on_tiles(lo, a.m_local, a.m)));
  auto copy_in = [&] {
    detail::launch_copy_rows(ws + lo * row_bytes, row_bytes, a.a, lda * es, row_bytes, a.m_local, st);
  };
  // My shard into my rows of the workspace (compute stream).
  if (!direct_gather && !from_input) copy_in();
  const unsigned char* my_src = from_input ? static_cast<const unsigned char*>(a.a) : ws + lo * row_bytes;
  void* tmp = a.swiglu ? c.staging.ensure(static_cast<std::size_t>(a.m * swiglu_tmp_ld(a.n) * es), st) : nullptr;

  switch (s) {
    case Strategy::sequential: {
      const void* send = direct_gather ? a.a : static_cast<const void*>(ws + lo * row_bytes);
      TESSERA_NCCL_CHECK(ncclAllGather(send, ws, static_cast<std::size_t>(per_rank * a.k), runtime::nccl_dtype(a.dtype),
                                       c.pg.nccl(), st));
      local_gemm(c, a, ws, a.m, a.d, tmp, st);
      break;
    }
    case Strategy::decomposition: {
      TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_ready, st));
      TESSERA_CUDA_CHECK(cudaStreamWaitEvent(c.comm(), c.ev_ready, 0));
      push_copy_engine(c, plan, my_src, row_bytes, a.m_local, e);
      for (int src : plan.recv_from) {
        const std::int64_t rlo = plan.shards.lo(src), rows = plan.shards.rows(a.m, src);
        if (src != rank) link::rank_wait(st, *c.ag_flags, src, 0, e);
        local_gemm(c, a, src == rank ? my_src : ws + rlo * row_bytes, rows,
                   static_cast<unsigned char*>(a.d) + rlo * ldd * es,
                   tmp ? static_cast<unsigned char*>(tmp) + rlo * swiglu_tmp_ld(a.n) * es : nullptr, st);
      }
      break;
    }
    case Strategy::fused_ce:
    case Strategy::fused_sm: {
      TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_ready, st));
      TESSERA_CUDA_CHECK(cudaStreamWaitEvent(c.comm(), c.ev_ready, 0));
      int max_ctas = 0;
      if (s == Strategy::fused_ce) {
        if (!kernel_only) push_copy_engine(c, plan, my_src, row_bytes, a.m_local, e);
      } else {
        cudaStream_t cs = c.comm();
        detail::PushLaunch p;
        for (int r = 0; r < R; ++r) p.ws[r] = c.ag_ws.peer(r);
        p.lo = lo;
        p.rows = a.m_local;
        p.row_bytes = row_bytes;
        p.channels = plan.channels;
        p.rows_per_channel = plan.map.m_per_channel;
        p.steps = static_cast<int>(plan.push_to.size());
        for (int j = 0; j < p.steps; ++j) {
          p.push_to[j] = plan.push_to[j];
          if (e > 1) link::rank_wait(cs, *c.control, plan.push_to[j], kAgFree, e - 1);
        }
        p.sv = c.ag_flags->view();
        p.epoch = e;
        p.done = static_cast<unsigned*>(c.push_done.get());
        // The pusher is launched before the GEMM and the GEMM leaves it
        // comm_ctas SMs, so both are resident whatever the launch order.
        detail::launch_push(p, o.comm_ctas, cs);
        max_ctas = c.pg.sm_count() - o.comm_ctas;
      }
      detail::AgGemmLaunch g;
      g.a = ws;
      g.b = a.b;
      g.d = a.d;
      g.m = a.m;
      g.n = a.n;
      g.k = a.k;
      g.ldb = a.ldb ? a.ldb : a.k;
      g.ldd = ldd;
      g.dtype = a.dtype;
      g.swiglu = a.swiglu;
      g.map = plan.map;
      const runtime::SignalView v = c.ag_flags->view();
      g.flags = v.flag_from(0, 0);
      g.flag_stride = v.slots;
      g.rank = rank;
      g.epoch = e;
      g.rotate_m = plan.rotate_m;
      g.max_ctas = max_ctas;
      if (from_input) {
        g.local = a.a;
        g.local_lo = lo;
        g.local_rows = a.m_local;
        g.local_lda = lda;
      }
      detail::launch_ag_gemm(g, st);
      break;
    }
    default:
      break;
  }
  if (a.gathered_a) {
    if (from_input) copy_in();
    TESSERA_CUDA_CHECK(
        cudaMemcpyAsync(a.gathered_a, ws, static_cast<std::size_t>(a.m * row_bytes), cudaMemcpyDeviceToDevice, st));
  }
  if (s != Strategy::sequential) {
    // The compute stream's later work (and the caller) sees the pushes done.
    TESSERA_CUDA_CHECK(cudaEventRecord(c.ev_comm_done, c.comm()));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(st, c.ev_comm_done, 0));
  }
  if (!kernel_only && c.lsa) notify_free(c, e);  // no peer writes into ws without lsa
}

}  // namespace tessera::ops
