// `tessera bench commir` — CommIR's GPU executor against the hand-built
// operators (ops::) on the tensor-parallel MLP GEMMs. Issue 6 asks the
// executor's TP GEMM plans to be within 10% of the hand-built operators.
//
//   tessera run -n 2 -- tessera bench commir [--shapes 1,2,3] [--reps 10]
//
// Column-parallel (AG + GEMM): C[S, I] = A[S, H] · B[H, I] over R ranks,
// plans ag_gemm / async_ag_gemm, against ops::ag_gemm (N = I/R per rank).
// Row-parallel (GEMM + RS):    C[S, H] = A[S, I] · B[I, H], plans gemm_rs /
// async_gemm_rs, against ops::gemm_rs (K = I/R per rank).
// Executor: bf16 inputs, f32 accumulators/outputs (more bytes stored than
// ops' bf16 outputs: noted in the table). A GpuExecutor runs once, so each
// repetition builds one (outside the timed region) and times run() from the
// first enqueue to the completion of both of its streams.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "command.hpp"
#include "common/mlp_shapes.hpp"
#include "common/timing.hpp"
#include "tessera/commir/gpu_executor.hpp"
#include "tessera/commir/schedules.hpp"
#include "tessera/ops/tp_mlp.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::bench {
namespace {

struct CommirOptions {
  std::vector<int> shapes{1, 2, 3};
  int reps = 10;
  int warmup = 2;
  std::string markdown;
};

// Cheap deterministic fill in [-1, 1) (values only have to be finite and
// varied; correctness is the tests' job).
std::vector<float> fill(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& f : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    f = static_cast<float>(static_cast<std::int64_t>(x >> 40) - (1 << 23)) / static_cast<float>(1 << 23);
  }
  return v;
}

/// Median over reps of one plan's run(), slowest rank.
double time_plan(runtime::ProcessGroup& pg, const commir::Plan& plan, const std::vector<float>& A,
                 const std::vector<float>& B, const CommirOptions& o) {
  cudaEvent_t start, stop, comm_done;
  TESSERA_CUDA_CHECK(cudaEventCreate(&start));
  TESSERA_CUDA_CHECK(cudaEventCreate(&stop));
  TESSERA_CUDA_CHECK(cudaEventCreate(&comm_done));
  std::vector<double> times;
  for (int it = 0; it < o.warmup + o.reps; ++it) {
    commir::GpuExecutor ex(plan, pg.rank(), pg.nccl(), pg.stream(), pg.comm_stream(0));
    ex.set_input("A", A);
    ex.set_input("B", B);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    pg.barrier();
    TESSERA_CUDA_CHECK(cudaEventRecord(start, pg.stream()));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(pg.comm_stream(0), start, 0));
    ex.run();
    TESSERA_CUDA_CHECK(cudaEventRecord(comm_done, pg.comm_stream(0)));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(pg.stream(), comm_done, 0));
    TESSERA_CUDA_CHECK(cudaEventRecord(stop, pg.stream()));
    TESSERA_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (it >= o.warmup) times.push_back(ms);
  }
  TESSERA_CUDA_CHECK(cudaEventDestroy(start));
  TESSERA_CUDA_CHECK(cudaEventDestroy(stop));
  TESSERA_CUDA_CHECK(cudaEventDestroy(comm_done));
  return pg.allreduce_max(summarize(times).median_ms);
}

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(std::size_t bytes) {
    TESSERA_CUDA_CHECK(cudaMalloc(&p, bytes));
    TESSERA_CUDA_CHECK(cudaMemset(p, 0, bytes));
  }
  ~DevBuf() { cudaFree(p); }
};

