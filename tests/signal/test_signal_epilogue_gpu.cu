// GPU test of the signal epilogues on the real GEMM engine: the GEMM writes
// its tiles into wave-group buffers (AllReduce, ReduceScatter, All-to-All
// layouts) and bumps the group counters. Every element read back through
// the maps must equal the engine's plain GEMM output bit for bit (same
// kernel and accumulation, only the addresses differ), padding must stay
// poisoned, and each counter must end at epoch * tiles of its group.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "support/test_support.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/gemm/launch.cuh"
#include "tessera/signal/a2a.hpp"
#include "tessera/signal/epilogue.cuh"
#include "tessera/signal/epilogue_tables.hpp"

using namespace tessera;
using namespace tessera::signal;
namespace eng = tessera::kernels::engine;
using bf16 = __nv_bfloat16;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

namespace {

constexpr int kSms = 100;  // GEMM CTAs: the SMs NCCL would leave free (any cap works)

struct Problem {
  std::int64_t m, n, k;
  int swizzle;
  bool along_m;
};

std::vector<unsigned short> random_bf16(std::int64_t n, std::mt19937_64& g) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<unsigned short> v(n);
  for (auto& x : v) {
    __nv_bfloat16_raw r = __float2bfloat16_rn(d(g));
    x = r.x;
  }
  return v;
}

template <class T>
T* upload(const std::vector<T>& v) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<std::size_t>(v.size(), 1) * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}

template <class T>
std::vector<T> download(const T* p, std::int64_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

struct GemmCase {
  kernels::GemmArgs args;
  kernels::GemmOptions opts;
  std::vector<unsigned short> ref;  // the engine's plain output
  void* a = nullptr;
  void* b = nullptr;
};

GemmCase make(const Problem& p, std::mt19937_64& g) {
  GemmCase s;
  auto ha = random_bf16(p.m * p.k, g), hb = random_bf16(p.n * p.k, g);
  s.a = upload(ha);
  s.b = upload(hb);
  s.args.a = s.a;
  s.args.b = s.b;
  s.args.m = p.m;
  s.args.n = p.n;
  s.args.k = p.k;
  s.opts.tile = kernels::GemmTile::T128x128;
  s.opts.max_ctas = kSms;
  s.opts.raster_group = p.swizzle;
  s.opts.raster_along_m = p.along_m;
  unsigned short* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, p.m * p.n * 2), cudaSuccess);
  s.args.d = d;
  kernels::gemm(s.args, s.opts, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  s.ref = download(d, p.m * p.n);
  cudaFree(d);
  return s;
}

eng::RasterScheduler sched(const Problem& p) { return eng::RasterScheduler{p.swizzle, p.along_m, 0}; }

const std::vector<Problem> kProblems = {
    {1000, 776, 256, 2, false}, {2048, 1024, 512, 8, false}, {777, 1288, 128, 3, true}};

}  // namespace

