// Host side of the grouped GEMM: validation, TMA descriptors (A 2-D, B 3-D
// with the group outermost), the configuration heuristic, the status words
// and the dispatch to the kernels compiled per (B layout, epilogue).
#include "tessera/kernels/grouped_gemm.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "tessera/kernels/gemm/host_detail.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::kernels {

namespace detail {
// grouped_gemm_kernels_*.cu
void grouped_gemm_bf16_nk_plain(GroupedTile, const GroupedGemmArgs&, const GroupedGemmOptions&, cudaStream_t);
void grouped_gemm_bf16_kn_plain(GroupedTile, const GroupedGemmArgs&, const GroupedGemmOptions&, cudaStream_t);
void grouped_gemm_bf16_nk_swiglu(GroupedTile, const GroupedGemmArgs&, const GroupedGemmOptions&, cudaStream_t);
void grouped_gemm_bf16_kn_swiglu(GroupedTile, const GroupedGemmArgs&, const GroupedGemmOptions&, cudaStream_t);
void grouped_gemm_bf16_nk_swiglu_gather(GroupedTile, const GroupedGemmArgs&, const GroupedGemmOptions&, cudaStream_t);
}  // namespace detail

namespace {

bool aligned(const void* p, uintptr_t n) { return (reinterpret_cast<uintptr_t>(p) % n) == 0; }
constexpr int64_t kInt31 = int64_t{1} << 31;

const char* layout_name(BLayout l) { return l == BLayout::NK ? "NK ([G, N, K])" : "KN ([G, K, N])"; }

void validate_grouped_inputs(const GroupedGemmArgs& a, const char* op) {
  TESSERA_CHECK(a.in == DType::bf16 || a.in == DType::f16, "{}: input dtype {} not supported (bf16 or f16)", op,
                dtype_name(a.in));
  TESSERA_CHECK(a.groups >= 1 && a.groups <= kGroupedMaxGroups,
                "{}: groups = {} out of range [1, {}] (the kernel's shared-memory group table holds {})", op, a.groups,
                kGroupedMaxGroups, kGroupedMaxGroups);
  TESSERA_CHECK(a.max_rows >= 0 && a.max_rows < kInt31, "{}: max_rows = {} out of range [0, 2^31)", op, a.max_rows);
  TESSERA_CHECK(a.n >= 1 && a.n < kInt31, "{}: N = {} out of range [1, 2^31)", op, a.n);
  TESSERA_CHECK(a.k >= 8 && a.k < kInt31, "{}: K = {} out of range [8, 2^31)", op, a.k);
  TESSERA_CHECK(a.k % 8 == 0, "{}: K = {} must be a multiple of 8 (16-byte rows for TMA)", op, a.k);
  TESSERA_CHECK(a.a != nullptr, "{}: A is null", op);
  TESSERA_CHECK(a.b != nullptr, "{}: B is null", op);
  TESSERA_CHECK(a.group_rows != nullptr, "{}: group_rows is null (device int[G] of row counts)", op);
  TESSERA_CHECK(a.status != nullptr, "{}: status is null (device int[{}]: the kernel reports a bad row table there)",
                op, kGroupedStatusInts);
  TESSERA_CHECK(aligned(a.a, 16), "{}: A = {} is not 16-byte aligned", op, a.a);
  TESSERA_CHECK(aligned(a.b, 16), "{}: B = {} is not 16-byte aligned", op, a.b);
  TESSERA_CHECK(aligned(a.group_rows, 4), "{}: group_rows = {} is not 4-byte aligned", op,
                static_cast<const void*>(a.group_rows));
  TESSERA_CHECK(aligned(a.status, 4), "{}: status = {} is not 4-byte aligned", op, static_cast<const void*>(a.status));
  const int64_t lda = a.lda_or_packed(), ldb = a.ldb_or_packed(), sb = a.stride_b_or_packed();
  TESSERA_CHECK(lda >= a.k && lda % 8 == 0 && lda < kInt31,
                "{}: lda = {} must be >= K = {}, < 2^31 and a multiple of 8", op, lda, a.k);
  const bool nk = a.b_layout == BLayout::NK;
  const int64_t brow = nk ? a.k : a.n, bcount = nk ? a.n : a.k;
  TESSERA_CHECK(ldb >= brow && ldb % 8 == 0 && ldb < kInt31,
                "{}: ldb = {} must be >= {} ({}), < 2^31 and a multiple of 8", op, ldb, brow, layout_name(a.b_layout));
  TESSERA_CHECK(sb >= ldb * bcount && sb % 8 == 0,
                "{}: stride_b = {} must be >= {} (ldb x {} rows of a group's {}) and a multiple of 8", op, sb,
                ldb * bcount, bcount, layout_name(a.b_layout));
  TESSERA_CHECK(sb * 2 < (int64_t{1} << 40), "{}: stride_b = {} elements exceeds TMA's 2^40-byte stride", op, sb);
  if (a.a_gather != nullptr) {
    TESSERA_CHECK(aligned(a.a_gather, 4), "{}: a_gather = {} is not 4-byte aligned", op,
                  static_cast<const void*>(a.a_gather));
    TESSERA_CHECK(a.a_rows >= 1 && a.a_rows < kInt31, "{}: a_rows = {} out of range [1, 2^31) (rows of the gathered A)",
                  op, a.a_rows);
    TESSERA_CHECK(a.a_gather_div >= 1 && a.a_rows * a.a_gather_div < kInt31,
                  "{}: a_gather_div = {} must be >= 1 with a_rows x a_gather_div < 2^31 (int indices)", op,
                  a.a_gather_div);
  }
  const int64_t tiles = grouped_max_tiles(a, TileShape{64, 64});
  TESSERA_CHECK(tiles < kInt31, "{}: up to {} tiles (max_rows = {}, G = {}, N = {}) overflow the schedule's int", op,
                tiles, a.max_rows, a.groups, a.n);
}

void check_output(const GroupedGemmArgs& a, GroupedEpilogueKind e, const char* op) {
  TESSERA_CHECK(a.out == a.in, "{}: output dtype {} must equal the input dtype {} (compiled for out == in)", op,
                dtype_name(a.out), dtype_name(a.in));
  TESSERA_CHECK(a.d != nullptr, "{}: D is null", op);
  TESSERA_CHECK(aligned(a.d, 16), "{}: D = {} is not 16-byte aligned", op, a.d);
  const bool swiglu = e == GroupedEpilogueKind::SwiGLU;
  TESSERA_CHECK(!swiglu || a.n % 2 == 0, "{}: N = {} must be even with the SwiGLU epilogue (gate/up interleaved)", op,
                a.n);
  const int64_t n_out = swiglu ? a.n / 2 : a.n;
  const int64_t ldd = a.ldd ? a.ldd : n_out;
  TESSERA_CHECK(ldd >= n_out && (ldd * static_cast<int64_t>(dtype_size(a.out))) % 16 == 0,
                "{}: ldd = {} must be >= {} (D's columns) and a multiple of 16 bytes", op, ldd, n_out);
}

}  // namespace

