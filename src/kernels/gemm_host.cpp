// Host side of the GEMM engine: validation, tile heuristic, TMA descriptors.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/gemm_plan.hpp"
#include "tessera/kernels/gemm/host_detail.hpp"
#include "tessera/kernels/gemm/scheduler.cuh"
#include "tessera/runtime/capture_mode.hpp"
#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::kernels {

namespace detail {
void fail_unresolved_tile_shape() {
  TESSERA_FAIL("tile_shape: GemmTile::Auto has no shape; resolve it first (resolve_tile)");
}
}  // namespace detail

std::string tile_name(GemmTile t) {
  switch (t) {
    case GemmTile::T128x256:
      return "128x256";
    case GemmTile::T256x128:
      return "256x128";
    case GemmTile::T128x128:
      return "128x128";
    case GemmTile::T64x256:
      return "64x256";
    case GemmTile::T64x64:
      return "64x64";
    case GemmTile::T128x192:
      return "128x192";
    case GemmTile::T128x32:
      return "128x32";
    case GemmTile::T128x64:
      return "128x64";
    case GemmTile::T128x96:
      return "128x96";
    case GemmTile::Auto:
      return "auto";
  }
  return "?";
}

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

/// Largest row stride (elements of 2 bytes) a TMA descriptor takes: < 2^40 bytes.
constexpr int64_t kMaxTmaStrideElems = int64_t{1} << 39;

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
  TESSERA_CHECK(major == 9 && minor == 0,
                "{}: device {} has compute capability {}.{}; the GEMM engine needs sm_90 (Hopper)", op, dev, major,
                minor);
  if (dev < 64) seen[dev] = 1;
}

// validate_inputs' argument checks without the device check: every bad
// argument is named before the GPU is looked at (the host tests run them on
// machines without one).
void check_input_args(const GemmArgs& a, const char* op) {
  TESSERA_CHECK(a.in == DType::bf16 || a.in == DType::f16, "{}: input dtype {} not supported (bf16 or f16)", op,
                dtype_name(a.in));
  TESSERA_CHECK(a.m >= 1 && a.m < (int64_t{1} << 31), "{}: M = {} out of range [1, 2^31)", op, a.m);
  TESSERA_CHECK(a.n >= 1 && a.n < (int64_t{1} << 31), "{}: N = {} out of range [1, 2^31)", op, a.n);
  TESSERA_CHECK(a.k >= 1 && a.k < (int64_t{1} << 31), "{}: K = {} out of range [1, 2^31)", op, a.k);
  // Any K and N: TMA zero-fills the tails; only the row strides in memory
  // must be 16-byte multiples (a packed K or N that is not a multiple of 8
  // needs a padded lda / ldb).
  TESSERA_CHECK(a.lda != 0 || a.k % 8 == 0,
                "{}: K = {} with packed A (lda = K) gives {}-byte rows; TMA needs 16-byte rows: pass lda, a multiple "
                "of 8 >= K",
                op, a.k, a.k * 2);
  TESSERA_CHECK(a.ldb != 0 || (a.b_layout == BLayout::NK ? a.k : a.n) % 8 == 0,
                "{}: {} = {} with packed B gives {}-byte rows; TMA needs 16-byte rows: pass ldb, a multiple of 8", op,
                a.b_layout == BLayout::NK ? "K" : "N", a.b_layout == BLayout::NK ? a.k : a.n,
                (a.b_layout == BLayout::NK ? a.k : a.n) * 2);
  TESSERA_CHECK(a.a != nullptr, "{}: A is null", op);
  TESSERA_CHECK(a.b != nullptr, "{}: B is null", op);
  TESSERA_CHECK(aligned16(a.a), "{}: A = {} is not 16-byte aligned", op, a.a);
  TESSERA_CHECK(aligned16(a.b), "{}: B = {} is not 16-byte aligned", op, a.b);
  const int64_t lda = a.lda_or_packed(), ldb = a.ldb_or_packed();
  TESSERA_CHECK(lda >= a.k && lda % 8 == 0, "{}: lda = {} must be >= K = {} and a multiple of 8", op, lda, a.k);
  const int64_t brow = a.b_layout == BLayout::NK ? a.k : a.n;
  TESSERA_CHECK(ldb >= brow && ldb % 8 == 0, "{}: ldb = {} must be >= {} ({}) and a multiple of 8", op, ldb, brow,
                a.b_layout == BLayout::NK ? "K, B is [N, K]" : "N, B is [K, N]");
  // TMA takes row strides below 2^40 bytes; larger ones would fail to encode
  // (or wrap in lda * 2) after the checks above.
  TESSERA_CHECK(lda < kMaxTmaStrideElems, "{}: lda = {} elements exceeds TMA's 2^40-byte row stride", op, lda);
  TESSERA_CHECK(ldb < kMaxTmaStrideElems, "{}: ldb = {} elements exceeds TMA's 2^40-byte row stride", op, ldb);
}

}  // namespace

