// The GPU executor's bookkeeping: a rank's Plan -> a program of device ops
// on numbered blocks (see gpu_program.hpp). No CUDA here.
#include "tessera/commir/gpu_program.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "tessera/runtime/error.hpp"

namespace tessera::commir {

const char* dev_op_name(DevOpKind k) {
  switch (k) {
    case DevOpKind::zero:
      return "zero";
    case DevOpKind::copy:
      return "copy";
    case DevOpKind::add:
      return "add";
    case DevOpKind::gemm:
      return "gemm";
    case DevOpKind::group_start:
      return "group_start";
    case DevOpKind::group_end:
      return "group_end";
    case DevOpKind::send:
      return "send";
    case DevOpKind::recv:
      return "recv";
    case DevOpKind::all_gather:
      return "all_gather";
    case DevOpKind::reduce_scatter:
      return "reduce_scatter";
    case DevOpKind::all_reduce:
      return "all_reduce";
    case DevOpKind::broadcast:
      return "broadcast";
    case DevOpKind::comm_waits_compute:
      return "comm_waits_compute";
    case DevOpKind::compute_waits_comm:
      return "compute_waits_comm";
    case DevOpKind::attention:
      return "attention";
    case DevOpKind::merge:
      return "merge";
  }
  return "?";
}

std::int64_t DevProgram::bytes() const {
  std::int64_t b = 0;
  for (const auto& blk : blocks) b += blk.elements() * (blk.f32 ? 4 : 2);
  return b;
}

namespace {

/// A DevOp of kind `k` on `stream`, every other field at its default.
DevOp make_op(DevOpKind k, DevStream stream = DevStream::comm) {
  DevOp op;
  op.kind = k;
  op.stream = stream;
  return op;
}

// True when the union of `pieces` covers the 2-D box `want` (pieces may
// overlap): coordinate compression, every cell of the compressed grid must
// lie in some piece.
bool covers_2d(const std::vector<Box>& pieces, const Box& want) {
  if (want.volume() == 0) return true;
  std::vector<std::int64_t> xs{want.r[0].lo, want.r[0].hi}, ys{want.r[1].lo, want.r[1].hi};
  for (const auto& p : pieces) {
    if (!p.intersects(want)) continue;
    const Box c = p.intersect(want);
    xs.insert(xs.end(), {c.r[0].lo, c.r[0].hi});
    ys.insert(ys.end(), {c.r[1].lo, c.r[1].hi});
  }
  for (auto* v : {&xs, &ys}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  for (std::size_t i = 0; i + 1 < xs.size(); ++i)
    for (std::size_t j = 0; j + 1 < ys.size(); ++j) {
      const Box cell{{{xs[i], xs[i + 1]}, {ys[j], ys[j + 1]}}};
      if (std::none_of(pieces.begin(), pieces.end(), [&](const Box& p) { return p.contains(cell); })) return false;
    }
  return true;
}

// ---- N-D blocks (attention): row-major over the box's dimensions, `elem`
// trailing elements per point.
std::vector<std::int64_t> strides_of(const Box& b, std::int64_t elem) {
  std::vector<std::int64_t> st(b.r.size());
  std::int64_t s = elem;
  for (int i = static_cast<int>(b.r.size()) - 1; i >= 0; --i) {
    st[i] = s;
    s *= b.r[i].size();
  }
  return st;
}
// Element offset of the first point of `at` in a block of box `blk`.
std::int64_t nd_offset(const Box& blk, std::int64_t elem, const Box& at) {
  const auto st = strides_of(blk, elem);
  std::int64_t o = 0;
  for (std::size_t i = 0; i < blk.r.size(); ++i) o += (at.r[i].lo - blk.r[i].lo) * st[i];
  return o;
}
// True when box `b` (inside block box `blk`) is one contiguous range of the block.
bool contiguous_in(const Box& blk, const Box& b) {
  const int n = static_cast<int>(b.r.size());
  int k = 0;
  while (k < n - 1 && b.r[k].size() == 1) ++k;
  for (int i = k + 1; i < n; ++i)
    if (b.r[i] != blk.r[i]) return false;
  return true;
}
struct Piece2d {
  std::int64_t src_off, src_ld, dst_off, dst_ld, rows, cols;
};
// The copy of box `in` (inside both) from a block of box `sb` into one of
// box `db` as 2-D pieces (rows x cols elements with leading dimensions): the
// innermost dimensions that both blocks hold whole merge into one run, the
// next ones into rows where the strides allow, and every index of the
// dimensions outside those is one piece.
std::vector<Piece2d> copy_pieces(const Box& in, const Box& sb, const Box& db, std::int64_t elem) {
  std::vector<Piece2d> out;
  if (in.volume() == 0) return out;
  const int n = static_cast<int>(in.r.size());
  const auto ss = strides_of(sb, elem), ds = strides_of(db, elem);
  auto whole = [&](int i) { return in.r[i] == sb.r[i] && in.r[i] == db.r[i]; };
  std::int64_t cols = elem;
  int k = n - 1;
  for (;; --k) {
    cols *= in.r[k].size();
    if (k == 0 || !whole(k)) break;
  }
  std::int64_t rows = 1, sld = cols, dld = cols;
  int r = k;  // dimensions [0, r) are iterated
  if (k > 0) {
    r = k - 1;
    rows = in.r[r].size();
    sld = ss[r];
    dld = ds[r];
    while (r > 0 && whole(r)) {
      --r;
      rows *= in.r[r].size();
    }
  }
  std::vector<std::int64_t> idx(r, 0);
  for (;;) {
    std::int64_t so = 0, dof = 0;
    for (int i = 0; i < n; ++i) {
      const std::int64_t p = in.r[i].lo + (i < r ? idx[i] : 0);
      so += (p - sb.r[i].lo) * ss[i];
      dof += (p - db.r[i].lo) * ds[i];
    }
    out.push_back({so, sld, dof, dld, rows, cols});
    int d = r - 1;
    while (d >= 0 && ++idx[d] == in.r[d].size()) idx[d--] = 0;
    if (d < 0) break;
  }
  return out;
}
// covers_2d for any number of dimensions.
bool covers_nd(const std::vector<Box>& pieces, const Box& want) {
  if (want.volume() == 0) return true;
  const std::size_t n = want.r.size();
  std::vector<std::vector<std::int64_t>> cut(n);
  for (std::size_t i = 0; i < n; ++i) cut[i] = {want.r[i].lo, want.r[i].hi};
  for (const auto& p : pieces) {
    if (!p.intersects(want)) continue;
    const Box c = p.intersect(want);
    for (std::size_t i = 0; i < n; ++i) cut[i].insert(cut[i].end(), {c.r[i].lo, c.r[i].hi});
  }
  for (auto& v : cut) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  }
  std::vector<std::size_t> idx(n, 0);
  for (;;) {
    Box cell;
    for (std::size_t i = 0; i < n; ++i) cell.r.push_back({cut[i][idx[i]], cut[i][idx[i] + 1]});
    if (std::none_of(pieces.begin(), pieces.end(), [&](const Box& p) { return p.contains(cell); })) return false;
    int d = static_cast<int>(n) - 1;
    while (d >= 0 && ++idx[d] + 1 == cut[d].size()) idx[d--] = 0;
    if (d < 0) return true;
  }
}

struct Builder {
  const Plan& plan;
  const Grid& g;
  int rank;
  GpuProgramOptions opts;
  DevProgram prog;
  std::string out_name;                           // the accumulator/output buffer
  bool out_f32 = false;                           // its dtype: f32, else bf16
  std::set<int> received_partials;                // blocks of partials received into a box no compute wrote yet
  std::map<std::string, std::vector<int>> store;  // live blocks per buffer, in arrival order
  std::map<int, int> recv_time;                   // transfer tag -> time of its receive
  std::map<int, bool> partial_tag;                // transfer tag -> carries a partial accumulator
  std::set<const Step*> emitted;
  // Attention plans.
  bool attn = false;
  std::int64_t head_dim = 0;
  std::map<int, std::vector<std::pair<int, const Step*>>> coll_steps;  // collective id -> (rank, step), rank order
  std::map<std::string, int> remaining;  // output cell -> contributions still to come on this rank (box_text)
  std::map<std::string, std::vector<int>> retired;  // freed blocks (their memory stays allocated)