namespace detail {

void grouped_check_instantiation(const GroupedGemmArgs& a, BLayout layout, DType in, int max_ctas, bool gather) {
  validate_grouped_inputs(a, "grouped_gemm");
  TESSERA_CHECK(a.b_layout == layout, "grouped_gemm: args.b_layout ({}) does not match the instantiated layout ({})",
                layout_name(a.b_layout), layout_name(layout));
  TESSERA_CHECK(a.in == in, "grouped_gemm: args.in = {} does not match the instantiated input type {}",
                dtype_name(a.in), dtype_name(in));
  TESSERA_CHECK(max_ctas >= 0, "grouped_gemm: max_ctas = {} must be >= 0", max_ctas);
  TESSERA_CHECK((a.a_gather != nullptr) == gather,
                "grouped_gemm: args.a_gather is {} but the instantiated kernel {} the row gather",
                a.a_gather ? "set" : "null", gather ? "expects" : "does not do");
  GemmArgs probe{};  // the engine's device check (sm_90)
  probe.a = a.a;
  probe.b = a.b;
  probe.m = 1;
  probe.n = a.n;
  probe.k = a.k;
  probe.lda = a.lda_or_packed();
  probe.ldb = a.ldb_or_packed();
  probe.in = a.in;
  probe.b_layout = a.b_layout;
  validate_inputs(probe, "grouped_gemm");
}

namespace {
PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    TESSERA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    TESSERA_CHECK(fn != nullptr && q == cudaDriverEntryPointSuccess,
                  "grouped_gemm: cuTensorMapEncodeTiled not found in the driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

void encode(const char* what, const void* base, DType t, int rank, const cuuint64_t* dims, const cuuint64_t* strides,
            const cuuint32_t* box, CUtensorMap* out) {
  const CUtensorMapDataType dt = t == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult rc =
      encoder()(out, dt, rank, const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TESSERA_CHECK(rc == CUDA_SUCCESS, "grouped_gemm: cuTensorMapEncodeTiled for {} failed (CUresult {}): dims {}x{}{}",
                what, static_cast<int>(rc), dims[0], dims[1], rank == 3 ? fmt::format("x{}", dims[2]) : "");
}
}  // namespace

void grouped_make_tma_a(const GroupedGemmArgs& a, int bm, CUtensorMap* out) {
  const int64_t rows = a.a_gather != nullptr ? a.a_rows : a.max_rows;  // gathering: the map is not read
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(a.k), static_cast<cuuint64_t>(std::max<int64_t>(rows, 1))};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(a.lda_or_packed() * 2)};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(bm)};
  encode("A (stacked rows)", a.a, a.in, 2, dims, strides, box, out);
}

