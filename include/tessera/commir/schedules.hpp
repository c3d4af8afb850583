// tessera/commir/schedules.hpp — the published multi-GPU strategies written
// as CommIR schedule scripts (Mercury §5), for meshes of one or two levels.
//
// GEMM:      ag_gemm, gemm_rs, gemm_ar, async_ag_gemm, async_gemm_rs, bcast_gemm
// attention: cp, cp_ag, ring, ulysses, usp, two_level, tree, tree_rs
// On a two-level mesh the one-level GEMM strategies run on the inner level and
// split m over the outer level; ring on two levels is the two-level shift.
#pragma once

#include <string>
#include <vector>

#include "tessera/commir/ir.hpp"

namespace tessera::commir {

/// The script of schedule `name` for `mesh` (throws for unknown names or a
/// schedule that needs another mesh depth).
std::string schedule_script(const std::string& name, const std::vector<int>& mesh);
/// Schedules available for an operator kind ("gemm" / "attention") on a mesh depth.
std::vector<std::string> schedule_names(const std::string& op, int mesh_levels);
/// The grid with the schedule applied (and patched).
Grid scheduled(Grid g, const std::string& name);

}  // namespace tessera::commir
