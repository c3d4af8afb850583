// GPU executor of CommIR GEMM plans: NCCL for communication, cuBLASLt for the
// local GEMMs (see gpu_executor.hpp).
#include "tessera/commir/gpu_executor.hpp"

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <thread>

#include "tessera/commir/gpu_program.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/wait_diagnostics.hpp"

#define TESSERA_CUBLAS_CHECK(expr)                                                               \
  do {                                                                                           \
    const cublasStatus_t st_ = (expr);                                                           \
    TESSERA_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "{} failed: cuBLAS status {}", #expr, static_cast<int>(st_)); \
  } while (0)

namespace tessera::commir {
namespace {

// The local kernel: D[m, n] (+)= A[m, k] * B[k, n], row-major views with
// leading dimensions in elements; A, B bf16, D f32. Row-major D = A B is
// column-major D^T = B^T A^T, which is what cuBLASLt is given.
void local_gemm(cublasLtHandle_t lt, cudaStream_t s, const void* A, std::int64_t lda, const void* B, std::int64_t ldb,
                void* D, std::int64_t ldd, std::int64_t m, std::int64_t n, std::int64_t k, void* workspace,
                std::size_t ws_bytes) {
  cublasLtMatmulDesc_t op;
  TESSERA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasLtMatrixLayout_t la, lb, ld;
  TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, n, k, ldb));  // B^T: n x k col-major
  TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, m, lda));  // A^T: k x m col-major
  TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, n, m, ldd));
  const float alpha = 1.f, beta = 1.f;
  const cublasStatus_t st = cublasLtMatmul(lt, op, &alpha, B, la, A, lb, &beta, D, ld, D, ld, nullptr, workspace,
                                           ws_bytes, s);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(op);
  TESSERA_CHECK(st == CUBLAS_STATUS_SUCCESS, "commir gpu executor: cublasLtMatmul {}x{}x{} failed: status {}", m, n, k,
                static_cast<int>(st));
}


// cublasLtMatrixTransform: D = A + B, rows x cols f32, row-major views
// (column-major cols x rows for cuBLASLt). Merges partial accumulators.
void local_add(cublasLtHandle_t lt, cudaStream_t s, const void* A, std::int64_t lda, const void* B, std::int64_t ldb,
               void* D, std::int64_t ldd, std::int64_t rows, std::int64_t cols) {
  cublasLtMatrixTransformDesc_t desc;
  TESSERA_CUBLAS_CHECK(cublasLtMatrixTransformDescCreate(&desc, CUDA_R_32F));
  cublasLtMatrixLayout_t la, lb, ld;
  TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, cols, rows, lda));
  TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, cols, rows, ldb));
  TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, cols, rows, ldd));
  const float one = 1.f;
  const cublasStatus_t st = cublasLtMatrixTransform(lt, desc, &one, A, la, &one, B, lb, D, ld, s);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatrixTransformDescDestroy(desc);
  TESSERA_CHECK(st == CUBLAS_STATUS_SUCCESS, "commir gpu executor: cublasLtMatrixTransform (add) {}x{} failed: status {}",
                rows, cols, static_cast<int>(st));
}

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
  std::vector<void*> mem;  // per block
  cudaEvent_t ev = nullptr;
  bool ran = false;

  std::size_t esize(int blk) const { return prog.blocks[blk].f32 ? 4 : 2; }
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

  void issue(const DevOp& op) {
    const cudaStream_t s = stream(op.stream);
    switch (op.kind) {
      case DevOpKind::zero:
        TESSERA_CUDA_CHECK(cudaMemsetAsync(mem.at(op.dst.block), 0, prog.blocks[op.dst.block].box.volume() * esize(op.dst.block), s));
        break;
      case DevOpKind::copy: {
        const std::size_t e = op.f32 ? 4 : 2;
        TESSERA_CUDA_CHECK(cudaMemcpy2DAsync(ptr(op.dst), op.dst.ld * e, ptr(op.src), op.src.ld * e, op.cols * e, op.rows,
                                             cudaMemcpyDeviceToDevice, s));
        break;
      }
      case DevOpKind::add:
        local_add(lt, s, ptr(op.a), op.a.ld, ptr(op.b), op.b.ld, ptr(op.dst), op.dst.ld, op.rows, op.cols);
        break;
      case DevOpKind::gemm:
        local_gemm(lt, s, ptr(op.a), op.a.ld, ptr(op.b), op.b.ld, ptr(op.dst), op.dst.ld, op.m, op.n, op.k, ws, ws_bytes);
        break;
      case DevOpKind::group_start: TESSERA_NCCL_CHECK(ncclGroupStart()); break;
      case DevOpKind::group_end: TESSERA_NCCL_CHECK(ncclGroupEnd()); break;
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

GpuExecutor::GpuExecutor(const Plan& plan, int rank, ncclComm_t comm, cudaStream_t compute, cudaStream_t comm_stream)
    : impl_(new Impl(plan, rank, comm, compute, comm_stream)) {
  int n = 0;
  TESSERA_NCCL_CHECK(ncclCommCount(comm, &n));
  TESSERA_CHECK(n == plan.grid.world(), "commir gpu executor: plan is for {} ranks, the communicator has {}",
                plan.grid.world(), n);
  auto& I = *impl_;
  I.prog = build_gpu_program(plan, rank);  // every check, before anything is allocated or launched
  TESSERA_CHECK(cublasLtCreate(&I.lt) == CUBLAS_STATUS_SUCCESS, "commir gpu executor: cublasLtCreate failed");
  TESSERA_CUDA_CHECK(cudaMalloc(&I.ws, I.ws_bytes));
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&I.ev, cudaEventDisableTiming));
  // Every block up front: no cudaMalloc (which may synchronize) between
  // issued ops, so communication and compute keep overlapping.
  I.mem.assign(I.prog.blocks.size(), nullptr);
  for (std::size_t b = 0; b < I.prog.blocks.size(); ++b)
    TESSERA_CUDA_CHECK(cudaMalloc(&I.mem[b], std::max<std::size_t>(I.prog.blocks[b].box.volume() * I.esize(b), 16)));
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
  for (void* p : I.mem) cudaFree(p);
  cudaFree(I.ws);
  if (I.ev) cudaEventDestroy(I.ev);
  if (I.lt) cublasLtDestroy(I.lt);
}

