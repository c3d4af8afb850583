// GPU tests of the flash-attention forward kernel against a float64 CPU
// reference: fresh random data, poisoned outputs (NaN), causal and not,
// explicit q_offset (a shard mid-sequence, rows with no admitted key), Lq !=
// Lk, GQA / MQA, ragged lengths, head dims 64 and 128, bf16 and fp16, BSHD
// and BHSD strides, the LSE, the KV wait hook (K / V chunks and their flags
// released late from the host), and bad input rejected before launch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "attention_test_kernels.hpp"
#include "support/test_support.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/runtime/error.hpp"

namespace tk = tessera::kernels;
using tessera::DType;
using tessera::testing::relative_error;

namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 r(std::random_device{}());
  return r;
}

struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  explicit DevBuf(size_t b) : bytes(b) { TESSERA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(b, 16))); }
  DevBuf(DevBuf&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
};

uint16_t to_bits(float x, DType t) {
  if (t == DType::bf16) return static_cast<__nv_bfloat16_raw>(__float2bfloat16(x)).x;
  return static_cast<__half_raw>(__float2half(x)).x;
}
double from_bits(uint16_t b, DType t) {
  if (t == DType::bf16) {
    __nv_bfloat16_raw r;
    r.x = b;
    return static_cast<double>(__bfloat162float(__nv_bfloat16(r)));
  }
  __half_raw r;
  r.x = b;
  return static_cast<double>(__half2float(__half(r)));
}

/// A [B, S, H, D] tensor stored BSHD (bhsd = false) or BHSD (true), with its
/// host copy (rounded values) in logical [b][s][h][d] order.
struct Tensor {
  DevBuf dev;
  std::vector<double> host;
  tk::AttnStrides strides;  // elements; packed BSHD = all zero
  int64_t B, S, H, D;
  double at(int64_t b, int64_t s, int64_t h, int64_t d) const { return host[((b * S + s) * H + h) * D + d]; }
};

tk::AttnStrides strides_of(int64_t S, int64_t H, int64_t D, bool bhsd) {
  if (!bhsd) return {};  // packed BSHD
  return {H * S * D, D, S * D};
}

