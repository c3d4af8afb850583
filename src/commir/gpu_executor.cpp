// GPU executor of CommIR GEMM and attention plans: NCCL for communication,
// cuBLASLt for the local GEMMs (what the hand-built operators' sequential
// strategy uses), the add kernel (kernels::add_2d) for bf16 partial merges,
// kernels::attention and kernels::attention_merge for attention plans (see
// gpu_executor.hpp).
#include "tessera/commir/gpu_executor.hpp"

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <thread>

#include "tessera/commir/gpu_program.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/kernels/attention_merge.hpp"
#include "tessera/kernels/elementwise.hpp"
#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/wait_diagnostics.hpp"

#define TESSERA_CUBLAS_CHECK(expr)                                                                            \
  do {                                                                                                        \
    const cublasStatus_t st_ = (expr);                                                                        \
    TESSERA_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "{} failed: cuBLAS status {}", #expr, static_cast<int>(st_)); \
  } while (0)

namespace tessera::commir {
namespace {

// Largest power of two (<= 256) dividing the address: cuBLASLt's heuristic
// assumes 256-byte aligned operands unless told otherwise, and views into a
// block may start anywhere.
std::uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

// One local GEMM, prepared at construction (descriptors and the algorithm
// chosen once, so run() only enqueues): D[m, n] (+)= A[m, k] * B[k, n],
// row-major views with leading dimensions in elements; A, B bf16, D bf16 or
// f32. Row-major D = A B is column-major D^T = B^T A^T: cuBLASLt's "A" is
// our B (n x k column-major, ld = ldb), its "B" our A (k x m, ld = lda).
struct LtGemm {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  float beta = 0.f;

  /// sm_target > 0: the GEMM runs while NCCL kernels are in flight; cuBLASLt
  /// picks (and sizes its persistent grid) for that many SMs, leaving the
  /// rest to the communication kernels instead of making them wait for the
  /// GEMM's CTAs to retire.
  void prepare(cublasLtHandle_t lt, const DevOp& op, const void* A, const void* B, const void* D, bool d_f32,
               std::size_t ws_bytes, int sm_target) {
    TESSERA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (sm_target > 0)
      TESSERA_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_target, sizeof(sm_target)));
    // Our B [k, n] row-major is column-major n x k: cuBLASLt "A" untransposed.
    // Stored [n, k] (op.b_nk) it is column-major k x n, transposed ("TN").
    if (op.b_nk) {
      const cublasOperation_t ta = CUBLAS_OP_T;
      TESSERA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    }
    TESSERA_CUBLAS_CHECK(op.b_nk ? cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, op.k, op.n, op.b.ld)
                                 : cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, op.n, op.k, op.b.ld));
    TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, op.k, op.m, op.a.ld));
    TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, d_f32 ? CUDA_R_32F : CUDA_R_16BF, op.n, op.m, op.dst.ld));
    beta = op.accumulate ? 1.f : 0.f;
    cublasLtMatmulPreference_t pref = nullptr;
    TESSERA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const std::uint32_t al_a = alignment(B), al_b = alignment(A), al_d = alignment(D);
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                             sizeof(ws_bytes));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    TESSERA_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0,
                  "commir gpu executor: {}: no cuBLASLt algorithm for GEMM {}x{}x{} (status {}, alignments {}/{}/{})",
                  op.what, op.m, op.n, op.k, static_cast<int>(st), al_a, al_b, al_d);
    algo = res.algo;
  }
  void enqueue(cublasLtHandle_t lt, const DevOp& op, const void* A, const void* B, void* D, void* ws,
               std::size_t ws_bytes, cudaStream_t s) const {
    const float alpha = 1.f;
    const cublasStatus_t st =
        cublasLtMatmul(lt, desc, &alpha, B, la, A, lb, &beta, D, ld, D, ld, &algo, ws, ws_bytes, s);
    TESSERA_CHECK(st == CUBLAS_STATUS_SUCCESS, "commir gpu executor: {}: cublasLtMatmul {}x{}x{} failed: status {}",
                  op.what, op.m, op.n, op.k, static_cast<int>(st));
  }
  void destroy() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// f32 partial merge: cublasLtMatrixTransform D = A + B, rows x cols, row-major
// views (column-major cols x rows for cuBLASLt). Descriptors prepared once.
struct LtAddF32 {
  cublasLtMatrixTransformDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;

