// `tessera bench mlp` — the tensor-parallel MLP (WORKLOADS.md MLP-1..6) at
// TP = world size R. Per shape, three parts and the whole layer:
//   AG+GEMM        — column-parallel GEMM1 as in MACHINES.md's baselines:
//                    AllGather(x)[S, H] · W[I/R, H]ᵀ (non-gated, N = I/R)
//   AG+GEMM gated  — the same with the fused gate/up weight (N = 2·I/R) and
//                    SiLU(gate)·up (what ops::mlp runs)
//   GEMM+RS        — row-parallel GEMM2 [S, I/R] · Wd[H, I/R]ᵀ + ReduceScatter
//   GEMM+AR        — the same GEMM + AllReduce (ops::gemm_ar: the row-parallel
//                    GEMM without sequence parallelism: the MLP
//                    down-projection target); comm = ncclAllReduce, no
//                    decomposition strategy
//   MLP            — ops::mlp (gated AG+GEMM then GEMM+RS)
// Columns: GEMM alone (cuBLASLt, the full per-rank GEMM [S, N, K]; for the
// gated part the GEMM only, without the activation) and its TFLOP/s, the
// engine's plain GEMM at the fused tile (ping-pong 64x256) on the same data, comm
// alone (NCCL AllGather / ReduceScatter), sequential, decomposition, the best
// fused strategy at default options (and which), Tessera = what ops:: runs
// with Strategy::automatic (the tuner's choice, never slower than sequential;
// measured fresh: no on-disk cache; the tuner runs in the first warm-up
// call), ideal = max(GEMM, comm), speedup of
// Tessera over sequential and fraction of ideal. A second table lists every
// fused variant (options A/B) with its speedup over sequential.
//
// Inputs: fresh random data (never zeros: a zero operand lowers the GEMM's
// power draw and inflates its rate), rotated over --sets buffer sets so no
// repetition finds its inputs in L2 (bench/gemm's convention). Every column
// of one shape is timed in one interleaved loop (InterleavedTimer: each
// repetition runs every variant once), so clock drift hits all alike. Times
// are medians of --reps, each run after a device sync, a barrier and a
// one-element all-reduce that starts the ranks together (ProcessGroup::align_streams:
// without it the host barrier's exit skew, tens of µs, lands in every
// column that waits for a peer but not in GEMM alone), max over ranks.
//
// Clock state: run back to back, the columns keep the GPU at its power cap
// (measured: ~680 W, SM clock ~1500 MHz, 65 % of samples capped), which is
// what a training loop sees. A harness with host gaps between runs (the
// PyTorch script, MACHINES.md's baselines) runs at ~1980 MHz instead. --gap-ms
// idles the GPU before every timed run so both can be compared at like
// clocks; the "GEMM TF/s" column shows the state a table was taken in.
// By default (--lead, on) every timed run is queued behind a ~0.7 ms lead
// GEMM, as inside a training step: the run starts on a busy GPU with the host
// already ahead, so neither launch latency nor an idle-clock burst lands in
// any column. scripts/bench_async_tp.py does the same for PyTorch.
// --random N [--seed S] replaces MLP-1..6 by N shapes drawn as bench gemm
// --random draws its GEMMs (gemm::draw_shapes): tokens S = M rounded up to a
// multiple of R, H = K, I/R = N. After the tables it prints, per part,
// Tessera (automatic) / sequential: geometric mean, worst, and how many
// shapes were slower than sequential (issue 19: never); --json writes them.
// With --random each part's sequential call is also timed right after
// automatic ("seq last/first"), which tells the loop position's share.
// Automatic runs right after the part's first sequential body, so a ratio
// compares two calls with the same predecessor (--automatic-late moves it
// after the fused bodies, where it alone inherits their ranks' skew).
// Run with: tessera run -n R -- tessera bench mlp [--shapes 1,2,3] [--markdown FILE]
//           tessera run -n R -- tessera bench mlp --random 20 --seed 1 --no-variants --json FILE
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <utility>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "command.hpp"
#include "common/timing.hpp"
#include "gemm/bench_gemm_kernels.hpp"
#include "tessera/kernels/gemm.hpp"
#include "common/mlp_shapes.hpp"
#include "common/results.hpp"
#include "gemm/bench_gemm_random.hpp"
#include "tessera/ops/tp_mlp.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/process_group.hpp"