Tensor random_tensor(int64_t B, int64_t S, int64_t H, int64_t D, DType t, bool bhsd) {
  Tensor x{DevBuf(static_cast<size_t>(B * S * H * D) * 2),
           std::vector<double>(B * S * H * D),
           strides_of(S, H, D, bhsd),
           B,
           S,
           H,
           D};
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> bits(B * S * H * D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const uint16_t v = to_bits(nd(rng()), t);
          x.host[((b * S + s) * H + h) * D + d] = from_bits(v, t);
          const int64_t off = bhsd ? ((b * H + h) * S + s) * D + d : ((b * S + s) * H + h) * D + d;
          bits[off] = v;
        }
  TESSERA_CUDA_CHECK(cudaMemcpy(x.dev.p, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  return x;
}

Tensor poisoned_tensor(int64_t B, int64_t S, int64_t H, int64_t D, bool bhsd) {
  Tensor x{DevBuf(static_cast<size_t>(B * S * H * D) * 2), {}, strides_of(S, H, D, bhsd), B, S, H, D};
  TESSERA_CUDA_CHECK(cudaMemset(x.dev.p, 0xFF, x.dev.bytes));  // NaN in bf16 and f16
  return x;
}

std::vector<double> download(const Tensor& x, DType t, bool bhsd) {
  std::vector<uint16_t> bits(x.B * x.S * x.H * x.D);
  TESSERA_CUDA_CHECK(cudaMemcpy(bits.data(), x.dev.p, bits.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<double> out(bits.size());
  for (int64_t b = 0; b < x.B; ++b)
    for (int64_t s = 0; s < x.S; ++s)
      for (int64_t h = 0; h < x.H; ++h)
        for (int64_t d = 0; d < x.D; ++d) {
          const int64_t off = bhsd ? ((b * x.H + h) * x.S + s) * x.D + d : ((b * x.S + s) * x.H + h) * x.D + d;
          out[((b * x.S + s) * x.H + h) * x.D + d] = from_bits(bits[off], t);
        }
  return out;
}

struct Case {
  int64_t B = 1, Lq = 1, Lk = 1, Hq = 1, Hkv = 1, D = 128;
  bool causal = false;
  DType dtype = DType::bf16;
  std::optional<int64_t> q_offset{};
  bool bhsd = false;
  float scale = 0.f;
  int64_t q_split = 0, q_offset_split = 0;  ///< rows >= q_split use q_offset_split
};

std::string name(const Case& c) {
  return "B" + std::to_string(c.B) + " Lq" + std::to_string(c.Lq) + " Lk" + std::to_string(c.Lk) + " H" +
         std::to_string(c.Hq) + "/" + std::to_string(c.Hkv) + " D" + std::to_string(c.D) + (c.causal ? " causal" : "") +
         (c.q_offset ? " q_offset " + std::to_string(*c.q_offset) : "") +
         (c.q_split ? " split " + std::to_string(c.q_split) + "@" + std::to_string(c.q_offset_split) : "") +
         (c.bhsd ? " BHSD" : "") + " " + std::string(tessera::dtype_name(c.dtype));
}

/// float64 reference: O [b][i][h][d] and LSE [b][h][i] (-inf for no key).
void reference(const Case& c, const Tensor& q, const Tensor& k, const Tensor& v, std::vector<double>& o,
               std::vector<double>& lse) {
  const double scale = c.scale != 0.f ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.D));
  const int64_t off = c.q_offset.value_or(c.Lk - c.Lq);
  const int64_t g = c.Hq / c.Hkv;
  o.assign(c.B * c.Lq * c.Hq * c.D, 0.0);
  lse.assign(c.B * c.Hq * c.Lq, -std::numeric_limits<double>::infinity());
  std::vector<double> s(c.Lk);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Lq; ++i) {
        const int64_t row_off = c.q_split > 0 && i >= c.q_split ? c.q_offset_split : off;
        const int64_t keys = c.causal ? std::clamp<int64_t>(i + row_off + 1, 0, c.Lk) : c.Lk;
        if (keys == 0) continue;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < keys; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < c.D; ++d) acc += q.at(b, i, h, d) * k.at(b, j, h / g, d);
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < keys; ++j) sum += (s[j] = std::exp(s[j] - mx));
        lse[(b * c.Hq + h) * c.Lq + i] = mx + std::log(sum);
        double* orow = &o[((b * c.Lq + i) * c.Hq + h) * c.D];
        for (int64_t j = 0; j < keys; ++j)
          for (int64_t d = 0; d < c.D; ++d) orow[d] += s[j] / sum * v.at(b, j, h / g, d);
      }
}

struct Problem {
  Tensor q, k, v, o;
  DevBuf lse;
  tk::AttentionArgs args;
};

Problem setup(const Case& c) {
  Problem r{
      random_tensor(c.B, c.Lq, c.Hq, c.D, c.dtype, c.bhsd),  random_tensor(c.B, c.Lk, c.Hkv, c.D, c.dtype, c.bhsd),
      random_tensor(c.B, c.Lk, c.Hkv, c.D, c.dtype, c.bhsd), poisoned_tensor(c.B, c.Lq, c.Hq, c.D, c.bhsd),
      DevBuf(static_cast<size_t>(c.B * c.Hq * c.Lq) * 4),    {}};
  TESSERA_CUDA_CHECK(cudaMemset(r.lse.p, 0xFF, r.lse.bytes));  // NaN
  tk::AttentionArgs& a = r.args;
  a.q = r.q.dev.p;
  a.k = r.k.dev.p;
  a.v = r.v.dev.p;
  a.o = r.o.dev.p;
  a.lse = static_cast<float*>(r.lse.p);
  a.batch = c.B;
  a.seqlen_q = c.Lq;
  a.seqlen_k = c.Lk;
  a.heads_q = c.Hq;
  a.heads_kv = c.Hkv;
  a.head_dim = c.D;
  a.q_stride = r.q.strides;
  a.k_stride = r.k.strides;
  a.v_stride = r.v.strides;
  a.o_stride = r.o.strides;
  a.dtype = c.dtype;
  a.causal = c.causal;
  a.q_offset = c.q_offset;
  a.q_split = c.q_split;
  a.q_offset_split = c.q_offset_split;
  a.softmax_scale = c.scale;
  return r;
}

