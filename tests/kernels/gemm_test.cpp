// GPU tests of the GEMM engine against cuBLASLt (and a float64 CPU reference
// on a small problem): fresh random data, poisoned outputs, aligned and ragged
// shapes, both B layouts, both input types, every policy.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gemm_policy_kernels.hpp"
#include "gemm_test_util.hpp"
#include "support/test_support.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/runtime/wait_diagnostics.hpp"

namespace tk = tessera::kernels;
namespace tt = tessera::kernels::testk;
using tessera::DType;
using tessera::testing::relative_error;

namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 r(std::random_device{}());
  return r;
}

struct Problem {
  int64_t m, n, k;
  DType in = DType::bf16, out = DType::bf16;
  tk::BLayout layout = tk::BLayout::NK;
  int64_t pad = 0;  // extra elements per row on every leading dimension
};

struct Buffers {
  tt::DevBuf a, b, d, ref;
  tk::GemmArgs args;
  std::vector<double> ha, hb;
};

Buffers make(const Problem& p, bool host_copy = false) {
  Buffers s;
  const int64_t lda = (p.k + 7) / 8 * 8 + p.pad;  // 16-byte rows; pad is a multiple of 8
  const bool nk = p.layout == tk::BLayout::NK;
  const int64_t brows = nk ? p.n : p.k, bcols = nk ? p.k : p.n, ldb = (bcols + 7) / 8 * 8 + p.pad;
  const int64_t ldd = (p.n + 7) / 8 * 8 + p.pad;  // validate(): 16-byte rows
  s.a = tt::random_matrix(p.m, p.k, lda, p.in, rng(), host_copy ? &s.ha : nullptr);
  s.b = tt::random_matrix(brows, bcols, ldb, p.in, rng(), host_copy ? &s.hb : nullptr);
  s.d = tt::DevBuf(static_cast<size_t>(p.m * ldd) * tessera::dtype_size(p.out));
  s.ref = tt::DevBuf(s.d.bytes);
  tt::poison(s.d);
  tt::poison(s.ref);
  s.args = tk::GemmArgs{s.a.p, s.b.p, s.d.p, p.m, p.n, p.k, lda, ldb, ldd, p.in, p.out, p.layout};
  return s;
}

// Runs cuBLASLt into s.ref and returns rel. error of D vs it.
double error_vs_cublas(Buffers& s) {
  tk::GemmArgs r = s.args;
  r.d = s.ref.p;
  tk::cublaslt_gemm(r);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  const auto& a = s.args;
  return relative_error(tt::download(a.d, a.m, a.n, a.ldd, a.out), tt::download(r.d, a.m, a.n, a.ldd, a.out));
}

double tolerance(DType out) { return out == DType::f32 ? 1e-5 : 8e-3; }

std::string name(const Problem& p, tk::GemmTile t) {
  return std::to_string(p.m) + "x" + std::to_string(p.n) + "x" + std::to_string(p.k) + " in " +
         std::string(tessera::dtype_name(p.in)) + " out " + std::string(tessera::dtype_name(p.out)) +
         (p.layout == tk::BLayout::NK ? " B[N,K]" : " B[K,N]") + " tile " + tk::tile_name(t) + " pad " +
         std::to_string(p.pad);
}

}  // namespace

TEST(GemmGpu, MatchesFloat64ReferenceOnSmallRaggedProblem) {
  TESSERA_REQUIRE_GPUS(1);
  for (auto layout : {tk::BLayout::NK, tk::BLayout::KN}) {
    const Problem p{200, 136, 72, DType::bf16, DType::f32, layout, 8};
    Buffers s = make(p, true);
    tk::gemm(s.args);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> ref(static_cast<size_t>(p.m * p.n));
    const int64_t lda = s.args.lda, ldb = s.args.ldb;
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t j = 0; j < p.n; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < p.k; ++k)
          acc += s.ha[i * lda + k] * (layout == tk::BLayout::NK ? s.hb[j * ldb + k] : s.hb[k * ldb + j]);
        ref[i * p.n + j] = acc;
      }
    const double err = relative_error(tt::download(s.d.p, p.m, p.n, s.args.ldd, p.out), ref);
    EXPECT_LT(err, 1e-5) << name(p, tk::GemmTile::Auto);
    EXPECT_LT(error_vs_cublas(s), 1e-5) << "cuBLASLt baseline disagrees: " << name(p, tk::GemmTile::Auto);
  }
}

// One case per shape, so a sanitizer run can take the shapes as separate jobs.
class GemmTileSweep : public ::testing::TestWithParam<std::array<int64_t, 3>> {};

namespace {
std::string sweep_case_name(const ::testing::TestParamInfo<std::array<int64_t, 3>>& info) {
  const std::array<int64_t, 3>& p = info.param;
  return "M" + std::to_string(p[0]) + "_N" + std::to_string(p[1]) + "_K" + std::to_string(p[2]);
}
}  // namespace

TEST_P(GemmTileSweep, EveryTileLayoutTypeAndShapeMatchesCublas) {
  TESSERA_REQUIRE_GPUS(1);
  const std::array<int64_t, 3> sh = GetParam();
  for (DType in : {DType::bf16, DType::f16})
    for (auto layout : {tk::BLayout::NK, tk::BLayout::KN})
      for (auto tile : {tk::GemmTile::T128x256, tk::GemmTile::T256x128, tk::GemmTile::T128x128})
        for (int cluster : {1, 2}) {
          if (tile == tk::GemmTile::T128x128 && cluster == 2) continue;
          const Problem p{sh[0], sh[1], sh[2], in, in, layout, (sh[0] % 2) ? 8 : 0};
          Buffers s = make(p);
          tk::GemmOptions o;
          o.tile = tile;
          o.cluster_m = cluster;
          tk::gemm(s.args, o);
          const double err = error_vs_cublas(s);
          EXPECT_LT(err, tolerance(p.out)) << name(p, tile) << " cluster " << cluster;
        }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmTileSweep,
                         ::testing::Values(std::array<int64_t, 3>{512, 768, 1024}, std::array<int64_t, 3>{300, 200, 72},
                                           std::array<int64_t, 3>{129, 257, 136},
                                           std::array<int64_t, 3>{1000, 520, 2056}),
                         sweep_case_name);

// Ping-pong schedule (GemmOptions::ping_pong): both ping-pong tiles,
// aligned and ragged shapes, both layouts and input types. Each result is
// compared with cuBLASLt and BITWISE with the default (cooperative) path: the
// per-element K order is the same, so any difference is a schedule bug (a
// slot read at the wrong phase, a tile stored twice or not at all).
// 2304x2176x4096 has more tiles than SMs (several per CTA, ring wrapping);
// 300x200x72 has fewer K blocks than ring stages and single-tile CTAs.
// One case per shape (sanitizer jobs), as GemmTileSweep.
class GemmOverlapShapes : public ::testing::TestWithParam<std::array<int64_t, 3>> {};

