// Policy instantiations and helper kernels for the GEMM tests (see .hpp).
#include "tessera/link/memory_order.cuh"
#include "gemm_policy_kernels.hpp"

#include <cuda_bf16.h>

#include "tessera/kernels/gemm/launch.cuh"
#include "tessera/runtime/wait_diagnostics.hpp"

namespace tessera::kernels::testk {
namespace {
using bf16 = __nv_bfloat16;
using engine::StdEpilogue;

template <unsigned F>
StdEpilogue<bf16, F> epi_for(const GemmArgs& a) {
  StdEpilogue<bf16, F> e;
  e.d = static_cast<bf16*>(a.d);
  e.ldd = a.ldd_or_packed();
  return e;
}

template <class Pro, class Epi, class Sched>
void run(const GemmArgs& a, GemmTile t, int max_ctas, const Pro& pro, const Epi& epi, const Sched& sched,
         cudaStream_t s, int cluster = 1) {
  GemmOptions o;
  o.tile = t;
  o.max_ctas = max_ctas;
  // Two cooperative tiles compiled for policy tests: enough to exercise 1 and
  // 2 wgmma atoms per consumer; 2-CTA clusters for the 128x256 tile. T128x128
  // means the ping-pong kernel (ping_pong; 2 atoms per consumer).
  if (t == GemmTile::T128x128) {
    if (cluster != 1) detail::fail("policy test: the ping-pong kernel has no clusters");
    o.ping_pong = true;
    gemm_with<PingPong<GemmTile::T128x128>, bf16, BLayout::NK>(a, o, pro, epi, sched, s);
  } else if (t == GemmTile::T256x128) {
    gemm_with<Cooperative<GemmTile::T256x128>, bf16, BLayout::NK>(a, o, pro, epi, sched, s);
  } else if (t == GemmTile::T128x256) {
    if (cluster == 2)
      gemm_with<Cooperative<GemmTile::T128x256, 2>, bf16, BLayout::NK>(a, o, pro, epi, sched, s);
    else
      gemm_with<Cooperative<GemmTile::T128x256>, bf16, BLayout::NK>(a, o, pro, epi, sched, s);
  } else {
    detail::fail("policy test: tile " + tile_name(t) + " not compiled here");
  }
}
}  // namespace

void gemm_permuted(const GemmArgs& a, GemmTile t, const int* d_order, int max_ctas, cudaStream_t s) {
  run(a, t, max_ctas, engine::NoWait{}, epi_for<engine::kEpiPlain>(a), engine::PermutedScheduler{d_order}, s);
}

void gemm_flag_wait(const GemmArgs& a, GemmTile t, const uint32_t* flags, int rows_per_flag, uint32_t expected,
                    uint64_t timeout_ns, int max_ctas, cudaStream_t s, int cluster) {
  engine::FlagWait<uint32_t, false> w;
  w.flags = flags;
  w.expected = expected;
  w.rows_per_flag = rows_per_flag;
  w.timeout_ns = timeout_ns;
  w.diag = runtime::process_wait_diagnostics().device_record();
  run(a, t, max_ctas, w, epi_for<engine::kEpiPlain>(a), engine::RasterScheduler{}, s, cluster);
}

void gemm_notify(const GemmArgs& a, GemmTile t, uint32_t* flags, const int* tile_to_flag, int max_ctas, cudaStream_t s,
                 int cluster) {
  auto e = epi_for<engine::kEpiNotify>(a);
  e.flags = flags;
  e.tile_to_flag = tile_to_flag;
  run(a, t, max_ctas, engine::NoWait{}, e, engine::RasterScheduler{}, s, cluster);
}

void gemm_reorder(const GemmArgs& a, GemmTile t, const int* reorder, cudaStream_t s) {
  auto e = epi_for<engine::kEpiReorder>(a);
  e.reorder = reorder;
  run(a, t, 0, engine::NoWait{}, e, engine::RasterScheduler{}, s);
}

void gemm_add_partial(const GemmArgs& a, GemmTile t, const void* c, int64_t ldc, cudaStream_t s) {
  auto e = epi_for<engine::kEpiAddPartial>(a);
  e.c = static_cast<const bf16*>(c);
  e.ldc = ldc;
  run(a, t, 0, engine::NoWait{}, e, engine::RasterScheduler{}, s);
}

void gemm_bias(const GemmArgs& a, GemmTile t, const void* bias, cudaStream_t s) {
  auto e = epi_for<engine::kEpiBias>(a);
  e.bias = static_cast<const bf16*>(bias);
  run(a, t, 0, engine::NoWait{}, e, engine::RasterScheduler{}, s);
}

void gemm_swiglu(const GemmArgs& a, GemmTile t, cudaStream_t s) {
  run(a, t, 0, engine::NoWait{}, epi_for<engine::kEpiSwiGLU>(a), engine::RasterScheduler{}, s);
}

void gemm_peer_notify_sys(const GemmArgs& a, GemmTile t, uint32_t* flags, cudaStream_t s) {
  auto e = epi_for<engine::kEpiNotifySys>(a);
  e.flags = flags;
  run(a, t, 0, engine::NoWait{}, e, engine::RasterScheduler{}, s);
}

namespace {
__global__ void release_chunks_kernel(const bf16* src, bf16* dst, int64_t m, int64_t k, int64_t ld, int rows,
                                      uint32_t* flags, uint32_t value, uint64_t delay_ns) {
  // One block does it all, chunk by chunk, so later chunks are released later.
  const uint64_t start = tessera::link::mo::globaltimer_ns();
  if (threadIdx.x == 0)
    while (tessera::link::mo::globaltimer_ns() - start < delay_ns) __nanosleep(1000);
  __syncthreads();
  const int chunks = static_cast<int>((m + rows - 1) / rows);
  for (int c = 0; c < chunks; ++c) {
    const int64_t r0 = static_cast<int64_t>(c) * rows, r1 = (m < r0 + rows ? m : r0 + rows);
    for (int64_t i = r0 * k + threadIdx.x; i < r1 * k; i += blockDim.x) {
      const int64_t r = i / k, col = i % k;
      dst[r * ld + col] = src[r * ld + col];
    }
    __syncthreads();  // every thread's stores happen-before thread 0's release (CTA barrier + cumulativity)
    if (threadIdx.x == 0) {
      __threadfence();
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flags + c), "r"(value) : "memory");
    }
    __syncthreads();
  }
}

