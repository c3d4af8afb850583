// tessera/commir/cpu_executor.hpp — runs a Plan on a simulated mesh (one
// thread per rank, memcpy as the link) in float64 and checks every rank's
// final output region against the un-parallelized loop nest.
//
// Each rank holds blocks (box + data). A compute step must find its input
// blocks locally (else the plan is wrong and the run fails naming the step);
// sends copy (or move, for partial accumulators) a block into a mailbox;
// receives wait for it with a timeout; collectives rendezvous by id. Attention
// accumulators keep (o, running max, running sum) so partial blocks merge
// exactly the way the lowered plan combines them (online softmax).
// Memory: the executor measures each rank's peak bytes of live blocks.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessera/commir/plan.hpp"

namespace tessera::commir {

using Tensors = std::map<std::string, std::vector<double>>;  // full tensors, row-major (dims..., elem)

/// Fresh random inputs (uniform in [-1, 1)) for every read buffer of `g`.
Tensors random_inputs(const Grid& g, std::uint64_t seed);
/// The reference: the grid's body evaluated over the whole iteration space.
Tensors reference(const Grid& g, const Tensors& inputs);

struct CpuRun {
  double max_rel_error = 0;              // max over outputs of ||out - ref|| / ||ref|| on each rank's region
  std::vector<std::int64_t> peak_bytes;  // measured per rank
  std::int64_t checked_elements = 0;
};

/// Runs the plan; throws tessera::Error when a step cannot run (missing data,
/// a receive or collective that times out, an output region not covered).
CpuRun run_cpu(const Plan& plan, const Tensors& inputs, const Tensors& expected,
               std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace tessera::commir
