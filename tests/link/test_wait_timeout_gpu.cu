// A device-side wait whose notify never comes must end in an error naming
// the wait (rank, tile, channel, expected, seen), not in a hang. The trap
// kills this process's CUDA context, so this binary holds only this test.
#include <gtest/gtest.h>

#include <cstdlib>

#include "support/gpu_group.hpp"
#include "tessera/link/device_primitives.cuh"
#include "tessera/runtime/error.hpp"

using namespace tessera;

namespace {
__global__ void wait_forever(runtime::SignalView sv, link::AllGatherTileMap map, int tile_c) {
  link::consumer_tile_wait(sv, map, tile_c, /*epoch=*/1);
}
}  // namespace

TEST(WaitTimeout, MissingNotifyGivesDiagnosticNotHang) {
  TESSERA_REQUIRE_WORLD_GPUS(1);
  setenv("TESSERA_WAIT_TIMEOUT_MS", "300", 1);
  auto& pg = tessera::testing::group();
  auto map = link::AllGatherTileMap::make(1024, pg.world(), 2, 64, 128);
  runtime::Signals sig(pg, map.num_channels());
  const int tile_c = 3;  // rows 384..511: channel 1 of rank 0 when world == 1
  wait_forever<<<1, 32, 0, pg.stream()>>>(sig.view(), map, tile_c);
  try {
    runtime::synchronize(pg.stream(), &sig.diagnostics(), "missing notify");
    FAIL() << "the wait returned without a notify";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("consumer_tile_wait timed out on rank " + std::to_string(pg.rank())), std::string::npos) << m;
    EXPECT_NE(m.find("tile 3"), std::string::npos) << m;
    EXPECT_NE(m.find("expected >= "), std::string::npos) << m;
  }
}
