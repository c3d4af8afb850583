// CommIR grid lookups and the canonical operators.
#include "tessera/commir/ir.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "tessera/commir/transforms.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::commir {

bool Buffer::indexed_by(const std::string& a) const {
  return std::any_of(dims.begin(), dims.end(), [&](const Dim& d) { return d.axis == a; });
}

const Axis* Grid::find_axis(const std::string& n) const {
  for (const auto& a : axes)
    if (a.name == n) return &a;
  return nullptr;
}
const Buffer* Grid::find_buffer(const std::string& n) const {
  for (const auto& b : buffers)
    if (b.name == n) return &b;
  return nullptr;
}
Loop* Grid::find_loop(const std::string& n) {
  for (auto& l : loops)
    if (l.name == n) return &l;
  return nullptr;
}
const Loop* Grid::find_loop(const std::string& n) const {
  for (const auto& l : loops)
    if (l.name == n) return &l;
  return nullptr;
}
int Grid::loop_index(const std::string& n) const {
  for (std::size_t i = 0; i < loops.size(); ++i)
    if (loops[i].name == n) return static_cast<int>(i);
  return -1;
}
const Axis& Grid::axis(const std::string& n, const char* what) const {
  const Axis* a = find_axis(n);
  TESSERA_CHECK(a, "{}: grid '{}' has no axis '{}'", what, name, n);
  return *a;
}
const Buffer& Grid::buffer(const std::string& n, const char* what) const {
  const Buffer* b = find_buffer(n);
  TESSERA_CHECK(b, "{}: grid '{}' has no buffer '{}'", what, name, n);
  return *b;
}
const Loop& Grid::loop(const std::string& n, const char* what) const {
  const Loop* l = find_loop(n);
  TESSERA_CHECK(l, "{}: grid '{}' has no loop '{}'", what, name, n);
  return *l;
}
std::int64_t Grid::factor_extent(const Factor& f) const {
  auto it = tiling.find(f.axis);
  TESSERA_CHECK(it != tiling.end() && f.level >= 0 && f.level < static_cast<int>(it->second.size()),
                "grid '{}': no factor {}#{} (no tile line defines it)", name, f.axis, f.level);
  return it->second[f.level];
}
std::int64_t Grid::loop_extent(const Loop& l) const {
  std::int64_t e = 1;
  for (const auto& f : l.factors) e = checked_mul(e, factor_extent(f), kMaxExtent, "loop extent");
  return e;
}
const Loop* Grid::parallel_loop(int level) const {
  for (const auto& l : loops)
    if (l.mesh_level == level) return &l;
  return nullptr;
}
const Placement* Grid::placement(const std::string& b, const std::string& l) const {
  for (const auto& p : placements)
    if (p.buffer == b && p.loop == l) return &p;
  return nullptr;
}
bool Grid::loop_indexes(const Loop& l, const Buffer& b) const {
  return std::any_of(l.factors.begin(), l.factors.end(), [&](const Factor& f) { return b.indexed_by(f.axis); });
}
std::int64_t Grid::min_cell(const std::string& a) const {
  std::int64_t size = axis(a).extent;
  auto it = tiling.find(a);
  if (it != tiling.end())
    for (std::int64_t n : it->second) {
      TESSERA_CHECK(n >= 1, "grid '{}': axis {} is tiled into {} cells (must be >= 1)", name, a, n);
      size /= n;  // floor(len/n) is the smallest balanced part
    }
  return size;
}
int Grid::world() const {
  TESSERA_CHECK(mesh.size() <= static_cast<std::size_t>(kMaxMeshLevels), "grid '{}': mesh has {} levels (at most {})",
                name, mesh.size(), kMaxMeshLevels);
  std::int64_t w = 1;
  for (int m : mesh) {
    TESSERA_CHECK(m >= 1 && m <= kMaxLevelSize, "grid '{}': mesh level size {} outside [1, {}]", name, m,
                  kMaxLevelSize);
    w *= m;  // <= 4096^8 < 2^63
    TESSERA_CHECK(w <= kMaxWorld, "grid '{}': mesh {} has more than {} devices", name, mesh_string(mesh), kMaxWorld);
  }
  return static_cast<int>(w);
}

