// tessera/commir/plan.hpp — a lowered CommIR schedule: for every rank an
// ordered list of local compute steps and communication steps, plus the
// static per-rank memory footprint.
//
// Lowering rules (Mercury §4.2, §7.3), per mesh level with parallel loop P:
//  read buffer X
//   - indexed by P's axes, no placement       -> partitioned, local
//   - not indexed, no placement / replicate    -> replicated, local
//   - shard along an axis, X not indexed by P  -> AllGather (prologue)
//   - shard along an axis, X indexed by P      -> AllToAll (prologue; Ulysses)
//   - shard along loop L shifted by P           -> P2P from the neighbour that
//     used the block one iteration of L earlier (offset +1 on P's level,
//     derived from (l+1)+p = l+(p+1)); ring passes, overlapped with compute
//   - shard along a sequential loop L in lockstep -> Broadcast per iteration
//   - anything else a step needs                 -> P2P from an owner (fallback)
//  write buffer Y, P a reduction loop
//   - default / replicate                       -> AllReduce (epilogue)
//   - shard along an axis or unshifted loop     -> ReduceScatter (epilogue)
//   - shard along loop L shifted by P            -> partials passed along the
//     ring each iteration (rank i+1 -> i); when no input rides that ring the
//     shift runs (j + i + 1) mod J, so the last iteration on rank i computes
//     its own cell and the result needs no move; otherwise (j + i) mod J and
//     one P2P to the owner in the epilogue
//  write buffer Y, P spatial: shard along another axis -> AllToAll;
//   replicate -> AllGather (epilogue). P2P fallback for any remaining gap.
//
// Step order within time t on a rank (deadlock-free: a receive at t only
// waits on sends posted before t, or on owner sends that wait on nothing):
// pre-sends, collectives, receives, forward sends, compute, partial sends, frees.
// Time -1 is the prologue, time T (steps_per_rank) the epilogue collectives,
// T + 1 the P2P fallback of the epilogue (partials settled at a holder, and
// final pieces from ranks that held them before T + 1), T + 2 the final
// pieces forwarded by ranks that received them at T + 1 (only when needed);
// the finalize step comes last.
// A prologue collective whose group cannot supply what a member needs (shards
// on several levels that do not nest) is refused naming the placements.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessera/commir/ir.hpp"

namespace tessera::commir {

/// Per-dimension ranges: over grid axes for compute steps, over buffer
/// dimensions for data.
struct Box {
  std::vector<Range> r;
  bool operator==(const Box&) const = default;
  std::int64_t volume() const;
  bool contains(const Box& b) const;
  bool intersects(const Box& b) const;
  Box intersect(const Box& b) const;
};
using Region = std::vector<Box>;  // disjoint boxes
std::int64_t volume(const Region& r);
/// True when the union of `have` covers `b` (boxes of `have` disjoint).
bool covers(const Region& have, const Box& b);
std::string box_text(const Box& b);

enum class StepKind { compute, send, recv, collective, free_block, finalize };
enum class Slot { pre_send = 0, collective = 1, recv = 2, send = 3, compute = 4, partial_send = 5, free = 6 };
enum class CollKind { all_gather, all_to_all, broadcast, all_reduce, reduce_scatter };
std::string_view coll_name(CollKind k);

struct Step {
  StepKind kind = StepKind::compute;
  int time = 0;
  Slot slot = Slot::compute;
  std::string buffer;
  Box box;               // compute: grid axes; send/recv/free: buffer dims
  int peer = -1;         // send/recv
  int tag = 0;           // send/recv match key; collective id
  bool partial = false;  // accumulator (moved, merged on arrival)
  CollKind coll = CollKind::all_gather;
  std::vector<int> group;  // collective members (ascending ranks)
  int root = -1;           // broadcast
  Region before, after;    // collective: this rank's data before / after
  std::int64_t bytes = 0;  // payload bytes this rank sends + receives
  int level = -1;          // mesh level whose links carry the traffic
};

struct RankPlan {
  int rank = 0;
  std::vector<int> coords;
  std::vector<Step> steps;
  std::int64_t peak_bytes = 0;  // static footprint (inputs, received, accumulators)
};

struct Plan {
  Grid grid;
  int steps_per_rank = 0;
  std::vector<RankPlan> ranks;
  /// Per buffer: each rank's initial (input) or required final (output) region.
  std::map<std::string, std::vector<Region>> initial, final;
  std::int64_t max_peak_bytes() const;
  /// Bytes moved per mesh level (sum over ranks of sends; collectives by payload).
  std::vector<double> bytes_per_level() const;
  std::map<std::string, int> counts() const;  // "p2p", "all_gather", ... -> number of ops
};

/// Lowers an annotated, patched grid. Throws tessera::Error ("lower: ...")
/// when the schedule is incomplete (no kernel, a mesh level without a
/// parallel loop) or a needed block cannot be sourced.
Plan lower(const Grid& g);

/// Accumulator elements per point of write buffer `b` (attention keeps the
/// running max and sum next to the unnormalized output).
std::int64_t acc_elem(const Grid& g, const Buffer& b);

std::string describe(const Plan& p, int max_steps_per_rank = 40);

/// Mixed-radix coordinates of `rank` in `mesh` (level 0 outermost).
std::vector<int> mesh_coords(const std::vector<int>& mesh, int rank);
int mesh_rank(const std::vector<int>& mesh, const std::vector<int>& coords);

}  // namespace tessera::commir
