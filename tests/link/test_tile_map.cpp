// CPU tests of the tile-centric maps (TileLink §4.1), ragged sizes included.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "tessera/link/tile_map.hpp"
#include "tessera/runtime/error.hpp"

using tessera::link::AllGatherTileMap;
using tessera::link::DynamicTileMap;

namespace {

// Every row in [0, M) is covered by exactly one non-empty producer tile, that
// tile's rank owns the row's shard, and its channel's rows contain it.
void check_producer_side(const AllGatherTileMap& m) {
  std::vector<int> cover(m.M, 0);
  std::vector<int> per_channel(m.num_channels(), 0);
  for (int t = 0; t < m.num_tiles(); ++t) {
    const auto rr = m.shape(t);
    ASSERT_LE(rr.size(), m.tile_m_p) << "tile " << t;
    if (rr.empty()) continue;
    ++per_channel[m.channel(t)];
    const auto cr = m.channel_rows(m.channel(t));
    EXPECT_GE(rr.lo, cr.lo);
    EXPECT_LE(rr.hi, cr.hi);
    EXPECT_EQ(m.channel(t) / m.C, m.rank(t));
    for (auto i = rr.lo; i < rr.hi; ++i) {
      ASSERT_LT(i, m.M);
      ++cover[i];
      EXPECT_EQ(i / m.m_per_rank, m.rank(t)) << "row " << i << " of tile " << t;
      EXPECT_EQ(m.channel_of_row(i), m.channel(t));
    }
    EXPECT_EQ(m.shard_offset(t), rr.lo - m.rank(t) * m.m_per_rank);
  }
  for (std::int64_t i = 0; i < m.M; ++i) ASSERT_EQ(cover[i], 1) << "row " << i;
  for (int c = 0; c < m.num_channels(); ++c) EXPECT_EQ(per_channel[c], m.tiles_in_channel(c)) << "channel " << c;
}

// A consumer tile waits for exactly the channels its rows overlap.
void check_consumer_side(const AllGatherTileMap& m) {
  std::int64_t covered = 0;
  for (int u = 0; u < m.num_consumer_tiles(); ++u) {
    const auto rr = m.consumer_rows(u);
    covered += rr.size();
    const auto cr = m.consumer_channels(u);
    std::vector<bool> needed(m.num_channels(), false);
    for (auto i = rr.lo; i < rr.hi; ++i) needed[m.channel_of_row(i)] = true;
    for (int c = 0; c < m.num_channels(); ++c) {
      const bool in = c >= cr.lo && c < cr.hi;
      // Channels inside the range but with no rows (empty channel of a short
      // shard) are harmless: they expect 0 notifications.
      if (needed[c]) EXPECT_TRUE(in) << "consumer tile " << u << " misses channel " << c;
      if (in && !needed[c]) EXPECT_EQ(m.tiles_in_channel(c), 0) << "consumer tile " << u << " waits on channel " << c;
    }
  }
  EXPECT_EQ(covered, m.M);
}

}  // namespace

TEST(AllGatherTileMap, MatchesTileLinkFormulaWhenDivisible) {
  // TileLink §4.1: src_rank = tile / (M_per_rank / Tm), channel = tile / (M_per_channel / Tm).
  for (int R : {1, 2, 4, 8})
    for (int C : {1, 2, 4}) {
      const int Tm = 128;
      const std::int64_t M = static_cast<std::int64_t>(R) * C * Tm * 3;
      auto m = AllGatherTileMap::make(M, R, C, Tm, 256);
      const std::int64_t mpr = M / R, mpc = M / (R * C);
      ASSERT_EQ(m.num_tiles(), M / Tm);
      for (int t = 0; t < m.num_tiles(); ++t) {
        EXPECT_EQ(m.rank(t), t / (mpr / Tm));
        EXPECT_EQ(m.channel(t), t / (mpc / Tm));
        EXPECT_EQ(m.shape(t).lo, static_cast<std::int64_t>(t) * Tm);
        EXPECT_EQ(m.shape(t).hi, static_cast<std::int64_t>(t) * Tm + Tm);
      }
      check_producer_side(m);
      check_consumer_side(m);
    }
}

