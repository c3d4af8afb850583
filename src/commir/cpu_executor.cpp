// CPU reference executor of CommIR plans (see cpu_executor.hpp).
#include "tessera/commir/cpu_executor.hpp"

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <thread>

#include "tessera/runtime/error.hpp"

namespace tessera::commir {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct Block {
  Box box;
  std::int64_t elem = 1;
  std::vector<double> data;
  std::int64_t offset(const std::vector<std::int64_t>& p) const {
    std::int64_t o = 0;
    for (std::size_t i = 0; i < box.r.size(); ++i) o = o * box.r[i].size() + (p[i] - box.r[i].lo);
    return o * elem;
  }
};

void for_each_point(const Box& b, const std::function<void(const std::vector<std::int64_t>&)>& fn) {
  if (b.volume() == 0) return;
  std::vector<std::int64_t> p(b.r.size());
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = b.r[i].lo;
  while (true) {
    fn(p);
    int d = static_cast<int>(p.size()) - 1;
    while (d >= 0 && ++p[d] == b.r[d].hi) {
      p[d] = b.r[d].lo;
      --d;
    }
    if (d < 0) return;
  }
}

Box full_box(const Grid& g, const Buffer& b) {
  Box x;
  for (const auto& d : b.dims) x.r.push_back({0, (g.axis(d.axis).extent + d.group - 1) / d.group});
  return x;
}

// Copies the overlap of src into dst (same elem).
void copy_overlap(const Block& src, Block& dst) {
  if (!src.box.intersects(dst.box)) return;
  for_each_point(src.box.intersect(dst.box), [&](const std::vector<std::int64_t>& p) {
    std::copy_n(src.data.begin() + src.offset(p), src.elem, dst.data.begin() + dst.offset(p));
  });
}

// Merges accumulator `in` into `out` (elem values): sum, or online-softmax state.
void merge_acc(bool attention, const double* in, double* out, std::int64_t elem) {
  if (!attention) {
    for (std::int64_t i = 0; i < elem; ++i) out[i] += in[i];
    return;
  }
  const std::int64_t d = elem - 2;
  const double m1 = out[d], m2 = in[d];
  if (m2 == kNegInf) return;
  if (m1 == kNegInf) {
    std::copy_n(in, elem, out);
    return;
  }
  const double m = std::max(m1, m2), a = std::exp(m1 - m), c = std::exp(m2 - m);
  for (std::int64_t i = 0; i < d; ++i) out[i] = out[i] * a + in[i] * c;
  out[d] = m;
  out[d + 1] = out[d + 1] * a + in[d + 1] * c;
}

struct Message {
  Block block;
};

struct Rendezvous {
  std::vector<std::vector<Block>> deposits;
  int arrived = 0;
};

struct World {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int, Message> mailbox;
  std::map<int, Rendezvous> meets;
  std::atomic<bool> abort{false};
  std::string first_error;
};

struct RankRunner {
  const Plan& plan;
  const Grid& g;
  int rank;
  World& world;
  std::chrono::milliseconds timeout;
  std::map<std::string, std::vector<Block>> store;
  std::int64_t live = 0, peak = 0;
  bool attention;

  void account() {
    live = 0;
    for (const auto& [n, v] : store)
      for (const auto& b : v)
        live += static_cast<std::int64_t>(b.data.size()) * static_cast<std::int64_t>(g.elem_bytes());
    peak = std::max(peak, live);
  }

  const Block* find(const std::string& buf, const Box& box) const {
    auto it = store.find(buf);
    if (it == store.end()) return nullptr;
    for (const auto& b : it->second)
      if (b.box.contains(box)) return &b;
    return nullptr;
  }
  const Block& need(const std::string& buf, const Box& box, const Step& s) const {
    const Block* b = find(buf, box);
    TESSERA_CHECK(b, "cpu executor: rank {} step t{}: {}{} is not present (plan is missing a transfer)", rank, s.time,
                  buf, box_text(box));
    return *b;
  }
  Block extract(const std::string& buf, const Box& box, const Step& s) const {
    const Block& src = need(buf, box, s);
    Block out{box, src.elem, std::vector<double>(box.volume() * src.elem)};
    copy_overlap(src, out);
    return out;
  }

