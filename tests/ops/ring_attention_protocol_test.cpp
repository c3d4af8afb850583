// CPU model of ring attention's flag protocol: R ranks, each with a compute
// and a communication stream, run the operations ring_schedule() emits for a
// sequence of calls (the same strategies on every rank, as collectives are
// called), interleaved at random. Streams run in order; waits block on flags
// or events; an NCCL exchange completes once both neighbours reached it.
// Checked at every operation:
//   - a step attends, and a forward pushes, the shard of the right owner and
//     call (slot contents are tracked);
//   - nothing overwrites a slot before its shard was attended and, where it
//     is forwarded, forwarded (no push lands in a slot still being read);
//   - flags only grow; a call ends after its pushes (the inputs are free);
//   - no interleaving deadlocks.
// Without flags (no symmetric memory) the overlapped schedule's exchanges
// run on the communication stream, ordered by events. A schedule without
// its control, data or event waits must be caught (the model has teeth).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "ops/seq_parallel_detail.hpp"
#include "tessera/ops/ring_attention.hpp"
#include "tessera/runtime/error.hpp"

using namespace tessera::ops;
using detail::RingOp;

namespace {

struct Slot {
  bool valid = false;
  std::uint64_t epoch = 0;
  int step = 0;
  bool attended = false, forwarded = false, needs_forward = false;
};

struct TaggedOp {
  RingOp op;
  std::uint64_t epoch;
  int call;
  bool last_of_call;  ///< the call's last compute-stream operation
};

struct RankState {
  std::vector<TaggedOp> q[2];  ///< 0: compute, 1: communication
  std::size_t pc[2] = {0, 0};
  std::uint64_t data_flag = 0, control_flag = 0;
  Slot slot[2];
};

/// Runs the calls on `world` ranks in one random interleaving; returns an
/// error description or "".
std::string simulate(int world, const std::vector<RingStrategy>& calls, bool flags, std::uint64_t seed,
                     int drop_kind = -1) {
  std::vector<RankState> rs(static_cast<std::size_t>(world));
  const std::int64_t seq = 4 * world;
  for (int r = 0; r < world; ++r) {
    const RingAttnPlan plan = plan_ring_attention(seq, world, r, false);
    for (std::size_t c = 0; c < calls.size(); ++c) {
      const std::uint64_t e = c + 1;
      const auto ops = detail::ring_schedule(plan, calls[c], e, flags);
      std::size_t last_compute = 0;
      for (std::size_t i = 0; i < ops.size(); ++i)
        if (!ops[i].comm) last_compute = i;
      for (std::size_t i = 0; i < ops.size(); ++i) {
        if (ops[i].kind == drop_kind) continue;
        rs[r].q[ops[i].comm].push_back({ops[i], e, static_cast<int>(c), i == last_compute});
      }
    }
  }
  auto prev = [&](int r) { return (r - 1 + world) % world; };
  auto next = [&](int r) { return (r + 1) % world; };
  // Has rank r reached (or passed) the exchange of (epoch, step), on whichever stream runs it?
  auto reached_exchange = [&](int r, std::uint64_t e, int j) {
    const RankState& x = rs[r];
    for (int s = 0; s < 2; ++s)
      for (std::size_t i = 0; i < x.q[s].size(); ++i) {
        const TaggedOp& t = x.q[s][i];
        if (t.op.kind == RingOp::exchange && t.epoch == e && t.op.step == j) return x.pc[s] >= i;
      }
    return false;
  };
  // Has stream `s` of rank r executed the op of `kind` (epoch, step)?
  auto executed = [&](int r, int s, RingOp::Kind kind, std::uint64_t e, int j) {
    const RankState& x = rs[r];
    for (std::size_t i = 0; i < x.pc[s]; ++i) {
      const TaggedOp& t = x.q[s][i];
      if (t.op.kind == kind && t.epoch == e && t.op.step == j) return true;
    }
    return false;
  };
  auto held_ok = [&](int r, std::uint64_t e, int j, std::string* err, const char* what) {
    if (j == 0) return true;  // the call's inputs
    const Slot& s = rs[r].slot[j % 2];
    if (!s.valid || s.epoch != e || s.step != j) {
      *err = "rank " + std::to_string(r) + " " + what + " at call " + std::to_string(e) + " step " + std::to_string(j) +
             " finds slot " + std::to_string(j % 2) + " holding call " + std::to_string(s.epoch) + " step " +
             std::to_string(s.step) + (s.valid ? "" : " (empty)");
      return false;
    }
    return true;
  };
  auto write_slot = [&](int r, std::uint64_t e, int j, std::string* err, const char* what) {
    Slot& s = rs[r].slot[j % 2];
    if (s.valid && (!s.attended || (s.needs_forward && !s.forwarded))) {
      *err = std::string(what) + " of call " + std::to_string(e) + " step " + std::to_string(j) + " overwrites slot " +
             std::to_string(j % 2) + " of rank " + std::to_string(r) + " holding call " + std::to_string(s.epoch) +
             " step " + std::to_string(s.step) + (s.attended ? " not yet forwarded" : " not yet attended");
      return false;
    }
    s = Slot{true, e, j, false, false, j + 1 < world};
    return true;
  };

  std::mt19937_64 rng(seed);
  for (;;) {
    std::vector<std::pair<int, int>> ready;
    bool all_done = true;
    for (int r = 0; r < world; ++r)
      for (int s = 0; s < 2; ++s) {
        RankState& x = rs[r];
        if (x.pc[s] >= x.q[s].size()) continue;
        all_done = false;
        const TaggedOp& t = x.q[s][x.pc[s]];
        bool ok = true;
        switch (t.op.kind) {
          case RingOp::wait_ready:
            ok = executed(r, 0, RingOp::record_ready, t.epoch, 0);
            break;
          case RingOp::wait_data:
            ok = x.data_flag >= t.op.value;
            break;
          case RingOp::wait_control:
            ok = x.control_flag >= t.op.value;
            break;
          case RingOp::wait_push:
            ok = executed(r, 1, RingOp::record_push, t.epoch, t.op.step);
            break;
          case RingOp::wait_attend:
            ok = executed(r, 0, RingOp::record_attend, t.epoch, t.op.step);
            break;
          case RingOp::exchange:
            ok = reached_exchange(prev(r), t.epoch, t.op.step) && reached_exchange(next(r), t.epoch, t.op.step);
            break;
          default:
            break;
        }
        if (ok) ready.push_back({r, s});
      }
    if (all_done) return "";
    if (ready.empty()) {
      std::string d = "deadlock:";
      for (int r = 0; r < world; ++r)
        for (int s = 0; s < 2; ++s)
          if (rs[r].pc[s] < rs[r].q[s].size()) {
            const TaggedOp& t = rs[r].q[s][rs[r].pc[s]];
            d += " rank " + std::to_string(r) + (s ? " comm" : " compute") + " at op " +
                 std::to_string(static_cast<int>(t.op.kind)) + " call " + std::to_string(t.epoch) + " step " +
                 std::to_string(t.op.step) + ";";
          }
      return d;
    }
    const auto [r, s] = ready[rng() % ready.size()];
    RankState& x = rs[r];
    const TaggedOp& t = x.q[s][x.pc[s]];
    const int j = t.op.step;
    std::string err;
    switch (t.op.kind) {
      case RingOp::push: {
        if (!held_ok(r, t.epoch, j, &err, "forward")) return err;
        if (j > 0) x.slot[j % 2].forwarded = true;
        if (!write_slot(prev(r), t.epoch, j + 1, &err, "push")) return err;
        break;
      }
      case RingOp::exchange: {
        if (!held_ok(r, t.epoch, j, &err, "exchange send")) return err;
        if (j > 0) x.slot[j % 2].forwarded = true;
        if (!write_slot(r, t.epoch, j + 1, &err, "exchange receive")) return err;
        break;
      }
      case RingOp::attend:
        if (!held_ok(r, t.epoch, j, &err, "attend")) return err;
        if (j > 0) x.slot[j % 2].attended = true;
        break;
      case RingOp::notify_data: {
        std::uint64_t& f = rs[prev(r)].data_flag;
        if (t.op.value <= f) return "data flag of rank " + std::to_string(prev(r)) + " does not grow";
        f = t.op.value;
        break;
      }
      case RingOp::notify_control: {
        std::uint64_t& f = rs[next(r)].control_flag;
        if (t.op.value <= f) return "control flag of rank " + std::to_string(next(r)) + " does not grow";
        f = t.op.value;
        break;
      }
      default:
        break;
    }
    if (s == 0 && t.last_of_call)  // the call is over for the caller: its pushes must be done
      for (const TaggedOp& u : x.q[1])
        if (u.call == t.call && (u.op.kind == RingOp::push || u.op.kind == RingOp::exchange) &&
            !executed(r, 1, u.op.kind, u.epoch, u.op.step))
          return "rank " + std::to_string(r) + " ends call " + std::to_string(t.epoch) +
                 " before its transfer of step " + std::to_string(u.op.step);
    ++x.pc[s];
  }
}

}  // namespace

