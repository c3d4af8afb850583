// Bounded host waits on a real GPU, one process: a
// stream that never drains (a kernel spinning on a host flag stands in for a
// collective whose peer died) makes the bounded wait throw within the
// timeout, naming the rank and the operation, and abort the group (the abort
// itself bounded: ncclCommAbort cannot finish beside a stuck kernel that is
// not NCCL's); the teardown then returns promptly. A healthy group's teardown (the bounded
// finalize) and TESSERA_NO_LSA are checked too.
#include <cuda_runtime.h>
#include <nccl.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"
#include "tessera/runtime/symmetric_heap.hpp"
#include "tessera/runtime/wait_diagnostics.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using tessera::runtime::ProcessGroup;

__global__ void spin_until_set(const volatile unsigned* flag) {
  while (*flag == 0) {
  }
}

tessera::runtime::LaunchInfo single() {
  tessera::runtime::LaunchInfo li;
  li.master_addr = "127.0.0.1";
  li.source = "test";
  return li;
}

bool have_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n >= 1;
}

TEST(BoundedWaitGpu, AStuckStreamTimesOutAbortsTheGroupAndTeardownReturns) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  auto pg = ProcessGroup::create(single());
  unsigned* host_flag = nullptr;
  unsigned* dev_flag = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&host_flag), sizeof(unsigned), cudaHostAllocMapped), cudaSuccess);
  *host_flag = 0;
  ASSERT_EQ(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_flag), host_flag, 0), cudaSuccess);
  spin_until_set<<<1, 1, 0, pg->stream()>>>(dev_flag);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);

  const auto t0 = Clock::now();
  std::string msg;
  try {
    tessera::runtime::bounded_sync(pg->stream(), "the test's stuck wait", pg.get(), nullptr, 300ms);
  } catch (const tessera::Error& e) {
    msg = e.what();
  }
  const auto took = Clock::now() - t0;
  EXPECT_NE(msg.find("the test's stuck wait"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("aborted"), std::string::npos) << msg;
  EXPECT_GE(took, 300ms);
  // Our kernel is not NCCL's: ncclCommAbort cannot finish while it spins,
  // and abort() gives up on it after TESSERA_WAIT_TIMEOUT_MS (default 5 s).
  EXPECT_LT(took, 300ms + std::chrono::nanoseconds(tessera::runtime::wait_timeout_ns()) + 3s);
  EXPECT_TRUE(pg->aborted());

  *static_cast<volatile unsigned*>(host_flag) = 1;  // the "peer" is gone; our own kernel may end
  EXPECT_NO_THROW(tessera::runtime::bounded_sync(pg->stream(), "after the release", nullptr, nullptr, 10s));
  const auto t1 = Clock::now();
  pg.reset();
  EXPECT_LT(Clock::now() - t1, 5s) << "teardown of an aborted group";
  (void)cudaFreeHost(host_flag);
}

TEST(BoundedWaitGpu, AHealthyGroupSynchronizesAndTearsDown) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  auto pg = ProcessGroup::create(single());
  float* x = nullptr;
  ASSERT_EQ(cudaMalloc(&x, sizeof(float)), cudaSuccess);
  ASSERT_EQ(ncclAllReduce(x, x, 1, ncclFloat, ncclSum, pg->nccl(), pg->stream()), ncclSuccess);
  EXPECT_NO_THROW(pg->synchronize(pg->stream(), "one all-reduce"));
  cudaEvent_t ev;
  ASSERT_EQ(cudaEventCreate(&ev), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(ev, pg->comm_stream(0)), cudaSuccess);
  EXPECT_NO_THROW(tessera::runtime::bounded_event_sync(ev, "an event", pg.get()));
  EXPECT_NO_THROW(pg->synchronize_all("every stream"));
  EXPECT_FALSE(pg->aborted());
  (void)cudaEventDestroy(ev);
  (void)cudaFree(x);
  const auto t0 = Clock::now();
  pg.reset();
  EXPECT_LT(Clock::now() - t0, 5s) << "teardown (bounded finalize) of a healthy group";
}

TEST(BoundedWaitGpu, NoLsaIsForcedByTheEnvironment) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  {
    auto pg = ProcessGroup::create(single());
    EXPECT_TRUE(pg->lsa_reachable()) << "one rank reaches itself";
  }
  ::setenv("TESSERA_NO_LSA", "1", 1);
  auto pg = ProcessGroup::create(single());
  ::unsetenv("TESSERA_NO_LSA");
  EXPECT_FALSE(pg->lsa_reachable());
  try {
    tessera::runtime::SymBuffer<float> b(*pg, 16);
    ADD_FAILURE() << "symmetric memory without load/store reach";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("load/store reachable"), std::string::npos) << e.what();
  }
}

}  // namespace
