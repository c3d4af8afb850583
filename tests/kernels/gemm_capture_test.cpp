// A split-K and a stream-K GEMM captured into CUDA graphs as the process's
// first such calls: split-K's workspace pool and the stream's stream-K
// workspace are then created during the capture (global mode), which must
// not fail the capture. Its own binary, so no earlier test has created
// them. Each graph is replayed on fresh inputs and checked against
// cuBLASLt each time (poisoned output); stream-K's replays alternate with
// eager calls on the same stream, which share its workspace.
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

namespace {

// Captures gemm(args(m, n, k), o) on a fresh stream as the first call of
// its kind, then replays it three times on fresh A; with `eager_between`,
// an eager call of the same GEMM on the same stream follows each replay.
// Every result is checked against cuBLASLt.
void check_first_call_inside_capture(int64_t m, int64_t n, int64_t k, const tk::GemmOptions& o, bool eager_between) {
  const std::uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  tt::DevBuf a = tt::random_matrix(m, k, k, DType::bf16, rng, nullptr);
  tt::DevBuf b = tt::random_matrix(n, k, k, DType::bf16, rng, nullptr);
  tt::DevBuf d(static_cast<size_t>(m * n) * 2), ref(static_cast<size_t>(m * n) * 2);
  tk::GemmArgs args{a.p, b.p, d.p, m, n, k, k, k, n, DType::bf16, DType::bf16, tk::BLayout::NK};

  cudaStream_t s = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  tk::gemm(args, o, s);
  TESSERA_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec = nullptr;
  TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));

  const auto expect_matches_cublas = [&](const char* what, int round) {
    tk::GemmArgs r = args;
    r.d = ref.p;
    tk::cublaslt_gemm(r);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    const double err = tessera::testing::relative_error(tt::download(d.p, m, n, n, DType::bf16),
                                                        tt::download(ref.p, m, n, n, DType::bf16));
    EXPECT_LT(err, 8e-3) << what << " " << round;
  };
  for (int replay = 0; replay < 3; ++replay) {
    // Fresh A each replay (same buffer, new values), output poisoned; both
    // complete before the replay (s does not sync with the legacy stream).
    tt::DevBuf fresh = tt::random_matrix(m, k, k, DType::bf16, rng, nullptr);
    TESSERA_CUDA_CHECK(cudaMemcpy(a.p, fresh.p, a.bytes, cudaMemcpyDeviceToDevice));
    tt::poison(d);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, s));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(s));
    expect_matches_cublas("replay", replay);
    if (eager_between) {
      tt::poison(d);
      TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
      tk::gemm(args, o, s);
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(s));
      expect_matches_cublas("eager call after replay", replay);
    }
  }
  TESSERA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TESSERA_CUDA_CHECK(cudaGraphDestroy(g));
  TESSERA_CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace

TEST(GemmGpuCapture, SplitKFirstCalledInsideAGlobalCapture) {
  TESSERA_REQUIRE_GPUS(1);
  tk::GemmOptions o;
  o.k_splits = 4;
  check_first_call_inside_capture(96, 512, 4096, o, false);  // few tiles, long K: a split the options force anyway
}

// Stream-K's per-stream workspace made inside the capture; its flags must
// be zero again after every launch, captured or eager, for the next one.
TEST(GemmGpuCapture, StreamKFirstCalledInsideAGlobalCapture) {
  TESSERA_REQUIRE_GPUS(1);
  tk::GemmOptions o;
  o.stream_k = true;
  o.tile = tk::GemmTile::T128x128;
  check_first_call_inside_capture(700, 1300, 3000, o, true);  // 66 tiles on every SM: tiles split between CTAs
}
