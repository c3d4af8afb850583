// Shared by the CommIR attention GPU tests (commir_gpu_executor,
// commir_gpu_two_level): fresh bf16-rounded inputs agreed across ranks, and
// one plan run on this rank's GPU against the float64 reference.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tessera/commir/cpu_executor.hpp"
#include "tessera/commir/gpu_executor.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::commir::gpu_check {

struct AttnShape {
  std::int64_t b, h, hkv, s, d;
};

// Fresh inputs, the same on every rank (rank 0 draws the seed), rounded to
// bf16 so that the float64 runs see what the GPU sees; and the reference.
struct AttnData {
  Tensors in, ref;
  std::map<std::string, std::vector<float>> in_f;
};
inline AttnData attn_data(tessera::runtime::ProcessGroup& pg, const Grid& op) {
  AttnData d;
  const std::uint64_t seed = pg.allgather(static_cast<std::uint64_t>(std::random_device{}()))[0];
  d.in = random_inputs(op, seed);
  for (auto& [name, v] : d.in)
    for (auto& x : v) {
      x = __bfloat162float(__float2bfloat16(static_cast<float>(x)));
      d.in_f[name].push_back(static_cast<float>(x));
    }
  d.ref = reference(op, d.in);
  return d;
}

// Runs `plan` 4 times (non-input blocks poisoned before each run) and checks
// this rank's O against the reference: relative L2 error < 1e-2.
inline void run_attention_plan(tessera::runtime::ProcessGroup& pg, const Plan& plan, const std::string& label,
                               const AttnShape& sh, const AttnData& d) {
  GpuExecutorOptions eo;
  eo.schedule = label;
  std::unique_ptr<GpuExecutor> ex;
  std::string why;
  try {
    ex = std::make_unique<GpuExecutor>(plan, pg.rank(), pg.nccl(), pg.stream(), pg.comm_stream(0), eo);
    for (const char* b : {"Q", "K", "V"}) ex->set_input(b, d.in_f.at(b));
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  } catch (const std::exception& e) {
    why = e.what();
    ex.reset();
  }
  const auto ok = pg.allgather(static_cast<int>(why.empty()));
  if (std::count(ok.begin(), ok.end(), 0) > 0) {
    ADD_FAILURE() << "rank " << pg.rank() << ": " << (why.empty() ? "another rank could not build the plan" : why);
    return;
  }
  const std::vector<double>& O = d.ref.at("O");
  std::vector<double> times;
  double err = 0;
  std::int64_t checked = 0;
  for (int it = 0; it < 4; ++it) {
    ex->poison();
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    pg.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    ex->run();
    const auto out = ex->output("O");
    times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    double num = 0, den = 0;
    checked = 0;
    for (const auto& [box, vals] : out) {
      // Box over O's [b, h, q]; values [box..., d] row-major.
      std::int64_t k = 0;
      for (std::int64_t b = box.r[0].lo; b < box.r[0].hi; ++b)
        for (std::int64_t h = box.r[1].lo; h < box.r[1].hi; ++h)
          for (std::int64_t q = box.r[2].lo; q < box.r[2].hi; ++q)
            for (std::int64_t e = 0; e < sh.d; ++e, ++k) {
              const double want = O[((b * sh.h + h) * sh.s + q) * sh.d + e];
              const double got = vals[k];
              num += std::isnan(got) ? INFINITY : (got - want) * (got - want);
              den += want * want;
            }
      checked += k;
    }
    const double e = std::sqrt(num / den);
    err = std::isnan(e) ? INFINITY : std::max(err, e);
  }
  EXPECT_GT(checked, 0);
  EXPECT_LT(err, 1e-2) << "rank " << pg.rank();
  std::sort(times.begin() + 1, times.end());
  std::printf(
      "rank %d attention %s b%lld h%lld/%lld s%lld d%lld: rel err %.2e, median %.1f us incl. readback (not a "
      "benchmark)\n",
      pg.rank(), label.c_str(), static_cast<long long>(sh.b), static_cast<long long>(sh.h),
      static_cast<long long>(sh.hkv), static_cast<long long>(sh.s), static_cast<long long>(sh.d), err,
      times[times.size() / 2]);
}

}  // namespace tessera::commir::gpu_check
