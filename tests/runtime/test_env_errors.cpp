// CPU tests of the runtime's small host pieces: typed environment reads,
// error messages, the wait-diagnostic formatting, NCCL's dtype mapping.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>

#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"
#include "tessera/runtime/wait_diagnostics.hpp"
#include "support/test_support.hpp"

namespace env = tessera::env;

using tessera::testing::error_message;

namespace {
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* v) : name(n) {
    if (v)
      setenv(n, v, 1);
    else
      unsetenv(n);
  }
  ~ScopedEnv() { unsetenv(name); }
};

}  // namespace

TEST(Env, UnsetGivesFallbackAndSetValueIsParsed) {
  ScopedEnv a("TESSERA_TEST_INT", nullptr);
  EXPECT_EQ(env::get_int("TESSERA_TEST_INT", 42), 42);
  EXPECT_FALSE(env::find_int("TESSERA_TEST_INT").has_value());
  ScopedEnv b("TESSERA_TEST_INT", "-17");
  EXPECT_EQ(env::get_int("TESSERA_TEST_INT", 42), -17);
  EXPECT_EQ(env::get("TESSERA_TEST_INT").value(), "-17");
}

TEST(Env, MalformedOrOutOfRangeValueIsAnErrorNamingTheVariable) {
  for (const char* bad : {"", "12x", "x", "1e3", " 5", "99999999999999999999999"}) {
    ScopedEnv a("TESSERA_TEST_INT", bad);
    const std::string m = error_message([] { env::get_int("TESSERA_TEST_INT", 1); });
    EXPECT_NE(m.find("TESSERA_TEST_INT"), std::string::npos) << "value '" << bad << "': " << m;
  }
  ScopedEnv a("TESSERA_TEST_INT", "0");
  const std::string m = error_message([] { env::get_int("TESSERA_TEST_INT", 1, 1, 10); });
  EXPECT_NE(m.find("out of range [1, 10]"), std::string::npos) << m;
}

TEST(Error, ChecksNameFileValueAndRank) {
  const std::string m = error_message([] { TESSERA_CHECK(1 + 1 == 3, "shape {} is wrong", 7); });
  EXPECT_NE(m.find("shape 7 is wrong"), std::string::npos) << m;
  EXPECT_NE(m.find("test_env_errors.cpp"), std::string::npos) << m;
  tessera::detail::set_current_rank(3);
  const std::string r = error_message([] { TESSERA_FAIL("boom"); });
  tessera::detail::set_current_rank(-1);
  EXPECT_NE(r.find("[tessera rank 3]"), std::string::npos) << r;
  const std::string c = error_message([] { TESSERA_CUDA_CHECK(2); });  // cudaErrorMemoryAllocation
  EXPECT_NE(c.find("cudaErrorMemoryAllocation"), std::string::npos) << c;
  const std::string n = error_message([] { TESSERA_NCCL_CHECK(4); });  // ncclInvalidArgument
  EXPECT_NE(n.find("NCCL error 4"), std::string::npos) << n;
}

TEST(NcclDtype, MapsEveryReducibleTypeAndRejectsTheRest) {
  using tessera::DType;
  EXPECT_EQ(tessera::runtime::nccl_dtype(DType::bf16), ncclBfloat16);
  EXPECT_EQ(tessera::runtime::nccl_dtype(DType::f16), ncclFloat16);
  EXPECT_EQ(tessera::runtime::nccl_dtype(DType::f32), ncclFloat32);
  try {
    tessera::runtime::nccl_dtype(static_cast<DType>(99));
    ADD_FAILURE() << "an unknown dtype was mapped";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("nccl_dtype"), std::string::npos) << e.what();
  }
}

namespace {
tessera::runtime::WaitRecord record(tessera::runtime::WaitKind kind) {
  tessera::runtime::WaitRecord r{};
  r.claimed = 1;
  r.kind = static_cast<int>(kind);
  r.rank = r.block = r.tile = r.tile_m = r.tile_n = r.channel = r.peer = -1;
  return r;
}
}  // namespace

// The one record every device wait fills: each kind reads as the wait it was.
TEST(WaitRecord, LinkWaitsNameRankTileChannelAndPeer) {
  using tessera::runtime::WaitKind;
  auto r = record(WaitKind::consumer_tile);
  r.rank = 1;
  r.tile = 3;
  r.channel = 5;
  r.expected = 8;
  r.seen = 6;
  r.timeout_ns = 300'000'000;
  EXPECT_EQ(tessera::runtime::describe_wait(r),
            "consumer_tile_wait timed out on rank 1: tile 3 channel 5 expected >= 8 but saw 6 after 300 ms");
  r.kind = static_cast<int>(WaitKind::peer_tile);
  r.peer = 2;
  EXPECT_EQ(tessera::runtime::describe_wait(r),
            "peer_tile_wait timed out on rank 1: tile 3 channel 5 from rank 2 expected >= 8 but saw 6 after 300 ms");
  r = record(WaitKind::counter);
  r.rank = 0;
  r.tile = 4;  // the signal group
  r.expected = 12;
  r.seen = 11;
  r.timeout_ns = 5'000'000'000;
  EXPECT_EQ(tessera::runtime::describe_wait(r),
            "counter wait timed out on rank 0: tile 4 channel -1 expected >= 12 but saw 11 after 5000 ms");
}

TEST(WaitRecord, BadIdNamesTheIdAndItsLimit) {
  auto r = record(tessera::runtime::WaitKind::bad_id);
  r.rank = 2;
  r.tile = 7;
  r.expected = 16;
  r.seen = static_cast<std::uint64_t>(std::int64_t{-1});
  EXPECT_EQ(tessera::runtime::describe_wait(r), "rank 2: tile 7 maps to id -1 outside [0, 16)");
}

TEST(WaitRecord, TileFlagNamesBlockTileAndFlag) {
  auto r = record(tessera::runtime::WaitKind::tile_flag);
  r.block = 12;
  r.tile_m = 3;
  r.tile_n = 0;
  r.channel = 2;
  r.expected = 1;
  r.seen = 0;
  r.timeout_ns = 50'000'000;
  // The engine's FlagWait does not know the rank.
  EXPECT_EQ(tessera::runtime::describe_wait(r),
            "tile flag wait timed out after 50000000 ns: block 12 waiting for tile (3, 0): flag[2] expected >= 1, "
            "seen 0");
  // The ops' prologues do, and name the source rank of a per-source flag.
  r.rank = 1;
  r.peer = 0;
  EXPECT_EQ(tessera::runtime::describe_wait(r),
            "rank 1: tile flag wait timed out after 50000000 ns: block 12 waiting for tile (3, 0): flag[2] from "
            "rank 0 expected >= 1, seen 0");
}
