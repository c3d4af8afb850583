// GPU tests of the grouped GEMM: every group against cuBLASLt on its own
// slice (fresh random data, poisoned outputs), uniform and skewed routing,
// empty groups, M_g = 1, K and N tails, both B layouts, every configuration,
// the SwiGLU epilogue, small grids (many tiles per CTA across groups), the
// per-group / per-tile notify and the per-row-chunk wait hooks, device-side
// table errors reported after the call, and bad input rejected before launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gemm_test_util.hpp"
#include "grouped_gemm_policy_kernels.hpp"
#include "support/test_support.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/grouped_gemm.hpp"

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
  std::vector<int> rows;  // M_g
  int64_t n, k;
  tk::BLayout layout = tk::BLayout::NK;
  int64_t slack = 37;  // max_rows = sum + slack (rows past the sum must stay untouched)
};

struct Buffers {
  tt::DevBuf a, b, d, rows, status;
  tk::GroupedGemmArgs args;
  int64_t total = 0;
};

Buffers make(const Problem& p, int64_t d_cols) {
  Buffers s;
  for (int r : p.rows) s.total += std::max(r, 0);
  const int64_t G = static_cast<int64_t>(p.rows.size());
  const int64_t max_rows = s.total + p.slack;
  const bool nk = p.layout == tk::BLayout::NK;
  s.a = tt::random_matrix(std::max<int64_t>(max_rows, 1), p.k, p.k, DType::bf16, rng());
  s.b = tt::random_matrix(G * (nk ? p.n : p.k), nk ? p.k : p.n, nk ? p.k : p.n, DType::bf16, rng());
  s.d = tt::DevBuf(static_cast<size_t>(std::max<int64_t>(max_rows, 1) * d_cols) * 2);
  tt::poison(s.d);
  s.rows = tt::DevBuf(static_cast<size_t>(G) * 4);
  TESSERA_CUDA_CHECK(cudaMemcpy(s.rows.p, p.rows.data(), s.rows.bytes, cudaMemcpyHostToDevice));
  s.status = tt::DevBuf(tk::kGroupedStatusInts * 4);
  TESSERA_CUDA_CHECK(cudaMemset(s.status.p, 0x7F, s.status.bytes));
  auto& a = s.args;
  a.a = s.a.p;
  a.b = s.b.p;
  a.d = s.d.p;
  a.group_rows = s.rows.as<int>();
  a.status = s.status.as<int>();
  a.groups = G;
  a.n = p.n;
  a.k = p.k;
  a.max_rows = max_rows;
  a.b_layout = p.layout;
  return s;
}

/// cuBLASLt per group into a [total, n] f32 reference (host knows the counts).
std::vector<double> cublas_reference(const Buffers& s, const Problem& p) {
  const int64_t n = p.n, k = p.k;
  tt::DevBuf ref(static_cast<size_t>(std::max<int64_t>(s.total, 1) * n) * 4);
  int64_t off = 0;
  const bool nk = p.layout == tk::BLayout::NK;
  for (size_t g = 0; g < p.rows.size(); ++g) {
    if (p.rows[g] <= 0) continue;
    tk::GemmArgs ga;
    ga.a = static_cast<const uint16_t*>(s.a.p) + off * k;
    ga.b = static_cast<const uint16_t*>(s.b.p) + static_cast<int64_t>(g) * n * k;
    ga.d = static_cast<float*>(ref.p) + off * n;
    ga.m = p.rows[g];
    ga.n = n;
    ga.k = k;
    ga.ldb = nk ? k : n;
    ga.out = DType::f32;
    ga.b_layout = p.layout;
    tk::cublaslt_gemm(ga);
    off += p.rows[g];
  }
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  return tt::download(ref.p, s.total, n, n, DType::f32);
}

std::string name(const Problem& p, tk::GroupedTile t, tk::GroupedEpilogueKind e, int ctas) {
  std::string r = "rows {";
  for (int x : p.rows) r += std::to_string(x) + ",";
  return r + "} N " + std::to_string(p.n) + " K " + std::to_string(p.k) +
         (p.layout == tk::BLayout::NK ? " B[G,N,K]" : " B[G,K,N]") + " tile " + tk::grouped_tile_name(t) +
         (e == tk::GroupedEpilogueKind::SwiGLU ? " swiglu" : "") + " max_ctas " + std::to_string(ctas);
}

