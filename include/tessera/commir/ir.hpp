// tessera/commir/ir.hpp — CommIR: an operator as a loop nest whose loops can be
// spread over a device mesh (after Mercury, SOSP'25).
//
// An operator is a Grid: named logical Axes (extent, spatial or reduction),
// Buffers indexed by axes (read or write; a dimension may be axis/g for GQA;
// `elem` trailing elements per point, e.g. the head dimension), a Body
// (C += A * B, O = attend(Q, K, V), Y = X1 + X2) and, once patched, the name of
// the local kernel that runs the innermost block.
//
// Tiling: each axis is split hierarchically. tile(a, n) adds a factor level
// (a#k, extent n) whose cells split the cells of level k-1 into n balanced
// parts (ragged extents allowed: cell sizes differ by at most one). What is
// left below the last level is the block one kernel call processes.
// Loops: the nest is an ordered list (outer -> inner) of loops, each covering
// one factor, or several after join (major -> minor). A loop may be
// parallelized on a mesh level (its extent equals that level's size) and a
// sequential loop may be shifted by a parallel loop: index (j + i) mod J
// (own block first), or (j + i + 1) mod J for the ring reduce-scatter — a
// reduction parallel loop whose shift rings only the output's partials — so
// the last iteration on rank i computes the output cell i it owns (the
// offset is chosen by lowering; the textual form does not carry it).
// Placements (shard / replicate) say how a buffer lies on a mesh level.
//
// Mesh levels: level 0 is the outermost (e.g. nodes in "2x4"); the last level
// is the innermost (GPUs of a node). Rank = row-major over mesh coordinates.
//
// Limits: kernels are GEMM (2-D contract), attention (non-causal) and add.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessera/runtime/dtype.hpp"

namespace tessera::commir {

enum class AxisKind { spatial, reduction };
enum class Access { read, write };
enum class BodyKind { contract, attend, add };

struct Axis {
  std::string name;
  std::int64_t extent = 0;
  AxisKind kind = AxisKind::spatial;
  bool operator==(const Axis&) const = default;
};

/// One buffer dimension: index = axis_index / group (group > 1 for GQA's K/V).
struct Dim {
  std::string axis;
  std::int64_t group = 1;
  bool operator==(const Dim&) const = default;
};

struct Buffer {
  std::string name;
  std::vector<Dim> dims;
  std::int64_t elem = 1;  // trailing contiguous elements per index point
  Access access = Access::read;
  bool operator==(const Buffer&) const = default;
  bool indexed_by(const std::string& axis) const;
};

struct Body {
  BodyKind kind = BodyKind::contract;
  std::string out;
  std::vector<std::string> ins;
  bool operator==(const Body&) const = default;
};

/// The level-th tiling factor of an axis.
struct Factor {
  std::string axis;
  int level = 0;
  bool operator==(const Factor&) const = default;
};

struct Loop {
  std::string name;
  std::vector<Factor> factors;  // > 1 after join, major -> minor
  int mesh_level = -1;          // >= 0 when parallelized
  std::string shift_by;         // parallel loop this loop is shifted by
  bool operator==(const Loop&) const = default;
  bool parallel() const { return mesh_level >= 0; }
};

enum class PlacementKind { shard, replicate };

/// How a buffer lies on one mesh level (the level of parallel loop `loop`).
/// shard along a sequential loop (loop-aligned cells) or along an axis of the
/// buffer (balanced split into mesh-size parts).
struct Placement {
  std::string buffer;
  std::string loop;  // the parallel loop
  PlacementKind kind = PlacementKind::shard;
  std::string along;  // loop or axis name (shard only)
  bool along_is_loop = false;
  bool operator==(const Placement&) const = default;
};

struct Range {
  std::int64_t lo = 0, hi = 0;
  std::int64_t size() const { return hi - lo; }
  bool operator==(const Range&) const = default;
  bool contains(const Range& r) const { return lo <= r.lo && r.hi <= hi; }
};

/// Part i of n of r, balanced (sizes differ by at most one).
inline Range part(Range r, std::int64_t n, std::int64_t i) {
  const std::int64_t len = r.size();
  return {r.lo + len * i / n, r.lo + len * (i + 1) / n};
}

struct Grid {
  std::string name = "op";
  DType dtype = DType::bf16;
  std::vector<int> mesh;  // sizes per level, outer -> inner
  std::vector<Axis> axes;
  std::vector<Buffer> buffers;
  Body body;
  std::string kernel;                                       // set by patch
  std::map<std::string, std::vector<std::int64_t>> tiling;  // axis -> factor extents
  std::vector<Loop> loops;                                  // outer -> inner
  std::vector<Placement> placements;
  bool operator==(const Grid&) const = default;