/// Checks O and LSE of r (already computed) against the reference.
void expect_matches(const Case& c, const Problem& r) {
  std::vector<double> o_ref, lse_ref;
  reference(c, r.q, r.k, r.v, o_ref, lse_ref);
  const std::vector<double> o = download(r.o, c.dtype, c.bhsd);
  std::vector<float> lse(c.B * c.Hq * c.Lq);
  TESSERA_CUDA_CHECK(cudaMemcpy(lse.data(), r.lse.p, lse.size() * 4, cudaMemcpyDeviceToHost));
  const double err = relative_error(o, o_ref);
  const double tol = c.dtype == DType::bf16 ? 1e-2 : 2e-3;
  EXPECT_LT(err, tol) << name(c);
  double lse_err = 0;
  int64_t bad = 0;
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(lse_ref[i])) {
      bad += !(std::isinf(lse[i]) && lse[i] < 0);
      continue;
    }
    if (!std::isfinite(lse[i])) {
      ++bad;
      continue;
    }
    lse_err = std::max(lse_err, std::abs(lse[i] - lse_ref[i]) / std::max(1.0, std::abs(lse_ref[i])));
  }
  EXPECT_EQ(bad, 0) << name(c) << ": LSE rows with the wrong infinity / NaN";
  EXPECT_LT(lse_err, 1e-4) << name(c);
  // Rows with no admitted key are exactly 0 (not NaN).
  for (size_t i = 0; i < o.size(); ++i)
    if (!std::isfinite(o[i])) {
      ADD_FAILURE() << name(c) << ": non-finite O at " << i;
      break;
    }
}

class AttentionGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    TESSERA_REQUIRE_GPUS(1);
    int major = 0;
    TESSERA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    if (major != 9) GTEST_SKIP() << "needs an sm_90 (Hopper) GPU, found compute capability " << major;
  }
};

TEST_F(AttentionGpu, MatchesReferenceAcrossShapes) {
  std::vector<Case> cases;
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t d : {64, 128})
      for (bool causal : {false, true}) {
        cases.push_back({2, 200, 333, 4, 2, d, causal, t});  // ragged, GQA, Lq != Lk (end-aligned causal)
        cases.push_back({1, 256, 256, 2, 2, d, causal, t});  // whole tiles, MHA
      }
  cases.push_back({3, 77, 77, 4, 1, 128, true, DType::bf16});                             // MQA, one partial tile
  cases.push_back({1, 150, 700, 4, 2, 128, true, DType::bf16, int64_t{260}});             // Q shard mid-sequence
  cases.push_back({1, 190, 400, 2, 2, 64, true, DType::f16, int64_t{-60}});               // rows with no key
  cases.push_back({2, 130, 390, 4, 2, 128, false, DType::bf16, std::nullopt, true});      // BHSD strides
  cases.push_back({1, 129, 129, 2, 1, 64, true, DType::bf16, std::nullopt, true, 0.3f});  // explicit scale
  cases.push_back({1, 1, 300, 4, 4, 128, true, DType::bf16});                             // one query row
  // Two segments of the sequence in one Q (a zig-zag shard): rows 0..255 at
  // global 256.., rows 256..383 at global 896..; and rows with no key after the split.
  cases.push_back({1, 384, 1024, 4, 2, 128, true, DType::bf16, int64_t{256}, false, 0.f, 256, 640});
  cases.push_back({2, 300, 500, 2, 1, 64, true, DType::f16, int64_t{100}, false, 0.f, 128, -200});
  for (const Case& c : cases) {
    Problem r = setup(c);
    tk::attention(r.args);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    expect_matches(c, r);
  }
}