TEST_P(GemmOverlapShapes, OverlapMatchesDefaultBitwiseAndCublas) {
  TESSERA_REQUIRE_GPUS(1);
  const std::array<int64_t, 3> sh = GetParam();
  for (DType in : {DType::bf16, DType::f16})
    for (auto layout : {tk::BLayout::NK, tk::BLayout::KN}) {
      const Problem p{sh[0], sh[1], sh[2], in, in, layout, (sh[0] % 2) ? 8 : 0};
      Buffers s = make(p);
      tk::GemmOptions whole_k;
      whole_k.k_splits = 1;       // split-K sums in another order: whole-K kernels only
      tk::gemm(s.args, whole_k);  // default path
      TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
      const auto want = tt::bytes_of(s.d);
      EXPECT_LT(error_vs_cublas(s), tolerance(p.out)) << "default path: " << name(p, tk::GemmTile::Auto);
      for (auto tile : {tk::GemmTile::Auto, tk::GemmTile::T128x128, tk::GemmTile::T64x256}) {
        tt::poison(s.d);
        tk::GemmOptions o;
        o.tile = tile;
        o.ping_pong = true;
        tk::gemm(s.args, o);
        TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_TRUE(tt::bytes_of(s.d) == want) << "overlap differs from default: " << name(p, tile);
        EXPECT_LT(error_vs_cublas(s), tolerance(p.out)) << "overlap: " << name(p, tile);
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmOverlapShapes,
                         ::testing::Values(std::array<int64_t, 3>{512, 768, 1024}, std::array<int64_t, 3>{300, 200, 72},
                                           std::array<int64_t, 3>{129, 257, 136},
                                           std::array<int64_t, 3>{1000, 520, 2056},
                                           std::array<int64_t, 3>{2304, 2176, 4096}),
                         sweep_case_name);

// Ping-pong with tile orders and SM caps: odd CTA counts leave one consumer
// with one tile fewer; a cap of 1 runs every tile through one CTA.
TEST(GemmGpu, OverlapTileOrdersAndSmCapGiveIdenticalResults) {
  TESSERA_REQUIRE_GPUS(1);
  const Problem p{1100, 1300, 512};
  Buffers s = make(p);
  tk::GemmOptions whole_k;
  whole_k.k_splits = 1;  // split-K sums in another order: whole-K kernels only
  tk::gemm(s.args, whole_k);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  const auto want = tt::bytes_of(s.d);
  struct Variant {
    const char* what;
    int group;
    bool along_m;
    int rotate;
    int max_ctas;
  };
  const Variant variants[] = {{"default raster", 8, false, 0, 0},  {"row-major", 1, false, 0, 0},
                              {"along m, group 2", 2, true, 0, 0}, {"rotate 3", 8, false, 3, 0},
                              {"sm cap 5", 8, false, 0, 5},        {"sm cap 1", 8, false, 0, 1},
                              {"sm cap 2", 3, false, 0, 2}};
  for (auto tile : {tk::GemmTile::T128x128, tk::GemmTile::T64x256})
    for (const auto& v : variants) {
      tt::poison(s.d);
      tk::GemmOptions o;
      o.tile = tile;
      o.ping_pong = true;
      o.raster_group = v.group;
      o.raster_along_m = v.along_m;
      o.rotate_m = v.rotate;
      o.max_ctas = v.max_ctas;
      tk::gemm(s.args, o);
      TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(tt::bytes_of(s.d) == want) << v.what << " tile " << tk::tile_name(tile);
    }
  const int tiles = static_cast<int>(((p.m + 127) / 128) * ((p.n + 127) / 128));
  std::vector<int> order(tiles);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng());
  tt::DevBuf d_order(tiles * sizeof(int));
  TESSERA_CUDA_CHECK(cudaMemcpy(d_order.p, order.data(), tiles * sizeof(int), cudaMemcpyHostToDevice));
  tt::poison(s.d);
  tt::gemm_permuted(s.args, tk::GemmTile::T128x128, d_order.as<int>(), 7, nullptr);  // ping-pong
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(tt::bytes_of(s.d) == want) << "overlap, random permutation, 7 CTAs";
}

TEST(GemmGpu, OverlapRejectsWhatItDoesNotCompile) {
  TESSERA_REQUIRE_GPUS(1);
  const Problem p{256, 256, 128, DType::bf16, DType::f32};
  Buffers s = make(p);
  tk::GemmOptions o;
  o.ping_pong = true;
  EXPECT_THROW(tk::gemm(s.args, o), tessera::Error);  // f32 output from bf16 inputs
  s.args.out = DType::bf16;
  o.tile = tk::GemmTile::T128x256;
  EXPECT_THROW(tk::gemm(s.args, o), tessera::Error);
  o.tile = tk::GemmTile::Auto;
  o.cluster_m = 2;
  EXPECT_THROW(tk::gemm(s.args, o), tessera::Error);
  tk::GemmOptions plain;
  plain.tile = tk::GemmTile::T64x256;
  EXPECT_THROW(tk::gemm(s.args, plain), tessera::Error);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
}

// cuBLASLt has no bf16 -> f16 (or f16 -> bf16) kernels: compare every output
// type against its f32 output.
std::vector<double> cublas_f32(const tk::GemmArgs& a);

TEST(GemmGpu, MixedOutputTypesMatchCublas) {
  TESSERA_REQUIRE_GPUS(1);
  for (DType in : {DType::bf16, DType::f16})
    for (DType out : {DType::bf16, DType::f16, DType::f32})
      for (auto layout : {tk::BLayout::NK, tk::BLayout::KN}) {
        const Problem p{384, 392, 264, in, out, layout};
        Buffers s = make(p);
        tk::gemm(s.args);
        TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
        const double err = relative_error(tt::download(s.d.p, p.m, p.n, s.args.ldd, out), cublas_f32(s.args));
        EXPECT_LT(err, out == DType::f32 ? 1e-5 : 8e-3) << name(p, tk::GemmTile::Auto);
      }
}

// Every tile order must give bitwise the same D: a tile is computed the same
// way whichever CTA takes it and when.
TEST(GemmGpu, TileOrdersAndSmCapGiveIdenticalResults) {
  TESSERA_REQUIRE_GPUS(1);
  const Problem p{1100, 1300, 512};
  Buffers s = make(p);
  tk::GemmOptions base;
  base.tile = tk::GemmTile::T128x256;
  base.cluster_m = 1;
  tk::gemm(s.args, base);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LT(error_vs_cublas(s), tolerance(p.out));
  const auto want = tt::bytes_of(s.d);

  struct Variant {
    const char* what;
    int group;
    bool along_m;
    int rotate;
    int max_ctas;
    int cluster;
  };
  const Variant variants[] = {{"row-major", 1, false, 0, 0, 1},          {"group 3", 3, false, 0, 0, 1},
                              {"along m, group 2", 2, true, 0, 0, 1},    {"rotate 3", 8, false, 3, 0, 1},
                              {"sm cap 5", 8, false, 0, 5, 1},           {"sm cap 1", 8, false, 0, 1, 1},
                              {"cluster 2", 8, false, 0, 0, 2},          {"cluster 2, rotate 4", 3, false, 4, 0, 2},
                              {"cluster 2, along m", 2, true, 0, 0, 2},  {"cluster 2, sm cap 6", 8, false, 0, 6, 2},
                              {"cluster 2, sm cap 2", 1, false, 0, 2, 2}};
  for (const auto& v : variants) {
    tt::poison(s.d);
    tk::GemmOptions o = base;
    o.raster_group = v.group;
    o.raster_along_m = v.along_m;
    o.rotate_m = v.rotate;
    o.max_ctas = v.max_ctas;
    o.cluster_m = v.cluster;
    tk::gemm(s.args, o);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(tt::bytes_of(s.d) == want) << v.what;
  }

  // Explicit random permutation (PermutedScheduler).
  const int tiles = static_cast<int>(((p.m + 127) / 128) * ((p.n + 255) / 256));
  std::vector<int> order(tiles);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng());
  tt::DevBuf d_order(tiles * sizeof(int));
  TESSERA_CUDA_CHECK(cudaMemcpy(d_order.p, order.data(), tiles * sizeof(int), cudaMemcpyHostToDevice));
  tt::poison(s.d);
  tt::gemm_permuted(s.args, tk::GemmTile::T128x256, d_order.as<int>(), 7, nullptr);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(tt::bytes_of(s.d) == want) << "random permutation, 7 CTAs";
}

