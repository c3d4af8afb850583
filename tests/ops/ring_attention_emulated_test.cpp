// One-GPU test of ring and Ulysses attention with the ranks emulated: each
// rank's zig-zag shard runs through the operators' own per-rank pieces
// (src/ops/seq_parallel_detail.hpp) — ring steps and LSE merges against the
// shard each rank holds at each step, Ulysses packs, all-to-all (here plain
// copies between the emulated ranks' staging buffers), unpacks, attention
// per head group — and must match attention over the whole sequence at the
// same global positions: O to a relative L2 error < 1e-2, LSE within 1e-3.
// Ulysses attends whole sequences per head, so it is expected to match
// bitwise; differences are reported. Worlds 1-4 (Ulysses where the heads
// divide), causal and not, MHA and GQA, head dim 128 and 64, batch 2 and 1, chunks
// aligned and not aligned to the 128-row query tile.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ops/seq_parallel_detail.hpp"
#include "support/device_buffers.hpp"
#include "support/test_support.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/kernels/attention_merge.hpp"
#include "tessera/runtime/error.hpp"

using namespace tessera;
namespace tk = tessera::kernels;

using tessera::testing::bf16_to_float;
using tessera::testing::DeviceBuffer;
using tessera::testing::download;
using tessera::testing::hopper_skip_reason;

namespace {

struct Problem {
  int world;
  int64_t chunk, hq, hkv, d;
  bool causal;
  int64_t batch = 2;
};

/// Global tensors, their whole-sequence attention, and every rank's shard.
struct Emulation {
  Problem pb;
  int64_t B, S, L;
  std::unique_ptr<DeviceBuffer> q, k, v, o, lse;
  std::vector<std::unique_ptr<DeviceBuffer>> sq, sk, sv, so, slse;
  std::vector<uint16_t> o_full;
  std::vector<float> lse_full;

