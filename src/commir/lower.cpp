// Lowering of an annotated CommIR grid to a per-rank Plan (rules in plan.hpp).
#include <algorithm>
#include <functional>
#include <set>

#include "tessera/commir/plan.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::commir {

// ---------------------------------------------------------------- boxes ----
std::int64_t Box::volume() const {
  std::int64_t v = 1;
  for (const auto& x : r) v *= std::max<std::int64_t>(0, x.size());
  return v;
}
bool Box::contains(const Box& b) const {
  for (std::size_t i = 0; i < r.size(); ++i)
    if (!r[i].contains(b.r[i])) return false;
  return true;
}
bool Box::intersects(const Box& b) const {
  for (std::size_t i = 0; i < r.size(); ++i)
    if (std::max(r[i].lo, b.r[i].lo) >= std::min(r[i].hi, b.r[i].hi)) return false;
  return true;
}
Box Box::intersect(const Box& b) const {
  Box o;
  for (std::size_t i = 0; i < r.size(); ++i)
    o.r.push_back({std::max(r[i].lo, b.r[i].lo), std::min(r[i].hi, b.r[i].hi)});
  return o;
}
std::int64_t volume(const Region& reg) {
  std::int64_t v = 0;
  for (const auto& b : reg) v += b.volume();
  return v;
}
bool covers(const Region& have, const Box& b) {
  std::int64_t v = 0;
  for (const auto& h : have)
    if (h.intersects(b)) v += h.intersect(b).volume();
  return v == b.volume();
}
std::string box_text(const Box& b) {
  std::string s = "[";
  for (std::size_t i = 0; i < b.r.size(); ++i) s += fmt::format("{}{}:{}", i ? "," : "", b.r[i].lo, b.r[i].hi);
  return s + "]";
}
std::string_view coll_name(CollKind k) {
  switch (k) {
    case CollKind::all_gather:
      return "AllGather";
    case CollKind::all_to_all:
      return "AllToAll";
    case CollKind::broadcast:
      return "Broadcast";
    case CollKind::all_reduce:
      return "AllReduce";
    case CollKind::reduce_scatter:
      return "ReduceScatter";
  }
  return "?";
}

std::vector<int> mesh_coords(const std::vector<int>& mesh, int rank) {
  std::vector<int> c(mesh.size());
  for (int l = static_cast<int>(mesh.size()) - 1; l >= 0; --l) {
    c[l] = rank % mesh[l];
    rank /= mesh[l];
  }
  return c;
}
int mesh_rank(const std::vector<int>& mesh, const std::vector<int>& c) {
  int r = 0;
  for (std::size_t l = 0; l < mesh.size(); ++l) r = r * mesh[l] + c[l];
  return r;
}

std::int64_t acc_elem(const Grid& g, const Buffer& b) { return g.kernel == "attention" ? b.elem + 2 : b.elem; }

std::int64_t Plan::max_peak_bytes() const {
  std::int64_t m = 0;
  for (const auto& r : ranks) m = std::max(m, r.peak_bytes);
  return m;
}
std::vector<double> Plan::bytes_per_level() const {
  std::vector<double> v(grid.mesh.size(), 0.0);
  for (const auto& r : ranks)
    for (const auto& s : r.steps)
      if ((s.kind == StepKind::send || s.kind == StepKind::collective) && s.level >= 0) v[s.level] += s.bytes;
  return v;
}
std::map<std::string, int> Plan::counts() const {
  std::map<std::string, int> c;
  std::set<int> seen;
  for (const auto& r : ranks)
    for (const auto& s : r.steps) {
      if (s.kind == StepKind::send) ++c["p2p"];
      if (s.kind == StepKind::compute) ++c["compute"];
      if (s.kind == StepKind::collective && seen.insert(s.tag).second) ++c[std::string(coll_name(s.coll))];
    }
  return c;
}