TEST(SignalEpilogueGpu, AllReduceAndReduceScatterLayouts) {
  TESSERA_REQUIRE_GPUS(1);
  std::mt19937_64 g(std::random_device{}());
  for (const Problem& p : kProblems) {
    GemmCase s = make(p, g);
    const WaveModel wm(GemmTiling{p.m, p.n, 128, 128}, kSms, p.swizzle, p.along_m ? Raster::AlongM : Raster::AlongN);
    for (const GroupPlan& plan : {GroupPlan::single(wm), GroupPlan::per_wave(wm)}) {
      for (int R : {1, 2, 4}) {
        const bool ar = R == 1;
        const ArMap am = make_ar_map(wm);
        const RsMap rm = make_rs_map(wm, ar ? 2 : R);
        const EpilogueTables t = ar ? epilogue_tables(wm, plan, am) : epilogue_tables(wm, plan, rm);
        const DeviceEpilogueTables dt(t);
        const std::int64_t elems = am.buffer_elems();
        unsigned short* buf = nullptr;
        std::uint32_t* counters = nullptr;
        CUDA_OK(cudaMalloc(&buf, elems * 2));
        CUDA_OK(cudaMemset(buf, 0xFF, elems * 2));  // NaN poison
        CUDA_OK(cudaMalloc(&counters, plan.groups() * 4));
        CUDA_OK(cudaMemset(counters, 0, plan.groups() * 4));
        const auto epi = GroupEpilogue<bf16>::to_params(s.args, s.opts, {buf, &dt, counters});
        for (int epoch = 1; epoch <= 2; ++epoch)  // counters are not reset between calls
          kernels::gemm_with<kernels::Cooperative<kernels::GemmTile::T128x128>, bf16, kernels::BLayout::NK>(
              s.args, s.opts, eng::NoWait{}, epi, sched(p), nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        const auto got = download(buf, elems);
        const auto cnt = download(counters, plan.groups());
        std::int64_t bad = 0, written = 0;
        for (std::int64_t o = 0; o < elems; ++o) {
          const Element e = ar ? am.element_at(o) : rm.send_element_at(o, plan.host_view());
          if (e.valid) {
            bad += got[o] != s.ref[e.i * p.n + e.j];
            ++written;
          } else {
            bad += got[o] != 0xFFFF;  // padding untouched
          }
        }
        EXPECT_EQ(written, p.m * p.n);
        EXPECT_EQ(bad, 0) << (ar ? "AR" : "RS") << " R=" << R << " plan " << plan.str() << " M=" << p.m;
        for (int k = 0; k < plan.groups(); ++k) EXPECT_EQ(cnt[k], plan.counter_target(k, 2)) << "group " << k;
        cudaFree(buf);
        cudaFree(counters);
      }
    }
    cudaFree(s.a);
    cudaFree(s.b);
  }
}

TEST(SignalEpilogueGpu, AllToAllPools) {
  TESSERA_REQUIRE_GPUS(1);
  std::mt19937_64 g(std::random_device{}());
  for (const Problem& p : kProblems) {
    GemmCase s = make(p, g);
    const int R = 4;
    // This rank's rows route unevenly; other ranks only need a row each.
    std::vector<std::vector<int>> dest(R, std::vector<int>(1, 0));
    dest[0].resize(p.m);
    for (auto& d : dest[0])
      d = std::uniform_int_distribution<int>(0, 9)(g) < 6 ? 3 : std::uniform_int_distribution<int>(0, 2)(g);
    const Raster raster = p.along_m ? Raster::AlongM : Raster::AlongN;
    std::vector<std::vector<int>> parts(R, std::vector<int>{1});
    const WaveModel wm(GemmTiling{p.m, p.n, 128, 128}, kSms, p.swizzle, raster);
    parts[0] = {wm.waves()};
    const A2aPlan plan(p.n, 128, 128, kSms, p.swizzle, raster, dest, parts);
    int* d_dest = upload(plan.dest(0));
    int* d_slot = upload(plan.row_slot(0));
    std::int64_t* d_tpo = upload(plan.tile_pool_offset(0));
    std::int64_t* d_pb = upload(plan.pool_base(0));
    int* d_groups = upload(tile_groups(plan.model(0), plan.plan(0)));
    A2aSendMap map = plan.send_map(0);
    map.dest = d_dest;
    map.row_slot = d_slot;
    map.tile_pool_offset = d_tpo;
    map.pool_base = d_pb;
    const std::int64_t elems = plan.send_elems(0);
    unsigned short* buf = nullptr;
    std::uint32_t* counters = nullptr;
    CUDA_OK(cudaMalloc(&buf, elems * 2));
    CUDA_OK(cudaMemset(buf, 0xFF, elems * 2));
    CUDA_OK(cudaMalloc(&counters, 4));
    CUDA_OK(cudaMemset(counters, 0, 4));
    A2aEpilogue<bf16> epi{reinterpret_cast<bf16*>(buf), map, d_groups, counters};
    kernels::gemm_with<kernels::Cooperative<kernels::GemmTile::T128x128>, bf16, kernels::BLayout::NK>(
        s.args, s.opts, eng::NoWait{}, epi, sched(p), nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = download(buf, elems);
    const A2aSendMap hmap = plan.send_map(0);
    std::int64_t bad = 0;
    for (std::int64_t i = 0; i < p.m; ++i)
      for (std::int64_t j = 0; j < p.n; ++j) bad += got[hmap.offset(i, j)] != s.ref[i * p.n + j];
    EXPECT_EQ(bad, 0) << "A2A M=" << p.m;
    EXPECT_EQ(download(counters, 1)[0], std::uint32_t(wm.tiles()));
    for (void* q : {(void*)d_dest, (void*)d_slot, (void*)d_tpo, (void*)d_pb, (void*)d_groups, (void*)buf,
                    (void*)counters, s.a, s.b})
      cudaFree(q);
  }
}