namespace tessera::bench {
namespace {

struct Options {
  std::vector<int> shapes{1, 2, 3, 4, 5, 6};
  std::string dtype = "bf16";
  int reps = 20, warmup = 5, sets = 3;
  double gap_ms = 0;  // host sleep before every timed run (after the drain, before the barrier)
  bool lead = true;   // a lead GEMM queued before every timed run
  int channels = 4, comm_ctas = 16;
  bool variants = true;
  /// Rows "fused_ce kernel only": the fused_ce kernel with no communication
  /// (OpOptions::diag_kernel_only), i.e. the kernel's own cost beside the engine.
  bool kernel_only = true;
  /// GEMM+RS rows "kernel only - …": the kernel-only run with the owner add,
  /// the band waits, the notify adds, or all three left out
  /// (OpOptions::diag_skip), to place its cost over the engine.
  bool kernel_split = true;
  std::string markdown;
  int random = 0;          ///< shapes to draw instead of MLP-1..6 (--random N)
  double budget_s = 0;     ///< with --random: no new shape after this many seconds (0: none)
  std::uint64_t seed = 1;  ///< --seed S
  std::string json;        ///< with --random: per-shape records and the summary
  /// Time automatic (and the second sequential) right after each part's
  /// first sequential body (default), not after every other strategy
  /// (--automatic-late): there it alone follows a fused body, whose ranks
  /// finish apart, and its first collective waits out that skew.
  bool automatic_early = true;
  std::string device_kind = "unknown";
  std::string commit;
  std::string command_line;
};

struct Buf {
  void* p = nullptr;
  explicit Buf(std::size_t bytes) { TESSERA_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 16))); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

/// One rotation set of inputs (all filled with fresh random data).
struct InputSet {
  std::unique_ptr<Buf> x, xfull, wgu, wd, hid;
};

std::string ms(double v) { return v > 0 ? fmt::format("{:.3f}", v) : std::string("-"); }

using ops::Strategy;

/// What every shape shares: the group, the context, the lead GEMM and the tables.
struct Bench {
  const Options& o;
  runtime::ProcessGroup& pg;
  ops::TpContext& ctx;
  cudaStream_t st;
  DType t;
  ncclDataType_t nt;
  /// "engine": the plain GEMM on the fused operators' tile (ping-pong 64x256),
  /// named explicitly since the plain default turns cooperative on large shapes.
  kernels::GemmOptions fused_tile;
  kernels::GemmArgs lead_args;
  Table table{{"shape", "part", "GEMM", "GEMM TF/s", "engine", "comm", "sequential", "decomp", "best fused", "which",
               "tessera", "choice", "ideal", "speedup", "of ideal"}};
  Table var{{"shape", "part", "variant", "ms", "vs sequential"}};
};

/// One part's columns of the main table.
struct PartResult {
  double gemm = 0, engine = 0, comm = 0, seq = 0, dec = 0, best = 0, tes = 0;
  double seq_last = 0;  ///< sequential again, timed right after automatic (--random)
  std::string which, choice;
  double flop = 0;
};

/// What --random summarizes of one part of one shape.
struct PartOutcome {
  std::string part;
  double seq = 0, tes = 0;
  double seq_last = 0;  ///< sequential timed right after automatic (0: not timed)
  std::string choice;
};

/// One MLP shape: its inputs, every timed body (registered in one
/// interleaved loop by the add_* steps, in a fixed order), and its rows.
class ShapeBench {
 public:
  ShapeBench(Bench& b, const MlpShape& sh)
      : b_(b),
        sh_(sh),
        m_(sh.s),
        ml_(sh.s / b.pg.world()),
        h_(sh.h),
        il_(sh.i / b.pg.world()),
        agout_(m_ * il_ * 2),
        gemm_out_(m_ * 2 * il_ * 2),
        part_(m_ * h_ * 2),
        out_(ml_ * h_ * 2),
        timer_(b.st, b.o.warmup, b.o.reps, [&b] {
          TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
          if (b.o.gap_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(b.o.gap_ms));
          b.pg.barrier();
          if (b.o.lead) kernels::cublaslt_gemm(b.lead_args, b.st);  // the host queues the run while this runs
          b.pg.align_streams(b.st);                                 // the ranks start each run together
        }) {
    fill_inputs();
    ag_base_.channels = b.o.channels;
    ag_base_.comm_ctas = b.o.comm_ctas;
    ag_base_.use_cache = false;
    rs_base_.comm_ctas = b.o.comm_ctas;
    rs_base_.use_cache = false;
    ar_base_.use_cache = false;
    // GEMM+RS on the copy engine needs the shards on tile rows.
    rs_ce_ok_ = ops::shard_rows(m_, b.pg.world()).per_rank % ops::kRsFusedTileRows == 0;
  }
  ShapeBench(const ShapeBench&) = delete;
  ShapeBench& operator=(const ShapeBench&) = delete;

  /// Every figure of this shape is timed in ONE interleaved loop (the add_*
  /// steps register, timer.run() measures, report() reads), so all columns
  /// see the same clocks; per-rank medians, then the max over ranks.
  void measure() {
    add_ag();
    add_rs();
    add_ar();
    add_mlp();
    print_tuner_choices();
    timer_.run([&](double median) { return b_.pg.allreduce_max(median); });
  }

  void report() {
    report_ag();
    report_rs_ar();
    report_mlp();
    report_variants();
  }

  /// Sequential and automatic per part (after report()).
  std::vector<PartOutcome> outcomes() const {
    return {{"AG+GEMM", ag_res_[0].seq, ag_res_[0].tes, ag_res_[0].seq_last, ag_res_[0].choice},
            {"AG+GEMM gated", ag_res_[1].seq, ag_res_[1].tes, ag_res_[1].seq_last, ag_res_[1].choice},
            {"GEMM+RS", rs_.seq, rs_.tes, rs_.seq_last, rs_.choice},
            {"GEMM+AR", ar_.seq, ar_.tes, ar_.seq_last, ar_.choice},
            {"MLP", layer_.seq, layer_.tes, layer_.seq_last, layer_.choice}};
  }

 private:
  struct Variant {
    std::string part, name;
    double ms = 0;
  };

  void fill_inputs() {
    in_.resize(static_cast<std::size_t>(b_.o.sets));
    std::uint64_t seed = 1000 + 100 * static_cast<std::uint64_t>(b_.pg.rank());
    for (auto& set : in_) {
      auto make = [&](std::int64_t elems) {
        auto p = std::make_unique<Buf>(static_cast<std::size_t>(elems) * 2);
        gemm::fill_random(p->p, elems, b_.t, seed++, b_.st);
        return p;
      };
      set.x = make(ml_ * h_);
      set.xfull = make(m_ * h_);
      set.wgu = make(2 * il_ * h_);  // its first I/R rows are the non-gated weight [I/R, H]
      set.wd = make(h_ * il_);
      set.hid = make(m_ * il_);
    }
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(b_.st));
  }

