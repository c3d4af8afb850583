// cuBLASLt GEMM: the operators' sequential strategy and CommIR's local GEMMs run
// it, and tests and `tessera bench gemm` compare the engine against it.
//
// Row-major D[M,N] = A[M,K]·op(B) is computed as the column-major product
// Dᵀ[N,M] = op(B)ᵀ·Aᵀ: cuBLAS's "A" is our B (transposed when B is [N,K]),
// its "B" is our A, m = N, n = M.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <tuple>

#include "tessera/kernels/gemm.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::kernels {
namespace {

#define TESSERA_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                      \
    const cublasStatus_t st_ = (expr);                                                      \
    TESSERA_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "cublaslt_gemm: {} failed: {} ({})", #expr, \
                  cublasLtGetStatusString(st_), static_cast<int>(st_));                     \
  } while (0)

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    case DType::f32:
      return CUDA_R_32F;
  }
  TESSERA_FAIL("cublaslt_gemm: unknown dtype");
}

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = size_t{32} << 20;
  // (m, n, k, lda, ldb, ldd, in, out, layout) -> algorithm
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int>, cublasLtMatmulAlgo_t> algos;
};

DeviceState& state_for_current_device() {
  static std::mutex mu;
  static std::map<int, DeviceState> states;
  int dev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  DeviceState& s = states[dev];
  if (!s.handle) {
    TESSERA_CUBLAS_CHECK(cublasLtCreate(&s.handle));
    TESSERA_CUDA_CHECK(cudaMalloc(&s.workspace, s.workspace_bytes));
  }
  return s;
}

}  // namespace

void cublaslt_gemm(const GemmArgs& a, cudaStream_t stream) {
  validate(a, "cublaslt_gemm");
  DeviceState& st = state_for_current_device();
  const int64_t lda = a.lda_or_packed(), ldb = a.ldb_or_packed(), ldd = a.ldd_or_packed();
  const bool nk = a.b_layout == BLayout::NK;

  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  TESSERA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = nk ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  TESSERA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  TESSERA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  // cuBLAS "A" = our B: stored col-major as [K, N] (NK) or [N, K] (KN).
  TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, cuda_type(a.in), nk ? a.k : a.n, nk ? a.n : a.k, ldb));
  // cuBLAS "B" = our A: col-major [K, M].
  TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, cuda_type(a.in), a.k, a.m, lda));
  TESSERA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, cuda_type(a.out), a.n, a.m, ldd));

  const auto key = std::make_tuple(a.m, a.n, a.k, lda, ldb, ldd, static_cast<int>(a.in), static_cast<int>(a.out),
                                   static_cast<int>(a.b_layout));
  auto it = st.algos.find(key);
  if (it == st.algos.end()) {
    cublasLtMatmulPreference_t pref = nullptr;
    TESSERA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    TESSERA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                              &st.workspace_bytes, sizeof(st.workspace_bytes)));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    TESSERA_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(st.handle, op, la, lb, ld, ld, pref, 1, &res, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    TESSERA_CHECK(found > 0, "cublaslt_gemm: no algorithm for M={} N={} K={}", a.m, a.n, a.k);
    it = st.algos.emplace(key, res.algo).first;
  }
  const float alpha = 1.0f, beta = 0.0f;
  TESSERA_CUBLAS_CHECK(cublasLtMatmul(st.handle, op, &alpha, a.b, la, a.a, lb, &beta, a.d, ld, a.d, ld, &it->second,
                                      st.workspace, st.workspace_bytes, stream));
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(op);
}

}  // namespace tessera::kernels