// The GEMM waits for A's row chunks, which a second stream writes and
// releases one by one after a delay. A starts as different random data, so a
// tile loaded before its flag would be wrong.
TEST(GemmGpu, FlagWaitReleasedBySecondStream) {
  TESSERA_REQUIRE_GPUS(1);
  const Problem p{1024, 768, 512};
  Buffers s = make(p);
  tk::GemmOptions o;
  o.tile = tk::GemmTile::T128x256;
  tk::gemm(s.args, o);  // reference with the final A
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  const auto want = tt::bytes_of(s.d);

  tt::preload_helpers();  // lazy module loading would serialise the two streams
  tt::DevBuf staged(s.a.bytes);
  TESSERA_CUDA_CHECK(cudaMemcpy(staged.p, s.a.p, s.a.bytes, cudaMemcpyDeviceToDevice));
  const int rows_per_flag = 96;  // not a multiple of BM: tiles straddle two flags
  const int chunks = static_cast<int>((p.m + rows_per_flag - 1) / rows_per_flag);
  tt::DevBuf flags(chunks * sizeof(uint32_t));
  TESSERA_CUDA_CHECK(cudaMemset(flags.p, 0, flags.bytes));
  int sms = 0;
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t s1, s2;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  // Epoch 1: cooperative, 2: cooperative with 2-CTA clusters, 3: ping-pong.
  for (uint32_t epoch = 1; epoch <= 3; ++epoch) {
    std::mt19937_64 r2(rng()());
    tt::DevBuf wrong = tt::random_matrix(p.m, p.k, s.args.lda, p.in, r2);
    TESSERA_CUDA_CHECK(cudaMemcpy(s.a.p, wrong.p, s.a.bytes, cudaMemcpyDeviceToDevice));
    tt::poison(s.d);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    // GEMM first (leaving SMs for the releasing kernel), then the release.
    tt::gemm_flag_wait(s.args, epoch == 3 ? tk::GemmTile::T128x128 : tk::GemmTile::T128x256, flags.as<uint32_t>(),
                       rows_per_flag, epoch, 5'000'000'000ull, sms - 2, s1, /*cluster=*/epoch == 2 ? 2 : 1);
    tt::release_chunks(staged.p, s.a.p, p.m, p.k, s.args.lda, rows_per_flag, flags.as<uint32_t>(), epoch, 20'000'000ull,
                       s2);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(s1));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(s2));
    EXPECT_TRUE(tt::bytes_of(s.d) == want) << "epoch " << epoch << (epoch == 3 ? " ping-pong" : " cooperative");
  }
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

namespace {
void wait_on_a_flag_never_set() {
  const Problem p{256, 256, 128};
  Buffers s = make(p);
  tt::DevBuf flags(64);
  TESSERA_CUDA_CHECK(cudaMemset(flags.p, 0, 64));
  tessera::runtime::process_wait_diagnostics().clear();
  tt::gemm_flag_wait(s.args, tk::GemmTile::T128x256, flags.as<uint32_t>(), 128, 1, 50'000'000ull, 0, nullptr);
  const cudaError_t e = cudaDeviceSynchronize();
  fprintf(stderr, "gemm wait ended: %s; %s\n", cudaGetErrorString(e),
          tessera::runtime::process_wait_diagnostics().describe().value_or("").c_str());
  if (e != cudaSuccess) std::abort();
}
}  // namespace

// A flag that is never set: the producer times out, prints a diagnostic and
// traps; the host sees an error. Runs in a re-executed child process
// (threadsafe death test) because a trap ruins the CUDA context.
TEST(GemmGpuDeathTest, FlagWaitTimesOutAndTraps) {
  TESSERA_REQUIRE_GPUS(1);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(wait_on_a_flag_never_set(),
               "gemm wait ended: .*(launch failure|illegal|trap|unspecified).*timed out after 50000000 ns: block "
               "[0-9]+ waiting for tile \\([0-9], 0\\): flag\\[[0-9]\\] expected >= 1, seen 0");
}

// Per-tile notify, observed while the GEMM runs by a kernel on another stream
// that copies each tile as soon as its flag says it is complete: the copy must
// equal the final D (a tile announced before its stores are visible would
// show poison). Second epoch: flags reach 2.
TEST(GemmGpu, NotifyObservedDuringTheGemm) {
  TESSERA_REQUIRE_GPUS(1);
  const Problem p{1536, 1280, 1024};
  Buffers s = make(p);
  int sms = 0;
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t s1, s2;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  const int observers = 8;
  // Lazy module loading: a kernel's first launch waits for running kernels, so
  // both the observer and the GEMM must be loaded before they run together.
  tt::preload_helpers();
  // 256x128: cooperative kernel; 128x128 here: the ping-pong kernel.
  for (auto tile : {tk::GemmTile::T256x128, tk::GemmTile::T128x128}) {
    const int bm = tk::tile_shape(tile).bm, bn = tk::tile_shape(tile).bn;
    const int tiles = static_cast<int>(((p.m + bm - 1) / bm) * ((p.n + bn - 1) / bn));
    tt::DevBuf flags(tiles * 4), copy(s.d.bytes), status(4);
    TESSERA_CUDA_CHECK(cudaMemset(flags.p, 0, flags.bytes));
    tt::gemm_notify(s.args, tile, flags.as<uint32_t>(), nullptr, sms - observers, s1);  // epoch 1
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(s1));
    for (uint32_t epoch = 2; epoch <= 3; ++epoch) {
      tt::poison(s.d);
      tt::poison(copy);
      TESSERA_CUDA_CHECK(cudaMemset(status.p, 0, 4));
      TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
      tt::observe_tiles(flags.as<uint32_t>(), epoch, s.d.p, copy.p, p.m, p.n, s.args.ldd, bm, bn, 5'000'000'000ull,
                        status.as<int>(), observers, s2);
      tt::gemm_notify(s.args, tile, flags.as<uint32_t>(), nullptr, sms - observers, s1);
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(s1));
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(s2));
      int st = -1;
      TESSERA_CUDA_CHECK(cudaMemcpy(&st, status.p, 4, cudaMemcpyDeviceToHost));
      EXPECT_EQ(st, 0) << "observer timed out, epoch " << epoch << " tile " << tk::tile_name(tile);
      EXPECT_TRUE(tt::bytes_of(copy) == tt::bytes_of(s.d))
          << "observer saw a tile before its stores, epoch " << epoch << " tile " << tk::tile_name(tile);
      std::vector<uint32_t> f(tiles);
      TESSERA_CUDA_CHECK(cudaMemcpy(f.data(), flags.p, flags.bytes, cudaMemcpyDeviceToHost));
      EXPECT_TRUE(std::all_of(f.begin(), f.end(), [&](uint32_t v) { return v == epoch; }))
          << "epoch " << epoch << " tile " << tk::tile_name(tile);
    }
    EXPECT_LT(error_vs_cublas(s), tolerance(p.out)) << tk::tile_name(tile);
  }
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

