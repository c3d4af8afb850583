// signal::OverlapComm: a bad configuration is a tessera::Error naming the
// field, raised before any NCCL call (so a null parent is never touched).
#include <gtest/gtest.h>

#include <string>

#include "tessera/runtime/error.hpp"
#include "tessera/signal/overlap_comm.hpp"

namespace tessera::signal {
namespace {

std::string error_of(const OverlapCommConfig& cfg) {
  try {
    OverlapComm c(nullptr, cfg);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(OverlapComm, RejectsBadConfigBeforeTouchingNccl) {
  EXPECT_NE(error_of({0, 0, 0}).find("max_ctas 0"), std::string::npos);
  EXPECT_NE(error_of({65, 0, 0}).find("max_ctas 65"), std::string::npos);
  EXPECT_NE(error_of({8, 9, 0}).find("min_ctas 9"), std::string::npos);
  EXPECT_NE(error_of({8, 0, 9}).find("cga_cluster_size 9"), std::string::npos);
  EXPECT_NE(error_of({8, 0, -1}).find("cga_cluster_size -1"), std::string::npos);
  // A valid config reaches the parent check.
  EXPECT_NE(error_of({16, 0, 0}).find("null parent"), std::string::npos);
}

}  // namespace
}  // namespace tessera::signal
