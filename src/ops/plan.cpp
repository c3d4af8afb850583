// Communication and tile plans of the TP-MLP operators (host only).
#include "tessera/ops/plan.hpp"

#include <algorithm>
#include <numeric>

#include "tessera/runtime/error.hpp"

namespace tessera::ops {

AgPlan plan_ag(std::int64_t m, int world, int rank, int channels, int tile_m) {
  TESSERA_CHECK(world >= 1 && rank >= 0 && rank < world, "plan_ag: rank {} / world {} invalid", rank, world);
  TESSERA_CHECK(channels >= 1 && channels <= kMaxChannels, "plan_ag: channels = {} outside [1, {}]", channels,
                kMaxChannels);
  TESSERA_CHECK(tile_m > 0, "plan_ag: tile_m = {} must be positive", tile_m);
  AgPlan p;
  p.rank = rank;
  p.world = world;
  p.shards = shard_rows(m, world);
  p.channels = channels;
  p.tile_m = tile_m;
  // Producer tiles = whole channels: one flag per channel chunk.
  const std::int64_t per_channel = (p.shards.per_rank + channels - 1) / channels;
  p.map = link::AllGatherTileMap::make(m, world, channels, static_cast<int>(per_channel > 0 ? per_channel : 1), tile_m);
  p.rotate_m = static_cast<int>(p.shards.lo(rank) / tile_m);
  for (int j = 1; j < world; ++j) p.push_to.push_back((rank - j + world) % world);
  for (int j = 0; j < world; ++j) p.recv_from.push_back((rank + j) % world);
  return p;
}

int RsPlan::first_owner(int t) const {
  return static_cast<int>((static_cast<std::int64_t>(t) * tile_m) / shards.per_rank);
}

int RsPlan::last_owner(int t, std::int64_t m) const {
  const std::int64_t last_row = std::min<std::int64_t>(static_cast<std::int64_t>(t + 1) * tile_m, m) - 1;
  return static_cast<int>(last_row / shards.per_rank);
}

int RsPlan::owner_raster_group() const {
  const std::int64_t q = shards.per_rank / tile_m;  // tile rows per shard
  return static_cast<int>(std::max<std::int64_t>(1, std::gcd(std::gcd(std::int64_t{8}, q), std::int64_t{tiles_m})));
}

RsPlan plan_rs(std::int64_t m, std::int64_t n, int world, int rank, int tile_m, int tile_n) {
  TESSERA_CHECK(world >= 1 && rank >= 0 && rank < world, "plan_rs: rank {} / world {} invalid", rank, world);
  TESSERA_CHECK(tile_m > 0 && tile_n > 0, "plan_rs: tile {}x{} invalid", tile_m, tile_n);
  TESSERA_CHECK(m >= 1 && n >= 1, "plan_rs: M = {}, N = {} must be positive", m, n);
  RsPlan p;
  p.rank = rank;
  p.world = world;
  p.shards = shard_rows(m, world);
  p.tile_m = tile_m;
  p.tile_n = tile_n;
  p.tiles_m = static_cast<int>((m + tile_m - 1) / tile_m);
  p.tiles_n = static_cast<int>((n + tile_n - 1) / tile_n);
  p.rotate_m = static_cast<int>(p.shards.lo((rank + 1) % world) / tile_m);
  p.ld_recv = (n + 7) / 8 * 8;
  const std::int64_t lo = p.shards.lo(rank), hi = lo + p.shards.rows(m, rank);
  p.own_tile_lo = static_cast<int>(lo / tile_m);
  p.own_tile_hi = static_cast<int>((hi + tile_m - 1) / tile_m);
  return p;
}

std::int64_t RingRsPlan::chunk_rows_max(int s) const {
  const std::int64_t rows = shards.rows(m, s);
  return (rows + channels - 1) / channels;
}

std::int64_t RingRsPlan::chunk_lo(int s, int c) const {
  return std::min<std::int64_t>(static_cast<std::int64_t>(c) * chunk_rows_max(s), shards.rows(m, s));
}

std::int64_t RingRsPlan::chunk_rows(int s, int c) const {
  const std::int64_t hi =
      std::min<std::int64_t>(static_cast<std::int64_t>(c + 1) * chunk_rows_max(s), shards.rows(m, s));
  return hi - chunk_lo(s, c);
}

std::uint64_t RingRsPlan::flag_value(std::uint64_t epoch, int step, int channel) {
  TESSERA_CHECK(epoch >= 1, "ring flag_value: epoch {} must be >= 1", epoch);
  TESSERA_CHECK(step >= 1 && step < kRingMaxWorld, "ring flag_value: receive step {} outside [1, {})", step,
                kRingMaxWorld);
  TESSERA_CHECK(channel >= 0 && channel < kMaxChannels, "ring flag_value: channel {} outside [0, {})", channel,
                kMaxChannels);
  return epoch * kRingEpochStride + static_cast<std::uint64_t>(step - 1) * kMaxChannels +
         static_cast<std::uint64_t>(channel) + 1;
}

RingRsPlan plan_ring_rs(std::int64_t m, std::int64_t n, int world, int rank, int channels) {
  TESSERA_CHECK(world >= 1 && world <= kRingMaxWorld && rank >= 0 && rank < world,
                "plan_ring_rs: rank {} / world {} invalid (world <= {})", rank, world, kRingMaxWorld);
  TESSERA_CHECK(channels >= 1 && channels <= kMaxChannels, "plan_ring_rs: channels = {} outside [1, {}]", channels,
                kMaxChannels);
  TESSERA_CHECK(m >= 1 && n >= 1, "plan_ring_rs: M = {}, N = {} must be positive", m, n);
  RingRsPlan p;
  p.rank = rank;
  p.world = world;
  p.channels = channels;
  p.m = m;
  p.shards = shard_rows(m, world);
  TESSERA_CHECK(p.shards.rows(m, world - 1) > 0, "plan_ring_rs: M = {} leaves an empty shard over {} ranks", m, world);
  p.ld_recv = (n + 7) / 8 * 8;
  p.send_to = (rank - 1 + world) % world;
  p.recv_from = (rank + 1) % world;
  for (int j = 0; j < world; ++j) {
    RingRsStep s;
    s.shard = (rank + j + 1) % world;
    s.receives = j > 0;
    s.sends = j < world - 1;
    p.steps.push_back(s);
  }
  return p;
}

}  // namespace tessera::ops