TEST(GemmGpu, WaveGroupCountersCountTheirTiles) {
  TESSERA_REQUIRE_GPUS(1);
  const Problem p{1100, 1500, 256};  // 9 tile rows: with clusters the last pair has a phantom tile
  Buffers s = make(p);
  struct Cfg {
    tk::GemmTile tile;  // T128x128: the ping-pong kernel (gemm_policy_kernels.hpp)
    int cluster;
  };
  for (const Cfg c : {Cfg{tk::GemmTile::T128x256, 1}, Cfg{tk::GemmTile::T128x256, 2}, Cfg{tk::GemmTile::T128x128, 1}}) {
    const auto sh = tk::tile_shape(c.tile);
    const int tiles_m = static_cast<int>((p.m + sh.bm - 1) / sh.bm),
              tiles_n = static_cast<int>((p.n + sh.bn - 1) / sh.bn);
    const int tiles = tiles_m * tiles_n;
    const int per_group = 7, groups = (tiles + per_group - 1) / per_group;
    std::vector<int> map(tiles);
    for (int t = 0; t < tiles; ++t) map[t] = t / per_group;
    tt::DevBuf d_map(tiles * 4), counters(groups * 4);
    TESSERA_CUDA_CHECK(cudaMemcpy(d_map.p, map.data(), tiles * 4, cudaMemcpyHostToDevice));
    TESSERA_CUDA_CHECK(cudaMemset(counters.p, 0, counters.bytes));
    tt::poison(s.d);
    tt::gemm_notify(s.args, c.tile, counters.as<uint32_t>(), d_map.as<int>(), 0, nullptr, c.cluster);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint32_t> cnt(groups);
    TESSERA_CUDA_CHECK(cudaMemcpy(cnt.data(), counters.p, counters.bytes, cudaMemcpyDeviceToHost));
    for (int g = 0; g < groups; ++g)
      EXPECT_EQ(cnt[g], static_cast<uint32_t>(std::min(per_group, tiles - g * per_group)))
          << "group " << g << " tile " << tk::tile_name(c.tile) << " cluster " << c.cluster;
    EXPECT_LT(error_vs_cublas(s), tolerance(p.out)) << tk::tile_name(c.tile) << " cluster " << c.cluster;
  }
}

// Tiles go to slot reorder[tile] of a dense group buffer; every in-range
// element must equal the plain GEMM's.
TEST(GemmGpu, ReorderMapStoresTilesIntoSlots) {
  TESSERA_REQUIRE_GPUS(1);
  // T128x128: the ping-pong kernel (reference: the plain ping-pong GEMM).
  for (auto tile : {tk::GemmTile::T128x256, tk::GemmTile::T256x128, tk::GemmTile::T128x128}) {
    const Problem p{700, 900, 320};
    Buffers s = make(p);
    tk::GemmOptions o;
    o.tile = tile;
    o.ping_pong = tile == tk::GemmTile::T128x128;
    tk::gemm(s.args, o);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    const auto plain = tt::download(s.d.p, p.m, p.n, s.args.ldd, p.out);
    const auto sh = tk::tile_shape(tile);
    const int tm = static_cast<int>((p.m + sh.bm - 1) / sh.bm), tn = static_cast<int>((p.n + sh.bn - 1) / sh.bn);
    std::vector<int> slot(tm * tn);
    std::iota(slot.begin(), slot.end(), 0);
    std::shuffle(slot.begin(), slot.end(), rng());
    tt::DevBuf d_slot(slot.size() * 4), group(static_cast<size_t>(tm * tn) * sh.bm * sh.bn * 2);
    TESSERA_CUDA_CHECK(cudaMemcpy(d_slot.p, slot.data(), d_slot.bytes, cudaMemcpyHostToDevice));
    tt::poison(group);
    tk::GemmArgs a = s.args;
    a.d = group.p;
    tt::gemm_reorder(a, tile, d_slot.as<int>(), nullptr);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    const int64_t elems = static_cast<int64_t>(group.bytes / 2);
    const auto g = tt::download(group.p, 1, elems, elems, p.out);
    int64_t bad = 0;
    for (int t = 0; t < tm * tn; ++t)
      for (int r = 0; r < sh.bm; ++r)
        for (int c = 0; c < sh.bn; ++c) {
          const int64_t row = static_cast<int64_t>(t / tn) * sh.bm + r, col = static_cast<int64_t>(t % tn) * sh.bn + c;
          const double v = g[static_cast<size_t>(slot[t]) * sh.bm * sh.bn + r * sh.bn + c];
          if (row < p.m && col < p.n) {
            if (v != plain[row * p.n + col]) ++bad;
          } else if (!std::isnan(v)) {
            ++bad;  // outside the problem the block must stay untouched
          }
        }
    EXPECT_EQ(bad, 0) << tk::tile_name(tile);
  }
}

// cuBLASLt with f32 output, as doubles.
std::vector<double> cublas_f32(const tk::GemmArgs& a) {
  tk::GemmArgs r = a;
  r.out = DType::f32;
  r.ldd = a.n + (a.n % 4 ? 4 - a.n % 4 : 0);
  tt::DevBuf out2(static_cast<size_t>(a.m * r.ldd) * 4);
  r.d = out2.p;
  tk::cublaslt_gemm(r);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  return tt::download(out2.p, a.m, a.n, r.ldd, DType::f32);
}

TEST(GemmGpu, AddPartialAndBias) {
  TESSERA_REQUIRE_GPUS(1);
  const Problem p{520, 640, 384, DType::bf16, DType::bf16, tk::BLayout::NK, 8};
  Buffers s = make(p);
  const auto acc = cublas_f32(s.args);
  std::vector<double> hc, hbias;
  tt::DevBuf c = tt::random_matrix(p.m, p.n, s.args.ldd, DType::bf16, rng(), &hc);
  tt::DevBuf bias = tt::random_matrix(1, p.n, p.n, DType::bf16, rng(), &hbias);
  // T128x128: the ping-pong kernel.
  for (auto tile : {tk::GemmTile::T128x256, tk::GemmTile::T256x128, tk::GemmTile::T128x128}) {
    std::vector<double> ref(acc.size());
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t j = 0; j < p.n; ++j) ref[i * p.n + j] = acc[i * p.n + j] + hc[i * s.args.ldd + j];
    tt::poison(s.d);
    tt::gemm_add_partial(s.args, tile, c.p, s.args.ldd, nullptr);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LT(relative_error(tt::download(s.d.p, p.m, p.n, s.args.ldd, p.out), ref), 8e-3)
        << "partial " << tk::tile_name(tile);
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t j = 0; j < p.n; ++j) ref[i * p.n + j] = acc[i * p.n + j] + hbias[j];
    tt::poison(s.d);
    tt::gemm_bias(s.args, tile, bias.p, nullptr);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LT(relative_error(tt::download(s.d.p, p.m, p.n, s.args.ldd, p.out), ref), 8e-3)
        << "bias " << tk::tile_name(tile);
  }
}