TEST(RingAttentionProtocol, RandomInterleavingsOfMixedStrategies) {
  std::mt19937_64 pick(42);
  for (int world : {2, 3, 4, 5, 8})
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<RingStrategy> calls;
      for (int c = 0; c < 6; ++c) calls.push_back(pick() % 2 ? RingStrategy::overlapped : RingStrategy::sequential);
      if (trial == 0) calls.assign(6, RingStrategy::overlapped);
      const std::string err = simulate(world, calls, true, pick());
      ASSERT_EQ(err, "") << "world " << world << " trial " << trial;
    }
}

// Without symmetric memory (no flags): sequential, and overlapped by NCCL on
// the communication stream, mixed.
TEST(RingAttentionProtocol, WithoutFlags) {
  std::mt19937_64 pick(7);
  for (int world : {2, 3, 4, 5, 8})
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<RingStrategy> calls;
      for (int c = 0; c < 6; ++c) calls.push_back(pick() % 2 ? RingStrategy::overlapped : RingStrategy::sequential);
      ASSERT_EQ(simulate(world, calls, false, pick()), "") << "world " << world << " trial " << trial;
    }
}

TEST(RingAttentionProtocol, ModelCatchesMissingWaits) {
  for (RingOp::Kind k : {RingOp::wait_control, RingOp::wait_data, RingOp::wait_push}) {
    int caught = 0;
    for (std::uint64_t seed = 0; seed < 200; ++seed)
      caught += simulate(4, std::vector<RingStrategy>(4, RingStrategy::overlapped), true, seed, k) != "";
    EXPECT_GT(caught, 0) << "dropping every wait of kind " << k << " went unnoticed in 200 interleavings";
  }
  for (RingOp::Kind k : {RingOp::wait_attend, RingOp::wait_push, RingOp::wait_ready}) {
    int caught = 0;
    for (std::uint64_t seed = 0; seed < 200; ++seed)
      caught += simulate(4, std::vector<RingStrategy>(4, RingStrategy::overlapped), false, seed, k) != "";
    EXPECT_GT(caught, 0) << "without flags, dropping every wait of kind " << k << " went unnoticed";
  }
}