void run_commir(const CommirOptions& o) {
  auto pg = runtime::ProcessGroup::from_environment();
  const int R = pg->world();
  TESSERA_CHECK(R >= 2, "bench commir needs at least 2 ranks (tessera run -n 2 -- tessera bench commir)");
  ops::TpContext ctx(*pg);
  cudaStream_t s = pg->stream();
  auto barrier = [&] {
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(s));
    pg->barrier();
  };
  Table table({"shape", "part", "plan", "commir", "ops seq", "ops tuned", "tuned =", "commir / ops best"});
  for (int idx : o.shapes) {
    const MlpShape& sh = mlp_shape(idx);
    TESSERA_CHECK(sh.i % R == 0 && sh.s % R == 0, "{}: I = {} and S = {} must divide by {} ranks", sh.name, sh.i, sh.s,
                  R);
    const std::int64_t il = sh.i / R, ml = sh.s / R;
    for (const bool column : {true, false}) {
      // Executor inputs: full host tensors (each rank uploads its region).
      const std::int64_t M = sh.s, N = column ? sh.i : sh.h, K = column ? sh.h : sh.i;
      const std::vector<float> A = fill(static_cast<std::size_t>(M * K), 1), B = fill(static_cast<std::size_t>(K * N), 2);
      // ops operands (bf16, contents irrelevant for timing; zero is avoided by
      // the executor's random data only — ops' GEMM runs the same work).
      DevBuf a(static_cast<std::size_t>((column ? ml : M) * (column ? K : il)) * 2);
      DevBuf b(static_cast<std::size_t>((column ? il : N) * (column ? K : il)) * 2);
      DevBuf d(static_cast<std::size_t>((column ? M : ml) * (column ? il : N)) * 2);
      auto time_ops = [&](ops::Strategy st) {
        ops::OpOptions oo;
        oo.strategy = st;
        if (column) {
          ops::AgGemmArgs g{a.p, b.p, d.p, M, ml, il, K};
          return pg->allreduce_max(time_on_stream(s, [&] { ops::ag_gemm(ctx, g, oo); }, o.warmup, o.reps, barrier).median_ms);
        }
        ops::GemmRsArgs g{a.p, b.p, d.p, M, ml, N, il};
        return pg->allreduce_max(time_on_stream(s, [&] { ops::gemm_rs(ctx, g, oo); }, o.warmup, o.reps, barrier).median_ms);
      };
      const double seq = time_ops(ops::Strategy::sequential);
      ops::TuneReport rep;
      if (column) {
        ops::AgGemmArgs g{a.p, b.p, d.p, M, ml, il, K};
        ctx.resolve(g, {}, &rep);
      } else {
        ops::GemmRsArgs g{a.p, b.p, d.p, M, ml, N, il};
        ctx.resolve(g, {}, &rep);
      }
      const double tuned = time_ops(rep.chosen);
      for (const char* name : column ? std::vector<const char*>{"ag_gemm", "async_ag_gemm"}
                                     : std::vector<const char*>{"gemm_rs", "async_gemm_rs"}) {
        const commir::Plan plan = commir::lower(commir::scheduled(commir::make_gemm(M, N, K, {R}), name));
        const double t = time_plan(*pg, plan, A, B, o);
        table.add({sh.name, column ? "AG+GEMM" : "GEMM+RS", name, fmt::format("{:.3f}", t), fmt::format("{:.3f}", seq),
                   fmt::format("{:.3f}", tuned), std::string(ops::strategy_name(rep.chosen)),
                   fmt::format("{:.2f}", t / std::min(seq, tuned))});
      }
    }
  }
  if (pg->rank() == 0) {
    std::printf("tessera bench commir: TP=%d on %s (ms, median of %d, slowest rank; executor stores f32, ops bf16)\n%s",
                R, pg->device_properties().name, o.reps, table.str().c_str());
    if (!o.markdown.empty()) {
      std::ofstream f(o.markdown, std::ios::app);
      f << table.markdown();
      TESSERA_CHECK(f.good(), "cannot write {}", o.markdown);
    }
  }
  barrier();
}

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto& bench = tools::subcommand(root, "bench", "Benchmarks (run multi-GPU ones under `tessera run -n N --`)");
  auto opts = std::make_shared<CommirOptions>();
  auto* cmd = bench.add_subcommand("commir", "CommIR GPU executor's TP GEMM plans vs the hand-built ops");
  cmd->add_option("--shapes", opts->shapes, "MLP shape numbers (1..6)")->delimiter(',');
  cmd->add_option("--reps", opts->reps, "timed repetitions")->check(CLI::Range(1, 1000));
  cmd->add_option("--warmup", opts->warmup, "warm-up repetitions")->check(CLI::Range(0, 1000));
  cmd->add_option("--markdown", opts->markdown, "append the table as Markdown to this file (rank 0)");
  cmd->callback([opts] { run_commir(*opts); });
});

}  // namespace
}  // namespace tessera::bench
