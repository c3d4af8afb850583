// GPU tests of the post-communication kernels: plain un-reorder and RMSNorm
// fused with the un-reorder, for the AllReduce, ReduceScatter and
// All-to-All maps, against a CPU reference; fresh random data, poisoned
// outputs (NaN), padding columns must stay untouched.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/test_support.hpp"
#include "tessera/signal/a2a.hpp"
#include "tessera/signal/unreorder.hpp"

using namespace tessera;
using namespace tessera::signal;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 g{std::random_device{}()};
  return g;
}

// Host storage of one dtype as raw 16-bit or 32-bit words, with float views.
struct HostBuf {
  DType t;
  std::vector<unsigned char> bytes;
  HostBuf(DType t_, std::int64_t n) : t(t_), bytes(n * dtype_size(t_)) {}
  std::int64_t size() const { return bytes.size() / dtype_size(t); }
  double get(std::int64_t i) const {
    if (t == DType::f32) {
      float f;
      std::memcpy(&f, &bytes[i * 4], 4);
      return f;
    }
    unsigned short h;
    std::memcpy(&h, &bytes[i * 2], 2);
    if (t == DType::bf16) {
      __nv_bfloat16_raw r;
      r.x = h;
      return __bfloat162float(__nv_bfloat16(r));
    }
    __half_raw r;
    r.x = h;
    return __half2float(__half(r));
  }
  void set(std::int64_t i, float v) {
    if (t == DType::f32) {
      std::memcpy(&bytes[i * 4], &v, 4);
      return;
    }
    unsigned short h;
    if (t == DType::bf16) {
      __nv_bfloat16_raw r = __float2bfloat16_rn(v);
      h = r.x;
    } else {
      __half_raw r = __float2half_rn(v);
      h = r.x;
    }
    std::memcpy(&bytes[i * 2], &h, 2);
  }
  void randomize() {
    std::normal_distribution<float> d(0.f, 1.f);
    for (std::int64_t i = 0; i < size(); ++i) set(i, d(rng()));
  }
};

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(std::size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~DevBuf() { cudaFree(p); }
};

template <class Map>
void check_map(const Map& map, DType t, const char* what) {
  const std::int64_t rows = map.rows(), n = map.cols(), ld = n + 16;
  const int chunks = static_cast<int>((n + map.chunk_width() - 1) / map.chunk_width());
  std::int64_t recv_elems = 0;  // enough to cover every chunk read
  for (std::int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < chunks; ++c) recv_elems = std::max(recv_elems, map.chunk_offset(r, c) + map.chunk_width());
  HostBuf recv(t, std::max<std::int64_t>(recv_elems, 8)), weight(t, n);
  recv.randomize();
  weight.randomize();
  const std::size_t es = dtype_size(t);
  DevBuf d_recv(recv.bytes.size()), d_w(weight.bytes.size()), d_out(rows * ld * es + 16);
  CUDA_OK(cudaMemcpy(d_recv.p, recv.bytes.data(), recv.bytes.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_w.p, weight.bytes.data(), weight.bytes.size(), cudaMemcpyHostToDevice));
  HostBuf out(t, rows * ld);

  for (int fused = 0; fused < 2; ++fused) {
    if (fused && t == DType::f32) continue;
    CUDA_OK(cudaMemset(d_out.p, 0xFF, rows * ld * es));  // NaN poison
    if (fused)
      rmsnorm_unreorder(map, d_recv.p, d_w.p, d_out.p, ld, 1e-6f, t, nullptr);
    else
      unreorder(map, d_recv.p, d_out.p, ld, t, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(out.bytes.data(), d_out.p, rows * ld * es, cudaMemcpyDeviceToHost));
    std::vector<double> got, ref;
    for (std::int64_t r = 0; r < rows; ++r) {
      std::vector<double> x(n);
      double ss = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        const int c = static_cast<int>(j / map.chunk_width());
        x[j] = recv.get(map.chunk_offset(r, c) + j % map.chunk_width());
        ss += x[j] * x[j];
      }
      const double scale = 1.0 / std::sqrt(ss / n + 1e-6);
      for (std::int64_t j = 0; j < n; ++j) {
        got.push_back(out.get(r * ld + j));
        ref.push_back(fused ? x[j] * scale * weight.get(j) : x[j]);
      }
      for (std::int64_t j = n; j < ld; ++j)
        ASSERT_TRUE(std::isnan(out.get(r * ld + j)))
            << what << ": padding column " << j << " of row " << r << " written";
    }
    const double err = tessera::testing::relative_error(got, ref);
    if (fused)
      EXPECT_LT(err, t == DType::bf16 ? 8e-3 : 2e-3) << what << " rmsnorm " << dtype_name(t);
    else
      EXPECT_EQ(err, 0.0) << what << " unreorder " << dtype_name(t);  // a copy: bit-exact
  }
}

}  // namespace