TEST(AllGatherTileMap, RaggedShapesCoverEveryRowOnce) {
  std::mt19937 rng(1234);
  for (int R : {1, 2, 3, 4, 8})
    for (int C : {1, 2, 3, 4})
      for (int trial = 0; trial < 6; ++trial) {
        const std::int64_t M = 1 + rng() % 3000;
        const int tp = 1 + rng() % 200, tc = 1 + rng() % 300;
        SCOPED_TRACE(::testing::Message() << "M=" << M << " R=" << R << " C=" << C << " Tp=" << tp << " Tc=" << tc);
        auto m = AllGatherTileMap::make(M, R, C, tp, tc);
        check_producer_side(m);
        check_consumer_side(m);
      }
}

TEST(AllGatherTileMap, MoreRanksThanRows) {
  auto m = AllGatherTileMap::make(3, 8, 2, 4, 4);  // shards of 1 row, five empty
  check_producer_side(m);
  check_consumer_side(m);
  int nonempty = 0;
  for (int c = 0; c < m.num_channels(); ++c) nonempty += m.tiles_in_channel(c);
  EXPECT_EQ(nonempty, 3);
}

TEST(AllGatherTileMap, RejectsBadParameters) {
  EXPECT_THROW(AllGatherTileMap::make(0, 2, 1, 128, 128), tessera::Error);
  EXPECT_THROW(AllGatherTileMap::make(1024, 0, 1, 128, 128), tessera::Error);
  EXPECT_THROW(AllGatherTileMap::make(1024, 2, 0, 128, 128), tessera::Error);
  EXPECT_THROW(AllGatherTileMap::make(1024, 2, 1, 0, 128), tessera::Error);
  EXPECT_THROW(AllGatherTileMap::make(1024, 2, 1, 128, -1), tessera::Error);
  try {
    AllGatherTileMap::make(1024, 2, 1, 0, 128);
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tile heights"), std::string::npos) << e.what();
  }
}

TEST(AllGatherTileMap, TileIdOutsideMapIsAnError) {
  auto m = AllGatherTileMap::make(1000, 2, 2, 64, 128);
  EXPECT_NO_THROW(tessera::link::check_tile(m, 0, "test"));
  EXPECT_NO_THROW(tessera::link::check_tile(m, m.num_tiles() - 1, "test"));
  try {
    tessera::link::check_tile(m, m.num_tiles(), "notify");
    FAIL() << "no error";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tile id " + std::to_string(m.num_tiles())), std::string::npos) << e.what();
  }
  EXPECT_THROW(tessera::link::check_tile(m, -1, "notify"), tessera::Error);
  EXPECT_THROW(tessera::link::check_consumer_tile(m, m.num_consumer_tiles(), "wait"), tessera::Error);
}

TEST(DynamicTileMap, CountsExpectedPerChannelAndValidates) {
  // MoE-like: tokens routed to experts give uneven row ranges per rank.
  std::vector<DynamicTileMap::Tile> tiles = {
      {0, 100, 0, 0}, {100, 160, 0, 0}, {160, 160, 1, 1}, {160, 300, 1, 1}, {300, 301, 1, 2}};
  std::vector<DynamicTileMap::ConsumerTile> cons = {{0, 1}, {0, 2}, {1, 3}};
  DynamicTileMap dm(tiles, cons, 3, 2);
  auto h = dm.host();
  EXPECT_EQ(h.num_tiles(), 5);
  EXPECT_EQ(h.tiles_in_channel(0), 2);
  EXPECT_EQ(h.tiles_in_channel(1), 1);  // the empty tile is not counted
  EXPECT_EQ(h.tiles_in_channel(2), 1);
  EXPECT_EQ(h.rank(3), 1);
  EXPECT_EQ(h.shape(3).lo, 160);
  EXPECT_EQ(h.consumer_channels(2).hi, 3);

  EXPECT_THROW(DynamicTileMap({{0, 10, 2, 0}}, {}, 1, 2), tessera::Error);        // rank outside world
  EXPECT_THROW(DynamicTileMap({{0, 10, 0, 5}}, {}, 1, 2), tessera::Error);        // channel outside
  EXPECT_THROW(DynamicTileMap({{10, 0, 0, 0}}, {}, 1, 2), tessera::Error);        // reversed range
  EXPECT_THROW(DynamicTileMap({{0, 10, 0, 0}}, {{0, 2}}, 1, 2), tessera::Error);  // consumer range outside
}
