// The zig-zag ring attention plan (ring_attention.hpp).
#include <algorithm>

#include "seq_parallel_detail.hpp"
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
  const SpAttnPlan z = plan_sp_attention(seq, world, rank, causal);  // the zig-zag shards, checked
  RingAttnPlan p;
  p.rank = rank;
  p.world = world;
  p.seq = seq;
  p.chunk = z.chunk;
  p.causal = causal;
  p.chunks[0] = z.chunks[0];
  p.chunks[1] = z.chunks[1];
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

namespace detail {

std::vector<RingOp> ring_schedule(const RingAttnPlan& plan, RingStrategy s, std::uint64_t e, bool flags) {
  const int R = plan.world;
  TESSERA_CHECK(R > 1 && e >= 1, "ring_schedule: world {} and epoch {} (needs world > 1, epoch >= 1)", R, e);
  auto stamp = [&](int j, std::uint64_t epoch) { return ring_stamp(epoch, j, R); };
  std::vector<RingOp> ops;
  auto add = [&](RingOp::Kind k, bool comm, int step = 0, std::uint64_t value = 0) {
    ops.push_back({k, comm, step, value});
  };
  if (s == RingStrategy::sequential) {
    for (int j = 0; j < R; ++j) {
      if (j + 1 < R) add(RingOp::exchange, false, j);
      add(RingOp::attend, false, j);
    }
  } else if (!flags) {
    // Overlapped without symmetric memory: the NCCL exchange of step j runs
    // on the communication stream during step j's attention. Its receive
    // overwrites local slot (j+1) % 2, last read by step j-1 (or, j < 2, by
    // the previous call, which ended before record_ready).
    add(RingOp::record_ready, false);
    add(RingOp::wait_ready, true);
    for (int j = 0; j < R; ++j) {
      if (j + 1 < R) {
        if (j >= 2) add(RingOp::wait_attend, true, j - 1);
        add(RingOp::exchange, true, j);
        add(RingOp::record_push, true, j);
      }
      if (j >= 1) add(RingOp::wait_push, false, j - 1);
      add(RingOp::attend, false, j);
      if (j >= 1 && j + 3 <= R) add(RingOp::record_attend, false, j);  // awaited by the exchange of step j + 1
    }
    add(RingOp::wait_push, false, R - 2);  // the exchanges read the inputs and the slots
  } else {
    add(RingOp::record_ready, false);
    add(RingOp::wait_ready, true);
    for (int j = 0; j < R; ++j) {
      if (j + 1 < R) {  // forward the held shard into rank r-1's slot (j+1) % 2 while step j computes
        if (j >= 1) add(RingOp::wait_data, true, j, stamp(j, e));
        // That slot was last read at step j-1 of this call, or (j < 2) in
        // the previous call.
        if (j >= 2)
          add(RingOp::wait_control, true, j, stamp(j - 1, e));
        else if (e > 1)
          add(RingOp::wait_control, true, j, stamp(R, e - 1));
        add(RingOp::push, true, j);
        add(RingOp::notify_data, true, j, stamp(j + 1, e));
        add(RingOp::record_push, true, j);
      }
      if (j >= 1) add(RingOp::wait_data, false, j, stamp(j, e));
      add(RingOp::attend, false, j);
      if (j >= 1 && j + 1 < R) {  // slot j % 2 is free once read here and forwarded
        add(RingOp::wait_push, false, j);
        add(RingOp::notify_control, false, j, stamp(j, e));
      }
    }
    // The forwards read the inputs (j = 0) and the slots: the call ends
    // after them.
    add(RingOp::wait_push, false, R - 2);
  }
  // Stamp (e, R): this rank's slots are free for the next call, whichever
  // strategy it uses.
  if (flags) add(RingOp::notify_control, false, R, stamp(R, e));
  return ops;
}

}  // namespace detail

}  // namespace tessera::ops