/// Runs the grouped GEMM and checks every group's rows against cuBLASLt, the
/// rows past the sum untouched (poison), and the status words.
void check(const Problem& p, tk::GroupedTile t, tk::GroupedEpilogueKind e, int max_ctas = 0, int band = -1) {
  const bool swiglu = e == tk::GroupedEpilogueKind::SwiGLU;
  const int64_t cols = swiglu ? p.n / 2 : p.n;
  Buffers s = make(p, cols);
  tk::GroupedGemmOptions o;
  o.tile = t;
  o.epilogue = e;
  o.max_ctas = max_ctas;
  o.raster_band = band;
  tk::grouped_gemm(s.args, o);
  const tk::GroupedGemmStatus st = tk::grouped_gemm_status(s.args.status);
  const std::string what = name(p, t, e, max_ctas) + " band " + std::to_string(band);
  ASSERT_TRUE(st.ok()) << what << ": " << st.message();
  EXPECT_EQ(st.value, s.total) << what;
  const std::vector<double> full = cublas_reference(s, p);
  std::vector<double> want(static_cast<size_t>(s.total * cols));
  for (int64_t r = 0; r < s.total; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      if (swiglu) {
        const double g = full[r * p.n + 2 * j], u = full[r * p.n + 2 * j + 1];
        want[r * cols + j] = g / (1.0 + std::exp(-g)) * u;
      } else {
        want[r * cols + j] = full[r * p.n + j];
      }
    }
  const auto got = tt::download(s.d.p, s.args.max_rows, cols, cols, DType::bf16);
  const std::vector<double> got_rows(got.begin(), got.begin() + s.total * cols);
  if (s.total > 0) EXPECT_LT(relative_error(got_rows, want), 8e-3) << what;
  int64_t written_past = 0;
  for (size_t i = s.total * cols; i < got.size(); ++i) written_past += !std::isnan(got[i]);
  EXPECT_EQ(written_past, 0) << what << ": rows past the groups' sum were written";
}

const tk::GroupedTile kTiles[] = {tk::GroupedTile::Coop128x256, tk::GroupedTile::Coop128x128,
                                  tk::GroupedTile::PingPong128x128, tk::GroupedTile::PingPong64x256};

}  // namespace

TEST(GroupedGemmGpu, UniformAndSkewedRoutingMatchCublasPerGroup) {
  TESSERA_REQUIRE_GPUS(1);
  const std::vector<Problem> problems = {
      {{256, 256, 256, 256}, 512, 512},                     // uniform, whole tiles
      {{0, 1, 777, 0, 130, 64, 1000, 5}, 528, 200},         // skewed, empty groups, M_g = 1, N and K tails
      {{3000, 0, 0, 17, 200}, 384, 1024, tk::BLayout::KN},  // one hot expert
      {{1}, 16, 8},                                         // the smallest problem
  };
  for (const auto& base : problems)
    for (auto layout : {tk::BLayout::NK, tk::BLayout::KN}) {
      Problem p = base;
      p.layout = layout;
      for (auto t : kTiles) check(p, t, tk::GroupedEpilogueKind::Plain);
    }
}

TEST(GroupedGemmGpu, SwiGLUOfInterleavedGateAndUp) {
  TESSERA_REQUIRE_GPUS(1);
  for (auto layout : {tk::BLayout::NK, tk::BLayout::KN})
    for (auto t : kTiles) check({{0, 300, 1, 129, 0, 64}, 528, 136, layout}, t, tk::GroupedEpilogueKind::SwiGLU);
}