std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::int64_t limit, const char* what) {
  TESSERA_CHECK(a >= 0 && b >= 0, "{}: negative size in {} x {}", what, a, b);
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r) || r > limit) {
    const bool pow2 = limit > 0 && (limit & (limit - 1)) == 0;
    TESSERA_FAIL("{}: {} x {} exceeds the limit {}", what, a, b,
                 pow2 ? fmt::format("2^{}", 63 - __builtin_clzll(static_cast<unsigned long long>(limit)))
                      : std::to_string(limit));
  }
  return r;
}

namespace {

bool is_identifier(const std::string& s) {
  if (s.empty() || s.size() > kMaxName) return false;
  if (!(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  });
}

}  // namespace

namespace {

// validate()'s checks of one grid, section by section; every message names
// the caller (`what`) and the grid.
struct GridCheck {
  const Grid& g;
  const char* what;
  const std::string gn;

  void ident(const std::string& s, const char* kind) const {
    TESSERA_CHECK(is_identifier(s),
                  "{}: grid '{}': {} name '{}' is not an identifier (letter or '_' first, then "
                  "letters, digits, '_', '.', '-'; at most {} characters)",
                  what, gn, kind, s.substr(0, 80), kMaxName);
  }

  // Axes: their names (every name once).
  std::set<std::string> axes() const {
    TESSERA_CHECK(!g.axes.empty() && g.axes.size() <= static_cast<std::size_t>(kMaxAxes),
                  "{}: grid '{}' has {} axes (1..{})", what, gn, g.axes.size(), kMaxAxes);
    std::set<std::string> names;
    std::int64_t points = 1;
    for (const auto& a : g.axes) {
      ident(a.name, "axis");
      TESSERA_CHECK(names.insert(a.name).second, "{}: grid '{}': axis '{}' is declared twice", what, gn, a.name);
      TESSERA_CHECK(a.extent >= 1 && a.extent <= kMaxExtent,
                    "{}: grid '{}': axis {} has extent {} (must be in [1, 2^40])", what, gn, a.name, a.extent);
      points = checked_mul(points, a.extent, kMaxGridPoints,
                           fmt::format("{}: grid '{}': product of the axis extents", what, gn).c_str());
    }
    return names;
  }

  // Tiling: every level of an existing axis splits into non-empty cells.
  // Returns the number of tile factors.
  std::size_t tiling() const {
    std::size_t factors = 0;
    for (const auto& [axis, ns] : g.tiling) {
      const Axis* a = g.find_axis(axis);
      TESSERA_CHECK(a, "{}: grid '{}': tile of '{}', which is not an axis", what, gn, axis);
      TESSERA_CHECK(!ns.empty() && ns.size() <= static_cast<std::size_t>(kMaxTileLevels),
                    "{}: grid '{}': axis {} has {} tiling levels (1..{})", what, gn, axis, ns.size(), kMaxTileLevels);
      std::int64_t cell = a->extent;
      for (std::size_t lv = 0; lv < ns.size(); ++lv) {
        TESSERA_CHECK(ns[lv] >= 1 && ns[lv] <= cell,
                      "{}: grid '{}': tile {}#{} into {} cells: the smallest cell has {} element(s) (need 1..{} cells)",
                      what, gn, axis, lv, ns[lv], cell, cell);
        cell /= ns[lv];
      }
      factors += ns.size();
    }
    return factors;
  }

