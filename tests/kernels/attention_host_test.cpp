// CPU tests of the attention kernel's host side: argument validation (each
// bad argument rejected with its name and value, before any device work),
// packed-stride defaults, the causal offset default, the FLOP count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "tessera/kernels/attention.hpp"
#include "tessera/runtime/error.hpp"

namespace tk = tessera::kernels;

namespace {

void* fake(std::uintptr_t v) { return reinterpret_cast<void*>(v); }

tk::AttentionArgs good() {
  tk::AttentionArgs a;
  a.q = fake(0x10000);
  a.k = fake(0x20000);
  a.v = fake(0x30000);
  a.o = fake(0x40000);
  a.batch = 2;
  a.seqlen_q = 300;
  a.seqlen_k = 1000;
  a.heads_q = 8;
  a.heads_kv = 2;
  a.head_dim = 128;
  return a;
}

/// validate(a) must throw a message containing `what` (the device check
/// comes last, so argument errors are reported without a GPU).
void expect_rejected(const tk::AttentionArgs& a, const std::string& what) {
  try {
    tk::validate(a);
    ADD_FAILURE() << "accepted; expected: " << what;
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(AttentionHost, RejectsEachBadArgumentByName) {
  auto a = good();
  a.heads_q = 6;
  a.heads_kv = 4;
  expect_rejected(a, "heads_q = 6 is not a multiple of heads_kv = 4");
  a = good();
  a.heads_kv = 16;
  expect_rejected(a, "heads_kv = 16 must be in [1, heads_q = 8]");
  a = good();
  a.head_dim = 96;
  expect_rejected(a, "head_dim = 96 not supported");
  a = good();
  a.dtype = tessera::DType::f32;
  expect_rejected(a, "dtype f32 not supported");
  a = good();
  a.seqlen_k = 0;
  expect_rejected(a, "seqlen_k = 0 out of range");
  a = good();
  a.batch = 0;
  expect_rejected(a, "batch = 0 out of range");
  a = good();
  a.v = nullptr;
  expect_rejected(a, "must be non-null");
  a = good();
  a.o = fake(0x40008);
  expect_rejected(a, "16-byte aligned");
  a = good();
  a.q_stride = {300 * 8 * 128, 8 * 128 + 4, 128};
  expect_rejected(a, "q strides (batch 307200, seq 1028, head 128) must be multiples of 8");
  a = good();
  a.k_stride = {0, 2 * 128, 128};
  expect_rejected(a, "a stride may be 0 only where its extent is 1");
  a = good();
  a.softmax_scale = -1.f;
  expect_rejected(a, "softmax_scale = -1");
  a = good();
  a.lse_head_stride = -5;
  expect_rejected(a, "LSE strides");
  a = good();
  a.q_split = 128;  // good() is not causal
  expect_rejected(a, "q_split = 128 needs causal");
  a.causal = true;
  a.q_split = 100;
  expect_rejected(a, "q_split = 100 must be a multiple of 128");
  a.q_split = 384;  // seqlen_q = 300
  expect_rejected(a, "q_split = 384 must be a multiple of 128");
}

TEST(AttentionHost, DefaultsAndFlops) {
  auto a = good();
  const tk::AttnStrides q = a.q_strides(), k = a.k_strides();
  EXPECT_EQ(q.seq, 8 * 128);
  EXPECT_EQ(q.head, 128);
  EXPECT_EQ(q.batch, 300 * 8 * 128);
  EXPECT_EQ(k.seq, 2 * 128);
  EXPECT_EQ(k.batch, 1000 * 2 * 128);
  EXPECT_EQ(a.causal_offset(), 700);  // end-aligned: seqlen_k - seqlen_q
  a.q_offset = 42;
  EXPECT_EQ(a.causal_offset(), 42);
  EXPECT_FLOAT_EQ(a.scale(), 1.f / std::sqrt(128.f));
  a.q_offset.reset();
  EXPECT_DOUBLE_EQ(tk::attention_flops(a), 4.0 * 2 * 8 * 128 * 300 * 1000);
  a.causal = true;
  // Row i admits 701 + i keys (i < 300): sum = 300 * 701 + 299 * 300 / 2.
  EXPECT_DOUBLE_EQ(tk::attention_flops(a), 4.0 * 2 * 8 * 128 * (300.0 * 701 + 299.0 * 300 / 2));
  a.seqlen_q = a.seqlen_k = 1000;
  EXPECT_DOUBLE_EQ(tk::attention_flops(a), 4.0 * 2 * 8 * 128 * (1000.0 * 1001 / 2));
  // Rows >= 256 at offset 100: rows 0..255 admit 701 + i, rows 256..299 admit 101 + i keys.
  a.seqlen_q = 300;
  a.q_split = 256;
  a.q_offset_split = 100;
  EXPECT_EQ(a.causal_offset(255), 700);
  EXPECT_EQ(a.causal_offset(256), 100);
  double pairs = 0;
  for (int i = 0; i < 300; ++i) pairs += i < 256 ? 701 + i : 101 + i;
  EXPECT_DOUBLE_EQ(tk::attention_flops(a), 4.0 * 2 * 8 * 128 * pairs);
}
