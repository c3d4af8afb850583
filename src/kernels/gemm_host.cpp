// Host side of the GEMM engine: validation, tile heuristic, TMA descriptors.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstring>
#include <cstdint>
#include <mutex>

#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/gemm/host_detail.hpp"
#include "tessera/kernels/gemm/wait_diag.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::kernels {

TileShape tile_shape(GemmTile t) {
  switch (t) {
    case GemmTile::T128x256: return {128, 256};
    case GemmTile::T256x128: return {256, 128};
    case GemmTile::T128x128: return {128, 128};
    case GemmTile::T64x256: return {64, 256};
    case GemmTile::Auto: break;
  }
  TESSERA_FAIL("tile_shape: GemmTile::Auto has no shape; resolve it first (resolve_tile)");
}

std::string tile_name(GemmTile t) {
  switch (t) {
    case GemmTile::T128x256: return "128x256";
    case GemmTile::T256x128: return "256x128";
    case GemmTile::T128x128: return "128x128";
    case GemmTile::T64x256: return "64x256";
    case GemmTile::Auto: return "auto";
  }
  return "?";
}

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Compute capability of the current device, checked once per device.
void require_hopper(const char* op) {
  static std::mutex mu;
  static std::array<int, 64> seen{};  // 0 unknown, 1 ok
  int dev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (dev < 64 && seen[dev]) return;
  int major = 0, minor = 0;
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  TESSERA_CHECK(major == 9 && minor == 0, "{}: device {} has compute capability {}.{}; the GEMM engine needs sm_90 (Hopper)",
                op, dev, major, minor);
  if (dev < 64) seen[dev] = 1;
}

}  // namespace

namespace detail {

void fail(const std::string& msg) { TESSERA_FAIL("{}", msg); }

void cuda_check(cudaError_t rc, const char* what) {
  TESSERA_CHECK(rc == cudaSuccess, "{}: {} ({})", what, cudaGetErrorString(rc), static_cast<int>(rc));
}

void check_instantiation(const GemmArgs& a, BLayout layout, DType in, int max_ctas) {
  validate_inputs(a, "gemm");
  TESSERA_CHECK(a.b_layout == layout, "gemm: args.b_layout ({}) does not match the instantiated layout ({})",
                a.b_layout == BLayout::NK ? "NK" : "KN", layout == BLayout::NK ? "NK" : "KN");
  TESSERA_CHECK(a.in == in, "gemm: args.in = {} does not match the instantiated input type {}", dtype_name(a.in),
                dtype_name(in));
  TESSERA_CHECK(max_ctas >= 0, "gemm: max_ctas = {} must be >= 0", max_ctas);
}

void validate_inputs(const GemmArgs& a, const char* op) {
  TESSERA_CHECK(a.in == DType::bf16 || a.in == DType::f16, "{}: input dtype {} not supported (bf16 or f16)", op,
                dtype_name(a.in));
  TESSERA_CHECK(a.m >= 1 && a.m < (int64_t{1} << 31), "{}: M = {} out of range [1, 2^31)", op, a.m);
  TESSERA_CHECK(a.n >= 1 && a.n < (int64_t{1} << 31), "{}: N = {} out of range [1, 2^31)", op, a.n);
  TESSERA_CHECK(a.k >= 8 && a.k < (int64_t{1} << 31), "{}: K = {} out of range [8, 2^31)", op, a.k);
  TESSERA_CHECK(a.k % 8 == 0, "{}: K = {} must be a multiple of 8 (16-byte rows for TMA)", op, a.k);
  TESSERA_CHECK(a.a != nullptr, "{}: A is null", op);
  TESSERA_CHECK(a.b != nullptr, "{}: B is null", op);
  TESSERA_CHECK(aligned16(a.a), "{}: A = {} is not 16-byte aligned", op, a.a);
  TESSERA_CHECK(aligned16(a.b), "{}: B = {} is not 16-byte aligned", op, a.b);
  const int64_t lda = a.lda_or_packed(), ldb = a.ldb_or_packed();
  TESSERA_CHECK(lda >= a.k && lda % 8 == 0, "{}: lda = {} must be >= K = {} and a multiple of 8", op, lda, a.k);
  const int64_t brow = a.b_layout == BLayout::NK ? a.k : a.n;
  TESSERA_CHECK(ldb >= brow && ldb % 8 == 0, "{}: ldb = {} must be >= {} ({}) and a multiple of 8", op, ldb, brow,
                a.b_layout == BLayout::NK ? "K, B is [N, K]" : "N, B is [K, N]");
  require_hopper(op);
}

void make_tma_2d(const char* what, const void* base, DType t, uint64_t inner, uint64_t outer, uint64_t ld,
                 uint32_t box_inner, uint32_t box_outer, CUtensorMap* out) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    TESSERA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    TESSERA_CHECK(fn != nullptr && q == cudaDriverEntryPointSuccess, "gemm: cuTensorMapEncodeTiled not found in the driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  const CUtensorMapDataType dt = t == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {ld * 2};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult rc = encode(out, dt, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TESSERA_CHECK(rc == CUDA_SUCCESS,
                "gemm: cuTensorMapEncodeTiled for {} failed (CUresult {}): dims {}x{}, ld {}, box {}x{}", what,
                static_cast<int>(rc), inner, outer, ld, box_inner, box_outer);
}

