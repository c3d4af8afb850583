// CommIR cost model, schedule search and graph-level search (see tuner.hpp).
#include "tessera/commir/tuner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <set>

#include "tessera/commir/text.hpp"
#include "tessera/commir/transforms.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::commir {
namespace {

double kernel_flops(const Grid& g, const Box& b) {
  double v = 1;
  for (const auto& r : b.r) v *= static_cast<double>(r.size());
  if (g.kernel == "gemm") return 2.0 * v;
  if (g.kernel == "attention") return 4.0 * v * static_cast<double>(g.buffer(g.body.ins[0]).elem);
  return v;
}

double xfer_us(double bytes, double gbps) { return bytes / (gbps * 1e3); }

}  // namespace

Estimate estimate(const Plan& p, const MachineProfile& prof) {
  const Grid& g = p.grid;
  const int W = static_cast<int>(p.ranks.size()), L = static_cast<int>(g.mesh.size());
  const auto links = prof.links(g.mesh);
  const double rate = (g.kernel == "attention" ? prof.attention_tflops : prof.gemm_tflops) * 1e6;  // flop per us
  std::map<std::pair<int, int>, std::vector<std::pair<int, const Step*>>> buckets;
  for (int r = 0; r < W; ++r)
    for (const auto& s : p.ranks[r].steps) buckets[{s.time, static_cast<int>(s.slot)}].push_back({r, &s});
  std::vector<double> clock(W, 0), comp(W, 0), comm(W, 0);
  std::vector<std::vector<double>> out_free(W, std::vector<double>(L, 0)), in_free = out_free;
  std::map<int, double> arrival;
  for (auto& [when, items] : buckets) {
    std::map<int, std::vector<std::pair<int, const Step*>>> colls;
    for (auto [r, s] : items) {
      switch (s->kind) {
        case StepKind::compute: {
          const double d = kernel_flops(g, s->box) / rate + prof.kernel_overhead_us;
          clock[r] += d;
          comp[r] += d;
          break;
        }
        case StepKind::send: {
          const int l = std::max(0, s->level);
          const double start = std::max({clock[r], out_free[r][l], in_free[s->peer][l]});
          const double d = links[l].latency_us + xfer_us(static_cast<double>(s->bytes), links[l].p2p_gbps);
          arrival[s->tag] = start + d;
          out_free[r][l] = in_free[s->peer][l] = start + d;
          comm[r] += d;
          break;
        }
        case StepKind::recv: {
          auto it = arrival.find(s->tag);
          TESSERA_CHECK(it != arrival.end(), "estimate: receive {} on rank {} before its send", s->tag, r);
          clock[r] = std::max(clock[r], it->second);
          break;
        }
        case StepKind::collective:
          colls[s->tag].push_back({r, s});
          break;
        default:
          break;
      }
    }
    for (auto& [tag, members] : colls) {
      double start = 0, bytes = 0;
      for (auto [r, s] : members) {
        start = std::max(start, clock[r]);
        bytes = std::max(bytes, static_cast<double>(s->bytes));
      }
      const int l = std::max(0, members.front().second->level);
      const double d = links[l].latency_us + xfer_us(bytes, links[l].coll_gbps);
      for (auto [r, s] : members) {
        clock[r] = start + d;
        comm[r] += d;
      }
    }
  }
  Estimate e;
  e.time_us = *std::max_element(clock.begin(), clock.end());
  e.compute_us = *std::max_element(comp.begin(), comp.end());
  e.comm_us = *std::max_element(comm.begin(), comm.end());
  e.bytes_per_level = p.bytes_per_level();
  e.peak_bytes = p.max_peak_bytes();
  return e;
}

std::vector<Candidate> pareto_front(std::vector<Candidate> c) {
  std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) {
    return a.est.time_us != b.est.time_us ? a.est.time_us < b.est.time_us : a.est.peak_bytes < b.est.peak_bytes;
  });
  std::vector<Candidate> front;
  for (auto& x : c)
    if (front.empty() || x.est.peak_bytes < front.back().est.peak_bytes) front.push_back(std::move(x));
  return front;
}

