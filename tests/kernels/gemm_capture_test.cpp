// A split-K GEMM captured into a CUDA graph as the process's first split-K
// call: the workspace pool is then created during the capture (global mode),
// which must not fail the capture. Its own binary, so no earlier test has
// created the pool. The graph is replayed on fresh inputs and checked
// against cuBLASLt each time (poisoned output).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

#include "gemm_test_util.hpp"
#include "support/test_support.hpp"
#include "tessera/kernels/gemm.hpp"

namespace tk = tessera::kernels;
namespace tt = tessera::kernels::testk;
using tessera::DType;

TEST(GemmGpuCapture, SplitKFirstCalledInsideAGlobalCapture) {
  TESSERA_REQUIRE_GPUS(1);
  const std::uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int64_t m = 96, n = 512, k = 4096;  // few tiles, long K: a split the options force anyway
  tt::DevBuf a = tt::random_matrix(m, k, k, DType::bf16, rng, nullptr);
  tt::DevBuf b = tt::random_matrix(n, k, k, DType::bf16, rng, nullptr);
  tt::DevBuf d(static_cast<size_t>(m * n) * 2), ref(static_cast<size_t>(m * n) * 2);
  tk::GemmArgs args{a.p, b.p, d.p, m, n, k, k, k, n, DType::bf16, DType::bf16, tk::BLayout::NK};
  tk::GemmOptions o;
  o.k_splits = 4;

  cudaStream_t s = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  tk::gemm(args, o, s);
  TESSERA_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec = nullptr;
  TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));

  for (int replay = 0; replay < 3; ++replay) {
    // Fresh A each replay (same buffer, new values), output poisoned; both
    // complete before the replay (s does not sync with the legacy stream).
    tt::DevBuf fresh = tt::random_matrix(m, k, k, DType::bf16, rng, nullptr);
    TESSERA_CUDA_CHECK(cudaMemcpy(a.p, fresh.p, a.bytes, cudaMemcpyDeviceToDevice));
    tt::poison(d);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, s));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(s));
    tk::GemmArgs r = args;
    r.d = ref.p;
    tk::cublaslt_gemm(r);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    const double err = tessera::testing::relative_error(tt::download(d.p, m, n, n, DType::bf16),
                                                        tt::download(ref.p, m, n, n, DType::bf16));
    EXPECT_LT(err, 8e-3) << "replay " << replay;
  }
  TESSERA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TESSERA_CUDA_CHECK(cudaGraphDestroy(g));
  TESSERA_CUDA_CHECK(cudaStreamDestroy(s));
}