  void prepare(const DevOp& op) {
    TESSERA_CUBLAS_CHECK(cublasLtMatrixTransformDescCreate(&desc, CUDA_R_32F));
    TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, op.cols, op.rows, op.a.ld));
    TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, op.cols, op.rows, op.b.ld));
    TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, op.cols, op.rows, op.dst.ld));
  }
  void enqueue(cublasLtHandle_t lt, const DevOp& op, const void* A, const void* B, void* D, cudaStream_t s) const {
    const float one = 1.f;
    const cublasStatus_t st = cublasLtMatrixTransform(lt, desc, &one, A, la, &one, B, lb, D, ld, s);
    TESSERA_CHECK(st == CUBLAS_STATUS_SUCCESS,
                  "commir gpu executor: {}: cublasLtMatrixTransform (add) {}x{} failed: status {}", op.what, op.rows,
                  op.cols, static_cast<int>(st));
  }
  void destroy() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (desc) cublasLtMatrixTransformDescDestroy(desc);
  }
};

using Clock = std::chrono::steady_clock;

// Polls `s` until idle or the deadline (cudaErrorNotReady), surfacing an
// asynchronous NCCL error as soon as it appears.
cudaError_t wait_idle(cudaStream_t s, Clock::time_point deadline, ncclComm_t comm) {
  for (;;) {
    const cudaError_t rc = cudaStreamQuery(s);
    if (rc != cudaErrorNotReady) return rc;
    ncclResult_t async = ncclSuccess;
    TESSERA_NCCL_CHECK(ncclCommGetAsyncError(comm, &async));
    TESSERA_NCCL_CHECK(async);
    if (Clock::now() > deadline) return cudaErrorNotReady;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

struct GpuExecutor::Impl {
  Impl(const Plan& p, int r, ncclComm_t c, cudaStream_t compute, cudaStream_t comm_stream)
      : plan(p), rank(r), comm(c), cs(compute), ms(comm_stream) {}
  const Plan& plan;
  int rank;
  ncclComm_t comm;
  cudaStream_t cs, ms;
  DevProgram prog;
  cublasLtHandle_t lt = nullptr;
  void* ws = nullptr;
  std::size_t ws_bytes = 32u << 20;
  std::vector<void*> mem;     // per block
  std::vector<LtGemm> gemms;  // prepared GEMMs / f32 adds, indexed through prepared[op]
  std::vector<LtAddF32> adds;
  std::vector<kernels::AttentionArgs> attns;  // prepared attention calls (validated)
  std::vector<kernels::AttentionMergeArgs> merges;
  std::vector<int> prepared;  // per op: index into gemms, adds, attns or merges, -1 otherwise
  int add_ctas = 1;           // CTAs of the bf16 add kernel (all SMs: it runs alone or after the GEMM)
  int comm_sms = 8;           // SMs a GEMM leaves to NCCL kernels in flight (TESSERA_COMMIR_COMM_SMS)
  cudaEvent_t ev = nullptr;

  std::size_t esize(int blk) const { return prog.blocks[blk].f32 ? 4 : 2; }
  std::size_t block_bytes(int blk) const { return prog.blocks[blk].elements() * esize(blk); }
  char* ptr(const DevView& v) const { return static_cast<char*>(mem.at(v.block)) + v.offset * esize(v.block); }
  cudaStream_t stream(DevStream s) const { return s == DevStream::compute ? cs : ms; }
  static ncclDataType_t nccl_type(bool f32) { return f32 ? ncclFloat : ncclBfloat16; }

  // Both streams idle within the wait timeout, or an Error (the rank, and
  // that an NCCL call is probably waiting for a peer).
  void wait_streams(const char* what) const {
    const auto deadline = Clock::now() + std::chrono::nanoseconds(runtime::wait_timeout_ns());
    for (cudaStream_t s : {cs, ms}) {
      const cudaError_t rc = wait_idle(s, deadline, comm);
      TESSERA_CHECK(rc != cudaErrorNotReady,
                    "commir gpu executor: rank {}: {}: the {} stream is still busy after {} ms (an NCCL call waiting "
                    "for a peer that did not issue it?)",
                    rank, what, s == cs ? "compute" : "communication", runtime::wait_timeout_ns() / 1000000);
      TESSERA_CUDA_CHECK(rc);
    }
  }

  // Each stream waits for everything issued on the other so far.
  void join_streams() {
    TESSERA_CUDA_CHECK(cudaEventRecord(ev, cs));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(ms, ev));
    TESSERA_CUDA_CHECK(cudaEventRecord(ev, ms));  // now after both streams' work
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, ev));
  }

  // Descriptors, algorithms and alignment checks of every local op, before
  // anything runs (the addresses are known: every block is allocated).
  void prepare() {
    prepared.assign(prog.ops.size(), -1);
    bool comm_in_flight = false;  // an NCCL op the compute stream has not waited for yet
    for (std::size_t i = 0; i < prog.ops.size(); ++i) {
      const DevOp& op = prog.ops[i];
      switch (op.kind) {
        case DevOpKind::send:
        case DevOpKind::recv:
        case DevOpKind::all_gather:
        case DevOpKind::reduce_scatter:
        case DevOpKind::all_reduce:
        case DevOpKind::broadcast:
          comm_in_flight = true;
          break;
        case DevOpKind::compute_waits_comm:
          comm_in_flight = false;
          break;
        default:
          break;
      }
      if (op.kind == DevOpKind::attention) {
        const DevAttn& d = op.attn;
        kernels::AttentionArgs a;
        a.q = ptr(d.q);
        a.k = ptr(d.k);
        a.v = ptr(d.v);
        a.o = ptr(d.o);
        a.lse = reinterpret_cast<float*>(ptr(d.lse));
        a.lse_batch_stride = d.lse_stride[0];
        a.lse_head_stride = d.lse_stride[1];
        a.batch = d.batch;
        a.seqlen_q = d.seq_q;
        a.seqlen_k = d.seq_k;
        a.heads_q = d.heads_q;
        a.heads_kv = d.heads_kv;
        a.head_dim = d.head_dim;
        // DevAttn strides are (batch, head, seq); AttnStrides (batch, seq, head).
        a.q_stride = {d.q_stride[0], d.q_stride[2], d.q_stride[1]};
        a.k_stride = {d.k_stride[0], d.k_stride[2], d.k_stride[1]};
        a.v_stride = {d.v_stride[0], d.v_stride[2], d.v_stride[1]};
        a.o_stride = {d.o_stride[0], d.o_stride[2], d.o_stride[1]};
        a.dtype = DType::bf16;
        a.causal = false;
        kernels::validate(a, op.what.c_str());  // the kernel's limits (head_dim, sm_90, alignment), before any launch
        attns.push_back(a);
        prepared[i] = static_cast<int>(attns.size()) - 1;
      } else if (op.kind == DevOpKind::merge) {
        const DevMerge& d = op.merge;
        kernels::AttentionMergeArgs m;
        m.o_acc = reinterpret_cast<float*>(ptr(d.acc));
        m.lse_acc = reinterpret_cast<float*>(ptr(d.acc_lse));
        if (d.part.block >= 0) {
          m.o_part = ptr(d.part);
          m.lse_part = reinterpret_cast<const float*>(ptr(d.part_lse));
        }
        m.init = d.init;
        m.write_acc = d.write_acc;
        if (d.out.block >= 0) {
          m.o_out = ptr(d.out);
          m.lse_out = reinterpret_cast<float*>(ptr(d.out_lse));
        }
        m.batch = 1;  // whole blocks of one box: a flat list of query rows
        m.seq = std::max<std::int64_t>(d.points, 1);
        m.heads = 1;
        m.head_dim = d.head_dim;
        m.row0 = 0;
        m.rows = d.points;
        m.dtype = DType::bf16;
        kernels::validate(m);
        merges.push_back(m);
        prepared[i] = static_cast<int>(merges.size()) - 1;
      } else if (op.kind == DevOpKind::gemm) {
        gemms.emplace_back();
        prepared[i] = static_cast<int>(gemms.size()) - 1;
        const int target = comm_in_flight && comm_sms > 0 ? add_ctas - comm_sms : 0;
        gemms.back().prepare(lt, op, ptr(op.a), ptr(op.b), ptr(op.dst), prog.blocks[op.dst.block].f32, ws_bytes,
                             target);
      } else if (op.kind == DevOpKind::add && op.f32) {
        adds.emplace_back();
        prepared[i] = static_cast<int>(adds.size()) - 1;
        adds.back().prepare(op);
      } else if (op.kind == DevOpKind::add) {
        // The bf16 add kernel moves 16-byte vectors: rows must start 16-byte aligned.
        for (const DevView* v : {&op.a, &op.b, &op.dst})
          TESSERA_CHECK(reinterpret_cast<std::uintptr_t>(ptr(*v)) % 16 == 0 && v->ld % 8 == 0,
                        "commir gpu executor: rank {} {}: the bf16 partial merge needs 16-byte aligned rows (leading "
                        "dimension a multiple of 8 elements), got leading dimension {} (use an f32 output buffer)",
                        rank, op.what, v->ld);
      }
    }
  }

  void issue(std::size_t i) {
    const DevOp& op = prog.ops[i];
    const cudaStream_t s = stream(op.stream);
    switch (op.kind) {
      case DevOpKind::zero:
        TESSERA_CUDA_CHECK(cudaMemsetAsync(mem.at(op.dst.block), 0, block_bytes(op.dst.block), s));
        break;
      case DevOpKind::attention:
        kernels::attention(attns.at(prepared[i]), s);
        break;
      case DevOpKind::merge:
        kernels::attention_merge(merges.at(prepared[i]), s);
        break;
      case DevOpKind::copy: {
        const std::size_t e = op.f32 ? 4 : 2;
        TESSERA_CUDA_CHECK(cudaMemcpy2DAsync(ptr(op.dst), op.dst.ld * e, ptr(op.src), op.src.ld * e, op.cols * e,
                                             op.rows, cudaMemcpyDeviceToDevice, s));
        break;
      }
      case DevOpKind::add:
        if (op.f32) {
          adds.at(prepared[i]).enqueue(lt, op, ptr(op.a), ptr(op.b), ptr(op.dst), s);
        } else {
          kernels::Add2dArgs a;
          a.x = ptr(op.a);
          a.ldx = op.a.ld;
          a.y = ptr(op.b);
          a.ldy = op.b.ld;
          a.out = ptr(op.dst);
          a.ldo = op.dst.ld;
          a.rows = op.rows;
          a.n = op.cols;
          a.dtype = DType::bf16;
          kernels::add_2d(a, add_ctas, s);
        }
        break;
      case DevOpKind::gemm:
        gemms.at(prepared[i]).enqueue(lt, op, ptr(op.a), ptr(op.b), ptr(op.dst), ws, ws_bytes, s);
        break;
      case DevOpKind::group_start:
        TESSERA_NCCL_CHECK(ncclGroupStart());
        break;
      case DevOpKind::group_end:
        TESSERA_NCCL_CHECK(ncclGroupEnd());
        break;
      case DevOpKind::send:
        TESSERA_NCCL_CHECK(ncclSend(ptr(op.src), op.count, nccl_type(op.f32), op.peer, comm, ms));
        break;
      case DevOpKind::recv:
        TESSERA_NCCL_CHECK(ncclRecv(ptr(op.dst), op.count, nccl_type(op.f32), op.peer, comm, ms));
        break;
      case DevOpKind::all_gather:
        TESSERA_NCCL_CHECK(ncclAllGather(ptr(op.src), ptr(op.dst), op.count, nccl_type(op.f32), comm, ms));
        break;
      case DevOpKind::reduce_scatter:
        TESSERA_NCCL_CHECK(ncclReduceScatter(ptr(op.src), ptr(op.dst), op.count, nccl_type(op.f32), ncclSum, comm, ms));
        break;
      case DevOpKind::all_reduce:
        TESSERA_NCCL_CHECK(ncclAllReduce(ptr(op.src), ptr(op.dst), op.count, nccl_type(op.f32), ncclSum, comm, ms));
        break;
      case DevOpKind::broadcast:
        TESSERA_NCCL_CHECK(ncclBroadcast(ptr(op.src), ptr(op.dst), op.count, nccl_type(op.f32), op.root, comm, ms));
        break;
      case DevOpKind::comm_waits_compute:
        TESSERA_CUDA_CHECK(cudaEventRecord(ev, cs));
        TESSERA_CUDA_CHECK(cudaStreamWaitEvent(ms, ev));
        break;
      case DevOpKind::compute_waits_comm:
        TESSERA_CUDA_CHECK(cudaEventRecord(ev, ms));
        TESSERA_CUDA_CHECK(cudaStreamWaitEvent(cs, ev));
        break;
    }
  }
};