namespace {

std::string kernel_for(const Grid& g) {
  switch (g.body.kind) {
    case BodyKind::contract:
      return "gemm";
    case BodyKind::attend:
      return "attention";
    case BodyKind::add:
      return "add";
  }
  return "";
}

// Communication choice of one level: a script fragment built once the
// parallel loop's name is known; `tiles` counts tiles per axis for loop names.
using Choice = std::function<std::string(const std::string& ploop, std::map<std::string, int>& tiles)>;

std::string next_loop(std::map<std::string, int>& tiles, const std::string& axis) {
  return axis + std::to_string(tiles[axis]++);
}

std::vector<Choice> level_choices(const Grid& g, const std::string& pax, int size) {
  std::vector<Choice> out;
  out.push_back([](const std::string&, std::map<std::string, int>&) { return std::string(); });  // replicate (default)
  const bool red = g.axis(pax).kind == AxisKind::reduction;
  std::vector<const Buffer*> reads_not, reads_idx;
  const Buffer* outb = g.find_buffer(g.body.out);
  for (const auto& b : g.buffers)
    if (b.access == Access::read) (b.indexed_by(pax) ? reads_idx : reads_not).push_back(&b);
  auto largest_other = [&](const Buffer& b) {
    std::string best;
    std::int64_t e = 0;
    for (const auto& d : b.dims)
      if (d.axis != pax && g.axis(d.axis).extent / d.group > e) {
        e = g.axis(d.axis).extent / d.group;
        best = d.axis;
      }
    return best;
  };
  if (!reads_not.empty())
    out.push_back([=](const std::string& P, std::map<std::string, int>&) {
      std::string s;
      for (auto* b : reads_not) s += fmt::format(" shard({},{},{})", b->name, P, largest_other(*b));
      return s;
    });
  for (const auto& a : g.axes) {
    if (a.name == pax || a.extent < size) continue;
    bool moves = false;
    for (auto* b : reads_not) moves |= b->indexed_by(a.name);
    if (red && outb && outb->indexed_by(a.name)) moves = true;
    if (!moves) continue;
    const std::string ax = a.name;
    out.push_back([=](const std::string& P, std::map<std::string, int>& tiles) {
      const std::string l = next_loop(tiles, ax);
      return fmt::format(" tile({},{}) shift({},{})", ax, size, l, P);
    });
    std::vector<std::string> bs;
    for (auto* b : reads_not)
      if (b->indexed_by(ax)) bs.push_back(b->name);
    if (!bs.empty())
      out.push_back([=](const std::string& P, std::map<std::string, int>& tiles) {
        const std::string l = next_loop(tiles, ax);
        std::string s = fmt::format(" tile({},{})", ax, size);
        for (const auto& b : bs) s += fmt::format(" shard({},{},{})", b, P, l);
        return s;
      });
  }
  if (!red && !reads_idx.empty())
    out.push_back([=](const std::string& P, std::map<std::string, int>&) {
      std::string s;
      for (auto* b : reads_idx) s += fmt::format(" shard({},{},{})", b->name, P, largest_other(*b));
      if (outb && outb->indexed_by(pax)) s += fmt::format(" shard({},{},{})", outb->name, P, largest_other(*outb));
      return s;
    });
  if (red && outb)
    out.push_back([=](const std::string& P, std::map<std::string, int>&) {
      return fmt::format(" shard({},{},{})", outb->name, P, largest_other(*outb));
    });
  return out;
}

}  // namespace

