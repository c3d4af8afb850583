// A sequence-parallel attention problem as the SP operator tests use it:
// global Q, K, V of S = 2·world·C tokens drawn from one seed (the same on
// every rank), whole-sequence attention by the kernel as the reference, and
// this rank's zig-zag shards (chunks rank and 2·world−1−rank, C rows each)
// with an output O / LSE the operator under test writes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "support/device_buffers.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/ops/sp_attention.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::testing {

/// A value of `t` (bf16 or f16) given by its bits.
inline float half_bits_to_float(std::uint16_t x, DType t) {
  if (t == DType::f16) {
    __half h;
    std::memcpy(&h, &x, 2);
    return __half2float(h);
  }
  return bf16_to_float(x);
}

/// The bits of x rounded to `t` (bf16 or f16).
inline std::uint16_t float_to_half_bits(float x, DType t) {
  std::uint16_t r;
  if (t == DType::f16) {
    const __half h = __float2half(x);
    std::memcpy(&r, &h, 2);
  } else {
    const __nv_bfloat16 h = __float2bfloat16(x);
    std::memcpy(&r, &h, 2);
  }
  return r;
}

class ZigZagAttention {
 public:
  const int world, rank;
  const std::int64_t B, C, S, L, H, Hkv, D;
  const DType dtype;
  const bool causal;