  template <class Pred>
  void wait(std::unique_lock<std::mutex>& lk, Pred ready, const std::string& what) {
    if (!world.cv.wait_for(lk, timeout, [&] { return ready() || world.abort.load(); }))
      TESSERA_FAIL("cpu executor: rank {}: {} timed out after {} ms", rank, what, timeout.count());
    TESSERA_CHECK(!world.abort.load() || ready(),
                  "cpu executor: rank {}: aborted while waiting for {} (another rank failed)", rank, what);
  }

  Box project(const Buffer& b, const Box& kb) const {
    Box o;
    for (const auto& d : b.dims) {
      std::size_t ai = 0;
      while (g.axes[ai].name != d.axis) ++ai;
      o.r.push_back({kb.r[ai].lo / d.group, (kb.r[ai].hi + d.group - 1) / d.group});
    }
    return o;
  }

  Block& acc_block(const Buffer& y, const Box& cell) {
    auto& v = store[y.name];
    for (auto& b : v)
      if (b.box == cell) return b;
    const std::int64_t e = acc_elem(g, y);
    Block nb{cell, e, std::vector<double>(cell.volume() * e, 0.0)};
    if (attention)
      for (std::int64_t i = 0; i < cell.volume(); ++i) nb.data[i * e + e - 2] = kNegInf;
    v.push_back(std::move(nb));
    return v.back();
  }

  void compute(const Step& s) {
    const auto& body = g.body;
    const Buffer& yb = g.buffer(body.out);
    Block& out = acc_block(yb, project(yb, s.box));
    if (g.kernel == "gemm") {
      const Buffer &ab = g.buffer(body.ins[0]), &bb = g.buffer(body.ins[1]);
      const Block& A = need(ab.name, project(ab, s.box), s);
      const Block& B = need(bb.name, project(bb, s.box), s);
      const Box ca = project(ab, s.box), cb = project(bb, s.box);
      for (auto i = ca.r[0].lo; i < ca.r[0].hi; ++i)
        for (auto j = cb.r[1].lo; j < cb.r[1].hi; ++j) {
          double sum = 0;
          for (auto k = ca.r[1].lo; k < ca.r[1].hi; ++k) sum += A.data[A.offset({i, k})] * B.data[B.offset({k, j})];
          out.data[out.offset({i, j})] += sum;
        }
    } else if (g.kernel == "attention") {
      const Buffer &qb = g.buffer(body.ins[0]), &kb = g.buffer(body.ins[1]), &vb = g.buffer(body.ins[2]);
      const Block& Q = need(qb.name, project(qb, s.box), s);
      const Block& K = need(kb.name, project(kb, s.box), s);
      const Block& V = need(vb.name, project(vb, s.box), s);
      const std::int64_t d = qb.elem, grp = kb.dims[1].group;
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      const Box cq = project(qb, s.box);
      const Range kv = project(kb, s.box).r[2];
      std::vector<double> st(d + 2);
      for_each_point(cq, [&](const std::vector<std::int64_t>& p) {
        const double* q = &Q.data[Q.offset(p)];
        std::fill(st.begin(), st.end(), 0.0);
        st[d] = kNegInf;
        for (auto j = kv.lo; j < kv.hi; ++j) {
          const std::vector<std::int64_t> kp{p[0], p[1] / grp, j};
          const double* k = &K.data[K.offset(kp)];
          const double* v = &V.data[V.offset(kp)];
          double sc = 0;
          for (std::int64_t e = 0; e < d; ++e) sc += q[e] * k[e];
          sc *= scale;
          const double m = std::max(st[d], sc), a = std::exp(st[d] - m), c = std::exp(sc - m);
          for (std::int64_t e = 0; e < d; ++e) st[e] = st[e] * a + v[e] * c;
          st[d + 1] = st[d + 1] * a + c;
          st[d] = m;
        }
        merge_acc(true, st.data(), &out.data[out.offset(p)], d + 2);
      });
    } else if (g.kernel == "add") {
      const Box c = project(yb, s.box);
      for (const auto& n : body.ins) {
        const Block& X = need(n, c, s);
        for_each_point(c, [&](const std::vector<std::int64_t>& p) {
          for (std::int64_t e = 0; e < yb.elem; ++e) out.data[out.offset(p) + e] += X.data[X.offset(p) + e];
        });
      }
    } else {
      TESSERA_FAIL("cpu executor: unknown kernel '{}'", g.kernel);
    }
  }