GpuExecutor::GpuExecutor(const Plan& plan, int rank, ncclComm_t comm, cudaStream_t compute, cudaStream_t comm_stream,
                         const GpuExecutorOptions& opts)
    : impl_(new Impl(plan, rank, comm, compute, comm_stream)) {
  int n = 0;
  TESSERA_NCCL_CHECK(ncclCommCount(comm, &n));
  TESSERA_CHECK(n == plan.grid.world(), "commir gpu executor: plan is for {} ranks, the communicator has {}",
                plan.grid.world(), n);
  auto& I = *impl_;
  GpuProgramOptions po;
  po.b_nk = opts.b_nk;
  po.schedule = opts.schedule;
  I.prog = build_gpu_program(plan, rank, po);  // every check, before anything is allocated or launched
  int dev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&I.add_ctas, cudaDevAttrMultiProcessorCount, dev));
  I.comm_sms = static_cast<int>(env::get_int("TESSERA_COMMIR_COMM_SMS", 8, 0, I.add_ctas - 1));
  if (opts.comm_sms >= 0) {
    TESSERA_CHECK(opts.comm_sms < I.add_ctas, "commir gpu executor: comm_sms {} must be below the SM count {}",
                  opts.comm_sms, I.add_ctas);
    I.comm_sms = opts.comm_sms;
  }
  TESSERA_CHECK(cublasLtCreate(&I.lt) == CUBLAS_STATUS_SUCCESS, "commir gpu executor: cublasLtCreate failed");
  TESSERA_CUDA_CHECK(cudaMalloc(&I.ws, I.ws_bytes));
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&I.ev, cudaEventDisableTiming));
  // Every block up front: no cudaMalloc (which may synchronize) between
  // issued ops, so communication and compute keep overlapping; run() reuses them.
  I.mem.assign(I.prog.blocks.size(), nullptr);
  for (std::size_t b = 0; b < I.prog.blocks.size(); ++b)
    TESSERA_CUDA_CHECK(cudaMalloc(&I.mem[b], std::max<std::size_t>(I.block_bytes(static_cast<int>(b)), 16)));
  try {
    I.prepare();  // may refuse the plan (cuBLASLt, the attention kernel's limits): nothing has launched
  } catch (...) {
    for (auto& g : I.gemms) g.destroy();
    for (auto& a : I.adds) a.destroy();
    for (void* p : I.mem) cudaFree(p);
    cudaFree(I.ws);
    cudaEventDestroy(I.ev);
    cublasLtDestroy(I.lt);
    throw;
  }
}

