// Peer-memory epilogues across two GPUs of one process: GPU 0 computes, the
// output (and a .sys notify flag per tile) live on GPU 1; a partial is read
// from GPU 1. Skips with fewer than 2 GPUs or without peer access.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "gemm_policy_kernels.hpp"
#include "gemm_test_util.hpp"
#include "support/test_support.hpp"
#include "tessera/kernels/gemm.hpp"

namespace tk = tessera::kernels;
namespace tt = tessera::kernels::testk;
using tessera::DType;

TEST(GemmPeer, StoreNotifyAndPartialThroughAPeerGpu) {
  TESSERA_REQUIRE_GPUS(2);
  int can = 0;
  TESSERA_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, 0, 1));
  if (!can) GTEST_SKIP() << "GPU 0 cannot access GPU 1";
  std::mt19937_64 rng(std::random_device{}());
  const int64_t m = 1000, n = 1200, k = 512;
  const int tiles = static_cast<int>(((m + 127) / 128) * ((n + 255) / 256));

  TESSERA_CUDA_CHECK(cudaSetDevice(1));
  tt::DevBuf d1(m * n * 2), flags1(tiles * 4);
  std::vector<double> hc;
  tt::DevBuf c1 = tt::random_matrix(m, n, n, DType::bf16, rng, &hc);
  tt::poison(d1);
  TESSERA_CUDA_CHECK(cudaMemset(flags1.p, 0, flags1.bytes));
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());

  TESSERA_CUDA_CHECK(cudaSetDevice(0));
  const cudaError_t pe = cudaDeviceEnablePeerAccess(1, 0);
  if (pe == cudaErrorPeerAccessAlreadyEnabled)
    (void)cudaGetLastError();
  else
    TESSERA_CUDA_CHECK(pe);
  tt::DevBuf a = tt::random_matrix(m, k, k, DType::bf16, rng), b = tt::random_matrix(n, k, k, DType::bf16, rng);
  tt::DevBuf d0(m * n * 2);
  tt::poison(d0);
  tk::GemmArgs args{a.p, b.p, d0.p, m, n, k, k, k, n};
  tk::GemmOptions o;
  o.tile = tk::GemmTile::T128x256;
  tk::gemm(args, o);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());

  tk::GemmArgs peer = args;
  peer.d = d1.p;
  tt::gemm_peer_notify_sys(peer, tk::GemmTile::T128x256, flags1.as<uint32_t>(), nullptr);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(tt::bytes_of(d1) == tt::bytes_of(d0)) << "peer store differs from the local result";
  std::vector<uint32_t> f(tiles);
  TESSERA_CUDA_CHECK(cudaMemcpy(f.data(), flags1.p, flags1.bytes, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(std::all_of(f.begin(), f.end(), [](uint32_t v) { return v == 1; }));

  // The same through the ping-pong kernel (T128x128 in the policy helpers;
  // ping_pong): peer stores and .sys notifies per 128x128 tile.
  {
    const int tiles_pp = static_cast<int>(((m + 127) / 128) * ((n + 127) / 128));
    TESSERA_CUDA_CHECK(cudaSetDevice(1));
    tt::DevBuf flags_pp(tiles_pp * 4);
    TESSERA_CUDA_CHECK(cudaMemset(flags_pp.p, 0, flags_pp.bytes));
    tt::poison(d1);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    TESSERA_CUDA_CHECK(cudaSetDevice(0));
    tt::gemm_peer_notify_sys(peer, tk::GemmTile::T128x128, flags_pp.as<uint32_t>(), nullptr);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(tt::bytes_of(d1) == tt::bytes_of(d0)) << "ping-pong peer store differs from the local result";
    std::vector<uint32_t> fp(tiles_pp);
    TESSERA_CUDA_CHECK(cudaMemcpy(fp.data(), flags_pp.p, flags_pp.bytes, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(std::all_of(fp.begin(), fp.end(), [](uint32_t v) { return v == 1; })) << "ping-pong notify";
  }

  // Partial read from the peer: D0 = A·B + C1.
  const auto plain = tt::download(d0.p, m, n, n, DType::bf16);
  tt::poison(d0);
  tt::gemm_add_partial(args, tk::GemmTile::T128x256, c1.p, n, nullptr);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> ref(plain.size());
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = plain[i] + hc[i];
  EXPECT_LT(tessera::testing::relative_error(tt::download(d0.p, m, n, n, DType::bf16), ref), 1e-2);
  tt::poison(d0);
  tt::gemm_add_partial(args, tk::GemmTile::T128x128, c1.p, n, nullptr);  // ping-pong
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LT(tessera::testing::relative_error(tt::download(d0.p, m, n, n, DType::bf16), ref), 1e-2) << "ping-pong";
}