  void collective(const Step& s) {
    const Buffer& b = g.buffer(s.buffer);
    const bool reduce = s.coll == CollKind::all_reduce || s.coll == CollKind::reduce_scatter;
    std::vector<Block> mine;
    for (const auto& blk : store[s.buffer])
      for (const auto& bx : s.before)
        if (blk.box.intersects(bx)) {
          mine.push_back(blk);
          break;
        }
    std::unique_lock lk(world.mu);
    auto& rv = world.meets[s.tag];
    if (rv.deposits.empty()) rv.deposits.resize(s.group.size());
    const auto pos = std::find(s.group.begin(), s.group.end(), rank) - s.group.begin();
    rv.deposits[pos] = std::move(mine);
    ++rv.arrived;
    world.cv.notify_all();
    const int n = static_cast<int>(s.group.size());
    wait(
        lk, [&] { return rv.arrived >= n; }, fmt::format("{} of {} (id {})", coll_name(s.coll), s.buffer, s.tag));
    const auto deposits = rv.deposits;  // copy under the lock
    lk.unlock();
    const std::int64_t e = reduce ? acc_elem(g, b) : (store[s.buffer].empty() ? b.elem : store[s.buffer][0].elem);
    const std::int64_t elem = deposits.empty() ? e : [&] {
      for (const auto& d : deposits)
        if (!d.empty()) return d[0].elem;
      return e;
    }();
    std::vector<Block> result;
    for (const auto& bx : s.after) {
      Block out{bx, elem, std::vector<double>(bx.volume() * elem, 0.0)};
      if (!reduce) {
        Region seen;
        for (const auto& dep : deposits)
          for (const auto& blk : dep)
            if (blk.box.intersects(bx)) {
              copy_overlap(blk, out);
              seen.push_back(blk.box.intersect(bx));
            }
        // Overlapping deposits (replicated data) are fine; coverage is what matters.
        std::int64_t covered = 0;
        for_each_point(bx, [&](const std::vector<std::int64_t>& p) {
          for (const auto& sb : seen)
            if (Box{[&] {
                  std::vector<Range> r;
                  for (auto x : p) r.push_back({x, x + 1});
                  return r;
                }()}
                    .intersects(sb)) {
              ++covered;
              return;
            }
        });
        TESSERA_CHECK(covered == bx.volume(), "cpu executor: rank {}: {} of {}: no member holds all of {}", rank,
                      coll_name(s.coll), s.buffer, box_text(bx));
      } else {
        if (attention)
          for (std::int64_t i = 0; i < bx.volume(); ++i) out.data[i * elem + elem - 2] = kNegInf;
        for (const auto& dep : deposits) {
          Block part{bx, elem, std::vector<double>(bx.volume() * elem, 0.0)};
          if (attention)
            for (std::int64_t i = 0; i < bx.volume(); ++i) part.data[i * elem + elem - 2] = kNegInf;
          std::int64_t covered = 0;
          for (const auto& blk : dep)
            if (blk.box.intersects(bx)) {
              copy_overlap(blk, part);
              covered += blk.box.intersect(bx).volume();
            }
          TESSERA_CHECK(covered == bx.volume(), "cpu executor: rank {}: {} of {}: a member lacks part of {}", rank,
                        coll_name(s.coll), s.buffer, box_text(bx));
          for (std::int64_t i = 0; i < bx.volume(); ++i)
            merge_acc(attention, &part.data[i * elem], &out.data[i * elem], elem);
        }
      }
      result.push_back(std::move(out));
    }
    if (s.coll == CollKind::broadcast) {
      if (rank != s.root)
        for (auto& r : result) store[s.buffer].push_back(std::move(r));
    } else {
      store[s.buffer] = std::move(result);
    }
  }

