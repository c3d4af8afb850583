// `tessera bench mlp` — the tensor-parallel MLP (WORKLOADS.md MLP-1..6) at
// TP = world size R. Per shape, three parts and the whole layer:
//   AG+GEMM        — column-parallel GEMM1 as in MACHINES.md's baselines:
//                    AllGather(x)[S, H] · W[I/R, H]ᵀ (non-gated, N = I/R)
//   AG+GEMM gated  — the same with the fused gate/up weight (N = 2·I/R) and
//                    SiLU(gate)·up (what ops::mlp runs)
//   GEMM+RS        — row-parallel GEMM2 [S, I/R] · Wd[H, I/R]ᵀ + ReduceScatter
//   GEMM+AR        — the same GEMM + AllReduce (ops::gemm_ar: the row-parallel
//                    GEMM without sequence parallelism; issue 5's MLP
//                    down-projection target); comm = ncclAllReduce, no
//                    decomposition strategy
//   MLP            — ops::mlp (gated AG+GEMM then GEMM+RS)
// Columns: GEMM alone (cuBLASLt, the full per-rank GEMM [S, N, K]; for the
// gated part the GEMM only, without the activation) and its TFLOP/s, the
// engine's plain GEMM at the fused tile (ping-pong 64x256) on the same data, comm
// alone (NCCL AllGather / ReduceScatter), sequential, decomposition, the best
// fused strategy at default options (and which), Tessera = what ops:: runs
// with Strategy::automatic (the tuner's choice, never slower than sequential;
// measured fresh: no on-disk cache; the tuner runs in the first warm-up
// call), ideal = max(GEMM, comm), speedup of
// Tessera over sequential and fraction of ideal. A second table lists every
// fused variant (options A/B) with its speedup over sequential.
//
// Inputs: fresh random data (never zeros: a zero operand lowers the GEMM's
// power draw and inflates its rate), rotated over --sets buffer sets so no
// repetition finds its inputs in L2 (bench/gemm's convention). Every column
// of one shape is timed in one interleaved loop (InterleavedTimer: each
// repetition runs every variant once), so clock drift hits all alike. Times
// are medians of --reps, each run after a device sync, a barrier and a
// one-element all-reduce that starts the ranks together (ProcessGroup::align_streams:
// without it the host barrier's exit skew, tens of µs, lands in every
// column that waits for a peer but not in GEMM alone), max over ranks.
//
// Clock state: run back to back, the columns keep the GPU at its power cap
// (measured: ~680 W, SM clock ~1500 MHz, 65 % of samples capped), which is
// what a training loop sees. A harness with host gaps between runs (the
// PyTorch script, MACHINES.md's baselines) runs at ~1980 MHz instead. --gap-ms
// idles the GPU before every timed run so both can be compared at like
// clocks; the "GEMM TF/s" column shows the state a table was taken in.
// By default (--lead, on) every timed run is queued behind a ~0.7 ms lead
// GEMM, as inside a training step: the run starts on a busy GPU with the host
// already ahead, so neither launch latency nor an idle-clock burst lands in
// any column. scripts/bench_async_tp.py does the same for PyTorch.
// Run with: tessera run -n R -- tessera bench mlp [--shapes 1,2,3] [--markdown FILE]
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "command.hpp"
#include "common/timing.hpp"
#include "gemm/bench_gemm_kernels.hpp"
#include "tessera/kernels/gemm.hpp"
#include "common/mlp_shapes.hpp"
#include "tessera/ops/tp_mlp.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::bench {
namespace {

struct Options {
  std::vector<int> shapes{1, 2, 3, 4, 5, 6};
  std::string dtype = "bf16";
  int reps = 20, warmup = 5, sets = 3;
  double gap_ms = 0;  // host sleep before every timed run (after the drain, before the barrier)
  bool lead = true;   // a lead GEMM queued before every timed run
  int channels = 4, comm_ctas = 16;
  bool variants = true;
  /// Rows "fused_ce kernel only": the fused_ce kernel with no communication
  /// (OpOptions::diag_kernel_only), i.e. the kernel's own cost beside the engine.
  bool kernel_only = true;
  /// GEMM+RS rows "kernel only - …": the kernel-only run with the owner add,
  /// the band waits, the notify adds, or all three left out
  /// (OpOptions::diag_skip), to place its cost over the engine.
  bool kernel_split = true;
  std::string markdown;
};

struct Buf {
  void* p = nullptr;
  explicit Buf(std::size_t bytes) { TESSERA_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 16))); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