  InputSet& next() { return in_[static_cast<std::size_t>(turn_++ % b_.o.sets)]; }

  /// Automatic (the tuner decides on its first, warm-up call) and, with
  /// --random, the part's sequential call again right after it.
  void add_automatic(PartResult& r, std::function<void()> automatic, std::function<void()> sequential) {
    timer_.add(&r.tes, std::move(automatic));
    if (b_.o.random > 0) timer_.add(&r.seq_last, std::move(sequential));
  }

  void variant(const std::string& part_name, const std::string& name, std::function<void()> body) {
    variants_.push_back({part_name, name});
    timer_.add(&variants_.back().ms, std::move(body));
  }

  ops::AgGemmArgs ag_args(InputSet& s, bool gated, void* d) const {
    ops::AgGemmArgs a;
    a.a = s.x->p;
    a.b = s.wgu->p;
    a.d = d;
    a.m = m_;
    a.m_local = ml_;
    a.n = gated ? 2 * il_ : il_;
    a.k = h_;
    a.ldd = il_;
    a.dtype = b_.t;
    a.swiglu = gated;
    return a;
  }
  ops::GemmRsArgs rs_args(InputSet& s) const {
    ops::GemmRsArgs a;
    a.a = s.hid->p;
    a.b = s.wd->p;
    a.d = out_.p;
    a.m = m_;
    a.m_local = ml_;
    a.n = h_;
    a.k = il_;
    a.dtype = b_.t;
    return a;
  }
  ops::GemmArArgs ar_args(InputSet& s) const {
    ops::GemmArArgs a;
    a.a = s.hid->p;
    a.b = s.wd->p;
    a.d = part_.p;
    a.m = m_;
    a.n = h_;
    a.k = il_;
    a.dtype = b_.t;
    return a;
  }
  std::function<void()> ag_call(ops::OpOptions op, bool gated) {
    return [this, op, gated] { ops::ag_gemm(b_.ctx, ag_args(next(), gated, agout_.p), op); };
  }
  std::function<void()> rs_call(ops::OpOptions op) {
    return [this, op] { ops::gemm_rs(b_.ctx, rs_args(next()), op); };
  }
  std::function<void()> ar_call(ops::OpOptions op) {
    return [this, op] { ops::gemm_ar(b_.ctx, ar_args(next()), op); };
  }
  std::function<void()> mlp_call(ops::OpOptions oa, ops::OpOptions orr) {
    return [this, oa, orr] {
      auto& s = next();
      ops::MlpArgs ma{s.x->p, s.wgu->p, s.wd->p, out_.p, m_, ml_, h_, il_, b_.t};
      ops::mlp(b_.ctx, ma, oa, orr);
    };
  }

  // ---- AG + GEMM (non-gated N = I/R, and gated N = 2·I/R with SiLU·up) -----
  void add_ag() {
    timer_.add(&ag_res_[0].comm, [this] {
      auto& s = next();
      TESSERA_NCCL_CHECK(
          ncclAllGather(s.x->p, s.xfull->p, static_cast<std::size_t>(ml_ * h_), b_.nt, b_.pg.nccl(), b_.st));
    });
    for (int gated = 0; gated < 2; ++gated) add_ag_part(gated != 0);
  }

  void add_ag_part(bool gated) {
    PartResult& r = ag_res_[gated ? 1 : 0];
    const std::int64_t n = gated ? 2 * il_ : il_;
    r.flop = 2.0 * m_ * n * h_;
    auto gemm_args = [this, n](InputSet& s) {
      return kernels::GemmArgs{s.xfull->p, s.wgu->p, gemm_out_.p, m_,   n,    h_,
                               h_,         h_,       n,           b_.t, b_.t, kernels::BLayout::NK};
    };
    timer_.add(&r.gemm, [this, gemm_args] { kernels::cublaslt_gemm(gemm_args(next()), b_.st); });
    // The plain GEMM on the fused AG+GEMM's tile (ping-pong 64x256).
    timer_.add(&r.engine, [this, gemm_args] { kernels::gemm(gemm_args(next()), b_.fused_tile, b_.st); });
    ops::OpOptions ag_seq = ag_base_;
    ag_seq.strategy = Strategy::sequential;
    for (Strategy sg : {Strategy::sequential, Strategy::decomposition, Strategy::fused_ce, Strategy::fused_sm}) {
      ops::OpOptions op = ag_base_;
      op.strategy = sg;
      timer_.add(&ag_tm_[gated ? 1 : 0][sg], ag_call(op, gated));
      if (sg == Strategy::sequential && b_.o.automatic_early)
        add_automatic(r, ag_call(ag_base_, gated), ag_call(ag_seq, gated));
    }
    if (!b_.o.automatic_early) add_automatic(r, ag_call(ag_base_, gated), ag_call(ag_seq, gated));
    const char* part_name = gated ? "AG+GEMM gated" : "AG+GEMM";
    if (b_.o.kernel_only) {
      // After the fused_ce body above in every round of the interleaved
      // loop, so the epoch it replays is always stored.
      ops::OpOptions op = ag_base_;
      op.strategy = Strategy::fused_ce;
      op.diag_kernel_only = true;
      variant(part_name, "fused_ce kernel only (no comm)", ag_call(op, gated));
    }
    if (!b_.o.variants) return;
    for (int ch : {1, 8}) {
      if (ch == b_.o.channels) continue;
      ops::OpOptions op = ag_base_;
      op.strategy = Strategy::fused_ce;
      op.channels = ch;
      variant(part_name, "fused_ce ch=" + std::to_string(ch), ag_call(op, gated));
    }
    for (int cc : {4, 8}) {
      if (cc == b_.o.comm_ctas) continue;
      ops::OpOptions op = ag_base_;
      op.strategy = Strategy::fused_sm;
      op.comm_ctas = cc;
      variant(part_name, "fused_sm ctas=" + std::to_string(cc), ag_call(op, gated));
    }
  }

