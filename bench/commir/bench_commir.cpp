// `tessera bench commir` — CommIR's GPU executor against the hand-built
// operators (ops::) on the tensor-parallel MLP GEMMs. The target: the
// executor's TP GEMM plans within 10% of the hand-built operators.
//
//   tessera run -n 2 -- tessera bench commir [--shapes 1,2,3] [--reps 10]
//   tessera run -n 2 -- tessera bench commir --attention [--seq 16384]
//       [--heads 32] [--kv-heads 8] [--head-dim 128] [--batch 1] [--reps 10]
//       [--mesh AxB]
//
// --attention: every one-level CommIR attention plan
// (`tessera plan attention`: cp, cp_ag, ring, ulysses, tree, tree_rs) on one
// non-causal shape, beside ops::sp_attention's strategies: cp_ag against
// sequential (NCCL all-gather of K/V + the kernel), ring against ring,
// ulysses against ulysses (the target: within 10 % of its hand-built
// counterpart); cp, tree and tree_rs have no counterpart (shown against
// the fastest ops strategy for scale). One interleaved loop, random data,
// each figure the median of the slowest rank; memory per rank: the
// executor's device blocks (inputs, received blocks, partials, output) and
// ops' shards plus sp_attention_workspace_bytes. The layouts differ (the
// executor's blocks are [b, h, s, d], ops' shards [b, s, h, d] in the
// zig-zag order) but the work is the same: non-causal attention of S/R
// queries per rank against all S keys.
// Two-level plans: when the world factors into a 2-D mesh (the smallest
// outer level >= 2 whose inner level is >= 2: 2x2 at R = 4, 2x4 at R = 8) or
// --mesh names one (any AxB = world, 1x2 and 2x1 included), every schedule
// `tessera plan attention` names for it (cp, cp_ag, ring = two_level,
// ulysses, tree, tree_rs over both levels, usp) runs too, labelled
// "<plan> AxB". usp (ring across level 0, Ulysses inside level 1) is
// measured against ops' two_level with Ulysses degree B; the others against
// the fastest ops strategy for scale; MiB/rank as above.
//
// Column-parallel (AG + GEMM): C[S, I] = A[S, H] · B[H, I] over R ranks,
// plans ag_gemm / async_ag_gemm, against ops::ag_gemm (N = I/R per rank).
// Row-parallel (GEMM + RS):    C[S, H] = A[S, I] · B[I, H], plans gemm_rs /
// async_gemm_rs, against ops::gemm_rs (K = I/R per rank).
// Executor: bf16 inputs and bf16 outputs (make_gemm's default dtype), like
// ops; B stored [n, k] (the weight layout ops takes) unless a variant says
// B[k,n]. Every executor variant is built before timing (allocation,
// cuBLASLt algorithm choice); ops sequential, ops' tuned strategy and every
// variant run once per repetition in one interleaved loop (InterleavedTimer),
// on random data all, each figure the median of the slowest rank, a run()
// from its first enqueue to the end of both streams.
//
// Why so: a GEMM on zeros draws less power and holds higher clocks than on
// random data (~10-15% on power-limited GPUs), and whatever runs first runs
// on a cooler GPU, so both sides get random operands and one interleaved
// loop; B is [n, k] on both sides (cuBLASLt "TN"), since the layout changes
// cuBLASLt's kernel. What still differs between async_ag_gemm and ops'
// decomposition: the executor exchanges through NCCL's SM kernel, so its
// step-0 GEMM runs on SMs - 16 (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET) while
// ops pushes with the copy engine and gives both GEMMs every SM; a
// copy-engine exchange in the executor needs symmetric blocks, a
// ProcessGroup and flag signalling with back-pressure across runs
// (runtime/symmetric_heap.hpp and link/host_primitives.hpp have the pieces).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.hpp"
#include "common/mlp_shapes.hpp"
#include "common/results.hpp"
#include "common/timing.hpp"
#include "tessera/commir/gpu_executor.hpp"
#include "tessera/commir/schedules.hpp"
#include "tessera/ops/sp_attention.hpp"
#include "tessera/ops/tp_mlp.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::bench {
namespace {

struct CommirOptions {
  std::vector<int> shapes{1, 2, 3};
  int reps = 10;
  int warmup = 2;
  bool variants = true;  // also B [k,n] and, for the AsyncTP plans, all SMs to the GEMM
  std::string markdown;
  std::string json;  // --attention: bench/results records (rank 0)
  // --attention
  bool attention = false;
  std::int64_t batch = 1, seq = 16384, heads = 32, kv_heads = 8, head_dim = 128;
  std::string mesh;  // --mesh AxB: the two-level mesh (default: two_level_mesh(world))
};

// The 2-D mesh whose plans --attention adds: --mesh when given (its product
// must be the world), else the smallest outer level >= 2 that leaves an
// inner level >= 2; none (empty) when the world has no such factorization.
std::vector<int> two_level_mesh(const CommirOptions& o, int world) {
  if (!o.mesh.empty()) {
    const std::vector<int> m = commir::parse_mesh(o.mesh);
    TESSERA_CHECK(m.size() == 2 && m[0] * m[1] == world,
                  "bench commir --attention: --mesh {} must be two levels AxB with A x B = the world size {}", o.mesh,
                  world);
    return m;
  }
  for (int a = 2; a * 2 <= world; ++a)
    if (world % a == 0) return {a, world / a};
  return {};
}

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

/// One executor variant of a plan, built before anything is timed
/// (allocation and cuBLASLt algorithm choice outside the timed region);
/// run() is repeatable.
struct PlanRun {
  std::string label;
  std::unique_ptr<commir::GpuExecutor> ex;
  double median_ms = 0;
};

/// bf16 device buffer of `count` values filled from fill(count, seed): ops'
/// operands carry random data like the executor's, not zeros — a GEMM on
/// zeros draws less power and runs at higher clocks (up to ~15% faster on a
/// power-limited GPU), which made every ops figure before 2026-11-22 a
/// zero-data figure against a random-data executor.
struct DevBuf {
  void* p = nullptr;
  DevBuf(std::size_t count, std::uint64_t seed) {
    const std::vector<float> v = fill(count, seed);
    std::vector<__nv_bfloat16> h(count);
    for (std::size_t i = 0; i < count; ++i) h[i] = __float2bfloat16(v[i]);
    TESSERA_CUDA_CHECK(cudaMalloc(&p, count * 2));
    TESSERA_CUDA_CHECK(cudaMemcpy(p, h.data(), count * 2, cudaMemcpyHostToDevice));
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
    pg->align_streams(s);  // the ranks start each run together
  };
  cudaStream_t ms = pg->comm_stream(0);
  cudaEvent_t ev = nullptr;
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  Table table({"shape", "part", "plan", "commir", "ops seq", "ops tuned", "tuned =", "commir / ops best"});
  for (int idx : o.shapes) {
    const MlpShape& sh = mlp_shape(idx);
    TESSERA_CHECK(sh.i % R == 0 && sh.s % R == 0, "{}: I = {} and S = {} must divide by {} ranks", sh.name, sh.i, sh.s,
                  R);
    const std::int64_t il = sh.i / R, ml = sh.s / R;
    for (const bool column : {true, false}) {
      // Executor inputs: full host tensors (each rank uploads its region).
      const std::int64_t M = sh.s, N = column ? sh.i : sh.h, K = column ? sh.h : sh.i;
      const std::vector<float> A = fill(static_cast<std::size_t>(M * K), 1),
                               B = fill(static_cast<std::size_t>(K * N), 2);
      // ops operands: bf16, random like the executor's (see DevBuf); B is
      // [N, K] per rank (the weight layout), as the executor stores it by default.
      DevBuf a(static_cast<std::size_t>((column ? ml : M) * (column ? K : il)), 3);
      DevBuf b(static_cast<std::size_t>((column ? il : N) * (column ? K : il)), 4);
      DevBuf d(static_cast<std::size_t>((column ? M : ml) * (column ? il : N)), 5);
      auto run_ops = [&](ops::Strategy st) {
        ops::OpOptions oo;
        oo.strategy = st;
        if (column) {
          ops::AgGemmArgs g{a.p, b.p, d.p, M, ml, il, K};
          ops::ag_gemm(ctx, g, oo);
        } else {
          ops::GemmRsArgs g{a.p, b.p, d.p, M, ml, N, il};
          ops::gemm_rs(ctx, g, oo);
        }
      };
      ops::TuneReport rep;
      if (column) {
        ops::AgGemmArgs g{a.p, b.p, d.p, M, ml, il, K};
        ctx.resolve(g, {}, &rep);
      } else {
        ops::GemmRsArgs g{a.p, b.p, d.p, M, ml, N, il};
        ctx.resolve(g, {}, &rep);
      }
      // Every executor variant of both plans: the default (B [n,k],
      // TESSERA_COMMIR_COMM_SMS reserved beside NCCL), B [k,n] (the layout
      // before 2026-11-22), and for the AsyncTP plans 16 reserved SMs (the old
      // default, 2026-11-22) and every
      // SM to the GEMM (what a copy-engine exchange would allow; with NCCL's
      // kernel in flight it may instead stall the GEMM's last CTAs).
      std::vector<std::pair<std::string, commir::Plan>> plans;  // complete before any executor refers to one
      for (const std::string name : column ? std::vector<std::string>{"ag_gemm", "async_ag_gemm"}
                                           : std::vector<std::string>{"gemm_rs", "async_gemm_rs"})
        plans.push_back({name, commir::lower(commir::scheduled(commir::make_gemm(M, N, K, {R}), name))});
      std::vector<PlanRun> runs;  // after plans: destroyed first (an executor refers to its plan)
      for (const auto& [name, plan] : plans) {
        std::vector<std::pair<std::string, commir::GpuExecutorOptions>> variants{{name, {}}};
        if (o.variants) {
          variants.push_back({name + " B[k,n]", {-1, false}});
          if (name.rfind("async_", 0) == 0) {
            variants.push_back({name + " 16 SMs", {16, true}});
            variants.push_back({name + " all SMs", {0, true}});
          }
        }
        for (const auto& [label, eo] : variants) {
          PlanRun r{label, std::make_unique<commir::GpuExecutor>(plan, pg->rank(), pg->nccl(), s, ms, eo)};
          TESSERA_CHECK(r.ex->b_nk() == eo.b_nk, "bench commir: {}: B [n,k] asked {}, executor {}", label, eo.b_nk,
                        r.ex->b_nk());
          r.ex->set_input("A", A);
          r.ex->set_input("B", B);
          runs.push_back(std::move(r));
        }
      }
      // One interleaved loop: every repetition runs ops sequential, ops'
      // tuned strategy and every executor variant once, so clock and
      // temperature drift hit all alike (ops used to be timed first, on a
      // cooler GPU; the MLP bench saw that drift worth ~7-10%).
      double seq = 0, tuned = 0;
      InterleavedTimer timer(s, o.warmup, o.reps, barrier);
      timer.add(&seq, [&] { run_ops(ops::Strategy::sequential); });
      timer.add(&tuned, [&] { run_ops(rep.chosen); });
      for (auto& r : runs)
        timer.add(&r.median_ms, [&, ex = r.ex.get()] {
          // The communication stream starts after the start event (recorded
          // on s) and s waits for its end: the figure covers both streams.
          TESSERA_CUDA_CHECK(cudaEventRecord(ev, s));
          TESSERA_CUDA_CHECK(cudaStreamWaitEvent(ms, ev, 0));
          ex->run();
          TESSERA_CUDA_CHECK(cudaEventRecord(ev, ms));
          TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, ev, 0));
        });
      timer.run();
      seq = pg->allreduce_max(seq);
      tuned = pg->allreduce_max(tuned);
      for (auto& r : runs) {
        (void)r.ex->output("C");  // waits (bounded) and surfaces an asynchronous NCCL error
        const double t = pg->allreduce_max(r.median_ms);
        table.add({sh.name, column ? "AG+GEMM" : "GEMM+RS", r.label, fmt::format("{:.3f}", t),
                   fmt::format("{:.3f}", seq), fmt::format("{:.3f}", tuned),
                   std::string(ops::strategy_name(rep.chosen)), fmt::format("{:.2f}", t / std::min(seq, tuned))});
      }
    }
  }
  if (pg->rank() == 0) {
    std::printf("tessera bench commir: TP=%d on %s (ms, median of %d, slowest rank; executor and ops bf16)\n%s", R,
                pg->device_properties().name, o.reps, table.str().c_str());
    if (!o.markdown.empty()) {
      std::ofstream f(o.markdown, std::ios::app);
      f << table.markdown();
      TESSERA_CHECK(f.good(), "cannot write {}", o.markdown);
    }
  }
  barrier();
  TESSERA_CUDA_CHECK(cudaEventDestroy(ev));
}