  std::string pre() const {
    return opts.schedule.empty() ? std::string("commir gpu executor")
                                 : fmt::format("commir gpu executor ({})", opts.schedule);
  }

  Builder(const Plan& p, int r, const GpuProgramOptions& o) : plan(p), g(p.grid), rank(r), opts(o) { prog.rank = r; }

  [[noreturn]] void fail(const std::string& what) const { TESSERA_FAIL("{}: rank {}: {}", pre(), rank, what); }

  int new_block(const std::string& buf, const Box& b) {
    prog.blocks.push_back(DevBlockInfo{buf, b, buf == out_name && out_f32});
    return static_cast<int>(prog.blocks.size()) - 1;
  }
  const DevBlockInfo& info(int blk) const { return prog.blocks[blk]; }
  DevView view(int blk, std::int64_t r, std::int64_t c) const {
    const auto& b = info(blk);
    if (b.transposed) return DevView{blk, (c - b.box.r[1].lo) * b.rows() + (r - b.box.r[0].lo), b.rows()};
    return DevView{blk, (r - b.box.r[0].lo) * b.cols() + (c - b.box.r[1].lo), b.cols()};
  }
  DevView view(int blk, const Box& at) const { return view(blk, at.r[0].lo, at.r[1].lo); }

  std::string held(const std::string& buf) const {
    std::string s;
    auto it = store.find(buf);
    if (it != store.end())
      for (int b : it->second) s += (s.empty() ? "" : " ") + buf + box_text(info(b).box);
    return s.empty() ? "nothing of " + buf : s;
  }
  int containing(const std::string& buf, const Box& box) const {
    auto it = store.find(buf);
    if (it != store.end())
      for (int b : it->second)
        if (info(b).box.contains(box)) return b;
    return -1;
  }
  int exact(const std::string& buf, const Box& box) const {
    auto it = store.find(buf);
    if (it != store.end())
      for (int b : it->second)
        if (info(b).box == box) return b;
    return -1;
  }
  // Blocks of `buf` intersecting `box`, in store order; Error unless they
  // cover it (2-D boxes: covers_2d; any rank: covers_nd).
  std::vector<int> covering(const std::string& buf, const Box& box, const std::string& what, bool nd = false) const {
    std::vector<int> ids;
    std::vector<Box> boxes;
    auto it = store.find(buf);
    if (it != store.end())
      for (int b : it->second)
        if (info(b).box.intersects(box)) {
          ids.push_back(b);
          boxes.push_back(info(b).box);
        }
    if (!(nd ? covers_nd(boxes, box) : covers_2d(boxes, box)))
      fail(fmt::format("{}: {}{} is not present (holds {})", what, buf, box_text(box), held(buf)));
    return ids;
  }

  // Ops issued on each stream so far, and how many the other stream had
  // seen at its last event wait (an event with nothing new to wait for is
  // not emitted).
  // The compute stream waits for the communication stream only when an op
  // needs it (it reads a block the comm stream wrote, or writes one the comm
  // stream reads or writes, since the last wait), so a transfer still in
  // flight that the next GEMM does not touch overlaps it.
  std::int64_t issued[2] = {0, 0}, seen_by_other[2] = {0, 0};
  std::map<int, std::int64_t> comm_wrote, comm_read;  // block -> comm position of the last such access
  static void touched(const DevOp& op, std::vector<int>& reads, std::vector<int>& writes) {
    switch (op.kind) {
      case DevOpKind::zero:
        writes = {op.dst.block};
        break;
      case DevOpKind::copy:
        reads = {op.src.block};
        writes = {op.dst.block};
        break;
      case DevOpKind::add:
        reads = {op.a.block, op.b.block};
        writes = {op.dst.block};
        break;
      case DevOpKind::gemm:
        reads = {op.a.block, op.b.block, op.dst.block};
        writes = {op.dst.block};
        break;
      case DevOpKind::send:
        reads = {op.src.block};
        break;
      case DevOpKind::recv:
        writes = {op.dst.block};
        break;
      case DevOpKind::all_gather:
      case DevOpKind::reduce_scatter:
      case DevOpKind::all_reduce:
      case DevOpKind::broadcast:
        reads = {op.src.block};
        writes = {op.dst.block};
        break;
      case DevOpKind::attention:
        reads = {op.attn.q.block, op.attn.k.block, op.attn.v.block};
        writes = {op.attn.o.block, op.attn.lse.block};
        break;
      case DevOpKind::merge: {
        const DevMerge& m = op.merge;
        if (!m.init) reads = {m.acc.block, m.acc_lse.block};
        if (m.part.block >= 0) reads.insert(reads.end(), {m.part.block, m.part_lse.block});
        if (m.write_acc) writes = {m.acc.block, m.acc_lse.block};
        if (m.out.block >= 0) writes.insert(writes.end(), {m.out.block, m.out_lse.block});
        break;
      }
      default:
        break;
    }
  }
  void emit(DevOp op) {
    std::vector<int> reads, writes;
    touched(op, reads, writes);
    if (op.kind != DevOpKind::comm_waits_compute && op.kind != DevOpKind::compute_waits_comm) {
      const int c = static_cast<int>(DevStream::comm);
      if (op.stream == DevStream::compute) {
        auto after_wait = [&](const std::map<int, std::int64_t>& m, int b) {
          auto it = m.find(b);
          return it != m.end() && it->second > seen_by_other[c];
        };
        bool wait = false;
        for (int b : reads) wait = wait || after_wait(comm_wrote, b);
        for (int b : writes) wait = wait || after_wait(comm_wrote, b) || after_wait(comm_read, b);
        if (wait) event(DevOpKind::compute_waits_comm);
      }
      ++issued[static_cast<int>(op.stream)];
      if (op.stream == DevStream::comm) {
        for (int b : reads) comm_read[b] = issued[c];
        for (int b : writes) comm_wrote[b] = issued[c];
      }
    }
    prog.ops.push_back(std::move(op));
  }
  void event(DevOpKind k) {
    const bool comm_waits = k == DevOpKind::comm_waits_compute;
    const int from = static_cast<int>(comm_waits ? DevStream::compute : DevStream::comm);
    if (issued[from] == seen_by_other[from]) return;
    seen_by_other[from] = issued[from];
    DevOp op = make_op(k);
    op.stream = comm_waits ? DevStream::comm : DevStream::compute;
    prog.ops.push_back(op);
  }