  // ---- GEMM + RS ------------------------------------------------------------
  void add_rs() {
    rs_.flop = 2.0 * m_ * h_ * il_;
    auto rs_gemm_args = [this](InputSet& s) {
      return kernels::GemmArgs{s.hid->p, s.wd->p, part_.p, m_, h_, il_, il_, il_, h_, b_.t, b_.t, kernels::BLayout::NK};
    };
    timer_.add(&rs_.gemm, [this, rs_gemm_args] { kernels::cublaslt_gemm(rs_gemm_args(next()), b_.st); });
    // The fused GEMM+RS's tile (ping-pong 64x256).
    timer_.add(&rs_.engine, [this, rs_gemm_args] { kernels::gemm(rs_gemm_args(next()), b_.fused_tile, b_.st); });
    timer_.add(&rs_.comm, [this] {
      TESSERA_NCCL_CHECK(
          ncclReduceScatter(part_.p, out_.p, static_cast<std::size_t>(ml_ * h_), b_.nt, ncclSum, b_.pg.nccl(), b_.st));
    });
    ops::OpOptions op = rs_base_;
    op.strategy = Strategy::sequential;
    timer_.add(&rs_.seq, rs_call(op));
    const ops::OpOptions rs_seq = op;
    if (b_.o.automatic_early) add_automatic(rs_, rs_call(rs_base_), rs_call(rs_seq));
    op.strategy = Strategy::decomposition;
    timer_.add(&rs_.dec, rs_call(op));
    op.strategy = Strategy::fused_sm;
    op.rs_reduce = ops::RsReduce::epilogue;  // OpOptions' default
    timer_.add(&rs_sm_, rs_call(op));
    if (rs_ce_ok_) add_rs_fused_ce(op);
    op.rs_reduce = ops::RsReduce::kernel;
    variant("GEMM+RS", "fused_sm reduce=kernel ctas=" + std::to_string(b_.o.comm_ctas), rs_call(op));
    if (b_.o.variants)
      for (int cc : {4, 8}) {
        if (cc == b_.o.comm_ctas) continue;
        op.comm_ctas = cc;
        variant("GEMM+RS", "fused_sm reduce=kernel ctas=" + std::to_string(cc), rs_call(op));
      }
    if (!b_.o.automatic_early) add_automatic(rs_, rs_call(rs_base_), rs_call(rs_seq));
  }

  /// fused_ce, then its kernel-only rows (after it in every round, so the
  /// epoch they replay is stored).
  void add_rs_fused_ce(ops::OpOptions op) {
    op.strategy = Strategy::fused_ce;
    timer_.add(&rs_ce_, rs_call(op));
    if (!b_.o.kernel_only) return;
    op.diag_kernel_only = true;
    variant("GEMM+RS", "fused_ce kernel only (no comm)", rs_call(op));
    if (!b_.o.kernel_split) return;
    // The kernel with parts of its work left out (OpOptions::diag_skip):
    // each row's difference to the one above is that part's cost.
    const std::pair<unsigned, const char*> splits[] = {
        {ops::kDiagSkipOwnerAdd, "kernel only - owner add"},
        {ops::kDiagSkipBandWait, "kernel only - band wait"},
        {ops::kDiagSkipNotify, "kernel only - notify add"},
        {ops::kDiagSkipOwnerAdd | ops::kDiagSkipBandWait | ops::kDiagSkipNotify, "kernel only - all three"},
    };
    for (const auto& [bits, name] : splits) {
      op.diag_skip = bits;
      variant("GEMM+RS", name, rs_call(op));
    }
  }

  // ---- GEMM + AR (same GEMM; the full [S, H] sum on every rank, into `part`) ---
  void add_ar() {
    ar_.flop = rs_.flop;
    timer_.add(&ar_.comm, [this] {
      TESSERA_NCCL_CHECK(
          ncclAllReduce(part_.p, part_.p, static_cast<std::size_t>(m_ * h_), b_.nt, ncclSum, b_.pg.nccl(), b_.st));
    });
    ops::OpOptions op = ar_base_;
    op.strategy = Strategy::sequential;
    timer_.add(&ar_.seq, ar_call(op));
    if (b_.o.automatic_early) add_automatic(ar_, ar_call(ar_base_), ar_call(op));
    if (rs_ce_ok_) {
      ops::OpOptions ce = op;
      ce.strategy = Strategy::fused_ce;
      timer_.add(&ar_ce_, ar_call(ce));
    }
    if (!b_.o.automatic_early) add_automatic(ar_, ar_call(ar_base_), ar_call(op));
  }

