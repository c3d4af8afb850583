// CPU tests of the MoE routing kernels' host checks, each naming the
// argument before any launch: top-k > E, experts outside the compiled table, negative
// or overflowing sizes, null and misaligned pointers, short workspaces and
// strides are each rejected, named, before any launch. Expert ids outside
// [0, E) and capacity overflows are device data, counted by the kernels and
// read after the call (moe_routing_test.cpp, on the GPU).
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <iterator>
#include <string>
#include <utility>

#include "tessera/kernels/moe_routing.hpp"
#include "tessera/runtime/error.hpp"

namespace km = tessera::kernels::moe;
using tessera::DType;

namespace {

template <class T>
T* fake(std::uintptr_t v) {
  return reinterpret_cast<T*>(v);
}

template <class Args>
std::string error_of(void (*fn)(const Args&, cudaStream_t), const Args& a) {
  try {
    fn(a, nullptr);
  } catch (const tessera::Error& e) {
    return e.what();
  }
  return "";
}

template <class Args>
void expect_named(void (*fn)(const Args&, cudaStream_t), const Args& good,
                  const std::pair<std::function<void(Args&)>, std::string>* cases, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    Args a = good;
    cases[i].first(a);
    const std::string e = error_of(fn, a);
    EXPECT_NE(e.find(cases[i].second), std::string::npos) << "want '" << cases[i].second << "', got: '" << e << "'";
  }
}

}  // namespace

TEST(MoeRoutingHost, TopkGatingNamesEachBadArgument) {
  km::TopKArgs g;
  g.logits = fake<const void>(0x10000);
  g.expert_ids = fake<std::int32_t>(0x20000);
  g.weights = fake<float>(0x30000);
  g.tokens = 16;
  g.experts = 8;
  g.k = 2;
  using A = km::TopKArgs;
  const std::pair<std::function<void(A&)>, std::string> bad[] = {
      {[](A& a) { a.k = 9; }, "moe::topk_gating: k = 9 out of range [1, min(16, experts = 8)]"},
      {[](A& a) {
         a.experts = 64;
         a.k = 17;
       },
       "moe::topk_gating: k = 17 out of range [1, min(16, experts = 64)]"},
      {[](A& a) { a.k = 0; }, "moe::topk_gating: k = 0 out of range"},
      {[](A& a) { a.experts = 1025; }, "moe::topk_gating: experts = 1025 out of range [1, 1024]"},
      {[](A& a) { a.experts = 0; }, "moe::topk_gating: experts = 0 out of range"},
      {[](A& a) { a.tokens = -1; }, "moe::topk_gating: tokens = -1 out of range [0, 2^31)"},
      {[](A& a) { a.tokens = std::int64_t{1} << 30; },
       "moe::topk_gating: tokens * k = 2147483648 does not fit the int32 row indices"},
      {[](A& a) { a.logits = nullptr; }, "moe::topk_gating: logits, expert_ids and weights must be non-null"},
      {[](A& a) { a.weights = nullptr; }, "moe::topk_gating: logits, expert_ids and weights must be non-null"},
      {[](A& a) { a.ld_logits = 4; }, "moe::topk_gating: ld_logits = 4 < experts = 8"},
  };
  expect_named(&km::topk_gating, g, bad, std::size(bad));
  A empty = g;
  empty.tokens = 0;  // no tokens: checked, then nothing launched
  EXPECT_EQ(error_of(&km::topk_gating, empty), "");
}

TEST(MoeRoutingHost, PermuteNamesEachBadArgument) {
  km::PermuteArgs g;
  g.expert_ids = fake<const std::int32_t>(0x10000);
  g.expert_offsets = fake<std::int32_t>(0x20000);
  g.sorted_entry = fake<std::int32_t>(0x30000);
  g.entry_row = fake<std::int32_t>(0x40000);
  g.workspace = fake<void>(0x50000);
  g.tokens = 100;
  g.experts = 8;
  g.k = 2;
  g.workspace_bytes = km::permute_workspace_bytes(200, 8);
  using A = km::PermuteArgs;
  const std::pair<std::function<void(A&)>, std::string> bad[] = {
      {[](A& a) { a.k = 9; }, "moe::permute: k = 9 out of range [1, min(16, experts = 8)]"},
      {[](A& a) { a.experts = 2000; }, "moe::permute: experts = 2000 out of range [1, 1024]"},
      {[](A& a) { a.tokens = -3; }, "moe::permute: tokens = -3 out of range"},
      {[](A& a) { a.entry_row = nullptr; }, "moe::permute: expert_ids, expert_offsets, sorted_entry and entry_row"},
      {[](A& a) { a.capacity = -1; }, "moe::permute: capacity = -1 must be >= 0"},
      {[](A& a) { a.workspace_bytes = 4; }, "moe::permute: workspace of 4 bytes given"},
      {[](A& a) { a.workspace = nullptr; }, "(permute_workspace_bytes)"},
  };
  expect_named(&km::permute, g, bad, std::size(bad));
}

