// Standalone development harness for the grouped GEMM (not part of the
// build): correctness against an f32 reference and timings of every
// configuration, the per-expert cuBLASLt loop and one dense GEMM of the same
// FLOPs, on the MoE expert GEMMs. Built by scripts/grouped_harness.sh.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <atomic>
#include <chrono>
#include <thread>
#include <unistd.h>
#include <string>
#include <vector>

#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/grouped_gemm.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::detail {
[[noreturn]] void throw_error(std::string_view file, int line, std::string_view msg) {
  throw Error(std::string(file) + ":" + std::to_string(line) + " " + std::string(msg));
}
[[noreturn]] void throw_cuda_error(std::string_view file, int line, std::string_view expr, int code) {
  throw Error(std::string(file) + ":" + std::to_string(line) + " " + std::string(expr) + ": " +
              cudaGetErrorString(static_cast<cudaError_t>(code)));
}
[[noreturn]] void throw_nccl_error(std::string_view file, int line, std::string_view expr, int code) {
  throw Error("nccl");
}
int current_rank() noexcept { return -1; }
}  // namespace tessera::detail

namespace tessera::kernels::detail {
void gemm_plain_bf16_nk(const GemmArgs&, const GemmOptions&, cudaStream_t);
}
using namespace tessera;
using namespace tessera::kernels;

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

__global__ void fill_rand(__nv_bfloat16* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t x = (uint32_t)i * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    p[i] = __float2bfloat16(((x & 0xffff) / 65536.0f - 0.5f) * scale);
  }
}
__global__ void fill_u16(uint16_t* p, size_t n, uint16_t v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}
// Reference: D[r, c] for group rows, f32.
__global__ void ref_kernel(const __nv_bfloat16* A, const __nv_bfloat16* B, float* D, const int* row_group, int rows,
                           int N, int K, int lda, int ldb, long long sb, bool kn) {
  int r = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows || c >= N) return;
  int g = row_group[r];
  const __nv_bfloat16* Bg = B + sb * g;
  float acc = 0;
  for (int k = 0; k < K; ++k) {
    float b = kn ? __bfloat162float(Bg[(size_t)k * ldb + c]) : __bfloat162float(Bg[(size_t)c * ldb + k]);
    acc += __bfloat162float(A[(size_t)r * lda + k]) * b;
  }
  D[(size_t)r * N + c] = acc;
}

