// CPU tests of the runtime's small host pieces: typed environment reads,
// error messages, the wait-diagnostic formatting, NCCL's dtype mapping.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>

#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace env = tessera::env;

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

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const tessera::Error& e) {
    return e.what();
  }
  return "";
}
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
    const std::string m = message_of([] { env::get_int("TESSERA_TEST_INT", 1); });
    EXPECT_NE(m.find("TESSERA_TEST_INT"), std::string::npos) << "value '" << bad << "': " << m;
  }
  ScopedEnv a("TESSERA_TEST_INT", "0");
  const std::string m = message_of([] { env::get_int("TESSERA_TEST_INT", 1, 1, 10); });
  EXPECT_NE(m.find("out of range [1, 10]"), std::string::npos) << m;
}

TEST(Error, ChecksNameFileValueAndRank) {
  const std::string m = message_of([] { TESSERA_CHECK(1 + 1 == 3, "shape {} is wrong", 7); });
  EXPECT_NE(m.find("shape 7 is wrong"), std::string::npos) << m;
  EXPECT_NE(m.find("test_env_errors.cpp"), std::string::npos) << m;
  tessera::detail::set_current_rank(3);
  const std::string r = message_of([] { TESSERA_FAIL("boom"); });
  tessera::detail::set_current_rank(-1);
  EXPECT_NE(r.find("[tessera rank 3]"), std::string::npos) << r;
  const std::string c = message_of([] { TESSERA_CUDA_CHECK(2); });  // cudaErrorMemoryAllocation
  EXPECT_NE(c.find("cudaErrorMemoryAllocation"), std::string::npos) << c;
  const std::string n = message_of([] { TESSERA_NCCL_CHECK(4); });  // ncclInvalidArgument
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