void GpuExecutor::set_input(const std::string& name, const std::vector<float>& full) {
  auto& I = *impl_;
  const Grid& g = I.plan.grid;
  const Buffer& b = g.buffer(name, "commir gpu executor");
  const std::int64_t cols = g.axis(b.dims[1].axis).extent, rows = g.axis(b.dims[0].axis).extent;
  TESSERA_CHECK(static_cast<std::int64_t>(full.size()) == rows * cols, "commir gpu executor: {} has {} values, expected {}",
                name, full.size(), rows * cols);
  TESSERA_CHECK(I.plan.initial.count(name), "commir gpu executor: {} is not an input of the plan", name);
  for (const auto& [buf, blk] : I.prog.inputs) {
    if (buf != name) continue;  // (a rank may hold no part of an input)
    const DevBlockInfo& d = I.prog.blocks[blk];
    std::vector<__nv_bfloat16> host(d.box.volume());
    for (std::int64_t r = 0; r < d.rows(); ++r)
      for (std::int64_t c = 0; c < d.cols(); ++c)
        host[r * d.cols() + c] = __float2bfloat16(full[(d.box.r[0].lo + r) * cols + d.box.r[1].lo + c]);
    // On the compute stream (pageable source: staged before the call
    // returns); run() orders the communication stream after it.
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(I.mem[blk], host.data(), host.size() * sizeof(__nv_bfloat16),
                                       cudaMemcpyHostToDevice, I.cs));
  }
}

void GpuExecutor::run() {
  auto& I = *impl_;
  TESSERA_CHECK(!I.ran, "commir gpu executor: run() called twice (accumulators are not reset)");
  I.ran = true;
  // The uploads of set_input precede everything, on both streams.
  TESSERA_CUDA_CHECK(cudaEventRecord(I.ev, I.cs));
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(I.ms, I.ev));
  for (const DevOp& op : I.prog.ops) I.issue(op);
}

std::vector<std::pair<Box, std::vector<float>>> GpuExecutor::output(const std::string& name) {
  auto& I = *impl_;
  I.wait_streams("output");
  auto it = I.prog.outputs.find(name);
  TESSERA_CHECK(it != I.prog.outputs.end(), "commir gpu executor: {} is not an output of the plan", name);
  std::vector<std::pair<Box, std::vector<float>>> out;
  for (const auto& [want, pieces] : it->second) {
    std::vector<float> vals(want.volume(), std::numeric_limits<float>::quiet_NaN());
    for (const auto& p : pieces)
      TESSERA_CUDA_CHECK(cudaMemcpy2D(vals.data() + p.host_offset, want.r[1].size() * 4, I.ptr(p.src), p.src.ld * 4,
                                      p.cols * 4, p.rows, cudaMemcpyDeviceToHost));
    out.push_back({want, std::move(vals)});
  }
  return out;
}

}  // namespace tessera::commir
