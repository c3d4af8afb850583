// CPU tests of the sequence-parallel attention operators' bad-input checks,
// before any launch and without a GPU: one rank's shape checks
// (seq against the world, GQA divisibility, dtype, head dim, pointers), the
// head-sharded strategies' head-count rule, and the cross-rank agreement on
// shapes, head counts and strategy (sp_attention, ring and two-level
// attention share agree_zigzag; Ulysses has agree_ulysses), run over a
// loopback Bootstrap with one thread per rank (the exchange
// ProcessGroup::check_same_on_all_ranks makes).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ops/seq_parallel_detail.hpp"
#include "tessera/ops/sp_attention.hpp"
#include "tessera/ops/two_level_attention.hpp"
#include "tessera/runtime/bootstrap.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/launch.hpp"

namespace tessera::ops {
namespace {

using namespace std::chrono_literals;

SpAttnArgs good() {
  SpAttnArgs a;
  a.q = reinterpret_cast<const void*>(0x10000);
  a.k = reinterpret_cast<const void*>(0x20000);
  a.v = reinterpret_cast<const void*>(0x30000);
  a.o = reinterpret_cast<void*>(0x40000);
  a.batch = 1;
  a.seq = 64;
  a.heads_q = 8;
  a.heads_kv = 2;
  a.head_dim = 128;
  return a;
}

std::string shape_error(const SpAttnArgs& a, int world) {
  try {
    detail::validate_zigzag_shape(a, world, "sp_attention");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SpAttentionValidate, OneRanksShapeChecksNameTheArgument) {
  using A = SpAttnArgs;
  const std::pair<std::function<void(A&)>, std::string> bad[] = {
      {[](A& a) { a.seq = 60; }, "seq = 60 must be a positive multiple of 2 x world = 8"},
      {[](A& a) { a.seq = 0; }, "seq = 0 must be a positive multiple of 2 x world = 8"},
      {[](A& a) { a.seq = -8; }, "seq = -8 must be a positive multiple"},
      // GQA: query heads a multiple of the KV heads.
      {[](A& a) {
         a.heads_q = 6;
         a.heads_kv = 4;
       },
       "heads_q = 6 is not a multiple of heads_kv = 4"},
      {[](A& a) { a.heads_kv = 16; }, "heads_kv = 16 must be in [1, heads_q = 8]"},
      {[](A& a) { a.heads_kv = 0; }, "heads_kv = 0 must be in [1, heads_q = 8]"},
      {[](A& a) { a.heads_q = -8; }, "heads_q = -8 out of range"},
      {[](A& a) { a.head_dim = 96; }, "head_dim = 96 not supported (64 or 128)"},
      {[](A& a) { a.dtype = DType::f32; }, "dtype f32 not supported (bf16 or f16)"},
      {[](A& a) { a.batch = 0; }, "batch = 0 out of range"},
      {[](A& a) { a.batch = std::int64_t{1} << 40; }, "batch = 1099511627776 out of range"},
      {[](A& a) { a.k = nullptr; }, "q, k, v and o must be non-null"},
      {[](A& a) { a.v = reinterpret_cast<const void*>(0x30008); }, "q, k, v and o must be 16-byte aligned"},
      {[](A& a) { a.lse = reinterpret_cast<float*>(0x50002); }, "lse = 0x50002 is not aligned to its 4-byte"},
      {[](A& a) { a.softmax_scale = -2.f; }, "softmax_scale = -2"},
  };
  for (const auto& [edit, want] : bad) {
    SpAttnArgs a = good();
    edit(a);
    const std::string e = shape_error(a, 4);
    EXPECT_NE(e.find("sp_attention: " + want), std::string::npos) << "want '" << want << "', got: '" << e << "'";
  }
  EXPECT_NE(shape_error(good(), 0).find("world = 0 must be >= 1"), std::string::npos);
  // A good call passes every argument check; what may fail on a machine
  // without a GPU is the kernel's device check, which comes last.
  for (int world : {1, 2, 4, 8, 32}) {
    const std::string e = shape_error(good(), world);
    EXPECT_EQ(e.find("sp_attention: seq"), std::string::npos) << e;
    EXPECT_EQ(e.find("heads"), std::string::npos) << e;
  }
}

TEST(SpAttentionValidate, HeadShardedStrategiesNeedHeadsDivisibleByTheWorld) {
  SpAttnArgs a = good();  // 8 query heads, 2 KV heads
  EXPECT_NO_THROW(detail::check_sp_heads(a, 2, SpStrategy::ulysses));
  try {
    detail::check_sp_heads(a, 4, SpStrategy::ulysses);
    ADD_FAILURE() << "2 KV heads over 4 ranks accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "strategy ulysses needs heads_q = 8 and heads_kv = 2 to be multiples of the world size 4"),
              std::string::npos)
        << e.what();
  }
  a.heads_q = 12;
  a.heads_kv = 12;
  EXPECT_THROW(detail::check_sp_heads(a, 8, SpStrategy::ulysses), Error);
  // The sequence-sharded strategies do not shard heads; automatic leaves
  // ulysses out of its candidates instead (sp_attention_candidates).
  for (SpStrategy s : {SpStrategy::automatic, SpStrategy::sequential, SpStrategy::fused_ce, SpStrategy::ring})
    EXPECT_NO_THROW(detail::check_sp_heads(a, 8, s)) << sp_strategy_name(s);
}

// Two-level attention: the Ulysses degree u must divide the world and both
// head counts (each group shards the query and the KV heads).
TEST(SpAttentionValidate, TwoLevelDegreeMustDivideWorldAndHeads) {
  const auto error = [](const SpAttnArgs& a, int world, int u) {
    try {
      two_level_inner_degree(a, world, u);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  SpAttnArgs a = good();  // 8 query heads, 2 KV heads
  EXPECT_EQ(error(a, 8, 2), "");
  EXPECT_NE(error(a, 8, 3).find("two_level_inner = 3 must be a divisor of the world size 8"), std::string::npos);
  EXPECT_NE(error(a, 8, 4).find("heads_kv = 2 is not a multiple of two_level_inner = 4"), std::string::npos);
  EXPECT_NE(error(a, 8, -1).find("two_level_inner = -1 must be >= 0"), std::string::npos);
  a.heads_q = 6;
  a.heads_kv = 6;
  EXPECT_NE(error(a, 8, 4).find("heads_q = 6 is not a multiple of two_level_inner = 4"), std::string::npos);
  a.heads_kv = 4;
  EXPECT_NE(error(a, 8, 0).find("heads_q = 6 is not a multiple of heads_kv = 4"), std::string::npos);
}

runtime::LaunchInfo loopback(int rank, int world, int port) {
  runtime::LaunchInfo li;
  li.rank = rank;
  li.world = world;
  li.local_rank = rank;
  li.local_world = world;
  li.master_addr = "127.0.0.1";
  li.master_port = port;
  li.source = "test";
  li.job_secret = "sp-attention-validate-test";
  li.secret_source = "the test's secret";
  return li;
}

/// Runs body(rank, bootstrap) on `world` threads over one loopback
/// rendezvous; returns each rank's error text ("" when it passed).
std::vector<std::string> on_ranks(int world, const std::function<void(int, runtime::Bootstrap&)>& body) {
  const int port = runtime::find_free_tcp_port();
  std::vector<std::string> out(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        auto b = runtime::Bootstrap::connect(loopback(r, world, port), 20s);
        body(r, *b);
        b->barrier();
      } catch (const std::exception& e) {
        out[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return out;
}

/// Every rank calls agree_zigzag with its own args (edit(rank, args)) and
/// strategy code; returns each rank's error text.
std::vector<std::string> agree(int world, const std::function<void(int, SpAttnArgs&, int&)>& edit) {
  return on_ranks(world, [&](int rank, runtime::Bootstrap& b) {
    SpAttnArgs a = good();
    int strategy = static_cast<int>(SpStrategy::sequential);
    edit(rank, a, strategy);
    std::set<detail::ZigzagSignature> agreed;
    try {
      detail::agree_zigzag(
          a, "sp_attention", strategy, sp_strategy_name(static_cast<SpStrategy>(strategy)), agreed,
          [&b](const std::string& what, const void* data, std::size_t n) { b.check_same(data, n, what); });
    } catch (...) {
      b.barrier();  // every rank reached its verdict: the rendezvous closes cleanly
      throw;
    }
  });
}

TEST(SpAttentionValidate, MismatchedShapesOrHeadCountsAcrossRanksFailOnEveryRank) {
  struct Case {
    const char* what;
    std::function<void(SpAttnArgs&, int&)> edit;  // applied on the last rank only
    const char* own;                              // the description rank 0 sends
  };
  const Case cases[] = {
      {"heads_q", [](SpAttnArgs& a, int&) { a.heads_q = 16; }, "heads 8/2"},
      {"heads_kv", [](SpAttnArgs& a, int&) { a.heads_kv = 4; }, "heads 8/2"},
      {"seq", [](SpAttnArgs& a, int&) { a.seq = 128; }, "seq 64"},
      {"batch", [](SpAttnArgs& a, int&) { a.batch = 2; }, "batch 1"},
      {"head_dim", [](SpAttnArgs& a, int&) { a.head_dim = 64; }, "head_dim 128"},
      {"dtype", [](SpAttnArgs& a, int&) { a.dtype = DType::f16; }, "dtype bf16"},
      {"causal", [](SpAttnArgs& a, int&) { a.causal = false; }, "causal true"},
      {"strategy", [](SpAttnArgs&, int& s) { s = static_cast<int>(SpStrategy::ring); }, "strategy sequential"},
  };
  for (const int world : {2, 3}) {
    for (const Case& c : cases) {
      const auto errors = agree(world, [&](int rank, SpAttnArgs& a, int& s) {
        if (rank == world - 1) c.edit(a, s);
      });
      for (int r = 0; r < world; ++r) {
        const std::string& e = errors[static_cast<std::size_t>(r)];
        EXPECT_NE(e.find("sp_attention: shapes and strategy ("), std::string::npos)
            << c.what << ", world " << world << ", rank " << r << ": '" << e << "'";
        EXPECT_NE(e.find("differs between ranks: rank(s) " + std::to_string(world - 1)), std::string::npos)
            << c.what << ", rank " << r << ": " << e;
        if (r == 0) EXPECT_NE(e.find(c.own), std::string::npos) << c.what << ": " << e;
      }
    }
  }
}

// Ulysses (its own context and signature: the head groups too).
TEST(SpAttentionValidate, UlyssesMismatchedHeadCountsOrGroupsFailOnEveryRank) {
  const std::pair<std::function<void(SpAttnArgs&, int&)>, std::string> cases[] = {
      {[](SpAttnArgs& a, int&) { a.heads_kv = 4; }, "heads 8/2"},
      {[](SpAttnArgs& a, int&) { a.heads_q = 16; }, "heads 8/2"},
      {[](SpAttnArgs& a, int&) { a.seq = 32; }, "seq 64"},
      {[](SpAttnArgs&, int& groups) { groups = 2; }, "head groups 1"},
  };
  for (const auto& [edit, own] : cases) {
    const auto errors = on_ranks(2, [&](int rank, runtime::Bootstrap& b) {
      SpAttnArgs a = good();
      int groups = 1;
      if (rank == 1) edit(a, groups);
      std::set<detail::UlyssesSignature> agreed;
      try {
        detail::agree_ulysses(a, groups, agreed, [&b](const std::string& what, const void* data, std::size_t n) {
          b.check_same(data, n, what);
        });
      } catch (...) {
        b.barrier();
        throw;
      }
    });
    for (int r = 0; r < 2; ++r) {
      const std::string& e = errors[static_cast<std::size_t>(r)];
      EXPECT_NE(e.find("ulysses_attention: shapes ("), std::string::npos) << own << ", rank " << r << ": '" << e << "'";
      EXPECT_NE(e.find("differs between ranks: rank(s) 1"), std::string::npos) << own << ", rank " << r << ": " << e;
      if (r == 0) EXPECT_NE(e.find(own), std::string::npos) << e;
    }
  }
}

TEST(SpAttentionValidate, AgreedShapesPassAndAreExchangedOnce) {
  const auto errors = on_ranks(2, [](int, runtime::Bootstrap& b) {
    std::set<detail::ZigzagSignature> agreed;
    int exchanges = 0;
    const detail::CheckSameOnAllRanks check = [&](const std::string& what, const void* data, std::size_t n) {
      ++exchanges;
      b.check_same(data, n, what);
    };
    const SpAttnArgs a = good();
    for (int call = 0; call < 3; ++call) detail::agree_zigzag(a, "sp_attention", 1, "sequential", agreed, check);
    TESSERA_CHECK(exchanges == 1, "{} exchanges for one signature", exchanges);
    SpAttnArgs b2 = a;
    b2.seq = 128;  // a new signature: one more exchange
    detail::agree_zigzag(b2, "sp_attention", 1, "sequential", agreed, check);
    TESSERA_CHECK(exchanges == 2, "{} exchanges for two signatures", exchanges);
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
}

}  // namespace
}  // namespace tessera::ops