namespace {

using Key = std::vector<std::int64_t>;
Key key_of(const Box& b) {
  Key k;
  for (const auto& x : b.r) {
    k.push_back(x.lo);
    k.push_back(x.hi);
  }
  return k;
}

// True when the union of `have` (boxes may overlap) covers `b`: what is
// left of b after taking away each box of `have` in turn is empty.
bool covers_union(const Region& have, const Box& b) {
  Region left{b};
  for (const auto& h : have) {
    Region next;
    for (Box x : left) {
      if (!x.intersects(h)) {
        next.push_back(x);
        continue;
      }
      for (std::size_t d = 0; d < x.r.size(); ++d) {  // the slabs of x outside h along d, then x narrows to h
        if (x.r[d].lo < h.r[d].lo) {
          Box s = x;
          s.r[d] = {x.r[d].lo, h.r[d].lo};
          next.push_back(s);
        }
        if (h.r[d].hi < x.r[d].hi) {
          Box s = x;
          s.r[d] = {h.r[d].hi, x.r[d].hi};
          next.push_back(s);
        }
        x.r[d] = {std::max(x.r[d].lo, h.r[d].lo), std::min(x.r[d].hi, h.r[d].hi)};
      }
    }
    left = std::move(next);
  }
  return std::all_of(left.begin(), left.end(), [](const Box& x) { return x.volume() == 0; });
}

std::vector<Range> merge(std::vector<Range> v) {
  std::sort(v.begin(), v.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
  std::vector<Range> o;
  for (const auto& x : v) {
    if (x.size() <= 0) continue;
    if (!o.empty() && x.lo <= o.back().hi)
      o.back().hi = std::max(o.back().hi, x.hi);
    else
      o.push_back(x);
  }
  return o;
}

struct Lowerer {
  const Grid& g;
  int W = 1, T = 1, L = 0;
  std::vector<std::vector<int>> coords;
  std::vector<int> seq;  // indices into g.loops of sequential loops, nest order
  std::vector<std::int64_t> seq_ext;
  std::vector<const Loop*> par;  // per level
  Plan plan;
  int next_tag = 1;
  std::vector<std::vector<std::int64_t>> mem;  // [rank][t+1]

  explicit Lowerer(const Grid& grid) : g(grid) {}

  std::vector<std::int64_t> tvec(int t) const {
    std::vector<std::int64_t> v(seq.size());
    for (int i = static_cast<int>(seq.size()) - 1; i >= 0; --i) {
      v[i] = t % seq_ext[i];
      t = static_cast<int>(t / seq_ext[i]);
    }
    return v;
  }
  int tindex(const std::vector<std::int64_t>& v) const {
    std::int64_t t = 0;
    for (std::size_t i = 0; i < seq.size(); ++i) t = t * seq_ext[i] + v[i];
    return static_cast<int>(t);
  }
  int level_of(const std::string& loop) const { return g.loop(loop, "lower").mesh_level; }

  // Shift offset of sequential loop l: iteration j on the rank at coordinate i
  // of the shifting level runs cell (j + i + offset) mod J. 0 (the seed's
  // (j + i) mod J, own block first) except for the ring reduce-scatter: when
  // the shifting loop is a reduction, a write buffer is sharded along l on
  // its level and no read buffer rides the same ring, offset 1 makes the last
  // iteration on rank i compute cell i — the cell it owns — so the partials
  // pass i+1 -> i along the ring and the finished cell needs no epilogue move
  // (offset 0 finishes cell i-1 on rank i: one whole output cell moved after
  // the last kernel). With a read ring too, offset 0 keeps its first block
  // local (offset 1 would fetch it before step 0, as costly as the move).
  int shift_offset(const Loop& l) const {
    if (l.shift_by.empty()) return 0;
    const Loop& p = g.loop(l.shift_by, "lower");
    if (!is_reduction(p)) return 0;
    bool write_ring = false;
    for (const auto& pl : g.placements) {
      if (pl.loop != p.name || pl.kind != PlacementKind::shard || !pl.along_is_loop || pl.along != l.name) continue;
      if (g.buffer(pl.buffer, "lower").access == Access::read) return 0;
      write_ring = true;
    }
    return write_ring ? 1 : 0;
  }

  // Factor indices from a loop value (mixed radix, major -> minor).
  void decompose(const Loop& l, std::int64_t v, std::map<std::pair<std::string, int>, std::int64_t>& out) const {
    for (int i = static_cast<int>(l.factors.size()) - 1; i >= 0; --i) {
      const auto e = g.factor_extent(l.factors[i]);
      out[{l.factors[i].axis, l.factors[i].level}] = v % e;
      v /= e;
    }
  }

  // The kernel block of `rank` at time vector tv, over grid axes.
  Box kernel_box(int rank, const std::vector<std::int64_t>& tv) const {
    std::map<std::pair<std::string, int>, std::int64_t> idx;
    std::size_t si = 0;
    for (const auto& l : g.loops) {
      std::int64_t v;
      if (l.parallel()) {
        v = coords[rank][l.mesh_level];
      } else {
        v = tv[si++];
        if (!l.shift_by.empty()) v = (v + coords[rank][level_of(l.shift_by)] + shift_offset(l)) % g.loop_extent(l);
      }
      decompose(l, v, idx);
    }
    Box b;
    for (const auto& a : g.axes) {
      Range r{0, a.extent};
      auto it = g.tiling.find(a.name);
      if (it != g.tiling.end())
        for (std::size_t lv = 0; lv < it->second.size(); ++lv)
          r = part(r, it->second[lv], idx.at({a.name, static_cast<int>(lv)}));
      b.r.push_back(r);
    }
    return b;
  }

  std::size_t axis_pos(const std::string& a) const {
    for (std::size_t i = 0; i < g.axes.size(); ++i)
      if (g.axes[i].name == a) return i;
    TESSERA_FAIL("lower: unknown axis {}", a);
  }

  Box project(const Buffer& b, const Box& kb) const {
    Box o;
    for (const auto& d : b.dims) {
      const Range r = kb.r[axis_pos(d.axis)];
      o.r.push_back({r.lo / d.group, (r.hi + d.group - 1) / d.group});
    }
    return o;
  }

  std::int64_t dim_extent(const Dim& d) const { return (g.axis(d.axis).extent + d.group - 1) / d.group; }

  // Region of buffer b held by `rank` when level l has placement pl[l] (nullptr = default).
  Region holding(const Buffer& b, int rank, const std::vector<const Placement*>& pl) const {
    std::map<std::pair<std::string, int>, std::int64_t> fixed;
    for (int l = 0; l < L; ++l) {
      const Placement* p = pl[l];
      const int c = coords[rank][l];
      if (!p) {
        if (g.loop_indexes(*par[l], b)) decompose(*par[l], c, fixed);
      } else if (p->kind == PlacementKind::shard && p->along_is_loop) {
        decompose(g.loop(p->along, "lower"), c, fixed);
      }
    }
    std::vector<std::vector<Range>> per_dim;
    for (const auto& d : b.dims) {
      // Cells of the axis consistent with the fixed factor indices.
      std::vector<Range> cells{{0, g.axis(d.axis).extent}};
      auto it = g.tiling.find(d.axis);
      if (it != g.tiling.end()) {
        for (std::size_t lv = 0; lv < it->second.size(); ++lv) {
          std::vector<Range> next;
          const auto n = it->second[lv];
          auto f = fixed.find({d.axis, static_cast<int>(lv)});
          for (const auto& c : cells)
            for (std::int64_t i = 0; i < n; ++i)
              if (f == fixed.end() || f->second == i) next.push_back(part(c, n, i));
          cells = std::move(next);
        }
      }
      for (auto& c : cells) c = {c.lo / d.group, (c.hi + d.group - 1) / d.group};
      cells = merge(cells);
      // Shards along an axis split each held range again, outer level first
      // (nested, so the union over a level's ranks is the range before it).
      for (int l = 0; l < L; ++l)
        if (pl[l] && pl[l]->kind == PlacementKind::shard && !pl[l]->along_is_loop && pl[l]->along == d.axis)
          for (auto& c : cells) c = part(c, g.mesh[l], coords[rank][l]);
      per_dim.push_back(merge(cells));
    }
    Region reg{Box{}};
    for (const auto& ranges : per_dim) {
      Region next;
      for (const auto& bx : reg)
        for (const auto& r : ranges) {
          Box nb = bx;
          nb.r.push_back(r);
          next.push_back(nb);
        }
      reg = std::move(next);
    }
    return reg;
  }

  std::vector<const Placement*> placements_of(const std::string& b) const {
    std::vector<const Placement*> v(L, nullptr);
    for (int l = 0; l < L; ++l) v[l] = g.placement(b, par[l]->name);
    return v;
  }

  std::vector<int> group_of(int rank, int level) const {
    std::vector<int> m;
    auto c = coords[rank];
    for (int i = 0; i < g.mesh[level]; ++i) {
      c[level] = i;
      m.push_back(mesh_rank(g.mesh, c));
    }
    std::sort(m.begin(), m.end());
    return m;
  }
  int neighbor(int rank, int level, int delta) const {
    auto c = coords[rank];
    c[level] = ((c[level] + delta) % g.mesh[level] + g.mesh[level]) % g.mesh[level];
    return mesh_rank(g.mesh, c);
  }
  int link_level(int a, int b) const {
    for (int l = 0; l < L; ++l)
      if (coords[a][l] != coords[b][l]) return l;
    return L - 1;
  }
  bool is_reduction(const Loop& l) const {
    for (const auto& f : l.factors)
      if (g.axis(f.axis).kind == AxisKind::reduction) return true;
    return false;
  }

  void add(int rank, Step s) { plan.ranks[rank].steps.push_back(std::move(s)); }
  void charge(int rank, int t_from, int t_to, std::int64_t bytes) {
    for (int t = std::max(t_from, -1); t <= std::min(t_to, T + 2); ++t) mem[rank][t + 1] += bytes;
  }

  void p2p(int from, int to, const std::string& buf, const Box& box, int t_send, Slot send_slot, int t_recv,
           bool partial, std::int64_t esize) {
    const int tag = next_tag++;
    const std::int64_t bytes = box.volume() * esize;
    const int lvl = link_level(from, to);
    Step s;
    s.kind = StepKind::send;
    s.time = t_send;
    s.slot = send_slot;
    s.buffer = buf;
    s.box = box;
    s.peer = to;
    s.tag = tag;
    s.partial = partial;
    s.bytes = bytes;
    s.level = lvl;
    add(from, s);
    s.kind = StepKind::recv;
    s.time = t_recv;
    s.slot = Slot::recv;
    s.peer = from;
    add(to, s);
  }

  void collective(CollKind k, const std::string& buf, int t, const std::vector<int>& group, int level, int root,
                  const std::vector<Region>& before, const std::vector<Region>& after, std::int64_t esize) {
    const int tag = next_tag++;
    const double n = static_cast<double>(group.size());
    for (std::size_t i = 0; i < group.size(); ++i) {
      Step s;
      s.kind = StepKind::collective;
      s.time = t;
      s.slot = Slot::collective;
      s.buffer = buf;
      s.coll = k;
      s.tag = tag;
      s.group = group;
      s.root = root;
      s.before = before[i];
      s.after = after[i];
      s.level = level;
      const double va = static_cast<double>(volume(after[i])), vb = static_cast<double>(volume(before[i]));
      double moved = 0;
      switch (k) {
        case CollKind::all_gather:
          moved = va - vb;
          break;
        case CollKind::all_to_all:
          moved = va * (n - 1) / n;
          break;
        case CollKind::broadcast:
          moved = va;
          break;
        case CollKind::all_reduce:
          moved = 2.0 * va * (n - 1) / n;
          break;
        case CollKind::reduce_scatter:
          moved = vb * (n - 1) / n;
          break;
      }
      s.bytes = static_cast<std::int64_t>(moved * static_cast<double>(esize));
      add(group[i], s);
    }
  }

  // The lowering, in its steps (run() calls them in order).
  using Held = std::vector<std::pair<Box, int>>;     // received blocks: box, step obtained
  using Cells = std::map<Key, std::pair<Box, int>>;  // accumulator cell -> (box, last step used)
  std::int64_t es = 1;                               // element bytes
  std::map<std::string, std::vector<Region>> base;   // read buffers after the prologue, per rank
  std::map<std::string, std::vector<Held>> resident;
  std::map<std::string, std::vector<Cells>> acc;
  std::set<std::tuple<std::string, int, int>> bcast_done;  // buffer, first group rank, level (per step)

  void setup();
  void gather_input(const Buffer& b);
  void check_within_group(const Buffer& b, const std::vector<const Placement*>& pl, int l, CollKind kind,
                          const std::vector<int>& grp, const std::vector<Region>& before,
                          const std::vector<Region>& after) const;
  void step(int t);
  void fetch_input(const Buffer& b, int t, const std::vector<std::int64_t>& tv, const std::vector<Box>& kb);
  bool fetch_shifted(const Buffer& b, int r, int t, const std::vector<std::int64_t>& tv, const Box& need, Held& now);
  bool fetch_broadcast(const Buffer& b, int r, int t, const std::vector<const Placement*>& pl,
                       const std::vector<Box>& kb, const Box& need, Held& now);
  void fetch_from_owner(const Buffer& b, int r, int t, const Box& need, Held& now);
  void release_inputs(const Buffer& b, int t, const std::vector<Held>& now);
  void accumulate_output(const Buffer& b, int t, const std::vector<std::int64_t>& tv, const std::vector<Box>& kb);
  void finish_output(const Buffer& b);
  void reduce_levels(const Buffer& b, std::vector<Region>& cur, std::vector<bool>& partial,
                     std::vector<const Placement*>& state);
  void redistribute_levels(const Buffer& b, std::vector<Region>& cur, std::vector<const Placement*>& state);
  static std::vector<Region> finished(const std::vector<Region>& cur, const std::vector<bool>& partial);
  void settle_partials(const Buffer& b, std::vector<Region>& cur);
  void fill_final(const Buffer& b, std::vector<Region>& cur, const std::vector<Region>& ready);
  void fill_from(const Buffer& b, int r, const Box& f, const std::vector<Region>& src, std::vector<Region>& cur, int t);
  Plan finalize();
  // The last time of the plan: T + 1, or T + 2 when the epilogue forwards
  // pieces received at T + 1.
  int last_time() const {
    int t = T + 1;
    for (const auto& rp : plan.ranks)
      for (const auto& s : rp.steps) t = std::max(t, s.time);
    return t;
  }

  Plan run() {
    setup();
    for (const auto& b : g.buffers) gather_input(b);
    for (int t = 0; t < T; ++t) step(t);
    for (const auto& b : g.buffers)
      if (b.access == Access::write) finish_output(b);
    return finalize();
  }
};

void Lowerer::setup() {
  TESSERA_CHECK(!g.kernel.empty(), "lower: grid '{}' has no kernel; apply patch(gemm|attention|add) first", g.name);
  TESSERA_CHECK(!g.mesh.empty(), "lower: grid '{}' has no mesh", g.name);
  L = static_cast<int>(g.mesh.size());
  W = g.world();
  par.assign(L, nullptr);
  for (int l = 0; l < L; ++l) {
    par[l] = g.parallel_loop(l);
    TESSERA_CHECK(par[l],
                  "lower: mesh level {} ({} devices) has no parallel loop; parallelize a loop of extent {} on it", l,
                  g.mesh[l], g.mesh[l]);
  }
  for (std::size_t i = 0; i < g.loops.size(); ++i)
    if (!g.loops[i].parallel()) {
      seq.push_back(static_cast<int>(i));
      seq_ext.push_back(g.loop_extent(g.loops[i]));
    }
  std::int64_t steps = 1;
  for (auto e : seq_ext) steps *= e;
  TESSERA_CHECK(steps <= 1 << 16, "lower: {} sequential steps per rank is too many for a plan", steps);
  T = static_cast<int>(steps);
  for (int r = 0; r < W; ++r) coords.push_back(mesh_coords(g.mesh, r));
  plan.grid = g;
  plan.steps_per_rank = T;
  plan.ranks.resize(W);
  for (int r = 0; r < W; ++r) {
    plan.ranks[r].rank = r;
    plan.ranks[r].coords = coords[r];
  }
  mem.assign(W, std::vector<std::int64_t>(T + 4, 0));
  es = static_cast<std::int64_t>(g.elem_bytes());
  for (const auto& b : g.buffers) {
    if (b.access == Access::read)
      resident[b.name].resize(W);
    else
      acc[b.name].resize(W);
  }
}

// Prologue: the initial layout of every buffer, and the gathers (or
// all-to-alls) that undo its shards along axes no loop walks.
void Lowerer::gather_input(const Buffer& b) {
  auto pl = placements_of(b.name);
  std::vector<Region> hold(W);
  for (int r = 0; r < W; ++r) hold[r] = holding(b, r, pl);
  if (b.access == Access::write) {
    plan.final[b.name] = hold;
    return;
  }
  plan.initial[b.name] = hold;
  const std::int64_t bes = es * b.elem;
  for (int l = L - 1; l >= 0; --l) {
    if (!pl[l] || pl[l]->kind != PlacementKind::shard || pl[l]->along_is_loop) continue;
    auto next = pl;
    next[l] = nullptr;
    const CollKind kind = g.loop_indexes(*par[l], b) ? CollKind::all_to_all : CollKind::all_gather;
    std::set<int> done;
    for (int r = 0; r < W; ++r) {
      if (done.count(r)) continue;
      auto grp = group_of(r, l);
      std::vector<Region> before, after;
      for (int m : grp) {
        done.insert(m);
        before.push_back(hold[m]);
        after.push_back(holding(b, m, next));
      }
      check_within_group(b, pl, l, kind, grp, before, after);
      collective(kind, b.name, -1, grp, l, -1, before, after, bes);
      for (std::size_t i = 0; i < grp.size(); ++i) {
        if (kind == CollKind::all_to_all) charge(grp[i], -1, -1, volume(before[i]) * bes);
        hold[grp[i]] = after[i];
      }
    }
    pl = next;
  }
  for (int r = 0; r < W; ++r) charge(r, -1, T + 2, volume(hold[r]) * bes);
  base[b.name] = hold;
}

// A prologue collective moves data within its group only: every member's
// new region must come from the group's old ones. Shards on several levels
// can break that (an outer shard along an axis that an inner parallel loop
// tiles splits each inner cell, not the axis), and such a schedule is
// refused naming the placements.
void Lowerer::check_within_group(const Buffer& b, const std::vector<const Placement*>& pl, int l, CollKind kind,
                                 const std::vector<int>& grp, const std::vector<Region>& before,
                                 const std::vector<Region>& after) const {
  Region have;
  for (const auto& reg : before) have.insert(have.end(), reg.begin(), reg.end());
  for (std::size_t i = 0; i < grp.size(); ++i)
    for (const auto& x : after[i]) {
      if (covers_union(have, x)) continue;
      std::string others;
      for (int k = 0; k < L; ++k)
        if (k != l && pl[k] && pl[k]->kind == PlacementKind::shard)
          others += fmt::format(" with shard({},{},{}) on level {}", b.name, pl[k]->loop, pl[k]->along, k);
      TESSERA_FAIL(
          "lower: shard({},{},{}){}: the level-{} {} of {} that undoes it cannot give rank {} {}{}: no rank of its "
          "group {{{}}} holds it (an outer shard along an axis that an inner parallel loop tiles splits each inner "
          "cell, not the axis; shard that level along another axis)",
          b.name, pl[l]->loop, pl[l]->along, others, l, coll_name(kind), b.name, grp[i], b.name, box_text(x),
          fmt::join(grp, ","));
    }
}

// Main loop, step t: every rank obtains the input blocks its kernel block
// needs, accumulates its output cells, and computes.
void Lowerer::step(int t) {
  const auto tv = tvec(t);
  std::vector<Box> kb(W);
  for (int r = 0; r < W; ++r) kb[r] = kernel_box(r, tv);
  bcast_done.clear();
  for (const auto& b : g.buffers) {
    if (b.access == Access::read)
      fetch_input(b, t, tv, kb);
    else
      accumulate_output(b, t, tv, kb);
  }
  for (int r = 0; r < W; ++r) {
    Step c;
    c.kind = StepKind::compute;
    c.time = t;
    c.slot = Slot::compute;
    c.box = kb[r];
    add(r, c);
  }
}

void Lowerer::fetch_input(const Buffer& b, int t, const std::vector<std::int64_t>& tv, const std::vector<Box>& kb) {
  const auto pl = placements_of(b.name);
  std::vector<Held> now(W);
  for (int r = 0; r < W; ++r) {
    const Box need = project(b, kb[r]);
    // R1: held since the prologue, or received earlier and still resident.
    bool held = false;
    for (const auto& h : base[b.name][r]) held |= h.contains(need);
    if (held) continue;
    bool got = false;
    for (const auto& [bx, since] : resident[b.name][r])
      if (bx.contains(need)) {
        now[r].push_back({bx, since});
        got = true;
        break;
      }
    if (got) continue;
    // R2 shifted loops, innermost first; R3 a lockstep broadcast; R4 the nearest owner.
    if (!fetch_shifted(b, r, t, tv, need, now[r]) && !fetch_broadcast(b, r, t, pl, kb, need, now[r]))
      fetch_from_owner(b, r, t, need, now[r]);
  }
  release_inputs(b, t, now);
}

bool Lowerer::fetch_shifted(const Buffer& b, int r, int t, const std::vector<std::int64_t>& tv, const Box& need,
                            Held& now) {
  const std::int64_t bes = es * b.elem;
  for (int si = static_cast<int>(seq.size()) - 1; si >= 0; --si) {
    const Loop& lp = g.loops[seq[si]];
    if (lp.shift_by.empty() || tv[si] == 0) continue;
    const int q = neighbor(r, level_of(lp.shift_by), +1);
    auto tv2 = tv;
    tv2[si] -= 1;
    if (project(b, kernel_box(q, tv2)) != need) continue;
    const int t2 = tindex(tv2);
    p2p(q, r, b.name, need, t2, Slot::send, t, false, bes);
    charge(r, t2, t, need.volume() * bes);
    now.push_back({need, t});
    return true;
  }
  return false;
}

// Along a sequential, unshifted loop every rank of a group needs the same
// block at the same step: one broadcast from a rank that holds it.
bool Lowerer::fetch_broadcast(const Buffer& b, int r, int t, const std::vector<const Placement*>& pl,
                              const std::vector<Box>& kb, const Box& need, Held& now) {
  const std::int64_t bes = es * b.elem;
  for (int l = 0; l < L; ++l) {
    const Placement* p = pl[l];
    if (!p || p->kind != PlacementKind::shard || !p->along_is_loop) continue;
    if (!g.loop(p->along, "lower").shift_by.empty()) continue;
    const auto grp = group_of(r, l);
    bool same = true;
    int root = -1;
    for (int m : grp) {
      same &= project(b, kb[m]) == need;
      for (const auto& h : base[b.name][m])
        if (root < 0 && h.contains(need)) root = m;
    }
    if (!same || root < 0) continue;
    if (bcast_done.insert({b.name, grp.front(), l}).second) {
      std::vector<Region> before, after;
      for (int m : grp) {
        before.push_back(m == root ? Region{need} : Region{});
        after.push_back(Region{need});
      }
      collective(CollKind::broadcast, b.name, t, grp, l, root, before, after, bes);
    }
    if (r != root) {
      charge(r, t, t, need.volume() * bes);
      now.push_back({need, t});
    }
    return true;
  }
  return false;
}

void Lowerer::fetch_from_owner(const Buffer& b, int r, int t, const Box& need, Held& now) {
  int owner = -1;
  for (int l = L; l >= 0 && owner < 0; --l)
    for (int q = 0; q < W && owner < 0; ++q) {
      if (q == r || (l < L && link_level(q, r) < l)) continue;
      for (const auto& h : base[b.name][q])
        if (h.contains(need)) {
          owner = q;
          break;
        }
    }
  TESSERA_CHECK(owner >= 0, "lower: rank {} at step {} needs {}{} which no rank holds", r, t, b.name, box_text(need));
  const int ts = std::max(0, t - 1);
  const std::int64_t bes = es * b.elem;
  p2p(owner, r, b.name, need, ts, Slot::pre_send, t, false, bes);
  charge(r, ts, t, need.volume() * bes);
  now.push_back({need, t});
}

// Received blocks not needed at step t are freed at the end of step t - 1.
void Lowerer::release_inputs(const Buffer& b, int t, const std::vector<Held>& now) {
  const std::int64_t bes = es * b.elem;
  for (int r = 0; r < W; ++r) {
    for (const auto& [bx, since] : resident[b.name][r]) {
      bool keep = false;
      for (const auto& [nb, s2] : now[r]) keep |= nb == bx;
      if (!keep) {
        Step f;
        f.kind = StepKind::free_block;
        f.time = t - 1;
        f.slot = Slot::free;
        f.buffer = b.name;
        f.box = bx;
        add(r, f);
      } else {
        charge(r, t, t, bx.volume() * bes);
      }
    }
    resident[b.name][r] = now[r];
  }
}

// A write buffer's cell is accumulated where it is computed; along a shifted
// reduction loop the partial cell travels with the ring to the next rank.
void Lowerer::accumulate_output(const Buffer& b, int t, const std::vector<std::int64_t>& tv,
                                const std::vector<Box>& kb) {
  const std::int64_t aes = es * acc_elem(g, b);
  const auto pl = placements_of(b.name);
  for (int r = 0; r < W; ++r) {
    const Box cell = project(b, kb[r]);
    auto& mine = acc[b.name][r];
    auto it = mine.find(key_of(cell));
    if (it != mine.end()) {
      it->second.second = t;
      continue;
    }
    bool ring = false, moved = false;  // ring: the output is reduced along a shifted loop (no collective)
    for (int si = static_cast<int>(seq.size()) - 1; si >= 0; --si) {
      const Loop& lp = g.loops[seq[si]];
      if (lp.shift_by.empty()) continue;
      const int lvl = level_of(lp.shift_by);
      const Placement* p = pl[lvl];
      if (!p || !p->along_is_loop || p->along != lp.name) continue;
      ring = true;
      if (tv[si] == 0) continue;
      const int q = neighbor(r, lvl, +1);
      auto tv2 = tv;
      tv2[si] -= 1;
      const int t2 = tindex(tv2);
      auto& theirs = acc[b.name][q];
      auto jt = theirs.find(key_of(cell));
      if (jt == theirs.end() || jt->second.second != t2) continue;
      p2p(q, r, b.name, cell, t2, Slot::partial_send, t, true, aes);
      theirs.erase(jt);
      moved = true;
      break;
    }
    // A ring-reduced cell is never reduced by a collective, so its partial
    // must reach the rank that continues it even when the neighbour did not
    // finish it one step earlier (further sequential loops inside the shifted
    // one, or an order that revisits cells after the ring wrapped): from
    // whichever rank holds it, after that rank's last use.
    if (ring && !moved)
      for (int q = 0; q < W; ++q) {
        if (q == r) continue;
        auto& theirs = acc[b.name][q];
        auto jt = theirs.find(key_of(cell));
        if (jt == theirs.end() || jt->second.second >= t) continue;
        p2p(q, r, b.name, cell, jt->second.second, Slot::partial_send, t, true, aes);
        theirs.erase(jt);
        break;
      }
    mine[key_of(cell)] = {cell, t};
    // An upper bound: a cell moved away stays counted on the rank it left.
    charge(r, t, T + 2, cell.volume() * aes);
  }
}

// Epilogue of a write buffer: reductions, redistribution, then whatever
// the final layout still lacks.
void Lowerer::finish_output(const Buffer& b) {
  std::vector<Region> cur(W);
  for (int r = 0; r < W; ++r)
    for (const auto& [k, v] : acc[b.name][r]) cur[r].push_back(v.first);
  std::vector<bool> partial(W, false);
  std::vector<const Placement*> state(L, nullptr);  // the layout so far (default)
  reduce_levels(b, cur, partial, state);
  redistribute_levels(b, cur, state);
  const std::vector<Region> ready = finished(cur, partial);  // before T + 1
  if (std::find(partial.begin(), partial.end(), true) != partial.end()) settle_partials(b, cur);
  fill_final(b, cur, ready);
}

// Reduction levels, outer -> inner: shards along an axis nest outer level
// first, so scattering in that order lands each part on its owner. Groups
// whose ranks hold different cells are left partial.
void Lowerer::reduce_levels(const Buffer& b, std::vector<Region>& cur, std::vector<bool>& partial,
                            std::vector<const Placement*>& state) {
  const std::int64_t aes = es * acc_elem(g, b);
  const auto pl = placements_of(b.name);
  for (int l = 0; l < L; ++l) {
    if (!is_reduction(*par[l])) continue;
    const Placement* p = pl[l];
    state[l] = p;
    if (p && p->along_is_loop && !g.loop(p->along, "lower").shift_by.empty()) continue;  // ring already reduced
    std::set<int> done;
    for (int r = 0; r < W; ++r) {
      if (done.count(r)) continue;
      auto grp = group_of(r, l);
      for (int m : grp) done.insert(m);
      bool same = true;
      for (int m : grp) {
        auto a = cur[m], c = cur[grp[0]];
        auto lt = [](const Box& x, const Box& y) { return key_of(x) < key_of(y); };
        std::sort(a.begin(), a.end(), lt);
        std::sort(c.begin(), c.end(), lt);
        same &= a == c;
      }
      if (!same) {
        for (int m : grp) partial[m] = true;
        continue;
      }
      const bool scatter = p && p->kind == PlacementKind::shard;
      std::vector<Region> before, after;
      for (int m : grp) {
        before.push_back(cur[m]);
        if (!scatter) {
          after.push_back(cur[m]);
        } else {
          Region tgt = holding(b, m, state), out;
          for (const auto& x : cur[m])
            for (const auto& y : tgt)
              if (x.intersects(y)) out.push_back(x.intersect(y));
          after.push_back(out);
        }
      }
      collective(scatter ? CollKind::reduce_scatter : CollKind::all_reduce, b.name, T, grp, l, -1, before, after, aes);
      for (std::size_t i = 0; i < grp.size(); ++i) cur[grp[i]] = after[i];
    }
  }
}

// Spatial levels whose final layout differs from the computed one (outer first, as above).
void Lowerer::redistribute_levels(const Buffer& b, std::vector<Region>& cur, std::vector<const Placement*>& state) {
  const std::int64_t aes = es * acc_elem(g, b);
  const auto pl = placements_of(b.name);
  for (int l = 0; l < L; ++l) {
    if (is_reduction(*par[l]) || !pl[l]) continue;
    const Placement* p = pl[l];
    if (p->kind == PlacementKind::shard && p->along_is_loop) continue;
    auto next = state;
    next[l] = p;
    std::set<int> done;
    for (int r = 0; r < W; ++r) {
      if (done.count(r)) continue;
      auto grp = group_of(r, l);
      Region uni;
      for (int m : grp) {
        done.insert(m);
        uni.insert(uni.end(), cur[m].begin(), cur[m].end());
      }
      std::vector<Region> before, after;
      for (int m : grp) {
        before.push_back(cur[m]);
        Region out;
        for (const auto& y : holding(b, m, next))
          for (const auto& x : uni)
            if (x.intersects(y)) out.push_back(x.intersect(y));
        after.push_back(out);
      }
      const CollKind k = p->kind == PlacementKind::replicate ? CollKind::all_gather : CollKind::all_to_all;
      collective(k, b.name, T, grp, l, -1, before, after, aes);
      for (std::size_t i = 0; i < grp.size(); ++i) {
        charge(grp[i], T, T, volume(after[i]) * aes);
        cur[grp[i]] = after[i];
      }
    }
    state = next;
  }
}

// The cells each rank holds finished after reduce_levels: not those that
// several of the ranks left partial hold (settle_partials completes them at
// T + 1).
std::vector<Region> Lowerer::finished(const std::vector<Region>& cur, const std::vector<bool>& partial) {
  std::map<Key, int> holders;
  for (std::size_t r = 0; r < cur.size(); ++r)
    if (partial[r])
      for (const auto& x : cur[r]) ++holders[key_of(x)];
  std::vector<Region> out = cur;
  for (std::size_t r = 0; r < out.size(); ++r)
    if (partial[r]) std::erase_if(out[r], [&](const Box& x) { return holders[key_of(x)] > 1; });
  return out;
}

// Partials left by reduce_levels: each cell held by several ranks is summed
// at one holder (one whose final layout covers it, if any) by P2P.
void Lowerer::settle_partials(const Buffer& b, std::vector<Region>& cur) {
  const std::int64_t aes = es * acc_elem(g, b);
  std::map<Key, std::vector<int>> holders;
  for (int r = 0; r < W; ++r)
    for (const auto& x : cur[r]) holders[key_of(x)].push_back(r);
  for (auto& [k, hs] : holders) {
    if (hs.size() < 2) continue;
    Box cell;
    for (const auto& x : cur[hs[0]])
      if (key_of(x) == k) cell = x;
    int target = hs[0];
    for (int h : hs)
      if (covers(plan.final[b.name][h], cell)) {
        target = h;
        break;
      }
    for (int h : hs) {
      if (h == target) continue;
      p2p(h, target, b.name, cell, T + 1, Slot::pre_send, T + 1, true, aes);
      auto& v = cur[h];
      v.erase(std::remove(v.begin(), v.end(), cell), v.end());
    }
  }
}

// Whatever a rank's final layout still lacks comes by P2P from a holder:
// at T + 1 from what a rank held finished before it (`ready`), at T + 2 from
// what it received at T + 1 (a settled partial, or a piece another rank
// filled), so that no rank sends a piece before it has it. The nearest
// holder (the deepest mesh level shared) sends.
void Lowerer::fill_final(const Buffer& b, std::vector<Region>& cur, const std::vector<Region>& ready) {
  for (const int t : {T + 1, T + 2}) {
    const std::vector<Region> src = t == T + 1 ? ready : cur;
    for (int r = 0; r < W; ++r)
      for (const auto& f : plan.final[b.name][r])
        if (!covers(cur[r], f)) fill_from(b, r, f, src, cur, t);
  }
  for (int r = 0; r < W; ++r)
    for (const auto& f : plan.final[b.name][r])
      TESSERA_CHECK(covers(cur[r], f), "lower: rank {} must end with {}{} but no rank holds all of it", r, b.name,
                    box_text(f));
}

// The pieces of `f` that rank r lacks, from the holders in `src`, nearest first.
void Lowerer::fill_from(const Buffer& b, int r, const Box& f, const std::vector<Region>& src, std::vector<Region>& cur,
                        int t) {
  const std::int64_t aes = es * acc_elem(g, b);
  std::vector<int> order;
  for (int q = 0; q < W; ++q)
    if (q != r) order.push_back(q);
  std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return link_level(a, r) > link_level(c, r); });
  for (int q : order)
    for (const auto& x : src[q]) {
      if (!x.intersects(f)) continue;
      const Box piece = x.intersect(f);
      if (covers(cur[r], piece)) continue;
      p2p(q, r, b.name, piece, t, Slot::pre_send, t, false, aes);
      charge(r, t, t, piece.volume() * aes);
      cur[r].push_back(piece);
    }
}