  // A view of `box` of `buf`: directly into a block that holds all of it
  // (contiguous: only if the box spans the block's full width), else a new
  // block assembled with copies on stream `s`.
  DevView assemble(const std::string& buf, const Box& box, DevStream s, bool contiguous, const std::string& what) {
    const int c = containing(buf, box);
    if (c >= 0 && (!contiguous || box.r[1] == info(c).box.r[1])) return view(c, box);
    const std::vector<int> pieces = c >= 0 ? std::vector<int>{c} : covering(buf, box, what);
    const int tmp = new_block(buf, box);
    for (int p : pieces) {
      // choose_b_layout() keeps B row-major wherever a copy could need it.
      if (info(p).transposed)
        fail(fmt::format("{}: internal: copy from the transposed block {}{}", what, buf, box_text(info(p).box)));
      const Box in = info(p).box.intersect(box);
      DevOp op = make_op(DevOpKind::copy, s);
      op.src = view(p, in);
      op.dst = view(tmp, in);
      op.rows = in.r[0].size();
      op.cols = in.r[1].size();
      op.f32 = info(p).f32;
      op.what = what;
      emit(op);
    }
    return view(tmp, box);
  }

  Box project(const Buffer& b, const Box& kb) const {
    Box o;
    for (const auto& d : b.dims)
      for (std::size_t i = 0; i < g.axes.size(); ++i)
        if (g.axes[i].name == d.axis) o.r.push_back({kb.r[i].lo / d.group, (kb.r[i].hi + d.group - 1) / d.group});
    return o;
  }

  std::string step_text(const Step& s) const {
    const std::string when = s.time < 0                      ? "prologue"
                             : s.time >= plan.steps_per_rank ? "epilogue"
                                                             : fmt::format("t{}", s.time);
    switch (s.kind) {
      case StepKind::compute:
        return fmt::format("{} compute {}", when, box_text(s.box));
      case StepKind::send:
        return fmt::format("{} send{} {}{} to rank {}", when, s.partial ? " partial" : "", s.buffer, box_text(s.box),
                           s.peer);
      case StepKind::recv:
        return fmt::format("{} recv{} {}{} from rank {}", when, s.partial ? " partial" : "", s.buffer, box_text(s.box),
                           s.peer);
      case StepKind::collective:
        return fmt::format("{} {} of {} (id {})", when, coll_name(s.coll), s.buffer, s.tag);
      case StepKind::free_block:
        return fmt::format("{} free {}{}", when, s.buffer, box_text(s.box));
      case StepKind::finalize:
        return fmt::format("{} finalize", when);
    }
    return when;
  }

  // ---- validation of the whole plan (every rank builds the same verdict) ----
  void validate() {
    TESSERA_CHECK(g.kernel == "gemm" || g.kernel == "attention",
                  "{}: only GEMM and attention plans run on GPUs for now, got kernel '{}'", pre(), g.kernel);
    attn = g.kernel == "attention";
    TESSERA_CHECK(attn || g.mesh.size() == 1, "{}: GEMM plans run on one-level meshes only, got {}", pre(),
                  mesh_string(g.mesh));
    TESSERA_CHECK(rank >= 0 && rank < static_cast<int>(plan.ranks.size()), "{}: rank {} out of range [0, {})", pre(),
                  rank, plan.ranks.size());
    out_name = g.body.out;
    const DType out_dt = g.dtype;  // the Grid's element type (its buffers')
    TESSERA_CHECK(out_dt == DType::bf16 || out_dt == DType::f32, "{}: output {} must be bf16 or f32, got {}", pre(),
                  out_name, dtype_name(out_dt));
    out_f32 = out_dt == DType::f32;
    if (!attn) {
      for (const auto& name : {g.body.ins[0], g.body.ins[1], g.body.out}) {
        const Buffer& b = g.buffer(name, "commir gpu executor");
        TESSERA_CHECK(b.dims.size() == 2 && b.elem == 1, "{}: {} must be a 2-D matrix of scalars", pre(), name);
      }
    } else {
      // make_attention's layout: Q, O [b, h, q]; K, V [b, h/g, kv]; head_dim trailing.
      TESSERA_CHECK(g.body.kind == BodyKind::attend && g.body.ins.size() == 3,
                    "{}: attention needs O = attend(Q, K, V)", pre());
      const Buffer &q = g.buffer(g.body.ins[0]), &k = g.buffer(g.body.ins[1]), &v = g.buffer(g.body.ins[2]),
                   &o = g.buffer(g.body.out);
      head_dim = q.elem;
      for (const Buffer* b : {&q, &k, &v, &o})
        TESSERA_CHECK(b->dims.size() == 3 && b->elem == head_dim && b->dims[0].group == 1 && b->dims[2].group == 1,
                      "{}: attention buffer {} must be [batch, heads, seq] x head_dim {}", pre(), b->name, head_dim);
      TESSERA_CHECK(o.dims == q.dims && k.dims == v.dims && k.dims[0].axis == q.dims[0].axis &&
                        k.dims[1].axis == q.dims[1].axis && q.dims[1].group == 1,
                    "{}: attention buffers must index [b, h, q] (Q, O) and [b, h/g, kv] (K, V)", pre());
    }
    const int world = static_cast<int>(plan.ranks.size());
    std::map<int, std::vector<const Step*>> colls;  // id -> the step on each rank
    for (const auto& rp : plan.ranks)
      for (const auto& s : rp.steps) {
        if (s.kind == StepKind::recv) recv_time[s.tag] = s.time;
        if (s.kind == StepKind::send) partial_tag[s.tag] = s.partial;
        if (s.kind == StepKind::collective) {
          colls[s.tag].push_back(&s);
          coll_steps[s.tag].push_back({rp.rank, &s});
        }
      }
    for (const auto& rp : plan.ranks)
      for (const auto& s : rp.steps) {
        if (s.kind == StepKind::send && !recv_time.count(s.tag))
          TESSERA_FAIL("{}: rank {} {}: no matching receive (tag {})", pre(), rp.rank, step_text(s), s.tag);
        if (s.kind == StepKind::recv && !partial_tag.count(s.tag))
          TESSERA_FAIL("{}: rank {} {}: no matching send (tag {})", pre(), rp.rank, step_text(s), s.tag);
      }
    // Attention plans run every collective as point-to-point transfers of the
    // plan's boxes (collective_attn): no layout limit.
    if (attn) return;
    for (const auto& [id, steps] : colls) {
      const Step& s0 = *steps[0];
      const std::string name = fmt::format("{} of {} (id {})", coll_name(s0.coll), s0.buffer, id);
      TESSERA_CHECK(static_cast<int>(steps.size()) == world && static_cast<int>(s0.group.size()) == world,
                    "{}: {} is over a sub-group; NCCL collectives span the whole communicator", pre(), name);
      for (const Step* s : steps)
        TESSERA_CHECK(s->before.size() <= 1 && s->after.size() == 1 && s->coll == s0.coll && s->root == s0.root,
                      "{}: {} needs one contiguous box before and after on every rank", pre(), name);
      auto rows_part = [&](const Box& whole, int i, const Box& part) {
        const std::int64_t h = whole.r[0].size() / world;
        return whole.r[0].size() % world == 0 && part.r[1] == whole.r[1] &&
               part.r[0] == Range{whole.r[0].lo + i * h, whole.r[0].lo + (i + 1) * h};
      };
      // steps[] is in rank order (plan.ranks is), which is NCCL's part order.
      for (int i = 0; i < world; ++i) {
        const Step& s = *steps[i];
        bool ok = s.after[0] == s0.after[0] || s.coll == CollKind::reduce_scatter;
        switch (s.coll) {
          case CollKind::all_gather:
            ok = ok && s.before.size() == 1 && rows_part(s.after[0], i, s.before[0]);
            break;
          case CollKind::reduce_scatter:
            ok = s.before.size() == 1 && s.before[0] == s0.before[0] && rows_part(s.before[0], i, s.after[0]);
            break;
          case CollKind::all_reduce:
            ok = ok && s.before.size() == 1 && s.before[0] == s.after[0];
            break;
          case CollKind::broadcast:
            ok = ok && (i == s.root ? s.before.size() == 1 && s.before[0] == s.after[0] : s.before.empty());
            break;
          case CollKind::all_to_all:
            TESSERA_FAIL("{}: {} is not supported on GPUs yet", pre(), name);
        }
        TESSERA_CHECK(ok,
                      "{}: {} on rank {}: NCCL needs equal, contiguous, full-width row blocks in rank "
                      "order (extents divisible by the world size); got before {} after {}",
                      pre(), name, i, s.before.empty() ? std::string("-") : box_text(s.before[0]),
                      box_text(s.after[0]));
      }
    }
  }

