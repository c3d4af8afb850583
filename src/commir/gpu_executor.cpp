// GPU executor of CommIR GEMM plans: NCCL for communication, cuBLASLt for the
// local GEMMs (see gpu_executor.hpp).
#include "tessera/commir/gpu_executor.hpp"

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <map>
#include <set>

#include "tessera/runtime/error.hpp"

#define TESSERA_CUBLAS_CHECK(expr)                                                               \
  do {                                                                                           \
    const cublasStatus_t st_ = (expr);                                                           \
    TESSERA_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "{} failed: cuBLAS status {}", #expr, static_cast<int>(st_)); \
  } while (0)

namespace tessera::commir {
namespace {

struct DevBlock {
  Box box;
  bool f32 = false;  // accumulators are f32, inputs bf16
  void* ptr = nullptr;
  std::int64_t rows() const { return box.r[0].size(); }
  std::int64_t cols() const { return box.r[1].size(); }
  std::size_t esize() const { return f32 ? 4 : 2; }
  std::size_t bytes() const { return static_cast<std::size_t>(box.volume()) * esize(); }
  // Address of element (r, c) (global indices) and the row pitch in elements.
  char* at(std::int64_t r, std::int64_t c) const {
    return static_cast<char*>(ptr) + ((r - box.r[0].lo) * cols() + (c - box.r[1].lo)) * esize();
  }
};

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

}  // namespace

struct GpuExecutor::Impl {
  Impl(const Plan& p, int r, ncclComm_t c, cudaStream_t compute, cudaStream_t comm_stream)
      : plan(p), rank(r), comm(c), cs(compute), ms(comm_stream) {}
  const Plan& plan;
  int rank;
  ncclComm_t comm;
  cudaStream_t cs, ms;
  cublasLtHandle_t lt = nullptr;
  void* ws = nullptr;
  std::size_t ws_bytes = 32u << 20;
  std::map<std::string, std::vector<DevBlock>> store;
  std::map<int, int> recv_time;  // transfer tag -> receive time
  std::vector<void*> staging;

