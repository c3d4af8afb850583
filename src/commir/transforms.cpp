// CommIR schedule primitives with validation (Mercury Table 2 semantics).
#include "tessera/commir/transforms.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <set>

#include "tessera/runtime/error.hpp"

namespace tessera::commir {
namespace {

std::set<std::string> loop_axes(const Loop& l) {
  std::set<std::string> s;
  for (const auto& f : l.factors) s.insert(f.axis);
  return s;
}

bool loop_is_reduction(const Grid& g, const Loop& l) {
  for (const auto& f : l.factors)
    if (g.axis(f.axis).kind == AxisKind::reduction) return true;
  return false;
}

std::string dims_text(const Buffer& b) {
  std::string s = b.name + "[";
  for (std::size_t i = 0; i < b.dims.size(); ++i) {
    s += (i ? "," : "") + b.dims[i].axis;
    if (b.dims[i].group > 1) s += "/" + std::to_string(b.dims[i].group);
  }
  return s + "]";
}

}  // namespace

void tile(Grid& g, const std::string& axis, std::int64_t n, std::string name) {
  const Axis* a = g.find_axis(axis);
  TESSERA_CHECK(a, "tile({}, {}): grid '{}' has no axis '{}'", axis, n, g.name, axis);
  TESSERA_CHECK(n >= 1, "tile({}, {}): the number of cells must be >= 1", axis, n);
  TESSERA_CHECK(g.loops.size() < static_cast<std::size_t>(kMaxLoops), "tile({}, {}): grid '{}' already has {} loops",
                axis, n, g.name, kMaxLoops);
  if (auto it = g.tiling.find(axis); it != g.tiling.end())
    TESSERA_CHECK(it->second.size() < static_cast<std::size_t>(kMaxTileLevels),
                  "tile({}, {}): axis {} already has {} tiling levels", axis, n, axis, kMaxTileLevels);
  const std::int64_t cell = g.min_cell(axis);
  TESSERA_CHECK(n <= cell,
                "tile({}, {}): the smallest cell of axis {} has {} element(s); {} cells would leave some empty", axis,
                n, axis, cell, n);
  auto& levels = g.tiling[axis];
  const int level = static_cast<int>(levels.size());
  if (name.empty()) name = axis + std::to_string(level);
  TESSERA_CHECK(!g.find_loop(name), "tile({}, {}): a loop named '{}' already exists; pass another name", axis, n, name);
  levels.push_back(n);
  g.loops.push_back(Loop{name, {Factor{axis, level}}, -1, ""});
}

void join(Grid& g, const std::string& outer, const std::string& inner, std::string name) {
  const int io = g.loop_index(outer), ii = g.loop_index(inner);
  TESSERA_CHECK(io >= 0, "join({}, {}): no loop '{}'", outer, inner, outer);
  TESSERA_CHECK(ii >= 0, "join({}, {}): no loop '{}'", outer, inner, inner);
  TESSERA_CHECK(ii == io + 1, "join({}, {}): loops must be adjacent with {} directly outside {} (reorder first)", outer,
                inner, outer, inner);
  for (int i : {io, ii}) {
    const Loop& l = g.loops[i];
    TESSERA_CHECK(!l.parallel() && l.shift_by.empty(),
                  "join({}, {}): loop {} is parallelized or shifted; join before communication primitives", outer,
                  inner, l.name);
    for (const auto& p : g.placements)
      TESSERA_CHECK(!(p.along_is_loop && p.along == l.name) && p.loop != l.name,
                    "join({}, {}): loop {} is referenced by a placement of buffer {}", outer, inner, l.name, p.buffer);
    for (const auto& other : g.loops)
      TESSERA_CHECK(other.shift_by != l.name, "join({}, {}): loop {} is shifted by {}", outer, inner, other.name,
                    l.name);
  }
  if (name.empty()) name = outer + inner;
  TESSERA_CHECK(name == outer || name == inner || !g.find_loop(name), "join({}, {}): a loop named '{}' already exists",
                outer, inner, name);
  Loop merged{name, g.loops[io].factors, -1, ""};
  merged.factors.insert(merged.factors.end(), g.loops[ii].factors.begin(), g.loops[ii].factors.end());
  g.loops[io] = merged;
  g.loops.erase(g.loops.begin() + ii);
}

void reorder(Grid& g, const std::vector<std::string>& order) {
  std::string call = "reorder(";
  for (std::size_t i = 0; i < order.size(); ++i) call += (i ? ", " : "") + order[i];
  call += ")";
  std::vector<int> pos;
  std::set<std::string> seen;
  for (const auto& n : order) {
    TESSERA_CHECK(seen.insert(n).second, "{}: loop {} listed twice", call, n);
    const int i = g.loop_index(n);
    TESSERA_CHECK(i >= 0, "{}: no loop '{}'", call, n);
    pos.push_back(i);
  }
  std::vector<Loop> picked;
  for (const auto& n : order) picked.push_back(*g.find_loop(n));
  std::sort(pos.begin(), pos.end());
  for (std::size_t i = 0; i < pos.size(); ++i) g.loops[pos[i]] = picked[i];
}

void patch(Grid& g, const std::string& kernel) {
  const Body& body = g.body;
  auto buf = [&](const std::string& n) -> const Buffer& { return g.buffer(n, "patch"); };
  auto spatial = [&](const Dim& d) { return g.axis(d.axis).kind == AxisKind::spatial; };
  const std::string call = "patch(" + kernel + ")";
  if (kernel == "gemm") {
    TESSERA_CHECK(body.kind == BodyKind::contract && body.ins.size() == 2,
                  "{}: the body of grid '{}' is not a contraction of two buffers", call, g.name);
    const Buffer &c = buf(body.out), &a = buf(body.ins[0]), &b = buf(body.ins[1]);
    const bool shape = c.dims.size() == 2 && a.dims.size() == 2 && b.dims.size() == 2;
    TESSERA_CHECK(shape, "{}: gemm needs 2-D buffers, got {} += {} * {}", call, dims_text(c), dims_text(a),
                  dims_text(b));
    const bool ok = a.dims[0] == c.dims[0] && b.dims[1] == c.dims[1] && a.dims[1] == b.dims[0] && spatial(c.dims[0]) &&
                    spatial(c.dims[1]) && !spatial(a.dims[1]) && a.dims[1].group == 1 && c.dims[0].group == 1 &&
                    c.dims[1].group == 1 && a.elem == 1 && b.elem == 1 && c.elem == 1;
    TESSERA_CHECK(ok, "{}: {} += {} * {} does not match C[m,n] += A[m,k] * B[k,n] with k a reduction axis", call,
                  dims_text(c), dims_text(a), dims_text(b));
  } else if (kernel == "attention") {
    TESSERA_CHECK(body.kind == BodyKind::attend && body.ins.size() == 3,
                  "{}: the body of grid '{}' is not attend(Q, K, V)", call, g.name);
    const Buffer &o = buf(body.out), &q = buf(body.ins[0]), &k = buf(body.ins[1]), &v = buf(body.ins[2]);
    const bool ok = o.dims.size() == 3 && q.dims == o.dims && k.dims == v.dims && k.dims.size() == 3 &&
                    k.dims[0] == q.dims[0] && k.dims[1].axis == q.dims[1].axis && !spatial(k.dims[2]) &&
                    spatial(q.dims[0]) && spatial(q.dims[1]) && spatial(q.dims[2]) && q.elem == k.elem &&
                    k.elem == v.elem && v.elem == o.elem && q.dims[1].group == 1 && q.dims[0].group == 1 &&
                    k.dims[0].group == 1 && k.dims[2].group == 1;
    TESSERA_CHECK(ok,
                  "{}: {} = attend({}, {}, {}) does not match O[b,h,q] = attend(Q[b,h,q], K[b,h/g,kv], V[b,h/g,kv])",
                  call, dims_text(o), dims_text(q), dims_text(k), dims_text(v));
    TESSERA_CHECK(g.axis(k.dims[1].axis).extent % k.dims[1].group == 0,
                  "{}: heads ({}) must be a multiple of the K/V group size {}", call, g.axis(k.dims[1].axis).extent,
                  k.dims[1].group);
  } else if (kernel == "add") {
    TESSERA_CHECK(body.kind == BodyKind::add && !body.ins.empty(),
                  "{}: the body of grid '{}' is not an element-wise sum", call, g.name);
    const Buffer& o = buf(body.out);
    for (const auto& n : body.ins)
      TESSERA_CHECK(buf(n).dims == o.dims && buf(n).elem == o.elem, "{}: {} and {} differ in shape", call,
                    dims_text(buf(n)), dims_text(o));
    for (const auto& d : o.dims)
      TESSERA_CHECK(spatial(d), "{}: element-wise sums have no reduction axis ({})", call, d.axis);
  } else {
    TESSERA_FAIL("{}: unknown kernel; registered kernels are gemm, attention, add", call);
  }
  g.kernel = kernel;
}

void parallelize(Grid& g, const std::string& loop, int level) {
  const std::string call = fmt::format("parallelize({}, {})", loop, level);
  Loop* l = g.find_loop(loop);
  TESSERA_CHECK(l, "{}: no loop '{}' (tile the axis first)", call, loop);
  TESSERA_CHECK(!g.mesh.empty(), "{}: grid '{}' has no mesh", call, g.name);
  TESSERA_CHECK(level >= 0 && level < static_cast<int>(g.mesh.size()), "{}: mesh {} has levels 0..{}", call,
                mesh_string(g.mesh), g.mesh.size() - 1);
  TESSERA_CHECK(!l->parallel(), "{}: loop {} is already parallel on level {}", call, loop, l->mesh_level);
  TESSERA_CHECK(l->shift_by.empty(), "{}: loop {} is shifted; a shifted loop stays sequential", call, loop);
  const Loop* other = g.parallel_loop(level);
  TESSERA_CHECK(!other, "{}: mesh level {} is already taken by loop {}", call, level, other ? other->name : "");
  const std::int64_t e = g.loop_extent(*l);
  TESSERA_CHECK(e == g.mesh[level], "{}: loop {} has extent {} but mesh level {} has {} devices; they must be equal",
                call, loop, e, level, g.mesh[level]);
  l->mesh_level = level;
}

void shift(Grid& g, const std::string& loop, const std::string& par) {
  const std::string call = fmt::format("shift({}, {})", loop, par);
  Loop* l = g.find_loop(loop);
  TESSERA_CHECK(l, "{}: no loop '{}'", call, loop);
  const Loop* p = g.find_loop(par);
  TESSERA_CHECK(p, "{}: no loop '{}'", call, par);
  TESSERA_CHECK(p->parallel(), "{}: {} is not parallelized; shift follows a parallel loop", call, par);
  TESSERA_CHECK(!l->parallel(), "{}: {} is parallel; only sequential (temporal) loops can be shifted", call, loop);
  TESSERA_CHECK(l->shift_by.empty(), "{}: {} is already shifted by {}", call, loop, l->shift_by);
  for (const auto& o : g.loops)
    TESSERA_CHECK(o.shift_by != par, "{}: {} already shifts loop {}; one shifted loop per parallel loop", call, par,
                  o.name);
  const std::int64_t le = g.loop_extent(*l), pe = g.loop_extent(*p);
  TESSERA_CHECK(le == pe, "{}: loop {} has extent {} but parallel loop {} has {}; a shifted loop must match", call,
                loop, le, par, pe);
  l->shift_by = par;
  // Bundled shard: shifting without sharding changes nothing (Mercury §6).
  const bool reduction = loop_is_reduction(g, *p);
  bool any = false;
  for (const auto& b : g.buffers) {
    if (!g.loop_indexes(*l, b) || g.loop_indexes(*p, b) || g.placement(b.name, par)) continue;
    if (b.access == Access::write && !reduction) continue;
    g.placements.push_back(Placement{b.name, par, PlacementKind::shard, loop, true});
    any = true;
  }
  if (!any) {
    // Allowed only when some buffer was sharded along this loop explicitly before.
    bool prior = false;
    for (const auto& pl : g.placements) prior |= pl.loop == par && pl.along_is_loop && pl.along == loop;
    TESSERA_CHECK(prior, "{}: no buffer is indexed by {} and not by {}; the shift would move no data", call, loop, par);
  }
}

void shard(Grid& g, const std::string& buffer, const std::string& par, const std::string& along_in) {
  std::string along = along_in;
  const std::string call = fmt::format("shard({}, {}{}{})", buffer, par, along.empty() ? "" : ", ", along);
  const Buffer* b = g.find_buffer(buffer);
  TESSERA_CHECK(b, "{}: no buffer '{}'", call, buffer);
  const Loop* p = g.find_loop(par);
  TESSERA_CHECK(p && p->parallel(), "{}: {} is not a parallel loop", call, par);
  TESSERA_CHECK(!g.placement(buffer, par), "{}: {} is already placed on the level of {}", call, buffer, par);
  const auto paxes = loop_axes(*p);
  const bool indexed = g.loop_indexes(*p, *b);
  if (along.empty()) {
    TESSERA_CHECK(!indexed, "{}: {} is already partitioned by {}; name the axis to shard along instead", call, buffer,
                  par);
    for (const auto& d : b->dims)
      if (!paxes.count(d.axis)) {
        along = d.axis;
        break;
      }
  }
  Placement pl{buffer, par, PlacementKind::shard, along, false};
  if (const Loop* l = g.find_loop(along)) {
    TESSERA_CHECK(!l->parallel(), "{}: {} is parallel; shard along a sequential loop or an axis", call, along);
    TESSERA_CHECK(g.loop_indexes(*l, *b), "{}: loop {} does not index {}", call, along, buffer);
    TESSERA_CHECK(!indexed, "{}: {} is partitioned by {}; shard it along an axis, not a loop", call, buffer, par);
    TESSERA_CHECK(g.loop_extent(*l) == g.loop_extent(*p), "{}: loop {} has extent {}, parallel loop {} has {}", call,
                  along, g.loop_extent(*l), par, g.loop_extent(*p));
    pl.along_is_loop = true;
  } else {
    TESSERA_CHECK(g.find_axis(along), "{}: '{}' is neither a loop nor an axis", call, along);
    TESSERA_CHECK(b->indexed_by(along), "{}: axis {} does not index {}", call, along, buffer);
    TESSERA_CHECK(!paxes.count(along), "{}: {} already splits axis {}", call, par, along);
    std::int64_t ext = g.axis(along).extent;
    for (const auto& d : b->dims)
      if (d.axis == along) ext = (ext + d.group - 1) / d.group;
    TESSERA_CHECK(ext >= g.loop_extent(*p), "{}: axis {} of {} has {} entries, fewer than the {} ranks", call, along,
                  buffer, ext, g.loop_extent(*p));
  }
  g.placements.push_back(pl);
}

void replicate(Grid& g, const std::string& buffer, const std::string& par) {
  const std::string call = fmt::format("replicate({}, {})", buffer, par);
  TESSERA_CHECK(g.find_buffer(buffer), "{}: no buffer '{}'", call, buffer);
  const Loop* p = g.find_loop(par);
  TESSERA_CHECK(p && p->parallel(), "{}: {} is not a parallel loop", call, par);
  TESSERA_CHECK(!g.placement(buffer, par), "{}: {} is already placed on the level of {}", call, buffer, par);
  g.placements.push_back(Placement{buffer, par, PlacementKind::replicate, "", false});
}

void apply(Grid& g, const std::string& script) {
  TESSERA_CHECK(script.size() <= (std::size_t{1} << 16), "schedule: {} characters (at most 65536)", script.size());
  std::size_t i = 0;
  auto skip = [&] {
    while (i < script.size() && (std::isspace(static_cast<unsigned char>(script[i])) || script[i] == ';')) ++i;
  };
  for (skip(); i < script.size(); skip()) {
    const std::size_t open = script.find('(', i), close = script.find(')', i);
    TESSERA_CHECK(open != std::string::npos && close != std::string::npos && open < close,
                  "schedule: expected name(args) at '{}'", script.substr(i, 30));
    std::string name = script.substr(i, open - i);
    std::vector<std::string> args;
    std::string cur;
    for (std::size_t j = open + 1; j <= close; ++j) {
      const char c = script[j];
      if (c == ',' || c == ')') {
        if (!cur.empty()) args.push_back(cur);
        cur.clear();
      } else if (!std::isspace(static_cast<unsigned char>(c))) {
        cur += c;
      }
    }
    i = close + 1;
    auto need = [&](std::size_t lo, std::size_t hi) {
      TESSERA_CHECK(args.size() >= lo && args.size() <= hi, "schedule: {} takes {}..{} arguments, got {}", name, lo, hi,
                    args.size());
    };
    auto num = [&](const std::string& s) {
      TESSERA_CHECK(!s.empty() && s.find_first_not_of("0123456789") == std::string::npos,
                    "schedule: {}: '{}' is not a number", name, s.substr(0, 40));
      std::int64_t v = 0;
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      TESSERA_CHECK(ec == std::errc() && end == s.data() + s.size() && v <= kMaxExtent,
                    "schedule: {}: {} is too large (at most 2^40)", name, s.substr(0, 40));
      return v;
    };
    if (name == "tile") {
      need(2, 3);
      tile(g, args[0], num(args[1]), args.size() > 2 ? args[2] : "");
    } else if (name == "join") {
      need(2, 3);
      join(g, args[0], args[1], args.size() > 2 ? args[2] : "");
    } else if (name == "reorder") {
      need(1, 64);
      reorder(g, args);
    } else if (name == "patch") {
      need(1, 1);
      patch(g, args[0]);
    } else if (name == "parallelize") {
      need(2, 2);
      const std::int64_t level = num(args[1]);
      TESSERA_CHECK(level < kMaxMeshLevels, "schedule: parallelize({}, {}): mesh levels are below {}", args[0], level,
                    kMaxMeshLevels);
      parallelize(g, args[0], static_cast<int>(level));
    } else if (name == "shift") {
      need(2, 2);
      shift(g, args[0], args[1]);
    } else if (name == "shard") {
      need(2, 3);
      shard(g, args[0], args[1], args.size() > 2 ? args[2] : "");
    } else if (name == "replicate") {
      need(2, 2);
      replicate(g, args[0], args[1]);
    } else {
      TESSERA_FAIL(
          "schedule: unknown primitive '{}' (tile, join, reorder, patch, parallelize, shift, shard, replicate)", name);
    }
  }
}

}  // namespace tessera::commir