// The row gather of A (a_gather): the same tile over the explicitly gathered
// rows gives the same bits, out-of-range indices read zero rows, and rows
// past the groups' sum stay untouched; every configuration, K tails, a
// small grid (tiles across groups) and empty groups.
TEST(GroupedGemmGpu, RowGatherEqualsTheGatheredRowsBitwise) {
  TESSERA_REQUIRE_GPUS(1);
  for (const int64_t k : {200, 1024})
    for (const int ctas : {0, 3}) {
      const Problem p{{0, 300, 1, 129, 0, 64, 517}, 528, k};
      const int64_t cols = p.n / 2, x_rows = 150, div = 3;
      Buffers s = make(p, cols);  // s.a: the explicitly gathered A, filled below
      std::vector<double> xh;
      tt::DevBuf x = tt::random_matrix(x_rows, k, k, DType::bf16, rng(), &xh);
      const auto x_bits = tt::bytes_of(x);
      std::vector<int32_t> index(static_cast<size_t>(s.args.max_rows), 0x7fffffff);  // past the sum: never read
      std::vector<uint8_t> gathered(static_cast<size_t>(s.args.max_rows * k) * 2, 0);
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(x_rows * div - 1));
      for (int64_t i = 0; i < s.total; ++i) {
        index[i] = i % 97 == 5 ? -7 : i % 89 == 3 ? static_cast<int32_t>(x_rows * div + i) : pick(rng());
        if (index[i] >= 0 && index[i] < x_rows * div)
          std::copy_n(x_bits.begin() + (index[i] / div) * k * 2, k * 2, gathered.begin() + i * k * 2);
      }
      TESSERA_CUDA_CHECK(cudaMemcpy(s.a.p, gathered.data(), gathered.size(), cudaMemcpyHostToDevice));
      tt::DevBuf idx(index.size() * 4), d2(s.d.bytes);
      TESSERA_CUDA_CHECK(cudaMemcpy(idx.p, index.data(), idx.bytes, cudaMemcpyHostToDevice));
      for (auto t : kTiles) {
        const std::string what = name(p, t, tk::GroupedEpilogueKind::SwiGLU, ctas) + " gathered";
        tk::GroupedGemmOptions o;
        o.tile = t;
        o.epilogue = tk::GroupedEpilogueKind::SwiGLU;
        o.max_ctas = ctas;
        tt::poison(s.d);
        tk::grouped_gemm(s.args, o);
        tk::GroupedGemmArgs g = s.args;
        g.a = x.p;
        g.a_gather = idx.as<int32_t>();
        g.a_gather_div = div;
        g.a_rows = x_rows;
        g.d = d2.p;
        tt::poison(d2);
        tk::grouped_gemm(g, o);
        const tk::GroupedGemmStatus st = tk::grouped_gemm_status(g.status);
        ASSERT_TRUE(st.ok()) << what << ": " << st.message();
        const auto want = tt::bytes_of(s.d), got = tt::bytes_of(d2);
        const size_t stored = static_cast<size_t>(s.total * cols) * 2;
        size_t differ = 0;
        for (size_t i = 0; i < stored; ++i) differ += want[i] != got[i];
        EXPECT_EQ(differ, 0u) << what << ": bytes differ from the explicitly gathered rows";
        size_t written_past = 0;
        for (size_t i = stored; i < got.size(); ++i) written_past += got[i] != 0xFF;
        EXPECT_EQ(written_past, 0u) << what << ": rows past the groups' sum were written";
      }
    }
}

// Few CTAs: each walks many tiles across group boundaries (and empty groups).
TEST(GroupedGemmGpu, SmallGridsWalkAcrossGroups) {
  TESSERA_REQUIRE_GPUS(1);
  for (int ctas : {1, 3, 7})
    for (auto t : kTiles)
      for (int band : {-1, 0, 3}) {  // auto, row-major, bands of 3 tile rows (a partial last band)
        check({{300, 0, 129, 127, 1, 0, 0, 640}, 1024, 256}, t, tk::GroupedEpilogueKind::Plain, ctas, band);
        check({{300, 0, 129, 127, 1, 0, 0, 640}, 1024, 256, tk::BLayout::KN}, t, tk::GroupedEpilogueKind::SwiGLU, ctas,
              band);
      }
}

TEST(GroupedGemmGpu, AllGroupsEmptyWritesNothing) {
  TESSERA_REQUIRE_GPUS(1);
  for (auto t : kTiles) {
    check({{0, 0, 0}, 256, 64}, t, tk::GroupedEpilogueKind::Plain);
    check({{0, 0}, 256, 64, tk::BLayout::NK, 0}, t, tk::GroupedEpilogueKind::Plain);  // max_rows = 0
  }
}

// What only the device knows (the row counts) is reported after the call,
// with nothing computed; the status words are rewritten by the next call.
TEST(GroupedGemmGpu, DeviceTableErrorsAreReportedNotDropped) {
  TESSERA_REQUIRE_GPUS(1);
  for (auto t : kTiles) {
    {
      Buffers s = make({{100, 200}, 256, 64}, 256);
      s.args.max_rows = 250;  // the routing produced 300 rows
      tk::GroupedGemmOptions o;
      o.tile = t;
      tk::grouped_gemm(s.args, o);
      const auto st = tk::grouped_gemm_status(s.args.status);
      EXPECT_EQ(st.code, 2);
      EXPECT_EQ(st.value, 300);
      try {
        tk::check_grouped_gemm_status(s.args.status);
        ADD_FAILURE() << "no error for 300 rows over a bound of 250";
      } catch (const tessera::Error& e) {
        EXPECT_NE(std::string(e.what()).find("sum to 300"), std::string::npos) << e.what();
      }
      const auto d = tt::download(s.d.p, 250, 256, 256, DType::bf16);
      int64_t written = 0;
      for (double v : d) written += !std::isnan(v);
      EXPECT_EQ(written, 0) << "rows computed although the table was refused";
      // A valid table on the same status words: ok again.
      const int fixed[2] = {100, 150};
      TESSERA_CUDA_CHECK(cudaMemcpy(s.rows.p, fixed, 8, cudaMemcpyHostToDevice));
      tk::grouped_gemm(s.args, o);
      EXPECT_TRUE(tk::grouped_gemm_status(s.args.status).ok());
    }
    {
      Buffers s = make({{100, -3, 5}, 256, 64}, 256);
      tk::GroupedGemmOptions o;
      o.tile = t;
      tk::grouped_gemm(s.args, o);
      const auto st = tk::grouped_gemm_status(s.args.status);
      EXPECT_EQ(st.code, 1);
      EXPECT_EQ(st.group, 1);
      EXPECT_EQ(st.value, -3);
      EXPECT_THROW(tk::check_grouped_gemm_status(s.args.status), tessera::Error);
    }
  }
}