  DevBlock alloc(const Box& b, bool f32) {
    DevBlock d{b, f32, nullptr};
    TESSERA_CUDA_CHECK(cudaMalloc(&d.ptr, std::max<std::size_t>(d.bytes(), 16)));
    return d;
  }
  const DevBlock& find(const std::string& buf, const Box& b) const {
    auto it = store.find(buf);
    if (it != store.end())
      for (const auto& d : it->second)
        if (d.box.contains(b)) return d;
    TESSERA_FAIL("commir gpu executor: rank {}: {}{} is not present", rank, buf, box_text(b));
  }
  Box project(const Buffer& b, const Box& kb) const {
    Box o;
    for (const auto& d : b.dims)
      for (std::size_t i = 0; i < plan.grid.axes.size(); ++i)
        if (plan.grid.axes[i].name == d.axis) o.r.push_back(kb.r[i]);
    return o;
  }
  // Copies sub-box `b` of block `src` into a new contiguous block (stream s).
  DevBlock pack(const DevBlock& src, const Box& b, cudaStream_t s) {
    DevBlock d = alloc(b, src.f32);
    TESSERA_CUDA_CHECK(cudaMemcpy2DAsync(d.ptr, d.cols() * d.esize(), src.at(b.r[0].lo, b.r[1].lo), src.cols() * src.esize(),
                                         d.cols() * d.esize(), d.rows(), cudaMemcpyDeviceToDevice, s));
    return d;
  }
  ncclDataType_t nccl_type(bool f32) const { return f32 ? ncclFloat : ncclBfloat16; }
};

GpuExecutor::GpuExecutor(const Plan& plan, int rank, ncclComm_t comm, cudaStream_t compute, cudaStream_t comm_stream)
    : impl_(new Impl(plan, rank, comm, compute, comm_stream)) {
  const Grid& g = plan.grid;
  TESSERA_CHECK(g.kernel == "gemm", "commir gpu executor: only GEMM plans run on GPUs for now, got kernel '{}'", g.kernel);
  TESSERA_CHECK(g.mesh.size() == 1, "commir gpu executor: one-level meshes only, got {}", mesh_string(g.mesh));
  int n = 0;
  TESSERA_NCCL_CHECK(ncclCommCount(comm, &n));
  TESSERA_CHECK(n == g.world(), "commir gpu executor: plan is for {} ranks, the communicator has {}", g.world(), n);
  TESSERA_CHECK(rank >= 0 && rank < n, "commir gpu executor: rank {} out of range", rank);
  for (const auto& rp : plan.ranks)
    for (const auto& s : rp.steps) {
      if (s.kind == StepKind::recv) impl_->recv_time[s.tag] = s.time;
      if (s.kind == StepKind::collective) {
        TESSERA_CHECK(static_cast<int>(s.group.size()) == n, "commir gpu executor: collective over a sub-group");
        // NCCL needs equal contiguous row blocks, in rank order.
        for (const auto& r : {s.before, s.after})
          TESSERA_CHECK(r.size() <= 1, "commir gpu executor: {} of {} on a non-contiguous region", coll_name(s.coll),
                        s.buffer);
      }
    }
  TESSERA_CHECK(cublasLtCreate(&impl_->lt) == CUBLAS_STATUS_SUCCESS, "commir gpu executor: cublasLtCreate failed");
  TESSERA_CUDA_CHECK(cudaMalloc(&impl_->ws, impl_->ws_bytes));
}

GpuExecutor::~GpuExecutor() {
  if (!impl_) return;
  cudaStreamSynchronize(impl_->cs);
  cudaStreamSynchronize(impl_->ms);
  for (auto& [n, v] : impl_->store)
    for (auto& d : v) cudaFree(d.ptr);
  for (void* p : impl_->staging) cudaFree(p);
  cudaFree(impl_->ws);
  if (impl_->lt) cublasLtDestroy(impl_->lt);
}

void GpuExecutor::set_input(const std::string& name, const std::vector<float>& full) {
  auto& I = *impl_;
  const Grid& g = I.plan.grid;
  const Buffer& b = g.buffer(name, "commir gpu executor");
  const std::int64_t cols = g.axis(b.dims[1].axis).extent, rows = g.axis(b.dims[0].axis).extent;
  TESSERA_CHECK(static_cast<std::int64_t>(full.size()) == rows * cols, "commir gpu executor: {} has {} values, expected {}",
                name, full.size(), rows * cols);
  for (const auto& bx : I.plan.initial.at(name)[I.rank]) {
    DevBlock d = I.alloc(bx, false);
    std::vector<__nv_bfloat16> host(bx.volume());
    for (std::int64_t r = 0; r < d.rows(); ++r)
      for (std::int64_t c = 0; c < d.cols(); ++c)
        host[r * d.cols() + c] = __float2bfloat16(full[(bx.r[0].lo + r) * cols + bx.r[1].lo + c]);
    TESSERA_CUDA_CHECK(cudaMemcpy(d.ptr, host.data(), d.bytes(), cudaMemcpyHostToDevice));
    I.store[name].push_back(d);
  }
}

void GpuExecutor::run() {
  auto& I = *impl_;
  const Grid& g = I.plan.grid;
  const auto& steps = I.plan.ranks[I.rank].steps;
  const Buffer &ab = g.buffer(g.body.ins[0]), &bb = g.buffer(g.body.ins[1]), &cb = g.buffer(g.body.out);
  cudaEvent_t ev;
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  auto comm_after_compute = [&] {  // comm stream waits for everything issued on compute so far
    TESSERA_CUDA_CHECK(cudaEventRecord(ev, I.cs));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(I.ms, ev));
  };
  auto compute_after_comm = [&] {
    TESSERA_CUDA_CHECK(cudaEventRecord(ev, I.ms));
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(I.cs, ev));
  };
  // Point-to-point transfers received at time t, issued as one NCCL group.
  auto exchange = [&](int t, bool partial_only, bool skip_partial) {
    std::vector<const Step*> ops;
    for (const auto& s : steps)
      if ((s.kind == StepKind::send || s.kind == StepKind::recv) && I.recv_time.at(s.tag) == t &&
          !(partial_only && !s.partial) && !(skip_partial && s.partial))
        ops.push_back(&s);
    if (ops.empty()) return;
    comm_after_compute();
    std::vector<std::pair<const Step*, DevBlock>> incoming;
    TESSERA_NCCL_CHECK(ncclGroupStart());
    for (const Step* s : ops) {
      const bool f32 = s->buffer == cb.name;
      if (s->kind == StepKind::send) {
        const DevBlock& src = I.find(s->buffer, s->box);
        DevBlock tmp = I.pack(src, s->box, I.ms);
        I.staging.push_back(tmp.ptr);
        TESSERA_NCCL_CHECK(ncclSend(tmp.ptr, s->box.volume(), I.nccl_type(f32), s->peer, I.comm, I.ms));
        if (s->partial) {  // moved away: drop our copy once the send is done (staging holds the data)
          auto& v = I.store[s->buffer];
          auto it = std::find_if(v.begin(), v.end(), [&](const DevBlock& d) { return d.box == s->box; });
          I.staging.push_back(it->ptr);
          v.erase(it);
        }
      } else {
        DevBlock d = I.alloc(s->box, f32);
        TESSERA_NCCL_CHECK(ncclRecv(d.ptr, s->box.volume(), I.nccl_type(f32), s->peer, I.comm, I.ms));
        incoming.push_back({s, d});
      }
    }
    TESSERA_NCCL_CHECK(ncclGroupEnd());
    for (auto& [s, d] : incoming) {
      auto& v = I.store[s->buffer];
      auto it = std::find_if(v.begin(), v.end(), [&](const DevBlock& x) { return x.box == s->box; });
      TESSERA_CHECK(!(s->partial && it != v.end()), "commir gpu executor: merging a partial into an existing block is not supported");
      v.push_back(d);
    }
  };
  auto collective = [&](const Step& s) {
    const bool f32 = s.buffer == cb.name;
    comm_after_compute();
    auto& v = I.store[s.buffer];
    const Box in = s.before.empty() ? Box{} : s.before[0], out = s.after.empty() ? Box{} : s.after[0];
    DevBlock src = v.empty() ? DevBlock{} : v[0];
    DevBlock dst = I.alloc(out, f32);
    const auto t = I.nccl_type(f32);
    switch (s.coll) {
      case CollKind::all_gather:
        TESSERA_CHECK(in.volume() * static_cast<std::int64_t>(s.group.size()) == out.volume(),
                      "commir gpu executor: AllGather of {} needs equal parts", s.buffer);
        TESSERA_NCCL_CHECK(ncclAllGather(src.ptr, dst.ptr, in.volume(), t, I.comm, I.ms));
        break;
      case CollKind::reduce_scatter:
        TESSERA_CHECK(out.volume() * static_cast<std::int64_t>(s.group.size()) == in.volume(),
                      "commir gpu executor: ReduceScatter of {} needs equal parts", s.buffer);
        TESSERA_NCCL_CHECK(ncclReduceScatter(src.ptr, dst.ptr, out.volume(), t, ncclSum, I.comm, I.ms));
        break;
      case CollKind::all_reduce:
        TESSERA_NCCL_CHECK(ncclAllReduce(src.ptr, dst.ptr, out.volume(), t, ncclSum, I.comm, I.ms));
        break;
      default: TESSERA_FAIL("commir gpu executor: {} is not supported on GPUs yet", coll_name(s.coll));
    }
    for (auto& d : v) I.staging.push_back(d.ptr);  // freed at the end (the collective may still read it)
    v = {dst};
    compute_after_comm();
  };
  const int T = I.plan.steps_per_rank;
  for (const auto& s : steps)
    if (s.time < 0 && s.kind == StepKind::collective) collective(s);
  exchange(0, false, false);
  compute_after_comm();
  for (int t = 0; t < T; ++t) {
    exchange(t + 1, false, true);  // prefetch for t+1 overlaps compute t
    for (const auto& s : steps) {
      if (s.time != t || s.kind != StepKind::compute) continue;
      const Box ba = I.project(ab, s.box), bbx = I.project(bb, s.box), bc = I.project(cb, s.box);
      const DevBlock& A = I.find(ab.name, ba);
      const DevBlock& B = I.find(bb.name, bbx);
      auto& cv = I.store[cb.name];
      auto it = std::find_if(cv.begin(), cv.end(), [&](const DevBlock& d) { return d.box == bc; });
      if (it == cv.end()) {
        cv.push_back(I.alloc(bc, true));
        TESSERA_CUDA_CHECK(cudaMemsetAsync(cv.back().ptr, 0, cv.back().bytes(), I.cs));
        it = cv.end() - 1;
      }
      local_gemm(I.lt, I.cs, A.at(ba.r[0].lo, ba.r[1].lo), A.cols(), B.at(bbx.r[0].lo, bbx.r[1].lo), B.cols(),
                 it->at(bc.r[0].lo, bc.r[1].lo), it->cols(), ba.r[0].size(), bbx.r[1].size(), ba.r[1].size(), I.ws,
                 I.ws_bytes);
    }
    exchange(t + 1, true, false);  // partial accumulators leave after the compute that made them
    compute_after_comm();
  }
  for (const auto& s : steps)
    if (s.time == T && s.kind == StepKind::collective) collective(s);
  exchange(T + 1, false, false);
  compute_after_comm();
  TESSERA_CUDA_CHECK(cudaEventDestroy(ev));
}

std::vector<std::pair<Box, std::vector<float>>> GpuExecutor::output(const std::string& name) {
  auto& I = *impl_;
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(I.cs));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(I.ms));
  std::vector<std::pair<Box, std::vector<float>>> out;
  for (const auto& want : I.plan.final.at(name)[I.rank]) {
    std::vector<float> vals(want.volume());
    const DevBlock& d = I.find(name, want);
    TESSERA_CUDA_CHECK(cudaMemcpy2D(vals.data(), want.r[1].size() * 4, d.at(want.r[0].lo, want.r[1].lo), d.cols() * 4,
                                    want.r[1].size() * 4, want.r[0].size(), cudaMemcpyDeviceToHost));
    out.push_back({want, std::move(vals)});
  }
  return out;
}

}  // namespace tessera::commir