  // Loops: each factor covered once, parallel loops on distinct mesh levels
  // of their extent, the plan's steps bounded. Returns the loops' names.
  std::set<std::string> loops(std::size_t factors) const {
    const int L = static_cast<int>(g.mesh.size());
    TESSERA_CHECK(g.loops.size() <= static_cast<std::size_t>(kMaxLoops), "{}: grid '{}' has {} loops (at most {})",
                  what, gn, g.loops.size(), kMaxLoops);
    std::set<std::string> lnames;
    std::set<std::pair<std::string, int>> covered;
    std::vector<const Loop*> level_loop(L, nullptr);
    std::int64_t steps = 1;
    for (const auto& l : g.loops) {
      ident(l.name, "loop");
      TESSERA_CHECK(lnames.insert(l.name).second, "{}: grid '{}': loop '{}' is declared twice", what, gn, l.name);
      TESSERA_CHECK(!l.factors.empty(), "{}: grid '{}': loop {} has no factor", what, gn, l.name);
      for (const auto& f : l.factors) {
        auto it = g.tiling.find(f.axis);
        TESSERA_CHECK(it != g.tiling.end() && f.level >= 0 && f.level < static_cast<int>(it->second.size()),
                      "{}: grid '{}': loop {} names factor {}#{} that no tile line defines", what, gn, l.name, f.axis,
                      f.level);
        TESSERA_CHECK(covered.insert({f.axis, f.level}).second,
                      "{}: grid '{}': factor {}#{} is covered by 2 loops (expected 1)", what, gn, f.axis, f.level);
      }
      const std::int64_t e = g.loop_extent(l);
      if (l.parallel()) {
        TESSERA_CHECK(l.mesh_level < L,
                      "{}: grid '{}': loop {} is parallel on level {} but the mesh {} has {} level(s)", what, gn,
                      l.name, l.mesh_level, mesh_string(g.mesh), L);
        TESSERA_CHECK(!level_loop[l.mesh_level], "{}: grid '{}': mesh level {} is taken by loops {} and {}", what, gn,
                      l.mesh_level, level_loop[l.mesh_level] ? level_loop[l.mesh_level]->name : "", l.name);
        level_loop[l.mesh_level] = &l;
        TESSERA_CHECK(e == g.mesh[l.mesh_level],
                      "{}: grid '{}': loop {} has extent {} but mesh level {} has {} devices; they must be equal", what,
                      gn, l.name, e, l.mesh_level, g.mesh[l.mesh_level]);
      } else {
        TESSERA_CHECK(l.mesh_level == -1, "{}: grid '{}': loop {} has mesh level {}", what, gn, l.name, l.mesh_level);
        steps =
            checked_mul(steps, e, kMaxSteps, fmt::format("{}: grid '{}': sequential steps per rank", what, gn).c_str());
      }
    }
    if (covered.size() != factors)
      for (const auto& [axis, ns] : g.tiling)
        for (std::size_t lv = 0; lv < ns.size(); ++lv)
          TESSERA_CHECK(covered.count({axis, static_cast<int>(lv)}),
                        "{}: grid '{}': factor {}#{} is covered by 0 loops (expected 1)", what, gn, axis, lv);
    checked_mul(steps, g.world(), kMaxRankSteps,
                fmt::format("{}: grid '{}': ranks x steps of the plan", what, gn).c_str());
    return lnames;
  }

  // Shifts: a sequential loop follows one parallel loop of its extent.
  void shifts() const {
    std::set<std::string> shifters;
    for (const auto& l : g.loops) {
      if (l.shift_by.empty()) continue;
      const std::string call = fmt::format("{}: grid '{}': loop {} shift {}", what, gn, l.name, l.shift_by);
      TESSERA_CHECK(l.shift_by != l.name, "{}: a loop cannot shift itself", call);
      const Loop* p = g.find_loop(l.shift_by);
      TESSERA_CHECK(p, "{}: no loop '{}'", call, l.shift_by);
      TESSERA_CHECK(p->parallel(), "{}: {} is not parallel; shift follows a parallel loop", call, l.shift_by);
      TESSERA_CHECK(!l.parallel(), "{}: {} is parallel; only sequential loops are shifted", call, l.name);
      TESSERA_CHECK(shifters.insert(l.shift_by).second, "{}: {} already shifts another loop", call, l.shift_by);
      TESSERA_CHECK(g.loop_extent(l) == g.loop_extent(*p), "{}: extents {} and {} differ", call, g.loop_extent(l),
                    g.loop_extent(*p));
    }
  }