void make_tma_a(const GemmArgs& a, int bm, CUtensorMap* out) {
  make_tma_2d("A", a.a, a.in, a.k, a.m, a.lda_or_packed(), 64, bm, out);
}

void make_tma_b(const GemmArgs& a, int bn, CUtensorMap* out) {
  if (a.b_layout == BLayout::NK)
    make_tma_2d("B[N,K]", a.b, a.in, a.k, a.n, a.ldb_or_packed(), 64, bn, out);
  else
    make_tma_2d("B[K,N]", a.b, a.in, a.n, a.k, a.ldb_or_packed(), 64, 64, out);
}

int sm_count() {
  static std::mutex mu;
  static std::array<int, 64> cache{};
  int dev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (dev < 64 && cache[dev]) return cache[dev];
  int n = 0;
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  if (dev < 64) cache[dev] = n;
  return n;
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  TESSERA_CHECK(e == cudaSuccess, "{}: {} ({})", what, cudaGetErrorString(e), static_cast<int>(e));
}

}  // namespace detail

void validate(const GemmArgs& a, const char* op) {
  detail::validate_inputs(a, op);
  TESSERA_CHECK(a.d != nullptr, "{}: D is null", op);
  TESSERA_CHECK(aligned16(a.d), "{}: D = {} is not 16-byte aligned", op, a.d);
  const int64_t ldd = a.ldd_or_packed();
  const int64_t row_bytes = ldd * static_cast<int64_t>(dtype_size(a.out));
  TESSERA_CHECK(ldd >= a.n && row_bytes % 16 == 0, "{}: ldd = {} must be >= N = {} and a multiple of 16 bytes ({} {})",
                op, ldd, a.n, ldd, dtype_name(a.out));
}

GemmTile choose_tile(const GemmArgs& a, int num_sms) {
  TESSERA_CHECK(num_sms > 0, "choose_tile: num_sms = {} must be positive", num_sms);
  // Fraction of the tile-slots of all waves that hold useful output, times a
  // small penalty for 128x128 (half the arithmetic per byte loaded). Ties go
  // to the earlier (larger) tile.
  struct Cand {
    GemmTile t;
    double intensity;
  };
  const Cand cands[] = {{GemmTile::T128x256, 1.0}, {GemmTile::T256x128, 1.0}, {GemmTile::T128x128, 0.90}};
  GemmTile best = GemmTile::T128x256;
  double best_score = -1;
  for (const Cand& c : cands) {
    const TileShape s = tile_shape(c.t);
    const int64_t tiles = ((a.m + s.bm - 1) / s.bm) * ((a.n + s.bn - 1) / s.bn);
    const int64_t waves = (tiles + num_sms - 1) / num_sms;
    const double useful = static_cast<double>(a.m) * static_cast<double>(a.n);
    const double slots = static_cast<double>(waves) * num_sms * s.bm * s.bn;
    const double score = useful / slots * c.intensity;
    if (score > best_score * 1.0001) {
      best_score = score;
      best = c.t;
    }
  }
  return best;
}