  // ---- whole layer (gated AG+GEMM, then GEMM+RS) -----------------------------
  void add_mlp() {
    ops::OpOptions oa = ag_base_, orr = rs_base_;
    oa.strategy = orr.strategy = Strategy::sequential;
    timer_.add(&layer_.seq, mlp_call(oa, orr));
    const auto layer_seq = mlp_call(oa, orr);
    if (b_.o.automatic_early) add_automatic(layer_, mlp_call(ag_base_, rs_base_), layer_seq);
    oa.strategy = orr.strategy = Strategy::decomposition;
    timer_.add(&layer_.dec, mlp_call(oa, orr));
    orr.strategy = Strategy::fused_sm;
    oa.strategy = Strategy::fused_ce;
    timer_.add(&ml_ce_, mlp_call(oa, orr));
    oa.strategy = Strategy::fused_sm;
    timer_.add(&ml_sm_, mlp_call(oa, orr));
    if (rs_ce_ok_) {
      oa.strategy = orr.strategy = Strategy::fused_ce;
      timer_.add(&ml_cece_, mlp_call(oa, orr));
    }
    if (b_.o.variants) {
      // The same two fused halves as separate calls (hidden in the input set
      // rather than ops::mlp's own buffer): isolates what mlp() adds.
      ops::OpOptions oce = ag_base_, osm = rs_base_;
      oce.strategy = Strategy::fused_ce;
      osm.strategy = Strategy::fused_sm;
      variant("MLP", "fused_ce+fused_sm as two calls", [this, oce, osm] {
        auto& s = next();
        ops::ag_gemm(b_.ctx, ag_args(s, true, s.hid->p), oce);
        ops::gemm_rs(b_.ctx, rs_args(s), osm);
      });
    }
    if (!b_.o.automatic_early) add_automatic(layer_, mlp_call(ag_base_, rs_base_), layer_seq);
  }

  /// Tunes here, as the first automatic call would (same collective
  /// measurement, then memoized), to print what the tuner measured.
  void print_tuner_choices() {
    ops::TuneReport tuned[4];
    for (int gated = 0; gated < 2; ++gated) b_.ctx.resolve(ag_args(in_[0], gated, agout_.p), ag_base_, &tuned[gated]);
    b_.ctx.resolve(rs_args(in_[0]), rs_base_, &tuned[2]);
    b_.ctx.resolve(ar_args(in_[0]), ar_base_, &tuned[3]);
    if (b_.pg.rank() != 0) return;
    const char* parts[4] = {"AG+GEMM", "AG+GEMM gated", "GEMM+RS", "GEMM+AR"};
    for (int i = 0; i < 4; ++i) {
      std::string times;
      for (const auto& [k, v] : tuned[i].times_ms) {
        times += fmt::format(" {} {:.3f}", ops::strategy_name(k), v);
        if (const auto e = tuned[i].evidence.find(k); e != tuned[i].evidence.end())
          times += fmt::format(" ({})", ops::evidence_text(e->second));
      }
      fmt::print("{} {}: tuner chose {} ({}; ms:{}; load GEMMs {:.3f} ms)\n", sh_.name, parts[i],
                 ops::strategy_name(tuned[i].chosen), tuned[i].from_cache ? "cached" : "measured", times,
                 tuned[i].load_ms);
    }
  }

  void add_row(const char* part_name, const PartResult& r, double ideal) {
    b_.table.add({sh_.name, part_name, ms(r.gemm), r.flop > 0 ? fmt::format("{:.0f}", r.flop / r.gemm * 1e-9) : "-",
                  r.engine > 0 ? ms(r.engine) : "-", ms(r.comm), ms(r.seq), ms(r.dec), ms(r.best), r.which, ms(r.tes),
                  r.choice, ms(ideal), fmt::format("{:.2f}x", r.seq / r.tes),
                  fmt::format("{:.0f}%", 100.0 * ideal / r.tes)});
  }

  void report_ag() {
    ag_res_[1].comm = ag_res_[0].comm;
    for (int gated = 0; gated < 2; ++gated) {
      PartResult& r = ag_res_[gated];
      std::map<Strategy, double>& tm = ag_tm_[gated];
      r.seq = tm[Strategy::sequential];
      r.dec = tm[Strategy::decomposition];
      const Strategy best = tm[Strategy::fused_ce] <= tm[Strategy::fused_sm] ? Strategy::fused_ce : Strategy::fused_sm;
      r.best = tm[best];
      r.which = std::string(ops::strategy_name(best));
      r.choice = std::string(ops::strategy_name(b_.ctx.resolve(ag_args(in_[0], gated, agout_.p), ag_base_)));
      add_row(gated ? "AG+GEMM gated" : "AG+GEMM", r, std::max(r.gemm, r.comm));
    }
  }

  void report_rs_ar() {
    const bool ce_wins = rs_ce_ok_ && rs_ce_ < rs_sm_;
    rs_.best = ce_wins ? rs_ce_ : rs_sm_;
    rs_.which = ce_wins ? "fused_ce" : "fused_sm";
    rs_.choice = std::string(ops::strategy_name(b_.ctx.resolve(rs_args(in_[0]), rs_base_)));
    add_row("GEMM+RS", rs_, std::max(rs_.gemm, rs_.comm));
    ar_.gemm = rs_.gemm;
    ar_.engine = rs_.engine;
    if (rs_ce_ok_) {
      ar_.best = ar_ce_;
      ar_.which = "fused_ce";
    }
    ar_.choice = std::string(ops::strategy_name(b_.ctx.resolve(ar_args(in_[0]), ar_base_)));
    add_row("GEMM+AR", ar_, std::max(ar_.gemm, ar_.comm));
  }