TEST(GemmGpu, SwiGLUOfInterleavedGateAndUp) {
  TESSERA_REQUIRE_GPUS(1);
  const Problem p{600, 1000, 512};  // N = 2 * 500 interleaved gate/up columns
  Buffers s = make(p);
  const auto acc = cublas_f32(s.args);
  const int64_t nout = p.n / 2, ldo = nout + 4;
  tt::DevBuf out(static_cast<size_t>(p.m * ldo) * 2);
  std::vector<double> ref(static_cast<size_t>(p.m * nout));
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < nout; ++j) {
      const double g = acc[i * p.n + 2 * j], u = acc[i * p.n + 2 * j + 1];
      ref[i * nout + j] = g / (1.0 + std::exp(-g)) * u;
    }
  // T128x128: the ping-pong kernel.
  for (auto tile : {tk::GemmTile::T128x256, tk::GemmTile::T256x128, tk::GemmTile::T128x128}) {
    tt::poison(out);
    tk::GemmArgs a = s.args;
    a.d = out.p;
    a.ldd = ldo;
    tt::gemm_swiglu(a, tile, nullptr);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LT(relative_error(tt::download(out.p, p.m, nout, ldo, DType::bf16), ref), 1e-2) << tk::tile_name(tile);
  }
}

// Shape coverage: K tails of every 16-byte residue (K % 64 = 8,
// 24, 40, 56, 16), M = 1 and other tiny M, N tails (N % 8 != 0 with a padded
// ldd), whatever plan_gemm() picks and every forced split-K variant; both
// layouts and input types, bf16 / f32 output, outputs poisoned first.
TEST(GemmGpu, CoverageShapesMatchCublasOnEveryPlan) {
  TESSERA_REQUIRE_GPUS(1);
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 520, 1032},    {1, 1000, 4104},    {17, 4096, 2056},
                                                      {64, 1544, 8200},  {100, 777, 3000},   {333, 2049, 1240},
                                                      {1000, 600, 4040}, {2048, 1024, 1048}, {129, 8, 520}};
  for (const auto& sh : shapes)
    for (DType in : {DType::bf16, DType::f16})
      for (auto layout : {tk::BLayout::NK, tk::BLayout::KN})
        for (DType out : {in, DType::f32}) {
          const Problem p{sh[0], sh[1], sh[2], in, out, layout};
          Buffers s = make(p);
          struct Variant {
            const char* what;
            int splits;
            bool overlap;
          };
          const Variant variants[] = {{"auto", 0, false},
                                      {"split 1", 1, false},
                                      {"128x128 split 2", 2, false},
                                      {"128x128 split 7", 7, false},
                                      {"64x256 pp split 3", 3, true}};
          for (const auto& v : variants) {
            if (v.overlap && out != in) continue;  // ping-pong: out == in only
            tt::poison(s.d);
            tk::GemmOptions o;
            o.k_splits = v.splits;
            o.ping_pong = v.overlap;
            if (v.overlap) o.tile = tk::GemmTile::T64x256;
            tk::gemm(s.args, o);
            TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
            tt::poison(s.ref);
            EXPECT_LT(error_vs_cublas(s), tolerance(p.out))
                << name(p, tk::GemmTile::Auto) << " " << v.what << " plan " << tk::plan_name(tk::plan_gemm(s.args, o));
          }
        }
}

// The TMA-store epilogue (plain whole-K kernels, 16-bit D, N % 8 == 0):
// every kernel that stores through shared memory, on M and N tails inside a
// 64 x 32 box and with padded rows, against cuBLASLt, BITWISE against the
// 128x128 ping-pong kernel (whose 7-stage ring leaves no room for the
// staging buffers: the register store loop), and with the rows' padding
// left as poisoned (a bulk store must clip at N and M).
TEST(GemmGpu, TmaStoreMatchesRegisterStoreAndKeepsPadding) {
  TESSERA_REQUIRE_GPUS(1);
  struct Kernel {
    const char* what;
    tk::GemmTile tile;
    bool ping_pong;
    int cluster_n;
  };
  const Kernel kernels[] = {
      {"plan", tk::GemmTile::Auto, false, 0},           {"128x256", tk::GemmTile::T128x256, false, 0},
      {"256x128", tk::GemmTile::T256x128, false, 0},    {"128x192", tk::GemmTile::T128x192, false, 0},
      {"64x256 pp", tk::GemmTile::T64x256, true, 0},    {"64x64 pp", tk::GemmTile::T64x64, true, 0},
      {"128x128 1x2", tk::GemmTile::T128x128, false, 2}};
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 264, 136}, {65, 520, 200}, {129, 776, 72}, {300, 1000, 520}};
  for (const auto& sh : shapes)
    for (DType in : {DType::bf16, DType::f16}) {
      const Problem p{sh[0], sh[1], sh[2], in, in, tk::BLayout::NK, 8};
      Buffers s = make(p);
      tk::GemmOptions reg;
      reg.tile = tk::GemmTile::T128x128;
      reg.ping_pong = true;
      tk::gemm(s.args, reg);
      TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
      const auto want = tt::bytes_of(s.d);
      const int64_t es = 2, row_bytes = s.args.ldd * es;
      for (const auto& k : kernels) {
        tt::poison(s.d);
        tk::GemmOptions o;
        o.tile = k.tile;
        o.ping_pong = k.ping_pong;
        o.cluster_n = k.cluster_n;
        if (k.cluster_n > 1) o.cluster_m = 1;
        o.k_splits = 1;
        tk::gemm(s.args, o);
        TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
        const std::string what = name(p, k.tile) + " " + k.what + " plan " + tk::plan_name(tk::plan_gemm(s.args, o));
        const auto got = tt::bytes_of(s.d);
        EXPECT_TRUE(got == want) << "differs from the register store loop: " << what;
        bool padding_kept = true;
        for (int64_t r = 0; r < p.m; ++r)
          for (int64_t b = p.n * es; b < row_bytes; ++b) padding_kept = padding_kept && got[r * row_bytes + b] == 0xFF;
        EXPECT_TRUE(padding_kept) << "wrote into the rows' padding: " << what;
        tt::poison(s.ref);
        EXPECT_LT(error_vs_cublas(s), tolerance(p.out)) << what;
      }
    }
}

