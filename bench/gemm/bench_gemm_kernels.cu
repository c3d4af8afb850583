#include "gemm/bench_gemm_kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tessera/kernels/gemm/launch.cuh"
#include "tessera/runtime/wait_diagnostics.hpp"

namespace tessera::bench::gemm {
namespace {
__global__ void fill_kernel(uint16_t* p, int64_t n, bool bf16, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t x = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    const float u = static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f;
    if (bf16) {
      const __nv_bfloat16 h = __float2bfloat16_rn(u);
      p[i] = *reinterpret_cast<const uint16_t*>(&h);
    } else {
      const __half h = __float2half_rn(u);
      p[i] = *reinterpret_cast<const uint16_t*>(&h);
    }
  }
}
// The pre-memo FlagWait: a stateless prologue, so the kernel proxy-fences
// after every tile, and one ld.acquire per flag per tile (on the producer's
// waiter thread, like the memoized FlagWait).
struct PerTileWait {
  static constexpr bool kActive = true;
  kernels::engine::FlagWait<uint32_t, false> w;
  __device__ __forceinline__ void wait(const kernels::engine::TileInfo& t) const {
    const int last = min(t.row0 + t.bm, t.M) - 1;
    for (int f = t.row0 / w.rows_per_flag; f <= last / w.rows_per_flag; ++f) w.wait_one(t, f);
  }
};
}  // namespace

void fill_random(void* p, int64_t n, DType t, uint64_t seed, cudaStream_t s) {
  fill_kernel<<<1024, 256, 0, s>>>(static_cast<uint16_t*>(p), n, t == DType::bf16, seed);
  kernels::detail::check_launch("bench gemm: fill_random");
}

void gemm_idle_hooks(Hooks which, const kernels::GemmArgs& a, const kernels::GemmOptions& o,
                     const uint32_t* ready_flags, uint32_t epoch, uint32_t* tile_counters, cudaStream_t s) {
  using namespace kernels;
  if (a.b_layout != BLayout::NK || a.in != DType::bf16 || a.out != DType::bf16)
    detail::fail("bench gemm hooks: compiled for bf16, B [N, K] only");
  engine::FlagWait<uint32_t, false> w;
  w.flags = ready_flags;
  w.expected = epoch;
  w.rows_per_flag = 128;
  w.diag = runtime::process_wait_diagnostics().device_record();
  PerTileWait pw;
  pw.w = w;
  engine::StdEpilogue<__nv_bfloat16, engine::kEpiNotify> e;
  e.d = static_cast<__nv_bfloat16*>(a.d);
  e.ldd = a.ldd_or_packed();
  e.flags = tile_counters;
  engine::StdEpilogue<__nv_bfloat16> plain;
  plain.d = e.d;
  plain.ldd = e.ldd;
  // Hooks on the kernel the plain gemm() would run for these options.
  if (o.ping_pong || plain_uses_ping_pong(a, o)) {
    GemmOptions po = o;
    po.ping_pong = true;
    po.tile = o.ping_pong ? resolve_tile(a, po) : GemmTile::T64x256;
    switch (which) {
      case Hooks::Both:
        return gemm_with<PingPongTiles, __nv_bfloat16, BLayout::NK>(a, po, w, e, raster_from(o), s);
      case Hooks::WaitOnly:
        return gemm_with<PingPongTiles, __nv_bfloat16, BLayout::NK>(a, po, w, plain, raster_from(o), s);
      case Hooks::NotifyOnly:
        return gemm_with<PingPongTiles, __nv_bfloat16, BLayout::NK>(a, po, engine::NoWait{}, e, raster_from(o), s);
      case Hooks::WaitPerTile:
        return gemm_with<PingPongTiles, __nv_bfloat16, BLayout::NK>(a, po, pw, plain, raster_from(o), s);
    }
  }
  switch (which) {
    case Hooks::Both:
      return gemm_with<CooperativeTiles, __nv_bfloat16, BLayout::NK>(a, o, w, e, raster_from(o), s);
    case Hooks::WaitOnly:
      return gemm_with<CooperativeTiles, __nv_bfloat16, BLayout::NK>(a, o, w, plain, raster_from(o), s);
    case Hooks::NotifyOnly:
      return gemm_with<CooperativeTiles, __nv_bfloat16, BLayout::NK>(a, o, engine::NoWait{}, e, raster_from(o), s);
    case Hooks::WaitPerTile:
      return gemm_with<CooperativeTiles, __nv_bfloat16, BLayout::NK>(a, o, pw, plain, raster_from(o), s);
  }
}

}  // namespace tessera::bench::gemm