TEST(GroupedGemmGpu, BadInputThrowsBeforeLaunch) {
  TESSERA_REQUIRE_GPUS(1);
  Buffers s = make({{100, 28}, 256, 64}, 256);
  const tk::GroupedGemmArgs good = s.args;
  auto rejects = [&](tk::GroupedGemmArgs a, tk::GroupedGemmOptions o, const char* needle) {
    try {
      tk::grouped_gemm(a, o);
      ADD_FAILURE() << "accepted; expected an error naming " << needle;
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const tk::GroupedGemmOptions plain{};
  tk::GroupedGemmArgs a = good;
  a.a = static_cast<const char*>(good.a) + 2;
  rejects(a, plain, "A = ");
  a = good;
  a.b = static_cast<const char*>(good.b) + 8;
  rejects(a, plain, "B = ");
  a = good;
  a.d = static_cast<char*>(good.d) + 4;
  rejects(a, plain, "D = ");
  a = good;
  a.out = DType::f32;
  rejects(a, plain, "output dtype");
  a = good;
  a.in = DType::f32;
  rejects(a, plain, "input dtype");
  a = good;
  a.groups = tk::kGroupedMaxGroups + 1;
  rejects(a, plain, "groups = 1025");
  a = good;
  a.groups = 0;
  rejects(a, plain, "groups = 0");
  a = good;
  a.max_rows = -1;
  rejects(a, plain, "max_rows = -1");
  a = good;
  a.max_rows = int64_t{1} << 31;
  rejects(a, plain, "max_rows = 2147483648");
  a = good;
  a.n = -5;
  rejects(a, plain, "N = -5");
  a = good;
  a.k = 100;
  rejects(a, plain, "K = 100");
  a = good;
  a.group_rows = nullptr;
  rejects(a, plain, "group_rows is null");
  a = good;
  a.status = nullptr;
  rejects(a, plain, "status is null");
  a = good;
  a.ldd = 200;
  rejects(a, plain, "ldd = 200");
  a = good;
  a.stride_b = 64 * 256 - 8;
  rejects(a, plain, "stride_b");
  a = good;
  a.n = 250;  // odd N / 2: 125 columns, not 16-byte rows
  a.ldd = 0;
  tk::GroupedGemmOptions sw;
  sw.epilogue = tk::GroupedEpilogueKind::SwiGLU;
  rejects(a, sw, "ldd");
  a.n = 255;
  rejects(a, sw, "even");
  tk::GroupedGemmOptions band;
  band.raster_band = -2;
  rejects(good, band, "raster_band = -2");
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
}

// Notify hooks: per expert, flags[g] counts the group's tiles; per tile,
// every schedule position's flag is 1. Both kernels (cooperative, ping-pong).
TEST(GroupedGemmGpu, NotifyCountsEachGroupsTiles) {
  TESSERA_REQUIRE_GPUS(1);
  const Problem p{{300, 0, 129, 1, 0, 700}, 640, 256};
  for (bool pp : {false, true}) {
    const tk::TileShape ts = pp ? tk::TileShape{128, 128} : tk::TileShape{128, 256};
    const int64_t tiles_n = (p.n + ts.bn - 1) / ts.bn;
    int64_t total_tiles = 0;
    std::vector<uint32_t> want_group;
    for (int r : p.rows) {
      want_group.push_back(static_cast<uint32_t>((r + ts.bm - 1) / ts.bm * tiles_n));
      total_tiles += want_group.back();
    }
    for (bool per_group : {true, false}) {
      Buffers s = make(p, p.n);
      const size_t nflags = per_group ? p.rows.size() : static_cast<size_t>(total_tiles) + 8;
      tt::DevBuf flags(nflags * 4);
      TESSERA_CUDA_CHECK(cudaMemset(flags.p, 0, flags.bytes));
      tt::grouped_notify(s.args, pp, flags.as<uint32_t>(), per_group, nullptr);
      TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<uint32_t> f(nflags);
      TESSERA_CUDA_CHECK(cudaMemcpy(f.data(), flags.p, flags.bytes, cudaMemcpyDeviceToHost));
      if (per_group) {
        EXPECT_EQ(f, want_group) << (pp ? "ping-pong" : "cooperative");
      } else {
        for (size_t i = 0; i < nflags; ++i)
          EXPECT_EQ(f[i], i < static_cast<size_t>(total_tiles) ? 1u : 0u) << "tile " << i << (pp ? " ping-pong" : "");
      }
      const auto got = tt::download(s.d.p, s.total, p.n, p.n, DType::bf16);
      EXPECT_LT(relative_error(got, cublas_reference(s, p)), 8e-3);
    }
  }
}

// The plain epilogue stores through shared memory (bulk stores for 64-row
// atoms inside their group, masked copies out of the staging buffer for an
// atom that crosses the group's end); the notify epilogue keeps the register
// loop. Same main loop, same tiles: D must be equal bit for bit, rows past
// the groups' sum untouched by both. Groups end mid-atom, on an atom and on
// a tile; N a multiple of 8 but not of the tile.
TEST(GroupedGemmGpu, PlainStoreThroughSmemEqualsRegisterLoopBitwise) {
  TESSERA_REQUIRE_GPUS(1);
  const Problem p{{300, 0, 129, 1, 64, 128, 0, 700, 65}, 648, 320};
  for (bool pp : {false, true}) {
    Buffers s = make(p, p.n);
    tk::GroupedGemmOptions o;
    o.tile = pp ? tk::GroupedTile::PingPong128x128 : tk::GroupedTile::Coop128x256;
    tk::grouped_gemm(s.args, o);
    tt::DevBuf d2(s.d.bytes);
    tt::poison(d2);
    tk::GroupedGemmArgs a2 = s.args;
    a2.d = d2.p;
    tt::DevBuf flags(p.rows.size() * 4);
    TESSERA_CUDA_CHECK(cudaMemset(flags.p, 0, flags.bytes));
    tt::grouped_notify(a2, pp, flags.as<uint32_t>(), true, nullptr);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> x(s.d.bytes / 2), y(d2.bytes / 2);
    TESSERA_CUDA_CHECK(cudaMemcpy(x.data(), s.d.p, s.d.bytes, cudaMemcpyDeviceToHost));
    TESSERA_CUDA_CHECK(cudaMemcpy(y.data(), d2.p, d2.bytes, cudaMemcpyDeviceToHost));
    int64_t differ = 0;
    for (size_t i = 0; i < x.size(); ++i) differ += x[i] != y[i];
    EXPECT_EQ(differ, 0) << (pp ? "ping-pong" : "cooperative") << ": elements differing from the register loop";
    const auto got = tt::download(s.d.p, s.total, p.n, p.n, DType::bf16);
    EXPECT_LT(relative_error(got, cublas_reference(s, p)), 8e-3);
  }
}

// Wait hook: the GEMM waits per tile for the flags of the stacked A rows it
// reads (one flag per 64 rows, clipped at the group's end), released by a
// kernel on a second stream after a delay.
TEST(GroupedGemmGpu, RowChunkWaitReleasedBySecondStream) {
  TESSERA_REQUIRE_GPUS(1);
  const Problem p{{300, 0, 129, 1, 0, 700}, 512, 256};
  cudaStream_t s1, s2;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  for (bool pp : {false, true}) {
    Buffers s = make(p, p.n);
    const int chunks = static_cast<int>((s.args.max_rows + 63) / 64);
    tt::DevBuf flags(static_cast<size_t>(chunks + 4) * 4);
    TESSERA_CUDA_CHECK(cudaMemset(flags.p, 0, flags.bytes));
    tt::release_after(flags.as<uint32_t>(), chunks, 0, 0, s2);  // loads the helper's module
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    tt::grouped_flag_wait(s.args, pp, flags.as<uint32_t>(), 64, 1, 5'000'000'000ull, s1);
    tt::release_after(flags.as<uint32_t>(), chunks, 1, 2'000'000, s2);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(s1));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(s2));
    const auto got = tt::download(s.d.p, s.total, p.n, p.n, DType::bf16);
    EXPECT_LT(relative_error(got, cublas_reference(s, p)), 8e-3) << (pp ? "ping-pong" : "cooperative");
  }
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}