// Any N and K with 16-byte row strides: K and N not multiples of
// 8 with padded lda / ldb, and a packed D whose rows are not 16-byte
// multiples (staged through an aligned buffer and a 2-D copy).
TEST(GemmGpu, OddNAndKWithAlignedRowsMatchCublas) {
  TESSERA_REQUIRE_GPUS(1);
  const std::vector<std::array<int64_t, 3>> shapes = {
      {77, 1001, 1001}, {3000, 517, 2043}, {1, 9, 13}, {300, 4095, 100}};
  for (const auto& sh : shapes)
    for (auto layout : {tk::BLayout::NK, tk::BLayout::KN})
      for (DType out : {DType::bf16, DType::f32}) {
        const Problem p{sh[0], sh[1], sh[2], DType::bf16, out, layout};
        Buffers s = make(p);
        for (bool packed_d : {false, true}) {
          tk::GemmArgs a = s.args;
          if (packed_d) a.ldd = 0;  // ldd = N: unaligned rows
          tt::poison(s.d);
          tk::gemm(a);
          TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
          tk::GemmArgs r = a;
          r.d = s.ref.p;
          tt::poison(s.ref);
          tk::cublaslt_gemm(r);
          TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
          const int64_t ldd = a.ldd_or_packed();
          const double err =
              relative_error(tt::download(a.d, a.m, a.n, ldd, a.out), tt::download(r.d, a.m, a.n, ldd, a.out));
          EXPECT_LT(err, tolerance(out)) << name(p, tk::GemmTile::Auto) << (packed_d ? " packed D" : " padded D")
                                         << " plan " << tk::plan_name(tk::plan_gemm(a, {}));
        }
      }
}

// 64x64 ping-pong (small M): whole K (output type == input type) and split-K
// (any output type), M from 1 to 64 with K and N tails, both layouts and
// input types, outputs poisoned first; and the plan picks it for a decode
// shape.
TEST(GemmGpu, SmallMTile64x64MatchesCublasWholeKAndSplit) {
  TESSERA_REQUIRE_GPUS(1);
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 520, 1032},  {17, 4096, 2056}, {24, 992, 536},
                                                      {40, 824, 2448}, {64, 1544, 8200}, {33, 777, 3000}};
  for (const auto& sh : shapes)
    for (DType in : {DType::bf16, DType::f16})
      for (auto layout : {tk::BLayout::NK, tk::BLayout::KN})
        for (DType out : {in, DType::f32}) {
          const Problem p{sh[0], sh[1], sh[2], in, out, layout};
          Buffers s = make(p);
          for (int splits : {1, 3, 8}) {
            if (splits == 1 && out != in) continue;  // whole K: out == in only
            tt::poison(s.d);
            tk::GemmOptions o;
            o.tile = tk::GemmTile::T64x64;
            o.k_splits = splits;
            tk::gemm(s.args, o);
            TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
            tt::poison(s.ref);
            EXPECT_LT(error_vs_cublas(s), tolerance(p.out)) << name(p, tk::GemmTile::T64x64) << " splits " << splits;
          }
        }
  const Problem decode{24, 992, 536};
  Buffers s = make(decode);
  EXPECT_EQ(tk::plan_gemm(s.args, {}).tile, tk::GemmTile::T64x64) << tk::plan_name(tk::plan_gemm(s.args, {}));
  tt::poison(s.d);
  tk::gemm(s.args);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  tt::poison(s.ref);
  EXPECT_LT(error_vs_cublas(s), tolerance(decode.out));
  tk::GemmOptions mixed;
  mixed.tile = tk::GemmTile::T64x64;
  s.args.out = DType::f32;  // whole-K 64x64 stores the input type only
  EXPECT_THROW(tk::gemm(s.args, mixed), tessera::Error);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
}

// 128x192 cooperative (plain gemm() only, output type == input type): M, N
// and K tails (N not a multiple of 192 or of 8, K not a multiple of 64), one
// and many tiles, both layouts and input types, outputs poisoned first; the
// options it rejects are rejected before launch.
TEST(GemmGpu, Tile128x192MatchesCublas) {
  TESSERA_REQUIRE_GPUS(1);
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 192, 64},     {130, 200, 1000},  {1307, 696, 3520},
                                                      {4428, 552, 864}, {257, 1104, 2184}, {300, 4095, 100}};
  for (const auto& sh : shapes)
    for (DType in : {DType::bf16, DType::f16})
      for (auto layout : {tk::BLayout::NK, tk::BLayout::KN}) {
        const Problem p{sh[0], sh[1], sh[2], in, in, layout};
        Buffers s = make(p);
        tt::poison(s.d);
        tk::GemmOptions o;
        o.tile = tk::GemmTile::T128x192;
        EXPECT_EQ(tk::plan_name(tk::plan_gemm(s.args, o)), "128x192/c1");
        tk::gemm(s.args, o);
        TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
        tt::poison(s.ref);
        EXPECT_LT(error_vs_cublas(s), tolerance(p.out)) << name(p, tk::GemmTile::T128x192);
      }
  Buffers s = make(Problem{256, 384, 512});
  tk::GemmOptions o;
  o.tile = tk::GemmTile::T128x192;
  o.cluster_m = 2;
  EXPECT_THROW(tk::gemm(s.args, o), tessera::Error);
  o.cluster_m = 0;
  o.k_splits = 2;
  EXPECT_THROW(tk::gemm(s.args, o), tessera::Error);
  o.k_splits = 0;
  o.ping_pong = true;
  EXPECT_THROW(tk::gemm(s.args, o), tessera::Error);
  o.ping_pong = false;
  s.args.out = DType::f32;
  EXPECT_THROW(tk::gemm(s.args, o), tessera::Error);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
}

// The plain-only cluster kernels (cluster_kernel_compiled: A shared along
// N, 128x128 along M): each must give bitwise the D of the same tile
// without a cluster (same per-element K order), and match cuBLASLt, on
// tile counts that are not multiples of the cluster's extent (tiles past
// the problem: loaded, never stored), M, N and K tails, rows aligned to 16
// bytes only, both layouts and input types, and an SM cap under which
// each cluster walks several cluster tiles. Options they do not compile
// are rejected before launch.
TEST(GemmGpu, ClusterKernelsMatchUnclusteredBitwiseAndCublas) {
  TESSERA_REQUIRE_GPUS(1);
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 520, 1032}, {130, 200, 1000}, {300, 4095, 100}, {458, 1832, 2264}, {1307, 696, 3528}};
  for (const auto& sh : shapes)
    for (DType in : {DType::bf16, DType::f16})
      for (auto layout : {tk::BLayout::NK, tk::BLayout::KN}) {
        const Problem p{sh[0], sh[1], sh[2], in, in, layout};
        Buffers s = make(p);
        for (tk::GemmTile t : {tk::GemmTile::T128x128, tk::GemmTile::T128x256, tk::GemmTile::T128x192}) {
          tk::GemmOptions base;
          base.tile = t;
          base.cluster_m = 1;
          tt::poison(s.d);
          tk::gemm(s.args, base);
          TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
          const auto want = tt::bytes_of(s.d);
          for (int cm : {1, 2})
            for (int cn : {1, 2})
              for (int cap : {0, 8}) {
                if (!tk::cluster_kernel_compiled(t, cm, cn)) continue;
                tk::GemmOptions o = base;
                o.cluster_m = cm;
                o.cluster_n = cn;
                o.max_ctas = cap;
                const std::string what = name(p, t) + " cluster " + std::to_string(cm) + "x" + std::to_string(cn) +
                                         " sm cap " + std::to_string(cap);
                const tk::GemmPlan plan = tk::plan_gemm(s.args, o);
                EXPECT_EQ(plan.cluster_m, cm) << what;
                EXPECT_EQ(plan.cluster_n, cn) << what;
                tt::poison(s.d);
                tk::gemm(s.args, o);
                TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
                EXPECT_TRUE(tt::bytes_of(s.d) == want) << what << ": not bitwise the unclustered tile's D";
                tt::poison(s.ref);
                EXPECT_LT(error_vs_cublas(s), tolerance(p.out)) << what;
              }
        }
      }
  // Each change to a compiled 128x128 1x2 plan that no kernel runs.
  Buffers s = make(Problem{256, 384, 512});
  tk::GemmOptions o;
  o.tile = tk::GemmTile::T128x128;
  o.cluster_n = 2;
  for (auto bad : {+[](tk::GemmOptions&x, tk::GemmArgs&) { x.tile = tk::GemmTile::T256x128; },  // not compiled
                   +[](tk::GemmOptions&x, tk::GemmArgs&) { x.tile = tk::GemmTile::Auto; },      // names no tile
                   +[](tk::GemmOptions&x, tk::GemmArgs&) { x.cluster_n = 3; },
                   +[](tk::GemmOptions&x, tk::GemmArgs&) { x.k_splits = 2; },
                   +[](tk::GemmOptions&x, tk::GemmArgs&) { x.stream_k = true; },
                   +[](tk::GemmOptions&, tk::GemmArgs&a) { a.out = DType::f32; }}) {
    tk::GemmOptions b = o;
    tk::GemmArgs args = s.args;
    bad(b, args);
    EXPECT_THROW(tk::gemm(args, b), tessera::Error);
  }
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
}

