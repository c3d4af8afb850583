// GPU tests of the MoE routing kernels (tessera/kernels/moe_routing.hpp)
// against CPU references: top-k gating, the stable expert sort under
// uniform, skewed and invalid routing, the row gather, the expert-parallel
// slab layout and scatter, and the combine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gemm_test_util.hpp"
#include "support/test_support.hpp"
#include "tessera/kernels/moe_routing.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::kernels::moe {
namespace {

using testk::DevBuf;

template <class T>
std::vector<T> download(const DevBuf& b, std::size_t n) {
  std::vector<T> h(n);
  TESSERA_CUDA_CHECK(cudaMemcpy(h.data(), b.p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}
template <class T>
DevBuf upload(const std::vector<T>& h) {
  DevBuf b(std::max<std::size_t>(h.size() * sizeof(T), 16));
  TESSERA_CUDA_CHECK(cudaMemcpy(b.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return b;
}
DevBuf poisoned(std::size_t bytes) {
  DevBuf b(std::max<std::size_t>(bytes, 16));
  TESSERA_CUDA_CHECK(cudaMemset(b.p, 0xA5, b.bytes));
  return b;
}

struct TopKCase {
  int tokens, experts, k;
  bool renormalize;
};

class TopK : public ::testing::TestWithParam<TopKCase> {};

TEST_P(TopK, MatchesSoftmaxTopK) {
  TESSERA_REQUIRE_GPUS(1);
  const auto [T, E, k, renorm] = GetParam();
  std::mt19937 rng(1234 + T + E * 7 + k);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> logits(static_cast<std::size_t>(T) * E);
  for (float& v : logits) v = nd(rng);
  DevBuf dl = upload(logits);
  DevBuf ids = poisoned(sizeof(std::int32_t) * T * k), w = poisoned(sizeof(float) * T * k);
  TopKArgs a;
  a.logits = dl.p;
  a.tokens = T;
  a.experts = E;
  a.k = k;
  a.renormalize = renorm;
  a.expert_ids = ids.as<std::int32_t>();
  a.weights = w.as<float>();
  topk_gating(a, nullptr);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  const auto gi = download<std::int32_t>(ids, static_cast<std::size_t>(T) * k);
  const auto gw = download<float>(w, static_cast<std::size_t>(T) * k);
  double worst = 0;
  for (int t = 0; t < T; ++t) {
    const float* l = &logits[static_cast<std::size_t>(t) * E];
    const double mx = *std::max_element(l, l + E);
    std::vector<double> p(E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += p[e] = std::exp(l[e] - mx);
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return p[x] > p[y]; });
    double picked = 0;
    for (int s = 0; s < k; ++s) picked += p[order[s]] / sum;
    for (int s = 0; s < k; ++s) {
      ASSERT_EQ(gi[static_cast<std::size_t>(t) * k + s], order[s]) << "token " << t << " slot " << s;
      const double ref = p[order[s]] / sum / (renorm ? picked : 1.0);
      worst = std::max(worst, std::abs(gw[static_cast<std::size_t>(t) * k + s] - ref) / ref);
    }
  }
  EXPECT_LT(worst, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Cases, TopK,
                         ::testing::Values(TopKCase{1000, 8, 2, true}, TopKCase{777, 32, 5, false},
                                           TopKCase{513, 100, 8, true}, TopKCase{300, 256, 1, false},
                                           TopKCase{64, 1024, 16, true}));

/// CPU stable counting sort of the valid entries.
struct SortRef {
  std::vector<std::int32_t> offsets, sorted, row;
  int invalid = 0;
};
SortRef sort_ref(const std::vector<std::int32_t>& ids, int E) {
  SortRef r;
  r.offsets.assign(E + 1, 0);
  for (int e : ids)
    if (e >= 0 && e < E) ++r.offsets[e + 1];
  for (int e = 0; e < E; ++e) r.offsets[e + 1] += r.offsets[e];
  std::vector<std::int32_t> next(r.offsets.begin(), r.offsets.end() - 1);
  r.sorted.assign(r.offsets[E], -1);
  r.row.assign(ids.size(), -1);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const int e = ids[i];
    if (e < 0 || e >= E) {
      ++r.invalid;
      continue;
    }
    r.row[i] = next[e]++;
    r.sorted[r.row[i]] = static_cast<std::int32_t>(i);
  }
  return r;
}

enum class Routing { Uniform, Skewed, WithInvalid };

struct PermuteCase {
  int tokens, experts, k;
  Routing routing;
};

class Permute : public ::testing::TestWithParam<PermuteCase> {};

TEST_P(Permute, StableSortByExpert) {
  TESSERA_REQUIRE_GPUS(1);
  const auto [T, E, k, routing] = GetParam();
  std::mt19937 rng(99 + T + E + k);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(T) * k);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    switch (routing) {
      case Routing::Uniform:
        ids[i] = static_cast<std::int32_t>(rng() % E);
        break;
      case Routing::Skewed:  // half the entries to expert 0; the upper half of the experts get none
        ids[i] = (rng() % 2) ? 0 : static_cast<std::int32_t>(rng() % std::max(1, E / 2));
        break;
      case Routing::WithInvalid:
        ids[i] = (rng() % 17 == 0) ? (rng() % 2 ? -3 : E + 5) : static_cast<int>(rng() % E);
        break;
    }
  }
  const SortRef ref = sort_ref(ids, E);
  const std::int64_t entries = static_cast<std::int64_t>(T) * k;
  DevBuf di = upload(ids);
  DevBuf off = poisoned(sizeof(std::int32_t) * (E + 1)), sorted = poisoned(sizeof(std::int32_t) * entries),
         row = poisoned(sizeof(std::int32_t) * entries);
  DevBuf counts = poisoned(sizeof(std::int32_t) * E);
  DevBuf flags(2 * sizeof(std::int32_t));
  TESSERA_CUDA_CHECK(cudaMemset(flags.p, 0, flags.bytes));
  DevBuf ws(std::max<std::size_t>(permute_workspace_bytes(entries, E), 16));
  PermuteArgs a;
  a.expert_ids = di.as<std::int32_t>();
  a.tokens = T;
  a.experts = E;
  a.k = k;
  a.expert_offsets = off.as<std::int32_t>();
  a.expert_counts = counts.as<std::int32_t>();
  a.sorted_entry = sorted.as<std::int32_t>();
  a.entry_row = row.as<std::int32_t>();
  a.capacity = entries / E + 1;  // uniform stays about at it; skewed overflows it
  a.overflow = flags.as<std::int32_t>();
  a.invalid = flags.as<std::int32_t>() + 1;
  a.workspace = ws.p;
  a.workspace_bytes = ws.bytes;
  permute(a, nullptr);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(download<std::int32_t>(off, E + 1), ref.offsets);
  const auto gc = download<std::int32_t>(counts, E);
  for (int e = 0; e < E; ++e) EXPECT_EQ(gc[e], ref.offsets[e + 1] - ref.offsets[e]) << "expert " << e;
  const auto gs = download<std::int32_t>(sorted, entries);
  EXPECT_TRUE(std::equal(ref.sorted.begin(), ref.sorted.end(), gs.begin())) << "sorted_entry differs";
  EXPECT_EQ(download<std::int32_t>(row, entries), ref.row);
  const auto f = download<std::int32_t>(flags, 2);
  EXPECT_EQ(f[1], ref.invalid);
  int worst = 0;
  for (int e = 0; e < E; ++e) worst = std::max(worst, ref.offsets[e + 1] - ref.offsets[e]);
  EXPECT_EQ(f[0], worst > a.capacity ? worst : 0);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Permute,
    ::testing::Values(PermuteCase{8192, 8, 2, Routing::Uniform}, PermuteCase{8192, 32, 5, Routing::Skewed},
                      PermuteCase{1000, 32, 2, Routing::WithInvalid}, PermuteCase{3, 64, 2, Routing::Uniform},
                      PermuteCase{0, 8, 2, Routing::Uniform}, PermuteCase{4097, 1024, 4, Routing::Skewed}));

TEST(MoeRouting, GatherThenCombineIsWeightedRowSum) {
  TESSERA_REQUIRE_GPUS(1);
  for (const DType dt : {DType::bf16, DType::f16}) {
    const int T = 1531, E = 16, k = 3;
    const std::int64_t cols = 1003, ld = 1008;  // a ragged row tail
    std::mt19937 rng(7);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(T) * k);
    for (auto& e : ids) e = static_cast<std::int32_t>(rng() % E);
    std::vector<float> w(ids.size());
    std::uniform_real_distribution<float> ud(0.1f, 1.f);
    for (float& v : w) v = ud(rng);
    std::vector<std::uint16_t> x(static_cast<std::size_t>(T) * ld);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : x) v = testk::to_bits(nd(rng), dt);
    const std::int64_t entries = static_cast<std::int64_t>(T) * k;
    DevBuf di = upload(ids), dw = upload(w), dx = upload(x);
    DevBuf off(sizeof(std::int32_t) * (E + 1)), sorted(sizeof(std::int32_t) * entries),
        row(sizeof(std::int32_t) * entries), ws(permute_workspace_bytes(entries, E));
    PermuteArgs p;
    p.expert_ids = di.as<std::int32_t>();
    p.tokens = T;
    p.experts = E;
    p.k = k;
    p.expert_offsets = off.as<std::int32_t>();
    p.sorted_entry = sorted.as<std::int32_t>();
    p.entry_row = row.as<std::int32_t>();
    p.workspace = ws.p;
    p.workspace_bytes = ws.bytes;
    permute(p, nullptr);
    DevBuf gathered = poisoned(2 * entries * ld), out = poisoned(2 * static_cast<std::size_t>(T) * ld);
    GatherArgs g;
    g.x = dx.p;
    g.ldx = ld;
    g.gathered = gathered.p;
    g.ldg = ld;
    g.cols = cols;
    g.sorted_entry = p.sorted_entry;
    g.expert_offsets = p.expert_offsets;
    g.experts = E;
    g.k = k;
    g.max_rows = entries;
    g.dtype = dt;
    gather_rows(g, nullptr);
    CombineArgs c;
    c.y = gathered.p;  // an identity expert: each sorted row is its token's row
    c.ldy = ld;
    c.entry_row = p.entry_row;
    c.weights = dw.as<float>();
    c.out = out.p;
    c.ldo = ld;
    c.tokens = T;
    c.cols = cols;
    c.k = k;
    c.dtype = dt;
    combine(c, nullptr);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    const auto gs = download<std::int32_t>(sorted, entries);
    const auto gg = download<std::uint16_t>(gathered, entries * ld);
    for (std::int64_t r = 0; r < entries; ++r)
      for (std::int64_t j = 0; j < cols; ++j)
        ASSERT_EQ(gg[r * ld + j], x[(gs[r] / k) * ld + j]) << "gathered row " << r << " col " << j;
    const auto go = download<std::uint16_t>(out, static_cast<std::size_t>(T) * ld);
    std::vector<double> got, want;
    for (int t = 0; t < T; ++t) {
      double ws_ = 0;
      for (int s = 0; s < k; ++s) ws_ += w[static_cast<std::size_t>(t) * k + s];
      for (std::int64_t j = 0; j < cols; ++j) {
        got.push_back(testk::from_bits(go[t * ld + j], dt));
        want.push_back(ws_ * testk::from_bits(x[t * ld + j], dt));
      }
    }
    EXPECT_LT(tessera::testing::relative_error(got, want), dt == DType::bf16 ? 8e-3 : 1e-3) << dtype_name(dt);

    // With two addend blocks (a reduce-scatter's received partials), added in
    // f32 before the rounding.
    const std::int64_t block = static_cast<std::int64_t>(T) * ld + 8;  // a gap between the blocks
    std::vector<std::uint16_t> add(static_cast<std::size_t>(2 * block));
    for (auto& v : add) v = testk::to_bits(nd(rng), dt);
    DevBuf dadd = upload(add), out2 = poisoned(2 * static_cast<std::size_t>(T) * ld);
    c.out = out2.p;
    c.addend = dadd.p;
    c.addends = 2;
    c.ld_add = ld;
    c.addend_stride = block;
    combine(c, nullptr);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    const auto go2 = download<std::uint16_t>(out2, static_cast<std::size_t>(T) * ld);
    got.clear();
    want.clear();
    for (int t = 0; t < T; ++t) {
      double ws_ = 0;
      for (int s = 0; s < k; ++s) ws_ += w[static_cast<std::size_t>(t) * k + s];
      for (std::int64_t j = 0; j < cols; ++j) {
        got.push_back(testk::from_bits(go2[t * ld + j], dt));
        want.push_back(ws_ * testk::from_bits(x[t * ld + j], dt) + testk::from_bits(add[t * ld + j], dt) +
                       testk::from_bits(add[block + t * ld + j], dt));
      }
      ASSERT_EQ(go2[t * ld + cols], 0xA5A5u) << "row tail of token " << t << " was written";
    }
    EXPECT_LT(tessera::testing::relative_error(got, want), dt == DType::bf16 ? 8e-3 : 1e-3)
        << dtype_name(dt) << " with addends";
  }
}