GpuExecutor::~GpuExecutor() {
  if (!impl_) return;
  auto& I = *impl_;
  // Bounded: if an NCCL call never completes (a peer failed), freeing would
  // block forever; leak instead and say so.
  try {
    I.wait_streams("teardown");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s; leaking its device memory\n", e.what());
    return;
  }
  for (auto& g : I.gemms) g.destroy();
  for (auto& a : I.adds) a.destroy();
  for (void* p : I.mem) cudaFree(p);
  cudaFree(I.ws);
  if (I.ev) cudaEventDestroy(I.ev);
  if (I.lt) cublasLtDestroy(I.lt);
}

void GpuExecutor::set_input(const std::string& name, const std::vector<float>& full) {
  auto& I = *impl_;
  const Grid& g = I.plan.grid;
  const Buffer& b = g.buffer(name, "commir gpu executor");
  if (g.kernel == "attention") {  // N-D blocks: row-major over the box, elem values per point
    std::vector<std::int64_t> ext;
    std::int64_t total = b.elem;
    for (const auto& d : b.dims) {
      ext.push_back((g.axis(d.axis).extent + d.group - 1) / d.group);
      total *= ext.back();
    }
    TESSERA_CHECK(static_cast<std::int64_t>(full.size()) == total, "commir gpu executor: {} has {} values, expected {}",
                  name, full.size(), total);
    TESSERA_CHECK(I.plan.initial.count(name), "commir gpu executor: {} is not an input of the plan", name);
    for (const auto& [buf, blk] : I.prog.inputs) {
      if (buf != name) continue;
      const DevBlockInfo& d = I.prog.blocks[blk];
      std::vector<__nv_bfloat16> host(d.elements());
      const std::size_t n = d.box.r.size();
      const std::int64_t run = d.box.r[n - 1].size() * b.elem;  // contiguous on both sides
      std::vector<std::int64_t> p(n);
      for (std::size_t i = 0; i < n; ++i) p[i] = d.box.r[i].lo;
      std::int64_t at = 0;
      while (d.box.volume() > 0) {
        std::int64_t src = 0;
        for (std::size_t i = 0; i < n; ++i) src = src * ext[i] + p[i];
        src *= b.elem;
        for (std::int64_t e = 0; e < run; ++e) host[at + e] = __float2bfloat16(full[src + e]);
        at += run;
        int k = static_cast<int>(n) - 2;
        while (k >= 0 && ++p[k] == d.box.r[k].hi) {
          p[k] = d.box.r[k].lo;
          --k;
        }
        if (k < 0) break;
      }
      TESSERA_CUDA_CHECK(
          cudaMemcpyAsync(I.mem[blk], host.data(), host.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice, I.cs));
    }
    return;
  }
  const std::int64_t cols = g.axis(b.dims[1].axis).extent, rows = g.axis(b.dims[0].axis).extent;
  TESSERA_CHECK(static_cast<std::int64_t>(full.size()) == rows * cols,
                "commir gpu executor: {} has {} values, expected {}", name, full.size(), rows * cols);
  TESSERA_CHECK(I.plan.initial.count(name), "commir gpu executor: {} is not an input of the plan", name);
  for (const auto& [buf, blk] : I.prog.inputs) {
    if (buf != name) continue;  // (a rank may hold no part of an input)
    const DevBlockInfo& d = I.prog.blocks[blk];
    std::vector<__nv_bfloat16> host(d.box.volume());
    for (std::int64_t r = 0; r < d.rows(); ++r)
      for (std::int64_t c = 0; c < d.cols(); ++c)  // a transposed block (B as [n, k]) is column-major
        host[d.transposed ? c * d.rows() + r : r * d.cols() + c] =
            __float2bfloat16(full[(d.box.r[0].lo + r) * cols + d.box.r[1].lo + c]);
    // On the compute stream (pageable source: staged before the call
    // returns); run() orders the communication stream after it.
    TESSERA_CUDA_CHECK(
        cudaMemcpyAsync(I.mem[blk], host.data(), host.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice, I.cs));
  }
}

