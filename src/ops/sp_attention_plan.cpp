// The zig-zag sequence-parallel attention plan (sp_attention.hpp).
#include "tessera/ops/sp_attention.hpp"

#include <algorithm>

#include "tessera/runtime/error.hpp"

namespace tessera::ops {

std::int64_t SpAttnPlan::pairs() const {
  std::int64_t n = 0;
  for (const Part& p : parts)
    for (std::int64_t i = 0; i < p.rows; ++i)
      n += causal ? std::clamp<std::int64_t>(p.q_offset + i + 1, 0, p.kv_len) : p.kv_len;
  return n;
}

SpAttnPlan plan_sp_attention(std::int64_t seq, int world, int rank, bool causal) {
  TESSERA_CHECK(world >= 1, "sp_attention: world = {} must be >= 1", world);
  TESSERA_CHECK(rank >= 0 && rank < world, "sp_attention: rank = {} out of range [0, {})", rank, world);
  TESSERA_CHECK(seq >= 2 * world && seq % (2 * world) == 0,
                "sp_attention: sequence length {} must be a positive multiple of 2 x world = {} (zig-zag chunks)", seq,
                2 * world);
  SpAttnPlan p;
  p.rank = rank;
  p.world = world;
  p.seq = seq;
  p.chunk = seq / (2 * world);
  p.causal = causal;
  p.chunks[0] = rank;
  p.chunks[1] = 2 * world - 1 - rank;
  if (causal) {
    for (int i = 0; i < 2; ++i)
      p.parts.push_back({i * p.chunk, p.chunk, p.chunks[i] * p.chunk, (p.chunks[i] + 1) * p.chunk});
  } else {
    p.parts.push_back({0, 2 * p.chunk, 0, seq});
  }
  p.recv_from.push_back(rank);
  for (int j = 1; j < world; ++j) {
    p.push_to.push_back((rank - j + world) % world);
    p.recv_from.push_back((rank + j) % world);
  }
  return p;
}

}  // namespace tessera::ops
