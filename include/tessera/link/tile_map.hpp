// tessera/link/tile_map.hpp — tile-centric maps (TileLink §4.1): which rows
// a communication tile covers (f_S), which rank holds them (f_R) and which
// channel / barrier counts them (f_C), plus the consumer side: which
// channels a computation tile must wait for.
//
// Two kinds, one interface (usable on host and device):
//   AllGatherTileMap — static affine map: A [M, K] sharded by rows over R
//                      ranks, each shard split into C channels, channels cut
//                      into producer tiles of tile_m_p rows; the consumer
//                      (GEMM) uses its own tile height tile_m_c.
//   TableTileMap     — dynamic lookup tables (f_S_low, f_S_high, f_R, f_C)
//                      filled at run time, e.g. from MoE routing.
//
// Ragged sizes: shards are ceil(M/R) rows (the last may be shorter or
// empty), channels ceil(shard/C) rows, and a producer tile never straddles a
// channel or a shard, so every channel's tile count is exact. Tiles whose
// range is empty (short last shard) still exist and count as notified-free:
// tiles_in_channel() excludes them.
//
// Host calls validate and throw tessera::Error (tile id outside the map);
// device calls are unchecked for speed — the link primitives check ids.
#pragma once

#include <cstdint>

#include "tessera/runtime/dtype.hpp"
#include "tessera/runtime/host_device.hpp"

