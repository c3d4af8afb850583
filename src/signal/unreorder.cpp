// Argument validation of the un-reorder kernels (unreorder.hpp); the kernels
// are in unreorder.cu.
#include "tessera/signal/unreorder.hpp"

#include <cstdint>

#include "tessera/runtime/error.hpp"
#include "unreorder_launch.hpp"

namespace tessera::signal {
namespace {

void check_device_pointer(const void* p, const char* op, const char* what) {
  TESSERA_CHECK(p != nullptr, "{}: {} is null", op, what);
  TESSERA_CHECK(reinterpret_cast<std::uintptr_t>(p) % 16 == 0, "{}: {} = {} is not 16-byte aligned", op, what, p);
  cudaPointerAttributes a{};
  TESSERA_CUDA_CHECK(cudaPointerGetAttributes(&a, p));
  TESSERA_CHECK(a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged,
                "{}: {} = {} is not device memory (cudaMemoryType {})", op, what, p, static_cast<int>(a.type));
}

template <class Map>
void check_common(const Map& map, const void* recv, const void* out, std::int64_t ld_out, DType dtype, const char* op) {
  const std::int64_t v = 16 / static_cast<std::int64_t>(dtype_size(dtype));
  TESSERA_CHECK(map.cols() > 0 && map.rows() >= 0, "{}: bad output shape {}x{}", op, map.rows(), map.cols());
  TESSERA_CHECK(map.cols() % v == 0, "{}: N = {} is not a multiple of {} {} elements (16 bytes)", op, map.cols(), v,
                dtype_name(dtype));
  TESSERA_CHECK(map.chunk_width() % v == 0, "{}: tile width {} is not a multiple of {} {} elements (16 bytes)", op,
                map.chunk_width(), v, dtype_name(dtype));
  TESSERA_CHECK(ld_out >= map.cols() && ld_out % v == 0,
                "{}: output row stride {} must be >= N = {} and a multiple of {} elements", op, ld_out, map.cols(), v);
  check_device_pointer(recv, op, "received buffer");
  check_device_pointer(out, op, "output");
}

int current_sms() {
  int dev = 0, sms = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

void check_map_tables(const ArMap&, const char*) {}
void check_map_tables(const RsShard& s, const char* op) {
  TESSERA_CHECK(s.rank >= 0 && s.rank < s.map.ranks, "{}: rank {} outside [0, {})", op, s.rank, s.map.ranks);
}
void check_map_tables(const RowMajorMap& m, const char* op) {
  TESSERA_CHECK(m.ld >= m.n && m.ld % 8 == 0, "{}: input row stride {} must be >= N = {} and a multiple of 8", op, m.ld,
                m.n);
}
void check_map_tables(const A2aRecvMap& m, const char* op) {
  if (m.out_rows > 0) check_device_pointer(m.chunk_src, op, "A2aRecvMap::chunk_src table");
}

template <class Map>
void unreorder_any(const Map& map, const void* recv, void* out, std::int64_t ld_out, DType dtype, cudaStream_t stream) {
  constexpr const char* op = "signal::unreorder";
  check_common(map, recv, out, ld_out, dtype, op);
  check_map_tables(map, op);
  // The maps' chunk_offset uses 32-bit row math (reorder.hpp).
  TESSERA_CHECK(map.rows() < (std::int64_t(1) << 31) && map.cols() < (std::int64_t(1) << 31),
                "{}: {}x{} outside the kernel's limits (rows and N < 2^31)", op, map.rows(), map.cols());
  TESSERA_CUDA_CHECK(detail::launch_unreorder(map, recv, out, ld_out, dtype, current_sms(), stream));
}

template <class Map>
void rmsnorm_any(const Map& map, const void* recv, const void* weight, void* out, std::int64_t ld_out, float eps,
                 DType dtype, cudaStream_t stream) {
  constexpr const char* op = "signal::rmsnorm_unreorder";
  TESSERA_CHECK(dtype == DType::bf16 || dtype == DType::f16, "{}: dtype {} unsupported (bf16 or f16)", op,
                dtype_name(dtype));
  TESSERA_CHECK(eps >= 0.f, "{}: eps must be >= 0, got {}", op, eps);
  check_common(map, recv, out, ld_out, dtype, op);
  check_device_pointer(weight, op, "weight");
  check_map_tables(map, op);
  // Rows are CTA-uniform work items with two rows' chunk offsets in shared
  // memory (unreorder.cu).
  TESSERA_CHECK(map.rows() < (std::int64_t(1) << 31) && map.cols() < (std::int64_t(1) << 31),
                "{}: {}x{} outside the kernel's limits (rows and N < 2^31)", op, map.rows(), map.cols());
  const std::int64_t chunks = (map.cols() + map.chunk_width() - 1) / map.chunk_width();
  TESSERA_CHECK(chunks * 16 <= 48 * 1024,
                "{}: {} chunks of width {} per row exceed the 48 KiB of two rows' chunk tables", op, chunks,
                map.chunk_width());
  TESSERA_CUDA_CHECK(
      detail::launch_rmsnorm_unreorder(map, recv, weight, out, ld_out, eps, dtype, current_sms(), stream));
}

}  // namespace

void unreorder(const ArMap& m, const void* r, void* o, std::int64_t ld, DType t, cudaStream_t s) {
  unreorder_any(m, r, o, ld, t, s);
}
void unreorder(const RsShard& m, const void* r, void* o, std::int64_t ld, DType t, cudaStream_t s) {
  unreorder_any(m, r, o, ld, t, s);
}
void unreorder(const A2aRecvMap& m, const void* r, void* o, std::int64_t ld, DType t, cudaStream_t s) {
  unreorder_any(m, r, o, ld, t, s);
}
void unreorder(const RowMajorMap& m, const void* r, void* o, std::int64_t ld, DType t, cudaStream_t s) {
  unreorder_any(m, r, o, ld, t, s);
}

void rmsnorm_unreorder(const ArMap& m, const void* r, const void* w, void* o, std::int64_t ld, float eps, DType t,
                       cudaStream_t s) {
  rmsnorm_any(m, r, w, o, ld, eps, t, s);
}
void rmsnorm_unreorder(const RsShard& m, const void* r, const void* w, void* o, std::int64_t ld, float eps, DType t,
                       cudaStream_t s) {
  rmsnorm_any(m, r, w, o, ld, eps, t, s);
}
void rmsnorm_unreorder(const A2aRecvMap& m, const void* r, const void* w, void* o, std::int64_t ld, float eps, DType t,
                       cudaStream_t s) {
  rmsnorm_any(m, r, w, o, ld, eps, t, s);
}
void rmsnorm_unreorder(const RowMajorMap& m, const void* r, const void* w, void* o, std::int64_t ld, float eps, DType t,
                       cudaStream_t s) {
  rmsnorm_any(m, r, w, o, ld, eps, t, s);
}

}  // namespace tessera::signal
