// Multi-rank GPU tests of ops::ag_gemm / gemm_rs / mlp: every strategy
// against a host (double) reference built from the same seeded random data
// on every rank; bf16 and f16; aligned and ragged shapes; poisoned outputs;
// many back-to-back calls without resets; bad input rejected before launch.
// Skips unless launched with >= 2 ranks that each see a GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "support/test_support.hpp"
#include "tessera/ops/tp_mlp.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

using namespace tessera;
using namespace tessera::ops;

namespace {

bool skip() { return tessera::testing::launched_world_size() < 2 || tessera::testing::visible_gpus() < 1; }

runtime::ProcessGroup& group() {
  static std::unique_ptr<runtime::ProcessGroup> pg = runtime::ProcessGroup::from_environment();
  return *pg;
}
TpContext& ctx() {
  static std::unique_ptr<TpContext> c = std::make_unique<TpContext>(group());
  return *c;
}

/// Host matrix rounded to the device type (values kept as double).
struct Mat {
  std::int64_t rows = 0, cols = 0;
  std::vector<double> v;
  double& at(std::int64_t r, std::int64_t c) { return v[r * cols + c]; }
  double at(std::int64_t r, std::int64_t c) const { return v[r * cols + c]; }
};

double round_to(double x, DType t) {
  if (t == DType::f16) return __half2float(__float2half(static_cast<float>(x)));
  return __bfloat162float(__float2bfloat16(static_cast<float>(x)));
}

Mat random_mat(std::int64_t rows, std::int64_t cols, std::uint64_t seed, DType t, double scale = 1.0) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(-scale, scale);
  Mat m{rows, cols, std::vector<double>(rows * cols)};
  for (auto& x : m.v) x = round_to(u(g), t);
  return m;
}

/// Device copy (ld = ld elements, rows of `cols`), 16-bit type.
struct Dev {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit Dev(std::size_t b) : bytes(b) { TESSERA_CUDA_CHECK(cudaMalloc(&p, b)); }
  ~Dev() { cudaFree(p); }
  void poison() { TESSERA_CUDA_CHECK(cudaMemset(p, 0xFF, bytes)); }  // NaN in bf16 and f16
};

std::unique_ptr<Dev> upload(const Mat& m, std::int64_t row0, std::int64_t rows, std::int64_t ld, DType t) {
  std::vector<std::uint16_t> h(static_cast<std::size_t>(rows * ld), 0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < m.cols; ++c) {
      const float f = static_cast<float>(m.at(row0 + r, c));
      if (t == DType::f16) {
        __half x = __float2half(f);
        std::memcpy(&h[r * ld + c], &x, 2);
      } else {
        __nv_bfloat16 x = __float2bfloat16(f);
        std::memcpy(&h[r * ld + c], &x, 2);
      }
    }
  auto d = std::make_unique<Dev>(std::max<std::size_t>(h.size() * 2, 16));
  TESSERA_CUDA_CHECK(cudaMemcpy(d->p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  return d;
}

std::vector<double> download(const void* p, std::int64_t rows, std::int64_t cols, std::int64_t ld, DType t) {
  std::vector<std::uint16_t> h(static_cast<std::size_t>(rows * ld));
  TESSERA_CUDA_CHECK(cudaMemcpy(h.data(), p, h.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<double> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::uint16_t b = h[r * ld + c];
      if (t == DType::f16) {
        __half x;
        std::memcpy(&x, &b, 2);
        out[r * cols + c] = __half2float(x);
      } else {
        __nv_bfloat16 x;
        std::memcpy(&x, &b, 2);
        out[r * cols + c] = __bfloat162float(x);
      }
    }
  return out;
}

/// C[rows of a in [r0, r1), n] = A · Bᵀ in double.
std::vector<double> matmul_nt(const Mat& a, std::int64_t r0, std::int64_t r1, const Mat& b) {
  std::vector<double> c(static_cast<std::size_t>((r1 - r0) * b.rows), 0.0);
  for (std::int64_t i = r0; i < r1; ++i)
    for (std::int64_t j = 0; j < b.rows; ++j) {
      double s = 0;
      for (std::int64_t k = 0; k < a.cols; ++k) s += a.at(i, k) * b.at(j, k);
      c[(i - r0) * b.rows + j] = s;
    }
  return c;
}

std::uint64_t shared_seed() {
  std::uint64_t s = std::random_device{}();
  s = (s << 32) ^ std::random_device{}();
  return group().allgather(s)[0];
}

struct Shape {
  std::int64_t m, n, k, ldd_pad;
};
// The second shape is ragged: M not a multiple of R*128, N and K not multiples
// of the tile; its output rows are padded (ldd must stay a multiple of 8). The
// third has shards on tile rows (R = 2, 4, 8: the GEMM+RS owner epilogue runs)
// with N and K off the tile. The fourth has more tiles than SMs (several per
// persistent CTA: the owner epilogue's waits must not deadlock).
const Shape kShapes[] = {{1024, 768, 256, 0}, {1000, 700, 264, 8}, {1024, 700, 264, 8}, {2048, 4352, 64, 0}};

/// The row-parallel operators' data: every rank's A_r [M, K] and B_r [N, K]
/// (from one shared seed, so all ranks hold all of them) and the reference
/// rows [lo, lo + rows) of Σ_r A_r · B_rᵀ in double. Collective (the seed).
struct RowParallelCase {
  std::vector<Mat> as, bs;
  std::vector<double> ref;
};
RowParallelCase row_parallel_case(const Shape& sh, DType t, int world, std::int64_t lo, std::int64_t rows) {
  const std::uint64_t seed = shared_seed();
  RowParallelCase c;
  for (int r = 0; r < world; ++r) {
    c.as.push_back(random_mat(sh.m, sh.k, seed + 2 * r, t));
    c.bs.push_back(random_mat(sh.n, sh.k, seed + 2 * r + 1, t, 0.5));
  }
  c.ref.assign(static_cast<std::size_t>(rows * sh.n), 0.0);
  for (int r = 0; r < world; ++r) {
    const auto p = matmul_nt(c.as[r], lo, lo + rows, c.bs[r]);
    for (std::size_t i = 0; i < c.ref.size(); ++i) c.ref[i] += p[i];
  }
  return c;
}

/// Every RS variant: (strategy, where fused_sm reduces, ring channels).
struct RsVariant {
  Strategy strategy;
  RsReduce reduce;
  int channels = 4;
};
const RsVariant kRsVariants[] = {
    {Strategy::sequential, RsReduce::epilogue},
    {Strategy::decomposition, RsReduce::epilogue},
    {Strategy::fused_sm, RsReduce::kernel},
    {Strategy::fused_sm, RsReduce::epilogue},
    {Strategy::fused_sm, RsReduce::kernel},  // kernel again after epilogue: counters back at zero
    // Copy engine + owner add (tile-row shards only; ragged
    // shapes must be rejected), then fused_sm on the same slabs.
    {Strategy::fused_ce, RsReduce::epilogue},
    {Strategy::fused_sm, RsReduce::epilogue},
    // Ring (any R; R = 2 is the direct push): default, one and 32
    // channels per shard (32: short ragged chunks), then fused_sm
    // again (kRsFree epochs shared across strategies).
    {Strategy::ring, RsReduce::epilogue, 4},
    {Strategy::ring, RsReduce::epilogue, 1},
    {Strategy::ring, RsReduce::epilogue, 32},
    {Strategy::fused_ce, RsReduce::epilogue},
    {Strategy::fused_sm, RsReduce::epilogue}};

/// fused_ce GEMM+RS runs only when every shard boundary is on a tile row.
bool rs_tile_row_shards(std::int64_t m, int world) { return shard_rows(m, world).per_rank % kRsFusedTileRows == 0; }

double op_tolerance(DType t) { return t == DType::bf16 ? 2e-2 : 5e-3; }

/// ag_gemm(g) under strategy st (3 channels) into a poisoned D (and gathered
/// A): D [g.m, n_out] within the dtype's tolerance of ref, and with
/// g.gathered_a the gathered A bitwise a_full.
void expect_ag_gemm_matches(const AgGemmArgs& g, Strategy st, Dev& dd, Dev& dg, std::int64_t n_out,
                            const std::vector<double>& ref, const std::vector<double>& a_full, DType t,
                            const std::string& what) {
  OpOptions o;
  o.strategy = st;
  o.channels = 3;
  dd.poison();
  dg.poison();
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  ops::ag_gemm(ctx(), g, o);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(group().stream()));
  EXPECT_LT(tessera::testing::relative_error(download(dd.p, g.m, n_out, g.ldd, t), ref), op_tolerance(t))
      << strategy_name(st) << what;
  if (g.gathered_a)
    EXPECT_EQ(tessera::testing::relative_error(download(dg.p, g.m, g.k, g.k, t), a_full), 0.0)
        << strategy_name(st) << what;
}

/// gemm_rs(g, o) `calls` times back to back without resets, each into a
/// poisoned D: the first result within the dtype's tolerance of ref, every
/// later one bitwise equal to it (a fixed reduction order). Callers wrap it
/// in ASSERT_NO_FATAL_FAILURE.
void expect_gemm_rs_matches(const GemmRsArgs& g, const OpOptions& o, Dev& dd, int calls, const std::vector<double>& ref,
                            DType t, const std::string& what) {
  std::vector<double> first;
  for (int it = 0; it < calls; ++it) {
    dd.poison();
    ops::gemm_rs(ctx(), g, o);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(group().stream()));
    const auto out = download(dd.p, g.m_local, g.n, g.ldd, t);
    if (it == 0) {
      first = out;
      EXPECT_LT(tessera::testing::relative_error(out, ref), op_tolerance(t)) << what;
    } else {
      ASSERT_EQ(out, first) << what << ": iteration " << it << " differs (non-deterministic)";
    }
  }
}

}  // namespace

