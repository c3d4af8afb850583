// `tessera bench mlp` — the tensor-parallel MLP (WORKLOADS.md MLP-1..6) at
// TP = world size R. Per shape, three parts and the whole layer:
//   AG+GEMM        — column-parallel GEMM1 as in MACHINES.md's baselines:
//                    AllGather(x)[S, H] · W[I/R, H]ᵀ (non-gated, N = I/R)
//   AG+GEMM gated  — the same with the fused gate/up weight (N = 2·I/R) and
//                    SiLU(gate)·up (what ops::mlp runs)
//   GEMM+RS        — row-parallel GEMM2 [S, I/R] · Wd[H, I/R]ᵀ + ReduceScatter
//   MLP            — ops::mlp (gated AG+GEMM then GEMM+RS)
// Columns: GEMM alone (cuBLASLt, the full per-rank GEMM [S, N, K]; for the
// gated part the GEMM only, without the activation) and its TFLOP/s, the
// engine's plain GEMM at the fused tile (ping-pong 64x256) on the same data, comm
// alone (NCCL AllGather / ReduceScatter), sequential, decomposition, the best
// fused strategy at default options (and which), Tessera = what ops:: runs
// with Strategy::automatic (the tuner's choice, never slower than sequential;
// measured fresh: no on-disk cache), ideal = max(GEMM, comm), speedup of
// Tessera over sequential and fraction of ideal. A second table lists every
// fused variant (options A/B) with its speedup over sequential.
//
// Inputs: fresh random data (never zeros: a zero operand lowers the GEMM's
// power draw and inflates its rate), rotated over --sets buffer sets so no
// repetition finds its inputs in L2 (bench/gemm's convention). Times are
// medians of --reps, each repetition after a device sync and a barrier, max
// over ranks.
// Run with: tessera run -n R -- tessera bench mlp [--shapes 1,2,3] [--markdown FILE]
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
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
  int channels = 4, comm_ctas = 16;
  bool variants = true;
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

std::string ms(double v) { return fmt::format("{:.3f}", v); }

using ops::Strategy;