namespace detail {

void fail(const std::string& msg) { TESSERA_FAIL("{}", msg); }

void cuda_check(cudaError_t rc, const char* what) {
  TESSERA_CHECK(rc == cudaSuccess, "{}: {} ({})", what, cudaGetErrorString(rc), static_cast<int>(rc));
}

void check_instantiation(const GemmArgs& a, BLayout layout, DType in, int max_ctas) {
  check_input_args(a, "gemm");
  TESSERA_CHECK(a.b_layout == layout, "gemm: args.b_layout ({}) does not match the instantiated layout ({})",
                a.b_layout == BLayout::NK ? "NK" : "KN", layout == BLayout::NK ? "NK" : "KN");
  TESSERA_CHECK(a.in == in, "gemm: args.in = {} does not match the instantiated input type {}", dtype_name(a.in),
                dtype_name(in));
  TESSERA_CHECK(max_ctas >= 0, "gemm: max_ctas = {} must be >= 0", max_ctas);
  require_hopper("gemm");
}

void validate_inputs(const GemmArgs& a, const char* op) {
  check_input_args(a, op);
  require_hopper(op);
}

void make_tma_2d(const char* what, const void* base, DType t, uint64_t inner, uint64_t outer, uint64_t ld,
                 uint32_t box_inner, uint32_t box_outer, CUtensorMap* out,
                 CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    TESSERA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    TESSERA_CHECK(fn != nullptr && q == cudaDriverEntryPointSuccess,
                  "gemm: cuTensorMapEncodeTiled not found in the driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  const CUtensorMapDataType dt = t == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {ld * 2};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t elem_strides[2] = {1, 1};
  // Rows that are only 16-byte aligned (ld * 2 not a multiple of 32) load
  // slower from L2 (one 128-byte box row spans five sectors); 128-byte
  // promotion measured 1.30x against 1.49x of cuBLASLt with 256-byte
  // promotion on 8192 x 8192 x 8200 (nvidia-h200, docs/design/gemm.md).
  const CUtensorMapL2promotion promo =
      (ld * 2) % 32 != 0 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  const CUresult rc = encode(out, dt, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promo, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
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

bool make_tma_store_map(void* d, DType t, int64_t rows, int64_t cols, int64_t ldd, int box_rows, int box_cols,
                        CUtensorMap* out) {
  TESSERA_CHECK(t == DType::bf16 || t == DType::f16, "gemm: the TMA-store epilogue stores bf16 or f16, not {}",
                dtype_name(t));
  if (cols % 8 != 0 || rows <= 0 || !tma_store_enabled()) return false;
  make_tma_2d("D", d, t, static_cast<uint64_t>(cols), static_cast<uint64_t>(rows), static_cast<uint64_t>(ldd),
              static_cast<uint32_t>(box_cols), static_cast<uint32_t>(box_rows), out, CU_TENSOR_MAP_SWIZZLE_64B);
  return true;
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

bool tma_store_enabled() {
  static const bool on = env::find_int("TESSERA_GEMM_TMA_STORE", 0, 1).value_or(1) != 0;
  return on;
}

bool dependent_launch_enabled() {
  static const bool on = env::find_int("TESSERA_GEMM_PDL", 0, 1).value_or(1) != 0;
  return on;
}

using runtime::RelaxedCaptureMode;

void* acquire_workspace(size_t bytes, cudaStream_t stream) {
  static std::mutex mu;
  static std::array<cudaMemPool_t, 64> pools{};
  int dev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  TESSERA_CHECK(dev < 64, "gemm: device {} out of range for the split-K workspace pools", dev);
  cudaMemPool_t pool;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!pools[dev]) {
      // The first split-K call may come inside a stream capture (a CUDA
      // graph of the training step); cudaMemPoolCreate is not a stream
      // operation, and global capture mode forbids it on every thread. It
      // runs once per device in this thread's relaxed mode, then the
      // caller's mode is restored.
      RelaxedCaptureMode relaxed;
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = dev;
      TESSERA_CUDA_CHECK(cudaMemPoolCreate(&pools[dev], &props));
      uint64_t keep = UINT64_MAX;
      TESSERA_CUDA_CHECK(cudaMemPoolSetAttribute(pools[dev], cudaMemPoolAttrReleaseThreshold, &keep));
    }
    pool = pools[dev];
  }
  void* p = nullptr;
  TESSERA_CUDA_CHECK(cudaMallocFromPoolAsync(&p, bytes, pool, stream));
  return p;
}

void release_workspace(void* p, cudaStream_t stream) { TESSERA_CUDA_CHECK(cudaFreeAsync(p, stream)); }

StreamKWorkspace stream_k_workspace(cudaStream_t stream, size_t slot_bytes) {
  // One f32 tile per CTA slot, of the largest stream-K tile (128x256).
  constexpr TileShape kLargest = tile_shape(GemmTile::T128x256);
  constexpr size_t kMaxSlotBytes = size_t{kLargest.bm} * kLargest.bn * sizeof(float);
  TESSERA_CHECK(slot_bytes <= kMaxSlotBytes, "gemm: stream-K slot of {} bytes exceeds the workspace's {}", slot_bytes,
                kMaxSlotBytes);
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, StreamKWorkspace> buffers;
  int dev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  StreamKWorkspace& w = buffers[{dev, stream}];
  if (w.slots == nullptr) {
    // Made once per stream, possibly inside a capture: cudaMalloc and a
    // memset on a private stream are not stream operations of the captured
    // stream, allowed in this thread's relaxed mode.
    RelaxedCaptureMode relaxed;
    const size_t sms = static_cast<size_t>(sm_count());
    void* p = nullptr;
    TESSERA_CUDA_CHECK(cudaMalloc(&p, sms * (kMaxSlotBytes + sizeof(uint64_t))));
    auto* flags = reinterpret_cast<uint64_t*>(static_cast<char*>(p) + sms * kMaxSlotBytes);
    cudaStream_t init = nullptr;
    TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&init, cudaStreamNonBlocking));
    TESSERA_CUDA_CHECK(cudaMemsetAsync(flags, 0, sms * sizeof(uint64_t), init));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(init));
    TESSERA_CUDA_CHECK(cudaStreamDestroy(init));
    w.slots = static_cast<float*>(p);
    w.flags = flags;
  }
  return w;
}

void set_max_dynamic_smem_once(const void* kernel, int smem, const char* what) {
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  static std::mutex mu;
  static std::set<std::tuple<const void*, int, int>> done;  // (stub, device, bytes)
  const auto key = std::make_tuple(kernel, dev, smem);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (done.count(key)) return;
  }
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), what);
  std::lock_guard<std::mutex> lock(mu);
  done.insert(key);
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  TESSERA_CHECK(e == cudaSuccess, "{}: {} ({})", what, cudaGetErrorString(e), static_cast<int>(e));
}

}  // namespace detail