  void report_mlp() {
    const PartResult& g = ag_res_[1];
    layer_.gemm = g.gemm + rs_.gemm;
    layer_.engine = g.engine + rs_.engine;
    layer_.comm = g.comm + rs_.comm;
    layer_.best = std::min(ml_ce_, ml_sm_);
    layer_.which = ml_ce_ <= ml_sm_ ? "fused_ce+fused_sm" : "fused_sm+fused_sm";
    if (rs_ce_ok_ && ml_cece_ < layer_.best) {
      layer_.best = ml_cece_;
      layer_.which = "fused_ce+fused_ce";
    }
    // What ops::mlp runs: the halves' choices, or both sequential where the
    // layer check keeps them (memoized by the timed automatic calls).
    auto& in = in_[0];
    const ops::MlpArgs ma{in.x->p, in.wgu->p, in.wd->p, out_.p, m_, ml_, h_, il_, b_.t};
    const auto [s_ag, s_rs] = b_.ctx.resolve(ma, ag_base_, rs_base_);
    layer_.choice = std::string(ops::strategy_name(s_ag)) + "+" + std::string(ops::strategy_name(s_rs));
    add_row("MLP", layer_, std::max(g.gemm, g.comm) + std::max(rs_.gemm, rs_.comm));
  }

  double seq_of(const std::string& part_name) const {
    if (part_name == "AG+GEMM") return ag_res_[0].seq;
    if (part_name == "AG+GEMM gated") return ag_res_[1].seq;
    if (part_name == "GEMM+RS") return rs_.seq;
    if (part_name == "GEMM+AR") return ar_.seq;
    return layer_.seq;
  }

  void var_row(const std::string& part_name, const std::string& name, double v) {
    b_.var.add({sh_.name, part_name, name, ms(v), fmt::format("{:.2f}x", seq_of(part_name) / v)});
  }

  void report_variants() {
    for (int gated = 0; gated < 2; ++gated) {
      const char* part_name = gated ? "AG+GEMM gated" : "AG+GEMM";
      var_row(part_name, "fused_ce ch=" + std::to_string(b_.o.channels), ag_tm_[gated][Strategy::fused_ce]);
      var_row(part_name, "fused_sm ctas=" + std::to_string(b_.o.comm_ctas), ag_tm_[gated][Strategy::fused_sm]);
    }
    var_row("GEMM+RS", "fused_sm reduce=epilogue", rs_sm_);
    if (rs_ce_ok_) var_row("GEMM+RS", "fused_ce (copy engine)", rs_ce_);
    if (rs_ce_ok_) var_row("GEMM+AR", "fused_ce (copy engine)", ar_ce_);
    var_row("MLP", "fused_ce+fused_sm", ml_ce_);
    var_row("MLP", "fused_sm+fused_sm", ml_sm_);
    if (rs_ce_ok_) var_row("MLP", "fused_ce+fused_ce", ml_cece_);
    for (const Variant& v : variants_) var_row(v.part, v.name, v.ms);
  }

  Bench& b_;
  const MlpShape& sh_;
  const std::int64_t m_, ml_, h_, il_;
  std::vector<InputSet> in_;
  Buf agout_, gemm_out_, part_, out_;
  int turn_ = 0;
  InterleavedTimer timer_;
  std::deque<Variant> variants_;  // deque: stable addresses for the timer
  ops::OpOptions ag_base_, rs_base_, ar_base_;
  bool rs_ce_ok_ = false;
  PartResult ag_res_[2], rs_, ar_, layer_;  // layer_: the whole MLP
  std::map<Strategy, double> ag_tm_[2];
  double rs_sm_ = 0, rs_ce_ = 0, ar_ce_ = 0, ml_ce_ = 0, ml_sm_ = 0, ml_cece_ = 0;
};

void print_tables(const Bench& b) {
  const Options& o = b.o;
  const std::string head = fmt::format(
      "bench mlp: TP={} {} on {} (ms, median of {}, max over ranks, inputs rotated "
      "over {} sets, {})",
      b.pg.world(), o.dtype, b.pg.device_properties().name, o.reps, o.sets,
      fmt::format("{}{}", o.lead ? "lead GEMM before each run" : "no lead GEMM",
                  o.gap_ms > 0 ? fmt::format(", {} ms idle before", o.gap_ms) : std::string()));
  fmt::print("tessera {}\n{}", head, b.table.str());
  const bool var_table = o.variants || o.kernel_only;
  if (var_table) fmt::print("\nfused variants:\n{}", b.var.str());
  if (o.markdown.empty()) return;
  std::ofstream f(o.markdown, std::ios::app);
  TESSERA_CHECK(f.good(), "bench mlp: cannot open {}", o.markdown);
  f << "\n### " << head << "\n\n" << b.table.markdown() << "\n";
  if (var_table) f << "\nFused variants (A/B of OpOptions):\n\n" << b.var.markdown() << "\n";
}

/// MLP-1..6 as --shapes lists them.
std::vector<MlpShape> listed_shapes(const Options& o, int R) {
  std::vector<MlpShape> out;
  for (int idx : o.shapes) {
    TESSERA_CHECK(idx >= 1 && idx <= 6, "bench mlp: shape {} not in 1..6", idx);
    const MlpShape sh = mlp_shape(idx);
    TESSERA_CHECK(sh.i % R == 0 && sh.s % R == 0, "bench mlp: {} does not split over {} ranks", sh.name, R);
    out.push_back(sh);
  }
  return out;
}

/// --random's shapes: bench gemm's draw (M, N, K) as tokens S = M rounded up
/// to a multiple of R, I/R = N, H = K. Names live as long as the process.
std::vector<MlpShape> random_shapes(const Options& o, int R) {
  static std::deque<std::string> names;
  std::vector<MlpShape> out;
  for (const auto& [m, n, k] : gemm::draw_shapes(o.random, o.seed)) {
    const std::int64_t s = (m + R - 1) / R * R;
    names.push_back(fmt::format("S{}-H{}-I{}", s, k, n * R));
    out.push_back({names.back().c_str(), s, k, n * R});
  }
  return out;
}