  // B in the weight layout [n, k] (opts.b_nk) when nothing but this rank's
  // GEMMs ever reads B's blocks, each compute from one input block: then no
  // copy, transfer or collective has to deal with a transposed block.
  void choose_b_layout() {
    if (!opts.b_nk) return;
    const std::string& bn = g.body.ins[1];
    const Buffer& bb = g.buffer(bn);
    for (const auto& s : plan.ranks[rank].steps) {
      if (s.kind == StepKind::send || s.kind == StepKind::recv || s.kind == StepKind::collective) {
        if (s.buffer == bn) return;
      } else if (s.kind == StepKind::compute && containing(bn, project(bb, s.box)) < 0) {
        return;
      }
    }
    for (int b : store[bn]) prog.blocks[b].transposed = true;
    prog.b_nk = true;
  }

  // ---- emission ----
  void inputs() {
    for (const auto& [name, regions] : plan.initial) {
      TESSERA_CHECK(name != out_name, "{}: output {} cannot be an input", pre(), name);
      for (const auto& bx : regions[rank]) {
        const int b = new_block(name, bx);
        prog.blocks[b].elem = g.buffer(name).elem;
        prog.inputs.push_back({name, b});
        store[name].push_back(b);
      }
    }
  }

  void exchange(int t, bool partial) {
    std::vector<const Step*> ops;
    for (const auto& s : plan.ranks[rank].steps)
      if ((s.kind == StepKind::send || s.kind == StepKind::recv) && recv_time.at(s.tag) == t &&
          partial_tag.at(s.tag) == partial)
        ops.push_back(&s);
    if (ops.empty()) return;
    event(DevOpKind::comm_waits_compute);
    // Sources first: moving a partial away, or assembling a contiguous copy.
    std::map<const Step*, DevView> src;
    for (const Step* s : ops) {
      if (s->kind != StepKind::send) continue;
      if (s->partial) {
        const int b = exact(s->buffer, s->box);
        if (b < 0) fail(fmt::format("{}: the partial block is not here (holds {})", step_text(*s), held(s->buffer)));
        auto& v = store[s->buffer];
        v.erase(std::find(v.begin(), v.end(), b));  // moved: the data stays allocated until the end
        src[s] = view(b, s->box);
      } else {
        src[s] = assemble(s->buffer, s->box, DevStream::comm, true, step_text(*s));
      }
    }
    emit(make_op(DevOpKind::group_start));
    std::vector<std::pair<const Step*, int>> incoming;
    for (const Step* s : ops) {
      DevOp op = make_op(s->kind == StepKind::send ? DevOpKind::send : DevOpKind::recv);
      op.count = s->box.volume();
      op.f32 = s->buffer == out_name && out_f32;
      op.peer = s->peer;
      op.what = step_text(*s);
      if (s->kind == StepKind::send) {
        op.src = src.at(s);
      } else {
        const int b = new_block(s->buffer, s->box);
        op.dst = view(b, s->box);
        incoming.push_back({s, b});
      }
      emit(op);
    }
    emit(make_op(DevOpKind::group_end));
    for (auto [s, b] : incoming) {
      const int have = s->partial ? exact(s->buffer, s->box) : -1;
      if (have < 0) {
        store[s->buffer].push_back(b);
        if (s->partial) received_partials.insert(b);  // merged after the compute of its box (compute())
        continue;
      }
      // A partial for a box already held: merged (sum) into a new block.
      const int sum = new_block(s->buffer, s->box);
      DevOp op = make_op(DevOpKind::add, DevStream::comm);
      op.dst = view(sum, s->box);
      op.a = view(have, s->box);
      op.b = view(b, s->box);
      op.rows = s->box.r[0].size();
      op.cols = s->box.r[1].size();
      op.f32 = out_f32;
      op.what = step_text(*s);
      TESSERA_CHECK(s->buffer == out_name, "{}: merging partials of input {}", pre(), s->buffer);
      emit(op);
      auto& v = store[s->buffer];
      *std::find(v.begin(), v.end(), have) = sum;
      if (received_partials.erase(have)) received_partials.insert(sum);
    }
    for (const Step* s : ops) emitted.insert(s);
  }