void run(const Options& o) {
  auto pg = runtime::ProcessGroup::from_environment();
  const int R = pg->world(), rank = pg->rank();
  TESSERA_CHECK(o.dtype == "bf16" || o.dtype == "f16", "bench mlp: --dtype {} (bf16 or f16)", o.dtype);
  const DType t = o.dtype == "f16" ? DType::f16 : DType::bf16;
  ops::TpContext ctx(*pg);
  cudaStream_t st = pg->stream();
  const ncclDataType_t nt = t == DType::f16 ? ncclFloat16 : ncclBfloat16;
  auto timed = [&](const std::function<void()>& body) {
    const Stats s = time_on_stream(st, body, o.warmup, o.reps, [&] {
      TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
      pg->barrier();
    });
    return pg->allreduce_max(s.median_ms);
  };
  Table table({"shape", "part", "GEMM", "GEMM TF/s", "engine", "comm", "sequential", "decomp", "best fused", "which",
               "tessera", "choice", "ideal", "speedup", "of ideal"});
  Table var({"shape", "part", "variant", "ms", "vs sequential"});
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
                 r.choice, ms(ideal), fmt::format("{:.2f}x", r.seq / r.tes), fmt::format("{:.0f}%", 100.0 * ideal / r.tes)});
    };
    auto variant = [&](const char* part_name, const std::string& name, double v, double seq) {
      var.add({sh.name, part_name, name, ms(v), fmt::format("{:.2f}x", seq / v)});
    };

    // ---- AG + GEMM (non-gated N = I/R, and gated N = 2·I/R with SiLU·up) -----
    const double ag_comm = timed([&] {
      auto& s = next();
      TESSERA_NCCL_CHECK(ncclAllGather(s.x->p, s.xfull->p, static_cast<std::size_t>(ml * h), nt, pg->nccl(), st));
    });
    std::map<bool, PartResult> ag_res;
    std::map<bool, Strategy> ag_best;
    for (bool gated : {false, true}) {
      PartResult r;
      const std::int64_t n = gated ? 2 * il : il;
      r.flop = 2.0 * m * n * h;
      r.comm = ag_comm;
      auto gemm_args = [&](InputSet& s) {
        return kernels::GemmArgs{s.xfull->p, s.wgu->p, gemm_out.p, m, n, h, h, h, n, t, t, kernels::BLayout::NK};
      };
      r.gemm = timed([&] { kernels::cublaslt_gemm(gemm_args(next()), st); });
      const kernels::GemmOptions eo;  // the plain engine default: ping-pong 64x256, the fused ops' tile
      r.engine = timed([&] { kernels::gemm(gemm_args(next()), eo, st); });
      auto ag_args = [&](InputSet& s) {
        ops::AgGemmArgs a;
        a.a = s.x->p;
        a.b = s.wgu->p;
        a.d = agout.p;
        a.m = m;
        a.m_local = ml;
        a.n = n;
        a.k = h;
        a.ldd = il;
        a.dtype = t;
        a.swiglu = gated;
        return a;
      };
      auto time_ag = [&](ops::OpOptions op) { return timed([&] { ops::ag_gemm(ctx, ag_args(next()), op); }); };
      ops::OpOptions base;
      base.channels = o.channels;
      base.comm_ctas = o.comm_ctas;
      base.use_cache = false;
      std::map<Strategy, double> tm;
      for (Strategy s : {Strategy::sequential, Strategy::decomposition, Strategy::fused_ce, Strategy::fused_sm}) {
        ops::OpOptions op = base;
        op.strategy = s;
        tm[s] = time_ag(op);
      }
      r.seq = tm[Strategy::sequential];
      r.dec = tm[Strategy::decomposition];
      const Strategy best = tm[Strategy::fused_ce] <= tm[Strategy::fused_sm] ? Strategy::fused_ce : Strategy::fused_sm;
      r.best = tm[best];
      r.which = std::string(ops::strategy_name(best));
      ag_best[gated] = best;
      ops::OpOptions automatic = base;  // Strategy::automatic: the tuner decides (first call measures)
      r.tes = time_ag(automatic);
      r.choice = std::string(ops::strategy_name(ctx.resolve(ag_args(in[0]), automatic)));
      const char* part_name = gated ? "AG+GEMM gated" : "AG+GEMM";
      add(part_name, r, std::max(r.gemm, r.comm));
      ag_res[gated] = r;
      if (o.variants) {
        variant(part_name, "fused_ce ch=" + std::to_string(o.channels), tm[Strategy::fused_ce], r.seq);
        variant(part_name, "fused_sm ctas=" + std::to_string(o.comm_ctas), tm[Strategy::fused_sm], r.seq);
        for (int ch : {1, 8}) {
          if (ch == o.channels) continue;
          ops::OpOptions op = base;
          op.strategy = Strategy::fused_ce;
          op.channels = ch;
          variant(part_name, "fused_ce ch=" + std::to_string(ch), time_ag(op), r.seq);
        }
        for (int cc : {4, 8}) {
          if (cc == o.comm_ctas) continue;
          ops::OpOptions op = base;
          op.strategy = Strategy::fused_sm;
          op.comm_ctas = cc;
          variant(part_name, "fused_sm ctas=" + std::to_string(cc), time_ag(op), r.seq);
        }
      }
    }

    // ---- GEMM + RS ------------------------------------------------------------
    PartResult rs;
    rs.flop = 2.0 * m * h * il;
    rs.gemm = timed([&] {
      auto& s = next();
      kernels::cublaslt_gemm(kernels::GemmArgs{s.hid->p, s.wd->p, part.p, m, h, il, il, il, h, t, t,
                                               kernels::BLayout::NK},
                             st);
    });
    {
      const kernels::GemmOptions eo;  // ping-pong 64x256, as the fused GEMM+RS
      rs.engine = timed([&] {
        auto& s = next();
        kernels::gemm(kernels::GemmArgs{s.hid->p, s.wd->p, part.p, m, h, il, il, il, h, t, t, kernels::BLayout::NK},
                      eo, st);
      });
    }
    rs.comm = timed([&] {
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
    auto time_rs = [&](ops::OpOptions op) { return timed([&] { ops::gemm_rs(ctx, rs_args(next()), op); }); };
    ops::OpOptions rs_base;
    rs_base.comm_ctas = o.comm_ctas;
    rs_base.use_cache = false;
    std::map<std::string, double> rs_var;
    {
      ops::OpOptions op = rs_base;
      op.strategy = Strategy::sequential;
      rs.seq = time_rs(op);
      op.strategy = Strategy::decomposition;
      rs.dec = time_rs(op);
      op.strategy = Strategy::fused_sm;
      op.rs_reduce = ops::RsReduce::epilogue;
      rs_var["fused_sm reduce=epilogue"] = time_rs(op);
      op.rs_reduce = ops::RsReduce::kernel;
      rs_var["fused_sm reduce=kernel ctas=" + std::to_string(o.comm_ctas)] = time_rs(op);
      if (o.variants)
        for (int cc : {4, 8}) {
          if (cc == o.comm_ctas) continue;
          op.comm_ctas = cc;
          rs_var["fused_sm reduce=kernel ctas=" + std::to_string(cc)] = time_rs(op);
        }
    }
    const double rs_fused_default = rs_var["fused_sm reduce=epilogue"];  // OpOptions' default rs_reduce
    rs.best = rs_fused_default;
    rs.which = "fused_sm";
    ops::OpOptions rs_auto = rs_base;
    rs.tes = time_rs(rs_auto);
    rs.choice = std::string(ops::strategy_name(ctx.resolve(rs_args(in[0]), rs_auto)));
    add("GEMM+RS", rs, std::max(rs.gemm, rs.comm));
    if (o.variants)
      for (auto& [name, v] : rs_var) variant("GEMM+RS", name, v, rs.seq);

    // ---- whole layer (gated AG+GEMM, then GEMM+RS) -----------------------------
    auto mlp_time = [&](ops::OpOptions oa, ops::OpOptions orr) {
      return timed([&] {
        auto& s = next();
        ops::MlpArgs ma{s.x->p, s.wgu->p, s.wd->p, out.p, m, ml, h, il, t};
        ops::mlp(ctx, ma, oa, orr);
      });
    };
    ops::OpOptions oa, orr;
    oa.channels = o.channels;
    oa.comm_ctas = o.comm_ctas;
    oa.use_cache = false;
    orr = rs_base;
    PartResult ml_r;
    const PartResult& g = ag_res[true];
    ml_r.gemm = g.gemm + rs.gemm;
    ml_r.engine = g.engine + rs.engine;
    ml_r.comm = g.comm + rs.comm;
    oa.strategy = orr.strategy = Strategy::sequential;
    ml_r.seq = mlp_time(oa, orr);
    oa.strategy = orr.strategy = Strategy::decomposition;
    ml_r.dec = mlp_time(oa, orr);
    oa.strategy = ag_best[true];
    orr.strategy = Strategy::fused_sm;
    ml_r.best = mlp_time(oa, orr);
    ml_r.which = fmt::format("{}+fused_sm", ops::strategy_name(ag_best[true]));
    if (o.variants) {
      // The same two fused halves as separate calls (hidden in the input set
      // rather than ops::mlp's own buffer): isolates what mlp() adds.
      const double two = timed([&] {
        auto& s = next();
        ops::AgGemmArgs ga;
        ga.a = s.x->p;
        ga.b = s.wgu->p;
        ga.d = s.hid->p;
        ga.m = m;
        ga.m_local = ml;
        ga.n = 2 * il;
        ga.k = h;
        ga.ldd = il;
        ga.dtype = t;
        ga.swiglu = true;
        ops::ag_gemm(ctx, ga, oa);
        ops::gemm_rs(ctx, rs_args(s), orr);
      });
      variant("MLP", fmt::format("{}+fused_sm as two calls", ops::strategy_name(ag_best[true])), two, ml_r.seq);
    }
    oa.strategy = orr.strategy = Strategy::automatic;
    ml_r.tes = mlp_time(oa, orr);
    ml_r.choice = g.choice + "+" + rs.choice;
    add("MLP", ml_r, std::max(g.gemm, g.comm) + std::max(rs.gemm, rs.comm));
  }
  if (rank == 0) {
    const std::string head = fmt::format("bench mlp: TP={} {} on {} (ms, median of {}, max over ranks, inputs rotated "
                                         "over {} sets)",
                                         R, o.dtype, pg->device_properties().name, o.reps, o.sets);
    fmt::print("tessera {}\n{}", head, table.str());
    if (o.variants) fmt::print("\nfused variants:\n{}", var.str());
    if (!o.markdown.empty()) {
      std::ofstream f(o.markdown, std::ios::app);
      TESSERA_CHECK(f.good(), "bench mlp: cannot open {}", o.markdown);
      f << "\n### " << head << "\n\n" << table.markdown() << "\n";
      if (o.variants) f << "\nFused variants (A/B of OpOptions):\n\n" << var.markdown() << "\n";
    }
  }
}

}  // namespace

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto& bench = tools::subcommand(root, "bench", "Benchmarks");
  auto opts = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("mlp", "Tensor-parallel MLP (MLP-1..6): AG+GEMM (plain and gated), GEMM+RS, whole "
                                          "layer vs sequential, decomposition and ideal");
  cmd->add_option("--shapes", opts->shapes, "MLP shape numbers (1..6)")->delimiter(',');
  cmd->add_option("--dtype", opts->dtype, "bf16 or f16");
  cmd->add_option("--reps", opts->reps, "timed repetitions (median)")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", opts->warmup, "warm-up repetitions")->check(CLI::Range(0, 100000));
  cmd->add_option("--sets", opts->sets, "input buffer sets rotated between runs")->check(CLI::Range(1, 16));
  cmd->add_option("--channels", opts->channels, "AG channels per shard")->check(CLI::Range(1, 32));
  cmd->add_option("--comm-ctas", opts->comm_ctas, "CTAs for SM pushes / reductions")->check(CLI::Range(1, 64));
  cmd->add_flag("--variants,!--no-variants", opts->variants, "print the fused-variant A/B table (--no-variants: skip it)");
  cmd->add_option("--markdown", opts->markdown, "append the tables (markdown) to this file");
  cmd->callback([opts] { run(*opts); });
});

}  // namespace tessera::bench