TEST(MoeRoutingHost, GatherScatterAndCombineNameEachBadArgument) {
  km::GatherArgs g;
  g.x = fake<const void>(0x10000);
  g.gathered = fake<void>(0x20000);
  g.ldx = g.ldg = g.cols = 64;
  g.sorted_entry = fake<const std::int32_t>(0x30000);
  g.expert_offsets = fake<const std::int32_t>(0x40000);
  g.experts = 8;
  g.k = 2;
  g.max_rows = 200;
  using G = km::GatherArgs;
  const std::pair<std::function<void(G&)>, std::string> gather_bad[] = {
      {[](G& a) { a.experts = 1025; }, "moe::gather_rows: experts = 1025 out of range [1, 1024]"},
      {[](G& a) { a.k = 17; }, "moe::gather_rows: k = 17 out of range [1, 16]"},
      {[](G& a) { a.max_rows = -1; }, "moe::gather_rows: max_rows = -1 out of range [0, 2^31)"},
      {[](G& a) { a.x = fake<const void>(0x10008); }, "moe::gather_rows: x = 0x10008 must be non-null and 16-byte"},
      {[](G& a) { a.gathered = nullptr; }, "moe::gather_rows: gathered = 0x0 must be non-null"},
      {[](G& a) { a.dtype = DType::f32; }, "moe::gather_rows: dtype f32 not supported (bf16 or f16)"},
      {[](G& a) { a.ldx = 60; }, "moe::gather_rows: the row stride of x (60) must be >= cols = 64"},
      {[](G& a) { a.ldg = 68; }, "moe::gather_rows: the row stride of gathered (68) must be >= cols = 64 and a"},
      {[](G& a) { a.expert_offsets = nullptr; }, "moe::gather_rows: sorted_entry and expert_offsets must be non-null"},
  };
  expect_named(&km::gather_rows, g, gather_bad, std::size(gather_bad));

  km::ScatterArgs s;
  s.x = fake<const void>(0x10000);
  s.dst = fake<void>(0x20000);
  s.ldx = s.ldd = s.cols = 64;
  s.entry_slot = fake<const std::int32_t>(0x30000);
  s.entries = 200;
  s.k = 2;
  using S = km::ScatterArgs;
  const std::pair<std::function<void(S&)>, std::string> scatter_bad[] = {
      {[](S& a) { a.k = 0; }, "moe::scatter_rows: k = 0 out of range [1, 16]"},
      {[](S& a) { a.entries = -1; }, "moe::scatter_rows: entries = -1 out of range [0, 2^31)"},
      {[](S& a) { a.dst = fake<void>(0x20004); }, "moe::scatter_rows: dst = 0x20004 must be non-null and 16-byte"},
      {[](S& a) { a.entry_slot = nullptr; }, "moe::scatter_rows: entry_slot must be non-null"},
  };
  expect_named(&km::scatter_rows, s, scatter_bad, std::size(scatter_bad));

  km::CombineArgs c;
  c.y = fake<const void>(0x10000);
  c.out = fake<void>(0x20000);
  c.ldy = c.ldo = c.cols = 64;
  c.entry_row = fake<const std::int32_t>(0x30000);
  c.weights = fake<const float>(0x40000);
  c.tokens = 100;
  c.k = 2;
  using C = km::CombineArgs;
  const std::pair<std::function<void(C&)>, std::string> combine_bad[] = {
      {[](C& a) { a.k = 17; }, "moe::combine: k = 17 out of range [1, 16]"},
      {[](C& a) { a.tokens = -1; }, "moe::combine: tokens = -1 (times k = 2) out of range"},
      {[](C& a) { a.tokens = std::int64_t{1} << 30; }, "moe::combine: tokens = 1073741824 (times k = 2) out of range"},
      {[](C& a) { a.out = fake<void>(0x20002); }, "moe::combine: out = 0x20002 must be non-null and 16-byte"},
      {[](C& a) { a.weights = nullptr; }, "moe::combine: entry_row and weights must be non-null"},
      {[](C& a) { a.addends = -1; }, "moe::combine: addends = -1 must be >= 0"},
      {[](C& a) {
         a.addends = 1;
         a.addend = fake<const void>(0x50000);
         a.ld_add = 64;
         a.addend_stride = 64;
       },
       "moe::combine: addend_stride = 64 must be a multiple of 8 and >= tokens (100) x ld_add (64)"},
      {[](C& a) {
         a.addends = 1;
         a.ld_add = 64;
         a.addend_stride = 6400;
       },
       "moe::combine: addend = 0x0 must be non-null"},
  };
  expect_named(&km::combine, c, combine_bad, std::size(combine_bad));
}

TEST(MoeRoutingHost, BlockLayoutNamesEachBadArgument) {
  km::BlockLayoutArgs g;
  g.expert_ids = fake<const std::int32_t>(0x10000);
  g.expert_offsets = fake<const std::int32_t>(0x20000);
  g.entry_row = fake<const std::int32_t>(0x30000);
  g.block_counts = fake<std::int32_t>(0x40000);
  g.entry_slot = fake<std::int32_t>(0x50000);
  g.tokens = 100;
  g.experts = 8;
  g.k = 2;
  g.blocks = 2;
  g.capacity = 200;
  using A = km::BlockLayoutArgs;
  const std::pair<std::function<void(A&)>, std::string> bad[] = {
      {[](A& a) { a.k = 9; }, "moe::block_layout: k = 9 out of range [1, min(16, experts = 8)]"},
      {[](A& a) { a.blocks = 3; }, "moe::block_layout: blocks = 3 must be >= 1 and divide experts = 8"},
      {[](A& a) { a.blocks = 0; }, "moe::block_layout: blocks = 0 must be >= 1"},
      {[](A& a) { a.capacity = -1; }, "moe::block_layout: capacity = -1 (times blocks = 2) out of range [0, 2^31)"},
      {[](A& a) { a.capacity = std::int64_t{1} << 30; }, "moe::block_layout: capacity = 1073741824 (times blocks = 2)"},
      {[](A& a) { a.entry_slot = nullptr; }, "moe::block_layout: expert_ids, expert_offsets, entry_row, block_counts"},
  };
  expect_named(&km::block_layout, g, bad, std::size(bad));
}
