// Validation of the TP-MLP operators' arguments (host only, before launch).
#include "tessera/ops/args.hpp"

#include <cstdint>
#include <cstring>
#include <tuple>

#include "tessera/runtime/error.hpp"
#include "tessera/runtime/symmetric_heap.hpp"

namespace tessera::ops {

namespace {
constexpr unsigned bit(OpKind k) { return static_cast<unsigned>(k); }
constexpr unsigned kAll =
    bit(OpKind::ag_gemm) | bit(OpKind::gemm_rs) | bit(OpKind::gemm_ar) | bit(OpKind::sp_attention);
constexpr unsigned kMoe = bit(OpKind::moe_tp) | bit(OpKind::moe_ep);
constexpr std::array<StrategyInfo, kStrategyCount> kStrategies{{
    {Strategy::automatic, "automatic", kAll | kMoe},
    {Strategy::sequential, "sequential", kAll | kMoe},
    {Strategy::decomposition, "decomposition", bit(OpKind::ag_gemm) | bit(OpKind::gemm_rs)},
    {Strategy::fused_ce, "fused_ce", kAll},
    {Strategy::fused_sm, "fused_sm", bit(OpKind::ag_gemm) | bit(OpKind::gemm_rs)},
    {Strategy::ring, "ring", bit(OpKind::gemm_rs) | bit(OpKind::sp_attention)},
    {Strategy::ulysses, "ulysses", bit(OpKind::sp_attention)},
    {Strategy::pipelined, "pipelined", kMoe},
    {Strategy::two_level, "two_level", bit(OpKind::sp_attention)},
}};
static_assert(
    [] {
      for (std::size_t i = 0; i < kStrategies.size(); ++i)
        if (static_cast<std::size_t>(kStrategies[i].strategy) != i) return false;
      return true;
    }(),
    "kStrategies is indexed by strategy code");
}  // namespace

const std::array<StrategyInfo, kStrategyCount>& strategy_table() { return kStrategies; }

const StrategyInfo* find_strategy(int code) {
  return code >= 0 && code < static_cast<int>(kStrategies.size()) ? &kStrategies[static_cast<std::size_t>(code)]
                                                                  : nullptr;
}

bool accepts(OpKind op, Strategy s) {
  const StrategyInfo* i = find_strategy(static_cast<int>(s));
  return i != nullptr && (i->ops & bit(op)) != 0;
}

std::string_view strategy_name(Strategy s) {
  const StrategyInfo* i = find_strategy(static_cast<int>(s));
  return i ? i->name : "?";
}

Strategy parse_strategy(std::string_view name) {
  if (name == "auto") return Strategy::automatic;
  for (const StrategyInfo& i : kStrategies)
    if (name == i.name) return i.strategy;
  TESSERA_FAIL(
      "unknown strategy '{}' (automatic, sequential, decomposition, fused_ce, fused_sm, ring, ulysses, pipelined, "
      "two_level)",
      name);
}

std::int64_t ShardRows::rows(std::int64_t m, int s) const {
  const std::int64_t lo = s * per_rank, hi = std::min(lo + per_rank, m);
  return hi > lo ? hi - lo : 0;
}

ShardRows shard_rows(std::int64_t m, int world) {
  TESSERA_CHECK(world >= 1, "shard_rows: world = {} must be >= 1", world);
  TESSERA_CHECK(m >= 0, "shard_rows: M = {} must be >= 0", m);
  return ShardRows{(m + world - 1) / world};
}

namespace {

constexpr std::int64_t kMaxDim = std::int64_t{1} << 31;          // rows, columns, leading dimensions
constexpr std::int64_t kMaxMatrixBytes = std::int64_t{1} << 48;  // one operand

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

void check_common(const char* op, DType dt, int rank, int world) {
  TESSERA_CHECK(world >= 1 && world <= runtime::kMaxPeers, "{}: world size {} outside [1, {}]", op, world,
                runtime::kMaxPeers);
  TESSERA_CHECK(rank >= 0 && rank < world, "{}: rank {} outside [0, {})", op, rank, world);
  TESSERA_CHECK(dt == DType::bf16 || dt == DType::f16, "{}: dtype {} not supported (bf16 or f16)", op, dtype_name(dt));
}

void check_ptr(const char* op, const char* name, const void* p) {
  TESSERA_CHECK(p != nullptr, "{}: {} is null", op, name);
  TESSERA_CHECK(aligned16(p), "{}: {} = {} is not 16-byte aligned (TMA and 16-byte vector accesses need it)", op, name,
                p);
}

void check_ld(const char* op, const char* name, std::int64_t ld, std::int64_t row) {
  TESSERA_CHECK(ld >= row, "{}: {} = {} is smaller than the row length {}", op, name, ld, row);
  TESSERA_CHECK(ld < kMaxDim, "{}: {} = {} out of range [row length, 2^31)", op, name, ld);
  TESSERA_CHECK(ld % 8 == 0, "{}: {} = {} is not a multiple of 8 elements (16-byte rows)", op, name, ld);
}

// Bytes of a [rows, ld] matrix of 2-byte elements must fit the address space
// (and every index the kernels form): rows * ld * 2 <= 2^48.
void check_extent_bytes(const char* op, const char* name, std::int64_t rows, std::int64_t ld) {
  std::int64_t elems = 0, bytes = 0;
  TESSERA_CHECK(!__builtin_mul_overflow(rows, ld, &elems) && !__builtin_mul_overflow(elems, std::int64_t{2}, &bytes) &&
                    bytes <= kMaxMatrixBytes,
                "{}: {} of {} rows x {} elements is larger than 2^48 bytes", op, name, rows, ld);
}

void check_rows(const char* op, std::int64_t m, std::int64_t m_local, int rank, int world) {
  TESSERA_CHECK(m >= 1 && m < (std::int64_t{1} << 31), "{}: M = {} out of range [1, 2^31)", op, m);
  const ShardRows s = shard_rows(m, world);
  TESSERA_CHECK(s.rows(m, world - 1) >= 1,
                "{}: M = {} leaves rank {} without rows (shards of ceil(M/R) = {} rows over {} ranks); use M > {}", op,
                m, world - 1, s.per_rank, world, (world - 1) * s.per_rank);
  TESSERA_CHECK(m_local == s.rows(m, rank),
                "{}: m_local = {} on rank {} but a ragged split of M = {} over {} ranks gives it {} rows "
                "(shards of ceil(M/R) = {}, the last ones shorter)",
                op, m_local, rank, m, world, s.rows(m, rank), s.per_rank);
}

void check_nk(const char* op, std::int64_t n, std::int64_t k) {
  TESSERA_CHECK(n >= 1 && n < (std::int64_t{1} << 31), "{}: N = {} out of range [1, 2^31)", op, n);
  TESSERA_CHECK(k >= 8 && k < (std::int64_t{1} << 31), "{}: K = {} out of range [8, 2^31)", op, k);
  TESSERA_CHECK(k % 8 == 0, "{}: K = {} must be a multiple of 8 (16-byte rows for TMA)", op, k);
}

// B of the layout: [N, K] (row length K) or with b_kn [K, N] (row length N,
// which must then keep 16-byte rows for the B tensor map).
void check_b(const char* op, bool b_kn, std::int64_t n, std::int64_t k, std::int64_t ldb) {
  if (b_kn)
    TESSERA_CHECK(n % 8 == 0, "{}: N = {} must be a multiple of 8 with b_kn (B [K, N] needs 16-byte rows for TMA)", op,
                  n);
  const std::int64_t row = b_kn ? n : k, rows = b_kn ? k : n;
  check_ld(op, "ldb", ldb ? ldb : row, row);
  check_extent_bytes(op, "B", rows, ldb ? ldb : row);
}

}  // namespace

void validate(const AgGemmArgs& a, int rank, int world, const char* op) {
  check_common(op, a.dtype, rank, world);
  check_nk(op, a.n, a.k);
  check_rows(op, a.m, a.m_local, rank, world);
  check_ptr(op, "A", a.a);
  check_ptr(op, "B", a.b);
  check_ptr(op, "D", a.d);
  if (a.gathered_a) check_ptr(op, "gathered_a", a.gathered_a);
  if (a.swiglu) TESSERA_CHECK(a.n % 2 == 0, "{}: N = {} must be even with the SiLU(gate)*up epilogue", op, a.n);
  TESSERA_CHECK(!(a.swiglu && a.b_kn),
                "{}: swiglu needs B as [N, K] (gate and up interleaved by rows); b_kn = true is not supported with it",
                op);
  check_ld(op, "lda", a.lda ? a.lda : a.k, a.k);
  check_b(op, a.b_kn, a.n, a.k, a.ldb);
  const std::int64_t n_out = a.swiglu ? a.n / 2 : a.n;
  check_ld(op, "ldd", a.ldd ? a.ldd : n_out, n_out);
  check_extent_bytes(op, "A", a.m, a.lda ? a.lda : a.k);  // gathered
}

namespace {
// The row-parallel GEMM's operands (gemm_rs, gemm_ar): D[rows, N] = A[M, K]·Bᵀ
// (b_kn: A·B).
template <class Args>
void check_row_parallel(const Args& a, std::int64_t m_local, bool b_kn, int rank, int world, const char* op) {
  check_common(op, a.dtype, rank, world);
  check_nk(op, a.n, a.k);
  check_rows(op, a.m, m_local, rank, world);
  check_ptr(op, "A", a.a);
  check_ptr(op, "B", a.b);
  check_ptr(op, "D", a.d);
  check_ld(op, "lda", a.lda ? a.lda : a.k, a.k);
  check_b(op, b_kn, a.n, a.k, a.ldb);
  check_ld(op, "ldd", a.ldd ? a.ldd : a.n, a.n);
  check_extent_bytes(op, "A", a.m, a.lda ? a.lda : a.k);
  check_extent_bytes(op, "D", a.m, a.ldd ? a.ldd : a.n);
}
}  // namespace

void validate(const GemmRsArgs& a, int rank, int world, const char* op) {
  check_row_parallel(a, a.m_local, a.b_kn, rank, world, op);
}

void validate(const GemmArArgs& a, int rank, int world, const char* op) {
  // Every rank owns (reduces) a ragged row shard, as in gemm_rs.
  check_row_parallel(a, shard_rows(a.m, world).rows(a.m, rank), false, rank, world, op);
}

void validate(const MlpArgs& a, int rank, int world, const char* op) {
  check_common(op, a.dtype, rank, world);
  // Bounds first: the operator forms 2 * I/R (the gate/up GEMM's N) and
  // M * I/R (the hidden activation) from these.
  TESSERA_CHECK(a.h >= 8 && a.h < kMaxDim && a.h % 8 == 0, "{}: H = {} must be a multiple of 8 in [8, 2^31)", op, a.h);
  TESSERA_CHECK(a.i_local >= 8 && a.i_local < kMaxDim / 2 && a.i_local % 8 == 0,
                "{}: I/R = {} must be a multiple of 8 in [8, 2^30) (the gate/up GEMM has 2*I/R rows)", op, a.i_local);
  check_rows(op, a.m, a.m_local, rank, world);
  check_extent_bytes(op, "x", a.m, a.h);
  check_extent_bytes(op, "w_gate_up", 2 * a.i_local, a.h);
  check_extent_bytes(op, "w_down", a.h, a.i_local);
  check_extent_bytes(op, "the hidden activation", a.m, 2 * a.i_local);
  check_ptr(op, "x", a.x);
  check_ptr(op, "w_gate_up", a.w_gate_up);
  check_ptr(op, "w_down", a.w_down);
  check_ptr(op, "out", a.out);
}

bool ShapeSignature::operator<(const ShapeSignature& o) const {
  return std::tie(op, dtype, strategy, flags, m, n, k) < std::tie(o.op, o.dtype, o.strategy, o.flags, o.m, o.n, o.k);
}

}  // namespace tessera::ops