void grouped_make_tma_b(const GroupedGemmArgs& a, int bn, CUtensorMap* out) {
  const bool nk = a.b_layout == BLayout::NK;
  const cuuint64_t inner = static_cast<cuuint64_t>(nk ? a.k : a.n), mid = static_cast<cuuint64_t>(nk ? a.n : a.k);
  const cuuint64_t dims[3] = {inner, mid, static_cast<cuuint64_t>(a.groups)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(a.ldb_or_packed() * 2),
                                 static_cast<cuuint64_t>(a.stride_b_or_packed() * 2)};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(nk ? bn : 64), 1};
  encode(nk ? "B [G, N, K]" : "B [G, K, N]", a.b, a.in, 3, dims, strides, box, out);
}

}  // namespace detail

std::string grouped_tile_name(GroupedTile t) {
  switch (t) {
    case GroupedTile::Auto:
      return "auto";
    case GroupedTile::Coop128x256:
      return "128x256";
    case GroupedTile::Coop128x128:
      return "128x128";
    case GroupedTile::PingPong128x128:
      return "128x128/pp";
    case GroupedTile::PingPong64x256:
      return "64x256/pp";
  }
  return "?";
}

TileShape grouped_tile_shape(GroupedTile t) {
  switch (t) {
    case GroupedTile::Coop128x256:
      return {128, 256};
    case GroupedTile::Coop128x128:
    case GroupedTile::PingPong128x128:
      return {128, 128};
    case GroupedTile::PingPong64x256:
      return {64, 256};
    case GroupedTile::Auto:
      break;
  }
  TESSERA_FAIL("grouped_tile_shape: GroupedTile::Auto has no shape; resolve it first (resolve_grouped_tile)");
}

int64_t grouped_max_tiles(const GroupedGemmArgs& a, TileShape s) {
  const int64_t rows = std::max<int64_t>(a.max_rows, 0);
  const int64_t tile_rows = rows / s.bm + std::min<int64_t>(std::max<int64_t>(a.groups, 0), rows);
  return tile_rows * ((std::max<int64_t>(a.n, 1) + s.bn - 1) / s.bn);
}

