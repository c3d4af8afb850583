// tessera/commir/transforms.hpp — the schedule primitives of CommIR (Mercury
// Table 2). Each validates its arguments and throws tessera::Error whose
// message starts with the call, e.g. "shift(kv0, q0): ..." and says why.
//
// Computation: tile, join, reorder, patch. Communication (annotations read
// by lowering): parallelize, shift (bundled: it shards the read buffers that
// the shifted loop indexes and the parallel loop does not, and the reduced
// output when the parallel loop is a reduction), shard, replicate.
#pragma once

#include <string>
#include <vector>

#include "tessera/commir/ir.hpp"

namespace tessera::commir {

/// Splits what is left of `axis` below its last factor into n cells; adds the
/// loop `name` (default axis + level) innermost in the nest.
void tile(Grid& g, const std::string& axis, std::int64_t n, std::string name = "");
/// Merges two adjacent sequential loops (outer, inner) into one.
void join(Grid& g, const std::string& outer, const std::string& inner, std::string name = "");
/// The listed loops take the listed order within the positions they occupy.
void reorder(Grid& g, const std::vector<std::string>& order);
/// Replaces the body by a local kernel: "gemm", "attention" or "add".
void patch(Grid& g, const std::string& kernel);
void parallelize(Grid& g, const std::string& loop, int mesh_level);
void shift(Grid& g, const std::string& loop, const std::string& parallel_loop);
/// Shards `buffer` on the level of `parallel_loop`, along a sequential loop or
/// an axis of the buffer (default: its first axis the parallel loop does not tile).
void shard(Grid& g, const std::string& buffer, const std::string& parallel_loop, const std::string& along = "");
void replicate(Grid& g, const std::string& buffer, const std::string& parallel_loop);

/// Applies a schedule script such as "tile(q,2) parallelize(q0,0) shift(kv0,q0)"
/// (calls separated by spaces or ';'). Errors name the failing call.
void apply(Grid& g, const std::string& script);

}  // namespace tessera::commir