  // Buffers: named apart from axes and loops, indexed by axes, bounded bytes.
  void buffers(const std::set<std::string>& names, const std::set<std::string>& lnames) const {
    TESSERA_CHECK(!g.buffers.empty() && g.buffers.size() <= static_cast<std::size_t>(kMaxBuffers),
                  "{}: grid '{}' has {} buffers (1..{})", what, gn, g.buffers.size(), kMaxBuffers);
    std::set<std::string> bnames;
    for (const auto& b : g.buffers) {
      ident(b.name, "buffer");
      TESSERA_CHECK(bnames.insert(b.name).second, "{}: grid '{}': buffer '{}' is declared twice", what, gn, b.name);
      TESSERA_CHECK(!names.count(b.name), "{}: grid '{}': buffer '{}' has the name of an axis", what, gn, b.name);
      TESSERA_CHECK(!lnames.count(b.name), "{}: grid '{}': buffer '{}' has the name of a loop", what, gn, b.name);
      TESSERA_CHECK(!b.dims.empty() && b.dims.size() <= static_cast<std::size_t>(kMaxDims),
                    "{}: grid '{}': buffer {} has {} dimensions (1..{})", what, gn, b.name, b.dims.size(), kMaxDims);
      TESSERA_CHECK(b.elem >= 1 && b.elem <= kMaxElem, "{}: grid '{}': buffer {} has {} elements per point (1..2^20)",
                    what, gn, b.name, b.elem);
      std::set<std::string> used;
      std::int64_t bytes =
          checked_mul(b.elem, static_cast<std::int64_t>(g.elem_bytes()), kMaxBufferBytes, "buffer bytes");
      for (const auto& d : b.dims) {
        const Axis* a = g.find_axis(d.axis);
        TESSERA_CHECK(a, "{}: grid '{}': buffer {} is indexed by '{}', which is not an axis", what, gn, b.name, d.axis);
        TESSERA_CHECK(used.insert(d.axis).second, "{}: grid '{}': buffer {} is indexed by axis {} twice", what, gn,
                      b.name, d.axis);
        TESSERA_CHECK(d.group >= 1 && d.group <= a->extent,
                      "{}: grid '{}': buffer {}: group {} of axis {} outside [1, {}]", what, gn, b.name, d.group,
                      d.axis, a->extent);
        bytes = checked_mul(bytes, (a->extent + d.group - 1) / d.group, kMaxBufferBytes,
                            fmt::format("{}: grid '{}': bytes of buffer {}", what, gn, b.name).c_str());
      }
    }
  }

  // Body: the operands are existing buffers, the output written, the inputs
  // read, each buffer used once.
  void body() const {
    const Body& body = g.body;
    TESSERA_CHECK(!body.out.empty(), "{}: grid '{}' has no body", what, gn);
    const std::size_t want = body.kind == BodyKind::contract ? 2 : body.kind == BodyKind::attend ? 3 : 0;
    TESSERA_CHECK(
        want ? body.ins.size() == want : !body.ins.empty() && body.ins.size() < static_cast<std::size_t>(kMaxBuffers),
        "{}: grid '{}': the body has {} input(s)", what, gn, body.ins.size());
    std::set<std::string> operands;
    auto operand = [&](const std::string& n, Access acc) {
      const Buffer* b = g.find_buffer(n);
      TESSERA_CHECK(b, "{}: grid '{}': the body names '{}', which is not a buffer", what, gn, n);
      TESSERA_CHECK(b->access == acc, "{}: grid '{}': the body {} buffer {}, declared {}", what, gn,
                    acc == Access::write ? "writes" : "reads", n, b->access == Access::write ? "write" : "read");
      TESSERA_CHECK(operands.insert(n).second, "{}: grid '{}': buffer {} appears twice in the body", what, gn, n);
    };
    operand(body.out, Access::write);
    for (const auto& n : body.ins) operand(n, Access::read);
    for (const auto& b : g.buffers)
      TESSERA_CHECK(operands.count(b.name), "{}: grid '{}': buffer {} is not used by the body", what, gn, b.name);
  }