class OpsTp : public ::testing::TestWithParam<DType> {};

TEST_P(OpsTp, AgGemmAllStrategiesMatchReference) {
  if (skip()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto& pg = group();
  const DType t = GetParam();
  const int R = pg.world(), rank = pg.rank();
  for (const Shape& sh : kShapes)
    for (bool swiglu : {false, true}) {
      const std::uint64_t seed = shared_seed();
      const Mat b = random_mat(sh.n, sh.k, seed + 1 + rank, t, 0.5);
      const ShardRows s = shard_rows(sh.m, R);
      const std::int64_t m_local = s.rows(sh.m, rank);
      auto db = upload(b, 0, sh.n, sh.k, t);
      const std::int64_t n_out = swiglu ? sh.n / 2 : sh.n;
      const std::int64_t ldd = (n_out + 7) / 8 * 8 + sh.ldd_pad;
      Dev dd(static_cast<std::size_t>(sh.m * ldd * 2)), dg(static_cast<std::size_t>(sh.m * sh.k * 2));
      auto reference = [&](const Mat& a) {
        std::vector<double> ref = matmul_nt(a, 0, sh.m, b);
        if (!swiglu) return ref;
        std::vector<double> act(static_cast<std::size_t>(sh.m * n_out));
        for (std::int64_t i = 0; i < sh.m; ++i)
          for (std::int64_t j = 0; j < n_out; ++j) {
            const double g = ref[i * sh.n + 2 * j], u = ref[i * sh.n + 2 * j + 1];
            act[i * n_out + j] = g / (1 + std::exp(-g)) * u;
          }
        return act;
      };
      // Two A matrices: the runs with gathered_a use the first (and leave it
      // in the workspace's own rows); the runs without it use the second, so
      // a GEMM that read its own rows from the stale workspace instead of A
      // itself (decomposition, fused_ce where the shard starts on a tile row:
      // here M = 1024 and 2048, not 1000) would fail.
      const Mat a = random_mat(sh.m, sh.k, seed, t), a2 = random_mat(sh.m, sh.k, seed + 7919, t);
      auto da = upload(a, s.lo(rank), m_local, sh.k, t), da2 = upload(a2, s.lo(rank), m_local, sh.k, t);
      const std::vector<double> ref_a = reference(a), ref_a2 = reference(a2);
      const std::pair<Strategy, bool> runs[] = {{Strategy::sequential, true},     {Strategy::decomposition, true},
                                                {Strategy::fused_ce, true},       {Strategy::fused_sm, true},
                                                {Strategy::decomposition, false}, {Strategy::fused_ce, false}};
      for (const auto& [st, want_gathered] : runs) {
        const std::vector<double>& ref = want_gathered ? ref_a : ref_a2;
        AgGemmArgs g;
        g.a = want_gathered ? da->p : da2->p;
        g.b = db->p;
        g.d = dd.p;
        g.m = sh.m;
        g.m_local = m_local;
        g.n = sh.n;
        g.k = sh.k;
        g.ldd = ldd;
        g.dtype = t;
        g.swiglu = swiglu;
        g.gathered_a = want_gathered ? dg.p : nullptr;
        expect_ag_gemm_matches(g, st, dd, dg, n_out, ref, a.v, t,
                               " M " + std::to_string(sh.m) + " N " + std::to_string(sh.n) + " K " +
                                   std::to_string(sh.k) + " swiglu " + std::to_string(swiglu) + " gathered_a " +
                                   std::to_string(want_gathered));
      }
    }
}

TEST_P(OpsTp, GemmRsAllStrategiesMatchReference) {
  if (skip()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto& pg = group();
  const DType t = GetParam();
  const int R = pg.world(), rank = pg.rank();
  for (const Shape& sh : kShapes) {
    const ShardRows s = shard_rows(sh.m, R);
    const std::int64_t m_local = s.rows(sh.m, rank), lo = s.lo(rank);
    const RowParallelCase cs = row_parallel_case(sh, t, R, lo, m_local);
    const std::vector<double>& ref = cs.ref;
    auto da = upload(cs.as[rank], 0, sh.m, sh.k, t);
    auto db = upload(cs.bs[rank], 0, sh.n, sh.k, t);
    const std::int64_t ldd = (sh.n + 7) / 8 * 8 + sh.ldd_pad;
    Dev dd(static_cast<std::size_t>(m_local * ldd * 2));
    for (const RsVariant& var : kRsVariants) {
      const Strategy st = var.strategy;
      GemmRsArgs g;
      g.a = da->p;
      g.b = db->p;
      g.d = dd.p;
      g.m = sh.m;
      g.m_local = m_local;
      g.n = sh.n;
      g.k = sh.k;
      g.ldd = ldd;
      g.dtype = t;
      OpOptions o;
      o.strategy = st;
      o.rs_reduce = var.reduce;
      o.channels = var.channels;
      if (st == Strategy::fused_ce && !rs_tile_row_shards(sh.m, R)) {
        try {
          ops::gemm_rs(ctx(), g, o);
          ADD_FAILURE() << "fused_ce accepted M " << sh.m << " at R " << R << " (shards not on tile rows)";
        } catch (const tessera::Error& e) {
          EXPECT_NE(std::string(e.what()).find("fused_ce"), std::string::npos) << e.what();
        }
        continue;
      }
      // Back-to-back without resets; a fixed reduction order gives bitwise
      // equal results run to run (fused / decomposition).
      ASSERT_NO_FATAL_FAILURE(expect_gemm_rs_matches(
          g, o, dd, st == Strategy::sequential ? 1 : 25, ref, t,
          std::string(strategy_name(st)) + " reduce " + std::string(rs_reduce_name(var.reduce)) + " channels " +
              std::to_string(var.channels) + " M " + std::to_string(sh.m) + " N " + std::to_string(sh.n)));
    }
  }
}

/// Bᵀ of a host matrix ([N, K] -> [K, N]).
Mat transposed(const Mat& b) {
  Mat t{b.cols, b.rows, std::vector<double>(b.v.size())};
  for (std::int64_t r = 0; r < b.rows; ++r)
    for (std::int64_t c = 0; c < b.cols; ++c) t.at(c, r) = b.at(r, c);
  return t;
}

// Shapes for B as [K, N] (b_kn): N a multiple of 8 (16-byte rows of B), the
// ragged ones (M, N and K off the tiles) with B's rows padded (ldb > N).
struct KnShape {
  std::int64_t m, n, k, ldb_pad;
};
const KnShape kKnShapes[] = {{1024, 768, 256, 0}, {1000, 704, 264, 8}, {1024, 712, 264, 16}, {2048, 4352, 64, 0}};

// Every AG+GEMM strategy with B given as [K, N] (the backward's dX = dY·W
// with W the nn.Linear weight), against A·B in double; with and without
// gathered_a (the runs without it read a second A: see
// AgGemmAllStrategiesMatchReference).
TEST_P(OpsTp, AgGemmAllStrategiesWithBAsKNMatchReference) {
  if (skip()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto& pg = group();
  const DType t = GetParam();
  const int R = pg.world(), rank = pg.rank();
  for (const KnShape& sh : kKnShapes) {
    const std::uint64_t seed = shared_seed();
    const Mat b = random_mat(sh.n, sh.k, seed + 1 + rank, t, 0.5);  // [N, K]; uploaded as Bᵀ [K, N]
    const std::int64_t ldb = sh.n + sh.ldb_pad;
    auto db = upload(transposed(b), 0, sh.k, ldb, t);
    const ShardRows s = shard_rows(sh.m, R);
    const std::int64_t m_local = s.rows(sh.m, rank);
    const std::int64_t ldd = sh.n;
    Dev dd(static_cast<std::size_t>(sh.m * ldd * 2)), dg(static_cast<std::size_t>(sh.m * sh.k * 2));
    const Mat a = random_mat(sh.m, sh.k, seed, t), a2 = random_mat(sh.m, sh.k, seed + 7919, t);
    auto da = upload(a, s.lo(rank), m_local, sh.k, t), da2 = upload(a2, s.lo(rank), m_local, sh.k, t);
    const std::vector<double> ref_a = matmul_nt(a, 0, sh.m, b), ref_a2 = matmul_nt(a2, 0, sh.m, b);
    const std::pair<Strategy, bool> runs[] = {{Strategy::sequential, true},     {Strategy::decomposition, true},
                                              {Strategy::fused_ce, true},       {Strategy::fused_sm, true},
                                              {Strategy::decomposition, false}, {Strategy::fused_ce, false},
                                              {Strategy::sequential, false}};
    for (const auto& [st, want_gathered] : runs) {
      const std::vector<double>& ref = want_gathered ? ref_a : ref_a2;
      AgGemmArgs g;
      g.a = want_gathered ? da->p : da2->p;
      g.b = db->p;
      g.d = dd.p;
      g.m = sh.m;
      g.m_local = m_local;
      g.n = sh.n;
      g.k = sh.k;
      g.ldb = sh.ldb_pad ? ldb : 0;  // 0: packed [K, N], ldb = N
      g.ldd = ldd;
      g.dtype = t;
      g.b_kn = true;
      g.gathered_a = want_gathered ? dg.p : nullptr;
      expect_ag_gemm_matches(g, st, dd, dg, sh.n, ref, a.v, t,
                             " b_kn M " + std::to_string(sh.m) + " N " + std::to_string(sh.n) + " K " +
                                 std::to_string(sh.k) + " ldb " + std::to_string(ldb) + " gathered_a " +
                                 std::to_string(want_gathered));
    }
  }
}

// Every GEMM+RS variant with B given as [K, N] against Σ_r A_r·B_r in
// double; a few back-to-back calls each, bitwise equal to the first where
// the reduction order is fixed.
TEST_P(OpsTp, GemmRsAllStrategiesWithBAsKNMatchReference) {
  if (skip()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto& pg = group();
  const DType t = GetParam();
  const int R = pg.world(), rank = pg.rank();
  for (const KnShape& sh : kKnShapes) {
    const ShardRows s = shard_rows(sh.m, R);
    const std::int64_t m_local = s.rows(sh.m, rank), lo = s.lo(rank);
    const RowParallelCase cs = row_parallel_case({sh.m, sh.n, sh.k, 0}, t, R, lo, m_local);
    const std::int64_t ldb = sh.n + sh.ldb_pad, ldd = sh.n;
    auto da = upload(cs.as[rank], 0, sh.m, sh.k, t);
    auto db = upload(transposed(cs.bs[rank]), 0, sh.k, ldb, t);
    Dev dd(static_cast<std::size_t>(m_local * ldd * 2));
    for (const RsVariant& var : kRsVariants) {
      const Strategy st = var.strategy;
      if (st == Strategy::fused_ce && !rs_tile_row_shards(sh.m, R)) continue;  // rejected (the NK test checks it)
      GemmRsArgs g;
      g.a = da->p;
      g.b = db->p;
      g.d = dd.p;
      g.m = sh.m;
      g.m_local = m_local;
      g.n = sh.n;
      g.k = sh.k;
      g.ldb = sh.ldb_pad ? ldb : 0;
      g.ldd = ldd;
      g.dtype = t;
      g.b_kn = true;
      OpOptions o;
      o.strategy = st;
      o.rs_reduce = var.reduce;
      o.channels = var.channels;
      ASSERT_NO_FATAL_FAILURE(expect_gemm_rs_matches(
          g, o, dd, st == Strategy::sequential ? 1 : 3, cs.ref, t,
          std::string(strategy_name(st)) + " b_kn reduce " + std::string(rs_reduce_name(var.reduce)) + " channels " +
              std::to_string(var.channels) + " M " + std::to_string(sh.m) + " N " + std::to_string(sh.n) + " K " +
              std::to_string(sh.k) + " ldb " + std::to_string(ldb)));
    }
  }
}

// Ring GEMM+RS at R = WORLD against sequential (cuBLASLt + NCCL) on the
// same data, aligned and ragged: many calls enqueued back to back with no
// host sync between them, interleaved with the other strategies (shared
// kRsFree epochs, shared staging), each into its own poisoned output.
TEST_P(OpsTp, GemmRsRingBackToBackMatchesSequential) {
  if (skip()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto& pg = group();
  const DType t = GetParam();
  const int R = pg.world(), rank = pg.rank();
  for (const Shape& sh : {kShapes[0], kShapes[1]}) {
    const std::uint64_t seed = shared_seed();
    const Mat a = random_mat(sh.m, sh.k, seed + 2 * rank, t);
    const Mat b = random_mat(sh.n, sh.k, seed + 2 * rank + 1, t, 0.5);
    const std::int64_t m_local = shard_rows(sh.m, R).rows(sh.m, rank);
    auto da = upload(a, 0, sh.m, sh.k, t);
    auto db = upload(b, 0, sh.n, sh.k, t);
    const std::int64_t ldd = (sh.n + 7) / 8 * 8 + sh.ldd_pad;
    GemmRsArgs g;
    g.a = da->p;
    g.b = db->p;
    g.m = sh.m;
    g.m_local = m_local;
    g.n = sh.n;
    g.k = sh.k;
    g.ldd = ldd;
    g.dtype = t;
    const Strategy order[] = {Strategy::ring,          Strategy::ring, Strategy::fused_sm,   Strategy::ring,
                              Strategy::decomposition, Strategy::ring, Strategy::sequential, Strategy::ring};
    constexpr int kRounds = 3;
    std::vector<std::unique_ptr<Dev>> outs;
    for (int i = 0; i < kRounds * 8; ++i) {
      outs.push_back(std::make_unique<Dev>(static_cast<std::size_t>(m_local * ldd * 2)));
      outs.back()->poison();
    }
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < kRounds * 8; ++i) {
      g.d = outs[i]->p;
      OpOptions o;
      o.strategy = order[i % 8];
      o.channels = 1 + i % 5;  // the ring's chunking changes call to call
      ops::gemm_rs(ctx(), g, o);
    }
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(pg.stream()));
    const auto seq = download(outs[6]->p, m_local, sh.n, ldd, t);
    for (const auto& v : seq) ASSERT_TRUE(std::isfinite(v));
    const auto ring0 = download(outs[0]->p, m_local, sh.n, ldd, t);
    for (int i = 0; i < kRounds * 8; ++i) {
      const auto out = download(outs[i]->p, m_local, sh.n, ldd, t);
      EXPECT_LT(tessera::testing::relative_error(out, seq), t == DType::bf16 ? 2e-2 : 5e-3)
          << "call " << i << " " << strategy_name(order[i % 8]) << " M " << sh.m << " R " << R;
      // Fixed ring order, whatever the chunking: bitwise equal call to call.
      if (order[i % 8] == Strategy::ring) EXPECT_EQ(out, ring0) << "ring call " << i << " M " << sh.m;
    }
  }
}

// GEMM+RS on the copy engine at its edges: the last shard ragged (M =
// R*128 - 1: shards of 128 rows, the last 127), and tile rows per shard odd
// (M = R*64*33: raster band of 1 tile row, 33*R bands, more than the 64 band
// slots the context starts with, so the band signals grow mid-call).
// Back-to-back calls without host sync, fused_sm in between; every fused_ce
// result bitwise equal to the first, and close to sequential.
TEST_P(OpsTp, GemmRsFusedCeEdgeShapesMatchSequential) {
  if (skip()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto& pg = group();
  const DType t = GetParam();
  const int R = pg.world(), rank = pg.rank();
  const std::int64_t n = 320, k = 128;
  for (const std::int64_t m : {std::int64_t{R} * 128 - 1, std::int64_t{R} * 64 * 33}) {
    ASSERT_TRUE(rs_tile_row_shards(m, R)) << m;
    const std::uint64_t seed = shared_seed();
    const Mat a = random_mat(m, k, seed + 2 * rank, t);
    const Mat b = random_mat(n, k, seed + 2 * rank + 1, t, 0.5);
    const std::int64_t m_local = shard_rows(m, R).rows(m, rank);
    auto da = upload(a, 0, m, k, t);
    auto db = upload(b, 0, n, k, t);
    GemmRsArgs g;
    g.a = da->p;
    g.b = db->p;
    g.m = m;
    g.m_local = m_local;
    g.n = n;
    g.k = k;
    g.dtype = t;
    const Strategy order[] = {Strategy::sequential, Strategy::fused_ce, Strategy::fused_ce,
                              Strategy::fused_sm,   Strategy::fused_ce, Strategy::fused_ce};
    std::vector<std::unique_ptr<Dev>> outs;
    for (std::size_t i = 0; i < std::size(order); ++i) {
      outs.push_back(std::make_unique<Dev>(static_cast<std::size_t>(std::max<std::int64_t>(m_local, 1) * n * 2)));
      outs.back()->poison();
    }
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    for (std::size_t i = 0; i < std::size(order); ++i) {
      g.d = outs[i]->p;
      OpOptions o;
      o.strategy = order[i];
      ops::gemm_rs(ctx(), g, o);
    }
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(pg.stream()));
    const auto seq = download(outs[0]->p, m_local, n, n, t);
    for (const auto& v : seq) ASSERT_TRUE(std::isfinite(v));
    const auto ce0 = download(outs[1]->p, m_local, n, n, t);
    for (std::size_t i = 1; i < std::size(order); ++i) {
      const auto out = download(outs[i]->p, m_local, n, n, t);
      EXPECT_LT(tessera::testing::relative_error(out, seq), t == DType::bf16 ? 2e-2 : 5e-3)
          << strategy_name(order[i]) << " call " << i << " M " << m << " R " << R;
      if (order[i] == Strategy::fused_ce) EXPECT_EQ(out, ce0) << "fused_ce call " << i << " M " << m;
    }
  }
}

// OpOptions::diag_kernel_only (bench mlp's cost breakdown) replays the last
// fused_ce epoch without communication. It must refuse to run before a
// normal fused_ce call (its waits would never be released), and the calls
// after it must be exactly as correct as before: the GEMM+RS kernel still
// counts its remote bands, so the host's running totals must follow.
TEST_P(OpsTp, FusedCeKernelOnlyLeavesLaterCallsCorrect) {
  if (skip()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto& pg = group();
  const DType t = GetParam();
  const int R = pg.world(), rank = pg.rank();
  TpContext fresh(pg);  // no epoch stored yet
  const std::int64_t m = std::int64_t{R} * 64 * 4, n = 320, k = 128;
  ASSERT_TRUE(rs_tile_row_shards(m, R));
  const std::uint64_t seed = shared_seed();
  const std::int64_t m_local = shard_rows(m, R).rows(m, rank);
  const Mat a = random_mat(m, k, seed + 2 * rank, t);
  const Mat b = random_mat(n, k, seed + 2 * rank + 1, t, 0.5);
  auto da = upload(a, 0, m, k, t);
  auto db = upload(b, 0, n, k, t);
  auto da_shard = upload(a, shard_rows(m, R).lo(rank), m_local, k, t);
  // GEMM+RS: A is this rank's [M, K] partial input; AG+GEMM: its shard of it.
  GemmRsArgs rs{.a = da->p, .b = db->p, .m = m, .m_local = m_local, .n = n, .k = k, .dtype = t};
  AgGemmArgs ag{.a = da_shard->p, .b = db->p, .m = m, .m_local = m_local, .n = n, .k = k, .dtype = t};
  Dev rs_out[3] = {Dev(static_cast<std::size_t>(m_local * n * 2)), Dev(static_cast<std::size_t>(m_local * n * 2)),
                   Dev(static_cast<std::size_t>(m_local * n * 2))};
  Dev ag_out[3] = {Dev(static_cast<std::size_t>(m * n * 2)), Dev(static_cast<std::size_t>(m * n * 2)),
                   Dev(static_cast<std::size_t>(m * n * 2))};
  for (auto& d : rs_out) d.poison();
  for (auto& d : ag_out) d.poison();
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  OpOptions seq, ce, only;
  seq.strategy = Strategy::sequential;
  ce.strategy = only.strategy = Strategy::fused_ce;
  only.diag_kernel_only = true;
  rs.d = rs_out[2].p;
  ag.d = ag_out[2].p;
  EXPECT_THROW(ops::gemm_rs(fresh, rs, only), Error);
  EXPECT_THROW(ops::ag_gemm(fresh, ag, only), Error);
  OpOptions only_sm = only;
  only_sm.strategy = Strategy::fused_sm;
  EXPECT_THROW(ops::gemm_rs(fresh, rs, only_sm), Error);
  // sequential, fused_ce, kernel only twice, fused_ce: the last must equal
  // the first fused_ce bit for bit (same inputs, same summation order).
  rs.d = rs_out[0].p;
  ops::gemm_rs(fresh, rs, seq);
  ag.d = ag_out[0].p;
  ops::ag_gemm(fresh, ag, seq);
  rs.d = rs_out[1].p;
  ops::gemm_rs(fresh, rs, ce);
  ag.d = ag_out[1].p;
  ops::ag_gemm(fresh, ag, ce);
  rs.d = rs_out[2].p;
  ag.d = ag_out[2].p;
  for (int i = 0; i < 2; ++i) {
    ops::gemm_rs(fresh, rs, only);
    ops::ag_gemm(fresh, ag, only);
  }
  // Every diag_skip bit, alone and together (bench mlp's split rows): the
  // calls after them must stay bit-exact too (kDiagSkipNotify leaves the
  // band counters short, which the host's running totals must follow).
  for (unsigned bits : {unsigned{kDiagSkipOwnerAdd}, unsigned{kDiagSkipBandWait}, unsigned{kDiagSkipNotify},
                        unsigned{kDiagSkipOwnerAdd | kDiagSkipBandWait | kDiagSkipNotify}}) {
    OpOptions skip = only;
    skip.diag_skip = bits;
    ops::gemm_rs(fresh, rs, skip);
  }
  OpOptions skip_without_kernel_only = ce;
  skip_without_kernel_only.diag_skip = kDiagSkipBandWait;
  EXPECT_THROW(ops::gemm_rs(fresh, rs, skip_without_kernel_only), Error);
  OpOptions unknown_bits = only;
  unknown_bits.diag_skip = 1u << 7;
  EXPECT_THROW(ops::gemm_rs(fresh, rs, unknown_bits), Error);
  rs_out[2].poison();
  ag_out[2].poison();
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  pg.barrier();
  ops::gemm_rs(fresh, rs, ce);
  ops::ag_gemm(fresh, ag, ce);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(pg.stream()));
  const double tol = t == DType::bf16 ? 2e-2 : 5e-3;
  const auto rs_seq = download(rs_out[0].p, m_local, n, n, t), rs_ce = download(rs_out[1].p, m_local, n, n, t);
  EXPECT_LT(tessera::testing::relative_error(rs_ce, rs_seq), tol);
  EXPECT_EQ(download(rs_out[2].p, m_local, n, n, t), rs_ce) << "gemm_rs fused_ce after kernel-only calls";
  const auto ag_seq = download(ag_out[0].p, m, n, n, t), ag_ce = download(ag_out[1].p, m, n, n, t);
  EXPECT_LT(tessera::testing::relative_error(ag_ce, ag_seq), tol);
  EXPECT_EQ(download(ag_out[2].p, m, n, n, t), ag_ce) << "ag_gemm fused_ce after kernel-only calls";
}

TEST_P(OpsTp, MlpBackToBackMatchesSequential) {
  if (skip()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto& pg = group();
  const DType t = GetParam();
  const int R = pg.world(), rank = pg.rank();
  const std::int64_t h = 512, il = 384;
  // M = 1000: ragged shards (the RS owner epilogue falls back to the kernel);
  // M = 1024: shards on tile rows for R = 2, 4, 8 (the owner epilogue runs).
  for (const std::int64_t m : {std::int64_t{1000}, std::int64_t{1024}})
    for (const RsReduce red : {RsReduce::epilogue, RsReduce::kernel}) {
      const std::uint64_t seed = shared_seed();
      const Mat x = random_mat(m, h, seed, t);
      const Mat wgu = random_mat(2 * il, h, seed + 10 + rank, t, 0.1);
      const Mat wd = random_mat(h, il, seed + 100 + rank, t, 0.1);
      const ShardRows s = shard_rows(m, R);
      const std::int64_t m_local = s.rows(m, rank);
      auto dx = upload(x, s.lo(rank), m_local, h, t);
      auto dgu = upload(wgu, 0, 2 * il, h, t);
      auto dwd = upload(wd, 0, h, il, t);
      Dev out(static_cast<std::size_t>(m_local * h * 2));
      MlpArgs a{dx->p, dgu->p, dwd->p, out.p, m, m_local, h, il, t};
      OpOptions seq;
      seq.strategy = Strategy::sequential;
      out.poison();
      ops::mlp(ctx(), a, seq, seq);
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(pg.stream()));
      const auto ref = download(out.p, m_local, h, h, t);
      for (const auto& v : ref) ASSERT_TRUE(std::isfinite(v));
      // Automatic on both halves: each half tuned alone, then the layer
      // check (the whole layer against both halves sequential).
      {
        OpOptions autom;
        autom.rs_reduce = red;
        for (int it = 0; it < 3; ++it) {
          out.poison();
          ops::mlp(ctx(), a, OpOptions{}, autom);
        }
        TESSERA_CUDA_CHECK(cudaStreamSynchronize(pg.stream()));
        EXPECT_LT(tessera::testing::relative_error(download(out.p, m_local, h, h, t), ref),
                  t == DType::bf16 ? 3e-2 : 1e-2)
            << "automatic, M " << m << " reduce " << rs_reduce_name(red);
        // The layer's resolve names what it runs: those strategies, forced,
        // give the same result.
        const auto [s_ag, s_rs] = ctx().resolve(a, OpOptions{}, autom);
        ASSERT_NE(s_ag, Strategy::automatic);
        ASSERT_NE(s_rs, Strategy::automatic);
        OpOptions fa, fr = autom;
        fa.strategy = s_ag;
        fr.strategy = s_rs;
        out.poison();
        ops::mlp(ctx(), a, fa, fr);
        TESSERA_CUDA_CHECK(cudaStreamSynchronize(pg.stream()));
        EXPECT_LT(tessera::testing::relative_error(download(out.p, m_local, h, h, t), ref),
                  t == DType::bf16 ? 3e-2 : 1e-2)
            << "the layer's resolved " << strategy_name(s_ag) << " + " << strategy_name(s_rs);
      }
      OpOptions ag, rs;
      ag.strategy = Strategy::fused_ce;
      rs.strategy = Strategy::fused_sm;
      rs.rs_reduce = red;
      for (int it = 0; it < 30; ++it) {
        out.poison();
        ops::mlp(ctx(), a, ag, rs);
      }
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(pg.stream()));
      EXPECT_LT(tessera::testing::relative_error(download(out.p, m_local, h, h, t), ref),
                t == DType::bf16 ? 3e-2 : 1e-2)
          << "M " << m << " reduce " << rs_reduce_name(red);
      // GEMM+RS on the copy engine where the shards fall on tile rows (30 calls,
      // after the fused_sm ones, no reset).
      if (rs_tile_row_shards(m, R)) {
        OpOptions ce_rs;
        ce_rs.strategy = Strategy::fused_ce;
        for (int it = 0; it < 30; ++it) {
          out.poison();
          ops::mlp(ctx(), a, ag, ce_rs);
        }
        TESSERA_CUDA_CHECK(cudaStreamSynchronize(pg.stream()));
        EXPECT_LT(tessera::testing::relative_error(download(out.p, m_local, h, h, t), ref),
                  t == DType::bf16 ? 3e-2 : 1e-2)
            << "M " << m << " rs fused_ce";
      }
      // The same layer with the ring reduce-scatter (after the fused calls above,
      // no reset in between).
      OpOptions ring;
      ring.strategy = Strategy::ring;
      for (int it = 0; it < 10; ++it) {
        out.poison();
        ops::mlp(ctx(), a, ag, ring);
      }
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(pg.stream()));
      EXPECT_LT(tessera::testing::relative_error(download(out.p, m_local, h, h, t), ref),
                t == DType::bf16 ? 3e-2 : 1e-2)
          << "M " << m << " ring";
    }
}

/// FNV-1a of a buffer's bytes (the cross-rank equality check).
std::uint64_t fnv1a(const void* dev, std::size_t bytes) {
  std::vector<unsigned char> h(bytes);
  TESSERA_CUDA_CHECK(cudaMemcpy(h.data(), dev, bytes, cudaMemcpyDeviceToHost));
  std::uint64_t x = 1469598103934665603ull;
  for (unsigned char c : h) x = (x ^ c) * 1099511628211ull;
  return x;
}

// GEMM+AllReduce: every strategy against the host double reference of the
// full sum, on every shape (fused_ce rejected where the shards are off the
// tile rows); the padding columns of D stay untouched; every rank ends with
// bitwise the same D; fused_ce is deterministic over back-to-back calls,
// including calls enqueued with no host sync, interleaved with gemm_rs
// fused_ce calls that share its epochs, band flags and staging.
TEST_P(OpsTp, GemmArMatchesReferenceOnEveryRank) {
  if (skip()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto& pg = group();
  const DType t = GetParam();
  const int R = pg.world(), rank = pg.rank();
  for (const Shape& sh : kShapes) {
    const RowParallelCase cs = row_parallel_case(sh, t, R, 0, sh.m);
    const std::vector<double>& ref = cs.ref;
    auto da = upload(cs.as[rank], 0, sh.m, sh.k, t);
    auto db = upload(cs.bs[rank], 0, sh.n, sh.k, t);
    const std::int64_t ldd = (sh.n + 7) / 8 * 8 + sh.ldd_pad;
    const std::size_t d_bytes = static_cast<std::size_t>(sh.m * ldd * 2);
    Dev d0(d_bytes), d1(d_bytes), d2(d_bytes);
    Dev* outs[3] = {&d0, &d1, &d2};
    GemmArArgs g;
    g.a = da->p;
    g.b = db->p;
    g.d = d0.p;
    g.m = sh.m;
    g.n = sh.n;
    g.k = sh.k;
    g.ldd = ldd;
    g.dtype = t;
    // A GEMM+RS of the same operands into its own buffer (shares the epochs).
    const ShardRows s = shard_rows(sh.m, R);
    Dev drs(static_cast<std::size_t>(s.rows(sh.m, rank) * ldd * 2));
    GemmRsArgs rs{da->p, db->p, drs.p, sh.m, s.rows(sh.m, rank), sh.n, sh.k, 0, 0, ldd, t};
    const bool ce_ok = rs_tile_row_shards(sh.m, R);
    // The padding columns of D must keep the poison (the copies are 2D).
    auto padding_untouched = [&](const Dev& d) {
      if (ldd == sh.n) return true;
      std::vector<std::uint16_t> h(static_cast<std::size_t>(sh.m * ldd));
      TESSERA_CUDA_CHECK(cudaMemcpy(h.data(), d.p, h.size() * 2, cudaMemcpyDeviceToHost));
      for (std::int64_t r = 0; r < sh.m; ++r)
        for (std::int64_t c = sh.n; c < ldd; ++c)
          if (h[r * ldd + c] != 0xFFFF) return false;
      return true;
    };
    for (Strategy st : {Strategy::sequential, Strategy::fused_ce, Strategy::automatic}) {
      OpOptions o;
      o.strategy = st;
      o.use_cache = false;
      if (st == Strategy::fused_ce && !ce_ok) {
        try {
          ops::gemm_ar(ctx(), g, o);
          ADD_FAILURE() << "gemm_ar fused_ce accepted M " << sh.m << " at R " << R << " (shards not on tile rows)";
        } catch (const tessera::Error& e) {
          EXPECT_NE(std::string(e.what()).find("fused_ce"), std::string::npos) << e.what();
        }
        continue;
      }
      d0.poison();
      ops::gemm_ar(ctx(), g, o);
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(pg.stream()));
      const auto first = download(d0.p, sh.m, sh.n, ldd, t);
      EXPECT_LT(tessera::testing::relative_error(first, ref), t == DType::bf16 ? 2e-2 : 5e-3)
          << "gemm_ar " << strategy_name(st) << " M " << sh.m << " N " << sh.n << " K " << sh.k;
      EXPECT_TRUE(padding_untouched(d0)) << "gemm_ar " << strategy_name(st) << " wrote D's padding columns";
      const std::uint64_t h = fnv1a(d0.p, d_bytes);
      const auto all = pg.allgather(h);
      for (int r = 0; r < R; ++r)
        EXPECT_EQ(all[r], h) << "gemm_ar " << strategy_name(st) << ": rank " << r << "'s D differs from rank " << rank
                             << "'s";
      if (st != Strategy::fused_ce) continue;
      // Back to back, no host sync: 6 AR calls into 3 rotating outputs, a
      // gemm_rs fused_ce between them; then every output equals the first.
      for (Dev* d : outs) d->poison();
      for (int it = 0; it < 6; ++it) {
        GemmArArgs gi = g;
        gi.d = outs[it % 3]->p;
        ops::gemm_ar(ctx(), gi, o);
        ops::gemm_rs(ctx(), rs, o);
      }
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(pg.stream()));
      for (int i = 0; i < 3; ++i)
        ASSERT_EQ(download(outs[i]->p, sh.m, sh.n, ldd, t), first)
            << "gemm_ar fused_ce back-to-back output " << i << " differs (non-deterministic or raced)";
    }
  }
}