void GpuExecutor::poison() {
  auto& I = *impl_;
  I.join_streams();
  std::vector<bool> input(I.prog.blocks.size(), false);
  for (const auto& [buf, blk] : I.prog.inputs) input[blk] = true;
  for (std::size_t b = 0; b < I.prog.blocks.size(); ++b)
    if (!input[b])  // all ones: NaN in bf16 and f32
      TESSERA_CUDA_CHECK(cudaMemsetAsync(I.mem[b], 0xFF, I.block_bytes(static_cast<int>(b)), I.cs));
}

void GpuExecutor::run() {
  auto& I = *impl_;
  // The uploads of set_input and the previous run (both streams) precede
  // everything on both streams: every block this run writes may still be
  // read by the previous one.
  I.join_streams();
  for (std::size_t i = 0; i < I.prog.ops.size(); ++i) I.issue(i);
}

std::int64_t GpuExecutor::device_bytes() const { return impl_->prog.bytes(); }
bool GpuExecutor::b_nk() const { return impl_->prog.b_nk; }

std::vector<std::pair<Box, std::vector<float>>> GpuExecutor::output(const std::string& name) {
  auto& I = *impl_;
  I.wait_streams("output");
  auto it = I.prog.outputs.find(name);
  TESSERA_CHECK(it != I.prog.outputs.end(), "commir gpu executor: {} is not an output of the plan", name);
  std::vector<std::pair<Box, std::vector<float>>> out;
  const std::int64_t elem = I.plan.grid.buffer(name).elem;
  for (const auto& [want, pieces] : it->second) {
    std::vector<float> vals(want.volume() * elem, std::numeric_limits<float>::quiet_NaN());
    for (const auto& p : pieces) {
      const std::int64_t w = p.host_ld > 0 ? p.host_ld : want.r[1].size();
      if (I.prog.blocks[p.src.block].f32) {
        TESSERA_CUDA_CHECK(cudaMemcpy2D(vals.data() + p.host_offset, w * 4, I.ptr(p.src), p.src.ld * 4, p.cols * 4,
                                        p.rows, cudaMemcpyDeviceToHost));
        continue;
      }
      std::vector<__nv_bfloat16> tmp(static_cast<std::size_t>(p.rows * p.cols));
      TESSERA_CUDA_CHECK(
          cudaMemcpy2D(tmp.data(), p.cols * 2, I.ptr(p.src), p.src.ld * 2, p.cols * 2, p.rows, cudaMemcpyDeviceToHost));
      for (std::int64_t r = 0; r < p.rows; ++r)
        for (std::int64_t c = 0; c < p.cols; ++c)
          vals[p.host_offset + r * w + c] = __bfloat162float(tmp[r * p.cols + c]);
    }
    out.push_back({want, std::move(vals)});
  }
  return out;
}

}  // namespace tessera::commir
