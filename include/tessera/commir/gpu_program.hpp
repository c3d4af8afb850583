// tessera/commir/gpu_program.hpp — the GPU executor's bookkeeping without a
// GPU: one rank's Plan translated into a linear program of device operations
// on numbered blocks, and a host simulator that runs the programs of all
// ranks together.
//
// The builder tracks, per buffer, which blocks (box + device allocation)
// this rank holds — with the CPU executor's rules: inputs from
// Plan::initial; an accumulator is created zeroed at its first compute (one
// block per compute box); a partial send moves its block away, a partial
// receive into a box already held adds into it; a collective's result
// replaces the buffer's blocks (Broadcast adds them on non-roots); a free
// drops a block. A box needed by a step may be covered by several blocks
// (then it is assembled into a temporary block with 2-D copies); a box held
// nowhere is an Error naming the rank, the step and what is held.
//
// A partial received into a box not held yet (a ring reduce-scatter step) is
// kept aside: the compute of that box writes a fresh block (so it does not
// wait for the transfer, which overlaps it) and then adds the received
// partial into a new block (compute stream, after an event on the
// communication stream).
//
// Issue order (same on every rank, so NCCL calls match): for t = -1 ..
// steps_per_rank + 1: collectives of time t (by id); the point-to-point
// transfers received at t+1 that do not carry partial accumulators (one NCCL
// group; prefetch, overlapping compute t); compute t; the partial transfers
// received at t+1 (another group, after the compute that made them); frees.
// Streams: compute ops (GEMM, assembling GEMM inputs, merging a received
// partial after its GEMM) on the compute stream, everything else on the
// communication stream; the communication stream waits for the compute
// stream before each NCCL group or collective; the compute stream waits for
// the communication stream only before an op that reads a block the comm
// stream wrote, or writes one it reads or writes (events), so a transfer
// the next GEMM does not touch stays in flight during it.
//
// Data types: inputs bf16; accumulators/outputs (stored, communicated and
// merged) in the Grid's dtype: bf16 (the default of
// make_gemm: what the hand-built operators do) or f32 (exact tests). The
// first GEMM into an accumulator block overwrites it (beta = 0, no memset),
// later ones add (beta = 1); a block whose only product is empty is zeroed.
//
// Limits (Error at build time): GEMM plans on one-level meshes; output dtype
// bf16 or f32; collectives over the whole world on row blocks
// that NCCL can address: AllGather/ReduceScatter parts equal, contiguous,
// full-width and in rank order; no AllToAll.
//
// Attention plans (kernel "attention", meshes of any depth; design notes in
// docs/design/commir.md) use the same builder with N-D blocks: a block holds a box of its
// buffer's dimensions (Q, O: [b, h, q], K, V: [b, h/g, kv]) row-major with
// `elem` (head_dim) trailing elements — the kernel's [batch, heads, seq,
// head_dim] with strides. Differences from GEMM plans:
//  - compute: one kernels::attention call per run of query heads that maps
//    onto its KV heads (GQA boxes that start inside a KV-head group are
//    split), writing a fresh partial (O in bf16, LSE in f32: the kernel's
//    outputs); the first contribution to an output cell is that partial;
//    later ones merge into it (kernels::attention_merge: a float32 running
//    accumulator, initialized from the held partial; the last contribution
//    known on this rank writes the bf16 partial instead of the accumulator).
//  - every output block has a companion LSE block (DevBlockInfo::lse);
//    output transfers carry both (O bf16, LSE f32), and a block is always a
//    bf16 partial when it leaves, is collected or is read back.
//  - every collective is an NCCL group of sends/receives with the plan's
//    boxes (AllGather, AllToAll, Broadcast: each member sends each other
//    member the part of its `before` region the other's `after` region
//    needs; pieces not contiguous in their block are copied out first);
//    the received pieces are held as blocks and assembled (N-D copies) where
//    a step needs one box. AllReduce / ReduceScatter of partial attention
//    results (tree schedules) exchange the partials the same way and merge
//    them in rank order (same result on every rank).
//    Collectives of one time on distinct buffers share one group. On a
//    mesh of several levels a collective's members are the ranks that share
//    the other coordinates (Step::group); its transfers are point-to-point
//    calls on the world communicator with global ranks as peers, and every
//    rank issues its collectives in the plan's id order, so two ranks meet
//    their common transfers in the same order whatever groups they belong to.
//  - the compute stream's wait for step t's received blocks comes before
//    step t + 1's prefetch group (so step t's kernel does not wait for step
//    t + 1's transfer); a send the plan posts steps before its receive
//    leaves with the receive's group, reading the block even if the plan
//    freed it meanwhile (no block's memory is reused within a run).
//  - the inputs are bf16 and the output is returned in bf16 whatever the
//    Grid's dtype (the kernel computes in bf16 with float32 accumulation).
//  - limits left to the executor (checked before any launch): the kernel's
//    (head_dim 64 or 128, sm_90); non-causal only (the IR has no causal
//    attention).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessera/commir/cpu_executor.hpp"
#include "tessera/commir/plan.hpp"