TEST(MoeRouting, BlockLayoutAndScatterFillTheSlabs) {
  TESSERA_REQUIRE_GPUS(1);
  // 16 experts in 4 blocks; block 0 is hot and overflows the capacity, block
  // 3 gets nothing; some ids are invalid.
  const int T = 777, E = 16, k = 3, B = 4, G = E / B;
  const std::int64_t cols = 72, ld = 80, cap = 500;
  std::mt19937 rng(31);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(T) * k);
  for (auto& e : ids) {
    const unsigned r = rng() % 20;
    e = r == 0 ? E + 1 : (r < 10 ? static_cast<int>(rng() % G) : static_cast<int>(rng() % (3 * G)));
  }
  const SortRef ref = sort_ref(ids, E);
  const std::int64_t entries = static_cast<std::int64_t>(T) * k;
  std::vector<std::int32_t> want_slot(entries, -1), want_counts(E);
  std::int32_t want_left_out = 0, want_largest = 0;
  for (int b = 0; b < B; ++b) {
    const std::int32_t start = ref.offsets[b * G], total = ref.offsets[(b + 1) * G] - start;
    if (total > cap)
      want_left_out += total - static_cast<std::int32_t>(cap), want_largest = std::max(want_largest, total);
    for (int e = b * G; e < (b + 1) * G; ++e)
      want_counts[e] = static_cast<std::int32_t>(std::min<std::int64_t>(ref.offsets[e + 1] - start, cap) -
                                                 std::min<std::int64_t>(ref.offsets[e] - start, cap));
  }
  for (std::int64_t i = 0; i < entries; ++i)
    if (ref.row[i] >= 0) {
      const int b = ids[i] / G;
      const std::int64_t pos = ref.row[i] - ref.offsets[b * G];
      if (pos < cap) want_slot[i] = static_cast<std::int32_t>(b * cap + pos);
    }
  std::vector<std::uint16_t> x(static_cast<std::size_t>(T) * ld);
  for (auto& v : x) v = static_cast<std::uint16_t>(rng() & 0x3fff);
  DevBuf di = upload(ids), dx = upload(x);
  DevBuf off(sizeof(std::int32_t) * (E + 1)), sorted(sizeof(std::int32_t) * entries),
      row(sizeof(std::int32_t) * entries), ws(permute_workspace_bytes(entries, E));
  DevBuf counts = poisoned(sizeof(std::int32_t) * E), slot = poisoned(sizeof(std::int32_t) * entries);
  DevBuf flags(2 * sizeof(std::int32_t)), dst = poisoned(2 * B * cap * ld);
  TESSERA_CUDA_CHECK(cudaMemset(flags.p, 0, flags.bytes));
  PermuteArgs p;
  p.expert_ids = di.as<std::int32_t>();
  p.tokens = T;
  p.experts = E;
  p.k = k;
  p.expert_offsets = off.as<std::int32_t>();
  p.sorted_entry = sorted.as<std::int32_t>();
  p.entry_row = row.as<std::int32_t>();
  p.workspace = ws.p;
  p.workspace_bytes = ws.bytes;
  permute(p, nullptr);
  BlockLayoutArgs l;
  l.expert_ids = p.expert_ids;
  l.expert_offsets = p.expert_offsets;
  l.entry_row = p.entry_row;
  l.tokens = T;
  l.experts = E;
  l.k = k;
  l.blocks = B;
  l.capacity = cap;
  l.block_counts = counts.as<std::int32_t>();
  l.entry_slot = slot.as<std::int32_t>();
  l.overflow = flags.as<std::int32_t>();
  block_layout(l, nullptr);
  ScatterArgs sc;
  sc.x = dx.p;
  sc.ldx = ld;
  sc.dst = dst.p;
  sc.ldd = ld;
  sc.cols = cols;
  sc.entry_slot = l.entry_slot;
  sc.entries = entries;
  sc.k = k;
  scatter_rows(sc, nullptr);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  ASSERT_GT(want_left_out, 0);  // the case must overflow
  EXPECT_EQ(download<std::int32_t>(counts, E), want_counts);
  EXPECT_EQ(download<std::int32_t>(slot, entries), want_slot);
  const auto f = download<std::int32_t>(flags, 2);
  EXPECT_EQ(f[0], want_left_out);
  EXPECT_EQ(f[1], want_largest);
  const auto gd = download<std::uint16_t>(dst, B * cap * ld);
  std::vector<char> used(B * cap, 0);
  for (std::int64_t i = 0; i < entries; ++i) {
    if (want_slot[i] < 0) continue;
    used[want_slot[i]] = 1;
    for (std::int64_t j = 0; j < cols; ++j)
      ASSERT_EQ(gd[want_slot[i] * ld + j], x[(i / k) * ld + j]) << "slot " << want_slot[i] << " col " << j;
  }
  for (std::int64_t r = 0; r < B * cap; ++r) {
    if (!used[r]) {
      ASSERT_EQ(gd[r * ld], 0xA5A5u) << "unused slab row " << r << " was written";
    }
  }
}

