// `tessera bench mlp` — the tensor-parallel MLP (WORKLOADS.md MLP-1..6) at
// TP = world size: per shape and per half (AG+GEMM with the fused gate/up
// weight and SiLU·up, GEMM+RS) and for the whole layer: GEMM alone
// (cuBLASLt), communication alone (NCCL AllGather / ReduceScatter), the
// sequential baseline, decomposition, Tessera (each fused strategy; the
// best is reported), ideal = max(GEMM, comm), speedup over sequential and
// fraction of ideal. Times are medians of --reps, max over ranks.
// Run with: tessera run -n R -- tessera bench mlp [--shapes 1,2,3] [--markdown FILE]
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "command.hpp"
#include "common/timing.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/ops/tp_mlp.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::bench {
namespace {

struct MlpShape {
  const char* name;
  std::int64_t s, h, i;
};
constexpr MlpShape kMlp[] = {{"MLP-1", 8192, 4096, 11008}, {"MLP-2", 8192, 4096, 14336},
                             {"MLP-3", 8192, 3584, 14336}, {"MLP-4", 8192, 4608, 36864},
                             {"MLP-5", 8192, 8192, 28672}, {"MLP-6", 8192, 8192, 29568}};

struct Options {
  std::vector<int> shapes{1, 2, 3, 4, 5, 6};
  std::string dtype = "bf16";
  int reps = 20, warmup = 5;
  int channels = 4, comm_ctas = 16;
  std::string markdown;
};

struct Buf {
  void* p = nullptr;
  explicit Buf(std::size_t bytes) { TESSERA_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 16))); }
  ~Buf() { cudaFree(p); }
};

void fill_random(void* p, std::size_t elems, std::uint64_t seed) {
  // Small random bf16/f16 bit patterns of magnitude < 1 (exponent limited), so
  // sums neither overflow nor denormalize; the bench does not check values.
  std::vector<std::uint16_t> h(elems);
  std::mt19937_64 g(seed);
  for (auto& x : h) x = static_cast<std::uint16_t>((g() & 0x807F) | 0x3A00);
  TESSERA_CUDA_CHECK(cudaMemcpy(p, h.data(), elems * 2, cudaMemcpyHostToDevice));
}

std::string ms(double v) { return fmt::format("{:.3f}", v); }