TEST(UnreorderGpu, AllReduceMap) {
  TESSERA_REQUIRE_GPUS(1);
  for (DType t : {DType::bf16, DType::f16, DType::f32}) {
    check_map(make_ar_map(WaveModel(GemmTiling{1000, 520, 128, 64}, 7, 2)), t, "AR 1000x520");
    check_map(make_ar_map(WaveModel(GemmTiling{256, 4096, 128, 128}, 132, 1)), t, "AR 256x4096");
  }
  // Fused kernel variants: 257 vectors per row (2 per thread, the last
  // thread's second one only; ragged last chunk of 8 columns) and rows wider
  // than the register-resident limit (two-pass kernel).
  for (DType t : {DType::bf16, DType::f16}) {
    check_map(make_ar_map(WaveModel(GemmTiling{130, 2056, 64, 64}, 5, 3)), t, "AR 130x2056");
    check_map(make_ar_map(WaveModel(GemmTiling{70, 20480, 64, 128}, 13, 2)), t, "AR 70x20480 (two-pass)");
  }
}

TEST(UnreorderGpu, RowMajorBaseline) {
  TESSERA_REQUIRE_GPUS(1);
  for (DType t : {DType::bf16, DType::f16}) check_map(RowMajorMap{300, 1024, 1040}, t, "row-major 300x1024");
}