int resolve_cluster(const GemmArgs& a, const GemmOptions& o, GemmTile t) {
  TESSERA_CHECK(o.cluster_m >= 0 && o.cluster_m <= 2, "gemm: cluster_m = {} (0 = auto, 1 or 2)", o.cluster_m);
  if (o.epilogue_overlap) {
    TESSERA_CHECK(o.cluster_m <= 1, "gemm: cluster_m = {} with epilogue_overlap (ping-pong runs without clusters)",
                  o.cluster_m);
    return 1;
  }
  if (t == GemmTile::T128x128 || t == GemmTile::Auto) return 1;
  if (o.cluster_m) return o.cluster_m;
  // Auto = 1: 2-CTA clusters measured at parity on H100 (docs/design/gemm-engine.md);
  // they stay available as an explicit option.
  (void)a;
  return 1;
}

bool plain_uses_ping_pong(const GemmArgs& a, const GemmOptions& o) {
  // Above ~4e11 multiply-adds the cooperative 128x256 kernel is the safer
  // choice: measured in one binary (nvidia-h200-x2, 36ee3d8, session 4 call 7),
  // ping-pong 64x256 is 0.96-1.00x cuBLASLt there when the GPU is power-capped
  // but 1.03-1.06x at boost clocks, the cooperative one 0.99-1.03x and
  // 0.97-1.01x. Below it ping-pong wins in both states (0.94-1.00x).
  constexpr double kPingPongMaxMnk = 4e11;
  const double mnk = static_cast<double>(a.m) * static_cast<double>(a.n) * static_cast<double>(a.k);
  return !o.epilogue_overlap && o.tile == GemmTile::Auto && o.cluster_m <= 1 && a.in == a.out &&
         mnk < kPingPongMaxMnk;
}

GemmTile resolve_tile(const GemmArgs& a, const GemmOptions& o) {
  TESSERA_CHECK(o.raster_group >= 1, "gemm: raster_group = {} must be >= 1", o.raster_group);
  TESSERA_CHECK(o.rotate_m >= 0, "gemm: rotate_m = {} must be >= 0", o.rotate_m);
  TESSERA_CHECK(o.max_ctas >= 0, "gemm: max_ctas = {} must be >= 0", o.max_ctas);
  if (o.epilogue_overlap) {
    TESSERA_CHECK(o.tile == GemmTile::Auto || o.tile == GemmTile::T128x128 || o.tile == GemmTile::T64x256,
                  "gemm: tile {} is not compiled with epilogue_overlap (ping-pong: 128x128 or 64x256)",
                  tile_name(o.tile));
    TESSERA_CHECK(o.cluster_m <= 1, "gemm: cluster_m = {} with epilogue_overlap (ping-pong runs without clusters)",
                  o.cluster_m);
    return o.tile == GemmTile::Auto ? GemmTile::T128x128 : o.tile;
  }
  TESSERA_CHECK(o.tile != GemmTile::T64x256, "gemm: tile 64x256 exists only with epilogue_overlap (ping-pong)");
  if (o.tile != GemmTile::Auto) return o.tile;
  const int sms = o.max_ctas > 0 ? std::min(o.max_ctas, detail::sm_count()) : detail::sm_count();
  return choose_tile(a, sms);
}

}  // namespace tessera::kernels

namespace tessera::kernels {

engine::WaitDiag* wait_diagnostics() {
  static engine::WaitDiag* d = [] {
    void* p = nullptr;
    TESSERA_CUDA_CHECK(cudaHostAlloc(&p, sizeof(engine::WaitDiag), cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(p, 0, sizeof(engine::WaitDiag));
    return static_cast<engine::WaitDiag*>(p);
  }();
  return d;
}

std::string last_wait_timeout() {
  const volatile engine::WaitDiag* d = wait_diagnostics();
  if (d->magic != engine::WaitDiag::kMagic) return "";
  return fmt::format(
      "gemm prologue wait timed out after {} ns: block {} waiting for tile ({}, {}): flag[{}] expected >= {}, seen {}",
      d->timeout_ns, d->block, d->tile_m, d->tile_n, d->flag, d->expected, d->seen);
}

void clear_wait_timeout() { std::memset(wait_diagnostics(), 0, sizeof(engine::WaitDiag)); }

}  // namespace tessera::kernels