  void run() {
    attention = g.kernel == "attention";
    const auto& rp = plan.ranks[rank];
    for (const auto& s : rp.steps) {
      if (world.abort.load()) return;
      switch (s.kind) {
        case StepKind::compute:
          compute(s);
          break;
        case StepKind::send: {
          Block blk;
          if (s.partial) {
            auto& v = store[s.buffer];
            auto it = std::find_if(v.begin(), v.end(), [&](const Block& b) { return b.box == s.box; });
            TESSERA_CHECK(it != v.end(), "cpu executor: rank {} t{}: partial {}{} to send is not here", rank, s.time,
                          s.buffer, box_text(s.box));
            blk = std::move(*it);
            v.erase(it);
          } else {
            blk = extract(s.buffer, s.box, s);
          }
          std::lock_guard lk(world.mu);
          world.mailbox[s.tag] = Message{std::move(blk)};
          world.cv.notify_all();
          break;
        }
        case StepKind::recv: {
          std::unique_lock lk(world.mu);
          wait(
              lk, [&] { return world.mailbox.count(s.tag) > 0; },
              fmt::format("step t{}: receive of {}{} from rank {}", s.time, s.buffer, box_text(s.box), s.peer));
          Block blk = std::move(world.mailbox[s.tag].block);
          world.mailbox.erase(s.tag);
          lk.unlock();
          auto& v = store[s.buffer];
          if (s.partial) {
            auto it = std::find_if(v.begin(), v.end(), [&](const Block& b) { return b.box == s.box; });
            if (it != v.end()) {
              for (std::int64_t i = 0; i < blk.box.volume(); ++i)
                merge_acc(attention, &blk.data[i * blk.elem], &it->data[i * blk.elem], blk.elem);
              break;
            }
          }
          v.push_back(std::move(blk));
          break;
        }
        case StepKind::collective:
          collective(s);
          break;
        case StepKind::free_block: {
          auto& v = store[s.buffer];
          auto it = std::find_if(v.begin(), v.end(), [&](const Block& b) { return b.box == s.box; });
          TESSERA_CHECK(it != v.end(), "cpu executor: rank {} t{}: block {}{} to free is not here", rank, s.time,
                        s.buffer, box_text(s.box));
          v.erase(it);
          break;
        }
        case StepKind::finalize:
          if (attention) {
            const Buffer& yb = g.buffer(g.body.out);
            for (auto& blk : store[yb.name]) {
              const std::int64_t d = yb.elem;
              std::vector<double> o(blk.box.volume() * d);
              for (std::int64_t i = 0; i < blk.box.volume(); ++i)
                for (std::int64_t e2 = 0; e2 < d; ++e2)
                  o[i * d + e2] = blk.data[i * (d + 2) + e2] / blk.data[i * (d + 2) + d + 1];
              blk.data = std::move(o);
              blk.elem = d;
            }
          }
          break;
      }
      account();
    }
  }
};

}  // namespace

Tensors random_inputs(const Grid& g, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Tensors t;
  for (const auto& b : g.buffers) {
    if (b.access != Access::read) continue;
    auto& v = t[b.name];
    v.resize(full_box(g, b).volume() * b.elem);
    for (auto& x : v) x = u(rng);
  }
  return t;
}

Tensors reference(const Grid& g, const Tensors& in) {
  TESSERA_CHECK(!g.kernel.empty() || true, "");
  Tensors out;
  const Body& body = g.body;
  const Buffer& yb = g.buffer(body.out, "reference");
  const Box yfull = full_box(g, yb);
  auto& y = out[yb.name];
  y.assign(yfull.volume() * yb.elem, 0.0);
  auto tensor = [&](const std::string& n) -> const std::vector<double>& {
    auto it = in.find(n);
    TESSERA_CHECK(it != in.end(), "reference: input {} missing", n);
    return it->second;
  };
  if (body.kind == BodyKind::contract) {
    const Buffer &ab = g.buffer(body.ins[0]), &bb = g.buffer(body.ins[1]);
    const auto &A = tensor(ab.name), &B = tensor(bb.name);
    const std::int64_t M = g.axis(yb.dims[0].axis).extent, N = g.axis(yb.dims[1].axis).extent,
                       K = g.axis(ab.dims[1].axis).extent;
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (std::int64_t k = 0; k < K; ++k) s += A[i * K + k] * B[k * N + j];
        y[i * N + j] = s;
      }
  } else if (body.kind == BodyKind::attend) {
    const Buffer &qb = g.buffer(body.ins[0]), &kb = g.buffer(body.ins[1]);
    const auto &Q = tensor(body.ins[0]), &K = tensor(body.ins[1]), &V = tensor(body.ins[2]);
    const std::int64_t Bn = g.axis(qb.dims[0].axis).extent, H = g.axis(qb.dims[1].axis).extent,
                       S = g.axis(qb.dims[2].axis).extent, KV = g.axis(kb.dims[2].axis).extent, d = qb.elem,
                       grp = kb.dims[1].group, HK = H / grp;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<double> sc(KV);
    for (std::int64_t b = 0; b < Bn; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < S; ++i) {
          const double* q = &Q[((b * H + h) * S + i) * d];
          double mx = kNegInf;
          for (std::int64_t j = 0; j < KV; ++j) {
            const double* k = &K[((b * HK + h / grp) * KV + j) * d];
            double s = 0;
            for (std::int64_t e = 0; e < d; ++e) s += q[e] * k[e];
            sc[j] = s * scale;
            mx = std::max(mx, sc[j]);
          }
          double sum = 0;
          for (auto& s : sc) sum += (s = std::exp(s - mx));
          double* o = &y[((b * H + h) * S + i) * d];
          for (std::int64_t j = 0; j < KV; ++j) {
            const double* v = &V[((b * HK + h / grp) * KV + j) * d];
            for (std::int64_t e = 0; e < d; ++e) o[e] += sc[j] / sum * v[e];
          }
        }
  } else {
    for (const auto& n : body.ins) {
      const auto& x = tensor(n);
      for (std::size_t i = 0; i < y.size(); ++i) y[i] += x[i];
    }
  }
  return out;
}

