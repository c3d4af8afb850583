// ProcessGroup::create_from_unique_id and NcclBootstrap on GPUs, one process
// per rank (`tessera run -n N`; N = 1 runs too). The unique id travels over
// the TCP bootstrap of a from_environment() group here, standing in for the
// caller's own group (torch.distributed in the Python front end).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "support/test_support.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/nccl_bootstrap.hpp"
#include "tessera/runtime/process_group.hpp"

namespace {

using tessera::runtime::NcclBootstrap;
using tessera::runtime::ProcessGroup;

std::unique_ptr<ProcessGroup> group_from_id(ProcessGroup& carrier, std::chrono::milliseconds timeout) {
  ncclUniqueId id{};
  if (carrier.rank() == 0) EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  carrier.bootstrap().broadcast(&id, sizeof(id), 0);
  tessera::runtime::ProcessGroupOptions o;
  o.bootstrap_timeout = timeout;
  return ProcessGroup::create_from_unique_id(carrier.rank(), carrier.world(), carrier.device(), id, o);
}

class NcclBootstrapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_GPUS(tessera::testing::launched_world_size());
    carrier_ = ProcessGroup::from_environment();
  }
  std::unique_ptr<ProcessGroup> carrier_;
};

TEST_F(NcclBootstrapTest, ExchangesMatchTheTcpBootstrap) {
  auto pg = group_from_id(*carrier_, std::chrono::milliseconds(30000));
  const int r = pg->rank(), w = pg->world();
  EXPECT_EQ(w, carrier_->world());
  EXPECT_EQ(pg->launch_info().source, "nccl-unique-id");
  EXPECT_TRUE(pg->lsa_reachable());
  ASSERT_NE(dynamic_cast<NcclBootstrap*>(&pg->bootstrap()), nullptr);

  const auto ranks = pg->allgather(static_cast<std::int64_t>(1000 + r));
  for (int i = 0; i < w; ++i) EXPECT_EQ(ranks[i], 1000 + i);
  std::vector<char> text(300, static_cast<char>('a' + r));
  pg->bootstrap().broadcast(text.data(), text.size(), w - 1);
  EXPECT_EQ(text[0], static_cast<char>('a' + w - 1));
  EXPECT_EQ(text[299], static_cast<char>('a' + w - 1));
  pg->barrier();
  EXPECT_EQ(pg->allreduce_max(static_cast<double>(r)), static_cast<double>(w - 1));
  const std::int64_t same = 42;
  EXPECT_NO_THROW(pg->check_same_on_all_ranks("shape", same));
  if (w > 1) {
    const std::int64_t differs = r == 1 ? 7 : 42;
    try {
      pg->check_same_on_all_ranks("shape", differs);
      ADD_FAILURE() << "no error for differing values";
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find("shape differs between ranks: rank(s) 1"), std::string::npos) << e.what();
    }
  }
  pg->barrier();  // still usable after a check_same that reported a difference
}

TEST_F(NcclBootstrapTest, MismatchedExchangesFailOnEveryRank) {
  if (carrier_->world() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto pg = group_from_id(*carrier_, std::chrono::milliseconds(30000));
  try {
    if (pg->rank() == 0) {
      pg->barrier();
    } else {
      std::int64_t v = 1;
      pg->allgather(v);
    }
    ADD_FAILURE() << "no error for mismatched exchanges";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 called barrier"), std::string::npos) << e.what();
  }
  pg->abort();
}

TEST_F(NcclBootstrapTest, AnAbsentPeerTimesOut) {
  if (carrier_->world() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto pg = group_from_id(*carrier_, std::chrono::milliseconds(500));
  if (pg->rank() == 0) {
    try {
      pg->barrier();  // nobody else joins
      ADD_FAILURE() << "the barrier returned without the peers";
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find("did not complete within 500 ms"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(static_cast<NcclBootstrap&>(pg->bootstrap()).broken());
  }
  pg->abort();
  carrier_->barrier();  // the TCP group still works
}

}  // namespace
