// Host simulator of the GPU executor's programs (see gpu_program.hpp): every
// rank's ops in program order, NCCL matching across ranks, a race check over
// the two streams of each rank, then the outputs against a reference.
#include <fmt/format.h>

#include <cmath>
#include <algorithm>
#include <deque>
#include <limits>

#include "tessera/commir/gpu_program.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::commir {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Per block: the last write and the latest read from each stream, as
// positions in that stream's op sequence (1-based; 0 = none).
struct Access {
  int write_stream = -1;
  std::int64_t write_pos = 0;
  std::int64_t read_pos[2] = {0, 0};
};

struct RankSim {
  const DevProgram* prog = nullptr;
  std::vector<std::vector<double>> data;  // per block; NaN = never written (device garbage)
  std::vector<Access> access;
  // clock[s][u]: how far stream s is known to be ordered after stream u's ops.
  std::int64_t clock[2][2] = {{0, 0}, {0, 0}};
  std::size_t pc = 0;
  bool posted = false;  // the comm unit at pc has been posted
  int pending = 0;      // its transfers not yet matched
  std::int64_t coll_index = 0;
};

struct PendingSend {
  int rank;
  std::vector<double> values;
  bool f32;
  std::string what;
};
struct PendingRecv {
  int rank;
  DevView dst;
  std::int64_t count;
  bool f32;
  std::string what;
};

struct Sim {
  const Plan& plan;
  std::vector<DevProgram> progs;
  std::vector<RankSim> ranks;
  std::map<std::pair<int, int>, std::deque<PendingSend>> sends;  // (from, to)
  std::map<std::pair<int, int>, std::deque<PendingRecv>> recvs;  // (from, to)
  std::map<std::int64_t, std::vector<const DevOp*>> colls;       // position -> each rank's op
  std::int64_t ops_ = 0;

  explicit Sim(const Plan& p) : plan(p) {}

  [[noreturn]] static void race(int r, const DevOp& op, int blk, const char* kind) {
    TESSERA_FAIL(
        "gpu program simulation: rank {}: {} {} ({}) touches block {} while {} on the other stream is not ordered "
        "before it (missing event)",
        r, dev_op_name(op.kind), op.what, op.stream == DevStream::comm ? "comm stream" : "compute stream", blk, kind);
  }
  void touch(int r, const DevOp& op, int blk, bool write) {
    RankSim& R = ranks[r];
    const int s = static_cast<int>(op.stream), o = 1 - s;
    Access& a = R.access.at(blk);
    if (a.write_stream == o && R.clock[s][o] < a.write_pos) race(r, op, blk, "a write");
    if (write && R.clock[s][o] < a.read_pos[o]) race(r, op, blk, "a read");
    if (write) {
      a.write_stream = s;
      a.write_pos = R.clock[s][s];
      a.read_pos[0] = a.read_pos[1] = 0;
    } else {
      a.read_pos[s] = std::max(a.read_pos[s], R.clock[s][s]);
    }
  }

  double& at(int r, const DevView& v, std::int64_t i, std::int64_t j) {
    auto& d = ranks[r].data.at(v.block);
    const std::int64_t e = v.offset + i * v.ld + j;
    TESSERA_CHECK(e >= 0 && e < static_cast<std::int64_t>(d.size()),
                  "gpu program simulation: rank {}: element {} outside block {} ({} elements)", r, e, v.block,
                  d.size());
    return d[e];
  }
  // `count` contiguous elements starting at v.
  double* span(int r, const DevView& v, std::int64_t count) {
    auto& d = ranks[r].data.at(v.block);
    TESSERA_CHECK(v.offset >= 0 && v.offset + count <= static_cast<std::int64_t>(d.size()),
                  "gpu program simulation: rank {}: {} elements at {} outside block {} ({} elements)", r, count,
                  v.offset, v.block, d.size());
    return d.data() + v.offset;
  }

