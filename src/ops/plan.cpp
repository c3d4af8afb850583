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

MoeTpPlan plan_moe_tp(std::int64_t tokens_local, int topk, int world, int rank) {
  TESSERA_CHECK(world >= 1 && world <= 1024 && rank >= 0 && rank < world, "plan_moe_tp: rank {} / world {} invalid",
                rank, world);
  TESSERA_CHECK(tokens_local >= 0 && topk >= 1, "plan_moe_tp: tokens_local = {}, topk = {} invalid", tokens_local,
                topk);
  MoeTpPlan p;
  p.rank = rank;
  p.world = world;
  p.topk = topk;
  p.tokens_local = tokens_local;
  for (int d = 1; d < world; ++d) {
    p.send_to.push_back((rank + d) % world);
    p.recv_from.push_back((rank - d + world) % world);
  }
  // Part 1: shard r-j arrives at step j; steps after j may still be in flight.
  for (int j = 0; j < world; ++j) p.gate_up.push_back({(rank - j + world) % world, j, j < world - 1});
  // Part 2: shard r+1+j's partial leaves at step j+1; earlier sends may still be in flight.
  for (int j = 0; j < world; ++j) {
    const int shard = (rank + 1 + j) % world;
    p.down.push_back({shard, shard == rank ? 0 : j + 1, j > 0});
  }
  return p;
}

MoeShardOrder moe_shard_expert_order(const std::vector<std::int32_t>& expert_ids, std::int64_t tokens_local, int world,
                                     int experts, int topk) {
  TESSERA_CHECK(world >= 1 && experts >= 1 && topk >= 1 && tokens_local >= 0,
                "moe_shard_expert_order: world {}, experts {}, topk {}, tokens_local {} invalid", world, experts, topk,
                tokens_local);
  const std::int64_t per = tokens_local * topk, entries = per * world;
  TESSERA_CHECK(static_cast<std::int64_t>(expert_ids.size()) == entries,
                "moe_shard_expert_order: {} expert ids for {} entries", expert_ids.size(), entries);
  MoeShardOrder o;
  o.sorted_entry.assign(static_cast<std::size_t>(entries), -1);
  o.entry_row.assign(static_cast<std::size_t>(entries), -1);
  o.group_rows.assign(static_cast<std::size_t>(world) * experts, 0);
  for (int s = 0; s < world; ++s) {
    std::int64_t row = s * per;
    for (int e = 0; e < experts; ++e)
      for (std::int64_t i = s * per; i < (s + 1) * per; ++i)
        if (expert_ids[static_cast<std::size_t>(i)] == e) {
          o.sorted_entry[static_cast<std::size_t>(row)] = static_cast<std::int32_t>(i);
          o.entry_row[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(row);
          ++o.group_rows[static_cast<std::size_t>(s) * experts + e];
          ++row;
        }
  }
  return o;
}

int moe_rs_chunks(std::int64_t hidden, int requested, bool copy_engine) {
  if (requested > 0) {
    TESSERA_CHECK(requested <= kMoeMaxRsChunks, "moe_tp: rs_chunks = {} exceeds {}", requested, kMoeMaxRsChunks);
    TESSERA_CHECK(hidden % requested == 0 && (hidden / requested) % 8 == 0,
                  "moe_tp: rs_chunks = {} must divide hidden = {} into multiples of 8 columns", requested, hidden);
    return requested;
  }
  TESSERA_CHECK(requested == 0, "moe_tp: rs_chunks = {} must be >= 0 (0: automatic)", requested);
  if (copy_engine) return 1;
  for (int c : {4, 2})
    if (hidden % c == 0 && hidden / c >= 1024 && (hidden / c) % 64 == 0) return c;
  return 1;
}

CallStart flag_call_start(bool has_flags, std::optional<unsigned long long> capture, bool captured,
                          unsigned long long reset_capture) {
  CallStart r{false, captured, reset_capture};
  if (!has_flags) return r;
  if (capture) {
    r.captured = true;
    r.reset = *capture != reset_capture;
    r.reset_capture = *capture;
  } else {
    r.reset = captured;
  }
  return r;
}

int rs_copy_chunk_bands(std::size_t band_bytes, int owner_bands, std::size_t target_bytes) {
  TESSERA_CHECK(owner_bands >= 1, "rs_copy_chunk_bands: {} bands", owner_bands);
  if (target_bytes == 0 || band_bytes == 0) return 1;
  const std::size_t want = (target_bytes + band_bytes - 1) / band_bytes;
  return static_cast<int>(std::min<std::size_t>(want, static_cast<std::size_t>(owner_bands)));
}

}  // namespace tessera::ops