// The KV hook: KvFlagWait on flags the host releases only after the kernel
// started; the result matches the reference and equals, bit for bit, the
// hook-free kernel of the same block geometry (same arithmetic order).
TEST_F(AttentionGpu, KvFlagWaitWaitsForLateChunks) {
  const Case c{1, 300, 1000, 4, 2, 128, true, DType::bf16};
  Problem plain = setup(c);
  tessera::kernels::testk::attention_kv_flags_geometry(plain.args, nullptr);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  expect_matches(c, plain);

  // Same inputs as plain, fresh poisoned outputs; K and V are poisoned (NaN)
  // too until their chunk lands: the copy stream copies a chunk's key rows,
  // then sets its flag, so a load the hook did not order after the flag reads
  // NaN and breaks the bitwise comparison below.
  Problem hooked = setup(c);
  TESSERA_CUDA_CHECK(cudaMemcpy(hooked.q.dev.p, plain.q.dev.p, plain.q.dev.bytes, cudaMemcpyDeviceToDevice));
  hooked.q.host = plain.q.host;
  for (auto [dst, src] : {std::pair{&hooked.k, &plain.k}, std::pair{&hooked.v, &plain.v}}) {
    TESSERA_CUDA_CHECK(cudaMemset(dst->dev.p, 0xFF, dst->dev.bytes));  // NaN in bf16
    dst->host = src->host;
  }
  constexpr int kChunk = 256;  // key rows per flag
  const int flags_n = static_cast<int>((c.Lk + kChunk - 1) / kChunk);
  const size_t row_bytes = static_cast<size_t>(c.Hkv * c.D) * 2;  // BSHD packed, batch 1: chunks are contiguous
  DevBuf flags(static_cast<size_t>(flags_n) * 4);
  TESSERA_CUDA_CHECK(cudaMemset(flags.p, 0, flags.bytes));
  // The poison and the flags' zeros are complete before the non-blocking
  // streams below start (they do not order behind the legacy stream).
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  cudaStream_t s_kernel, s_copy;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s_kernel, cudaStreamNonBlocking));
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s_copy, cudaStreamNonBlocking));
  tessera::kernels::testk::attention_kv_flags(hooked.args, static_cast<const uint32_t*>(flags.p), 1u, kChunk, s_kernel);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(cudaStreamQuery(s_kernel), cudaErrorNotReady) << "the kernel finished before its KV chunks were released";
  const std::vector<uint32_t> ones(flags_n, 1u);
  for (int f = flags_n - 1; f >= 0; --f) {  // chunks arrive one by one: K and V rows, then the flag
    const size_t off = static_cast<size_t>(f) * kChunk * row_bytes;
    const size_t bytes = static_cast<size_t>(std::min<int64_t>(kChunk, c.Lk - int64_t{f} * kChunk)) * row_bytes;
    for (auto [dst, src] : {std::pair{&hooked.k, &plain.k}, std::pair{&hooked.v, &plain.v}})
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst->dev.p) + off,
                                         static_cast<const char*>(src->dev.p) + off, bytes, cudaMemcpyDeviceToDevice,
                                         s_copy));
    TESSERA_CUDA_CHECK(
        cudaMemcpyAsync(static_cast<uint32_t*>(flags.p) + f, &ones[f], 4, cudaMemcpyHostToDevice, s_copy));
  }
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(s_copy));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(s_kernel));
  expect_matches(c, hooked);
  const std::vector<double> a = download(plain.o, c.dtype, false), b = download(hooked.o, c.dtype, false);
  EXPECT_EQ(a, b) << "hooked kernel differs from the plain one";
  cudaStreamDestroy(s_kernel);
  cudaStreamDestroy(s_copy);
}

// The online softmax does not depend on the order of KV blocks: a hook that
// rotates it (diagonal and ragged blocks visited mid-walk, after blocks that
// admit every key) gives the reference result too.
TEST_F(AttentionGpu, KvBlockOrderFromTheHook) {
  for (bool causal : {true, false})
    for (const Case& c : {Case{2, 333, 1000, 4, 2, 128, causal, DType::bf16}, Case{1, 700, 700, 2, 1, 128, causal}}) {
      Problem r = setup(c);
      tessera::kernels::testk::attention_rotated_kv_order(r.args, nullptr);
      TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
      expect_matches(c, r);
    }
}

TEST_F(AttentionGpu, RejectsBadInputBeforeLaunch) {
  const Case c{1, 64, 64, 4, 2, 128, false, DType::bf16};
  Problem r = setup(c);
  auto expect_error = [&](tk::AttentionArgs a, const char* what) {
    try {
      tk::attention(a);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  tk::AttentionArgs a = r.args;
  a.heads_q = 6;
  a.heads_kv = 4;
  expect_error(a, "heads_q = 6 is not a multiple of heads_kv = 4");
  a = r.args;
  a.head_dim = 96;
  expect_error(a, "head_dim = 96");
  a = r.args;
  a.q = static_cast<const char*>(a.q) + 2;
  expect_error(a, "16-byte aligned");
  a = r.args;
  a.k_stride = {64 * 2 * 128, 2 * 128 + 4, 128};
  expect_error(a, "multiples of 8");
  a = r.args;
  a.dtype = DType::f32;
  expect_error(a, "dtype f32");
  a = r.args;
  a.o = nullptr;
  expect_error(a, "non-null");
  // Nothing was written: O is still the poison.
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> o = download(r.o, c.dtype, false);
  EXPECT_TRUE(std::isnan(o[0]) && std::isnan(o.back()));
}

}  // namespace