  void local(int r, const DevOp& op) {
    RankSim& R = ranks[r];
    const int s = static_cast<int>(op.stream);
    switch (op.kind) {
      case DevOpKind::comm_waits_compute:
      case DevOpKind::compute_waits_comm: {
        const int from = op.kind == DevOpKind::comm_waits_compute ? 0 : 1, to = 1 - from;
        for (int u = 0; u < 2; ++u) R.clock[to][u] = std::max(R.clock[to][u], R.clock[from][u]);
        return;
      }
      default:
        break;
    }
    ++R.clock[s][s];
    switch (op.kind) {
      case DevOpKind::zero: {
        touch(r, op, op.dst.block, true);
        auto& d = R.data.at(op.dst.block);
        std::fill(d.begin(), d.end(), 0.0);
        break;
      }
      case DevOpKind::copy:
        touch(r, op, op.src.block, false);
        touch(r, op, op.dst.block, true);
        for (std::int64_t i = 0; i < op.rows; ++i)
          for (std::int64_t j = 0; j < op.cols; ++j) at(r, op.dst, i, j) = at(r, op.src, i, j);
        break;
      case DevOpKind::add:
        touch(r, op, op.a.block, false);
        touch(r, op, op.b.block, false);
        touch(r, op, op.dst.block, true);
        for (std::int64_t i = 0; i < op.rows; ++i)
          for (std::int64_t j = 0; j < op.cols; ++j) at(r, op.dst, i, j) = at(r, op.a, i, j) + at(r, op.b, i, j);
        break;
      case DevOpKind::gemm:
        touch(r, op, op.a.block, false);
        touch(r, op, op.b.block, false);
        touch(r, op, op.dst.block, true);
        for (std::int64_t i = 0; i < op.m; ++i)
          for (std::int64_t j = 0; j < op.n; ++j) {
            double sum = 0;
            // b_nk: the view is of B stored [n, k] (a transposed block).
            for (std::int64_t k = 0; k < op.k; ++k)
              sum += at(r, op.a, i, k) * (op.b_nk ? at(r, op.b, j, k) : at(r, op.b, k, j));
            // Overwrite (beta = 0) ignores what the block held (NaN = never written).
            if (op.accumulate)
              at(r, op.dst, i, j) += sum;
            else
              at(r, op.dst, i, j) = sum;
          }
        break;
      case DevOpKind::attention:
        attention(r, op);
        break;
      case DevOpKind::merge:
        merge(r, op);
        break;
      default:
        TESSERA_FAIL("gpu program simulation: rank {}: unexpected {}", r, dev_op_name(op.kind));
    }
  }

  double& elem_at(int r, int blk, std::int64_t e) {
    auto& d = ranks[r].data.at(blk);
    TESSERA_CHECK(e >= 0 && e < static_cast<std::int64_t>(d.size()),
                  "gpu program simulation: rank {}: element {} outside block {} ({} elements)", r, e, blk, d.size());
    return d[e];
  }