TEST(MoeRouting, BadInputIsRejectedBeforeLaunch) {
  TESSERA_REQUIRE_GPUS(1);
  DevBuf buf(4096);
  TopKArgs t;
  t.logits = buf.p;
  t.expert_ids = buf.as<std::int32_t>();
  t.weights = buf.as<float>();
  t.tokens = 4;
  t.experts = 8;
  t.k = 9;  // > experts
  EXPECT_THROW(topk_gating(t, nullptr), tessera::Error);
  t.k = 2;
  t.experts = kMaxExperts + 1;
  EXPECT_THROW(topk_gating(t, nullptr), tessera::Error);
  PermuteArgs p;
  p.expert_ids = buf.as<std::int32_t>();
  p.tokens = 100;
  p.experts = 8;
  p.k = 2;
  p.expert_offsets = p.sorted_entry = p.entry_row = buf.as<std::int32_t>();
  p.workspace = buf.p;
  p.workspace_bytes = 1;  // too small
  EXPECT_THROW(permute(p, nullptr), tessera::Error);
  CombineArgs c;
  c.y = static_cast<char*>(buf.p) + 2;  // misaligned
  c.out = buf.p;
  c.ldy = c.ldo = 8;
  c.cols = 8;
  c.tokens = 1;
  c.k = 1;
  c.entry_row = buf.as<std::int32_t>();
  c.weights = buf.as<float>();
  EXPECT_THROW(combine(c, nullptr), tessera::Error);
  c.y = buf.p;
  c.addend = buf.p;
  c.addends = 2;
  c.ld_add = 8;
  c.addend_stride = 4;  // shorter than one block of tokens x ld_add
  EXPECT_THROW(combine(c, nullptr), tessera::Error);
  c.addend_stride = 8;
  c.addends = -1;
  EXPECT_THROW(combine(c, nullptr), tessera::Error);
}

}  // namespace
}  // namespace tessera::kernels::moe