static float bf2f(uint16_t u) {
  uint32_t x = (uint32_t)u << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

struct Case {
  std::vector<int> rows;
  int n, k, max_rows;
  BLayout layout;
  GroupedEpilogueKind epi;
  GroupedTile tile;
  int max_ctas = 0;
};

static int failures = 0;

static void run_case(const Case& c, const char* name) {
  const int G = (int)c.rows.size();
  long long total = 0;
  bool neg = false;
  for (int r : c.rows) {
    total += std::max(r, 0);
    neg |= r < 0;
  }
  const int MR = c.max_rows;
  const bool nk = c.layout == BLayout::NK;
  const bool sw = c.epi == GroupedEpilogueKind::SwiGLU;
  const int nout = sw ? c.n / 2 : c.n;
  __nv_bfloat16 *A, *B, *D;
  float* R;
  int *rows, *status, *row_group;
  const size_t asz = (size_t)std::max(MR, 1) * c.k, bsz = (size_t)G * c.n * c.k, dsz = (size_t)std::max(MR, 1) * nout;
  CK(cudaMalloc(&A, asz * 2));
  CK(cudaMalloc(&B, bsz * 2));
  CK(cudaMalloc(&D, dsz * 2));
  CK(cudaMalloc(&R, std::max<size_t>(1, (size_t)std::max(MR, 1) * c.n) * 4));
  CK(cudaMalloc(&rows, G * 4));
  CK(cudaMalloc(&status, 16));
  CK(cudaMalloc(&row_group, std::max(MR, 1) * 4));
  fill_rand<<<256, 256>>>(A, asz, 1234 + G, 2.0f);
  fill_rand<<<256, 256>>>(B, bsz, 777 + c.n, 2.0f);
  fill_u16<<<256, 256>>>((uint16_t*)D, dsz, 0x7fc1);  // NaN poison
  CK(cudaMemcpy(rows, c.rows.data(), G * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(status, 0x55, 16));
  std::vector<int> rg;
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < std::max(c.rows[g], 0); ++i) rg.push_back(g);
  if (!rg.empty() && (long long)rg.size() <= MR)
    CK(cudaMemcpy(row_group, rg.data(), rg.size() * 4, cudaMemcpyHostToDevice));
  GroupedGemmArgs a;
  a.a = A;
  a.b = B;
  a.d = D;
  a.group_rows = rows;
  a.status = status;
  a.groups = G;
  a.n = c.n;
  a.k = c.k;
  a.max_rows = MR;
  a.b_layout = c.layout;
  GroupedGemmOptions o;
  o.tile = c.tile;
  o.epilogue = c.epi;
  o.max_ctas = c.max_ctas;
  try {
    grouped_gemm(a, o, nullptr);
  } catch (const std::exception& e) {
    printf("FAIL %s: threw %s\n", name, e.what());
    ++failures;
    return;
  }
  CK(cudaDeviceSynchronize());
  GroupedGemmStatus st = grouped_gemm_status(status, nullptr);
  const bool expect_bad = neg || total > MR;
  std::vector<uint16_t> hd(dsz);
  CK(cudaMemcpy(hd.data(), D, dsz * 2, cudaMemcpyDeviceToHost));
  if (expect_bad) {
    bool untouched = true;
    for (auto v : hd) untouched &= v == 0x7fc1;
    bool ok = !st.ok() && untouched;
    printf("%s %s: status %d (%s), D untouched %d\n", ok ? "ok  " : "FAIL", name, st.code, st.message().c_str(),
           untouched);
    failures += !ok;
  } else {
    if (total > 0) {
      dim3 grid((c.n + 127) / 128, (unsigned)total);
      ref_kernel<<<grid, 128>>>(A, B, R, row_group, (int)total, c.n, c.k, c.k, nk ? c.k : c.n, (long long)c.n * c.k,
                                !nk);
      CK(cudaDeviceSynchronize());
    }
    std::vector<float> hr((size_t)std::max<long long>(total, 1) * c.n);
    CK(cudaMemcpy(hr.data(), R, hr.size() * 4, cudaMemcpyDeviceToHost));
    double err2 = 0, ref2 = 0;
    long long nan_in = 0, touched_out = 0;
    for (long long r = 0; r < MR; ++r)
      for (int j = 0; j < nout; ++j) {
        uint16_t v = hd[(size_t)r * nout + j];
        if (r >= total) {
          touched_out += v != 0x7fc1;
          continue;
        }
        float got = bf2f(v);
        float want;
        if (sw) {
          float gt = hr[(size_t)r * c.n + 2 * j], up = hr[(size_t)r * c.n + 2 * j + 1];
          want = gt / (1.0f + std::exp(-gt)) * up;
        } else {
          want = hr[(size_t)r * c.n + j];
        }
        if (std::isnan(got)) {
          ++nan_in;
          continue;
        }
        err2 += (got - want) * (double)(got - want);
        ref2 += want * (double)want;
      }
    const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
    const bool ok = st.ok() && st.value == total && nan_in == 0 && touched_out == 0 && rel < 1e-2;
    printf("%s %s: rel %.2e, unwritten %lld, written past rows %lld, status %d value %lld\n", ok ? "ok  " : "FAIL",
           name, rel, nan_in, touched_out, st.code, (long long)st.value);
    failures += !ok;
  }
  cudaFree(A);
  cudaFree(B);
  cudaFree(D);
  cudaFree(R);
  cudaFree(rows);
  cudaFree(status);
  cudaFree(row_group);
}

// ---- benchmark ----
struct Moe {
  const char* name;
  int S, H, I, E, topk;
};
static const Moe kMoe[] = {{"MoE-1", 8192, 2048, 1536, 8, 2},  {"MoE-2", 8192, 2048, 1536, 32, 2},
                           {"MoE-3", 8192, 2048, 1536, 32, 5}, {"MoE-4", 8192, 4096, 2048, 8, 2},
                           {"MoE-5", 8192, 4096, 2048, 32, 2}, {"MoE-6", 8192, 4096, 2048, 32, 5}};

static std::vector<int> routing(int S, int E, int topk, bool skewed) {
  const int T = S * topk;
  std::vector<int> r(E, 0);
  if (!skewed) {
    for (int e = 0; e < E; ++e) r[e] = T / E + (e < T % E ? 1 : 0);
    return r;
  }
  // One hot expert: half of the routed rows (at most S: a token picks an
  // expert once); every 4th other expert gets none; the rest share evenly.
  r[0] = std::min(T / 2, S);
  std::vector<int> live;
  for (int e = 1; e < E; ++e)
    if (e % 4 != 0) live.push_back(e);
  const int rest = T - r[0];
  for (size_t i = 0; i < live.size(); ++i)
    r[live[i]] = rest / (int)live.size() + ((int)i < rest % (int)live.size() ? 1 : 0);
  return r;
}

static std::atomic<long long> g_progress{0};
static std::string g_what;
static void watchdog() {
  long long last = -1;
  int still = 0;
  while (true) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    long long p = g_progress.load();
    if (p == last) {
      if (++still >= 15) {
        fprintf(stdout, "\nHANG in %s\n", g_what.c_str());
        fflush(stdout);
        _exit(3);
      }
    } else {
      still = 0;
      last = p;
    }
  }
}