  /// Global [B, S, heads, D] tensors from N(0, 1) with `seed`; reference O
  /// [B, S, H, D] and LSE [B, H, S]; shards [B, L = 2C, heads, D].
  ZigZagAttention(int world_, int rank_, std::int64_t batch, std::int64_t chunk, std::int64_t heads_q,
                  std::int64_t heads_kv, std::int64_t head_dim, DType dt, bool causal_, std::uint64_t seed)
      : world(world_),
        rank(rank_),
        B(batch),
        C(chunk),
        S(2 * world_ * chunk),
        L(2 * chunk),
        H(heads_q),
        Hkv(heads_kv),
        D(head_dim),
        dtype(dt),
        causal(causal_),
        q_(bytes(S, H)),
        k_(bytes(S, Hkv)),
        v_(bytes(S, Hkv)),
        o_(bytes(S, H)),
        lse_(static_cast<std::size_t>(B * H * S) * 4),
        sq_(bytes(L, H)),
        sk_(bytes(L, Hkv)),
        sv_(bytes(L, Hkv)),
        so_(bytes(L, H)),
        slse_(static_cast<std::size_t>(B * H * L) * 4) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto [buf, heads] : {std::pair{&q_, H}, std::pair{&k_, Hkv}, std::pair{&v_, Hkv}}) {
      std::vector<std::uint16_t> h(static_cast<std::size_t>(B * S * heads * D));
      for (auto& x : h) x = float_to_half_bits(nd(rng), dtype);
      TESSERA_CUDA_CHECK(cudaMemcpy(buf->p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    }
    const std::int64_t chunks[2] = {rank, 2 * world - 1 - rank};
    for (auto [dst, src, heads] : {std::tuple{&sq_, &q_, H}, std::tuple{&sk_, &k_, Hkv}, std::tuple{&sv_, &v_, Hkv}}) {
      const std::size_t row = static_cast<std::size_t>(heads * D * 2);
      for (int i = 0; i < 2; ++i)
        TESSERA_CUDA_CHECK(cudaMemcpy2D(static_cast<char*>(dst->p) + i * C * row, L * row,
                                        static_cast<const char*>(src->p) + chunks[i] * C * row, S * row, C * row,
                                        static_cast<std::size_t>(B), cudaMemcpyDeviceToDevice));
    }
    kernels::AttentionArgs full;
    full.q = q_.p;
    full.k = k_.p;
    full.v = v_.p;
    full.o = o_.p;
    full.lse = static_cast<float*>(lse_.p);
    full.batch = B;
    full.seqlen_q = full.seqlen_k = S;
    full.heads_q = H;
    full.heads_kv = Hkv;
    full.head_dim = D;
    full.dtype = dtype;
    full.causal = causal;
    kernels::attention(full);
    o_ref_ = download<std::uint16_t>(o_.p, static_cast<std::size_t>(B * S * H * D));
    lse_ref_ = download<float>(lse_.p, static_cast<std::size_t>(B * H * S));
  }

  /// Global position of local row i of the shard.
  std::int64_t global_row(std::int64_t i) const { return (i < C ? rank : 2 * world - 1 - rank) * C + i % C; }

  /// The operator's arguments: this rank's shards, its O and LSE.
  ops::SpAttnArgs args() const {
    ops::SpAttnArgs a;
    a.q = sq_.p;
    a.k = sk_.p;
    a.v = sv_.p;
    a.o = so_.p;
    a.lse = static_cast<float*>(slse_.p);
    a.batch = B;
    a.seq = S;
    a.heads_q = H;
    a.heads_kv = Hkv;
    a.head_dim = D;
    a.dtype = dtype;
    a.causal = causal;
    return a;
  }

  /// NaN bits into O and LSE (a call must overwrite every element); synchronizes the device.
  void poison() const {
    TESSERA_CUDA_CHECK(cudaMemset(so_.p, 0xFF, bytes(L, H)));
    TESSERA_CUDA_CHECK(cudaMemset(slse_.p, 0xFF, static_cast<std::size_t>(B * H * L) * 4));
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  }

  struct Diff {
    double o_rel = 0;                ///< relative L2 error of O
    double lse_max = 0;              ///< largest |LSE - reference|
    std::int64_t nonfinite = 0;      ///< non-finite O (and LSE) values: poison left or NaN
    std::int64_t o_rows_differ = 0;  ///< rows of O not bitwise equal to the reference
    std::int64_t lse_differ = 0;     ///< LSE entries not bitwise equal
  };

  /// The shard's O (and LSE when `with_lse`) against the reference rows.
  Diff compare(bool with_lse = true) const {
    const auto o_sh = download<std::uint16_t>(so_.p, static_cast<std::size_t>(B * L * H * D));
    const auto lse_sh = download<float>(slse_.p, static_cast<std::size_t>(B * H * L));
    Diff d;
    double num = 0, den = 0;
    const std::size_t row = static_cast<std::size_t>(H * D);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t i = 0; i < L; ++i) {
        const std::int64_t g = global_row(i);
        const std::uint16_t* x = &o_sh[(b * L + i) * row];
        const std::uint16_t* y = &o_ref_[(b * S + g) * row];
        d.o_rows_differ += std::memcmp(x, y, row * 2) != 0;
        for (std::size_t j = 0; j < row; ++j) {
          const float xf = half_bits_to_float(x[j], dtype), yf = half_bits_to_float(y[j], dtype);
          d.nonfinite += !std::isfinite(xf);
          num += (xf - yf) * (xf - yf);
          den += yf * yf;
        }
        if (!with_lse) continue;
        for (std::int64_t h = 0; h < H; ++h) {
          const float l0 = lse_sh[(b * H + h) * L + i], l1 = lse_ref_[(b * H + h) * S + g];
          d.nonfinite += !std::isfinite(l0);
          d.lse_differ += std::memcmp(&l0, &l1, 4) != 0;
          d.lse_max = std::max(d.lse_max, static_cast<double>(std::abs(l0 - l1)));
        }
      }
    d.o_rel = std::sqrt(num / den);
    return d;
  }

 private:
  std::size_t bytes(std::int64_t rows, std::int64_t heads) const {
    return static_cast<std::size_t>(B * rows * heads * D) * 2;
  }
  DeviceBuffer q_, k_, v_, o_, lse_, sq_, sk_, sv_, so_, slse_;
  std::vector<std::uint16_t> o_ref_;
  std::vector<float> lse_ref_;
};

}  // namespace tessera::testing