GroupedTile resolve_grouped_tile([[maybe_unused]] const GroupedGemmArgs& a, const GroupedGemmOptions& o) {
  if (o.tile != GroupedTile::Auto) return o.tile;
  // Measured on nvidia-h200 over the 72 MoE-1..6 expert GEMMs (TP 1, 2, 4;
  // uniform and skewed; docs/design/grouped_gemm.md): the expert GEMMs have
  // short K, so each tile's store is a large share of its time and ping-pong
  // hides it behind the other consumer's main loop; with its band-of-8
  // raster the 64x256 ping-pong tile is within 1.003x of the best
  // configuration in geometric mean at every TP, and the 128-row tiles win
  // nowhere by more than a few percent. The row gather's cp.async producer
  // keeps a 64-row tile fed at the TMA kernels' speed but not a 128-row one.
  return GroupedTile::PingPong64x256;
}

void validate(const GroupedGemmArgs& a, const GroupedGemmOptions& o) {
  validate_grouped_inputs(a, "grouped_gemm");
  check_output(a, o.epilogue, "grouped_gemm");
  TESSERA_CHECK(o.max_ctas >= 0, "grouped_gemm: max_ctas = {} must be >= 0", o.max_ctas);
  TESSERA_CHECK(o.raster_band >= -1 && o.raster_band <= 64, "grouped_gemm: raster_band = {} out of range [-1, 64]",
                o.raster_band);
  TESSERA_CHECK(a.in == DType::bf16,
                "grouped_gemm: input dtype {} is not compiled for grouped_gemm() (bf16; f16 "
                "through grouped_gemm_with_tile)",
                dtype_name(a.in));
  TESSERA_CHECK(a.a_gather == nullptr || (a.b_layout == BLayout::NK && o.epilogue == GroupedEpilogueKind::SwiGLU),
                "grouped_gemm: the row gather of A (a_gather) is compiled for B as NK with the SwiGLU epilogue "
                "only (got B {}, {} epilogue)",
                layout_name(a.b_layout), o.epilogue == GroupedEpilogueKind::SwiGLU ? "SwiGLU" : "plain");
}

void grouped_gemm(const GroupedGemmArgs& a, const GroupedGemmOptions& o, cudaStream_t stream) {
  validate(a, o);
  const GroupedTile t = resolve_grouped_tile(a, o);
  const bool nk = a.b_layout == BLayout::NK;
  if (a.a_gather != nullptr)
    detail::grouped_gemm_bf16_nk_swiglu_gather(t, a, o, stream);
  else if (o.epilogue == GroupedEpilogueKind::SwiGLU)
    nk ? detail::grouped_gemm_bf16_nk_swiglu(t, a, o, stream) : detail::grouped_gemm_bf16_kn_swiglu(t, a, o, stream);
  else
    nk ? detail::grouped_gemm_bf16_nk_plain(t, a, o, stream) : detail::grouped_gemm_bf16_kn_plain(t, a, o, stream);
}

std::string GroupedGemmStatus::message() const {
  switch (code) {
    case 0:
      return fmt::format("ok ({} rows)", value);
    case 1:
      return fmt::format("group_rows[{}] = {} is negative; nothing was computed", group, value);
    case 2:
      return fmt::format(
          "the groups' rows sum to {}, above the max_rows bound the call was given; nothing was computed", value);
  }
  return fmt::format("unknown status code {} (group {}, value {})", code, group, value);
}

GroupedGemmStatus grouped_gemm_status(const int* status, cudaStream_t stream) {
  TESSERA_CHECK(status != nullptr, "grouped_gemm_status: status is null");
  int w[kGroupedStatusInts] = {};
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(w, status, sizeof(w), cudaMemcpyDeviceToHost, stream));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  GroupedGemmStatus s;
  s.code = w[0];
  s.group = w[1];
  s.value =
      static_cast<int64_t>((static_cast<uint64_t>(static_cast<uint32_t>(w[3])) << 32) | static_cast<uint32_t>(w[2]));
  return s;
}

void check_grouped_gemm_status(const int* status, cudaStream_t stream, const char* op) {
  const GroupedGemmStatus s = grouped_gemm_status(status, stream);
  TESSERA_CHECK(s.ok(), "{}: {}", op, s.message());
}

}  // namespace tessera::kernels