Plan Lowerer::finalize() {
  for (int r = 0; r < W; ++r) {
    Step f;
    f.kind = StepKind::finalize;
    f.time = last_time();
    f.slot = Slot::free;
    add(r, f);
    auto& st = plan.ranks[r].steps;
    std::stable_sort(st.begin(), st.end(), [](const Step& a, const Step& b) {
      return a.time != b.time ? a.time < b.time : static_cast<int>(a.slot) < static_cast<int>(b.slot);
    });
    plan.ranks[r].peak_bytes = *std::max_element(mem[r].begin(), mem[r].end());
  }
  return std::move(plan);
}

}  // namespace

Plan lower(const Grid& g) { return Lowerer(g).run(); }

std::string describe(const Plan& p, int max_steps) {
  std::string s = fmt::format("plan for {} on mesh {}: {} ranks, {} steps each, peak {:.3f} MiB per rank\n",
                              p.grid.name, mesh_string(p.grid.mesh), p.ranks.size(), p.steps_per_rank,
                              static_cast<double>(p.max_peak_bytes()) / (1 << 20));
  for (const auto& [k, v] : p.counts()) s += fmt::format("  {} x{}\n", k, v);
  for (const auto& r : p.ranks) {
    s += fmt::format("rank {} (coords {}), peak {:.3f} MiB\n", r.rank, fmt::join(r.coords, ","),
                     static_cast<double>(r.peak_bytes) / (1 << 20));
    int n = 0;
    for (const auto& st : r.steps) {
      if (++n > max_steps) {
        s += fmt::format("  ... {} more\n", r.steps.size() - max_steps);
        break;
      }
      const std::string when = st.time < 0 ? "pro" : st.time >= p.steps_per_rank ? "epi" : fmt::format("t{}", st.time);
      switch (st.kind) {
        case StepKind::compute:
          s += fmt::format("  {:>4} compute {} {}\n", when, p.grid.kernel, box_text(st.box));
          break;
        case StepKind::send:
          s += fmt::format("  {:>4} send{} {}{} -> {}\n", when, st.partial ? " partial" : "", st.buffer,
                           box_text(st.box), st.peer);
          break;
        case StepKind::recv:
          s += fmt::format("  {:>4} recv{} {}{} <- {}\n", when, st.partial ? " partial" : "", st.buffer,
                           box_text(st.box), st.peer);
          break;
        case StepKind::collective:
          s += fmt::format("  {:>4} {} {} group {{{}}} level {}{}\n", when, coll_name(st.coll), st.buffer,
                           fmt::join(st.group, ","), st.level, st.root >= 0 ? fmt::format(" root {}", st.root) : "");
          break;
        case StepKind::free_block:
          s += fmt::format("  {:>4} free {}{}\n", when, st.buffer, box_text(st.box));
          break;
        case StepKind::finalize:
          s += fmt::format("  {:>4} finalize\n", when);
          break;
      }
    }
  }
  return s;
}

}  // namespace tessera::commir