static float time_ms(cudaStream_t s, int warm, int reps, const std::function<void()>& f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < warm; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, s);
    f();
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    ++g_progress;
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  bool bench = argc > 1 && std::string(argv[1]) == "bench";
  bool check = !bench || (argc > 2 && std::string(argv[2]) == "check");
  const GroupedTile tiles[] = {GroupedTile::Coop128x256, GroupedTile::Coop128x128, GroupedTile::PingPong128x128,
                               GroupedTile::PingPong64x256};
  if (check || !bench) {
    for (GroupedTile t : tiles)
      for (BLayout l : {BLayout::NK, BLayout::KN})
        for (GroupedEpilogueKind e : {GroupedEpilogueKind::Plain, GroupedEpilogueKind::SwiGLU}) {
          std::string base = grouped_tile_name(t) + (l == BLayout::NK ? " nk" : " kn") +
                             (e == GroupedEpilogueKind::SwiGLU ? " swiglu" : " plain");
          run_case({{256, 256, 256, 256}, 512, 512, 1024, l, e, t}, (base + " uniform").c_str());
          run_case({{0, 1, 777, 0, 130, 64, 1000, 5}, 528, 200, 2100, l, e, t}, (base + " skewed+tails").c_str());
          run_case({{0, 0, 0}, 256, 64, 300, l, e, t}, (base + " all empty").c_str());
          run_case({{0, 1, 777, 0, 130, 64, 1000, 5, 0}, 528, 200, 2100, l, e, t, 3},
                   (base + " skewed 3 CTAs").c_str());
          run_case({{300, 0, 129, 127, 1}, 1024, 1024, 600, l, e, t, 1}, (base + " 1 CTA").c_str());
          run_case({{1}, 16, 8, 1, l, e, t}, (base + " M=1 N=16 K=8").c_str());
          run_case({{100, 200}, 256, 64, 250, l, e, t}, (base + " over bound").c_str());
          run_case({{100, -3, 5}, 256, 64, 250, l, e, t}, (base + " negative").c_str());
        }
    for (GroupedTile t : tiles) {
      run_case({{8192, 1366, 1366, 1365, 0, 1365, 1365, 1365},
                1536,
                2048,
                16384,
                BLayout::NK,
                GroupedEpilogueKind::Plain,
                t},
               (grouped_tile_name(t) + " MoE-1 skewed full size nk").c_str());
      run_case({{8192, 1366, 1366, 1365, 0, 1365, 1365, 1365},
                1536,
                2048,
                16384,
                BLayout::KN,
                GroupedEpilogueKind::SwiGLU,
                t},
               (grouped_tile_name(t) + " MoE-1 skewed full size kn swiglu").c_str());
    }
    printf("correctness failures: %d\n", failures);
  }
  if (!bench) return failures ? 1 : 0;

  std::thread(watchdog).detach();
  int start = argc > 3 ? atoi(argv[3]) : 0, idx = -1;
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  // Buffers sized for the largest problem.
  const size_t maxA = (size_t)8192 * 5 * 4096, maxB = (size_t)32 * 4096 * 4096;
  __nv_bfloat16 *A, *B, *D;
  int *rows, *status;
  CK(cudaMalloc(&A, maxA * 2));
  CK(cudaMalloc(&B, maxB * 2));
  CK(cudaMalloc(&D, maxA * 2));
  CK(cudaMalloc(&rows, 4096));
  CK(cudaMalloc(&status, 16));
  fill_rand<<<1024, 256>>>(A, maxA, 1, 2.0f);
  fill_rand<<<1024, 256>>>(B, maxB, 2, 2.0f);
  CK(cudaDeviceSynchronize());
  printf("\nRESULTS\n");
  for (int tp : {1, 2, 4})
    for (const Moe& m : kMoe)
      for (int which = 0; which < 2; ++which)
        for (int skew = 0; skew < 2; ++skew) {
          if (++idx < start) continue;
          const int n = which == 0 ? 2 * m.I / tp : m.H, k = which == 0 ? m.H : m.I / tp;
          std::vector<int> r = routing(m.S, m.E, m.topk, skew);
          const int T = m.S * m.topk;
          CK(cudaMemcpy(rows, r.data(), r.size() * 4, cudaMemcpyHostToDevice));
          GroupedGemmArgs a;
          a.a = A;
          a.b = B;
          a.d = D;
          a.group_rows = rows;
          a.status = status;
          a.groups = m.E;
          a.n = n;
          a.k = k;
          a.max_rows = T;
          const double flop = 2.0 * T * n * k;
          printf("%s tp=%d %s %s N=%d K=%d:", m.name, tp, which == 0 ? "gateup" : "down", skew ? "skewed" : "uniform",
                 n, k);
          for (GroupedTile t : tiles) {
            GroupedGemmOptions o;
            o.tile = t;
            g_what = "problem " + std::to_string(idx) + " tile " + grouped_tile_name(t);
            float ms = time_ms(s, 5, 20, [&] { grouped_gemm(a, o, s); });
            printf(" %s=%.4fms(%.0f)", grouped_tile_name(t).c_str(), ms, flop / ms / 1e9);
          }
          {
            GroupedGemmOptions o;
            float ms = time_ms(s, 5, 20, [&] { grouped_gemm(a, o, s); });
            printf(" auto=%.4fms(%.0f)", ms, flop / ms / 1e9);
          }
          {  // per-expert cuBLASLt loop (host knows the counts: baseline only)
            float ms = time_ms(s, 3, 10, [&] {
              long long off = 0;
              for (int g = 0; g < m.E; ++g) {
                if (r[g] == 0) continue;
                GemmArgs ga;
                ga.a = A + off * k;
                ga.b = B + (size_t)g * n * k;
                ga.d = D + off * n;
                ga.m = r[g];
                ga.n = n;
                ga.k = k;
                cublaslt_gemm(ga, s);
                off += r[g];
              }
            });
            printf(" cublas_loop=%.4fms(%.0f)", ms, flop / ms / 1e9);
          }
          {  // one dense GEMM of the same FLOPs
            GemmArgs ga;
            ga.a = A;
            ga.b = B;
            ga.d = D;
            ga.m = T;
            ga.n = n;
            ga.k = k;
            float ms = time_ms(s, 5, 20, [&] { cublaslt_gemm(ga, s); });
            printf(" dense_cublas=%.4fms(%.0f)", ms, flop / ms / 1e9);
#ifdef WITH_DENSE
            float ms2 = time_ms(s, 5, 20, [&] { tessera::kernels::detail::gemm_plain_bf16_nk(ga, {}, s); });
            printf(" dense_ours=%.4fms(%.0f)", ms2, flop / ms2 / 1e9);
#endif
          }
          printf("\n");
          fflush(stdout);
        }
  return failures ? 1 : 0;
}