void validate(const GemmArgs& a, const char* op) {
  // Every argument first, the device last: bad input is named without a GPU.
  check_input_args(a, op);
  TESSERA_CHECK(a.out == DType::bf16 || a.out == DType::f16 || a.out == DType::f32,
                "{}: output dtype code {} not supported (bf16, f16 or f32)", op, static_cast<int>(a.out));
  TESSERA_CHECK(a.d != nullptr, "{}: D is null", op);
  const size_t es = dtype_size(a.out);
  TESSERA_CHECK(reinterpret_cast<uintptr_t>(a.d) % es == 0, "{}: D = {} is not aligned to its {}-byte elements", op,
                a.d, es);
  const int64_t ldd = a.ldd_or_packed();
  TESSERA_CHECK(ldd >= a.n && ldd < (int64_t{1} << 40), "{}: ldd = {} must be >= N = {} and < 2^40", op, ldd, a.n);
  require_hopper(op);
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
  if (o.ping_pong) {
    TESSERA_CHECK(o.cluster_m <= 1, "gemm: cluster_m = {} with ping_pong (ping-pong runs without clusters)",
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

bool is_swap_tile(GemmTile t) { return t == GemmTile::T128x32 || t == GemmTile::T128x64 || t == GemmTile::T128x96; }

bool cluster_kernel_compiled(GemmTile t, int cluster_m, int cluster_n) {
  if (t == GemmTile::T128x128) return (cluster_m == 2 || cluster_n == 2) && cluster_m <= 2 && cluster_n <= 2;
  if (t == GemmTile::T128x256) return cluster_m == 2 && cluster_n == 2;
  if (t == GemmTile::T128x192) return cluster_m == 1 && cluster_n == 2;
  return false;
}

bool plain_uses_ping_pong(const GemmArgs& a, const GemmOptions& o) {
  // Above ~4e11 multiply-adds the cooperative 128x256 kernel is the safer
  // choice: measured in one binary on nvidia-h200-x2 (docs/design/gemm-engine.md),
  // ping-pong 64x256 is 0.96-1.00x cuBLASLt there when the GPU is power-capped
  // but 1.03-1.06x at boost clocks, the cooperative one 0.99-1.03x and
  // 0.97-1.01x. Below it ping-pong wins in both states (0.94-1.00x).
  constexpr double kPingPongMaxMnk = 4e11;
  const double mnk = static_cast<double>(a.m) * static_cast<double>(a.n) * static_cast<double>(a.k);
  return !o.ping_pong && o.tile == GemmTile::Auto && o.cluster_m <= 1 && a.in == a.out && mnk < kPingPongMaxMnk;
}

GemmTile resolve_tile(const GemmArgs& a, const GemmOptions& o) {
  TESSERA_CHECK(o.raster_group >= 1, "gemm: raster_group = {} must be >= 1", o.raster_group);
  TESSERA_CHECK(o.rotate_m >= 0, "gemm: rotate_m = {} must be >= 0", o.rotate_m);
  TESSERA_CHECK(o.max_ctas >= 0, "gemm: max_ctas = {} must be >= 0", o.max_ctas);
  TESSERA_CHECK(o.tile != GemmTile::T64x64 && o.tile != GemmTile::T128x192 && !is_swap_tile(o.tile),
                "gemm: tile {} is compiled for the plain gemm() only (not for the policy entry points)",
                tile_name(o.tile));
  if (o.ping_pong) {
    TESSERA_CHECK(o.tile == GemmTile::Auto || o.tile == GemmTile::T128x128 || o.tile == GemmTile::T64x256,
                  "gemm: tile {} is not compiled with ping_pong (ping-pong: 128x128 or 64x256)", tile_name(o.tile));
    TESSERA_CHECK(o.cluster_m <= 1, "gemm: cluster_m = {} with ping_pong (ping-pong runs without clusters)",
                  o.cluster_m);
    return o.tile == GemmTile::Auto ? GemmTile::T128x128 : o.tile;
  }
  TESSERA_CHECK(o.tile != GemmTile::T64x256, "gemm: tile 64x256 exists only with ping_pong (ping-pong)");
  if (o.tile != GemmTile::Auto) return o.tile;
  const int sms = o.max_ctas > 0 ? std::min(o.max_ctas, detail::sm_count()) : detail::sm_count();
  return choose_tile(a, sms);
}

namespace {

// Largest power of two <= 128 dividing the byte address or stride x.
int pow2_align(uint64_t x) {
  int a = 1;
  while (a < 128 && x % (2 * a) == 0) a *= 2;
  return a;
}

}  // namespace

int row_alignment(const GemmArgs& a) {
  const uint64_t es = dtype_size(a.in);
  int al = 128;
  al = std::min(al, pow2_align(reinterpret_cast<uintptr_t>(a.a)));
  al = std::min(al, pow2_align(reinterpret_cast<uintptr_t>(a.b)));
  al = std::min(al, pow2_align(static_cast<uint64_t>(a.lda_or_packed()) * es));
  al = std::min(al, pow2_align(static_cast<uint64_t>(a.ldb_or_packed()) * es));
  return al;
}

bool plain_dependent_launch(const GemmArgs& a, const GemmOptions& o, const GemmPlan& p, int num_sms) {
  return o.dependent_launch && model_gemm_us(a, num_sms, p) < kDependentLaunchMaxUs;
}

namespace {

// The model's constants shared by the data-parallel and stream-K estimates
// (model_gemm_us says what each is and where it was fitted).
constexpr double kFlopPerUs = 5.63e6;
constexpr double kDramBytesPerUs = 3.98e6;
constexpr double kDramLatencyUs = 1.62;
constexpr double kSmBw = 91.2e3;
constexpr double kLaunchUs = 6.04;

// The compute estimate t raised to the DRAM time of the problem's bytes (at
// most kDramBytesPerUs, and no more than the active CTAs' pipelines hold in
// flight per kDramLatencyUs), plus the launch.
double with_dram_and_launch(const GemmArgs& a, double t, double active, double in_flight_rows, int stages, double fix,
                            double dram_eff = 1.0) {
  const double out_bytes = static_cast<double>(a.m) * a.n * dtype_size(a.out);
  const double dram = (static_cast<double>(a.m) * a.k + static_cast<double>(a.n) * a.k) * dtype_size(a.in) + out_bytes;
  const double in_flight = active * stages * in_flight_rows * 128;
  return std::max(t, dram / std::min(dram_eff * kDramBytesPerUs, in_flight / kDramLatencyUs) + fix) + kLaunchUs;
}

// L2->SM bytes per microsecond one of `active` CTAs receives when each
// loads `rows` 128-byte rows per K block: the GPU's rate for the row
// alignment (total_bw) shared by the active CTAs, at most kSmBw per SM.
// For whole tiles of an unswapped data-parallel plan (whole_tiles) whose
// rows are not 128-byte aligned and that load more than one 128-row box
// per K block, also at most the per-SM share of total_bw at full occupancy
// (kFullSms) however few CTAs run: the limit is then the TMA unit's
// requests (a misaligned box row is two), not L2. Measured: 3199 x 856 x
// 15480 (16-byte rows, 100 tiles of 128x256 on 132 SMs) runs 1.34x slower
// with one CTA per tile than with B multicast, as the per-SM cap predicts
// and a shared one does not. Split, stream-K and swapped plans keep the
// shared rate they were fitted with: capped too, they moved small problems
// to worse split counts (up to 1.27x on seeds 23 and 24). Choosing by it
// on seeds 18, 19 and 21 comes within 1.029 / 1.046 / 1.057 of the best
// timed kernel, 1.046 / 1.067 / 1.052 without it (docs/design/gemm.md,
// "Clusters for misaligned rows").
double sm_load_bw(int al, double total_bw, double active, double rows, bool whole_tiles) {
  constexpr double kFullSms = 132.0;
  const double cap = al < 128 && rows > 128 && whole_tiles ? std::min(kSmBw, total_bw / kFullSms) : kSmBw;
  return std::min(cap, total_bw / active);
}

// Stream-K (kernel_stream_k.cuh) as StreamKScheduler lays it out: whole
// waves but the last data-parallel, then every CTA an equal share of the
// remaining tiles' K blocks at the tile's per-block rate, a fixed cost per
// segment, and kStreamKUs for the partial tiles' exchange (stored in
// fragment order, waited for, added) whenever a tile is split. kStreamKUs
// is fitted to every compiled kernel's --diag timings of 251 shapes
// (bench/results/raw; docs/design/gemm.md, "Stream-K"): at the earlier
// 8 us the model chose stream-K on long-K, mid-M shapes where a split or
// clustered tile measured 1.1-1.2x faster.
double model_stream_k_us(const GemmArgs& a, int num_sms, const GemmPlan& p, int64_t tiles_m, int64_t tiles_n,
                         int64_t kb, double eff, double fix, int al, double total_bw) {
  constexpr double kStreamKUs = 20.0;
  if (!stream_k_fits(tiles_m * tiles_n, kb)) return std::numeric_limits<double>::infinity();
  const TileShape ts = tile_shape(p.tile);
  const engine::StreamKScheduler s = engine::StreamKScheduler::make(
      {}, static_cast<int>(tiles_m), static_cast<int>(tiles_n), static_cast<int>(kb), num_sms, kStreamKMinBlocks);
  const int64_t per_cta = (static_cast<int64_t>(s.iters) + s.units - 1) / s.units;
  const double active = static_cast<double>(std::min(s.units, num_sms));
  const double t_comp = 2.0 * ts.bm * ts.bn * 64 / (kFlopPerUs * eff);
  const double rows = static_cast<double>(std::min<int64_t>(ts.bm, a.m)) + std::min<int64_t>(ts.bn, a.n);
  const double t_block = std::max(t_comp, rows * 128 / sm_load_bw(al, total_bw, active, rows, false));
  const double t = static_cast<double>(s.dp_tiles / s.units) * (s.k_blocks * t_block + fix) + per_cta * t_block +
                   (static_cast<double>(per_cta) / s.k_blocks + 1) * fix + (s.any_split() ? kStreamKUs : 0.0);
  return with_dram_and_launch(a, t, active, rows, tile_stages(p.tile, false), fix);
}

}  // namespace

bool tiny_m_problem(const GemmArgs& a) { return a.m <= kTinyM && a.b_layout == BLayout::NK; }

double model_gemm_us(const GemmArgs& a, int num_sms, const GemmPlan& p) {
  // Constants fitted to 90 random shapes on nvidia-h200 (seeds 1, 2 and 5,
  // every compiled kernel timed per shape with `bench gemm --random --diag`,
  // 1,632 timings; least squares on log time, timings within 1.5x of the
  // shape's best weighted 5x). Picking among the timed kernels by the model
  // comes within 1.016x of the best one (1.013-1.022x with one seed held
  // out; docs/design/gemm.md). They are relative costs, not hardware rates:
  // kFlopPerUs over eff gives each kernel's wgmma time per K block,
  // total_bw the L2->SM bytes/us the whole GPU sustains for a row alignment
  // (shared by the active CTAs, at most kSmBw each), fix a per-unit cost,
  // kLaunchUs what every launch costs besides its waves (launch, ramp,
  // drain), kSplitUs the split-K extras (reduce launch, workspace) besides
  // the partials' traffic. DRAM: at most kDramBytesPerUs, and no more than
  // the bytes the active CTAs' pipelines hold in flight per kDramLatencyUs
  // (Little's law: where M is small, a deep ring of weight rows streams
  // faster than a shallow one); both fitted to seeds 8 and 11 under
  // GPU-only timing with the other constants held. (kFlopPerUs, the DRAM
  // and launch constants: above, shared with the stream-K estimate.)
  constexpr double kSplitUs = 2.0;
  const int al = row_alignment(a);
  const double total_bw = al >= 128 ? 17.2e6 : al >= 32 ? 11.1e6 : 7.58e6;
  const TileShape ts = tile_shape(p.tile);
  // A swapped plan tiles D^T: its rows run over N, its columns over M.
  const int64_t pm = p.swap_ab ? a.n : a.m, pn = p.swap_ab ? a.m : a.n;
  double eff = 1.12, fix = p.cluster_m == 2 ? 2.83 : 2.41;  // 128x256 cooperative
  // The plain-only cluster kernels (cluster_kernel_compiled) cost each
  // cluster tile kClusterFixUs more and run their wgmma at kClusterEff of
  // the tile's rate (its CTAs refill a slot only when all its readers
  // released it): fitted to their --diag timings beside every other kernel
  // (seeds 18 and 19; docs/design/gemm.md, "Clusters for misaligned rows").
  constexpr double kClusterFixUs = 1.0;
  constexpr double kClusterEff = 0.9;
  if (p.tile == GemmTile::T256x128) {
    eff = p.cluster_m == 2 ? 1.06 : 1.10;
    fix = p.cluster_m == 2 ? 3.3 : 2.35;
  } else if (p.tile == GemmTile::T128x128) {
    eff = p.ping_pong ? 1.23 : 1.22;
    fix = p.ping_pong ? 1.89 : 0.97;
  } else if (p.tile == GemmTile::T64x256) {
    eff = 0.965;
    fix = 0.556;
  } else if (p.tile == GemmTile::T128x192) {
    eff = 1.08;
    fix = 1.65;
  } else if (p.tile == GemmTile::T64x64) {
    // One m64n64 atom per K block: the lowest wgmma rate per FLOP; its use
    // is few tiles (small M or N), where the K-block time is the bytes each
    // SM loads.
    eff = 0.638;
    fix = 0.0;
  } else if (p.tile == GemmTile::T128x32) {
    // Swapped tiles: narrow wgmma N; their use is small M, where the K-block
    // time is the 128 weight rows each SM loads. 128x32's fixed cost per
    // tile is fitted (0, with kStreamKUs) to timings taken after the swapped
    // store began writing whole pieces of D's rows.
    eff = 0.55;
    fix = 0.0;
  } else if (p.tile == GemmTile::T128x64) {
    eff = 0.8;
    fix = 0.5;
  } else if (p.tile == GemmTile::T128x96) {
    eff = 0.95;
    fix = 0.5;
  }
  if (cluster_kernel_compiled(p.tile, p.cluster_m, p.cluster_n)) {
    eff *= kClusterEff;
    fix += kClusterFixUs;
  }
  int64_t tm = (pm + ts.bm - 1) / ts.bm, tn = (pn + ts.bn - 1) / ts.bn;
  const int64_t kb_total = (a.k + 63) / 64;
  if (p.stream_k) return model_stream_k_us(a, num_sms, p, tm, tn, kb_total, eff, fix, al, total_bw);
  // A cluster's CTAs run whole cluster tiles (the tiles past the problem
  // too, on zeros), and 4-CTA clusters leave some SMs of a GPC idle (30
  // such clusters of ~200 KiB CTAs are resident on the H200's 132 SMs,
  // cudaOccupancyMaxActiveClusters).
  int64_t sms = num_sms;
  if (p.cluster_m * p.cluster_n > 1) {
    tm = (tm + p.cluster_m - 1) / p.cluster_m * p.cluster_m;
    tn = (tn + p.cluster_n - 1) / p.cluster_n * p.cluster_n;
    constexpr double kQuadClusterSms = 120.0 / 132.0;
    const int64_t csize = p.cluster_m * p.cluster_n;
    sms = csize == 4 ? static_cast<int64_t>(num_sms * kQuadClusterSms) / 4 * 4 : num_sms / csize * csize;
    sms = std::max<int64_t>(sms, csize);
  }
  const int64_t kb = (kb_total + p.k_splits - 1) / p.k_splits;
  const int64_t splits = (kb_total + kb - 1) / kb;
  const int64_t units = tm * tn * splits;
  const int64_t waves = (units + sms - 1) / sms;
  const double active = static_cast<double>(std::min<int64_t>(units, sms));
  const double t_comp = 2.0 * ts.bm * ts.bn * 64 / (kFlopPerUs * eff);
  // L2->SM rows per K block and CTA: a cluster shares A along N, B along M.
  const double rows = static_cast<double>(std::min<int64_t>(ts.bm, pm)) / p.cluster_n +
                      static_cast<double>(std::min<int64_t>(ts.bn, pn)) / p.cluster_m;
  const double t_load = rows * 128 / sm_load_bw(al, total_bw, active, rows, p.k_splits == 1 && !p.swap_ab);
  double t = waves * (kb * std::max(t_comp, t_load) + fix);
  // Tiny M (tiny_m_problem): the 64x64 tile streams the weights at most at
  // kTinyM64x64DramEff of the rate the swapped 128x32 tile reaches (2.6
  // against 3.2-3.3 TB/s with 50-115 MB of B, as cuBLASLt), unsplit, and
  // split where N >= kTinyMSplitDramMinN. Below that the swapped tile has
  // fewer than 12 tiles and needs 6 or more splits to fill the SMs, where
  // the split 64x64 plans measured up to 1.26x faster (N ~ 1200, long K).
  // 0.7 and the split plans above the bound: on the 19 of 1,500 random
  // shapes it moves to swapped plans, 0.65-0.98x the time (A/B,
  // docs/design/gemm.md, "Small M: swapped operands").
  constexpr double kTinyM64x64DramEff = 0.7;
  constexpr int64_t kTinyMSplitDramMinN = 1536;
  const bool slow_stream =
      p.tile == GemmTile::T64x64 && tiny_m_problem(a) && (p.k_splits == 1 || a.n >= kTinyMSplitDramMinN);
  t = with_dram_and_launch(a, t, active, rows, tile_stages(p.tile, p.ping_pong), fix,
                           slow_stream ? kTinyM64x64DramEff : 1.0);
  const double out_bytes = static_cast<double>(a.m) * a.n * dtype_size(a.out);
  if (splits > 1) t += kSplitUs + (static_cast<double>(a.m) * a.n * 4 * splits * 2 + out_bytes) / kDramBytesPerUs;
  return t;
}

bool d_rows_aligned(const GemmArgs& a) {
  return aligned16(a.d) && (a.ldd_or_packed() * static_cast<int64_t>(dtype_size(a.out))) % 16 == 0;
}

namespace detail {

// The model search's candidates, in the order the search breaks ties by
// (the first of equally cheap plans wins).
std::vector<GemmPlan> plan_candidates(const GemmArgs& a, bool allow_split) {
  struct Cand {
    GemmTile t;
    bool pp;
    int cluster;
    bool splittable;
    bool mixed_ok;  // compiled for an output type other than the input's
    int cluster_n = 1;
  };
  const Cand cands[] = {
      {GemmTile::T128x256, false, 1, false, true},     {GemmTile::T128x256, false, 2, false, false},
      {GemmTile::T256x128, false, 1, false, false},    {GemmTile::T256x128, false, 2, false, false},
      {GemmTile::T128x128, false, 1, true, false},     {GemmTile::T128x128, true, 1, false, false},
      {GemmTile::T64x256, true, 1, true, false},       {GemmTile::T64x64, true, 1, true, false},
      {GemmTile::T128x192, false, 1, false, false},    {GemmTile::T128x128, false, 2, false, false},
      {GemmTile::T128x128, false, 1, false, false, 2}, {GemmTile::T128x128, false, 2, false, false, 2},
      {GemmTile::T128x256, false, 2, false, false, 2}, {GemmTile::T128x192, false, 1, false, false, 2},
  };
  const bool same_type = a.in == a.out;
  const int64_t kb_total = std::max<int64_t>(1, (a.k + 63) / 64);
  std::vector<GemmPlan> out;
  const int al = row_alignment(a);
  for (const Cand& c : cands) {
    const TileShape ts = tile_shape(c.t);
    const int64_t tile_rows = (a.m + ts.bm - 1) / ts.bm;
    if (c.cluster == 2 && tile_rows < 2) continue;
    // Rows aligned to 32 bytes or more: a cluster along M with an odd number
    // of tile rows measured 1.20x its unclustered tile in geomean (128x128,
    // 22 --diag shapes of bench/results/raw with 3-7 tile rows: 1.01-1.73x;
    // 1.02x on 27 with more), and the plain-only cluster kernels, built for
    // 16-byte rows, beat the best other kernel on 3 of 120 shapes with 64-
    // or 128-byte rows, by 3 % at most (docs/design/gemm.md, "Clusters for
    // misaligned rows").
    if (c.cluster == 2 && tile_rows % 2 == 1 && al >= 32) continue;
    if (cluster_kernel_compiled(c.t, c.cluster, c.cluster_n) && al >= 64) continue;
    // A cluster along N also needs two tile rows: with one, the A tile it
    // shares is mostly empty, and on M <= 43 (seed 18) 128x128 1x2 measured
    // no faster than 128x128 alone, far behind the swapped and 64x64 tiles.
    if (c.cluster_n == 2 && ((a.n + ts.bn - 1) / ts.bn < 2 || tile_rows < 2)) continue;
    const int max_splits = c.splittable && allow_split ? static_cast<int>(std::min<int64_t>(32, kb_total / 4)) : 1;
    for (int s = 1; s <= std::max(1, max_splits); ++s) {
      // Split kernels write f32 partials whatever the output type.
      if (!same_type && !c.mixed_ok && s == 1) continue;
      GemmPlan q;
      q.tile = c.t;
      q.ping_pong = c.pp;
      q.cluster_m = c.cluster;
      q.cluster_n = c.cluster_n;
      q.k_splits = canonical_k_splits(a, s);
      if (s > 1 && q.k_splits == 1) continue;
      if (std::find(out.begin(), out.end(), q) == out.end()) out.push_back(q);
    }
  }
  if (allow_split && same_type) {
    // Stream-K (whole K per tile summed over CTAs; cooperative, no
    // cluster; stores the input type only).
    for (GemmTile t : {GemmTile::T128x256, GemmTile::T128x128}) {
      const TileShape ts = tile_shape(t);
      if (!stream_k_fits(((a.m + ts.bm - 1) / ts.bm) * ((a.n + ts.bn - 1) / ts.bn), kb_total)) continue;
      GemmPlan q;
      q.tile = t;
      q.stream_k = true;
      out.push_back(q);
    }
  }
  if (a.b_layout == BLayout::NK && a.m <= kSwapMaxM) {
    // Swapped tiles (D^T = B A^T): whole K stores the input type only.
    for (GemmTile t : {GemmTile::T128x32, GemmTile::T128x64, GemmTile::T128x96}) {
      const int max_splits = allow_split ? static_cast<int>(std::min<int64_t>(32, kb_total / 4)) : 1;
      for (int s = 1; s <= std::max(1, max_splits); ++s) {
        if (!same_type && s == 1) continue;
        GemmPlan q;
        q.tile = t;
        q.cluster_m = 1;
        q.swap_ab = true;
        q.k_splits = canonical_k_splits(a, s);
        if (s > 1 && q.k_splits == 1) continue;
        if (std::find(out.begin(), out.end(), q) == out.end()) out.push_back(q);
      }
    }
  }
  return out;
}

}  // namespace detail

int canonical_k_splits(const GemmArgs& a, int splits) {
  const int64_t kb_total = std::max<int64_t>(1, (a.k + 63) / 64);
  const int64_t s = std::clamp<int64_t>(splits, 1, kb_total);
  const int64_t per = (kb_total + s - 1) / s;
  return static_cast<int>((kb_total + per - 1) / per);
}

std::vector<GemmPlan> gemm_plan_candidates(const GemmArgs& a) { return detail::plan_candidates(a, true); }

bool gemm_plan_valid(const GemmArgs& a, const GemmPlan& p) {
  const std::vector<GemmPlan> c = gemm_plan_candidates(a);
  return std::find(c.begin(), c.end(), p) != c.end();
}

GemmOptions plan_options(const GemmPlan& p, GemmOptions base) {
  base.tile = p.tile;
  // plan_gemm() runs 64x64 as ping-pong by itself; its ping_pong option
  // would name the 64x256 split kernel.
  base.ping_pong = p.ping_pong && p.tile != GemmTile::T64x64;
  base.cluster_m = p.cluster_m;
  base.cluster_n = p.cluster_n;
  base.k_splits = p.k_splits;
  base.stream_k = p.stream_k;
  base.swap_ab = p.swap_ab;
  return base;
}

int plan_sm_count(const GemmOptions& o) {
  return o.max_ctas > 0 ? std::min(o.max_ctas, detail::sm_count()) : detail::sm_count();
}

namespace {
std::atomic<GemmPlanLookup> g_plan_lookup{nullptr};
}  // namespace

void set_gemm_plan_lookup(GemmPlanLookup lookup) { g_plan_lookup.store(lookup); }
GemmPlanLookup gemm_plan_lookup() { return g_plan_lookup.load(); }

GemmPlan plan_gemm(const GemmArgs& a, const GemmOptions& o) {
  TESSERA_CHECK(o.k_splits >= 0, "gemm: k_splits = {} must be >= 0 (0 = heuristic)", o.k_splits);
  TESSERA_CHECK(o.cluster_n >= 0 && o.cluster_n <= 2, "gemm: cluster_n = {} (0 or 1: none, 2)", o.cluster_n);
  GemmPlan p;
  const bool same_type = a.in == a.out;
  const bool along_n = o.cluster_n == 2;
  if (o.stream_k) {
    // Explicit stream-K: 128x256 (Auto) or 128x128, cooperative, whole K.
    TESSERA_CHECK(o.tile == GemmTile::Auto || o.tile == GemmTile::T128x256 || o.tile == GemmTile::T128x128,
                  "gemm: stream_k runs tile 128x256 or 128x128, not {}", tile_name(o.tile));
    TESSERA_CHECK(!o.ping_pong, "gemm: stream_k runs the cooperative kernel (ping_pong is set)");
    TESSERA_CHECK(o.cluster_m <= 1 && !along_n, "gemm: stream_k runs without clusters (cluster_m = {}, cluster_n = {})",
                  o.cluster_m, o.cluster_n);
    TESSERA_CHECK(o.k_splits <= 1, "gemm: stream_k splits K by itself (k_splits = {})", o.k_splits);
    TESSERA_CHECK(same_type, "gemm: stream_k is compiled for output type == input type ({} -> {})", dtype_name(a.in),
                  dtype_name(a.out));
    TESSERA_CHECK(!o.swap_ab, "gemm: stream_k and swap_ab cannot be combined");
    p.tile = o.tile == GemmTile::T128x128 ? GemmTile::T128x128 : GemmTile::T128x256;
    p.stream_k = true;
    return p;
  }
  TESSERA_CHECK(o.swap_ab || !is_swap_tile(o.tile), "gemm: tile {} runs only with swap_ab (D^T = B A^T)",
                tile_name(o.tile));
  if (o.swap_ab) {
    // Explicit swapped operands: D^T = B A^T on a 128-row tile of N.
    TESSERA_CHECK(a.b_layout == BLayout::NK, "gemm: swap_ab needs B as [N, K] (b_layout NK)");
    TESSERA_CHECK(o.tile == GemmTile::Auto || is_swap_tile(o.tile),
                  "gemm: swap_ab runs tile 128x32, 128x64 or 128x96, not {}", tile_name(o.tile));
    TESSERA_CHECK(!o.ping_pong, "gemm: swap_ab runs the cooperative kernel (ping_pong is set)");
    TESSERA_CHECK(o.cluster_m <= 1 && !along_n, "gemm: swap_ab runs without clusters (cluster_m = {}, cluster_n = {})",
                  o.cluster_m, o.cluster_n);
    TESSERA_CHECK(same_type || o.k_splits > 1,
                  "gemm: swap_ab over whole K is compiled for output type == input type ({} -> {}); set k_splits > 1",
                  dtype_name(a.in), dtype_name(a.out));
    p.tile = o.tile != GemmTile::Auto ? o.tile
             : a.m <= 32              ? GemmTile::T128x32
             : a.m <= 64              ? GemmTile::T128x64
                                      : GemmTile::T128x96;
    p.swap_ab = true;
    p.k_splits = std::max(1, o.k_splits);
    return p;
  }
  if (o.k_splits > 1) {
    // Forced split: 64x64 ping-pong when named, 64x256 ping-pong with
    // ping_pong, else 128x128.
    TESSERA_CHECK(o.tile == GemmTile::Auto || o.tile == GemmTile::T64x64 ||
                      (o.ping_pong ? o.tile == GemmTile::T64x256 : o.tile == GemmTile::T128x128),
                  "gemm: k_splits = {} runs tile 128x128 (cooperative), 64x256 (ping_pong) or 64x64, not {}",
                  o.k_splits, tile_name(o.tile));
    TESSERA_CHECK(o.cluster_m <= 1 && !along_n,
                  "gemm: k_splits = {} runs without clusters (cluster_m = {}, cluster_n = {})", o.k_splits, o.cluster_m,
                  o.cluster_n);
    p.tile = o.tile == GemmTile::T64x64 ? GemmTile::T64x64 : (o.ping_pong ? GemmTile::T64x256 : GemmTile::T128x128);
    p.ping_pong = o.ping_pong || o.tile == GemmTile::T64x64;
    p.k_splits = o.k_splits;
    return p;
  }
  if (along_n || (o.tile == GemmTile::T128x128 && o.cluster_m == 2 && !o.ping_pong)) {
    // The plain gemm()'s own cluster kernels (A shared along N; 128x128
    // along M): cooperative, whole K, output type == input type.
    const int cm = std::max(1, o.cluster_m), cn = std::max(1, o.cluster_n);
    TESSERA_CHECK(!o.ping_pong, "gemm: cluster_n = 2 runs the cooperative kernel (ping_pong is set)");
    TESSERA_CHECK(same_type, "gemm: cluster {}x{} is compiled for output type == input type ({} -> {})", cm, cn,
                  dtype_name(a.in), dtype_name(a.out));
    TESSERA_CHECK(cluster_kernel_compiled(o.tile, cm, cn),
                  "gemm: no {}x{} cluster kernel for tile {} (compiled: 128x128 with 2x1, 1x2 or 2x2; 128x256 with "
                  "2x2; 128x192 with 1x2)",
                  cm, cn, tile_name(o.tile));
    p.tile = o.tile;
    p.cluster_m = cm;
    p.cluster_n = cn;
    return p;
  }
  if (o.tile == GemmTile::T128x192) {
    // Explicit 128x192 cooperative over whole K: no clusters, no ping-pong,
    // stores the input type only.
    TESSERA_CHECK(o.cluster_m <= 1, "gemm: tile 128x192 runs without clusters (cluster_m = {})", o.cluster_m);
    TESSERA_CHECK(!o.ping_pong, "gemm: tile 128x192 has no ping-pong kernel (ping_pong)");
    TESSERA_CHECK(same_type, "gemm: tile 128x192 is compiled for output type == input type ({} -> {})",
                  dtype_name(a.in), dtype_name(a.out));
    p.tile = GemmTile::T128x192;
    return p;
  }
  if (o.tile == GemmTile::T64x64) {
    // Explicit 64x64 ping-pong over whole K: stores the input type only.
    TESSERA_CHECK(o.cluster_m <= 1, "gemm: tile 64x64 runs without clusters (cluster_m = {})", o.cluster_m);
    TESSERA_CHECK(same_type, "gemm: tile 64x64 without split-K is compiled for output type == input type ({} -> {})",
                  dtype_name(a.in), dtype_name(a.out));
    p.tile = GemmTile::T64x64;
    p.ping_pong = true;
    return p;
  }
  if (o.tile != GemmTile::Auto || o.ping_pong || o.cluster_m != 0) {
    // Explicit choices: the kernel they name, never split.
    if (plain_uses_ping_pong(a, o)) {
      p.tile = GemmTile::T64x256;
      p.ping_pong = true;
      return p;
    }
    p.tile = resolve_tile(a, o);
    p.ping_pong = o.ping_pong;
    p.cluster_m = resolve_cluster(a, o, p.tile);
    return p;
  }
  return default_plan(a, plan_sm_count(o), o.k_splits == 0);
}

bool legacy_rule_applies(const GemmArgs& a, int num_sms) {
  const int64_t big_tiles = ((a.m + 127) / 128) * ((a.n + 255) / 256);
  return row_alignment(a) >= 128 && a.m >= 2048 && a.n >= 2048 && big_tiles >= 2 * num_sms;
}

GemmPlan default_plan(const GemmArgs& a, int num_sms, bool allow_split) {
  TESSERA_CHECK(num_sms > 0, "gemm: num_sms = {} must be positive", num_sms);
  if (!legacy_rule_applies(a, num_sms)) return model_plan(a, num_sms, allow_split);
  // Large, aligned problems: the rule measured on the 13 benchmark shapes.
  GemmPlan p;
  if (plain_uses_ping_pong(a, GemmOptions{})) {
    p.tile = GemmTile::T64x256;
    p.ping_pong = true;
    return p;
  }
  p.tile = choose_tile(a, num_sms);
  p.cluster_m = 1;
  return p;
}

std::vector<GemmPlanEstimate> gemm_plan_estimates(const GemmArgs& a, int num_sms) {
  TESSERA_CHECK(num_sms > 0, "gemm: num_sms = {} must be positive", num_sms);
  std::vector<GemmPlanEstimate> out;
  for (const GemmPlan& p : gemm_plan_candidates(a)) out.push_back({p, model_gemm_us(a, num_sms, p)});
  std::stable_sort(out.begin(), out.end(),
                   [](const GemmPlanEstimate& x, const GemmPlanEstimate& y) { return x.us < y.us; });
  return out;
}

GemmPlan model_plan(const GemmArgs& a, int num_sms, bool allow_split) {
  // Cached per problem (the search is ~100 model evaluations: host time
  // that small problems would wait for). The B layout is part of the
  // problem: only B [N,K] has the swapped tiles among its candidates.
  using Key = std::tuple<int64_t, int64_t, int64_t, int, int, int, int, int, bool>;
  static std::mutex cache_mu;
  static std::map<Key, GemmPlan> cache;
  const Key key{a.m,
                a.n,
                a.k,
                row_alignment(a),
                static_cast<int>(a.in),
                static_cast<int>(a.out),
                static_cast<int>(a.b_layout),
                num_sms,
                allow_split};
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  // At tiny M only the 64x64 and swapped plans, unless none is a candidate
  // (e.g. another output type without splits): then every plan.
  const std::vector<GemmPlan> cands = detail::plan_candidates(a, allow_split);
  const auto tiny_m_plan = [](const GemmPlan& q) { return q.swap_ab || q.tile == GemmTile::T64x64; };
  const bool tiny_m = tiny_m_problem(a) && std::any_of(cands.begin(), cands.end(), tiny_m_plan);
  GemmPlan p;
  double best = 1e300;
  for (const GemmPlan& q : cands) {
    if (tiny_m && !tiny_m_plan(q)) continue;
    const double t = model_gemm_us(a, num_sms, q);
    if (t < best * 0.999) {
      best = t;
      p = q;
    }
  }
  std::lock_guard<std::mutex> lock(cache_mu);
  if (cache.size() >= 4096) cache.clear();
  cache.emplace(key, p);
  return p;
}

std::string plan_name(const GemmPlan& p) {
  std::string s = tile_name(p.tile) + (p.ping_pong ? "/pp" : "/c" + std::to_string(p.cluster_m));
  if (p.cluster_n > 1) s += "x" + std::to_string(p.cluster_n);
  if (p.k_splits > 1) s += "/k" + std::to_string(p.k_splits);
  if (p.stream_k) s += "/sk";
  if (p.swap_ab) s += "/swap";
  return s;
}

}  // namespace tessera::kernels