TEST(RingAttentionProtocol, ScheduleShape) {
  const RingAttnPlan plan = plan_ring_attention(16, 4, 1, true);
  const auto ops = detail::ring_schedule(plan, RingStrategy::overlapped, 3, true);
  int pushes = 0, attends = 0;
  for (const RingOp& op : ops) {
    pushes += op.kind == RingOp::push;
    attends += op.kind == RingOp::attend;
    EXPECT_EQ(op.comm, op.kind == RingOp::push || op.kind == RingOp::wait_ready || op.kind == RingOp::record_push ||
                           op.kind == RingOp::notify_data ||
                           (op.comm && (op.kind == RingOp::wait_data || op.kind == RingOp::wait_control)));
  }
  EXPECT_EQ(pushes, 3);
  EXPECT_EQ(attends, 4);
  EXPECT_EQ(ops.back().kind, RingOp::notify_control);
  EXPECT_EQ(ops.back().value, detail::ring_stamp(3, 4, 4));
  int exchanges = 0;
  for (const RingOp& op : detail::ring_schedule(plan, RingStrategy::overlapped, 3, false)) {
    EXPECT_NE(op.kind, RingOp::push);
    EXPECT_NE(op.kind, RingOp::notify_control);
    if (op.kind == RingOp::exchange) {
      EXPECT_TRUE(op.comm);
      ++exchanges;
    }
  }
  EXPECT_EQ(exchanges, 3);
  EXPECT_THROW(detail::ring_schedule(plan_ring_attention(16, 1, 0, true), RingStrategy::sequential, 1, true),
               tessera::Error);
}