/// --random's summary: per part, Tessera (automatic) / sequential over the
/// drawn shapes; "slower" counts shapes where automatic took longer than
/// sequential (> 1.00) and beyond 2 % (> 1.02, about the run-to-run noise).
void summarize_random(const Options& o, const Bench& b,
                      const std::vector<std::pair<MlpShape, std::vector<PartOutcome>>>& outcomes, bool print) {
  const std::string series = fmt::format("random {} seed {}", o.random, o.seed);
  nlohmann::json records = nlohmann::json::array();
  // "seq last/first": the same sequential call timed right after automatic
  // over the one timed first in the part: what the position in the loop
  // alone makes of a ratio.
  Table sum{
      {"part", "shapes", "geomean tessera/seq", "worst", "worst shape", "> 1.00", "> 1.02", "geomean seq last/first"}};
  for (const char* part : {"AG+GEMM", "AG+GEMM gated", "GEMM+RS", "GEMM+AR", "MLP"}) {
    double log_sum = 0, worst = 0, log_last = 0;
    int n = 0, over = 0, over2 = 0, n_last = 0;
    std::string worst_shape;
    for (const auto& [sh, parts] : outcomes)
      for (const PartOutcome& p : parts) {
        if (p.part != part || p.seq <= 0 || p.tes <= 0) continue;
        const double r = p.tes / p.seq;
        log_sum += std::log(r);
        if (p.seq_last > 0) log_last += std::log(p.seq_last / p.seq), ++n_last;
        ++n;
        over += r > 1.0;
        over2 += r > 1.02;
        if (r > worst) worst = r, worst_shape = sh.name;
        records.push_back({{"metric", "tessera / sequential"},
                           {"case", fmt::format("{} {}", sh.name, part)},
                           {"value", r},
                           {"unit", "ratio"},
                           {"baseline", "sequential (cuBLASLt + NCCL)"},
                           {"series", series},
                           {"tessera_ms", p.tes},
                           {"sequential_ms", p.seq},
                           {"sequential_last_ms", p.seq_last},
                           {"choice", p.choice}});
      }
    if (n == 0) continue;
    const double gm = std::exp(log_sum / n);
    const double gm_last = n_last > 0 ? std::exp(log_last / n_last) : 0;
    sum.add({part, std::to_string(n), fmt::format("{:.3f}", gm), fmt::format("{:.3f}", worst), worst_shape,
             std::to_string(over), std::to_string(over2), n_last > 0 ? fmt::format("{:.3f}", gm_last) : "-"});
    const std::string c = fmt::format("{}: {}", series, part);
    records.push_back({{"metric", "geomean tessera / sequential"},
                       {"case", c},
                       {"value", gm},
                       {"unit", "ratio"},
                       {"baseline", "sequential (cuBLASLt + NCCL)"},
                       {"count", n}});
    records.push_back(
        {{"metric", "worst tessera / sequential"},
         {"case", c},
         {"value", worst},
         {"unit", "ratio"},
         {"baseline", "sequential (cuBLASLt + NCCL)"},
         {"issue", 19},
         {"target",
          {{"op", "<="}, {"value", 1.0}, {"text", "automatic never slower than sequential on any random shape"}}}});
    records.push_back({{"metric", "count tessera / sequential > 1.02"}, {"case", c}, {"value", over2}});
    if (n_last > 0)
      records.push_back({{"metric", "geomean sequential timed last / first"},
                         {"case", c},
                         {"value", gm_last},
                         {"unit", "ratio"},
                         {"count", n_last}});
  }
  if (print)
    fmt::print("\nbench mlp --random {} --seed {}: Tessera (automatic) / sequential per part, {} of {} shapes\n{}",
               o.random, o.seed, outcomes.size(), o.random, sum.str());
  if (o.json.empty()) return;
  const nlohmann::json prov{
      {"topic", "mlp"},
      {"issue", 19},
      {"device",
       o.device_kind != "unknown" ? o.device_kind : machine_kind(b.pg.device_properties().name, b.pg.world())},
      {"gpu", b.pg.device_properties().name},
      {"world", b.pg.world()},
      {"date", results_date()},
      {"commit", results_commit(o.commit)},
      {"command", o.command_line},
      {"dtype", o.dtype},
      {"reps", o.reps},
      {"lead", o.lead},
      {"automatic_timed", o.automatic_early ? "after the part's first sequential body" : "after the fused bodies"},
      {"shapes_measured", outcomes.size()}};
  write_results(o.json, prov, records, "bench mlp");
  if (print) fmt::print("wrote {}\n", o.json);
}

