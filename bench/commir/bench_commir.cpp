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
// Executor: bf16 inputs and bf16 outputs (make_gemm's default dtype), like
// ops. One GpuExecutor per plan (allocation, cuBLASLt algorithm choice
// outside the timed region); each repetition times run() from its first
// enqueue to the completion of both of its streams.
//
// Model and prediction (H200 x2, MLP-1; written before the run on the
// commit that introduced it). G(m) = cuBLASLt bf16 GEMM of m rows, as in
// ops' sequential strategy; the last run gave ops seq 0.631 (AG+GEMM) and
// 0.611 (GEMM+RS) ms, of which NCCL AG / RS of 32 MiB per rank ~0.13-0.17.
//  - ag_gemm:   AllGather(A) then G(M): ops' sequential program exactly
//               (B is [K, N] here, [N, K] in ops: another cuBLASLt kernel)
//               -> ~0.63 (ratio to ops best 0.513: ~1.2; no overlap to gain).
//  - async_ag_gemm: step 0 G(M/2) with the P2P exchange of A's other half
//               in flight (GEMM on SMs - 16), step 1 G(M/2): ~2 x 0.26 +
//               ~0.02 contention -> ~0.54 (ratio ~1.05).
//  - gemm_rs:   G(M) partial [M, N] bf16 then ReduceScatter bf16 -> ~0.61
//               (ratio ~1.0 to ops seq 0.611).
//  - async_gemm_rs: G(M/2) for the peer's rows, send (bf16, 32 MiB) in
//               flight during G(M/2) of the own rows (SMs - 16), then the
//               bf16 add of the received partial (~0.03) -> ~0.53-0.55
//               (ratio ~0.9 to ops decomposition 0.598). Lowering now runs
//               the reduction shift in ring reduce-scatter order (step t on
//               rank r computes rows (r + t + 1) mod R), so the last GEMM
//               makes the own rows and nothing moves after it. Run on
//               da267a3 (before that order): 0.796, with an epilogue exchange
//               of the finished rows (32 MiB each way, serial, ~0.11) the
//               order removes -> ~0.68 if the rest of that run's excess over
//               this model (~0.1: the partial transfer not overlapping the
//               second GEMM, NCCL's kernel not starting beside it) stays;
//               that would still be ~1.14x ops, and the next thing to look at.
//               CPU cost model (tuner, h200x2 profile, which waits for the
//               partial before the second GEMM): 0.634 ms.
// The last run before this model (f32 outputs) was 1.5-2.1x ops: f32
// accumulators (memset + beta = 1 read + f32 write = 3x the output bytes of
// ops), f32 ReduceScatter/P2P (2x the bytes), cuBLASLt heuristics and
// descriptors rebuilt on every GEMM call (algo = null), and the AsyncTP
// GEMM+RS second GEMM accumulating into the received partial, so it waited
// for the whole transfer.
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

/// Median over reps of one plan's run(), slowest rank. The executor (its
/// allocations and prepared GEMMs) is built once; run() is repeatable.
double time_plan(runtime::ProcessGroup& pg, const commir::Plan& plan, const std::vector<float>& A,
                 const std::vector<float>& B, const CommirOptions& o) {
  cudaStream_t cs = pg.stream(), ms = pg.comm_stream(0);
  commir::GpuExecutor ex(plan, pg.rank(), pg.nccl(), cs, ms);
  ex.set_input("A", A);
  ex.set_input("B", B);
  cudaEvent_t start, stop, comm_done;
  TESSERA_CUDA_CHECK(cudaEventCreate(&start));
  TESSERA_CUDA_CHECK(cudaEventCreate(&stop));
  TESSERA_CUDA_CHECK(cudaEventCreate(&comm_done));
  std::vector<double> times;
  for (int it = 0; it < o.warmup + o.reps; ++it) {
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    pg.barrier();
    TESSERA_CUDA_CHECK(cudaEventRecord(start, cs));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(ms, start, 0));
    ex.run();
    TESSERA_CUDA_CHECK(cudaEventRecord(comm_done, ms));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, comm_done, 0));
    TESSERA_CUDA_CHECK(cudaEventRecord(stop, cs));
    TESSERA_CUDA_CHECK(cudaEventSynchronize(stop));
    float elapsed = 0;
    TESSERA_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
    if (it >= o.warmup) times.push_back(elapsed);
  }
  (void)ex.output("C");  // waits (bounded) and surfaces an asynchronous NCCL error
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
    std::printf("tessera bench commir: TP=%d on %s (ms, median of %d, slowest rank; executor and ops bf16)\n%s",
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
