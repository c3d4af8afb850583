// `tessera bench comm` — communication microbenchmarks between ranks of one
// node: SM push / pull bandwidth against the number of SMs, copy-engine
// bandwidth, flag round-trip latency, and NCCL all-gather / reduce-scatter /
// all-reduce bus bandwidth. Run under the launcher:
//   tessera run -n 2 -- tessera bench comm
// Every rank measures at once (rank r talks to rank (r+1) % R); each figure
// is the median over repetitions of the slowest rank.
#include <nccl.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "command.hpp"
#include "common/timing.hpp"
#include "tessera/link/device_primitives.cuh"
#include "tessera/link/memory_order.cuh"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"
#include "tessera/runtime/symmetric_heap.hpp"

namespace tessera::bench {
namespace {

struct CommOptions {
  std::vector<int> blocks{8, 16, 32, 132};
  int threads = 1024;
  int sm_mib = 256;
  int max_mib = 256;
  int reps = 20;
  int warmup = 5;
  int rtt_iters = 2000;
  std::string markdown;
};

__global__ void copy_kernel(void* dst, const void* src, std::int64_t bytes) {
  const int tid = blockIdx.x * blockDim.x + threadIdx.x;
  link::copy_tile_bytes(dst, bytes, src, bytes, 1, bytes, tid, gridDim.x * blockDim.x);
}

// One thread per side. Rank a sends i, rank b echoes it; values grow across
// calls (base), so nothing is reset. Gives up (trap) after 10 s.
__global__ void ping_pong_kernel(std::uint64_t* my_flag, std::uint64_t* peer_flag, bool initiator, std::uint64_t base,
                                 int iters) {
  const std::uint64_t start = link::mo::globaltimer_ns();
  for (int i = 1; i <= iters; ++i) {
    const std::uint64_t v = base + i;
    if (initiator) link::mo::st_release_sys(peer_flag, v);
    while (link::mo::ld_acquire_sys(my_flag) < v) {
      if (link::mo::globaltimer_ns() - start > 10ull * 1000 * 1000 * 1000) {
        printf("[tessera] ping-pong timed out at %llu\n", static_cast<unsigned long long>(v));
        __trap();
      }
    }
    if (!initiator) link::mo::st_release_sys(peer_flag, v);
  }
}

std::string gbs(double bytes, double ms) { return fmt::format("{:.1f}", bytes / (ms * 1e-3) / 1e9); }

void run_comm(const CommOptions& o) {
  auto pg = runtime::ProcessGroup::from_environment();
  TESSERA_CHECK(pg->world() >= 2, "bench comm needs at least 2 ranks (tessera run -n 2 -- tessera bench comm)");
  const int R = pg->world(), me = pg->rank(), next = (me + 1) % R;
  cudaStream_t s = pg->stream();
  auto barrier = [&] {
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(s));
    pg->barrier();
  };
  auto slowest = [&](const Stats& st) { return pg->allreduce_max(st.median_ms); };

  Table table({"what", "config", "size", "time_ms", "GB/s"});
  const std::size_t sm_bytes = static_cast<std::size_t>(o.sm_mib) << 20;
  runtime::SymBuffer<char> src(*pg, sm_bytes), dst(*pg, sm_bytes);
  TESSERA_CUDA_CHECK(cudaMemset(src.local(), 1, sm_bytes));
  barrier();

