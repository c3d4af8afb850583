#include "tessera/link/tile_map.hpp"

#include <cuda_runtime_api.h>

#include <cstring>

#include "tessera/runtime/error.hpp"

namespace tessera::link {

AllGatherTileMap AllGatherTileMap::make(std::int64_t M, int R, int C, int tile_m_p, int tile_m_c) {
  TESSERA_CHECK(M > 0, "AllGatherTileMap: M = {} must be positive", M);
  TESSERA_CHECK(R > 0, "AllGatherTileMap: rank count {} must be positive", R);
  TESSERA_CHECK(C > 0, "AllGatherTileMap: channels per rank {} must be positive", C);
  TESSERA_CHECK(tile_m_p > 0 && tile_m_c > 0, "AllGatherTileMap: tile heights ({}, {}) must be positive", tile_m_p,
                tile_m_c);
  AllGatherTileMap m;
  m.M = M;
  m.R = R;
  m.C = C;
  m.tile_m_p = tile_m_p;
  m.tile_m_c = tile_m_c;
  m.m_per_rank = ceil_div(M, R);
  m.m_per_channel = ceil_div(m.m_per_rank, C);
  m.tiles_per_channel = static_cast<int>(ceil_div(m.m_per_channel, tile_m_p));
  TESSERA_CHECK(static_cast<std::int64_t>(R) * C * m.tiles_per_channel < (1LL << 31),
                "AllGatherTileMap: {} tiles overflow a 32-bit tile id",
                static_cast<std::int64_t>(R) * C * m.tiles_per_channel);
  return m;
}

void check_tile(const AllGatherTileMap& map, int tile, const char* what) {
  TESSERA_CHECK(tile >= 0 && tile < map.num_tiles(), "{}: tile id {} outside the map's {} tiles", what, tile,
                map.num_tiles());
}

void check_consumer_tile(const AllGatherTileMap& map, int tile_c, const char* what) {
  TESSERA_CHECK(tile_c >= 0 && tile_c < map.num_consumer_tiles(), "{}: consumer tile id {} outside the map's {} tiles",
                what, tile_c, map.num_consumer_tiles());
}

DynamicTileMap::DynamicTileMap(std::vector<Tile> tiles, std::vector<ConsumerTile> consumers, int nchannels, int world)
    : nchannels_(nchannels) {
  TESSERA_CHECK(nchannels > 0, "DynamicTileMap: channel count {} must be positive", nchannels);
  TESSERA_CHECK(world > 0, "DynamicTileMap: world {} must be positive", world);
  expected_.assign(nchannels, 0);
  for (size_t t = 0; t < tiles.size(); ++t) {
    const Tile& x = tiles[t];
    TESSERA_CHECK(x.lo >= 0 && x.hi >= x.lo, "DynamicTileMap: tile {} has rows [{}, {})", t, x.lo, x.hi);
    TESSERA_CHECK(x.rank >= 0 && x.rank < world, "DynamicTileMap: tile {} rank {} outside [0, {})", t, x.rank, world);
    TESSERA_CHECK(x.channel >= 0 && x.channel < nchannels, "DynamicTileMap: tile {} channel {} outside [0, {})", t,
                  x.channel, nchannels);
    lo_.push_back(x.lo);
    hi_.push_back(x.hi);
    rank_.push_back(x.rank);
    channel_.push_back(x.channel);
    if (x.hi > x.lo) ++expected_[x.channel];
  }
  for (size_t u = 0; u < consumers.size(); ++u) {
    const ConsumerTile& c = consumers[u];
    TESSERA_CHECK(c.channel_lo >= 0 && c.channel_lo <= c.channel_hi && c.channel_hi <= nchannels,
                  "DynamicTileMap: consumer tile {} waits for channels [{}, {}) outside [0, {})", u, c.channel_lo,
                  c.channel_hi, nchannels);
    cons_lo_.push_back(c.channel_lo);
    cons_hi_.push_back(c.channel_hi);
  }
}

DynamicTileMap::~DynamicTileMap() {
  if (dev_) (void)cudaFree(dev_);
}

TableTileMap DynamicTileMap::host() const {
  TableTileMap m;
  m.lo = lo_.data();
  m.hi = hi_.data();
  m.ranks = rank_.data();
  m.channels = channel_.data();
  m.expected = expected_.data();
  m.cons_lo = cons_lo_.data();
  m.cons_hi = cons_hi_.data();
  m.tiles = static_cast<int>(lo_.size());
  m.nchannels = nchannels_;
  m.consumer_tiles = static_cast<int>(cons_lo_.size());
  return m;
}

TableTileMap DynamicTileMap::device() {
  if (dev_) return dev_map_;
  const size_t nt = lo_.size(), nc = cons_lo_.size();
  // One allocation: int64 tables first (8-byte aligned), then the int tables.
  const size_t bytes = nt * 2 * sizeof(std::int64_t) + (nt * 2 + expected_.size() + nc * 2) * sizeof(int) + 16;
  TESSERA_CUDA_CHECK(cudaMalloc(&dev_, bytes));
  std::vector<char> h(bytes);
  size_t off = 0;
  auto put = [&](const void* src, size_t n) {
    if (n) std::memcpy(h.data() + off, src, n);
    const size_t at = off;
    off += n;
    return static_cast<char*>(dev_) + at;
  };
  TableTileMap m = host();
  m.lo = reinterpret_cast<const std::int64_t*>(put(lo_.data(), nt * 8));
  m.hi = reinterpret_cast<const std::int64_t*>(put(hi_.data(), nt * 8));
  m.ranks = reinterpret_cast<const int*>(put(rank_.data(), nt * 4));
  m.channels = reinterpret_cast<const int*>(put(channel_.data(), nt * 4));
  m.expected = reinterpret_cast<const int*>(put(expected_.data(), expected_.size() * 4));
  m.cons_lo = reinterpret_cast<const int*>(put(cons_lo_.data(), nc * 4));
  m.cons_hi = reinterpret_cast<const int*>(put(cons_hi_.data(), nc * 4));
  TESSERA_CUDA_CHECK(cudaMemcpy(dev_, h.data(), bytes, cudaMemcpyHostToDevice));
  dev_map_ = m;
  return m;
}

}  // namespace tessera::link