void run(const Options& o) {
  auto pg = runtime::ProcessGroup::from_environment();
  const int R = pg->world(), rank = pg->rank();
  const DType t = o.dtype == "f16" ? DType::f16 : DType::bf16;
  TESSERA_CHECK(o.dtype == "bf16" || o.dtype == "f16", "bench mlp: --dtype {} (bf16 or f16)", o.dtype);
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
  Table table({"shape", "part", "GEMM", "comm", "sequential", "decomp", "tessera", "best fused", "ideal", "speedup",
               "of ideal"});
  for (int idx : o.shapes) {
    TESSERA_CHECK(idx >= 1 && idx <= 6, "bench mlp: shape {} not in 1..6", idx);
    const MlpShape sh = kMlp[idx - 1];
    TESSERA_CHECK(sh.i % R == 0 && sh.s % R == 0, "bench mlp: {} does not split over {} ranks", sh.name, R);
    const std::int64_t m = sh.s, ml = sh.s / R, h = sh.h, il = sh.i / R;
    Buf x(ml * h * 2), wgu(2 * il * h * 2), wd(h * il * 2), hid(m * il * 2), out(ml * h * 2), tmp(m * 2 * il * 2);
    Buf xfull(m * h * 2), part(m * h * 2);
    fill_random(x.p, ml * h, 1 + rank);
    fill_random(wgu.p, 2 * il * h, 2 + rank);
    fill_random(wd.p, h * il, 3 + rank);
    fill_random(hid.p, m * il, 4 + rank);

    // ---- AG + GEMM (gate/up, SiLU·up) ----------------------------------------
    kernels::GemmArgs g1{xfull.p, wgu.p, tmp.p, m, 2 * il, h, h, h, 2 * il, t, t, kernels::BLayout::NK};
    const double ag_gemm_t = timed([&] { kernels::cublaslt_gemm(g1, st); });
    const double ag_comm_t = timed([&] {
      TESSERA_NCCL_CHECK(ncclAllGather(x.p, xfull.p, static_cast<std::size_t>(ml * h), nt, pg->nccl(), st));
    });
    ops::AgGemmArgs ag;
    ag.a = x.p;
    ag.b = wgu.p;
    ag.d = hid.p;
    ag.m = m;
    ag.m_local = ml;
    ag.n = 2 * il;
    ag.k = h;
    ag.dtype = t;
    ag.swiglu = true;
    std::map<ops::Strategy, double> ag_t;
    for (auto s : {ops::Strategy::sequential, ops::Strategy::decomposition, ops::Strategy::fused_ce,
                   ops::Strategy::fused_sm}) {
      ops::OpOptions op;
      op.strategy = s;
      op.channels = o.channels;
      op.comm_ctas = o.comm_ctas;
      ag_t[s] = timed([&] { ops::ag_gemm(ctx, ag, op); });
    }
    // ---- GEMM + RS ----------------------------------------------------------
    kernels::GemmArgs g2{hid.p, wd.p, part.p, m, h, il, il, il, h, t, t, kernels::BLayout::NK};
    const double rs_gemm_t = timed([&] { kernels::cublaslt_gemm(g2, st); });
    const double rs_comm_t = timed([&] {
      TESSERA_NCCL_CHECK(ncclReduceScatter(part.p, out.p, static_cast<std::size_t>(ml * h), nt, ncclSum, pg->nccl(), st));
    });
    ops::GemmRsArgs rs;
    rs.a = hid.p;
    rs.b = wd.p;
    rs.d = out.p;
    rs.m = m;
    rs.m_local = ml;
    rs.n = h;
    rs.k = il;
    rs.dtype = t;
    std::map<ops::Strategy, double> rs_t;
    for (auto s : {ops::Strategy::sequential, ops::Strategy::decomposition, ops::Strategy::fused_sm}) {
      ops::OpOptions op;
      op.strategy = s;
      op.comm_ctas = o.comm_ctas;
      rs_t[s] = timed([&] { ops::gemm_rs(ctx, rs, op); });
    }
    // ---- whole layer ---------------------------------------------------------
    ops::MlpArgs ma{x.p, wgu.p, wd.p, out.p, m, ml, h, il, t};
    auto best_of = [](const std::map<ops::Strategy, double>& tm) {
      ops::Strategy b = ops::Strategy::fused_sm;
      double v = 1e30;
      for (auto& [s, x] : tm)
        if ((s == ops::Strategy::fused_ce || s == ops::Strategy::fused_sm) && x < v) v = x, b = s;
      return b;
    };
    auto mlp_time = [&](ops::Strategy a, ops::Strategy r) {
      ops::OpOptions oa, orr;
      oa.strategy = a;
      oa.channels = o.channels;
      oa.comm_ctas = o.comm_ctas;
      orr.strategy = r;
      orr.comm_ctas = o.comm_ctas;
      return timed([&] { ops::mlp(ctx, ma, oa, orr); });
    };
    const double mlp_seq = mlp_time(ops::Strategy::sequential, ops::Strategy::sequential);
    const double mlp_dec = mlp_time(ops::Strategy::decomposition, ops::Strategy::decomposition);
    const auto ag_best = best_of(ag_t), rs_best = best_of(rs_t);
    const double mlp_tes = mlp_time(ag_best, rs_best);

    auto add = [&](const char* part, double gm, double cm, double seq, double dec, double tes, std::string which,
                   double ideal) {
      table.add({sh.name, part, ms(gm), ms(cm), ms(seq), ms(dec), ms(tes), which, ms(ideal),
                 fmt::format("{:.2f}x", seq / tes), fmt::format("{:.0f}%", 100.0 * ideal / tes)});
    };
    const double ag_ideal = std::max(ag_gemm_t, ag_comm_t), rs_ideal = std::max(rs_gemm_t, rs_comm_t);
    add("AG+GEMM", ag_gemm_t, ag_comm_t, ag_t[ops::Strategy::sequential], ag_t[ops::Strategy::decomposition],
        ag_t[ag_best], std::string(ops::strategy_name(ag_best)), ag_ideal);
    add("GEMM+RS", rs_gemm_t, rs_comm_t, rs_t[ops::Strategy::sequential], rs_t[ops::Strategy::decomposition],
        rs_t[rs_best], std::string(ops::strategy_name(rs_best)), rs_ideal);
    add("MLP", ag_gemm_t + rs_gemm_t, ag_comm_t + rs_comm_t, mlp_seq, mlp_dec, mlp_tes,
        fmt::format("{}+{}", ops::strategy_name(ag_best), ops::strategy_name(rs_best)), ag_ideal + rs_ideal);
  }
  if (rank == 0) {
    fmt::print("tessera bench mlp: TP={} {} on {} (ms, median of {}, max over ranks)\n{}", R, o.dtype,
               pg->device_properties().name, o.reps, table.str());
    if (!o.markdown.empty()) {
      std::ofstream f(o.markdown, std::ios::app);
      TESSERA_CHECK(f.good(), "bench mlp: cannot open {}", o.markdown);
      f << fmt::format("\n### bench mlp: TP={} {} on {}\n\n", R, o.dtype, pg->device_properties().name)
        << table.markdown() << "\n";
    }
  }
}

}  // namespace

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto& bench = tools::subcommand(root, "bench", "Benchmarks");
  auto opts = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("mlp", "Tensor-parallel MLP (MLP-1..6): AG+GEMM, GEMM+RS, whole layer vs "
                                          "sequential, decomposition and ideal");
  cmd->add_option("--shapes", opts->shapes, "MLP shape numbers (1..6)")->delimiter(',');
  cmd->add_option("--dtype", opts->dtype, "bf16 or f16");
  cmd->add_option("--reps", opts->reps, "timed repetitions (median)")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", opts->warmup, "warm-up repetitions")->check(CLI::Range(0, 100000));
  cmd->add_option("--channels", opts->channels, "AG channels per shard")->check(CLI::Range(1, 32));
  cmd->add_option("--comm-ctas", opts->comm_ctas, "CTAs for SM pushes / reductions")->check(CLI::Range(1, 64));
  cmd->add_option("--markdown", opts->markdown, "append the table (markdown) to this file");
  cmd->callback([opts] { run(*opts); });
});

}  // namespace tessera::bench
