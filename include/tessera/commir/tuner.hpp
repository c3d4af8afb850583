// tessera/commir/tuner.hpp — cost model, schedule search (Mercury §6) and
// graph-level search over operator chains with resharding cost (Alg. 1).
//
// Cost model: an event simulation of the plan. Each rank has a compute clock;
// a local kernel takes flops / rate + overhead; a P2P transfer starts when the
// sender reaches it and both its outgoing and the receiver's incoming link of
// that mesh level are free, and lasts latency + bytes / p2p bandwidth; a
// receive delays the compute clock until arrival (so transfers posted early
// overlap with compute); a collective starts when all members reach it and
// lasts latency + bytes / bus bandwidth of its level. Predicted time = the
// slowest rank's clock at the end.
//
// Search: computation schedule (extra tiling by 2, loop order), then per mesh
// level an axis to parallelize (tiled by the level size) and a bundled
// communication choice (replicate, gather, shift along an axis, broadcast,
// all-to-all, reduce-scatter). Invalid candidates (a transform throws) are
// counted and dropped; candidates over the memory limit are pruned.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessera/commir/machine.hpp"
#include "tessera/commir/plan.hpp"

namespace tessera::commir {

struct Estimate {
  double time_us = 0;
  double compute_us = 0;  // slowest rank's kernel time
  double comm_us = 0;     // slowest rank's busy time on links and collectives
  double reshard_us = 0;  // converting from / to a fixed interface layout (included in time_us)
  std::vector<double> bytes_per_level;
  std::int64_t peak_bytes = 0;
};

/// Where each rank holds each input before and each output after an operator.
struct Layout {
  std::map<std::string, std::vector<Region>> inputs, outputs;
};
Layout layout_of(const Plan& p);

/// Time for every rank to obtain `need[r]` when rank q holds `have[q]` (each
/// rank pulls what it lacks from the nearest holder; slowest rank counts).
double reshard_time(const std::vector<int>& mesh, const std::vector<Region>& have, const std::vector<Region>& need,
                    double elem_bytes, const MachineProfile& prof);

Estimate estimate(const Plan& plan, const MachineProfile& prof);

/// Time to bring `plan`'s inputs from `contract`'s layout into the plan's
/// initial layout and its outputs from its final layout into `contract`'s.
double contract_reshard_time(const Layout& contract, const Plan& plan, const MachineProfile& prof);

struct Candidate {
  std::string script;
  Grid grid;
  Estimate est;
};

struct TuneOptions {
  double memory_limit_gb = 0;  // 0: the profile's memory
  bool extra_tiling = true;    // also try tile(axis, 2) for local pipelining
  bool loop_orders = true;     // also try the reversed order of sequential loops
  /// When set, the operator's inputs arrive and its outputs must leave in this
  /// layout; each candidate pays the resharding from / to it (Mercury's
  /// setting for attention: sequence-sharded activations).
  const Layout* contract = nullptr;
  /// Wall-clock budget of the search in seconds (0: none). When it runs out
  /// the search stops and returns what it ranked so far (out_of_time set).
  double budget_s = 0;
};

struct TuneResult {
  std::vector<Candidate> ranked;  // feasible, fastest first
  std::vector<Candidate> pareto;  // time vs per-rank memory, fastest first
  int enumerated = 0, invalid = 0, pruned_memory = 0;
  bool out_of_time = false;  // the budget ran out: the ranking covers part of the space
};

/// Searches schedules of the unscheduled operator `op` (mesh set) on `prof`.
/// Checks `op` with validate() first; throws tessera::Error on a bad grid or
/// budget.
TuneResult tune(const Grid& op, const MachineProfile& prof, const TuneOptions& opt = {});

/// Fastest-first Pareto front (each next point uses strictly less memory).
std::vector<Candidate> pareto_front(std::vector<Candidate> c);

// ---- graph level ----------------------------------------------------------
struct GraphEdge {
  int from = 0, to = 0;    // operator indices (from < to)
  std::string out_buffer;  // written by `from`
  std::string in_buffer;   // read by `to`; dimensions correspond in order
};

struct GraphResult {
  std::vector<int> pick;  // candidate index per operator
  double total_us = 0;
  std::vector<double> exec_us;     // per operator
  std::vector<double> reshard_us;  // per operator, summed over its input edges
  std::int64_t combinations = 0;
};

/// Time to turn `from`'s final layout of `out` into `to`'s initial layout of
/// `in` (each rank receives what it lacks from the nearest holder).
double reshard_cost(const Plan& from, const std::string& out, const Plan& to, const std::string& in,
                    const MachineProfile& prof);

/// Alg. 1: exhaustive over every combination of per-operator candidates,
/// cost = sum of execution + resharding on every edge. Candidates must carry
/// plans (lowered from their grids).
GraphResult graph_search(const std::vector<std::vector<Candidate>>& candidates, const std::vector<GraphEdge>& edges,
                         const MachineProfile& prof);

}  // namespace tessera::commir