/// One rotation set of inputs (all filled with fresh random data).
struct InputSet {
  std::unique_ptr<Buf> x, xfull, wgu, wd, hid;
};

std::string ms(double v) { return v > 0 ? fmt::format("{:.3f}", v) : std::string("-"); }

using ops::Strategy;

void run(const Options& o) {
  auto pg = runtime::ProcessGroup::from_environment();
  const int R = pg->world(), rank = pg->rank();
  TESSERA_CHECK(o.dtype == "bf16" || o.dtype == "f16", "bench mlp: --dtype {} (bf16 or f16)", o.dtype);
  const DType t = o.dtype == "f16" ? DType::f16 : DType::bf16;
  ops::TpContext ctx(*pg);
  cudaStream_t st = pg->stream();
  const ncclDataType_t nt = t == DType::f16 ? ncclFloat16 : ncclBfloat16;
  Table table({"shape", "part", "GEMM", "GEMM TF/s", "engine", "comm", "sequential", "decomp", "best fused", "which",
               "tessera", "choice", "ideal", "speedup", "of ideal"});
  Table var({"shape", "part", "variant", "ms", "vs sequential"});
  // "engine": the plain GEMM on the fused operators' tile (ping-pong 64x256),
  // named explicitly since the plain default turns cooperative on large shapes.
  kernels::GemmOptions fused_tile;
  fused_tile.ping_pong = true;
  fused_tile.tile = kernels::GemmTile::T64x256;
  // Lead GEMM [8192, 8192, 4096] (~0.7 ms) on its own random operands.
  constexpr std::int64_t kLead = 8192, kLeadK = 4096;
  Buf lead_a(kLead * kLeadK * 2), lead_b(kLead * kLeadK * 2), lead_d(kLead * kLead * 2);
  gemm::fill_random(lead_a.p, kLead * kLeadK, t, 77 + rank, st);
  gemm::fill_random(lead_b.p, kLead * kLeadK, t, 88 + rank, st);
  const kernels::GemmArgs lead_args{lead_a.p, lead_b.p, lead_d.p, kLead, kLead, kLeadK,
                                    kLeadK,   kLeadK,   kLead,    t,     t,     kernels::BLayout::NK};
  for (int idx : o.shapes) {
    TESSERA_CHECK(idx >= 1 && idx <= 6, "bench mlp: shape {} not in 1..6", idx);
    const MlpShape sh = mlp_shape(idx);
    TESSERA_CHECK(sh.i % R == 0 && sh.s % R == 0, "bench mlp: {} does not split over {} ranks", sh.name, R);
    const std::int64_t m = sh.s, ml = sh.s / R, h = sh.h, il = sh.i / R;
    std::vector<InputSet> in(static_cast<std::size_t>(o.sets));
    std::uint64_t seed = 1000 + 100 * static_cast<std::uint64_t>(rank);
    for (auto& set : in) {
      auto make = [&](std::int64_t elems) {
        auto b = std::make_unique<Buf>(static_cast<std::size_t>(elems) * 2);
        gemm::fill_random(b->p, elems, t, seed++, st);
        return b;
      };
      set.x = make(ml * h);
      set.xfull = make(m * h);
      set.wgu = make(2 * il * h);  // its first I/R rows are the non-gated weight [I/R, H]
      set.wd = make(h * il);
      set.hid = make(m * il);
    }
    Buf agout(m * il * 2), gemm_out(m * 2 * il * 2), part(m * h * 2), out(ml * h * 2);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(st));
    int turn = 0;
    auto next = [&]() -> InputSet& { return in[static_cast<std::size_t>(turn++ % o.sets)]; };

    struct PartResult {
      double gemm = 0, engine = 0, comm = 0, seq = 0, dec = 0, best = 0, tes = 0;
      std::string which, choice;
      double flop = 0;
    };
    auto add = [&](const char* part_name, const PartResult& r, double ideal) {
      table.add({sh.name, part_name, ms(r.gemm), r.flop > 0 ? fmt::format("{:.0f}", r.flop / r.gemm * 1e-9) : "-",
                 r.engine > 0 ? ms(r.engine) : "-", ms(r.comm), ms(r.seq), ms(r.dec), ms(r.best), r.which, ms(r.tes),
                 r.choice, ms(ideal), fmt::format("{:.2f}x", r.seq / r.tes),
                 fmt::format("{:.0f}%", 100.0 * ideal / r.tes)});
    };
    // Every figure of this shape is timed in ONE interleaved loop (phase 1
    // registers, timer.run() measures, phase 2 reads), so all columns see the
    // same clocks; per-rank medians, then the max over ranks.
    InterleavedTimer timer(st, o.warmup, o.reps, [&] {
      TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
      if (o.gap_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o.gap_ms));
      pg->barrier();
      if (o.lead) kernels::cublaslt_gemm(lead_args, st);  // the host queues the run while this runs
      pg->align_streams(st);                              // the ranks start each run together
    });
    struct Variant {
      std::string part, name;
      double ms = 0;
    };
    std::deque<Variant> variants;  // deque: stable addresses for the timer
    auto variant = [&](const std::string& part_name, const std::string& name, std::function<void()> body) {
      variants.push_back({part_name, name});
      timer.add(&variants.back().ms, std::move(body));
    };

    // ---- AG + GEMM (non-gated N = I/R, and gated N = 2·I/R with SiLU·up) -----
    PartResult ag_res[2];
    std::map<Strategy, double> ag_tm[2];
    timer.add(&ag_res[0].comm, [&] {
      auto& s = next();
      TESSERA_NCCL_CHECK(ncclAllGather(s.x->p, s.xfull->p, static_cast<std::size_t>(ml * h), nt, pg->nccl(), st));
    });
    ops::OpOptions ag_base;
    ag_base.channels = o.channels;
    ag_base.comm_ctas = o.comm_ctas;
    ag_base.use_cache = false;
    auto ag_args = [&](InputSet& s, bool gated, void* d) {
      ops::AgGemmArgs a;
      a.a = s.x->p;
      a.b = s.wgu->p;
      a.d = d;
      a.m = m;
      a.m_local = ml;
      a.n = gated ? 2 * il : il;
      a.k = h;
      a.ldd = il;
      a.dtype = t;
      a.swiglu = gated;
      return a;
    };
    for (int gated = 0; gated < 2; ++gated) {
      PartResult& r = ag_res[gated];
      const std::int64_t n = gated ? 2 * il : il;
      r.flop = 2.0 * m * n * h;
      auto gemm_args = [&, n](InputSet& s) {
        return kernels::GemmArgs{s.xfull->p, s.wgu->p, gemm_out.p, m, n, h, h, h, n, t, t, kernels::BLayout::NK};
      };
      timer.add(&r.gemm, [&, gemm_args] { kernels::cublaslt_gemm(gemm_args(next()), st); });
      // The plain GEMM on the fused AG+GEMM's tile (ping-pong 64x256).
      timer.add(&r.engine, [&, gemm_args] { kernels::gemm(gemm_args(next()), fused_tile, st); });
      for (Strategy sg : {Strategy::sequential, Strategy::decomposition, Strategy::fused_ce, Strategy::fused_sm}) {
        ops::OpOptions op = ag_base;
        op.strategy = sg;
        timer.add(&ag_tm[gated][sg], [&, op, gated] { ops::ag_gemm(ctx, ag_args(next(), gated, agout.p), op); });
      }
      // Strategy::automatic: the tuner decides on the first (warm-up) call.
      timer.add(&r.tes, [&, gated] { ops::ag_gemm(ctx, ag_args(next(), gated, agout.p), ag_base); });
      if (o.kernel_only) {
        // After the fused_ce body above in every round of the interleaved
        // loop, so the epoch it replays is always stored.
        ops::OpOptions op = ag_base;
        op.strategy = Strategy::fused_ce;
        op.diag_kernel_only = true;
        variant(gated ? "AG+GEMM gated" : "AG+GEMM", "fused_ce kernel only (no comm)",
                [&, op, gated] { ops::ag_gemm(ctx, ag_args(next(), gated, agout.p), op); });
      }
      if (o.variants) {
        const char* part_name = gated ? "AG+GEMM gated" : "AG+GEMM";
        for (int ch : {1, 8}) {
          if (ch == o.channels) continue;
          ops::OpOptions op = ag_base;
          op.strategy = Strategy::fused_ce;
          op.channels = ch;
          variant(part_name, "fused_ce ch=" + std::to_string(ch),
                  [&, op, gated] { ops::ag_gemm(ctx, ag_args(next(), gated, agout.p), op); });
        }
        for (int cc : {4, 8}) {
          if (cc == o.comm_ctas) continue;
          ops::OpOptions op = ag_base;
          op.strategy = Strategy::fused_sm;
          op.comm_ctas = cc;
          variant(part_name, "fused_sm ctas=" + std::to_string(cc),
                  [&, op, gated] { ops::ag_gemm(ctx, ag_args(next(), gated, agout.p), op); });
        }
      }
    }

    // ---- GEMM + RS ------------------------------------------------------------
    PartResult rs;
    rs.flop = 2.0 * m * h * il;
    auto rs_gemm_args = [&](InputSet& s) {
      return kernels::GemmArgs{s.hid->p, s.wd->p, part.p, m, h, il, il, il, h, t, t, kernels::BLayout::NK};
    };
    timer.add(&rs.gemm, [&] { kernels::cublaslt_gemm(rs_gemm_args(next()), st); });
    // The fused GEMM+RS's tile (ping-pong 64x256).
    timer.add(&rs.engine, [&] { kernels::gemm(rs_gemm_args(next()), fused_tile, st); });
    timer.add(&rs.comm, [&] {
      TESSERA_NCCL_CHECK(
          ncclReduceScatter(part.p, out.p, static_cast<std::size_t>(ml * h), nt, ncclSum, pg->nccl(), st));
    });
    auto rs_args = [&](InputSet& s) {
      ops::GemmRsArgs a;
      a.a = s.hid->p;
      a.b = s.wd->p;
      a.d = out.p;
      a.m = m;
      a.m_local = ml;
      a.n = h;
      a.k = il;
      a.dtype = t;
      return a;
    };
    // GEMM+RS on the copy engine needs the shards on tile rows.
    const bool rs_ce_ok = ops::shard_rows(m, R).per_rank % ops::kRsFusedTileRows == 0;
    double rs_sm = 0, rs_ce = 0;
    ops::OpOptions rs_base;
    rs_base.comm_ctas = o.comm_ctas;
    rs_base.use_cache = false;
    auto rs_call = [&](ops::OpOptions op) { return [&, op] { ops::gemm_rs(ctx, rs_args(next()), op); }; };
    {
      ops::OpOptions op = rs_base;
      op.strategy = Strategy::sequential;
      timer.add(&rs.seq, rs_call(op));
      op.strategy = Strategy::decomposition;
      timer.add(&rs.dec, rs_call(op));
      op.strategy = Strategy::fused_sm;
      op.rs_reduce = ops::RsReduce::epilogue;  // OpOptions' default
      timer.add(&rs_sm, rs_call(op));
      if (rs_ce_ok) {
        op.strategy = Strategy::fused_ce;
        timer.add(&rs_ce, rs_call(op));
        if (o.kernel_only) {
          op.diag_kernel_only = true;
          variant("GEMM+RS", "fused_ce kernel only (no comm)", rs_call(op));
          if (o.kernel_split) {
            // The kernel with parts of its work left out (OpOptions::diag_skip):
            // each row's difference to the one above is that part's cost.
            const std::pair<unsigned, const char*> splits[] = {
                {ops::kDiagSkipOwnerAdd, "kernel only - owner add"},
                {ops::kDiagSkipBandWait, "kernel only - band wait"},
                {ops::kDiagSkipNotify, "kernel only - notify add"},
                {ops::kDiagSkipOwnerAdd | ops::kDiagSkipBandWait | ops::kDiagSkipNotify, "kernel only - all three"},
            };
            for (const auto& [bits, name] : splits) {
              op.diag_skip = bits;
              variant("GEMM+RS", name, rs_call(op));
            }
            op.diag_skip = 0;
          }
          op.diag_kernel_only = false;
        }
        op.strategy = Strategy::fused_sm;
      }
      op.rs_reduce = ops::RsReduce::kernel;
      variant("GEMM+RS", "fused_sm reduce=kernel ctas=" + std::to_string(o.comm_ctas), rs_call(op));
      if (o.variants)
        for (int cc : {4, 8}) {
          if (cc == o.comm_ctas) continue;
          op.comm_ctas = cc;
          variant("GEMM+RS", "fused_sm reduce=kernel ctas=" + std::to_string(cc), rs_call(op));
        }
    }
    timer.add(&rs.tes, rs_call(rs_base));

    // ---- GEMM + AR (same GEMM; the full [S, H] sum on every rank, into `part`) ---
    PartResult ar;
    ar.flop = rs.flop;
    timer.add(&ar.comm, [&] {
      TESSERA_NCCL_CHECK(ncclAllReduce(part.p, part.p, static_cast<std::size_t>(m * h), nt, ncclSum, pg->nccl(), st));
    });
    auto ar_args = [&](InputSet& s) {
      ops::GemmArArgs a;
      a.a = s.hid->p;
      a.b = s.wd->p;
      a.d = part.p;
      a.m = m;
      a.n = h;
      a.k = il;
      a.dtype = t;
      return a;
    };
    double ar_ce = 0;
    ops::OpOptions ar_base;
    ar_base.use_cache = false;
    auto ar_call = [&](ops::OpOptions op) { return [&, op] { ops::gemm_ar(ctx, ar_args(next()), op); }; };
    {
      ops::OpOptions op = ar_base;
      op.strategy = Strategy::sequential;
      timer.add(&ar.seq, ar_call(op));
      if (rs_ce_ok) {
        op.strategy = Strategy::fused_ce;
        timer.add(&ar_ce, ar_call(op));
      }
    }
    timer.add(&ar.tes, ar_call(ar_base));

    // ---- whole layer (gated AG+GEMM, then GEMM+RS) -----------------------------
    auto mlp_call = [&](ops::OpOptions oa, ops::OpOptions orr) {
      return [&, oa, orr] {
        auto& s = next();
        ops::MlpArgs ma{s.x->p, s.wgu->p, s.wd->p, out.p, m, ml, h, il, t};
        ops::mlp(ctx, ma, oa, orr);
      };
    };
    ops::OpOptions oa = ag_base, orr = rs_base;
    PartResult ml_r;
    double ml_ce = 0, ml_sm = 0, ml_cece = 0;
    oa.strategy = orr.strategy = Strategy::sequential;
    timer.add(&ml_r.seq, mlp_call(oa, orr));
    oa.strategy = orr.strategy = Strategy::decomposition;
    timer.add(&ml_r.dec, mlp_call(oa, orr));
    orr.strategy = Strategy::fused_sm;
    oa.strategy = Strategy::fused_ce;
    timer.add(&ml_ce, mlp_call(oa, orr));
    oa.strategy = Strategy::fused_sm;
    timer.add(&ml_sm, mlp_call(oa, orr));
    if (rs_ce_ok) {
      oa.strategy = orr.strategy = Strategy::fused_ce;
      timer.add(&ml_cece, mlp_call(oa, orr));
    }
    if (o.variants) {
      // The same two fused halves as separate calls (hidden in the input set
      // rather than ops::mlp's own buffer): isolates what mlp() adds.
      ops::OpOptions oce = ag_base, osm = rs_base;
      oce.strategy = Strategy::fused_ce;
      osm.strategy = Strategy::fused_sm;
      variant("MLP", "fused_ce+fused_sm as two calls", [&, oce, osm] {
        auto& s = next();
        ops::ag_gemm(ctx, ag_args(s, true, s.hid->p), oce);
        ops::gemm_rs(ctx, rs_args(s), osm);
      });
    }
    ops::OpOptions oauto = ag_base, rauto = rs_base;
    timer.add(&ml_r.tes, mlp_call(oauto, rauto));

    // Tune here, as the first automatic call would (same collective
    // measurement, then memoized), to print what the tuner measured.
    ops::TuneReport tuned[4];
    for (int gated = 0; gated < 2; ++gated) ctx.resolve(ag_args(in[0], gated, agout.p), ag_base, &tuned[gated]);
    ctx.resolve(rs_args(in[0]), rs_base, &tuned[2]);
    ctx.resolve(ar_args(in[0]), ar_base, &tuned[3]);
    if (pg->rank() == 0) {
      const char* parts[4] = {"AG+GEMM", "AG+GEMM gated", "GEMM+RS", "GEMM+AR"};
      for (int i = 0; i < 4; ++i) {
        std::string times;
        for (const auto& [k, v] : tuned[i].times_ms) times += fmt::format(" {} {:.3f}", ops::strategy_name(k), v);
        fmt::print("{} {}: tuner chose {} ({}; ms:{}; load GEMMs {:.3f} ms)\n", sh.name, parts[i],
                   ops::strategy_name(tuned[i].chosen), tuned[i].from_cache ? "cached" : "measured", times,
                   tuned[i].load_ms);
      }
    }
    timer.run([&](double median) { return pg->allreduce_max(median); });
    ag_res[1].comm = ag_res[0].comm;
    Strategy ag_best[2];
    for (int gated = 0; gated < 2; ++gated) {
      PartResult& r = ag_res[gated];
      r.seq = ag_tm[gated][Strategy::sequential];
      r.dec = ag_tm[gated][Strategy::decomposition];
      ag_best[gated] = ag_tm[gated][Strategy::fused_ce] <= ag_tm[gated][Strategy::fused_sm] ? Strategy::fused_ce
                                                                                            : Strategy::fused_sm;
      r.best = ag_tm[gated][ag_best[gated]];
      r.which = std::string(ops::strategy_name(ag_best[gated]));
      r.choice = std::string(ops::strategy_name(ctx.resolve(ag_args(in[0], gated, agout.p), ag_base)));
      add(gated ? "AG+GEMM gated" : "AG+GEMM", r, std::max(r.gemm, r.comm));
    }
    const bool ce_wins = rs_ce_ok && rs_ce < rs_sm;
    rs.best = ce_wins ? rs_ce : rs_sm;
    rs.which = ce_wins ? "fused_ce" : "fused_sm";
    rs.choice = std::string(ops::strategy_name(ctx.resolve(rs_args(in[0]), rs_base)));
    add("GEMM+RS", rs, std::max(rs.gemm, rs.comm));
    ar.gemm = rs.gemm;
    ar.engine = rs.engine;
    if (rs_ce_ok) {
      ar.best = ar_ce;
      ar.which = "fused_ce";
    }
    ar.choice = std::string(ops::strategy_name(ctx.resolve(ar_args(in[0]), ar_base)));
    add("GEMM+AR", ar, std::max(ar.gemm, ar.comm));
    const PartResult& g = ag_res[1];
    ml_r.gemm = g.gemm + rs.gemm;
    ml_r.engine = g.engine + rs.engine;
    ml_r.comm = g.comm + rs.comm;
    ml_r.best = std::min(ml_ce, ml_sm);
    ml_r.which = ml_ce <= ml_sm ? "fused_ce+fused_sm" : "fused_sm+fused_sm";
    if (rs_ce_ok && ml_cece < ml_r.best) {
      ml_r.best = ml_cece;
      ml_r.which = "fused_ce+fused_ce";
    }
    ml_r.choice = g.choice + "+" + rs.choice;
    add("MLP", ml_r, std::max(g.gemm, g.comm) + std::max(rs.gemm, rs.comm));
    auto seq_of = [&](const std::string& part_name) {
      if (part_name == "AG+GEMM") return ag_res[0].seq;
      if (part_name == "AG+GEMM gated") return ag_res[1].seq;
      if (part_name == "GEMM+RS") return rs.seq;
      if (part_name == "GEMM+AR") return ar.seq;
      return ml_r.seq;
    };
    auto var_row = [&](const std::string& part_name, const std::string& name, double v) {
      var.add({sh.name, part_name, name, ms(v), fmt::format("{:.2f}x", seq_of(part_name) / v)});
    };
    for (int gated = 0; gated < 2; ++gated) {
      const char* part_name = gated ? "AG+GEMM gated" : "AG+GEMM";
      var_row(part_name, "fused_ce ch=" + std::to_string(o.channels), ag_tm[gated][Strategy::fused_ce]);
      var_row(part_name, "fused_sm ctas=" + std::to_string(o.comm_ctas), ag_tm[gated][Strategy::fused_sm]);
    }
    var_row("GEMM+RS", "fused_sm reduce=epilogue", rs_sm);
    if (rs_ce_ok) var_row("GEMM+RS", "fused_ce (copy engine)", rs_ce);
    if (rs_ce_ok) var_row("GEMM+AR", "fused_ce (copy engine)", ar_ce);
    var_row("MLP", "fused_ce+fused_sm", ml_ce);
    var_row("MLP", "fused_sm+fused_sm", ml_sm);
    if (rs_ce_ok) var_row("MLP", "fused_ce+fused_ce", ml_cece);
    for (const Variant& v : variants) var_row(v.part, v.name, v.ms);
  }
  if (rank == 0) {
    const std::string head = fmt::format(
        "bench mlp: TP={} {} on {} (ms, median of {}, max over ranks, inputs rotated "
        "over {} sets, {})",
        R, o.dtype, pg->device_properties().name, o.reps, o.sets,
        fmt::format("{}{}", o.lead ? "lead GEMM before each run" : "no lead GEMM",
                    o.gap_ms > 0 ? fmt::format(", {} ms idle before", o.gap_ms) : std::string()));
    fmt::print("tessera {}\n{}", head, table.str());
    const bool var_table = o.variants || o.kernel_only;
    if (var_table) fmt::print("\nfused variants:\n{}", var.str());
    if (!o.markdown.empty()) {
      std::ofstream f(o.markdown, std::ios::app);
      TESSERA_CHECK(f.good(), "bench mlp: cannot open {}", o.markdown);
      f << "\n### " << head << "\n\n" << table.markdown() << "\n";
      if (var_table) f << "\nFused variants (A/B of OpOptions):\n\n" << var.markdown() << "\n";
    }
  }
}

}  // namespace

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto& bench = tools::subcommand(root, "bench", "Benchmarks");
  auto opts = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("mlp",
                                   "Tensor-parallel MLP (MLP-1..6): AG+GEMM (plain and gated), GEMM+RS, whole "
                                   "layer vs sequential, decomposition and ideal");
  cmd->add_option("--shapes", opts->shapes, "MLP shape numbers (1..6)")->delimiter(',');
  cmd->add_option("--dtype", opts->dtype, "bf16 or f16");
  cmd->add_option("--reps", opts->reps, "timed repetitions (median)")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", opts->warmup, "warm-up repetitions")->check(CLI::Range(0, 100000));
  cmd->add_option("--sets", opts->sets, "input buffer sets rotated between runs")->check(CLI::Range(1, 16));
  cmd->add_option("--gap-ms", opts->gap_ms,
                  "idle the GPU this long before every timed run (0: back to back, power-capped clocks)")
      ->check(CLI::Range(0.0, 1000.0));
  cmd->add_flag("--lead,!--no-lead", opts->lead,
                "queue a ~0.7 ms lead GEMM before every timed run (the run starts on a busy GPU, host ahead; "
                "--no-lead: start each run from an idle GPU)");
  cmd->add_option("--channels", opts->channels, "AG channels per shard")->check(CLI::Range(1, 32));
  cmd->add_option("--comm-ctas", opts->comm_ctas, "CTAs for SM pushes / reductions")->check(CLI::Range(1, 64));
  cmd->add_flag("--variants,!--no-variants", opts->variants,
                "print the fused-variant A/B table (--no-variants: skip it)");
  cmd->add_flag("--kernel-only,!--no-kernel-only", opts->kernel_only,
                "time the fused_ce kernels without their communication (OpOptions::diag_kernel_only; rows in the "
                "variant table; default on)");
  cmd->add_flag("--kernel-split,!--no-kernel-split", opts->kernel_split,
                "with --kernel-only: GEMM+RS kernel-only rows with the owner add, band waits or notify adds left out "
                "(OpOptions::diag_skip)");
  cmd->add_option("--markdown", opts->markdown, "append the tables (markdown) to this file");
  cmd->callback([opts] { run(*opts); });
});

}  // namespace tessera::bench