TuneResult tune(const Grid& op, const MachineProfile& prof, const TuneOptions& opt) {
  validate(op, "tune");
  TESSERA_CHECK(!op.mesh.empty(), "tune: grid '{}' has no mesh", op.name);
  TESSERA_CHECK(std::isfinite(opt.budget_s) && opt.budget_s >= 0, "tune: budget {} s must be finite and >= 0",
                opt.budget_s);
  TESSERA_CHECK(std::isfinite(opt.memory_limit_gb) && opt.memory_limit_gb >= 0,
                "tune: memory limit {} GB must be finite and >= 0", opt.memory_limit_gb);
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt.budget_s));
  auto out_of_time = [&] { return opt.budget_s > 0 && Clock::now() >= deadline; };
  TESSERA_CHECK(op.loops.empty() && op.placements.empty(),
                "tune: grid '{}' is already scheduled; pass the bare operator", op.name);
  const int L = static_cast<int>(op.mesh.size());
  const std::string kernel = kernel_for(op);
  const double limit = (opt.memory_limit_gb > 0 ? opt.memory_limit_gb : prof.memory_gb) * 1e9;
  TuneResult res;
  std::set<std::string> seen;
  std::vector<Candidate> feasible;
  // Parallel axis per level.
  std::vector<int> assign(L, 0);
  const int A = static_cast<int>(op.axes.size());
  std::function<void(int)> per_level;
  for (; !res.out_of_time;) {
    bool fits = true;
    std::map<std::string, std::int64_t> prod;
    for (int l = 0; l < L; ++l) {
      auto& p = prod[op.axes[assign[l]].name];
      p = (p ? p : 1) * op.mesh[l];
    }
    for (auto& [a, p] : prod) fits &= op.axis(a).extent >= p;
    if (fits) {
      std::vector<std::vector<Choice>> choices(L);
      for (int l = 0; l < L; ++l) choices[l] = level_choices(op, op.axes[assign[l]].name, op.mesh[l]);
      std::vector<std::size_t> pick(L, 0);
      for (; !res.out_of_time;) {
        std::vector<std::string> extras{""};
        if (opt.extra_tiling)
          for (const auto& a : op.axes)
            if (a.kind == AxisKind::reduction) extras.push_back(a.name);
        for (const auto& extra : extras)
          for (int order = 0; order < (opt.loop_orders ? 2 : 1); ++order) {
            if (out_of_time()) {
              res.out_of_time = true;
              break;
            }
            std::map<std::string, int> tiles;
            std::string script;
            std::vector<std::string> pl(L);
            for (int l = 0; l < L; ++l) {
              const std::string ax = op.axes[assign[l]].name;
              pl[l] = next_loop(tiles, ax);
              script += fmt::format(" tile({},{}) parallelize({},{})", ax, op.mesh[l], pl[l], l);
            }
            for (int l = 0; l < L; ++l) script += choices[l][pick[l]](pl[l], tiles);
            if (!extra.empty()) {
              script += fmt::format(" tile({},2)", extra);
              next_loop(tiles, extra);
            }
            script += fmt::format(" patch({})", kernel);
            ++res.enumerated;
            Grid g = op;
            try {
              commir::apply(g, script);
              if (order == 1) {
                std::vector<std::string> seqs;
                for (const auto& lp : g.loops)
                  if (!lp.parallel()) seqs.push_back(lp.name);
                if (seqs.size() < 2) continue;
                std::reverse(seqs.begin(), seqs.end());
                reorder(g, seqs);
                script += " reorder(";
                for (std::size_t i = 0; i < seqs.size(); ++i) script += (i ? "," : "") + seqs[i];
                script += ")";
              }
              validate(g, "tune");  // bounds the plan (ranks x steps) before lowering
            } catch (const Error&) {
              ++res.invalid;
              continue;
            }
            if (!seen.insert(print(g)).second) continue;
            Plan plan;
            try {
              plan = lower(g);
            } catch (const Error&) {
              ++res.invalid;
              continue;
            }
            Candidate c{script.substr(1), std::move(g), estimate(plan, prof)};
            if (opt.contract) {
              c.est.reshard_us = contract_reshard_time(*opt.contract, plan, prof);
              c.est.time_us += c.est.reshard_us;
            }
            if (static_cast<double>(c.est.peak_bytes) > limit) {
              ++res.pruned_memory;
              continue;
            }
            feasible.push_back(std::move(c));
          }
        int l = 0;
        while (l < L && ++pick[l] == choices[l].size()) pick[l++] = 0;
        if (l == L) break;
      }
    }
    int l = 0;
    while (l < L && ++assign[l] == A) assign[l++] = 0;
    if (l == L) break;
  }
  // Ties in time: less memory, then less traffic on the outermost (slowest) level.
  std::sort(feasible.begin(), feasible.end(), [](const Candidate& a, const Candidate& b) {
    if (a.est.time_us != b.est.time_us) return a.est.time_us < b.est.time_us;
    if (a.est.peak_bytes != b.est.peak_bytes) return a.est.peak_bytes < b.est.peak_bytes;
    return a.est.bytes_per_level < b.est.bytes_per_level;
  });
  res.pareto = pareto_front(feasible);
  res.ranked = std::move(feasible);
  return res;
}

Layout layout_of(const Plan& p) { return Layout{p.initial, p.final}; }

double reshard_time(const std::vector<int>& mesh, const std::vector<Region>& have, const std::vector<Region>& need,
                    double es, const MachineProfile& prof) {
  const auto links = prof.links(mesh);
  const int W = static_cast<int>(need.size());
  TESSERA_CHECK(static_cast<int>(have.size()) == W, "reshard: {} ranks hold data, {} need it", have.size(), W);
  double worst = 0;
  for (int r = 0; r < W; ++r) {
    double missing = 0;
    int level = -1;
    for (const auto& nb : need[r]) {
      double got = 0;
      for (const auto& h : have[r])
        if (h.intersects(nb)) got += static_cast<double>(h.intersect(nb).volume());
      const double miss = static_cast<double>(nb.volume()) - got;
      if (miss <= 0) continue;
      missing += miss;
      int best = static_cast<int>(links.size()) - 1;
      bool found = false;
      const auto cr = mesh_coords(mesh, r);
      for (int q = 0; q < W; ++q) {
        if (q == r) continue;
        for (const auto& h : have[q])
          if (h.intersects(nb)) {
            const auto cq = mesh_coords(mesh, q);
            int l = 0;
            while (l < static_cast<int>(cr.size()) && cr[l] == cq[l]) ++l;
            best = found ? std::min(best, l) : l;
            found = true;
          }
      }
      level = std::max(level, std::min(best, static_cast<int>(links.size()) - 1));
    }
    if (missing > 0) worst = std::max(worst, links[level].latency_us + xfer_us(missing * es, links[level].p2p_gbps));
  }
  return worst;
}