  // kernels::attention in double: O normalized, LSE natural log, scale 1/sqrt(head_dim).
  void attention(int r, const DevOp& op) {
    const DevAttn& a = op.attn;
    for (int b : {a.q.block, a.k.block, a.v.block}) touch(r, op, b, false);
    for (int b : {a.o.block, a.lse.block}) touch(r, op, b, true);
    TESSERA_CHECK(a.heads_kv > 0 && a.heads_q % a.heads_kv == 0,
                  "gpu program simulation: rank {}: {}: heads_q {} not a multiple of heads_kv {}", r, op.what,
                  a.heads_q, a.heads_kv);
    const std::int64_t G = a.heads_q / a.heads_kv, D = a.head_dim;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    std::vector<double> sc(a.seq_k);
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t h = 0; h < a.heads_q; ++h)
        for (std::int64_t i = 0; i < a.seq_q; ++i) {
          const std::int64_t qo = a.q.offset + b * a.q_stride[0] + h * a.q_stride[1] + i * a.q_stride[2];
          double mx = -std::numeric_limits<double>::infinity();
          for (std::int64_t j = 0; j < a.seq_k; ++j) {
            const std::int64_t ko = a.k.offset + b * a.k_stride[0] + (h / G) * a.k_stride[1] + j * a.k_stride[2];
            double dot = 0;
            for (std::int64_t e = 0; e < D; ++e) dot += elem_at(r, a.q.block, qo + e) * elem_at(r, a.k.block, ko + e);
            sc[j] = dot * scale;
            mx = std::max(mx, sc[j]);
          }
          double sum = 0;
          for (auto& x : sc) sum += (x = std::exp(x - mx));
          const std::int64_t oo = a.o.offset + b * a.o_stride[0] + h * a.o_stride[1] + i * a.o_stride[2];
          for (std::int64_t e = 0; e < D; ++e) {
            double v = 0;
            for (std::int64_t j = 0; j < a.seq_k; ++j)
              v += sc[j] / sum *
                   elem_at(r, a.v.block,
                           a.v.offset + b * a.v_stride[0] + (h / G) * a.v_stride[1] + j * a.v_stride[2] + e);
            elem_at(r, a.o.block, oo + e) = v;
          }
          elem_at(r, a.lse.block, a.lse.offset + b * a.lse_stride[0] + h * a.lse_stride[1] + i) = mx + std::log(sum);
        }
  }

  // kernels::attention_merge in double (the same weights, the same skipping
  // of a zero weight, so a never-written accumulator under init stays unread).
  void merge(int r, const DevOp& op) {
    const DevMerge& m = op.merge;
    if (!m.init) {
      touch(r, op, m.acc.block, false);
      touch(r, op, m.acc_lse.block, false);
    }
    if (m.part.block >= 0) {
      touch(r, op, m.part.block, false);
      touch(r, op, m.part_lse.block, false);
    }
    if (m.write_acc) {
      touch(r, op, m.acc.block, true);
      touch(r, op, m.acc_lse.block, true);
    }
    if (m.out.block >= 0) {
      touch(r, op, m.out.block, true);
      touch(r, op, m.out_lse.block, true);
    }
    constexpr double kInf = std::numeric_limits<double>::infinity();
    const std::int64_t D = m.head_dim;
    std::vector<double> v(D);
    for (std::int64_t p = 0; p < m.points; ++p) {
      const double la = m.init ? -kInf : elem_at(r, m.acc_lse.block, m.acc_lse.offset + p);
      const double lb = m.part.block >= 0 ? elem_at(r, m.part_lse.block, m.part_lse.offset + p) : -kInf;
      const double mx = std::max(la, lb);
      double wa = 0, wb = 0, lse = -kInf;
      if (mx != -kInf) {
        wa = std::exp(la - mx);
        wb = std::exp(lb - mx);
        const double sum = wa + wb;
        lse = mx + std::log(sum);
        wa /= sum;
        wb /= sum;
      }
      for (std::int64_t e = 0; e < D; ++e) {
        double x = 0;
        if (wa != 0) x += wa * elem_at(r, m.acc.block, m.acc.offset + p * D + e);
        if (wb != 0) x += wb * elem_at(r, m.part.block, m.part.offset + p * D + e);
        v[e] = x;
      }
      for (std::int64_t e = 0; e < D; ++e) {
        if (m.write_acc) elem_at(r, m.acc.block, m.acc.offset + p * D + e) = v[e];
        if (m.out.block >= 0) elem_at(r, m.out.block, m.out.offset + p * D + e) = v[e];
      }
      if (m.write_acc) elem_at(r, m.acc_lse.block, m.acc_lse.offset + p) = lse;
      if (m.out.block >= 0) elem_at(r, m.out_lse.block, m.out_lse.offset + p) = lse;
    }
  }

  // Posts the NCCL group starting at ranks[r].pc; matching happens in match().
  void post_group(int r) {
    RankSim& R = ranks[r];
    const auto& ops = R.prog->ops;
    std::size_t i = R.pc + 1;
    for (; i < ops.size() && ops[i].kind != DevOpKind::group_end; ++i) {
      const DevOp& op = ops[i];
      TESSERA_CHECK(op.kind == DevOpKind::send || op.kind == DevOpKind::recv,
                    "gpu program simulation: rank {}: {} inside an NCCL group", r, dev_op_name(op.kind));
      TESSERA_CHECK(op.peer >= 0 && op.peer < static_cast<int>(ranks.size()) && op.peer != r,
                    "gpu program simulation: rank {}: {} with peer {}", r, op.what, op.peer);
      ++R.clock[1][1];
      if (op.kind == DevOpKind::send) {
        touch(r, op, op.src.block, false);
        const double* p = span(r, op.src, op.count);
        sends[{r, op.peer}].push_back(PendingSend{r, std::vector<double>(p, p + op.count), op.f32, op.what});
      } else {
        touch(r, op, op.dst.block, true);
        span(r, op.dst, op.count);  // bounds
        recvs[{op.peer, r}].push_back(PendingRecv{r, op.dst, op.count, op.f32, op.what});
      }
      ++R.pending;
      ++ops_;
    }
    TESSERA_CHECK(i < ops.size(), "gpu program simulation: rank {}: NCCL group without its end", r);
    R.posted = true;
  }

  bool match() {
    bool progress = false;
    for (auto& [key, q] : sends) {
      auto& rq = recvs[key];
      while (!q.empty() && !rq.empty()) {
        PendingSend s = std::move(q.front());
        PendingRecv v = rq.front();
        q.pop_front();
        rq.pop_front();
        TESSERA_CHECK(static_cast<std::int64_t>(s.values.size()) == v.count && s.f32 == v.f32,
                      "gpu program simulation: rank {} '{}' ({} {} elements) matched rank {} '{}' ({} {} elements)",
                      key.first, s.what, s.values.size(), s.f32 ? "f32" : "bf16", key.second, v.what, v.count,
                      v.f32 ? "f32" : "bf16");
        std::copy(s.values.begin(), s.values.end(), span(v.rank, v.dst, v.count));
        --ranks[key.first].pending;
        --ranks[key.second].pending;
        progress = true;
      }
    }
    return progress;
  }

  void run_collective(std::int64_t pos) {
    const auto& members = colls.at(pos);
    const DevOp& o0 = *members[0];
    const int W = static_cast<int>(ranks.size());
    for (int r = 0; r < W; ++r) {
      const DevOp& o = *members[r];
      TESSERA_CHECK(o.kind == o0.kind && o.count == o0.count && o.root == o0.root && o.f32 == o0.f32,
                    "gpu program simulation: collective #{}: rank 0 issues {} '{}' ({} elements, root {}), rank {} "
                    "issues {} '{}' ({} elements, root {})",
                    pos, dev_op_name(o0.kind), o0.what, o0.count, o0.root, r, dev_op_name(o.kind), o.what, o.count,
                    o.root);
    }
    const std::int64_t n = o0.count;
    std::vector<std::vector<double>> in(W);
    const std::int64_t in_count = o0.kind == DevOpKind::reduce_scatter ? n * W : n;
    for (int r = 0; r < W; ++r)
      if (o0.kind != DevOpKind::broadcast || r == o0.root) {
        const double* p = span(r, members[r]->src, in_count);
        in[r].assign(p, p + in_count);
      }
    for (int r = 0; r < W; ++r) {
      const DevOp& o = *members[r];
      switch (o0.kind) {
        case DevOpKind::all_gather: {
          double* d = span(r, o.dst, n * W);
          for (int q = 0; q < W; ++q) std::copy(in[q].begin(), in[q].end(), d + q * n);
          break;
        }
        case DevOpKind::reduce_scatter: {
          double* d = span(r, o.dst, n);
          for (std::int64_t e = 0; e < n; ++e) {
            double sum = 0;
            for (int q = 0; q < W; ++q) sum += in[q][r * n + e];
            d[e] = sum;
          }
          break;
        }
        case DevOpKind::all_reduce: {
          double* d = span(r, o.dst, n);
          for (std::int64_t e = 0; e < n; ++e) {
            double sum = 0;
            for (int q = 0; q < W; ++q) sum += in[q][e];
            d[e] = sum;
          }
          break;
        }
        case DevOpKind::broadcast:
          std::copy(in[o0.root].begin(), in[o0.root].end(), span(r, o.dst, n));
          break;
        default:
          TESSERA_FAIL("gpu program simulation: {} is not a collective", dev_op_name(o0.kind));
      }
    }
  }

  // Advances rank r as far as it can; true if it moved.
  bool step(int r) {
    RankSim& R = ranks[r];
    const auto& ops = R.prog->ops;
    bool moved = false;
    while (R.pc < ops.size()) {
      const DevOp& op = ops[R.pc];
      if (op.kind == DevOpKind::group_start) {
        if (!R.posted) {
          post_group(r);
          moved = true;
        }
        if (R.pending > 0) return moved;
        while (ops[R.pc].kind != DevOpKind::group_end) ++R.pc;
        ++R.pc;
        R.posted = false;
        moved = true;
        continue;
      }
      if (op.kind == DevOpKind::all_gather || op.kind == DevOpKind::reduce_scatter ||
          op.kind == DevOpKind::all_reduce || op.kind == DevOpKind::broadcast) {
        if (!R.posted) {
          TESSERA_CHECK(op.stream == DevStream::comm, "gpu program simulation: rank {}: collective off the comm stream",
                        r);
          ++R.clock[1][1];
          if (op.kind != DevOpKind::broadcast || r == op.root) touch(r, op, op.src.block, false);
          touch(r, op, op.dst.block, true);
          auto& m = colls[R.coll_index];
          m.resize(ranks.size(), nullptr);
          m[r] = &op;
          R.posted = true;
          ++ops_;
          moved = true;
          if (std::all_of(m.begin(), m.end(), [](const DevOp* p) { return p != nullptr; }))
            run_collective(R.coll_index);
        }
        const auto& m = colls[R.coll_index];
        if (!std::all_of(m.begin(), m.end(), [](const DevOp* p) { return p != nullptr; })) return moved;
        ++R.coll_index;
        ++R.pc;
        R.posted = false;
        moved = true;
        continue;
      }
      TESSERA_CHECK(op.kind != DevOpKind::send && op.kind != DevOpKind::recv && op.kind != DevOpKind::group_end,
                    "gpu program simulation: rank {}: {} outside an NCCL group", r, dev_op_name(op.kind));
      local(r, op);
      ++ops_;
      ++R.pc;
      moved = true;
    }
    return moved;
  }

  void run() {
    const int W = static_cast<int>(ranks.size());
    for (;;) {
      bool moved = false;
      for (int r = 0; r < W; ++r) moved |= step(r);
      moved |= match();
      bool done = true;
      for (const auto& R : ranks) done &= R.pc >= R.prog->ops.size();
      if (done) return;
      if (!moved) {
        std::string where;
        for (int r = 0; r < W; ++r) {
          const auto& R = ranks[r];
          where += R.pc < R.prog->ops.size() ? fmt::format("; rank {} at {} '{}'", r,
                                                           dev_op_name(R.prog->ops[R.pc].kind), R.prog->ops[R.pc].what)
                                             : fmt::format("; rank {} done", r);
        }
        TESSERA_FAIL("gpu program simulation: deadlock (NCCL calls that never match){}", where);
      }
    }
  }
};

}  // namespace