  for (int b : o.blocks) {
    TESSERA_CHECK(b > 0 && b <= 4 * pg->sm_count(), "--blocks {} out of range", b);
    const double push = slowest(time_on_stream(
        s, [&] { copy_kernel<<<b, o.threads, 0, s>>>(dst.peer(next), src.local(), sm_bytes); }, o.warmup, o.reps,
        barrier));
    table.add({"SM push", fmt::format("{} blocks", b), fmt::format("{} MiB", o.sm_mib), fmt::format("{:.3f}", push),
               gbs(sm_bytes, push)});
  }
  for (int b : o.blocks) {
    const double pull = slowest(time_on_stream(
        s, [&] { copy_kernel<<<b, o.threads, 0, s>>>(dst.local(), src.peer(next), sm_bytes); }, o.warmup, o.reps,
        barrier));
    table.add({"SM pull", fmt::format("{} blocks", b), fmt::format("{} MiB", o.sm_mib), fmt::format("{:.3f}", pull),
               gbs(sm_bytes, pull)});
  }
  TESSERA_CUDA_CHECK(cudaGetLastError());
  {
    const double ce = slowest(time_on_stream(
        s,
        [&] {
          TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst.peer(next), src.local(), sm_bytes, cudaMemcpyDeviceToDevice, s));
        },
        o.warmup, o.reps, barrier));
    table.add({"copy engine", "cudaMemcpyAsync to peer", fmt::format("{} MiB", o.sm_mib), fmt::format("{:.3f}", ce),
               gbs(sm_bytes, ce)});
  }
  {
    runtime::SymBuffer<std::uint64_t> flags(*pg, 2);
    TESSERA_CUDA_CHECK(cudaMemset(flags.local(), 0, flags.bytes()));
    barrier();
    std::uint64_t base = 0;
    const bool pair = me < 2;
    const int partner = me == 0 ? 1 : 0;
    const double ms = slowest(time_on_stream(
        s,
        [&] {
          if (pair) ping_pong_kernel<<<1, 1, 0, s>>>(flags.local(), flags.peer(partner), me == 0, base, o.rtt_iters);
          base += o.rtt_iters;
        },
        o.warmup, o.reps, barrier));
    table.add({"flag round trip", "st.release.sys / ld.acquire.sys", "8 B", fmt::format("{:.3f}", ms),
               fmt::format("{:.2f} us/round trip", ms * 1e3 / o.rtt_iters)});
  }
  TESSERA_CUDA_CHECK(cudaGetLastError());

  // NCCL collectives; `size` is the bytes each rank contributes (AG send,
  // RS receive, AR buffer). Bus bandwidth as nccl-tests defines it.
  const std::size_t max_bytes = static_cast<std::size_t>(o.max_mib) << 20;
  void *in = nullptr, *out = nullptr;
  TESSERA_CUDA_CHECK(cudaMalloc(&in, max_bytes * R));
  TESSERA_CUDA_CHECK(cudaMalloc(&out, max_bytes * R));
  TESSERA_CUDA_CHECK(cudaMemset(in, 0, max_bytes * R));
  for (const char* coll : {"all-gather", "reduce-scatter", "all-reduce"}) {
    for (int mib = 1; mib <= o.max_mib; mib *= 4) {
      const std::size_t bytes = static_cast<std::size_t>(mib) << 20;
      const std::size_t count = bytes / 2;  // bf16 elements per rank
      const std::string c = coll;
      const double ms = slowest(time_on_stream(
          s,
          [&] {
            if (c == "all-gather")
              TESSERA_NCCL_CHECK(ncclAllGather(in, out, count, ncclBfloat16, pg->nccl(), s));
            else if (c == "reduce-scatter")
              TESSERA_NCCL_CHECK(ncclReduceScatter(in, out, count, ncclBfloat16, ncclSum, pg->nccl(), s));
            else
              TESSERA_NCCL_CHECK(ncclAllReduce(in, out, count, ncclBfloat16, ncclSum, pg->nccl(), s));
          },
          o.warmup, o.reps, barrier));
      const double factor = c == "all-reduce" ? 2.0 * (R - 1) / R : static_cast<double>(R - 1);
      table.add({"NCCL " + c, "bus bandwidth", fmt::format("{} MiB/rank", mib), fmt::format("{:.3f}", ms),
                 gbs(bytes * factor, ms)});
    }
  }
  TESSERA_CUDA_CHECK(cudaFree(in));
  TESSERA_CUDA_CHECK(cudaFree(out));

  if (me == 0) {
    std::printf("tessera bench comm: %d ranks, %s, %d SMs, median of %d after %d warm-up (slowest rank)\n%s", R,
                pg->device_properties().name, pg->sm_count(), o.reps, o.warmup, table.str().c_str());
    if (!o.markdown.empty()) {
      std::ofstream f(o.markdown);
      f << table.markdown();
      TESSERA_CHECK(f.good(), "cannot write {}", o.markdown);
    }
  }
  barrier();
}

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto& bench = tools::subcommand(root, "bench", "Benchmarks (run multi-GPU ones under `tessera run -n N --`)");
  auto opts = std::make_shared<CommOptions>();
  auto* cmd = bench.add_subcommand("comm", "SM push/pull, copy engine, flag round trip, NCCL collectives");
  cmd->add_option("--blocks", opts->blocks, "SM counts (blocks) for push/pull")->delimiter(',');
  cmd->add_option("--threads", opts->threads, "threads per block")->check(CLI::Range(32, 1024));
  cmd->add_option("--sm-mib", opts->sm_mib, "MiB per push/pull/copy-engine transfer")->check(CLI::Range(1, 4096));
  cmd->add_option("--max-mib", opts->max_mib, "largest NCCL size per rank (MiB; 1, 4, 16, ...)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--reps", opts->reps, "timed repetitions")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", opts->warmup, "warm-up repetitions")->check(CLI::Range(0, 100000));
  cmd->add_option("--rtt-iters", opts->rtt_iters, "round trips per timed repetition")->check(CLI::Range(1, 1000000));
  cmd->add_option("--markdown", opts->markdown, "also write the table as Markdown to this file (rank 0)");
  cmd->callback([opts] { run_comm(*opts); });
});

}  // namespace
}  // namespace tessera::bench