  explicit Emulation(const Problem& p) : pb(p), B(p.batch), S(2 * p.world * p.chunk), L(2 * p.chunk) {
    const size_t nq = B * S * p.hq * p.d, nk = B * S * p.hkv * p.d;
    q = std::make_unique<DeviceBuffer>(nq * 2);
    k = std::make_unique<DeviceBuffer>(nk * 2);
    v = std::make_unique<DeviceBuffer>(nk * 2);
    o = std::make_unique<DeviceBuffer>(nq * 2);
    lse = std::make_unique<DeviceBuffer>(B * p.hq * S * 4);
    std::mt19937_64 rng(777 + p.world * 31 + p.chunk + p.hkv + p.d + p.causal);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto [buf, n] : {std::pair{q.get(), nq}, std::pair{k.get(), nk}, std::pair{v.get(), nk}}) {
      std::vector<__nv_bfloat16> h(n);
      for (auto& x : h) x = __float2bfloat16(nd(rng));
      TESSERA_CUDA_CHECK(cudaMemcpy(buf->p, h.data(), n * 2, cudaMemcpyHostToDevice));
    }
    tk::AttentionArgs full;
    full.q = q->p;
    full.k = k->p;
    full.v = v->p;
    full.o = o->p;
    full.lse = lse->as<float>();
    full.batch = B;
    full.seqlen_q = full.seqlen_k = S;
    full.heads_q = p.hq;
    full.heads_kv = p.hkv;
    full.head_dim = p.d;
    full.causal = p.causal;
    tk::attention(full);
    o_full = download<uint16_t>(o->p, nq);
    lse_full = download<float>(lse->p, B * p.hq * S);
    for (int r = 0; r < p.world; ++r) {
      sq.push_back(shard(*q, p.hq, r));
      sk.push_back(shard(*k, p.hkv, r));
      sv.push_back(shard(*v, p.hkv, r));
      so.push_back(std::make_unique<DeviceBuffer>(B * L * p.hq * p.d * 2));
      slse.push_back(std::make_unique<DeviceBuffer>(B * p.hq * L * 4));
    }
  }
  int chunk_of(int r, int i) const { return i == 0 ? r : 2 * pb.world - 1 - r; }
  std::unique_ptr<DeviceBuffer> shard(const DeviceBuffer& g, int64_t heads, int r) const {
    auto b = std::make_unique<DeviceBuffer>(B * L * heads * pb.d * 2);
    const size_t row = heads * pb.d * 2;
    for (int i = 0; i < 2; ++i)
      TESSERA_CUDA_CHECK(cudaMemcpy2D(b->as<char>() + i * pb.chunk * row, L * row,
                                      static_cast<const char*>(g.p) + chunk_of(r, i) * pb.chunk * row, S * row,
                                      pb.chunk * row, B, cudaMemcpyDeviceToDevice));
    return b;
  }
  ops::SpAttnArgs args(int r) const {
    ops::SpAttnArgs a;
    a.q = sq[r]->p;
    a.k = sk[r]->p;
    a.v = sv[r]->p;
    a.o = so[r]->p;
    a.lse = slse[r]->as<float>();
    a.batch = B;
    a.seq = S;
    a.heads_q = pb.hq;
    a.heads_kv = pb.hkv;
    a.head_dim = pb.d;
    a.causal = pb.causal;
    return a;
  }
  void poison() {
    for (int r = 0; r < pb.world; ++r) {
      TESSERA_CUDA_CHECK(cudaMemset(so[r]->p, 0xFF, B * L * pb.hq * pb.d * 2));
      TESSERA_CUDA_CHECK(cudaMemset(slse[r]->p, 0xFF, B * pb.hq * L * 4));
    }
  }
  /// Checks every rank's outputs against the whole-sequence rows.
  void check(const std::string& what, bool report_bitwise) const {
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    const int64_t H = pb.hq, D = pb.d, C = pb.chunk;
    for (int r = 0; r < pb.world; ++r) {
      const auto o_sh = download<uint16_t>(so[r]->p, B * L * H * D);
      const auto lse_sh = download<float>(slse[r]->p, B * H * L);
      double num = 0, den = 0, lse_err = 0;
      int64_t bad = 0, differ = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < L; ++i) {
          const int64_t g = chunk_of(r, static_cast<int>(i / C)) * C + i % C;
          const uint16_t* x = &o_sh[(b * L + i) * H * D];
          const uint16_t* y = &o_full[(b * S + g) * H * D];
          for (int64_t j = 0; j < H * D; ++j) {
            bad += !std::isfinite(bf16_to_float(x[j]));
            differ += x[j] != y[j];
            num += (bf16_to_float(x[j]) - bf16_to_float(y[j])) * (bf16_to_float(x[j]) - bf16_to_float(y[j]));
            den += bf16_to_float(y[j]) * bf16_to_float(y[j]);
          }
          for (int64_t h = 0; h < H; ++h) {
            const float l0 = lse_sh[(b * H + h) * L + i], l1 = lse_full[(b * H + h) * S + g];
            bad += !std::isfinite(l0);
            differ += std::memcmp(&l0, &l1, 4) != 0;
            lse_err = std::max(lse_err, static_cast<double>(std::abs(l0 - l1)));
          }
        }
      const std::string at = what + " world " + std::to_string(pb.world) + " rank " + std::to_string(r) + " chunk " +
                             std::to_string(C) + " heads " + std::to_string(H) + "/" + std::to_string(pb.hkv) + " d " +
                             std::to_string(D) + (pb.causal ? " causal" : "");
      EXPECT_EQ(bad, 0) << at << ": non-finite outputs";
      EXPECT_LT(std::sqrt(num / den), 1e-2) << at;
      EXPECT_LT(lse_err, 1e-3) << at;
      if (report_bitwise && differ != 0)
        std::cout << "[   NOTE   ] " << at << ": " << differ << " O / LSE entries differ bitwise (within tolerance)\n";
    }
  }
};

