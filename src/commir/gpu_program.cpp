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
  }
  return "?";
}

std::int64_t DevProgram::bytes() const {
  std::int64_t b = 0;
  for (const auto& blk : blocks) b += blk.box.volume() * (blk.f32 ? 4 : 2);
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

  Builder(const Plan& p, int r, const GpuProgramOptions& o) : plan(p), g(p.grid), rank(r), opts(o) { prog.rank = r; }

  [[noreturn]] void fail(const std::string& what) const {
    TESSERA_FAIL("commir gpu executor: rank {}: {}", rank, what);
  }

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
  // Blocks of `buf` intersecting `box`, in store order; Error unless they cover it.
  std::vector<int> covering(const std::string& buf, const Box& box, const std::string& what) const {
    std::vector<int> ids;
    std::vector<Box> boxes;
    auto it = store.find(buf);
    if (it != store.end())
      for (int b : it->second)
        if (info(b).box.intersects(box)) {
          ids.push_back(b);
          boxes.push_back(info(b).box);
        }
    if (!covers_2d(boxes, box))
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
    TESSERA_CHECK(g.kernel == "gemm", "commir gpu executor: only GEMM plans run on GPUs for now, got kernel '{}'",
                  g.kernel);
    TESSERA_CHECK(g.mesh.size() == 1, "commir gpu executor: one-level meshes only, got {}", mesh_string(g.mesh));
    TESSERA_CHECK(rank >= 0 && rank < static_cast<int>(plan.ranks.size()),
                  "commir gpu executor: rank {} out of range [0, {})", rank, plan.ranks.size());
    out_name = g.body.out;
    const DType out_dt = g.dtype;  // the Grid's element type (its buffers')
    TESSERA_CHECK(out_dt == DType::bf16 || out_dt == DType::f32,
                  "commir gpu executor: output {} must be bf16 or f32, got {}", out_name, dtype_name(out_dt));
    out_f32 = out_dt == DType::f32;
    for (const auto& name : {g.body.ins[0], g.body.ins[1], g.body.out}) {
      const Buffer& b = g.buffer(name, "commir gpu executor");
      TESSERA_CHECK(b.dims.size() == 2 && b.elem == 1, "commir gpu executor: {} must be a 2-D matrix of scalars", name);
    }
    const int world = static_cast<int>(plan.ranks.size());
    std::map<int, std::vector<const Step*>> colls;  // id -> the step on each rank
    for (const auto& rp : plan.ranks)
      for (const auto& s : rp.steps) {
        if (s.kind == StepKind::recv) recv_time[s.tag] = s.time;
        if (s.kind == StepKind::send) partial_tag[s.tag] = s.partial;
        if (s.kind == StepKind::collective) colls[s.tag].push_back(&s);
      }
    for (const auto& rp : plan.ranks)
      for (const auto& s : rp.steps) {
        if (s.kind == StepKind::send && !recv_time.count(s.tag))
          TESSERA_FAIL("commir gpu executor: rank {} {}: no matching receive (tag {})", rp.rank, step_text(s), s.tag);
        if (s.kind == StepKind::recv && !partial_tag.count(s.tag))
          TESSERA_FAIL("commir gpu executor: rank {} {}: no matching send (tag {})", rp.rank, step_text(s), s.tag);
      }
    for (const auto& [id, steps] : colls) {
      const Step& s0 = *steps[0];
      const std::string name = fmt::format("{} of {} (id {})", coll_name(s0.coll), s0.buffer, id);
      TESSERA_CHECK(static_cast<int>(steps.size()) == world && static_cast<int>(s0.group.size()) == world,
                    "commir gpu executor: {} is over a sub-group; NCCL collectives span the whole communicator", name);
      for (const Step* s : steps)
        TESSERA_CHECK(s->before.size() <= 1 && s->after.size() == 1 && s->coll == s0.coll && s->root == s0.root,
                      "commir gpu executor: {} needs one contiguous box before and after on every rank", name);
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
            TESSERA_FAIL("commir gpu executor: {} is not supported on GPUs yet", name);
        }
        TESSERA_CHECK(ok,
                      "commir gpu executor: {} on rank {}: NCCL needs equal, contiguous, full-width row blocks in rank "
                      "order (extents divisible by the world size); got before {} after {}",
                      name, i, s.before.empty() ? std::string("-") : box_text(s.before[0]), box_text(s.after[0]));
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
      TESSERA_CHECK(name != out_name, "commir gpu executor: output {} cannot be an input", name);
      for (const auto& bx : regions[rank]) {
        const int b = new_block(name, bx);
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
      TESSERA_CHECK(s->buffer == out_name, "commir gpu executor: merging partials of input {}", s->buffer);
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
                  "commir gpu executor: rank {} {}: inconsistent GEMM boxes A{} B{} C{}", rank, what, box_text(ba),
                  box_text(bbx), box_text(bc));
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

  DevProgram build() {
    validate();
    inputs();
    choose_b_layout();
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
      for (const Step* s : colls) collective(*s);
      exchange(t + 1, false);  // prefetch: overlaps compute t
      for (const auto& s : steps)
        if (s.time == t && s.kind == StepKind::compute) compute(s);
      exchange(t + 1, true);  // partial accumulators leave after the compute that made them
      for (const auto& s : steps)
        if (s.time == t && s.kind == StepKind::free_block) free_block(s);
    }
    for (const auto& s : steps)
      if (s.kind != StepKind::finalize && !emitted.count(&s))
        fail(fmt::format("{}: step not scheduled by the GPU executor", step_text(s)));
    outputs();
    return std::move(prog);
  }
};

}  // namespace

DevProgram build_gpu_program(const Plan& plan, int rank, const GpuProgramOptions& opts) {
  return Builder(plan, rank, opts).build();
}

}  // namespace tessera::commir