  void collective(const Step& s) {
    const std::string what = step_text(s);
    event(DevOpKind::comm_waits_compute);
    const Box out = s.after[0];
    DevOp op{};
    op.stream = DevStream::comm;
    op.f32 = s.buffer == out_name && out_f32;
    op.root = s.root;
    op.what = what;
    int result = -1;
    switch (s.coll) {
      case CollKind::all_gather:
        op.kind = DevOpKind::all_gather;
        op.count = s.before[0].volume();
        break;
      case CollKind::reduce_scatter:
        op.kind = DevOpKind::reduce_scatter;
        op.count = out.volume();
        break;
      case CollKind::all_reduce:
        op.kind = DevOpKind::all_reduce;
        op.count = out.volume();
        break;
      case CollKind::broadcast:
        op.kind = DevOpKind::broadcast;
        op.count = out.volume();
        break;
      case CollKind::all_to_all:
        fail(what + ": not supported on GPUs");
    }
    if (s.coll == CollKind::broadcast && rank == s.root) {
      op.src = assemble(s.buffer, out, DevStream::comm, true, what);
      op.dst = op.src;  // in place on the root
    } else {
      if (!s.before.empty()) op.src = assemble(s.buffer, s.before[0], DevStream::comm, true, what);
      result = new_block(s.buffer, out);
      op.dst = view(result, out);
      if (s.before.empty()) op.src = op.dst;  // a Broadcast's non-root: NCCL ignores its send buffer
    }
    emit(op);
    if (s.coll == CollKind::broadcast) {
      if (result >= 0) store[s.buffer].push_back(result);
    } else {
      store[s.buffer] = {result};
    }
    emitted.insert(&s);
  }

  void compute(const Step& s) {
    const Buffer &ab = g.buffer(g.body.ins[0]), &bb = g.buffer(g.body.ins[1]), &cb = g.buffer(g.body.out);
    const Box ba = project(ab, s.box), bbx = project(bb, s.box), bc = project(cb, s.box);
    const std::string what = step_text(s);
    DevOp op = make_op(DevOpKind::gemm, DevStream::compute);
    op.a = assemble(ab.name, ba, DevStream::compute, false, what);
    op.b = assemble(bb.name, bbx, DevStream::compute, false, what);
    op.b_nk = info(op.b.block).transposed;
    op.m = ba.r[0].size();
    op.k = ba.r[1].size();
    op.n = bbx.r[1].size();
    TESSERA_CHECK(bbx.r[0].size() == op.k && bc.r[0].size() == op.m && bc.r[1].size() == op.n,
                  "{}: rank {} {}: inconsistent GEMM boxes A{} B{} C{}", pre(), rank, what, box_text(ba), box_text(bbx),
                  box_text(bc));
    op.what = what;
    int c = exact(cb.name, bc);
    // A partial received for this box (ring step) is not accumulated into:
    // the GEMM would have to wait for the transfer. It is added afterwards.
    int received = -1;
    if (c >= 0 && received_partials.count(c)) {
      received = c;
      received_partials.erase(c);
      c = -1;
    }
    op.accumulate = c >= 0;
    if (c < 0) {  // first write of this accumulator: a new block, overwritten by the GEMM
      c = new_block(cb.name, bc);
      auto& v = store[cb.name];
      if (received >= 0)
        *std::find(v.begin(), v.end(), received) = c;
      else
        v.push_back(c);
    }
    op.dst = view(c, bc);
    if (op.m > 0 && op.n > 0 && op.k > 0) {
      emit(op);
    } else if (!op.accumulate) {  // an empty product: the block holds zeros
      DevOp z = make_op(DevOpKind::zero, DevStream::compute);
      z.dst = view(c, bc);
      z.f32 = out_f32;
      z.what = what;
      emit(z);
    }
    if (received >= 0) {  // merge the received partial once it is here (emit() waits for it)
      const int sum = new_block(cb.name, bc);
      DevOp add = make_op(DevOpKind::add, DevStream::compute);
      add.dst = view(sum, bc);
      add.a = view(c, bc);
      add.b = view(received, bc);
      add.rows = bc.r[0].size();
      add.cols = bc.r[1].size();
      add.f32 = out_f32;
      add.what = what + " + received partial";
      emit(add);
      auto& v = store[cb.name];
      *std::find(v.begin(), v.end(), c) = sum;
    }
    emitted.insert(&s);
  }

  void free_block(const Step& s) {
    const int b = exact(s.buffer, s.box);
    if (b < 0) fail(fmt::format("{}: block to free is not here (holds {})", step_text(s), held(s.buffer)));
    auto& v = store[s.buffer];
    v.erase(std::find(v.begin(), v.end(), b));
    received_partials.erase(b);
    retired[s.buffer].push_back(b);  // blocks are never reused: a later send may still read it
    emitted.insert(&s);
  }

  void outputs() {
    for (const auto& [name, regions] : plan.final) {
      auto& list = prog.outputs[name];
      for (const auto& want : regions[rank]) {
        std::vector<DevReadback> pieces;
        for (int b : covering(name, want, fmt::format("output {}{}", name, box_text(want)))) {
          const Box in = info(b).box.intersect(want);
          pieces.push_back(DevReadback{view(b, in), in.r[0].size(), in.r[1].size(),
                                       (in.r[0].lo - want.r[0].lo) * want.r[1].size() + (in.r[1].lo - want.r[1].lo)});
        }
        list.push_back({want, std::move(pieces)});
      }
    }
  }