double contract_reshard_time(const Layout& contract, const Plan& plan, const MachineProfile& prof) {
  const Grid& op = plan.grid;
  double rs = 0;
  for (const auto& [name, regions] : contract.inputs)
    rs += reshard_time(op.mesh, regions, plan.initial.at(name),
                       static_cast<double>(op.elem_bytes() * op.buffer(name).elem), prof);
  for (const auto& [name, regions] : contract.outputs)
    rs += reshard_time(op.mesh, plan.final.at(name), regions,
                       static_cast<double>(op.elem_bytes() * op.buffer(name).elem), prof);
  return rs;
}

double reshard_cost(const Plan& from, const std::string& out, const Plan& to, const std::string& in,
                    const MachineProfile& prof) {
  TESSERA_CHECK(from.grid.mesh == to.grid.mesh, "reshard: meshes differ ({} vs {})", mesh_string(from.grid.mesh),
                mesh_string(to.grid.mesh));
  const auto fit = from.final.find(out);
  const auto tit = to.initial.find(in);
  TESSERA_CHECK(fit != from.final.end(), "reshard: {} is not an output of {}", out, from.grid.name);
  TESSERA_CHECK(tit != to.initial.end(), "reshard: {} is not an input of {}", in, to.grid.name);
  const Buffer& ob = from.grid.buffer(out);
  const Buffer& ib = to.grid.buffer(in);
  TESSERA_CHECK(ob.dims.size() == ib.dims.size() && ob.elem == ib.elem, "reshard: {} and {} differ in shape", out, in);
  return reshard_time(from.grid.mesh, fit->second, tit->second, static_cast<double>(from.grid.elem_bytes() * ob.elem),
                      prof);
}

GraphResult graph_search(const std::vector<std::vector<Candidate>>& cands, const std::vector<GraphEdge>& edges,
                         const MachineProfile& prof) {
  const int N = static_cast<int>(cands.size());
  TESSERA_CHECK(N > 0, "graph search: no operators");
  std::vector<std::vector<Plan>> plans(N);
  double combos = 1;
  for (int i = 0; i < N; ++i) {
    TESSERA_CHECK(!cands[i].empty(), "graph search: operator {} has no candidate", i);
    for (const auto& c : cands[i]) plans[i].push_back(lower(c.grid));
    combos *= static_cast<double>(cands[i].size());
  }
  TESSERA_CHECK(combos <= 1e7, "graph search: {} combinations is too many for exhaustive search; pass fewer candidates",
                combos);
  // Pairwise resharding cost of every edge (Alg. 1 line 7), computed once.
  std::vector<std::vector<std::vector<double>>> rs(edges.size());
  for (std::size_t e = 0; e < edges.size(); ++e) {
    const auto& ed = edges[e];
    TESSERA_CHECK(ed.from >= 0 && ed.from < N && ed.to >= 0 && ed.to < N && ed.from != ed.to,
                  "graph search: edge {} -> {} out of range", ed.from, ed.to);
    rs[e].assign(cands[ed.from].size(), std::vector<double>(cands[ed.to].size()));
    for (std::size_t a = 0; a < cands[ed.from].size(); ++a)
      for (std::size_t b = 0; b < cands[ed.to].size(); ++b)
        rs[e][a][b] = reshard_cost(plans[ed.from][a], ed.out_buffer, plans[ed.to][b], ed.in_buffer, prof);
  }
  GraphResult best;
  best.total_us = std::numeric_limits<double>::infinity();
  std::vector<int> pick(N, 0);
  for (;;) {
    ++best.combinations;
    double total = 0;
    for (int i = 0; i < N; ++i) total += cands[i][pick[i]].est.time_us;
    for (std::size_t e = 0; e < edges.size(); ++e) total += rs[e][pick[edges[e].from]][pick[edges[e].to]];
    if (total < best.total_us) {
      best.total_us = total;
      best.pick = pick;
    }
    int i = 0;
    while (i < N && ++pick[i] == static_cast<int>(cands[i].size())) pick[i++] = 0;
    if (i == N) break;
  }
  best.exec_us.assign(N, 0);
  best.reshard_us.assign(N, 0);
  for (int i = 0; i < N; ++i) best.exec_us[i] = cands[i][best.pick[i]].est.time_us;
  for (std::size_t e = 0; e < edges.size(); ++e)
    best.reshard_us[edges[e].to] += rs[e][best.pick[edges[e].from]][best.pick[edges[e].to]];
  return best;
}

}  // namespace tessera::commir
