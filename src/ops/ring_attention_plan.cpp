// The zig-zag ring attention plan (ring_attention.hpp).
#include <algorithm>

#include "tessera/ops/ring_attention.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops {

std::int64_t RingAttnPlan::pairs() const {
  std::int64_t n = 0;
  for (const Step& s : steps)
    for (std::int64_t i = s.row0; i < s.row0 + s.rows; ++i) n += s.causal ? std::min(i + 1, s.kv_len) : s.kv_len;
  return n;
}

RingAttnPlan plan_ring_attention(std::int64_t seq, int world, int rank, bool causal) {
  TESSERA_CHECK(world >= 1, "ring_attention: world = {} must be >= 1", world);
  TESSERA_CHECK(rank >= 0 && rank < world, "ring_attention: rank = {} out of range [0, {})", rank, world);
  TESSERA_CHECK(seq >= 2 * world && seq % (2 * world) == 0,
                "ring_attention: seq = {} must be a positive multiple of 2 x world = {} (zig-zag chunks)", seq,
                2 * world);
  RingAttnPlan p;
  p.rank = rank;
  p.world = world;
  p.seq = seq;
  p.chunk = seq / (2 * world);
  p.causal = causal;
  p.chunks[0] = rank;
  p.chunks[1] = 2 * world - 1 - rank;
  p.send_to = (rank - 1 + world) % world;
  p.recv_from = (rank + 1) % world;
  const std::int64_t C = p.chunk;
  for (int j = 0; j < world; ++j) {
    RingAttnPlan::Step s;
    s.owner = (rank + j) % world;
    if (!causal) {
      s.rows = s.kv_len = 2 * C;
    } else if (j == 0) {
      s.rows = s.kv_len = 2 * C;
      s.causal = true;
    } else if (s.owner < rank) {
      s.rows = 2 * C;  // both Q chunks after KV chunk `owner`; KV chunk 2R-1-owner after both
      s.kv_len = C;
    } else {
      s.row0 = C;  // Q chunk 2R-1-r after both KV chunks; Q chunk r before both
      s.rows = C;
      s.kv_len = 2 * C;
    }
    p.steps.push_back(s);
  }
  return p;
}

}  // namespace tessera::ops
