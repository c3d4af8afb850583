// CPU test of Ulysses attention's data movement: the operator's own pack /
// all-to-all / unpack functions (src/ops/seq_parallel_detail.hpp) run over
// host memory for R emulated ranks, with host copies in place of
// cudaMemcpy2DAsync and NCCL. Every head row carries a code of (tensor,
// batch, global token, global head); after the all-to-all in, each rank's
// head shard must hold all tokens in global order for its heads, and after
// the all-to-all out each rank's O and LSE must hold its zig-zag rows of
// every head. Worlds 1-4, batch 1 and 2, MHA and GQA, every head-group count.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ops/seq_parallel_detail.hpp"
#include "tessera/ops/ulysses_attention.hpp"

using namespace tessera;
using ops::detail::UlyssesRank;

namespace {

constexpr std::int64_t kD = 64;  // bf16: 128-byte head rows

std::uint64_t code(int tensor, std::int64_t b, std::int64_t t, std::int64_t h) {
  return (static_cast<std::uint64_t>(tensor) << 56) | (static_cast<std::uint64_t>(b) << 40) |
         (static_cast<std::uint64_t>(t) << 16) | static_cast<std::uint64_t>(h);
}

void host_copy(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
               std::size_t rows) {
  for (std::size_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<unsigned char*>(dst) + r * dpitch, static_cast<const unsigned char*>(src) + r * spitch,
                width);
}

/// Head row (b, t, h) of a [B, T, H, D] bf16 tensor: its first 8 bytes.
std::uint64_t& row_code(std::vector<unsigned char>& buf, std::int64_t T, std::int64_t H, std::int64_t b, std::int64_t t,
                        std::int64_t h) {
  return *reinterpret_cast<std::uint64_t*>(&buf[static_cast<std::size_t>(((b * T + t) * H + h) * kD * 2)]);
}
std::uint64_t row_code(const unsigned char* buf, std::int64_t T, std::int64_t H, std::int64_t b, std::int64_t t,
                       std::int64_t h) {
  std::uint64_t v;
  std::memcpy(&v, buf + ((b * T + t) * H + h) * kD * 2, 8);
  return v;
}
std::uint64_t head_code(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

/// One emulated all-to-all: rank r's k-th transfer with peer p feeds p's k-th transfer with r.
void exchange(const std::vector<UlyssesRank>& us, int g, bool in, bool lse) {
  const int W = static_cast<int>(us.size());
  auto with = [&](int r, int p) {
    std::vector<UlyssesRank::Transfer> v;
    for (const auto& t : in ? us[r].transfers_in(g) : us[r].transfers_out(g, lse))
      if (t.peer == p) v.push_back(t);
    return v;
  };
  for (int r = 0; r < W; ++r)
    for (int p = 0; p < W; ++p) {
      const auto sends = with(r, p), recvs = with(p, r);
      ASSERT_EQ(sends.size(), recvs.size());
      for (std::size_t k = 0; k < sends.size(); ++k) {
        ASSERT_EQ(sends[k].bytes, recvs[k].bytes);
        std::memcpy(recvs[k].recv, sends[k].send, sends[k].bytes);
      }
    }
}

std::string run(int W, std::int64_t B, std::int64_t H, std::int64_t Hkv, int G, bool with_lse) {
  const std::int64_t C = 3, L = 2 * C, S = W * L;
  auto global_row = [&](int r, std::int64_t i) { return (i < C ? r : 2 * W - 1 - r) * C + i % C; };
  std::vector<std::vector<unsigned char>> q(W), k(W), v(W), o(W), scratch(W);
  std::vector<std::vector<float>> lse(W);
  std::vector<ops::UlyssesAttnArgs> as(W);
  std::vector<UlyssesRank> us;
  for (int r = 0; r < W; ++r) {
    q[r].assign(static_cast<std::size_t>(B * L * H * kD * 2), 0);
    k[r].assign(static_cast<std::size_t>(B * L * Hkv * kD * 2), 0);
    v[r] = k[r];
    o[r].assign(q[r].size(), 0);
    lse[r].assign(static_cast<std::size_t>(B * H * L), -1.f);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t i = 0; i < L; ++i) {
        for (std::int64_t h = 0; h < H; ++h) row_code(q[r], L, H, b, i, h) = code(1, b, global_row(r, i), h);
        for (std::int64_t h = 0; h < Hkv; ++h) {
          row_code(k[r], L, Hkv, b, i, h) = code(2, b, global_row(r, i), h);
          row_code(v[r], L, Hkv, b, i, h) = code(3, b, global_row(r, i), h);
        }
      }
    ops::UlyssesAttnArgs& a = as[r];
    a.q = q[r].data();
    a.k = k[r].data();
    a.v = v[r].data();
    a.o = o[r].data();
    a.lse = with_lse ? lse[r].data() : nullptr;
    a.batch = B;
    a.seq = S;
    a.heads_q = H;
    a.heads_kv = Hkv;
    a.head_dim = kD;
    us.push_back(ops::detail::ulysses_rank(a, W, r, G));
    scratch[r].assign(us[r].layout().total, 0);
    us[r].place(scratch[r].data());
  }
  const ops::detail::Copy2d copy = host_copy;
  const std::int64_t Hl = H / W, Hkvl = Hkv / W;
  for (int g = 0; g < G; ++g) {
    for (int r = 0; r < W; ++r) ops::detail::ulysses_pack_in(us[r], as[r], g, copy);
    exchange(us, g, true, with_lse);
    for (int r = 0; r < W; ++r) ops::detail::ulysses_unpack_in(us[r], g, copy);
  }
  for (int r = 0; r < W; ++r)
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < S; ++t) {
        for (std::int64_t h = 0; h < Hl; ++h)
          if (head_code(us[r].fq + us[r].head_row(us[r].Hg, b, t, h)) != code(1, b, t, r * Hl + h))
            return "Q head shard of rank " + std::to_string(r) + " at (" + std::to_string(b) + ", " +
                   std::to_string(t) + ", " + std::to_string(h) + ")";
        for (std::int64_t h = 0; h < Hkvl; ++h)
          if (head_code(us[r].fk + us[r].head_row(us[r].Hkvg, b, t, h)) != code(2, b, t, r * Hkvl + h) ||
              head_code(us[r].fv + us[r].head_row(us[r].Hkvg, b, t, h)) != code(3, b, t, r * Hkvl + h))
            return "K/V head shard of rank " + std::to_string(r) + " at (" + std::to_string(b) + ", " +
                   std::to_string(t) + ", " + std::to_string(h) + ")";
      }
  // The way back: the kernel's outputs coded, then O / LSE of every rank checked.
  for (int r = 0; r < W; ++r)
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < S; ++t)
        for (std::int64_t h = 0; h < Hl; ++h) {
          const std::uint64_t c = code(4, b, t, r * Hl + h);
          std::memcpy(us[r].fo + us[r].head_row(us[r].Hg, b, t, h), &c, 8);
          us[r].flse[us[r].lse_index(b, t, h)] = static_cast<float>((b * H + r * Hl + h) * S + t);
        }
  for (int g = 0; g < G; ++g) {
    for (int r = 0; r < W; ++r) ops::detail::ulysses_pack_out(us[r], as[r], g, copy);
    exchange(us, g, false, with_lse);
    for (int r = 0; r < W; ++r) ops::detail::ulysses_unpack_out(us[r], as[r], g, copy);
  }
  for (int r = 0; r < W; ++r)
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t i = 0; i < L; ++i)
        for (std::int64_t h = 0; h < H; ++h) {
          const std::int64_t t = global_row(r, i);
          if (row_code(o[r].data(), L, H, b, i, h) != code(4, b, t, h))
            return "O of rank " + std::to_string(r) + " at (" + std::to_string(b) + ", " + std::to_string(i) + ", " +
                   std::to_string(h) + ")";
          const float want = with_lse ? static_cast<float>((b * H + h) * S + t) : -1.f;
          if (lse[r][(b * H + h) * L + i] != want)
            return "LSE of rank " + std::to_string(r) + " at (" + std::to_string(b) + ", " + std::to_string(h) + ", " +
                   std::to_string(i) + ")";
        }
  return "";
}

}  // namespace

TEST(UlyssesLayout, AllToAllPlacesEveryRowAndHead) {
  int cases = 0;
  for (int W : {1, 2, 3, 4})
    for (std::int64_t B : {1, 2})
      for (auto [H, Hkv] : {std::pair<std::int64_t, std::int64_t>{4, 4}, {8, 4}, {4, 2}, {12, 6}, {8, 8}, {6, 3}}) {
        if (H % W || Hkv % W) continue;
        for (int G = 1; G <= Hkv / W; ++G) {
          if ((Hkv / W) % G) continue;
          for (bool with_lse : {true, false}) {
            EXPECT_EQ(run(W, B, H, Hkv, G, with_lse), "") << "world " << W << " batch " << B << " heads " << H << "/"
                                                          << Hkv << " groups " << G << (with_lse ? "" : " no LSE");
            ++cases;
          }
        }
      }
  EXPECT_GT(cases, 40);
}