  // ---- attention plans ----
  const std::vector<Step>& steps_of_rank() const { return plan.ranks[rank].steps; }
  std::size_t axis_pos(const std::string& a) const {
    for (std::size_t i = 0; i < g.axes.size(); ++i)
      if (g.axes[i].name == a) return i;
    fail("internal: unknown axis " + a);
  }
  int new_nd(const std::string& buf, const Box& b, bool f32, std::int64_t elem) {
    prog.blocks.push_back(DevBlockInfo{buf, b, f32, false, elem});
    return static_cast<int>(prog.blocks.size()) - 1;
  }
  // An output block (O, head_dim per point) and its companion LSE block:
  // a float32 accumulator (acc) or a bf16 partial. `b` is a copy: callers
  // pass a held block's box, and the first push may move prog.blocks.
  int new_out(Box b, bool acc) {  // NOLINT(performance-unnecessary-value-param): the copy is the point
    const int lse = new_nd(out_name + ".lse", b, true, 1);
    const int o = new_nd(out_name, b, acc, head_dim);
    prog.blocks[o].lse = lse;
    return o;
  }
  void replace(const std::string& buf, int old_blk, int new_blk) {
    auto& v = store[buf];
    auto it = std::find(v.begin(), v.end(), old_blk);
    if (it == v.end()) fail("internal: replacing a block that is not held");
    *it = new_blk;
  }
  std::vector<int> covering_nd(const std::string& buf, const Box& box, const std::string& what) const {
    return covering(buf, box, what, true);
  }
  // Copies box `in` from block src to block dst (same elem and dtype).
  void copy_nd(int src, int dst, const Box& in, DevStream s, const std::string& what) {
    for (const auto& pc : copy_pieces(in, info(src).box, info(dst).box, info(src).elem)) {
      DevOp op = make_op(DevOpKind::copy, s);
      op.src = DevView{src, pc.src_off, pc.src_ld};
      op.dst = DevView{dst, pc.dst_off, pc.dst_ld};
      op.rows = pc.rows;
      op.cols = pc.cols;
      op.f32 = info(src).f32;
      op.what = what;
      emit(op);
    }
  }
  // A block holding `box` of input `buf`: one that contains it (contiguous:
  // as one contiguous range), else a new block assembled with copies.
  int assemble_in(const std::string& buf, const Box& box, DevStream s, bool contiguous, const std::string& what) {
    const int c = containing(buf, box);
    if (c >= 0 && (!contiguous || contiguous_in(info(c).box, box))) return c;
    const std::vector<int> pieces = c >= 0 ? std::vector<int>{c} : covering_nd(buf, box, what);
    const int tmp = new_nd(buf, box, false, g.buffer(buf).elem);
    for (int p : pieces) copy_nd(p, tmp, info(p).box.intersect(box), s, what);
    return tmp;
  }
  void emit_merge(int acc, int part, int out, bool init, bool write_acc, const std::string& what) {
    DevOp op = make_op(DevOpKind::merge, DevStream::compute);
    DevMerge& m = op.merge;
    m.acc = DevView{acc, 0, 0};
    m.acc_lse = DevView{info(acc).lse, 0, 0};
    if (part >= 0) {
      m.part = DevView{part, 0, 0};
      m.part_lse = DevView{info(part).lse, 0, 0};
    }
    if (out >= 0) {
      m.out = DevView{out, 0, 0};
      m.out_lse = DevView{info(out).lse, 0, 0};
    }
    m.init = init;
    m.write_acc = write_acc;
    m.points = info(acc).box.volume();
    m.head_dim = head_dim;
    op.what = what;
    emit(op);
  }
  // The held output block `blk` as a bf16 partial (an accumulator is
  // rounded into a new block that takes its place).
  int ensure_part(int blk, const std::string& what) {
    if (!info(blk).f32) return blk;
    const int out = new_out(info(blk).box, false);
    emit_merge(blk, -1, out, false, false, what + " (accumulator rounded to bf16)");
    replace(out_name, blk, out);
    return out;
  }
  // A bf16 partial holding exactly `box` of the output: a held block of that
  // box, else a new one assembled (O and LSE) from the held blocks.
  int out_exact(const Box& box, const std::string& what) {
    const int e = exact(out_name, box);
    if (e >= 0) return ensure_part(e, what);
    std::vector<int> pieces = covering_nd(out_name, box, what);
    for (int& p : pieces) p = ensure_part(p, what);
    const int tmp = new_out(box, false);
    for (int p : pieces) {
      const Box in = info(p).box.intersect(box);
      copy_nd(p, tmp, in, DevStream::compute, what);
      copy_nd(info(p).lse, info(tmp).lse, in, DevStream::compute, what);
    }
    return tmp;
  }
  // Merges partial `part` into the held output block `held` (same box);
  // `last`: no later contribution on this rank, so the result is a bf16
  // partial, else a float32 accumulator (initialized from `held` if that is
  // a partial). The result takes held's place.
  void merge_into(int held, int part, bool last, const std::string& what) {
    int acc = held;
    if (!info(held).f32) {
      acc = new_out(info(held).box, true);
      emit_merge(acc, held, -1, true, true, what + " (accumulator from the held partial)");
    }
    int result = acc;
    if (last) {
      result = new_out(info(held).box, false);
      emit_merge(acc, part, result, false, false, what);
    } else {
      emit_merge(acc, part, -1, false, true, what);
    }
    replace(out_name, held, result);
  }

  // The compute stream's wait for the blocks compute t reads from the
  // communication stream, emitted before the prefetch group of step t + 1:
  // an event waits for everything issued on the stream so far, so emitted
  // after that group it would make step t's kernel wait for step t + 1's
  // transfer (no overlap from R = 3 on).
  void prewait(int t) {
    const int c = static_cast<int>(DevStream::comm);
    auto since_wait = [&](const std::map<int, std::int64_t>& m, int b) {
      auto it = m.find(b);
      return it != m.end() && it->second > seen_by_other[c];
    };
    bool wait = false;
    for (const auto& s : steps_of_rank()) {
      if (s.time != t || s.kind != StepKind::compute) continue;
      for (const auto& name : g.body.ins) {
        const Box bx = project(g.buffer(name), s.box);
        for (int b : store[name]) wait = wait || (info(b).box.intersects(bx) && since_wait(comm_wrote, b));
      }
      const Box cell = project(g.buffer(out_name), s.box);
      for (int b : store[out_name])
        wait = wait || (info(b).box.intersects(cell) && (since_wait(comm_wrote, b) || since_wait(comm_read, b)));
    }
    if (wait) event(DevOpKind::compute_waits_comm);
  }

