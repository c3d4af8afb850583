// `tessera bench attention` — Tessera's flash-attention forward kernel alone:
// per case, the median time of --reps runs (CUDA events, warm-up first, one
// stream) and TFLOP/s as FlashAttention counts them (4·B·Hq·D·admitted
// pairs). Inputs are fresh random data (never zeros); O and LSE are written.
//
// The PyTorch baselines (scaled_dot_product_attention with the cuDNN and
// flash backends) run side by side with this kernel, in one process and one
// interleaved timing loop, in scripts/bench_attention.py --bench (it reaches
// the kernel through scripts/attention_ctypes.cpp); this subcommand gives the
// kernel's own figures without PyTorch.
//
// --hook-ab times, in one interleaved loop per case, the plain kernel beside
// the same kernel under KV hooks that never wait (hook_ab.cu): what
// sp_attention's hooked kernel costs before any flag is late.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <iterator>
#include <vector>

#include "command.hpp"
#include "common/device_buffer.hpp"
#include "common/timing.hpp"
#include "hook_ab.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/ops/sp_attention.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::bench::attention {
namespace {

struct Case {
  std::string name;
  int64_t b, lq, lk, hq, hkv;
  bool causal;
};

// The target cases (bf16, head dim 128, batch 1) and larger ones.
const std::vector<Case> kCases = {
    {"32h Q8k KV16k", 1, 8192, 16384, 32, 32, false},   {"32h 16k causal", 1, 16384, 16384, 32, 32, true},
    {"32h Q16k KV32k", 1, 16384, 32768, 32, 32, false}, {"GQA 32/8 Q8k KV16k", 1, 8192, 16384, 32, 8, false},
    {"64h 16k", 1, 16384, 16384, 64, 64, false},        {"64h 16k causal", 1, 16384, 16384, 64, 64, true},
    {"32h 32k causal", 1, 32768, 32768, 32, 32, true},  {"32h 64k causal", 1, 65536, 65536, 32, 32, true},
    {"32h Q8k KV128k", 1, 8192, 131072, 32, 32, false}, {"32h 128k causal", 1, 131072, 131072, 32, 32, true},
};

struct Options {
  std::vector<int> cases;  // indices into kCases; empty = all
  int head_dim = 128;
  std::string dtype = "bf16";
  int reps = 10;
  int warmup = 2;
  bool hook_ab = false;
  std::string json;
};

using Dev = DeviceBuffer;

/// `v` in a new device buffer, copied on `stream` before it returns.
template <class T>
Dev upload(const std::vector<T>& v, cudaStream_t stream) {
  Dev d(v.size() * sizeof(T));
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(d.p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return d;
}

/// --hook-ab: the plain kernel and the never-waiting hook variants of one
/// case, interleaved; prints each as a ratio to the plain kernel and returns
/// them as JSON records (--json).
std::string run_hook_ab(const Options& o, const Case& c, const kernels::AttentionArgs& a, cudaStream_t stream) {
  TESSERA_CHECK(o.head_dim == 128 && a.dtype == DType::bf16, "bench attention --hook-ab: bf16, head dim 128 only");
  const std::int64_t n_flags = std::max<std::int64_t>((a.seqlen_k + kHookAbRowsPerFlag - 1) / kHookAbRowsPerFlag, 4);
  // Every byte 0x01: each u32 and u64 view reads >= 1.
  const Dev flags = upload(std::vector<std::uint64_t>(static_cast<size_t>(n_flags), 0x0101010101010101ull), stream);
  // sp_slim (R = 2, rank 0: chunks of seqlen_k / 4, owners 0 1 1 0): the
  // abort word (0) and the peer's flag (index 2 = owner 1 + 1), and per KV
  // block 2 where it covers a peer chunk, else 0.
  const Dev slim = upload(std::vector<std::uint64_t>{0, 1, 1, 1}, stream);
  const std::int64_t rows = hook_ab_block_rows(), chunk = (a.seqlen_k + 3) / 4;
  std::vector<std::int32_t> owners(static_cast<size_t>((a.seqlen_k + rows - 1) / rows), 0);
  for (std::size_t b = 0; b < owners.size(); ++b) {
    const std::int64_t first = static_cast<std::int64_t>(b) * rows / chunk;
    const std::int64_t last = (std::min<std::int64_t>((b + 1) * rows, a.seqlen_k) - 1) / chunk;
    if (first <= 2 && last >= 1) owners[b] = 2;  // covers chunk 1 or 2
  }
  const Dev owner_table = upload(owners, stream);
  // sp_slim_full's visiting order: sp_attention's at R = 2, rank 0.
  const Dev order_table = upload(
      ops::kv_arrival_order(ops::plan_sp_attention(4 * chunk, 2, 0, a.causal), a.seqlen_k, static_cast<int>(rows)),
      stream);
  // sp_shard's table: R = 2, rank 0 (the peer's shard is the first half of
  // the keys), one head group, one slot per source: flag index 1 of `flags`.
  const Dev shard_table =
      upload(ops::sp_kv_flag_table(ops::plan_sp_attention(4 * chunk, 2, 0, false), ops::SpKvLayout::shard,
                                   static_cast<int>(rows), a.heads_kv, 1, 1),
             stream);
  const auto* shard_ptr = static_cast<const std::int32_t*>(shard_table.p);
  const auto* set = static_cast<const std::uint32_t*>(flags.p);
  const auto* slim_flags = static_cast<const std::uint64_t*>(slim.p);
  const auto* owner_ptr = static_cast<const std::int32_t*>(owner_table.p);
  const auto* order_ptr = static_cast<const std::int32_t*>(order_table.p);
  const std::pair<const char*, HookVariant> variants[] = {
      {"hooked config, no hook", HookVariant::config_only},
      {"ring hand-over only", HookVariant::hand_over},
      {"acquire.gpu once", HookVariant::acquire_gpu},
      {"acquire.sys once", HookVariant::acquire_sys},
      {"acquire.sys + proxy fence once", HookVariant::acquire_sys_fence},
      {"proxy fence once", HookVariant::fence_first},
      {"proxy fence every block", HookVariant::fence_every},
      {"hand-over, 2 more maps", HookVariant::params_padded},
      {"timed acquire.sys once", HookVariant::timed_acquire},
      {"polled acquire.sys once", HookVariant::polled_acquire},
      {"sp slim: owner table, abort word", HookVariant::sp_slim},
      {"sp slim + order + in-place source", HookVariant::sp_slim_full},
      {"sp-like chunk walk", HookVariant::sp_like},
      {"flag wait, flags set", HookVariant::flags_set},
      {"sp shard-layout wait (SpKvTableWait)", HookVariant::sp_shard}};
  double plain = 0;
  double t[std::size(variants)] = {};
  InterleavedTimer timer(stream, o.warmup, o.reps);
  timer.add(&plain, [&] { kernels::attention(a, stream); });
  for (std::size_t i = 0; i < std::size(variants); ++i)
    timer.add(&t[i], [&, i] {
      launch_hook_variant(variants[i].second, a, set, slim_flags, owner_ptr, order_ptr, shard_ptr, stream);
    });
  timer.run();
  fmt::print("{}: plain {:.3f} ms", c.name, plain);
  std::string json;
  for (std::size_t i = 0; i < std::size(variants); ++i) {
    fmt::print("; {} {:.3f} ({:.4f}x)", variants[i].first, t[i], t[i] / plain);
    json += fmt::format(
        "{}\n  {{\"case\": \"{}\", \"variant\": \"{}\", \"plain_ms\": {:.4f}, \"median_ms\": {:.4f}, "
        "\"ratio\": {:.4f}}}",
        i == 0 ? "" : ",", c.name, variants[i].first, plain, t[i], t[i] / plain);
  }
  fmt::print("\n");
  return json;
}

void run(const Options& o) {
  std::mt19937_64 rng(std::random_device{}());
  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const cudaDeviceProp prop = current_device_properties();
  Table table({"case", "B", "Lq", "Lk", "Hq/Hkv", "causal", "ms (median)", "min", "max", "TFLOP/s"});
  std::string json = fmt::format("{{\"device\": \"{}\", \"dtype\": \"{}\", \"head_dim\": {}, \"results\": [", prop.name,
                                 o.dtype, o.head_dim);
  std::vector<int> idx = o.cases;
  if (idx.empty())
    for (int i = 0; i < static_cast<int>(kCases.size()); ++i) idx.push_back(i);
  bool first = true;
  for (int i : idx) {
    TESSERA_CHECK(i >= 0 && i < static_cast<int>(kCases.size()), "bench attention: case {} out of range [0, {})", i,
                  kCases.size());
    const Case& c = kCases[i];
    kernels::AttentionArgs a;
    a.batch = c.b;
    a.seqlen_q = c.lq;
    a.seqlen_k = c.lk;
    a.heads_q = c.hq;
    a.heads_kv = c.hkv;
    a.head_dim = o.head_dim;
    a.causal = c.causal;
    a.dtype = o.dtype == "f16" ? DType::f16 : DType::bf16;
    TESSERA_CHECK(o.dtype == "bf16" || o.dtype == "f16", "bench attention: --dtype {} (bf16 or f16)", o.dtype);
    const size_t nq = static_cast<size_t>(c.b * c.lq * c.hq * o.head_dim);
    const size_t nk = static_cast<size_t>(c.b * c.lk * c.hkv * o.head_dim);
    Dev q(nq * 2), k(nk * 2), v(nk * 2), out(nq * 2), lse(static_cast<size_t>(c.b * c.hq * c.lq) * 4);
    fill_random_16bit(q.p, nq, rng);
    fill_random_16bit(k.p, nk, rng);
    fill_random_16bit(v.p, nk, rng);
    a.q = q.p;
    a.k = k.p;
    a.v = v.p;
    a.o = out.p;
    a.lse = static_cast<float*>(lse.p);
    kernels::validate(a, "bench attention");
    if (o.hook_ab) {
      json += (first ? "" : ",") + run_hook_ab(o, c, a, stream);
      first = false;
      continue;
    }
    const Stats s = time_on_stream(
        stream, [&] { kernels::attention(a, stream); }, o.warmup, o.reps);
    const double tflops = kernels::attention_flops(a) / (s.median_ms * 1e-3) / 1e12;
    table.add({c.name, std::to_string(c.b), std::to_string(c.lq), std::to_string(c.lk),
               fmt::format("{}/{}", c.hq, c.hkv), c.causal ? "yes" : "no", fmt::format("{:.3f}", s.median_ms),
               fmt::format("{:.3f}", s.min_ms), fmt::format("{:.3f}", s.max_ms), fmt::format("{:.0f}", tflops)});
    json += fmt::format(
        "{}\n  {{\"case\": \"{}\", \"B\": {}, \"Lq\": {}, \"Lk\": {}, \"heads_q\": {}, \"heads_kv\": {}, "
        "\"causal\": {}, \"median_ms\": {:.4f}, \"min_ms\": {:.4f}, \"max_ms\": {:.4f}, \"tflops\": {:.1f}}}",
        first ? "" : ",", c.name, c.b, c.lq, c.lk, c.hq, c.hkv, c.causal, s.median_ms, s.min_ms, s.max_ms, tflops);
    first = false;
    fmt::print("{}: {:.3f} ms, {:.0f} TFLOP/s\n", c.name, s.median_ms, tflops);
  }
  json += "\n]}\n";
  fmt::print("\n{}", table.str());
  fmt::print("PyTorch SDPA baselines side by side: python3 scripts/bench_attention.py --build --bench\n");
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    TESSERA_CHECK(f.good(), "bench attention: cannot write {}", o.json);
    f << json;
  }
  cudaStreamDestroy(stream);
}

}  // namespace

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto& bench = tools::subcommand(root, "bench", "Benchmarks");
  auto opts = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("attention", "Tessera's flash-attention forward kernel (time, TFLOP/s per case)");
  cmd->add_option("--cases", opts->cases,
                  "case indices (default all): 0 32h Q8k/KV16k, 1 32h 16k causal, 2 32h Q16k/KV32k, 3 GQA 32/8 "
                  "Q8k/KV16k, 4 64h 16k, 5 64h 16k causal, 6 32h 32k causal, 7 32h 64k causal, 8 32h Q8k/KV128k, "
                  "9 32h 128k causal")
      ->delimiter(',');
  cmd->add_option("--head-dim", opts->head_dim, "64 or 128")->check(CLI::IsMember({64, 128}));
  cmd->add_option("--dtype", opts->dtype, "bf16 or f16");
  cmd->add_option("--reps", opts->reps, "timed repetitions (median)")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", opts->warmup, "warm-up repetitions")->check(CLI::Range(0, 100000));
  cmd->add_option("--json", opts->json, "write the figures here");
  cmd->add_flag("--hook-ab", opts->hook_ab,
                "time the plain kernel beside KV hooks that never wait, per case (bf16, head dim 128)");
  cmd->callback([opts] { run(*opts); });
});

}  // namespace tessera::bench::attention
