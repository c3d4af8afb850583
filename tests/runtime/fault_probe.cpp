// fault_probe — the program scripts/fault-check.sh starts through `tessera
// run` to inject faults into a running job (the contract: a peer dying or
// stopping inside an NCCL collective or a load/store wait must give the
// survivors a clear error within TESSERA_WAIT_TIMEOUT_MS, never a hang).
//
//   fault_probe OP STRATEGY [ITERS]     OP: ag_gemm | gemm_rs | gemm_ar |
//                                           sp_attention | sp_attention_causal
//                                       STRATEGY: a strategy name or auto
// Environment:
//   FAULT       none (default) | kill (SIGKILL itself) | stall (SIGSTOP itself)
//   FAULT_RANK  the rank that faults (default 1)
//   FAULT_AT    the iteration at which it faults (default 3; iteration 0 is a
//               warm-up, so NCCL's connections exist before any fault)
// Every rank runs the operator ITERS times (default 8), each followed by
// ProcessGroup::synchronize (bounded; aborts the communicator on a timeout),
// then tears everything down. It prints one of
//   PROBE-OK rank R iters N teardown T ms
//   PROBE-DETECTED rank R after T ms in <what>: <the error>
// and exits 0 / 3. The time counts from the faulting iteration's start.
// With FAULT set, SIGTERM is ignored (see main).
#include <cuda_runtime_api.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "tessera/ops/sp_attention.hpp"
#include "tessera/ops/tp_mlp.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace {

using Clock = std::chrono::steady_clock;

long ms_since(Clock::time_point t) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

void* device_zeros(std::size_t bytes) {
  void* p = nullptr;
  TESSERA_CUDA_CHECK(cudaMalloc(&p, bytes));
  TESSERA_CUDA_CHECK(cudaMemset(p, 0, bytes));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: fault_probe ag_gemm|gemm_rs|gemm_ar|sp_attention|sp_attention_causal STRATEGY [ITERS]\n");
    return 64;
  }
  const std::string op = argv[1], strategy = argv[2];
  const int iters = argc > 3 ? std::atoi(argv[3]) : 8;
  const char* fault_env = std::getenv("FAULT");
  const std::string fault = fault_env ? fault_env : "none";
  const int fault_rank = env_int("FAULT_RANK", 1), fault_at = env_int("FAULT_AT", 3);
  // With a fault planned, the survivors ignore the launcher's SIGTERM (sent
  // as soon as the faulty rank dies), so they show whether they detect the
  // fault themselves; the launcher's SIGKILL after its grace period remains.
  if (fault != "none") ::signal(SIGTERM, SIG_IGN);
  int rank = -1;
  Clock::time_point fault_start = Clock::now();
  std::string where = "start-up";
  try {
    auto pg = tessera::runtime::ProcessGroup::from_environment();
    rank = pg->rank();
    const int R = pg->world();
    auto ctx = std::make_unique<tessera::ops::TpContext>(*pg);
    tessera::ops::OpOptions o;
    o.strategy = strategy == "auto" ? tessera::ops::Strategy::automatic : tessera::ops::parse_strategy(strategy);
    o.use_cache = std::getenv("TESSERA_CACHE_DIR") != nullptr;  // the cache only where the script points it
    const std::int64_t M = 2048 * R, N = 4096, K = 4096, es = 2;
    // sp_attention: 32 heads x 128, 4k tokens per rank (Q, K, V, O share the shape).
    std::unique_ptr<tessera::ops::SpAttnContext> sp;
    tessera::ops::SpAttnArgs sa;
    sa.seq = 4096 * R, sa.heads_q = sa.heads_kv = 32, sa.head_dim = 128, sa.causal = op == "sp_attention_causal";
    tessera::ops::SpAttnOptions so;
    so.strategy = static_cast<tessera::ops::SpStrategy>(o.strategy);
    so.use_cache = o.use_cache;
    void* a = device_zeros(static_cast<std::size_t>(M * K * es));
    void* b = device_zeros(static_cast<std::size_t>(N * K * es));
    void* d = device_zeros(static_cast<std::size_t>(M * N * es));
    if (op.rfind("sp_attention", 0) == 0) {
      sp = std::make_unique<tessera::ops::SpAttnContext>(*pg);
      sa.q = sa.k = sa.v = a;  // 4096 x 32 x 128 elements fit in A (M x K)
      sa.o = d;
    }
    for (int i = 0; i < iters; ++i) {
      if (i == fault_at) fault_start = Clock::now();
      if (rank == fault_rank && i == fault_at && fault != "none") {
        std::printf("PROBE-FAULT rank %d %s at iteration %d\n", rank, fault.c_str(), i);
        std::fflush(stdout);
        ::raise(fault == "stall" ? SIGSTOP : SIGKILL);
      }
      where = op + " iteration " + std::to_string(i);
      if (op == "ag_gemm") {
        tessera::ops::AgGemmArgs g;
        g.a = a, g.b = b, g.d = d, g.m = M, g.m_local = M / R, g.n = N, g.k = K;
        tessera::ops::ag_gemm(*ctx, g, o);
      } else if (op == "gemm_rs") {
        tessera::ops::GemmRsArgs g;
        g.a = a, g.b = b, g.d = d, g.m = M, g.m_local = M / R, g.n = N, g.k = K / R;
        tessera::ops::gemm_rs(*ctx, g, o);
      } else if (op == "gemm_ar") {
        tessera::ops::GemmArArgs g;
        g.a = a, g.b = b, g.d = d, g.m = M, g.n = N, g.k = K / R;
        tessera::ops::gemm_ar(*ctx, g, o);
      } else if (sp) {
        tessera::ops::sp_attention(*sp, sa, so);
      } else {
        std::fprintf(stderr, "fault_probe: unknown operator '%s'\n", op.c_str());
        return 64;
      }
      pg->synchronize(pg->stream(), "fault_probe: operator");
    }
    where = "teardown";
    const auto t0 = Clock::now();
    sp.reset();
    ctx.reset();
    for (void* p : {a, b, d}) (void)cudaFree(p);
    pg.reset();
    std::printf("PROBE-OK rank %d iters %d teardown %ld ms\n", rank, iters, ms_since(t0));
    return 0;
  } catch (const std::exception& e) {
    std::printf("PROBE-DETECTED rank %d after %ld ms in %s: %s\n", rank, ms_since(fault_start), where.c_str(),
                e.what());
    std::fflush(stdout);
    return 3;
  }
}