void run_ring(Emulation& s) {
  const int W = s.pb.world;
  s.poison();
  const int64_t H = s.pb.hq, D = s.pb.d;
  DeviceBuffer o_acc(s.B * s.L * H * D * 4), lse_acc(s.B * H * s.L * 4), o_part(s.B * s.L * H * D * 2),
      lse_part(s.B * H * s.L * 4);
  for (int r = 0; r < W; ++r) {
    const ops::SpAttnArgs a = s.args(r);
    const ops::RingAttnPlan plan = ops::plan_ring_attention(s.S, W, r, s.pb.causal);
    if (W == 1) {
      ops::detail::ring_attend(a, W, plan.steps[0], a.k, a.v, a.o, a.lse, nullptr);
      continue;
    }
    TESSERA_CUDA_CHECK(cudaMemset(o_part.p, 0xFF, s.B * s.L * H * D * 2));  // rows a step skips stay poisoned
    for (int j = 0; j < W; ++j) {
      const int owner = plan.steps[j].owner;
      ops::detail::ring_attend(a, W, plan.steps[j], s.sk[owner]->p, s.sv[owner]->p, o_part.p, lse_part.as<float>(),
                               nullptr);
      ops::detail::ring_merge(a, plan, j, o_acc.as<float>(), lse_acc.as<float>(), o_part.p, lse_part.as<float>(),
                              nullptr);
    }
  }
  s.check("ring", false);
}

void run_ulysses(Emulation& s, int groups) {
  const int W = s.pb.world;
  s.poison();
  std::vector<ops::SpAttnArgs> as;
  std::vector<ops::detail::UlyssesRank> us;
  std::vector<std::unique_ptr<DeviceBuffer>> scratch;
  for (int r = 0; r < W; ++r) {
    as.push_back(s.args(r));
    us.push_back(ops::detail::ulysses_rank(as[r], W, r, groups));
    scratch.push_back(std::make_unique<DeviceBuffer>(us[r].layout().total));
    us[r].place(scratch[r]->p);
  }
  // What NCCL does: rank r's k-th transfer with peer p feeds p's k-th transfer with r.
  auto exchange = [&](int g, bool in) {
    auto with = [&](int r, int p) {
      std::vector<ops::detail::UlyssesRank::Transfer> v;
      for (const auto& t : in ? us[r].transfers_in(g) : us[r].transfers_out(g, true))
        if (t.peer == p) v.push_back(t);
      return v;
    };
    for (int r = 0; r < W; ++r)
      for (int p = 0; p < W; ++p) {
        const auto sends = with(r, p), recvs = with(p, r);
        ASSERT_EQ(sends.size(), recvs.size());
        for (size_t k = 0; k < sends.size(); ++k) {
          ASSERT_EQ(sends[k].bytes, recvs[k].bytes);
          TESSERA_CUDA_CHECK(cudaMemcpy(recvs[k].recv, sends[k].send, sends[k].bytes, cudaMemcpyDeviceToDevice));
        }
      }
  };
  const ops::detail::Copy2d copy = ops::detail::stream_copy2d(nullptr);
  for (int g = 0; g < groups; ++g) {
    for (int r = 0; r < W; ++r) ops::detail::ulysses_pack_in(us[r], as[r], g, copy);
    exchange(g, true);
    for (int r = 0; r < W; ++r) ops::detail::ulysses_unpack_in(us[r], g, copy);
    for (int r = 0; r < W; ++r) ops::detail::ulysses_attend(us[r], as[r], g, nullptr);
    for (int r = 0; r < W; ++r) ops::detail::ulysses_pack_out(us[r], as[r], g, copy);
    exchange(g, false);
    for (int r = 0; r < W; ++r) ops::detail::ulysses_unpack_out(us[r], as[r], g, copy);
  }
  s.check("ulysses groups " + std::to_string(groups), true);
}

}  // namespace

TEST(RingAttentionEmulated, RingAndUlyssesMatchWholeSequence) {
  std::string why;
  if (hopper_skip_reason(&why)) GTEST_SKIP() << why;
  std::vector<Problem> problems;
  for (int world : {1, 2, 3, 4})
    for (bool causal : {true, false}) {
      problems.push_back({world, 128, 4, 4, 128, causal});
      problems.push_back({world, 128, 4, 2, 128, causal});
    }
  problems.push_back({2, 80, 4, 4, 64, true});  // chunks not aligned to the query tile, head dim 64
  problems.push_back({4, 96, 8, 4, 128, true});
  problems.push_back({2, 200, 8, 8, 64, false});
  // Batch 1: Ulysses moves rows in place (no staging copies).
  problems.push_back({2, 128, 8, 4, 128, true, 1});
  problems.push_back({4, 64, 8, 8, 128, false, 1});
  problems.push_back({3, 96, 6, 3, 64, true, 1});
  for (const Problem& p : problems) {
    Emulation s(p);
    run_ring(s);
    if (p.hq % p.world == 0 && p.hkv % p.world == 0) {
      const int64_t kv_local = p.hkv / p.world;
      for (int groups = 1; groups <= kv_local; ++groups)
        if (kv_local % groups == 0) run_ulysses(s, groups);
    }
  }
}