  // ---- lookups (throw tessera::Error naming `what` when absent) ----
  const Axis& axis(const std::string& name, const char* what = "grid") const;
  const Buffer& buffer(const std::string& name, const char* what = "grid") const;
  const Loop& loop(const std::string& name, const char* what = "grid") const;
  Loop* find_loop(const std::string& name);
  const Loop* find_loop(const std::string& name) const;
  int loop_index(const std::string& name) const;  // -1 if absent
  const Axis* find_axis(const std::string& name) const;
  const Buffer* find_buffer(const std::string& name) const;

  std::int64_t factor_extent(const Factor& f) const;  // throws when the tiling has no such factor
  std::int64_t loop_extent(const Loop& l) const;
  /// The parallel loop on mesh level `level`, or nullptr.
  const Loop* parallel_loop(int level) const;
  /// Placement of `buffer` on the level of parallel loop `loop`, or nullptr.
  const Placement* placement(const std::string& buffer, const std::string& loop) const;
  /// True when one of the loop's factors tiles an axis that indexes `b`.
  bool loop_indexes(const Loop& l, const Buffer& b) const;
  /// Smallest cell size of axis `a` at its deepest tiling level.
  std::int64_t min_cell(const std::string& a) const;
  int world() const;  // product of the mesh sizes; throws outside the limits below
  std::size_t elem_bytes() const { return dtype_size(dtype); }
};

// ---- limits (every size a grid carries is checked against these) ----------
// Planning simulates every rank and every sequential step on the host, so the
// world and the plan size are bounded; sizes are bounded so that every volume
// and byte count the planner forms fits in 64-bit integers.
inline constexpr std::int64_t kMaxExtent = std::int64_t{1} << 40;       // one axis
inline constexpr std::int64_t kMaxElem = std::int64_t{1} << 20;         // trailing elements per point
inline constexpr std::int64_t kMaxBufferBytes = std::int64_t{1} << 50;  // one buffer, whole
inline constexpr std::int64_t kMaxGridPoints = std::int64_t{1} << 62;   // product of all axis extents
inline constexpr int kMaxMeshLevels = 8;
inline constexpr int kMaxLevelSize = 4096;
inline constexpr int kMaxWorld = 256;                   // product of the mesh sizes
inline constexpr std::int64_t kMaxSteps = 1 << 16;      // sequential steps per rank (lower's limit)
inline constexpr std::int64_t kMaxRankSteps = 1 << 20;  // world x sequential steps
inline constexpr int kMaxAxes = 16, kMaxBuffers = 16, kMaxDims = 8, kMaxLoops = 64, kMaxTileLevels = 16;
inline constexpr int kMaxPlacements = 256;
inline constexpr std::size_t kMaxName = 64;

/// a * b, or throws tessera::Error "<what>: a x b overflows" when the product
/// leaves [0, limit] (inputs must be non-negative).
std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::int64_t limit, const char* what);

/// Checks everything a grid says against itself and the limits above: names
/// (identifiers, unique among axes / buffers / loops), extents and sizes,
/// buffer dimensions naming existing axes once each, groups, the body's
/// buffers, the kernel against the body, the tiling (no empty cell), loops
/// (factors covered once, parallel levels and extents against the mesh,
/// shifts: no self-shift, by a parallel loop of equal extent) and placements
/// (existing buffer and parallel loop, once per level, `along` valid).
/// Throws tessera::Error "<what>: ..." naming the offending name and why.
void validate(const Grid& g, const char* what = "grid");

/// Builds the canonical operators: C[m,n] += A[m,k]*B[k,n] and attention
/// O[b,h,q] = attend(Q[b,h,q], K[b,h/g,kv], V[b,h/g,kv]) (g = heads / kv_heads).
Grid make_gemm(std::int64_t m, std::int64_t n, std::int64_t k, std::vector<int> mesh, DType dt = DType::bf16);
Grid make_attention(std::int64_t batch, std::int64_t heads, std::int64_t kv_heads, std::int64_t q_len,
                    std::int64_t kv_len, std::int64_t head_dim, std::vector<int> mesh, DType dt = DType::bf16);

/// "2x4" -> {2, 4}; throws on malformed text, a level outside
/// [1, kMaxLevelSize], more than kMaxMeshLevels levels or a world above kMaxWorld.
std::vector<int> parse_mesh(const std::string& text);
std::string mesh_string(const std::vector<int>& mesh);

}  // namespace tessera::commir