CpuRun run_cpu(const Plan& plan, const Tensors& inputs, const Tensors& expected, std::chrono::milliseconds timeout) {
  const Grid& g = plan.grid;
  const int W = static_cast<int>(plan.ranks.size());
  World world;
  std::vector<RankRunner> runners;
  for (int r = 0; r < W; ++r) runners.push_back(RankRunner{plan, g, r, world, timeout, {}, 0, 0, false});
  // Seed inputs.
  for (const auto& [name, regions] : plan.initial) {
    const Buffer& b = g.buffer(name, "cpu executor");
    auto it = inputs.find(name);
    TESSERA_CHECK(it != inputs.end(), "cpu executor: no input tensor for {}", name);
    Block full{full_box(g, b), b.elem, it->second};
    TESSERA_CHECK(static_cast<std::int64_t>(full.data.size()) == full.box.volume() * b.elem,
                  "cpu executor: input {} has {} values, expected {}", name, full.data.size(),
                  full.box.volume() * b.elem);
    for (int r = 0; r < W; ++r)
      for (const auto& bx : regions[r]) {
        Block blk{bx, b.elem, std::vector<double>(bx.volume() * b.elem)};
        copy_overlap(full, blk);
        runners[r].store[name].push_back(std::move(blk));
      }
  }
  std::vector<std::thread> threads;
  std::mutex err_mu;
  for (int r = 0; r < W; ++r)
    threads.emplace_back([&, r] {
      try {
        runners[r].account();
        runners[r].run();
      } catch (const std::exception& e) {
        std::lock_guard lk(err_mu);
        if (world.first_error.empty()) world.first_error = e.what();
        world.abort = true;
        std::lock_guard lk2(world.mu);
        world.cv.notify_all();
      }
    });
  for (auto& t : threads) t.join();
  if (!world.first_error.empty()) throw Error(world.first_error);
  // Check every rank's required final region.
  CpuRun res;
  for (const auto& [name, regions] : plan.final) {
    const Buffer& b = g.buffer(name);
    auto it = expected.find(name);
    TESSERA_CHECK(it != expected.end(), "cpu executor: no expected tensor for {}", name);
    const Block ref{full_box(g, b), b.elem, it->second};
    for (int r = 0; r < W; ++r) {
      double num = 0, den = 0;
      for (const auto& bx : regions[r]) {
        Block got{bx, b.elem, std::vector<double>(bx.volume() * b.elem, std::numeric_limits<double>::quiet_NaN())};
        for (const auto& blk : runners[r].store[name]) {
          TESSERA_CHECK(blk.elem == b.elem, "cpu executor: rank {}: {} block has {} elements per point, expected {}", r,
                        name, blk.elem, b.elem);
          copy_overlap(blk, got);
        }
        Block want{bx, b.elem, std::vector<double>(bx.volume() * b.elem)};
        copy_overlap(ref, want);
        for (std::size_t i = 0; i < got.data.size(); ++i) {
          const double diff = got.data[i] - want.data[i];
          num += std::isnan(diff) ? std::numeric_limits<double>::infinity() : diff * diff;
          den += want.data[i] * want.data[i];
        }
        res.checked_elements += static_cast<std::int64_t>(got.data.size());
      }
      const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
      res.max_rel_error = std::max(res.max_rel_error, std::isnan(rel) ? std::numeric_limits<double>::infinity() : rel);
    }
  }
  for (const auto& rr : runners) res.peak_bytes.push_back(rr.peak);
  return res;
}

}  // namespace tessera::commir