TEST(RingAttentionEmulated, MergeKernelEdgeCases) {
  std::string why;
  if (hopper_skip_reason(&why)) GTEST_SKIP() << why;
  // One (batch, row, head) with D = 64: accumulator LSE -inf (no key yet)
  // merged with a partial, a partial with LSE -inf, and both -inf.
  const int64_t D = 64;
  DeviceBuffer o_acc(3 * D * 4), lse_acc(3 * 4), o_part(3 * D * 2), lse_part(3 * 4), o_out(3 * D * 2), lse_out(3 * 4);
  std::vector<float> acc(3 * D, 0.f), la = {-INFINITY, 1.5f, -INFINITY}, lb = {0.25f, -INFINITY, -INFINITY};
  std::vector<__nv_bfloat16> part(3 * D);
  for (int64_t j = 0; j < D; ++j) {
    acc[D + j] = 0.5f + j;
    part[j] = __float2bfloat16(1.0f + j);
    part[D + j] = __float2bfloat16(1e4f);  // weight 0: must not leak
    part[2 * D + j] = __float2bfloat16(7.f);
  }
  TESSERA_CUDA_CHECK(cudaMemcpy(o_acc.p, acc.data(), acc.size() * 4, cudaMemcpyHostToDevice));
  TESSERA_CUDA_CHECK(cudaMemcpy(lse_acc.p, la.data(), 12, cudaMemcpyHostToDevice));
  TESSERA_CUDA_CHECK(cudaMemcpy(o_part.p, part.data(), part.size() * 2, cudaMemcpyHostToDevice));
  TESSERA_CUDA_CHECK(cudaMemcpy(lse_part.p, lb.data(), 12, cudaMemcpyHostToDevice));
  tk::AttentionMergeArgs m;
  m.o_acc = o_acc.as<float>();
  m.lse_acc = lse_acc.as<float>();
  m.o_part = o_part.p;
  m.lse_part = lse_part.as<float>();
  m.o_out = o_out.p;
  m.lse_out = lse_out.as<float>();
  m.batch = 1;
  m.seq = 3;
  m.heads = 1;
  m.head_dim = D;
  m.rows = 3;
  tk::attention_merge(m, nullptr);
  const auto o = download<uint16_t>(o_out.p, 3 * D);
  const auto l = download<float>(lse_out.p, 3);
  const auto oa = download<float>(o_acc.p, 3 * D);
  EXPECT_NEAR(l[0], 0.25f, 1e-6);
  EXPECT_NEAR(l[1], 1.5f, 1e-6);
  EXPECT_TRUE(std::isinf(l[2]) && l[2] < 0);
  for (int64_t j = 0; j < D; ++j) {
    EXPECT_EQ(bf16_to_float(o[j]), __bfloat162float(part[j])) << j;
    EXPECT_EQ(oa[D + j], 0.5f + j) << j;
    EXPECT_EQ(oa[2 * D + j], 0.f) << j;
  }
  // Equal LSEs average the two outputs; LSE grows by log 2.
  const std::vector<float> eq = {2.f, 2.f, 2.f};
  TESSERA_CUDA_CHECK(cudaMemcpy(lse_acc.p, eq.data(), 12, cudaMemcpyHostToDevice));
  TESSERA_CUDA_CHECK(cudaMemcpy(lse_part.p, eq.data(), 12, cudaMemcpyHostToDevice));
  m.row0 = 1;
  m.rows = 1;
  tk::attention_merge(m, nullptr);
  const auto o2 = download<float>(o_acc.p, 3 * D);
  const auto l2 = download<float>(lse_acc.p, 3);
  EXPECT_NEAR(l2[1], 2.f + std::log(2.f), 1e-5);
  EXPECT_NEAR(o2[D + 3], 0.5f * (0.5f + 3.f) + 0.5f * __bfloat162float(part[D + 3]), 1e-2);
  EXPECT_EQ(o2[2 * D], 0.f);  // row 2 outside [row0, row0 + rows): untouched
}
