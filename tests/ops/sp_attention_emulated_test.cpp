// One-GPU test of the zig-zag sequence-parallel attention decomposition
// (ops/sp_attention.hpp) with the ranks emulated: each rank's shard of Q
// (global chunks r and 2R-1-r) runs through the plan's parts — attention
// against the gathered KV in global order, with the part's q_offset,
// KV-prefix length and LSE strides — and must equal, bit for bit, the rows of
// attention over the whole sequence at the same global positions (the same
// KV blocks are visited for every row, blocks past a row's last admitted key
// contribute exact zeros). Causal and not, chunks aligned and not aligned to
// the 128-row query tile, batch 2, GQA.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "support/device_buffers.hpp"
#include "support/test_support.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/ops/sp_attention.hpp"
#include "tessera/runtime/error.hpp"

namespace tk = tessera::kernels;
using tessera::ops::plan_sp_attention;
using tessera::ops::SpAttnPlan;

using tessera::testing::DeviceBuffer;
using tessera::testing::download;
using tessera::testing::hopper_skip_reason;

TEST(SpAttentionEmulated, ZigZagShardsEqualWholeSequenceAttention) {
  std::string why;
  if (hopper_skip_reason(&why)) GTEST_SKIP() << why;
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t B = 2, H = 4, Hkv = 2, D = 128;
  for (int64_t C : {256, 200})
    for (int world : {2, 4})
      for (bool causal : {true, false}) {
        const int64_t S = 2 * world * C;
        const size_t nq = B * S * H * D, nk = B * S * Hkv * D;
        DeviceBuffer q(nq * 2), k(nk * 2), v(nk * 2), o(nq * 2), lse(B * H * S * 4);
        for (auto [buf, n] : {std::pair{&q, nq}, std::pair{&k, nk}, std::pair{&v, nk}}) {
          std::vector<__nv_bfloat16> h(n);
          for (auto& x : h) x = __float2bfloat16(nd(rng));
          TESSERA_CUDA_CHECK(cudaMemcpy(buf->p, h.data(), n * 2, cudaMemcpyHostToDevice));
        }
        tk::AttentionArgs full;
        full.q = q.p;
        full.k = k.p;
        full.v = v.p;
        full.o = o.p;
        full.lse = static_cast<float*>(lse.p);
        full.batch = B;
        full.seqlen_q = full.seqlen_k = S;
        full.heads_q = H;
        full.heads_kv = Hkv;
        full.head_dim = D;
        full.causal = causal;
        tk::attention(full);
        const auto o_full = download<uint16_t>(o.p, nq);
        const auto lse_full = download<float>(lse.p, B * H * S);

        for (int r = 0; r < world; ++r) {
          const SpAttnPlan plan = plan_sp_attention(S, world, r, causal);
          const int64_t L = 2 * C;  // shard rows
          DeviceBuffer sq(B * L * H * D * 2), so(B * L * H * D * 2), slse(B * H * L * 4);
          TESSERA_CUDA_CHECK(cudaMemset(so.p, 0xFF, B * L * H * D * 2));
          TESSERA_CUDA_CHECK(cudaMemset(slse.p, 0xFF, B * H * L * 4));
          const size_t row_bytes = H * D * 2;
          for (int i = 0; i < 2; ++i)  // the shard: chunks r and 2R-1-r of every batch
            TESSERA_CUDA_CHECK(cudaMemcpy2D(static_cast<char*>(sq.p) + i * C * row_bytes, L * row_bytes,
                                            static_cast<const char*>(q.p) + plan.chunks[i] * C * row_bytes,
                                            S * row_bytes, C * row_bytes, B, cudaMemcpyDeviceToDevice));
          for (const SpAttnPlan::Part& part : plan.parts) {
            tk::AttentionArgs a = full;
            a.q = static_cast<const char*>(sq.p) + part.local_row0 * row_bytes;
            a.o = static_cast<char*>(so.p) + part.local_row0 * row_bytes;
            a.q_stride = a.o_stride = {L * H * D, H * D, D};
            a.k_stride = a.v_stride = {S * Hkv * D, Hkv * D, D};
            a.seqlen_q = part.rows;
            a.seqlen_k = part.kv_len;  // a prefix of the gathered KV
            a.q_offset = part.q_offset;
            a.lse = static_cast<float*>(slse.p) + part.local_row0;
            a.lse_batch_stride = H * L;
            a.lse_head_stride = L;
            tk::attention(a);
          }
          const auto o_sh = download<uint16_t>(so.p, B * L * H * D);
          const auto lse_sh = download<float>(slse.p, B * H * L);
          int64_t o_diff = 0, lse_diff = 0;
          for (int64_t b = 0; b < B; ++b)
            for (int64_t i = 0; i < L; ++i) {
              const int64_t g = plan.global_row(i);
              o_diff += std::memcmp(&o_sh[(b * L + i) * H * D], &o_full[(b * S + g) * H * D], row_bytes) != 0;
              for (int64_t h = 0; h < H; ++h)
                lse_diff += std::memcmp(&lse_sh[(b * H + h) * L + i], &lse_full[(b * H + h) * S + g], 4) != 0;
            }
          EXPECT_EQ(o_diff, 0) << "rank " << r << "/" << world << (causal ? " causal" : "") << " C " << C
                               << ": O rows differing from the whole-sequence attention";
          EXPECT_EQ(lse_diff, 0) << "rank " << r << "/" << world << (causal ? " causal" : "") << " C " << C
                                 << ": LSE entries differing";
        }
      }
}