  void compute_attn(const Step& s) {
    const Buffer &qb = g.buffer(g.body.ins[0]), &kb = g.buffer(g.body.ins[1]), &vb = g.buffer(g.body.ins[2]),
                 &ob = g.buffer(g.body.out);
    const Box qx = project(qb, s.box), kx = project(kb, s.box), vx = project(vb, s.box), cell = project(ob, s.box);
    const std::string what = step_text(s);
    const int qblk = assemble_in(qb.name, qx, DevStream::compute, false, what);
    const int kblk = assemble_in(kb.name, kx, DevStream::compute, false, what);
    const int vblk = assemble_in(vb.name, vx, DevStream::compute, false, what);
    const int held = exact(out_name, cell);
    if (held < 0)
      for (int b : store[out_name])
        if (info(b).box.intersects(cell))
          fail(fmt::format("{}: output cell {}{} overlaps the held block {}{} (partial cells of other boxes)", what,
                           out_name, box_text(cell), out_name, box_text(info(b).box)));
    const int part = new_out(cell, false);
    // One kernel call per run of query heads whose KV heads it can index
    // (heads_q a multiple of heads_kv, q head i -> kv head i / G): GQA groups
    // whole, or heads inside one group.
    const std::int64_t grp = kb.dims[1].group, D = head_dim;
    const Range hr = s.box.r[axis_pos(qb.dims[1].axis)];
    const auto qs = strides_of(info(qblk).box, D), ks = strides_of(info(kblk).box, D),
               vs = strides_of(info(vblk).box, D), os = strides_of(cell, D), ls = strides_of(cell, 1);
    for (std::int64_t h = hr.lo; h < hr.hi;) {
      std::int64_t e = h % grp != 0 ? std::min(hr.hi, (h / grp + 1) * grp) : h + (hr.hi - h) / grp * grp;
      if (e == h) e = hr.hi;
      Box qh = qx, kh = kx, vh = vx, oh = cell;
      qh.r[1] = oh.r[1] = {h, e};
      kh.r[1] = vh.r[1] = {h / grp, (e + grp - 1) / grp};
      DevOp op = make_op(DevOpKind::attention, DevStream::compute);
      DevAttn& a = op.attn;
      a.q = DevView{qblk, nd_offset(info(qblk).box, D, qh), 0};
      a.k = DevView{kblk, nd_offset(info(kblk).box, D, kh), 0};
      a.v = DevView{vblk, nd_offset(info(vblk).box, D, vh), 0};
      a.o = DevView{part, nd_offset(cell, D, oh), 0};
      a.lse = DevView{info(part).lse, nd_offset(cell, 1, oh), 0};
      a.batch = qh.r[0].size();
      a.seq_q = qh.r[2].size();
      a.seq_k = kh.r[2].size();
      a.heads_q = e - h;
      a.heads_kv = kh.r[1].size();
      a.head_dim = D;
      for (int i = 0; i < 3; ++i) {
        a.q_stride[i] = qs[i];
        a.k_stride[i] = ks[i];
        a.v_stride[i] = vs[i];
        a.o_stride[i] = os[i];
      }
      a.lse_stride[0] = ls[0];
      a.lse_stride[1] = ls[1];
      op.what = e - h == hr.size() ? what : fmt::format("{} heads [{}, {})", what, h, e);
      emit(op);
      h = e;
    }
    const int left = --remaining[box_text(cell)];
    if (held < 0)
      store[out_name].push_back(part);
    else
      merge_into(held, part, left == 0, what);
    emitted.insert(&s);
  }

  // One NCCL send (or receive) of a whole block or a contiguous box of it;
  // output blocks send their LSE right after.
  void p2p_op(bool send, int blk, const Box& box, int peer, const std::string& what) {
    DevOp op = make_op(send ? DevOpKind::send : DevOpKind::recv);
    const DevView v{blk, nd_offset(info(blk).box, info(blk).elem, box), 0};
    (send ? op.src : op.dst) = v;
    op.count = box.volume() * info(blk).elem;
    op.f32 = info(blk).f32;
    op.peer = peer;
    op.what = what;
    emit(op);
    if (info(blk).lse >= 0) {
      DevOp l = op;
      (send ? l.src : l.dst) = DevView{info(blk).lse, nd_offset(info(blk).box, 1, box), 0};
      l.count = box.volume();
      l.f32 = true;
      l.what = what + " (LSE)";
      emit(l);
    }
  }

  void exchange_attn(int t, bool partial) {
    std::vector<const Step*> ops;
    for (const auto& s : steps_of_rank())
      if ((s.kind == StepKind::send || s.kind == StepKind::recv) && recv_time.at(s.tag) == t &&
          partial_tag.at(s.tag) == partial)
        ops.push_back(&s);
    if (ops.empty()) return;
    // Sources on the compute stream (an accumulator rounded, a box copied out
    // contiguous), before the communication stream waits for it.
    std::map<const Step*, int> src;
    for (const Step* s : ops) {
      if (s->kind != StepKind::send) continue;
      const std::string what = step_text(*s);
      if (s->buffer != out_name) {
        // A send posted steps before its receive (the block's last use on
        // this rank, with further loops inside the shifted one) leaves with
        // the receive's group, after the plan freed the block here: its
        // memory is never reused, so it is read from the retired block.
        int c = containing(s->buffer, s->box);
        if (c < 0)
          for (int b : retired[s->buffer])
            if (info(b).box.contains(s->box)) {
              c = b;
              break;
            }
        if (c >= 0 && !contiguous_in(info(c).box, s->box)) {
          const int tmp = new_nd(s->buffer, s->box, false, info(c).elem);
          copy_nd(c, tmp, s->box, DevStream::compute, what);
          c = tmp;
        }
        src[s] = c >= 0 ? c : assemble_in(s->buffer, s->box, DevStream::compute, true, what);
      } else if (s->partial) {
        int b = exact(out_name, s->box);
        if (b < 0) fail(fmt::format("{}: the partial block is not here (holds {})", what, held(out_name)));
        b = ensure_part(b, what);
        auto& v = store[out_name];
        v.erase(std::find(v.begin(), v.end(), b));  // moved: the data stays allocated until the end
        src[s] = b;
      } else {
        src[s] = out_exact(s->box, what);
      }
    }
    event(DevOpKind::comm_waits_compute);
    emit(make_op(DevOpKind::group_start));
    std::vector<std::pair<const Step*, int>> incoming;
    for (const Step* s : ops) {
      if (s->kind == StepKind::send) {
        p2p_op(true, src.at(s), s->box, s->peer, step_text(*s));
      } else {
        const int b =
            s->buffer == out_name ? new_out(s->box, false) : new_nd(s->buffer, s->box, false, g.buffer(s->buffer).elem);
        p2p_op(false, b, s->box, s->peer, step_text(*s));
        incoming.push_back({s, b});
      }
    }
    emit(make_op(DevOpKind::group_end));
    for (auto [s, b] : incoming) {
      if (s->buffer == out_name && s->partial) {
        const int left = --remaining[box_text(s->box)];
        const int have = exact(out_name, s->box);
        if (have >= 0) {  // merged after the transfer (compute stream; emit() waits for it)
          merge_into(have, b, left == 0, step_text(*s));
          continue;
        }
      }
      store[s->buffer].push_back(b);  // a partial for a box not held yet: the compute of that box merges into it
    }
    for (const Step* s : ops) emitted.insert(s);
  }