__global__ void observe_tiles_kernel(const uint32_t* flags, uint32_t expected, const bf16* d, bf16* copy, int64_t m,
                                     int64_t n, int64_t ldd, int bm, int bn, uint64_t timeout_ns, int* status) {
  const int tiles_m = static_cast<int>((m + bm - 1) / bm), tiles_n = static_cast<int>((n + bn - 1) / bn);
  __shared__ int ok;
  for (int t = blockIdx.x; t < tiles_m * tiles_n; t += gridDim.x) {
    if (threadIdx.x == 0) {
      ok = 1;
      const uint64_t start = tessera::link::mo::globaltimer_ns();
      while (tessera::link::mo::ld_acquire_gpu(flags + t) < expected) {
        if (tessera::link::mo::globaltimer_ns() - start > timeout_ns) {
          ok = 0;
          atomicExch(status, 1);
          break;
        }
      }
    }
    __syncthreads();  // orders thread 0's acquire before the other threads' loads
    if (!ok) return;
    const int tm = t / tiles_n, tn = t % tiles_n;
    for (int i = threadIdx.x; i < bm * bn; i += blockDim.x) {
      const int64_t r = static_cast<int64_t>(tm) * bm + i / bn, c = static_cast<int64_t>(tn) * bn + i % bn;
      if (r < m && c < n) copy[r * ldd + c] = d[r * ldd + c];
    }
    __syncthreads();
  }
}
}  // namespace

void preload_helpers() {
  cudaFuncAttributes attr;
  detail::cuda_check(cudaFuncGetAttributes(&attr, release_chunks_kernel), "preload release_chunks_kernel");
  detail::cuda_check(cudaFuncGetAttributes(&attr, observe_tiles_kernel), "preload observe_tiles_kernel");
}

void release_chunks(const void* src, void* dst, int64_t m, int64_t k, int64_t ld, int rows, uint32_t* flags,
                    uint32_t value, uint64_t delay_ns, cudaStream_t s) {
  release_chunks_kernel<<<1, 512, 0, s>>>(static_cast<const bf16*>(src), static_cast<bf16*>(dst), m, k, ld, rows, flags,
                                          value, delay_ns);
  detail::check_launch("release_chunks");
}

void observe_tiles(const uint32_t* flags, uint32_t expected, const void* d, void* copy, int64_t m, int64_t n,
                   int64_t ldd, int bm, int bn, uint64_t timeout_ns, int* status, int blocks, cudaStream_t s) {
  observe_tiles_kernel<<<blocks, 256, 0, s>>>(flags, expected, static_cast<const bf16*>(d), static_cast<bf16*>(copy), m,
                                              n, ldd, bm, bn, timeout_ns, status);
  detail::check_launch("observe_tiles");
}

}  // namespace tessera::kernels::testk