// Stream-K (plain gemm() only, output type == input type): 128x256 and
// 128x128, M, N and K tails, M = 1, one tile and many, whole tiles and
// tiles split over several CTAs (the SM cap changes the ranges: 1 CTA runs
// every tile whole, 3 and 7 split tiles and cover several per CTA);
// outputs poisoned first; the same call twice gives the same bytes; the
// options it does not compile are rejected before launch.
TEST(GemmGpu, StreamKMatchesCublasAndIsDeterministic) {
  TESSERA_REQUIRE_GPUS(1);
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 520, 1032},    {45, 10520, 4344}, {130, 200, 1000},
                                                      {525, 2704, 4672}, {300, 4095, 100},  {2092, 2304, 3568}};
  for (const auto& sh : shapes)
    for (DType in : {DType::bf16, DType::f16})
      for (auto layout : {tk::BLayout::NK, tk::BLayout::KN}) {
        const Problem p{sh[0], sh[1], sh[2], in, in, layout};
        Buffers s = make(p);
        for (tk::GemmTile t : {tk::GemmTile::T128x256, tk::GemmTile::T128x128})
          for (int ctas : {0, 1, 3, 7}) {
            tk::GemmOptions o;
            o.tile = t;
            o.stream_k = true;
            o.max_ctas = ctas;
            EXPECT_TRUE(tk::plan_gemm(s.args, o).stream_k);
            tt::poison(s.d);
            tk::gemm(s.args, o);
            TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
            const auto first = tt::bytes_of(s.d);
            tt::poison(s.ref);
            EXPECT_LT(error_vs_cublas(s), tolerance(p.out)) << name(p, t) << " stream-K, max_ctas " << ctas;
            tt::poison(s.d);
            tk::gemm(s.args, o);
            TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
            EXPECT_TRUE(tt::bytes_of(s.d) == first) << name(p, t) << " stream-K, max_ctas " << ctas;
          }
      }
  Buffers s = make(Problem{256, 384, 512});
  tk::GemmOptions o;
  o.stream_k = true;
  for (auto bad :
       {+[](tk::GemmOptions& x) { x.tile = tk::GemmTile::T256x128; }, +[](tk::GemmOptions& x) { x.ping_pong = true; },
        +[](tk::GemmOptions& x) { x.cluster_m = 2; }, +[](tk::GemmOptions& x) { x.k_splits = 2; }}) {
    tk::GemmOptions b = o;
    bad(b);
    EXPECT_THROW(tk::gemm(s.args, b), tessera::Error);
  }
  s.args.out = DType::f32;
  EXPECT_THROW(tk::gemm(s.args, o), tessera::Error);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
}

// Swapped operands (plain gemm() only, B [N,K]): D^T = B A^T on the 128x32,
// 128x64 and 128x96 tiles, whole K and split, M = 1, M above one tile, M,
// N and K tails (N not a multiple of 8 or of 128, K not of 64), padded
// rows (the transposed store's row stride), f32 output through the split
// path; outputs poisoned first. What the swapped kernels do not compile is
// rejected before launch.
TEST(GemmGpu, SwapAbMatchesCublas) {
  TESSERA_REQUIRE_GPUS(1);
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 520, 1032},  {22, 4100, 5040}, {45, 1000, 344},
                                                      {96, 2000, 136}, {130, 200, 1000}, {288, 4095, 100}};
  for (const auto& sh : shapes)
    for (DType in : {DType::bf16, DType::f16})
      for (int64_t pad : {0, 8}) {
        const Problem p{sh[0], sh[1], sh[2], in, in, tk::BLayout::NK, pad};
        Buffers s = make(p);
        for (tk::GemmTile t : {tk::GemmTile::T128x32, tk::GemmTile::T128x64, tk::GemmTile::T128x96})
          for (int splits : {1, 3}) {
            tk::GemmOptions o;
            o.tile = t;
            o.swap_ab = true;
            o.k_splits = splits;
            const tk::GemmPlan plan = tk::plan_gemm(s.args, o);
            EXPECT_TRUE(plan.swap_ab && plan.tile == t);
            tt::poison(s.d);
            tk::gemm(s.args, o);
            TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
            tt::poison(s.ref);
            EXPECT_LT(error_vs_cublas(s), tolerance(p.out)) << name(p, t) << " swap_ab, k_splits " << splits;
          }
      }
  {
    const Problem p{45, 1000, 344, DType::bf16, DType::f32};
    Buffers s = make(p);
    tk::GemmOptions o;
    o.swap_ab = true;
    o.k_splits = 2;
    EXPECT_EQ(tk::plan_gemm(s.args, o).tile, tk::GemmTile::T128x64);  // Auto: the narrowest that holds M
    tt::poison(s.d);
    tk::gemm(s.args, o);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    tt::poison(s.ref);
    EXPECT_LT(error_vs_cublas(s), tolerance(p.out)) << name(p, tk::GemmTile::T128x64) << " swap_ab f32";
    o.k_splits = 1;  // whole K stores the input type only
    EXPECT_THROW(tk::gemm(s.args, o), tessera::Error);
  }
  Buffers s = make(Problem{64, 384, 512});
  tk::GemmOptions o;
  o.swap_ab = true;
  for (auto bad :
       {+[](tk::GemmOptions& x) { x.tile = tk::GemmTile::T128x128; }, +[](tk::GemmOptions& x) { x.ping_pong = true; },
        +[](tk::GemmOptions& x) { x.cluster_m = 2; }, +[](tk::GemmOptions& x) { x.stream_k = true; }}) {
    tk::GemmOptions b = o;
    bad(b);
    EXPECT_THROW(tk::gemm(s.args, b), tessera::Error);
  }
  tk::GemmOptions unswapped;
  unswapped.tile = tk::GemmTile::T128x32;  // a swapped tile without swap_ab
  EXPECT_THROW(tk::gemm(s.args, unswapped), tessera::Error);
  Buffers kn = make(Problem{64, 384, 512, DType::bf16, DType::bf16, tk::BLayout::KN});
  EXPECT_THROW(tk::gemm(kn.args, o), tessera::Error);
  // The model's plan cache keeps the layouts apart: the same shape with B
  // [N,K] (where a swapped tile may win) and then [K,N] (no swapped tiles).
  for (const auto& sh : shapes)
    for (auto layout : {tk::BLayout::NK, tk::BLayout::KN}) {
      const Problem p{sh[0], sh[1], sh[2], DType::bf16, DType::bf16, layout};
      Buffers b = make(p);
      const tk::GemmPlan plan = tk::plan_gemm(b.args, tk::GemmOptions{});
      if (layout == tk::BLayout::KN) EXPECT_FALSE(plan.swap_ab) << name(p, plan.tile);
      tt::poison(b.d);
      tk::gemm(b.args);
      TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
      tt::poison(b.ref);
      EXPECT_LT(error_vs_cublas(b), tolerance(p.out)) << name(p, plan.tile) << " plan " << tk::plan_name(plan);
    }
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
}