  // Kernel: must match the body (patch's checks).
  void kernel() const {
    if (!g.kernel.empty()) {
      Grid c;
      c.name = g.name;
      c.dtype = g.dtype;
      c.axes = g.axes;
      c.buffers = g.buffers;
      c.body = g.body;
      patch(c, g.kernel);
    }
  }

  // Placements: shard or replicate a buffer on a parallel loop's level.
  void placements() const {
    TESSERA_CHECK(g.placements.size() <= static_cast<std::size_t>(kMaxPlacements),
                  "{}: grid '{}' has {} placements (at most {})", what, gn, g.placements.size(), kMaxPlacements);
    std::set<std::pair<std::string, std::string>> placed;
    for (const auto& p : g.placements) {
      const std::string call = fmt::format("{}: grid '{}': {} {} {}", what, gn,
                                           p.kind == PlacementKind::shard ? "shard" : "replicate", p.buffer, p.loop);
      const Buffer* b = g.find_buffer(p.buffer);
      TESSERA_CHECK(b, "{}: no buffer '{}'", call, p.buffer);
      const Loop* pl = g.find_loop(p.loop);
      TESSERA_CHECK(pl && pl->parallel(), "{}: {} is not a parallel loop", call, p.loop);
      TESSERA_CHECK(placed.insert({p.buffer, p.loop}).second, "{}: {} is placed twice on the level of {}", call,
                    p.buffer, p.loop);
      if (p.kind == PlacementKind::replicate) {
        TESSERA_CHECK(p.along.empty() && !p.along_is_loop, "{}: a replicated buffer has no 'along'", call);
        continue;
      }
      bool indexed = false;
      for (const auto& f : pl->factors) indexed |= b->indexed_by(f.axis);
      if (p.along_is_loop) {
        const Loop* al = g.find_loop(p.along);
        TESSERA_CHECK(al, "{}: along {}: no loop '{}'", call, p.along, p.along);
        TESSERA_CHECK(!al->parallel(), "{}: along {}: the loop is parallel; shard along a sequential loop", call,
                      p.along);
        bool al_indexes = false;
        for (const auto& f : al->factors) al_indexes |= b->indexed_by(f.axis);
        TESSERA_CHECK(al_indexes, "{}: along {}: the loop does not index {}", call, p.along, p.buffer);
        TESSERA_CHECK(!indexed, "{}: {} is partitioned by {}; shard it along an axis, not a loop", call, p.buffer,
                      p.loop);
        TESSERA_CHECK(g.loop_extent(*al) == g.loop_extent(*pl), "{}: along {}: extents {} and {} differ", call, p.along,
                      g.loop_extent(*al), g.loop_extent(*pl));
      } else {
        const Axis* a = g.find_axis(p.along);
        TESSERA_CHECK(a, "{}: along {}: no axis '{}'", call, p.along, p.along);
        TESSERA_CHECK(b->indexed_by(p.along), "{}: along {}: the axis does not index {}", call, p.along, p.buffer);
        for (const auto& f : pl->factors)
          TESSERA_CHECK(f.axis != p.along, "{}: along {}: {} already splits that axis", call, p.along, p.loop);
        std::int64_t ext = a->extent;
        for (const auto& d : b->dims)
          if (d.axis == p.along) ext = (ext + d.group - 1) / d.group;
        TESSERA_CHECK(ext >= g.loop_extent(*pl), "{}: along {}: {} entries, fewer than the {} ranks", call, p.along,
                      ext, g.loop_extent(*pl));
      }
    }
  }
};

}  // namespace

void validate(const Grid& g, const char* what) {
  const GridCheck c{g, what, g.name};
  c.ident(g.name, "grid");
  // Mesh.
  TESSERA_CHECK(g.mesh.size() <= static_cast<std::size_t>(kMaxMeshLevels),
                "{}: grid '{}': mesh has {} levels (at most {})", what, c.gn, g.mesh.size(), kMaxMeshLevels);
  (void)g.world();  // level sizes and the world bound
  const std::set<std::string> names = c.axes();
  const std::set<std::string> lnames = c.loops(c.tiling());
  c.shifts();
  c.buffers(names, lnames);
  c.body();
  c.kernel();
  c.placements();
}