void run(const Options& o) {
  auto pg = runtime::ProcessGroup::from_environment();
  const int R = pg->world(), rank = pg->rank();
  TESSERA_CHECK(o.dtype == "bf16" || o.dtype == "f16", "bench mlp: --dtype {} (bf16 or f16)", o.dtype);
  const DType t = o.dtype == "f16" ? DType::f16 : DType::bf16;
  ops::TpContext ctx(*pg);
  cudaStream_t st = pg->stream();
  kernels::GemmOptions fused_tile;
  fused_tile.ping_pong = true;
  fused_tile.tile = kernels::GemmTile::T64x256;
  // Lead GEMM [8192, 8192, 4096] (~0.7 ms) on its own random operands.
  constexpr std::int64_t kLead = 8192, kLeadK = 4096;
  Buf lead_a(kLead * kLeadK * 2), lead_b(kLead * kLeadK * 2), lead_d(kLead * kLead * 2);
  gemm::fill_random(lead_a.p, kLead * kLeadK, t, 77 + rank, st);
  gemm::fill_random(lead_b.p, kLead * kLeadK, t, 88 + rank, st);
  const kernels::GemmArgs lead_args{lead_a.p, lead_b.p, lead_d.p, kLead, kLead, kLeadK,
                                    kLeadK,   kLeadK,   kLead,    t,     t,     kernels::BLayout::NK};
  Bench b{o, *pg, ctx, st, t, t == DType::f16 ? ncclFloat16 : ncclBfloat16, fused_tile, lead_args};
  const std::vector<MlpShape> shapes = o.random > 0 ? random_shapes(o, R) : listed_shapes(o, R);
  std::vector<std::pair<MlpShape, std::vector<PartOutcome>>> outcomes;
  const auto t0 = std::chrono::steady_clock::now();
  for (const MlpShape& sh : shapes) {
    // Every rank stops at the same shape: the slowest rank's clock decides.
    const double elapsed =
        pg->allreduce_max(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (o.budget_s > 0 && elapsed > o.budget_s) {
      if (rank == 0)
        fmt::print("bench mlp: budget spent ({:.0f} s): {} of {} shapes measured\n", elapsed, outcomes.size(),
                   shapes.size());
      break;
    }
    ShapeBench shape(b, sh);
    shape.measure();
    shape.report();
    outcomes.emplace_back(sh, shape.outcomes());
    // The records so far, so a run cut short keeps every finished shape.
    if (o.random > 0 && rank == 0) summarize_random(o, b, outcomes, false);
  }
  if (rank != 0) return;
  print_tables(b);
  if (o.random > 0) summarize_random(o, b, outcomes, true);
}

}  // namespace

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto& bench = tools::subcommand(root, "bench", "Benchmarks");
  auto opts = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("mlp",
                                   "Tensor-parallel MLP (MLP-1..6): AG+GEMM (plain and gated), GEMM+RS, whole "
                                   "layer vs sequential, decomposition and ideal");
  cmd->add_option("--shapes", opts->shapes, "MLP shape numbers (1..6)")->delimiter(',');
  cmd->add_option("--dtype", opts->dtype, "bf16 or f16");
  cmd->add_option("--reps", opts->reps, "timed repetitions (median)")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", opts->warmup, "warm-up repetitions")->check(CLI::Range(0, 100000));
  cmd->add_option("--sets", opts->sets, "input buffer sets rotated between runs")->check(CLI::Range(1, 16));
  cmd->add_option("--gap-ms", opts->gap_ms,
                  "idle the GPU this long before every timed run (0: back to back, power-capped clocks)")
      ->check(CLI::Range(0.0, 1000.0));
  cmd->add_flag("--lead,!--no-lead", opts->lead,
                "queue a ~0.7 ms lead GEMM before every timed run (the run starts on a busy GPU, host ahead; "
                "--no-lead: start each run from an idle GPU)");
  cmd->add_option("--channels", opts->channels, "AG channels per shard")->check(CLI::Range(1, 32));
  cmd->add_option("--comm-ctas", opts->comm_ctas, "CTAs for SM pushes / reductions")->check(CLI::Range(1, 64));
  cmd->add_flag("--variants,!--no-variants", opts->variants,
                "print the fused-variant A/B table (--no-variants: skip it)");
  cmd->add_flag("--kernel-only,!--no-kernel-only", opts->kernel_only,
                "time the fused_ce kernels without their communication (OpOptions::diag_kernel_only; rows in the "
                "variant table; default on)");
  cmd->add_flag("--kernel-split,!--no-kernel-split", opts->kernel_split,
                "with --kernel-only: GEMM+RS kernel-only rows with the owner add, band waits or notify adds left out "
                "(OpOptions::diag_skip)");
  cmd->add_option("--markdown", opts->markdown, "append the tables (markdown) to this file");
  cmd->add_option("--random", opts->random,
                  "N shapes drawn as bench gemm --random draws its GEMMs (tokens = M, I/R = N, H = K) instead of "
                  "--shapes; prints Tessera (automatic) / sequential per part")
      ->check(CLI::Range(1, 10000));
  cmd->add_option("--seed", opts->seed, "seed of --random's draw");
  cmd->add_option("--budget-s", opts->budget_s,
                  "with --random: start no new shape after this many seconds (0: measure all)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--json", opts->json, "with --random: write per-shape records and the summary here");
  cmd->add_flag("--automatic-early,!--automatic-late", opts->automatic_early,
                "time automatic right after each part's sequential body (default), or after the other strategies");
  cmd->add_option("--device-kind", opts->device_kind,
                  "device kind recorded in --json (default: from the GPU's name and the world size)");
  cmd->add_option("--commit", opts->commit, "commit recorded in --json (default $TESSERA_COMMIT)");
  cmd->callback([opts, cmd] {
    Options o = *opts;
    o.command_line = "tessera bench mlp";
    for (const auto* opt : cmd->get_options())
      if (opt->count() > 0 && opt->get_name() != "--help") {
        std::string v;
        for (const auto& r : opt->results()) v += (v.empty() ? "" : ",") + r;
        // Flags (--x,!--no-x) as typed; options with their values.
        if (opt->get_type_size() == 0)
          o.command_line += " " + (v == "false" ? "--no-" + opt->get_name().substr(2) : opt->get_name());
        else
          o.command_line += " " + opt->get_name() + " " + v;
      }
    TESSERA_CHECK(o.random > 0 || (o.json.empty() && o.budget_s == 0),
                  "bench mlp: --json and --budget-s go with --random");
    run(o);
  });
});

}  // namespace tessera::bench