// Split-K is deterministic: the same plan gives the same bytes twice, and the
// policy entry points refuse it.
TEST(GemmGpu, SplitKIsDeterministicAndPlainOnly) {
  TESSERA_REQUIRE_GPUS(1);
  const Problem p{40, 3000, 9000};
  Buffers s = make(p);
  tk::GemmOptions o;
  o.k_splits = 5;
  tk::gemm(s.args, o);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  const auto want = tt::bytes_of(s.d);
  tt::poison(s.d);
  tk::gemm(s.args, o);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(tt::bytes_of(s.d) == want);
  EXPECT_LT(error_vs_cublas(s), tolerance(p.out));
  o.tile = tk::GemmTile::T128x256;  // split runs 128x128 or 64x256 only
  EXPECT_THROW(tk::gemm(s.args, o), tessera::Error);
  o.tile = tk::GemmTile::Auto;
  o.k_splits = -1;
  EXPECT_THROW(tk::gemm(s.args, o), tessera::Error);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
}

// Programmatic dependent launch: a chain of plain GEMMs queued back to back
// behind a long GEMM, each reading the previous one's output (Y = X·W1ᵀ) or
// overwriting the input the previous one read (X = Y·W2ᵀ), gives the same
// bytes as the chain with the stream synchronized after every GEMM, and
// matches cuBLASLt's chain; for every kind of plan (cooperative, 2-CTA
// cluster, ping-pong, 64x64, 128x192, split-K), with few tiles (SMs left
// idle for the next kernel's early CTAs) and with more tiles than SMs.
TEST(GemmGpu, DependentLaunchChainMatchesSynchronizedChain) {
  TESSERA_REQUIRE_GPUS(1);
  struct Plan {
    const char* what;
    tk::GemmTile tile;
    int cluster, splits;
    bool ping_pong;
  };
  const Plan plans[] = {{"auto", tk::GemmTile::Auto, 0, 0, false},
                        {"128x256 cluster 2", tk::GemmTile::T128x256, 2, 1, false},
                        {"64x256 ping-pong", tk::GemmTile::T64x256, 0, 1, true},
                        {"64x64", tk::GemmTile::T64x64, 0, 1, false},
                        {"128x192", tk::GemmTile::T128x192, 0, 1, false},
                        {"split 3", tk::GemmTile::Auto, 0, 3, false},
                        {"64x64 split 3", tk::GemmTile::T64x64, 0, 3, false}};
  const std::vector<std::array<int64_t, 3>> shapes = {{192, 1024, 776}, {2304, 2048, 520}};
  constexpr int kRounds = 3;
  cudaStream_t st = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const Problem big{4096, 4096, 4096};
  Buffers lead = make(big);
  for (const auto& sh : shapes) {
    const int64_t m = sh[0], n = sh[1], k = sh[2];
    const tt::DevBuf x0 = tt::random_matrix(m, k, k, DType::bf16, rng());
    const tt::DevBuf w1 = tt::random_matrix(n, k, k, DType::bf16, rng());
    const tt::DevBuf w2 = tt::random_matrix(k, n, n, DType::bf16, rng());
    tt::DevBuf x(x0.bytes), y(static_cast<size_t>(m * n) * 2);
    // Y = X·W1ᵀ, then X = Y·W2ᵀ, kRounds times; `gemm` runs one of them.
    const tk::GemmArgs to_y{x.p, w1.p, y.p, m, n, k, k, k, n, DType::bf16, DType::bf16, tk::BLayout::NK};
    const tk::GemmArgs to_x{y.p, w2.p, x.p, m, k, n, n, n, k, DType::bf16, DType::bf16, tk::BLayout::NK};
    auto chain = [&](auto&& gemm, bool sync) {
      TESSERA_CUDA_CHECK(cudaMemcpy(x.p, x0.p, x0.bytes, cudaMemcpyDeviceToDevice));
      tt::poison(y);
      TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
      tk::gemm(lead.args, {}, st);  // keeps the GPU busy while the chain is queued
      for (int r = 0; r < kRounds; ++r)
        for (const tk::GemmArgs* g : {&to_y, &to_x}) {
          gemm(*g);
          if (sync) TESSERA_CUDA_CHECK(cudaStreamSynchronize(st));
        }
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(st));
      return std::make_pair(tt::bytes_of(x), tt::bytes_of(y));
    };
    chain([&](const tk::GemmArgs& g) { tk::cublaslt_gemm(g, st); }, true);
    const auto want_x = tt::download(x.p, m, k, k, DType::bf16), want_y = tt::download(y.p, m, n, n, DType::bf16);
    for (const Plan& pl : plans) {
      tk::GemmOptions o;
      o.tile = pl.tile;
      o.cluster_m = pl.cluster;
      o.k_splits = pl.splits;
      o.ping_pong = pl.ping_pong;
      const std::string what = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " " + pl.what +
                               " plan " + tk::plan_name(tk::plan_gemm(to_y, o));
      const auto ours = [&](const tk::GemmArgs& g) { tk::gemm(g, o, st); };
      const auto synced = chain(ours, true);
      const auto queued = chain(ours, false);
      EXPECT_TRUE(queued.first == synced.first && queued.second == synced.second) << what;
      EXPECT_LT(relative_error(tt::download(x.p, m, k, k, DType::bf16), want_x), 5e-2) << what;
      EXPECT_LT(relative_error(tt::download(y.p, m, n, n, DType::bf16), want_y), 5e-2) << what;
    }
  }
  TESSERA_CUDA_CHECK(cudaStreamDestroy(st));
}

TEST(GemmGpu, BadInputThrowsBeforeLaunch) {
  TESSERA_REQUIRE_GPUS(1);
  const Problem p{256, 256, 128};
  Buffers s = make(p);
  tk::GemmArgs a = s.args;
  a.k = 100;
  a.lda = a.ldb = 0;  // packed 200-byte rows: not 16-byte multiples
  EXPECT_THROW(tk::gemm(a), tessera::Error);
  a.lda = 100;
  a.ldb = 128;
  EXPECT_THROW(tk::gemm(a), tessera::Error);
  a = s.args;
  a.a = static_cast<const char*>(s.args.a) + 2;
  EXPECT_THROW(tk::gemm(a), tessera::Error);
  a = s.args;
  a.ldd = 200;
  EXPECT_THROW(tk::gemm(a), tessera::Error);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
}