// The overlapped strategies inside CUDA graphs. Four graphs, each an MLP
// layer and a GEMM+AR: graph 0 with AG+GEMM fused_ce, GEMM+RS fused_ce
// (fused_sm where the shards are off the tile rows) and GEMM+AR fused_ce
// (sequential there); graph 1 with AG+GEMM fused_sm, the ring GEMM+RS and
// GEMM+AR sequential; graph 2 with AG+GEMM decomposition and GEMM+RS fused_sm
// (reduce kernel); graph 3 with GEMM+RS decomposition. Captured in global mode (as torch.cuda.graph does),
// then replayed alternately on rotating inputs with eager calls of the same
// strategies in between: every replay's outputs bitwise equal the eager
// call's on the same input (same kernels, same order of additions). Own
// context: a captured context resets its flags on every later eager call.
TEST_P(OpsTp, CapturedOverlapReplaysEqualEager) {
  if (skip()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto& pg = group();
  const DType t = GetParam();
  const int R = pg.world(), rank = pg.rank();
  TpContext tc(pg);
  const std::int64_t m = 1024, h = 512, il = 384, ar_m = 256;
  const ShardRows s = shard_rows(m, R);
  const std::int64_t m_local = s.rows(m, rank);
  const std::size_t x_bytes = static_cast<std::size_t>(m_local * h * 2), ar_a_bytes = ar_m * il * 2,
                    ar_d_bytes = ar_m * h * 2;
  const std::uint64_t seed = shared_seed();
  constexpr int kInputs = 3;
  std::vector<std::unique_ptr<Dev>> xs, ar_as;
  for (int i = 0; i < kInputs; ++i) {
    xs.push_back(upload(random_mat(m, h, seed + i, t), s.lo(rank), m_local, h, t));
    ar_as.push_back(upload(random_mat(ar_m, il, seed + 20 + 4 * i + rank, t), 0, ar_m, il, t));
  }
  auto dgu = upload(random_mat(2 * il, h, seed + 10 + rank, t, 0.1), 0, 2 * il, h, t);
  auto dwd = upload(random_mat(h, il, seed + 100 + rank, t, 0.1), 0, h, il, t);
  auto dar_b = upload(random_mat(h, il, seed + 200 + rank, t, 0.1), 0, h, il, t);
  Dev x(x_bytes), ar_a(ar_a_bytes);  // the graphs' inputs, refilled before each run
  constexpr int kGraphs = 4;
  std::vector<std::unique_ptr<Dev>> out_bufs, ar_bufs;
  Dev* outs[kGraphs];
  Dev* ar_ds[kGraphs];
  for (int g = 0; g < kGraphs; ++g) {
    out_bufs.push_back(std::make_unique<Dev>(x_bytes));
    ar_bufs.push_back(std::make_unique<Dev>(ar_d_bytes));
    outs[g] = out_bufs.back().get();
    ar_ds[g] = ar_bufs.back().get();
  }
  const bool tile_rows = rs_tile_row_shards(m, R), ar_tile_rows = rs_tile_row_shards(ar_m, R);
  struct Config {
    OpOptions ag, rs, ar;
  } cfg[kGraphs];
  cfg[0].ag.strategy = Strategy::fused_ce;
  cfg[0].rs.strategy = tile_rows ? Strategy::fused_ce : Strategy::fused_sm;
  cfg[0].ar.strategy = ar_tile_rows ? Strategy::fused_ce : Strategy::sequential;
  cfg[1].ag.strategy = Strategy::fused_sm;
  cfg[1].rs.strategy = Strategy::ring;
  cfg[1].ar.strategy = Strategy::sequential;
  cfg[2].ag.strategy = Strategy::decomposition;
  cfg[2].rs.strategy = Strategy::fused_sm;
  cfg[2].rs.rs_reduce = RsReduce::kernel;
  cfg[2].ar.strategy = Strategy::sequential;
  cfg[3].ag.strategy = Strategy::sequential;
  cfg[3].rs.strategy = Strategy::decomposition;
  cfg[3].ar.strategy = Strategy::sequential;
  auto enqueue = [&](int g) {
    ops::mlp(tc, MlpArgs{x.p, dgu->p, dwd->p, outs[g]->p, m, m_local, h, il, t}, cfg[g].ag, cfg[g].rs);
    GemmArArgs ar;
    ar.a = ar_a.p;
    ar.b = dar_b->p;
    ar.d = ar_ds[g]->p;
    ar.m = ar_m;
    ar.n = h;
    ar.k = il;
    ar.dtype = t;
    ops::gemm_ar(tc, ar, cfg[g].ar);
  };
  auto load_inputs = [&](int i) {
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(x.p, xs[i]->p, x_bytes, cudaMemcpyDeviceToDevice, pg.stream()));
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(ar_a.p, ar_as[i]->p, ar_a_bytes, cudaMemcpyDeviceToDevice, pg.stream()));
  };
  auto results = [&](int g, const char* what) {
    pg.synchronize(pg.stream(), what);
    auto y = download(outs[g]->p, m_local, h, h, t);
    auto z = download(ar_ds[g]->p, ar_m, h, h, t);
    y.insert(y.end(), z.begin(), z.end());
    return y;
  };
  // Eager references (the workspaces grow here, before any capture).
  std::vector<double> ref[kGraphs][kInputs];
  for (int g = 0; g < kGraphs; ++g)
    for (int i = 0; i < kInputs; ++i) {
      load_inputs(i);
      outs[g]->poison();
      ar_ds[g]->poison();
      enqueue(g);
      ref[g][i] = results(g, "captured-overlap test: eager reference");
      for (const double v : ref[g][i]) ASSERT_TRUE(std::isfinite(v)) << "config " << g << " input " << i;
    }
  cudaGraphExec_t exec[kGraphs] = {};
  for (int g = 0; g < kGraphs; ++g) {
    cudaGraph_t graph = nullptr;
    TESSERA_CUDA_CHECK(cudaStreamBeginCapture(pg.stream(), cudaStreamCaptureModeGlobal));
    try {
      enqueue(g);
    } catch (const std::exception& e) {
      (void)cudaStreamEndCapture(pg.stream(), &graph);
      FAIL() << "config " << g << " refused under capture: " << e.what();
    }
    TESSERA_CUDA_CHECK(cudaStreamEndCapture(pg.stream(), &graph));
    TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec[g], graph, 0));
    TESSERA_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  for (int r = 0; r < 48; ++r) {
    const int g = r % kGraphs, i = (r / kGraphs) % kInputs;
    load_inputs(i);
    outs[g]->poison();
    ar_ds[g]->poison();
    TESSERA_CUDA_CHECK(cudaGraphLaunch(exec[g], pg.stream()));
    ASSERT_EQ(results(g, "captured-overlap test: replay"), ref[g][i])
        << "replay " << r << " of graph " << g << " (input " << i << ") differs from the eager call";
    if (r % 5 == 4) {  // an eager call between replays: it resets the flags the replays left
      const int j = (i + 1) % kInputs;
      load_inputs(j);
      outs[g]->poison();
      ar_ds[g]->poison();
      enqueue(g);
      ASSERT_EQ(results(g, "captured-overlap test: eager after replays"), ref[g][j])
          << "eager call after replay " << r << " (config " << g << ", input " << j << ") differs";
    }
  }
  for (cudaGraphExec_t e : exec) TESSERA_CUDA_CHECK(cudaGraphExecDestroy(e));
}