namespace tessera::commir {

/// A block of one buffer: row-major, `f32` (accumulators/outputs) or bf16.
/// `transposed`: stored column-major instead (element (i, j) of the box at
/// (j - cols.lo) * rows + (i - rows.lo)) — only the GEMM's B operand in the
/// weight layout [N, K] (GpuProgramOptions::b_nk); no copy, transfer or
/// readback ever touches such a block.
struct DevBlockInfo {
  std::string buffer;
  Box box;  // [rows, cols] in buffer coordinates (attention: N-D, see elem)
  bool f32 = false;
  bool transposed = false;
  std::int64_t elem = 1;  // trailing elements per point (attention: head_dim; 1 for LSE and GEMM blocks)
  /// Attention output blocks: the companion block of float32 LSE values (one
  /// per point, same box); -1 otherwise. An output block with f32 set is a
  /// running accumulator (kernels::attention_merge's o_acc / lse_acc), else
  /// a bf16 partial (normalized O and its LSE).
  int lse = -1;
  std::int64_t rows() const { return box.r[0].size(); }
  std::int64_t cols() const { return box.r[1].size(); }
  std::int64_t elements() const { return box.volume() * elem; }
};

/// Element (offset) of a block with a leading dimension, in elements. In a
/// transposed block, `offset` is the first element of the column-major view
/// and `ld` the block's row count (a GEMM's B then reads B^T rows).
struct DevView {
  int block = -1;
  std::int64_t offset = 0;
  std::int64_t ld = 0;
};

enum class DevStream { compute, comm };

enum class DevOpKind {
  zero,                // memset block `dst.block` to 0
  copy,                // rows x cols elements from src to dst (same dtype)
  add,                 // dst = a + b, rows x cols accumulator elements (merging a partial accumulator)
  gemm,                // D[m,n] (+)= A[m,k] * B[k,n]: a = A (bf16), b = B (bf16), dst = D (accumulator
                       // dtype); `accumulate`: += (beta 1), else = (beta 0); `b_nk`: B is read from a
                       // transposed block, i.e. stored [n, k] with leading dimension b.ld (cuBLASLt "TN")
  group_start,         // ncclGroupStart
  group_end,           // ncclGroupEnd
  send,                // ncclSend of `count` contiguous elements at src to `peer`
  recv,                // ncclRecv of `count` contiguous elements into dst from `peer`
  all_gather,          // src: count elements per rank; dst: world * count
  reduce_scatter,      // src: world * count; dst: count (sum)
  all_reduce,          // count elements, src -> dst (sum)
  broadcast,           // count elements from `root`'s src into every rank's dst
  comm_waits_compute,  // event: the comm stream waits for work issued on compute so far
  compute_waits_comm,  // event: the compute stream waits for work issued on comm so far
  attention,           // kernels::attention: DevOp::attn (Q, K, V bf16 -> O bf16 + LSE f32)
  merge,               // kernels::attention_merge: DevOp::merge (whole blocks of one box)
};
const char* dev_op_name(DevOpKind k);

/// An attention call: [batch, heads, seq, head_dim] views with element
/// strides (batch, head, seq) into their blocks; LSE [batch, heads_q, seq_q]
/// with strides (batch, head), rows contiguous.
struct DevAttn {
  DevView q, k, v, o, lse;
  std::int64_t batch = 0, seq_q = 0, seq_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  std::int64_t q_stride[3] = {0, 0, 0}, k_stride[3] = {0, 0, 0}, v_stride[3] = {0, 0, 0}, o_stride[3] = {0, 0, 0};
  std::int64_t lse_stride[2] = {0, 0};
};

/// A merge of one partial into a running accumulator over `points` query
/// rows of head_dim values, all views whole blocks of the same box (so the
/// layout is a flat list of points): kernels::attention_merge with batch 1,
/// heads 1, seq = points.
struct DevMerge {
  DevView acc, acc_lse;    // float32 running O and LSE (read unless init; written if write_acc)
  DevView part, part_lse;  // bf16 O and float32 LSE, or block -1 (finalize only)
  DevView out, out_lse;    // bf16 O and float32 LSE written, or block -1
  bool init = false, write_acc = true;
  std::int64_t points = 0, head_dim = 0;
};

struct DevOp {
  DevOpKind kind;
  DevStream stream = DevStream::comm;
  DevView src, dst, a, b;            // by kind (see DevOpKind)
  std::int64_t rows = 0, cols = 0;   // copy / add
  std::int64_t m = 0, n = 0, k = 0;  // gemm
  std::int64_t count = 0;            // NCCL ops, elements
  bool f32 = false;                  // dtype of the data moved (NCCL, copy, add): f32, else bf16
  bool accumulate = false;           // gemm: add to dst (beta = 1) instead of overwriting it
  bool b_nk = false;                 // gemm: B stored [n, k] (see DevOpKind::gemm)
  int peer = -1, root = -1;
  DevAttn attn;      // attention
  DevMerge merge;    // merge
  std::string what;  // the plan step it comes from (diagnostics)
};

/// One piece of an output: rows x cols of `src`, written at `host_offset`
/// (elements, leading dimension = the wanted box's width) of the box's values.
struct DevReadback {
  DevView src;
  std::int64_t rows = 0, cols = 0, host_offset = 0;
  std::int64_t host_ld = 0;  // leading dimension on the host; 0 = the wanted box's width (2-D GEMM boxes)
};

struct DevProgram {
  int rank = 0;
  std::vector<DevBlockInfo> blocks;
  /// Blocks filled by set_input: (buffer, block id), box = the block's box.
  std::vector<std::pair<std::string, int>> inputs;
  std::vector<DevOp> ops;
  /// Per output buffer: this rank's required final boxes, each with the
  /// pieces that assemble it (later pieces overwrite earlier ones); the
  /// host layout of a box is row-major over its dimensions and elem.
  std::map<std::string, std::vector<std::pair<Box, std::vector<DevReadback>>>> outputs;
  bool b_nk = false;           // B's blocks are stored transposed ([n, k], the weight layout)
  std::int64_t bytes() const;  // device memory of all blocks
};

struct GpuProgramOptions {
  /// Store the GEMM's B operand as [n, k] (nn.Linear's weight layout, what
  /// the hand-built operators take: cuBLASLt's "TN" GEMM, K-major on both
  /// operands) instead of the IR's row-major [k, n]. Applied only where the
  /// plan never moves B (no transfer or collective of B on this rank) and
  /// every compute reads its B box from one input block; otherwise the
  /// program stays [k, n] (DevProgram::b_nk tells which).
  bool b_nk = true;
  /// The schedule's name, for messages only ("commir gpu executor (ring): ...").
  std::string schedule;
};

/// Builds rank `rank`'s program; throws tessera::Error ("commir gpu
/// executor: ...") naming the step when the plan is outside the limits or a
/// step needs data this rank does not hold.
DevProgram build_gpu_program(const Plan& plan, int rank, const GpuProgramOptions& opts = {});

struct GpuSimRun {
  double max_rel_error = 0;  // over every rank's final region of every output
  std::int64_t checked_elements = 0;
  std::int64_t ops = 0;  // device ops simulated, all ranks
};

/// Runs the programs of all ranks on the host in double precision: NCCL
/// semantics (grouped sends/receives matched per peer pair in posting order,
/// collectives matched by position and checked for equal kind, count, root),
/// and a race check: every access to a block from one stream must be ordered
/// after the conflicting accesses from the other stream by the program's
/// event edges. Throws tessera::Error on a race, a mismatch, a deadlock or a
/// missing output; otherwise compares every rank's outputs with `expected`.
GpuSimRun simulate_gpu_programs(const Plan& plan, const Tensors& inputs, const Tensors& expected,
                                const GpuProgramOptions& opts = {});
/// Same with given programs (one per rank, e.g. altered by a test).
GpuSimRun simulate_gpu_programs(const Plan& plan, std::vector<DevProgram> programs, const Tensors& inputs,
                                const Tensors& expected);

}  // namespace tessera::commir