GpuSimRun simulate_gpu_programs(const Plan& plan, const Tensors& inputs, const Tensors& expected,
                                const GpuProgramOptions& opts) {
  std::vector<DevProgram> progs;
  for (int r = 0; r < static_cast<int>(plan.ranks.size()); ++r) progs.push_back(build_gpu_program(plan, r, opts));
  return simulate_gpu_programs(plan, std::move(progs), inputs, expected);
}

GpuSimRun simulate_gpu_programs(const Plan& plan, std::vector<DevProgram> programs, const Tensors& inputs,
                                const Tensors& expected) {
  const Grid& g = plan.grid;
  const int W = static_cast<int>(plan.ranks.size());
  TESSERA_CHECK(static_cast<int>(programs.size()) == W, "gpu program simulation: {} programs for {} ranks",
                programs.size(), W);
  Sim sim(plan);
  sim.progs = std::move(programs);
  sim.ranks.resize(W);
  // Row-major index of a point (and element) of buffer `name` in its full tensor.
  auto full_index = [&](const std::string& name, const std::vector<std::int64_t>& p, std::int64_t e) {
    const Buffer& b = g.buffer(name);
    std::int64_t i = 0;
    for (std::size_t d = 0; d < b.dims.size(); ++d)
      i = i * ((g.axis(b.dims[d].axis).extent + b.dims[d].group - 1) / b.dims[d].group) + p[d];
    return i * b.elem + e;
  };
  // Calls fn(point, k) for every point of `bx` in row-major order (k = 0, 1, ...).
  auto for_points = [](const Box& bx, const auto& fn) {
    if (bx.volume() == 0) return;
    std::vector<std::int64_t> p(bx.r.size());
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = bx.r[i].lo;
    for (std::int64_t k = 0;; ++k) {
      fn(p, k);
      int d = static_cast<int>(p.size()) - 1;
      while (d >= 0 && ++p[d] == bx.r[d].hi) {
        p[d] = bx.r[d].lo;
        --d;
      }
      if (d < 0) return;
    }
  };
  for (int r = 0; r < W; ++r) {
    RankSim& R = sim.ranks[r];
    R.prog = &sim.progs[r];
    for (const auto& b : R.prog->blocks) R.data.emplace_back(b.elements(), kNaN);
    R.access.resize(R.prog->blocks.size());
    for (const auto& [name, blk] : R.prog->inputs) {
      auto it = inputs.find(name);
      TESSERA_CHECK(it != inputs.end(), "gpu program simulation: no input tensor {}", name);
      const Box& bx = R.prog->blocks[blk].box;
      const bool tr = R.prog->blocks[blk].transposed;  // column-major, as the executor uploads it
      const std::int64_t el = R.prog->blocks[blk].elem;
      for_points(bx, [&](const std::vector<std::int64_t>& p, std::int64_t k) {
        for (std::int64_t e = 0; e < el; ++e)
          R.data[blk][tr ? (p[1] - bx.r[1].lo) * bx.r[0].size() + (p[0] - bx.r[0].lo) : k * el + e] =
              it->second.at(full_index(name, p, e));
      });
    }
  }
  sim.run();
  GpuSimRun res;
  res.ops = sim.ops_;
  for (int r = 0; r < W; ++r) {
    double num = 0, den = 0;
    for (const auto& [name, boxes] : sim.progs[r].outputs) {
      auto it = expected.find(name);
      TESSERA_CHECK(it != expected.end(), "gpu program simulation: no expected tensor {}", name);
      const std::int64_t el = g.buffer(name).elem;
      for (const auto& [want, pieces] : boxes) {
        std::vector<double> got(want.volume() * el, kNaN);
        for (const auto& p : pieces) {
          const std::int64_t ld = p.host_ld > 0 ? p.host_ld : want.r[1].size();
          for (std::int64_t i = 0; i < p.rows; ++i)
            for (std::int64_t j = 0; j < p.cols; ++j) got.at(p.host_offset + i * ld + j) = sim.at(r, p.src, i, j);
        }
        for_points(want, [&](const std::vector<std::int64_t>& pt, std::int64_t k) {
          for (std::int64_t e = 0; e < el; ++e) {
            const double ref = it->second.at(full_index(name, pt, e));
            const double diff = got[k * el + e] - ref;
            num += std::isnan(diff) ? std::numeric_limits<double>::infinity() : diff * diff;
            den += ref * ref;
          }
        });
        res.checked_elements += want.volume() * el;
      }
    }
    const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    res.max_rel_error = std::max(res.max_rel_error, std::isnan(rel) ? std::numeric_limits<double>::infinity() : rel);
  }
  return res;
}

}  // namespace tessera::commir