INSTANTIATE_TEST_SUITE_P(Types, OpsTp, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

// automatic without tune_on_miss: a shape never measured takes the nearest
// measured shape's choice (no measurement in the call), sequential when none
// is near; a call that may tune still measures a shape that was only guessed.
TEST(OpsTpTuner, UntunedShapeReusesTheNearestMeasuredChoice) {
  if (skip()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto& pg = group();
  const int R = pg.world(), rank = pg.rank();
  const std::int64_t n = 1024, k = 512, m_max = 16384;
  const Mat b = random_mat(n, k, shared_seed() + 1, DType::bf16, 0.5);
  const Mat a = random_mat(m_max, k, shared_seed() + 2 + rank, DType::bf16, 0.5);
  auto db = upload(b, 0, n, k, DType::bf16);
  auto da = upload(a, 0, m_max, k, DType::bf16);
  Dev dd(static_cast<std::size_t>(m_max * n * 2));
  auto resolve = [&](std::int64_t m, bool tune) {
    AgGemmArgs g;
    g.a = da->p;
    g.b = db->p;
    g.d = dd.p;
    g.m = m;
    g.m_local = shard_rows(m, R).rows(m, rank);
    g.n = n;
    g.k = k;
    OpOptions o;
    o.use_cache = false;
    o.tune_on_miss = tune;
    TuneReport r;
    r.chosen = ctx().resolve(g, o, &r);
    pg.synchronize(pg.stream(), "tuner test");
    return r;
  };
  const TuneReport measured = resolve(2048, true);
  EXPECT_FALSE(measured.times_ms.empty());
  const TuneReport near = resolve(3072, false);  // within a factor 2 of 2048
  EXPECT_TRUE(near.times_ms.empty()) << "a guessed shape must not be measured";
  EXPECT_EQ(near.chosen, measured.chosen);
  EXPECT_TRUE(near.from_cache);
  const TuneReport far = resolve(16384, false);  // 8x: no neighbour
  EXPECT_TRUE(far.times_ms.empty());
  EXPECT_EQ(far.chosen, Strategy::sequential);
  EXPECT_FALSE(resolve(3072, true).times_ms.empty()) << "tune_on_miss measures a shape that was only guessed";
}

TEST(OpsTpBadInput, RejectedBeforeLaunch) {
  if (skip()) GTEST_SKIP() << "needs >= 2 ranks with a GPU each";
  auto& pg = group();
  const int R = pg.world(), rank = pg.rank();
  const std::int64_t m = 1024, n = 512, k = 256;
  Dev a(m * k * 2), b(n * k * 2), d(m * n * 2);
  AgGemmArgs g;
  g.a = a.p;
  g.b = b.p;
  g.d = d.p;
  g.m = m;
  g.m_local = shard_rows(m, R).rows(m, rank);
  g.n = n;
  g.k = k;
  // Shapes disagreeing across ranks: every rank gets an Error naming the op.
  AgGemmArgs dis = g;
  if (rank == 1) dis.n = n - 8;
  try {
    ops::ag_gemm(ctx(), dis);
    ADD_FAILURE() << "disagreeing N was accepted";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("ag_gemm"), std::string::npos) << e.what();
  }
  // Local problems, identical on every rank (so no rank waits on another).
  AgGemmArgs bad = g;
  bad.a = static_cast<char*>(a.p) + 2;
  EXPECT_THROW(ops::ag_gemm(ctx(), bad), tessera::Error);
  bad = g;
  bad.dtype = DType::f32;
  EXPECT_THROW(ops::ag_gemm(ctx(), bad), tessera::Error);
  bad = g;
  bad.m_local = g.m_local + 1;
  EXPECT_THROW(ops::ag_gemm(ctx(), bad), tessera::Error);
  // GEMM+RS on the copy engine with shards off the tile rows (M = 1000).
  GemmRsArgs r{a.p, b.p, d.p, 1000, shard_rows(1000, R).rows(1000, rank), n, k};
  OpOptions ce;
  ce.strategy = Strategy::fused_ce;
  EXPECT_THROW(ops::gemm_rs(ctx(), r, ce), tessera::Error);
  // GEMM+AR: an unimplemented strategy, fused_ce off the tile rows, a
  // misaligned output.
  GemmArArgs ar{a.p, b.p, d.p, m, n, k};
  OpOptions dec;
  dec.strategy = Strategy::decomposition;
  try {
    ops::gemm_ar(ctx(), ar, dec);
    ADD_FAILURE() << "gemm_ar accepted strategy decomposition";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not implemented"), std::string::npos) << e.what();
  }
  GemmArArgs ar_ragged = ar;
  ar_ragged.m = 1000;
  EXPECT_THROW(ops::gemm_ar(ctx(), ar_ragged, ce), tessera::Error);
  GemmArArgs ar_bad = ar;
  ar_bad.d = static_cast<char*>(d.p) + 4;
  EXPECT_THROW(ops::gemm_ar(ctx(), ar_bad, ce), tessera::Error);
  // The context still works after the rejections.
  TESSERA_CUDA_CHECK(cudaMemset(a.p, 0, a.bytes));
  TESSERA_CUDA_CHECK(cudaMemset(b.p, 0, b.bytes));
  OpOptions o;
  o.strategy = Strategy::fused_ce;
  EXPECT_NO_THROW(ops::ag_gemm(ctx(), g, o));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(pg.stream()));
}