// --attention: the CommIR attention plans beside ops::sp_attention (see the header).
void run_commir_attention(const CommirOptions& o) {
  auto pg = runtime::ProcessGroup::from_environment();
  const int R = pg->world();
  TESSERA_CHECK(R >= 2, "bench commir --attention needs at least 2 ranks (tessera run -n 2 -- ...)");
  const std::int64_t B = o.batch, S = o.seq, H = o.heads, HKV = o.kv_heads, D = o.head_dim;
  TESSERA_CHECK(S % (2 * R) == 0, "bench commir --attention: --seq {} must be a multiple of 2 x world = {}", S, 2 * R);
  TESSERA_CHECK(H % HKV == 0, "bench commir --attention: --heads {} must be a multiple of --kv-heads {}", H, HKV);
  cudaStream_t s = pg->stream(), ms = pg->comm_stream(0);
  auto barrier = [&] {
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(s));
    pg->barrier();
    pg->align_streams(s);
  };
  cudaEvent_t ev = nullptr;
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  const std::string shape = fmt::format("b{} S={} h{}/{} d{}", B, S, H, HKV, D);

  // The hand-built operator: this rank's shards [B, S/R, H, D] (zig-zag order).
  const std::int64_t L = S / R;
  const std::size_t nq = static_cast<std::size_t>(B * L * H * D), nkv = static_cast<std::size_t>(B * L * HKV * D);
  DevBuf q(nq, 11), k(nkv, 12), v(nkv, 13), out(nq, 14);
  ops::SpAttnContext ctx(*pg);
  ops::SpAttnArgs a;
  a.q = q.p;
  a.k = k.p;
  a.v = v.p;
  a.o = out.p;
  a.batch = B;
  a.seq = S;
  a.heads_q = H;
  a.heads_kv = HKV;
  a.head_dim = D;
  a.causal = false;
  struct OpsRun {
    ops::SpAttnOptions opt;  // strategy, and two_level_inner for two_level
    double ms = 0;
    std::size_t bytes = 0;
  };
  const std::vector<int> mesh2 = two_level_mesh(o, R);
  std::vector<OpsRun> opsr;
  auto add_ops = [&](ops::SpStrategy st, int inner = 0) {
    OpsRun r;
    r.opt.strategy = st;
    r.opt.two_level_inner = inner;
    ops::sp_attention(ctx, a, r.opt);  // sizes the workspaces before timing
    r.bytes = (2 * nq + 2 * nkv) * 2 + ops::sp_attention_workspace_bytes(a, R, st, inner);
    opsr.push_back(r);
  };
  add_ops(ops::SpStrategy::sequential);
  add_ops(ops::SpStrategy::ring);
  if (H % R == 0 && HKV % R == 0) add_ops(ops::SpStrategy::ulysses);  // Ulysses splits heads
  // usp on the 2-D mesh (ring across level 0, Ulysses inside level 1) is the
  // hand-built two-level operator with the inner level as its Ulysses degree.
  if (!mesh2.empty() && H % mesh2[1] == 0 && HKV % mesh2[1] == 0) add_ops(ops::SpStrategy::two_level, mesh2[1]);

  // The CommIR plans: full host tensors, each rank uploads its region.
  const commir::Grid op = commir::make_attention(B, H, HKV, S, S, D, {R});
  const std::vector<float> Q = fill(static_cast<std::size_t>(B * H * S * D), 1),
                           K = fill(static_cast<std::size_t>(B * HKV * S * D), 2),
                           V = fill(static_cast<std::size_t>(B * HKV * S * D), 3);
  std::vector<std::pair<std::string, commir::Plan>> plans;  // complete before any executor refers to one
  for (const std::string& name : commir::schedule_names("attention", 1))
    plans.push_back({name, commir::lower(commir::scheduled(op, name))});
  if (!mesh2.empty()) {
    const commir::Grid op2 = commir::make_attention(B, H, HKV, S, S, D, mesh2);
    for (const std::string& name : commir::schedule_names("attention", 2))
      plans.push_back(
          {fmt::format("{} {}", name, commir::mesh_string(mesh2)), commir::lower(commir::scheduled(op2, name))});
  }
  std::vector<PlanRun> runs;  // after plans: destroyed first
  for (const auto& [name, plan] : plans) {
    commir::GpuExecutorOptions eo;
    eo.schedule = name;
    PlanRun r{name, std::make_unique<commir::GpuExecutor>(plan, pg->rank(), pg->nccl(), s, ms, eo)};
    r.ex->set_input("Q", Q);
    r.ex->set_input("K", K);
    r.ex->set_input("V", V);
    runs.push_back(std::move(r));
  }
  pg->synchronize(s, "bench commir --attention: set-up");

  InterleavedTimer timer(s, o.warmup, o.reps, barrier);
  for (auto& r : opsr) timer.add(&r.ms, [&, opt = r.opt] { ops::sp_attention(ctx, a, opt); });
  for (auto& r : runs)
    timer.add(&r.median_ms, [&, ex = r.ex.get()] {
      TESSERA_CUDA_CHECK(cudaEventRecord(ev, s));
      TESSERA_CUDA_CHECK(cudaStreamWaitEvent(ms, ev, 0));
      ex->run();
      TESSERA_CUDA_CHECK(cudaEventRecord(ev, ms));
      TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, ev, 0));
    });
  timer.run();
  for (auto& r : opsr) r.ms = pg->allreduce_max(r.ms);
  double best = 0;
  for (const auto& r : opsr) best = best == 0 ? r.ms : std::min(best, r.ms);
  const std::string usp2 = mesh2.empty() ? std::string() : "usp " + commir::mesh_string(mesh2);
  auto counterpart = [&](const std::string& plan) -> const OpsRun* {
    const ops::SpStrategy st = plan == "cp_ag"     ? ops::SpStrategy::sequential
                               : plan == "ring"    ? ops::SpStrategy::ring
                               : plan == "ulysses" ? ops::SpStrategy::ulysses
                               : plan == usp2      ? ops::SpStrategy::two_level
                                                   : ops::SpStrategy::automatic;
    for (const auto& r : opsr)
      if (r.opt.strategy == st) return &r;
    return nullptr;
  };
  auto ops_name = [](const OpsRun& r) {
    return r.opt.strategy == ops::SpStrategy::two_level ? fmt::format("two_level u={}", r.opt.two_level_inner)
                                                        : std::string(ops::sp_strategy_name(r.opt.strategy));
  };
  auto mib = [](double b) { return fmt::format("{:.0f}", b / (1 << 20)); };
  Table table({"shape", "plan", "commir ms", "MiB/rank", "hand-built", "ops ms", "ops MiB/rank", "commir / ops"});
  nlohmann::json records = nlohmann::json::array();
  for (auto& r : runs) {
    (void)r.ex->output("O");  // waits (bounded) and surfaces an asynchronous NCCL error
    const double t = pg->allreduce_max(r.median_ms);
    const double bytes = pg->allreduce_max(static_cast<double>(r.ex->device_bytes()));
    const OpsRun* c = counterpart(r.label);
    table.add({shape, r.label, fmt::format("{:.3f}", t), mib(bytes), c ? ops_name(*c) : std::string("- (best ops)"),
               fmt::format("{:.3f}", c ? c->ms : best), c ? mib(static_cast<double>(c->bytes)) : std::string("-"),
               fmt::format("{:.2f}", t / (c ? c->ms : best))});
    const std::string cs = fmt::format("{} R={}: {}", shape, R, r.label);
    records.push_back(
        {{"case", cs}, {"metric", "time_ms"}, {"value", t}, {"unit", "ms"}, {"series", "commir " + r.label}});
    records.push_back({{"case", cs}, {"metric", "MiB per rank"}, {"value", bytes / (1 << 20)}, {"unit", "MiB"}});
    if (c) {
      records.push_back(
          {{"case", cs},
           {"metric", "commir / hand-built"},
           {"value", t / c->ms},
           {"unit", "ratio"},
           {"baseline", "ops::sp_attention " + ops_name(*c)},
           {"target",
            {{"op", "<="}, {"value", 1.10}, {"text", "CommIR plan within 10 % of its hand-built counterpart"}}}});
    }
  }
  for (const auto& r : opsr) {
    const std::string cs = fmt::format("{} R={}: ops {}", shape, R, ops_name(r));
    records.push_back(
        {{"case", cs}, {"metric", "time_ms"}, {"value", r.ms}, {"unit", "ms"}, {"series", "ops " + ops_name(r)}});
  }
  if (pg->rank() == 0 && !o.json.empty())
    write_results(o.json,
                  {{"topic", "attention"},
                   {"issue", 21},
                   {"device", machine_kind(pg->device_properties().name, R)},
                   {"gpu", pg->device_properties().name},
                   {"date", results_date()},
                   {"commit", results_commit()},
                   {"command", fmt::format("tessera run -n {} -- tessera bench commir --attention --reps {} "
                                           "(non-causal; median, slowest rank)",
                                           R, o.reps)}},
                  records, "bench commir --attention");
  if (pg->rank() == 0) {
    std::printf(
        "tessera bench commir --attention: R=%d on %s, non-causal (ms, median of %d, slowest rank; bf16, f32 "
        "accumulation)\n%s",
        R, pg->device_properties().name, o.reps, table.str().c_str());
    if (!o.markdown.empty()) {
      std::ofstream f(o.markdown, std::ios::app);
      f << table.markdown();
      TESSERA_CHECK(f.good(), "cannot write {}", o.markdown);
    }
  }
  barrier();
  TESSERA_CUDA_CHECK(cudaEventDestroy(ev));
}

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto& bench = tools::subcommand(root, "bench", "Benchmarks (run multi-GPU ones under `tessera run -n N --`)");
  auto opts = std::make_shared<CommirOptions>();
  auto* cmd = bench.add_subcommand(
      "commir", "CommIR GPU executor's TP GEMM plans (or, --attention, its attention plans) vs the hand-built ops");
  cmd->add_option("--shapes", opts->shapes, "MLP shape numbers (1..6)")->delimiter(',');
  cmd->add_option("--reps", opts->reps, "timed repetitions")->check(CLI::Range(1, 1000));
  cmd->add_option("--warmup", opts->warmup, "warm-up repetitions")->check(CLI::Range(0, 1000));
  cmd->add_option("--markdown", opts->markdown, "append the table as Markdown to this file (rank 0)");
  cmd->add_option("--json", opts->json, "--attention: write bench/results records here (rank 0)");
  cmd->add_flag("!--no-variants", opts->variants, "time only each plan's default executor (B [n,k], reserved SMs)");
  cmd->add_flag("--attention", opts->attention,
                "time the attention plans (cp, cp_ag, ring, ulysses, tree, tree_rs; on a 2-D mesh also usp, "
                "two_level) beside ops::sp_attention");
  cmd->add_option("--batch", opts->batch, "--attention: batch")->check(CLI::Range(1, 64));
  cmd->add_option("--seq", opts->seq, "--attention: global tokens S (multiple of 2 x ranks)")
      ->check(CLI::Range(2, 1 << 22));
  cmd->add_option("--heads", opts->heads, "--attention: query heads")->check(CLI::Range(1, 1024));
  cmd->add_option("--kv-heads", opts->kv_heads, "--attention: K/V heads (divides --heads)")->check(CLI::Range(1, 1024));
  cmd->add_option("--head-dim", opts->head_dim, "--attention: head_dim (64 or 128)")->check(CLI::IsMember({64, 128}));
  cmd->add_option("--mesh", opts->mesh,
                  "--attention: also run the two-level plans on this mesh AxB (A x B = world; default: 2x2 at 4 "
                  "ranks, 2x4 at 8, none at 2)");
  cmd->callback([opts] { opts->attention ? run_commir_attention(*opts) : run_commir(*opts); });
});

}  // namespace
}  // namespace tessera::bench