// The single-pass RMSNorm kernel launches one wave of CTAs, each a pipeline
// over rows b, b + grid, ... (unreorder.cu, rows_per_cta): matrices taller
// than the resident CTAs (at most 8 per SM of 256 threads) give a CTA
// several rows. Row counts here do not divide evenly, so the last CTAs get
// one row fewer.
int device_sms() {
  int dev = 0, sms = 0;
  EXPECT_EQ(cudaGetDevice(&dev), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  return sms;
}

TEST(UnreorderGpu, MultiRowCtas) {
  TESSERA_REQUIRE_GPUS(1);
  const std::int64_t sms = device_sms();
  for (DType t : {DType::bf16, DType::f16}) {
    check_map(make_ar_map(WaveModel(GemmTiling{8 * sms + 3, 4096, 128, 128}, 132, 1)), t, "AR (8*SMs+3)x4096");
    check_map(make_ar_map(WaveModel(GemmTiling{8 * sms + 1, 2056, 64, 64}, 7, 2)), t, "AR (8*SMs+1)x2056");
    check_map(make_ar_map(WaveModel(GemmTiling{4 * sms + 1, 8192, 128, 128}, 132, 1)), t, "AR (4*SMs+1)x8192");
    check_map(make_ar_map(WaveModel(GemmTiling{4 * sms + 5, 16384, 128, 128}, 132, 1)), t,
              "AR (4*SMs+5)x16384 (one row of registers)");
    check_map(RowMajorMap{8 * sms + 2, 1024, 1040}, t, "row-major (8*SMs+2)x1024 (one chunk)");
  }
}

// Sets an environment variable for one scope (restores it after).
struct ScopedEnv {
  const char* name;
  std::string saved;
  bool had;
  ScopedEnv(const char* n, const std::string& v) : name(n), had(std::getenv(n) != nullptr) {
    if (had) saved = std::getenv(n);
    ::setenv(name, v.c_str(), 1);
  }
  ~ScopedEnv() { had ? ::setenv(name, saved.c_str(), 1) : ::unsetenv(name); }
};

// The pipelined rows compute every row exactly as one row per CTA: an AR
// map's fused RMSNorm in one tall launch must equal, bit for bit, the plain
// un-reorder (an exact copy) followed by the plain RMSNorm in launches of 5
// rows (one row per CTA: fewer rows than resident CTAs). The tall launch
// runs with the library's rule (several rows per CTA) and with forced rows
// per CTA (TESSERA_RMSNORM_ROWS: 2, 7 — ragged last CTAs — and 1).
TEST(UnreorderGpu, MultiRowCtasMatchOneRowPerCtaBitwise) {
  TESSERA_REQUIRE_GPUS(1);
  const std::int64_t sms = device_sms();
  for (const char* forced : {"0", "2", "7", "1"})
    for (DType t : {DType::bf16, DType::f16})
      for (std::int64_t n : {std::int64_t(1024), std::int64_t(4096), std::int64_t(8192), std::int64_t(16384)}) {
        SCOPED_TRACE(std::string("TESSERA_RMSNORM_ROWS=") + forced);
        const std::int64_t rows = 8 * sms + 3, ld = n + 8, piece = 5;
        const ArMap map = make_ar_map(WaveModel(GemmTiling{rows, n, 128, 128}, 132, 1));
        const int chunks = static_cast<int>((n + map.chunk_width() - 1) / map.chunk_width());
        std::int64_t recv_elems = 0;
        for (std::int64_t r = 0; r < rows; ++r)
          for (int c = 0; c < chunks; ++c)
            recv_elems = std::max(recv_elems, map.chunk_offset(r, c) + map.chunk_width());
        const std::size_t es = dtype_size(t), bytes = rows * ld * es;
        HostBuf recv(t, recv_elems), w(t, n);
        recv.randomize();
        w.randomize();
        DevBuf d_recv(recv.bytes.size()), d_w(w.bytes.size()), d_rm(bytes), d_tall(bytes), d_pieces(bytes);
        CUDA_OK(cudaMemcpy(d_recv.p, recv.bytes.data(), recv.bytes.size(), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(d_w.p, w.bytes.data(), w.bytes.size(), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemset(d_tall.p, 0xFF, bytes));
        CUDA_OK(cudaMemset(d_pieces.p, 0xFF, bytes));
        {
          const ScopedEnv env("TESSERA_RMSNORM_ROWS", forced);
          rmsnorm_unreorder(map, d_recv.p, d_w.p, d_tall.p, ld, 1e-6f, t, nullptr);
        }
        unreorder(map, d_recv.p, d_rm.p, ld, t, nullptr);
        for (std::int64_t r = 0; r < rows; r += piece) {
          const std::int64_t off = r * ld * es;
          rmsnorm_unreorder(RowMajorMap{std::min(piece, rows - r), n, ld}, static_cast<char*>(d_rm.p) + off, d_w.p,
                            static_cast<char*>(d_pieces.p) + off, ld, 1e-6f, t, nullptr);
        }
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<unsigned char> tall(bytes), pieces(bytes);
        CUDA_OK(cudaMemcpy(tall.data(), d_tall.p, bytes, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(pieces.data(), d_pieces.p, bytes, cudaMemcpyDeviceToHost));
        std::int64_t differ = 0, first = -1;
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t j = 0; j < n; ++j) {
            const std::size_t at = (r * ld + j) * es;
            if (std::memcmp(&tall[at], &pieces[at], es) != 0 && differ++ == 0) first = r * ld + j;
          }
        EXPECT_EQ(differ, 0) << dtype_name(t) << " " << rows << "x" << n << ": first difference at element " << first;
        HostBuf out(t, rows * ld);
        std::memcpy(out.bytes.data(), tall.data(), bytes);
        for (std::int64_t r = 0; r < rows; ++r)  // and no NaN anywhere (the poison was overwritten)
          for (std::int64_t j = 0; j < n; ++j)
            ASSERT_FALSE(std::isnan(out.get(r * ld + j))) << "row " << r << " col " << j;
      }
}

TEST(UnreorderGpu, ReduceScatterShards) {
  TESSERA_REQUIRE_GPUS(1);
  for (int R : {2, 4, 8})
    for (DType t : {DType::bf16, DType::f16}) {
      const RsMap map = make_rs_map(WaveModel(GemmTiling{1000, 1032, 128, 128}, 11, 3, Raster::AlongM), R);
      for (int r = 0; r < R; ++r) check_map(RsShard{map, r}, t, "RS shard");
    }
}

TEST(UnreorderGpu, AllToAllReceiveMap) {
  TESSERA_REQUIRE_GPUS(1);
  for (int R : {2, 4}) {
    std::vector<std::vector<int>> dest(R);
    std::vector<std::vector<int>> parts(R);
    for (int q = 0; q < R; ++q) {
      dest[q].resize(700 + 100 * q);
      for (auto& d : dest[q]) d = std::uniform_int_distribution<int>(0, R - 1)(rng()) == 0 ? 0 : R - 1;  // skewed
      parts[q] = {1, WaveModel(GemmTiling{std::int64_t(dest[q].size()), 264, 64, 64}, 9).waves() - 1};
    }
    const A2aPlan plan(264, 64, 64, 9, 1, Raster::AlongN, dest, parts);
    for (int s = 0; s < R; ++s) {
      const auto& table = plan.chunk_src(s);
      DevBuf d_table(std::max<std::size_t>(table.size(), 1) * sizeof(std::int64_t));
      CUDA_OK(cudaMemcpy(d_table.p, table.data(), table.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice));
      A2aRecvMap dev = plan.recv_map(s);
      A2aRecvMap host = dev;
      dev.chunk_src = static_cast<const std::int64_t*>(d_table.p);
      if (dev.rows() == 0) continue;
      // Offsets are read on the host through `host`; the kernel gets `dev`.
      for (DType t : {DType::bf16, DType::f16}) {
        const std::int64_t rows = host.rows(), n = host.cols(), ld = n;
        std::int64_t recv_elems = plan.recv_elems(s);
        HostBuf recv(t, recv_elems), w(t, n), out(t, rows * ld);
        recv.randomize();
        w.randomize();
        DevBuf d_recv(recv.bytes.size()), d_w(w.bytes.size()), d_out(out.bytes.size());
        CUDA_OK(cudaMemcpy(d_recv.p, recv.bytes.data(), recv.bytes.size(), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(d_w.p, w.bytes.data(), w.bytes.size(), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemset(d_out.p, 0xFF, out.bytes.size()));
        unreorder(dev, d_recv.p, d_out.p, ld, t, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(out.bytes.data(), d_out.p, out.bytes.size(), cudaMemcpyDeviceToHost));
        std::vector<double> got, ref;
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t j = 0; j < n; ++j) {
            got.push_back(out.get(r * ld + j));
            ref.push_back(recv.get(host.chunk_offset(r, int(j / 64)) + j % 64));
          }
        EXPECT_EQ(tessera::testing::relative_error(got, ref), 0.0) << "A2A unreorder R=" << R << " rank " << s;
        // Fused RMSNorm through the same map.
        CUDA_OK(cudaMemset(d_out.p, 0xFF, out.bytes.size()));
        rmsnorm_unreorder(dev, d_recv.p, d_w.p, d_out.p, ld, 1e-6f, t, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(out.bytes.data(), d_out.p, out.bytes.size(), cudaMemcpyDeviceToHost));
        got.clear();
        std::vector<double> fref;
        for (std::int64_t r = 0; r < rows; ++r) {
          double ss = 0;
          for (std::int64_t j = 0; j < n; ++j) ss += ref[r * n + j] * ref[r * n + j];
          const double scale = 1.0 / std::sqrt(ss / n + 1e-6);
          for (std::int64_t j = 0; j < n; ++j) {
            got.push_back(out.get(r * ld + j));
            fref.push_back(ref[r * n + j] * scale * w.get(j));
          }
        }
        EXPECT_LT(tessera::testing::relative_error(got, fref), t == DType::bf16 ? 8e-3 : 2e-3)
            << "A2A rmsnorm R=" << R << " rank " << s;
      }
    }
  }
}

TEST(UnreorderGpu, RejectsBadArgumentsBeforeLaunch) {
  TESSERA_REQUIRE_GPUS(1);
  const ArMap map = make_ar_map(WaveModel(GemmTiling{128, 512, 128, 128}, 4));
  DevBuf a(map.buffer_elems() * 2 + 64), b(128 * 512 * 2 + 64), w(512 * 2);
  std::vector<unsigned short> host(16);
  EXPECT_THROW(unreorder(map, a.p, b.p, 500, DType::bf16, nullptr), std::runtime_error);  // ld < N
  EXPECT_THROW(unreorder(map, static_cast<char*>(a.p) + 2, b.p, 512, DType::bf16, nullptr), std::runtime_error);
  EXPECT_THROW(unreorder(map, host.data(), b.p, 512, DType::bf16, nullptr), std::runtime_error);  // host memory
  EXPECT_THROW(rmsnorm_unreorder(map, a.p, w.p, b.p, 512, 1e-6f, DType::f32, nullptr), std::runtime_error);
  const ArMap odd = make_ar_map(WaveModel(GemmTiling{128, 500, 128, 100}, 4));
  EXPECT_THROW(unreorder(odd, a.p, b.p, 512, DType::bf16, nullptr), std::runtime_error);  // N % 8
}