namespace tessera::link {

/// Half-open row range [lo, hi).
struct RowRange {
  std::int64_t lo = 0, hi = 0;
  TESSERA_HD std::int64_t size() const { return hi > lo ? hi - lo : 0; }
  TESSERA_HD bool empty() const { return hi <= lo; }
};

/// Half-open channel range [lo, hi).
struct ChannelRange {
  int lo = 0, hi = 0;
};

TESSERA_HD std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
TESSERA_HD std::int64_t min64(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
TESSERA_HD std::int64_t max64(std::int64_t a, std::int64_t b) { return a > b ? a : b; }

/// TileLink's static affine map for AllGather (pull or push) feeding a GEMM.
struct AllGatherTileMap {
  std::int64_t M = 0;  ///< total rows of the gathered A
  int R = 1;           ///< ranks
  int C = 1;           ///< channels per rank
  int tile_m_p = 128;  ///< producer (communication) tile rows
  int tile_m_c = 128;  ///< consumer (computation) tile rows
  // Derived (call make()).
  std::int64_t m_per_rank = 0;     ///< ceil(M / R)
  std::int64_t m_per_channel = 0;  ///< ceil(m_per_rank / C)
  int tiles_per_channel = 0;       ///< ceil(m_per_channel / tile_m_p)

  /// Validated constructor (host): throws tessera::Error on bad parameters.
  static AllGatherTileMap make(std::int64_t M, int R, int C, int tile_m_p, int tile_m_c);

  // ---- producer side: f_S, f_R, f_C over producer tiles --------------------
  TESSERA_HD int num_tiles() const { return R * C * tiles_per_channel; }
  TESSERA_HD int num_channels() const { return R * C; }
  /// f_R: the rank whose shard holds the tile's rows.
  TESSERA_HD int rank(int tile) const { return tile / (C * tiles_per_channel); }
  /// f_C: global channel id (rank * C + local channel).
  TESSERA_HD int channel(int tile) const { return tile / tiles_per_channel; }
  /// f_S: the tile's rows in the gathered A (may be empty for a short last shard).
  TESSERA_HD RowRange shape(int tile) const {
    const int ch = channel(tile);
    const int r = ch / C, c = ch % C, k = tile % tiles_per_channel;
    const std::int64_t shard_lo = r * m_per_rank;
    const std::int64_t shard_hi = min64(shard_lo + m_per_rank, M);
    const std::int64_t ch_lo = shard_lo + c * m_per_channel;
    const std::int64_t ch_hi = min64(ch_lo + m_per_channel, shard_hi);
    const std::int64_t lo = ch_lo + static_cast<std::int64_t>(k) * tile_m_p;
    return RowRange{min64(lo, ch_hi), min64(lo + tile_m_p, ch_hi)};
  }
  /// Rows of a channel.
  TESSERA_HD RowRange channel_rows(int ch) const {
    const int r = ch / C, c = ch % C;
    const std::int64_t shard_lo = r * m_per_rank;
    const std::int64_t shard_hi = min64(shard_lo + m_per_rank, M);
    const std::int64_t lo = min64(shard_lo + c * m_per_channel, shard_hi);
    return RowRange{lo, min64(lo + m_per_channel, shard_hi)};
  }
  /// Non-empty producer tiles in a channel: the count a consumer waits for
  /// per epoch.
  TESSERA_HD int tiles_in_channel(int ch) const {
    return static_cast<int>(ceil_div(channel_rows(ch).size(), tile_m_p));
  }
  /// Offset of the tile's rows inside its source rank's shard.
  TESSERA_HD std::int64_t shard_offset(int tile) const { return shape(tile).lo - rank(tile) * m_per_rank; }

  // ---- consumer side ---------------------------------------------------------
  TESSERA_HD int num_consumer_tiles() const { return static_cast<int>(ceil_div(M, tile_m_c)); }
  TESSERA_HD RowRange consumer_rows(int tile_c) const {
    const std::int64_t lo = static_cast<std::int64_t>(tile_c) * tile_m_c;
    return RowRange{lo, min64(lo + tile_m_c, M)};
  }
  /// Channel containing row m (0 <= m < M).
  TESSERA_HD int channel_of_row(std::int64_t m) const {
    const int r = static_cast<int>(m / m_per_rank);
    const int c = static_cast<int>((m - r * m_per_rank) / m_per_channel);
    return r * C + c;
  }
  /// Channels a consumer tile must wait for: all channels overlapping its rows.
  TESSERA_HD ChannelRange consumer_channels(int tile_c) const {
    const RowRange rr = consumer_rows(tile_c);
    if (rr.empty()) return ChannelRange{0, 0};
    return ChannelRange{channel_of_row(rr.lo), channel_of_row(rr.hi - 1) + 1};
  }
};

/// Dynamic map: lookup tables in device (or host) memory, filled at run time.
/// Tile t covers rows [lo[t], hi[t]) of rank[t], counted by channel[t].
/// The consumer side is a table too: consumer tile u waits for channels
/// [cons_lo[u], cons_hi[u]); expected[ch] is the per-epoch count of channel ch.
struct TableTileMap {
  const std::int64_t* lo = nullptr;
  const std::int64_t* hi = nullptr;
  const int* ranks = nullptr;
  const int* channels = nullptr;
  const int* expected = nullptr;
  const int* cons_lo = nullptr;
  const int* cons_hi = nullptr;
  int tiles = 0;
  int nchannels = 0;
  int consumer_tiles = 0;

  TESSERA_HD int num_tiles() const { return tiles; }
  TESSERA_HD int num_channels() const { return nchannels; }
  TESSERA_HD int rank(int t) const { return ranks[t]; }
  TESSERA_HD int channel(int t) const { return channels[t]; }
  TESSERA_HD RowRange shape(int t) const { return RowRange{lo[t], hi[t]}; }
  TESSERA_HD int tiles_in_channel(int ch) const { return expected[ch]; }
  TESSERA_HD int num_consumer_tiles() const { return consumer_tiles; }
  TESSERA_HD ChannelRange consumer_channels(int u) const { return ChannelRange{cons_lo[u], cons_hi[u]}; }
};

// ---- host-side checked access --------------------------------------------
/// Throws tessera::Error unless 0 <= tile < map.num_tiles().
void check_tile(const AllGatherTileMap& map, int tile, const char* what);
void check_consumer_tile(const AllGatherTileMap& map, int tile_c, const char* what);

}  // namespace tessera::link

#include <vector>

namespace tessera::link {

/// Owner of a TableTileMap's tables: built on the host from per-tile
/// entries, validated, uploaded to the device.
class DynamicTileMap {
 public:
  struct Tile {
    std::int64_t lo, hi;
    int rank, channel;
  };
  struct ConsumerTile {
    int channel_lo, channel_hi;
  };
  /// Validates (ranges non-negative and ordered, rank in [0, world), channel
  /// in [0, nchannels), consumer channel ranges inside [0, nchannels)) and
  /// computes expected[] as the count of non-empty tiles per channel.
  DynamicTileMap(std::vector<Tile> tiles, std::vector<ConsumerTile> consumers, int nchannels, int world);
  ~DynamicTileMap();
  DynamicTileMap(const DynamicTileMap&) = delete;
  DynamicTileMap& operator=(const DynamicTileMap&) = delete;

  /// Host tables (for CPU use and tests).
  TableTileMap host() const;
  /// Device tables; uploaded on first call (synchronously).
  TableTileMap device();

 private:
  std::vector<std::int64_t> lo_, hi_;
  std::vector<int> rank_, channel_, expected_, cons_lo_, cons_hi_;
  int nchannels_;
  void* dev_ = nullptr;
  TableTileMap dev_map_{};
};

}  // namespace tessera::link