Grid make_gemm(std::int64_t m, std::int64_t n, std::int64_t k, std::vector<int> mesh, DType dt) {
  TESSERA_CHECK(m > 0 && n > 0 && k > 0, "make_gemm: extents must be positive, got m={} n={} k={}", m, n, k);
  Grid g;
  g.name = "gemm";
  g.dtype = dt;
  g.mesh = std::move(mesh);
  g.axes = {{"m", m, AxisKind::spatial}, {"n", n, AxisKind::spatial}, {"k", k, AxisKind::reduction}};
  g.buffers = {{"A", {{"m"}, {"k"}}, 1, Access::read},
               {"B", {{"k"}, {"n"}}, 1, Access::read},
               {"C", {{"m"}, {"n"}}, 1, Access::write}};
  g.body = {BodyKind::contract, "C", {"A", "B"}};
  validate(g, "make_gemm");
  return g;
}

Grid make_attention(std::int64_t batch, std::int64_t heads, std::int64_t kv_heads, std::int64_t q_len,
                    std::int64_t kv_len, std::int64_t head_dim, std::vector<int> mesh, DType dt) {
  TESSERA_CHECK(batch > 0 && heads > 0 && kv_heads > 0 && q_len > 0 && kv_len > 0 && head_dim > 0,
                "make_attention: extents must be positive");
  TESSERA_CHECK(heads % kv_heads == 0, "make_attention: heads ({}) must be a multiple of kv_heads ({})", heads,
                kv_heads);
  Grid g;
  g.name = "attention";
  g.dtype = dt;
  g.mesh = std::move(mesh);
  g.axes = {{"b", batch, AxisKind::spatial},
            {"h", heads, AxisKind::spatial},
            {"q", q_len, AxisKind::spatial},
            {"kv", kv_len, AxisKind::reduction}};
  const std::int64_t grp = heads / kv_heads;
  g.buffers = {{"Q", {{"b"}, {"h"}, {"q"}}, head_dim, Access::read},
               {"K", {{"b"}, {"h", grp}, {"kv"}}, head_dim, Access::read},
               {"V", {{"b"}, {"h", grp}, {"kv"}}, head_dim, Access::read},
               {"O", {{"b"}, {"h"}, {"q"}}, head_dim, Access::write}};
  g.body = {BodyKind::attend, "O", {"Q", "K", "V"}};
  validate(g, "make_attention");
  return g;
}

std::vector<int> parse_mesh(const std::string& text) {
  const std::string shown = text.substr(0, 64) + (text.size() > 64 ? "..." : "");
  TESSERA_CHECK(!text.empty(), "mesh '': empty; expected sizes separated by 'x', e.g. 2x4");
  std::vector<int> mesh;
  std::int64_t world = 1;
  std::size_t i = 0;
  for (;;) {
    const std::size_t j = std::min(text.find('x', i), text.size());
    const std::string item = text.substr(i, j - i);
    TESSERA_CHECK(!item.empty() && item.size() <= 9 && item.find_first_not_of("0123456789") == std::string::npos,
                  "mesh '{}': expected sizes separated by 'x', e.g. 2x4", shown);
    const int v = std::stoi(item);  // at most 9 digits: fits
    TESSERA_CHECK(v >= 1 && v <= kMaxLevelSize, "mesh '{}': level size {} outside [1, {}]", shown, v, kMaxLevelSize);
    mesh.push_back(v);
    TESSERA_CHECK(mesh.size() <= static_cast<std::size_t>(kMaxMeshLevels), "mesh '{}': more than {} levels", shown,
                  kMaxMeshLevels);
    world *= v;
    TESSERA_CHECK(world <= kMaxWorld, "mesh '{}': more than {} devices (the planner simulates every rank)", shown,
                  kMaxWorld);
    if (j == text.size()) break;
    i = j + 1;
  }
  return mesh;
}

std::string mesh_string(const std::vector<int>& mesh) {
  std::string s;
  for (std::size_t i = 0; i < mesh.size(); ++i) s += (i ? "x" : "") + std::to_string(mesh[i]);
  return s;
}

}  // namespace tessera::commir