  // Collectives as one NCCL group of point-to-point transfers (all the
  // collectives of one time on distinct buffers share the group: Ulysses'
  // three input all-to-alls are one exchange): each member sends each other
  // member the intersections of its `before` boxes with the other's `after`
  // boxes (not those the receiver holds already, unless the collective
  // reduces). AllGather / AllToAll: the held blocks that meet the new layout
  // plus the received pieces replace the buffer's blocks; Broadcast adds the
  // pieces. AllReduce / ReduceScatter (partial attention results): per
  // `after` box, the parts of all members merged in rank order.
  struct Xfer {
    int peer;
    Box box;
    bool send;
    int blk = -1;
  };
  void collectives_attn(const std::vector<const Step*>& steps) {
    std::vector<std::vector<Xfer>> all(steps.size());
    auto holds = [](const Region& reg, const Box& b) {
      return std::any_of(reg.begin(), reg.end(), [&](const Box& x) { return x.contains(b); });
    };
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const Step& s = *steps[i];
      const std::string what = step_text(s);
      const bool reduce = s.coll == CollKind::all_reduce || s.coll == CollKind::reduce_scatter;
      const bool is_out = s.buffer == out_name;
      if (reduce && !is_out) fail(what + ": a reduction of an input");
      auto& xs = all[i];
      for (const auto& [q, qs] : coll_steps.at(s.tag)) {
        if (q == rank) continue;
        for (const Box& bx : s.before)
          for (const Box& ax : qs->after)
            if (bx.intersects(ax) && (reduce || !holds(qs->before, bx.intersect(ax))))
              xs.push_back({q, bx.intersect(ax), true});
        for (const Box& bx : qs->before)
          for (const Box& ax : s.after)
            if (bx.intersects(ax) && (reduce || !holds(s.before, bx.intersect(ax))))
              xs.push_back({q, bx.intersect(ax), false});
      }
      for (auto& x : xs)
        if (x.send)
          x.blk = is_out ? out_exact(x.box, what) : assemble_in(s.buffer, x.box, DevStream::compute, true, what);
    }
    bool any = false;
    for (const auto& xs : all) any |= !xs.empty();
    if (any) {
      event(DevOpKind::comm_waits_compute);
      emit(make_op(DevOpKind::group_start));
      for (std::size_t i = 0; i < steps.size(); ++i) {
        const Step& s = *steps[i];
        for (auto& x : all[i]) {
          const std::string w = fmt::format("{} {} {}{} {} rank {}", step_text(s), x.send ? "send" : "recv", s.buffer,
                                            box_text(x.box), x.send ? "to" : "from", x.peer);
          if (!x.send)
            x.blk =
                s.buffer == out_name ? new_out(x.box, false) : new_nd(s.buffer, x.box, false, g.buffer(s.buffer).elem);
          p2p_op(x.send, x.blk, x.box, x.peer, w);
        }
      }
      emit(make_op(DevOpKind::group_end));
    }
    for (std::size_t i = 0; i < steps.size(); ++i) collective_result(*steps[i], all[i]);
  }

  void collective_result(const Step& s, const std::vector<Xfer>& xs) {
    const std::string what = step_text(s);
    std::vector<int> result;
    if (s.coll != CollKind::all_reduce && s.coll != CollKind::reduce_scatter) {
      for (int b : store[s.buffer])
        if (s.coll == CollKind::broadcast ||
            std::any_of(s.after.begin(), s.after.end(), [&](const Box& a) { return a.intersects(info(b).box); }))
          result.push_back(b);
      for (const auto& x : xs)
        if (!x.send) result.push_back(x.blk);
    } else {
      for (const Box& A : s.after) {
        std::vector<int> parts;
        for (const auto& [q, qs] : coll_steps.at(s.tag)) {
          if (q == rank) {
            parts.push_back(out_exact(A, what));
            continue;
          }
          for (const auto& x : xs)
            if (!x.send && x.peer == q && x.box.intersects(A)) {
              if (x.box != A)
                fail(fmt::format("{}: rank {}'s part {} of {} is not the whole box {} (not supported)", what, q,
                                 box_text(x.box), s.buffer, box_text(A)));
              parts.push_back(x.blk);
            }
        }
        if (parts.size() == 1) {
          result.push_back(parts[0]);
          continue;
        }
        const int acc = new_out(A, true);
        for (std::size_t k = 0; k < parts.size(); ++k) {
          const bool last = k + 1 == parts.size();
          const int out = last ? new_out(A, false) : -1;
          emit_merge(acc, parts[k], out, k == 0, !last, fmt::format("{} merge part {}", what, k));
          if (last) result.push_back(out);
        }
      }
    }
    store[s.buffer] = result;
    emitted.insert(&s);
  }

  void outputs_attn() {
    for (const auto& [name, regions] : plan.final) {
      auto& list = prog.outputs[name];
      for (const auto& want : regions[rank]) {
        const std::string what = fmt::format("output {}{}", name, box_text(want));
        std::vector<DevReadback> pieces;
        for (int b : covering_nd(name, want, what)) {
          b = ensure_part(b, what);
          for (const auto& pc : copy_pieces(info(b).box.intersect(want), info(b).box, want, info(b).elem))
            pieces.push_back(DevReadback{DevView{b, pc.src_off, pc.src_ld}, pc.rows, pc.cols, pc.dst_off, pc.dst_ld});
        }
        list.push_back({want, std::move(pieces)});
      }
    }
  }

  DevProgram build() {
    validate();
    inputs();
    if (!attn) choose_b_layout();
    if (attn) {  // contributions to each output cell on this rank: the last one writes the bf16 partial
      const Buffer& ob = g.buffer(out_name);
      for (const auto& s : steps_of_rank()) {
        if (s.kind == StepKind::compute) ++remaining[box_text(project(ob, s.box))];
        if (s.kind == StepKind::recv && s.partial && s.buffer == out_name) ++remaining[box_text(s.box)];
      }
    }
    const auto& steps = plan.ranks[rank].steps;
    int lo = -1, hi = plan.steps_per_rank + 1;
    for (const auto& s : steps) {
      lo = std::min(lo, s.time);
      hi = std::max(hi, s.time);
    }
    for (const auto& [tag, t] : recv_time) lo = std::min(lo, t - 1);
    for (int t = lo; t <= hi; ++t) {
      std::vector<const Step*> colls;
      for (const auto& s : steps)
        if (s.time == t && s.kind == StepKind::collective) colls.push_back(&s);
      std::sort(colls.begin(), colls.end(), [](const Step* a, const Step* b) { return a->tag < b->tag; });
      if (attn) {  // one exchange per run of collectives on distinct buffers
        for (std::size_t i = 0; i < colls.size();) {
          std::vector<const Step*> run;
          std::set<std::string> bufs;
          for (; i < colls.size() && bufs.insert(colls[i]->buffer).second; ++i) run.push_back(colls[i]);
          collectives_attn(run);
        }
      } else {
        for (const Step* s : colls) collective(*s);
      }
      if (attn) prewait(t);
      attn ? exchange_attn(t + 1, false) : exchange(t + 1, false);  // prefetch: overlaps compute t
      for (const auto& s : steps)
        if (s.time == t && s.kind == StepKind::compute) attn ? compute_attn(s) : compute(s);
      attn ? exchange_attn(t + 1, true) : exchange(t + 1, true);  // partials leave after the compute that made them
      for (const auto& s : steps)
        if (s.time == t && s.kind == StepKind::free_block) free_block(s);
    }
    for (const auto& s : steps)
      if (s.kind != StepKind::finalize && !emitted.count(&s))
        fail(fmt::format("{}: step not scheduled by the GPU executor", step_text(s)));
    attn ? outputs_attn() : outputs();
    return std::move(prog);
  }
};

}  // namespace

DevProgram build_gpu_program(const Plan& plan, int rank, const GpuProgramOptions& opts) {
  return Builder(plan, rank, opts).build();
}

}  // namespace tessera::commir
