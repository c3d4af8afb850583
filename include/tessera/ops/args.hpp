// tessera/ops/args.hpp — arguments, strategies and host-side validation of
// the tensor-parallel MLP operators (AllGather+GEMM, GEMM+ReduceScatter, MLP).
//
// Row sharding over R ranks (ragged allowed): shard s holds rows
// [s*ceil(M/R), min((s+1)*ceil(M/R), M)); every shard must be non-empty
// (M > (R-1)*ceil(M/R)). All matrices row-major; B is [N, K] (the nn.Linear
// weight layout, D = A·Bᵀ), or with b_kn (ag_gemm, gemm_rs) [K, N] (D = A·B:
// the backward's dX = dY·W with W the nn.Linear weight, read in place instead
// of transposed). A, B, D share one dtype (bf16 or f16).
//
// Validation here is pure host logic (no CUDA call, no communication), so it
// is CPU-tested; the cross-rank agreement check (same shape/dtype/strategy on
// every rank) is done by TpContext through ProcessGroup::check_same_on_all_ranks
// once per new shape signature.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "tessera/runtime/dtype.hpp"

namespace tessera::ops {

/// How an operator runs.
///  sequential    — cuBLASLt GEMM + NCCL collective, one after the other (the baseline)
///  decomposition — per-shard cuBLASLt GEMMs overlapped with copy-engine
///                  transfers on a second stream (the PyTorch async-TP idea)
///  fused_ce      — Tessera GEMM engine, transfers on the copy engine. AG: a
///                  per-tile wait prologue on the channels' flags. RS: remote
///                  rows staged locally and counted per band of tile rows, each
///                  band copied to its owner as soon as it is complete, the
///                  owner adding the peers' bands in its own tiles' epilogue
///                  (needs ceil(M/R) a multiple of the 64-row tile)
///                  GEMM+AR: the same reduce-scatter, then each owner's reduced
///                  bands copied to every peer on the copy engine as they complete
///  fused_sm      — AG: the same GEMM, transfers pushed by a few CTAs
///  ring          — GEMM+RS only: TileLink's ring reduce-scatter (Fig. 4): per-shard
///                  GEMMs in ring order, running sums passed to rank r-1 chunk by
///                  chunk (RingRsPlan); for R > 2 (at R = 2 it is the direct push)
///  pipelined     — the MoE layers only: moe_tp's per-token-shard grouped GEMMs
///                  pipelined with NCCL send/recv on a comm stream (all-gather
///                  steps hidden behind the own shard's gate/up GEMM,
///                  reduce-scatter steps behind the next shard's down GEMM;
///                  docs/design/moe_tp.md); moe_ep's per-slab GEMMs beside
///                  the dispatch and return (docs/design/moe_ep.md)
///  ulysses       — sp_attention only: all-to-all sequence <-> heads, then whole-sequence attention
///  two_level     — sp_attention only: Ulysses inside groups of u ranks, ring
///                  attention across the R / u groups (two_level_attention.hpp)
///  automatic     — the tuner's cached or measured choice
enum class Strategy : int {
  automatic = 0,
  sequential = 1,
  decomposition = 2,
  fused_ce = 3,
  fused_sm = 4,
  ring = 5,
  ulysses = 6,
  pipelined = 7,
  two_level = 8,
};

/// The operators a strategy table entry names (a bit each).
enum class OpKind : unsigned {
  ag_gemm = 1u,
  gemm_rs = 2u,
  gemm_ar = 4u,
  sp_attention = 8u,
  moe_tp = 16u,
  moe_ep = 32u,
};

/// The strategy table: each strategy's code (the enum value, also the C
/// API's TESSERA_* code), its name, and the operators that take it. The
/// operators' strategy checks, the C API (tessera_strategy_name /
/// tessera_strategy_accepts) and Python (checked against it when a context
/// opens) read this one table.
struct StrategyInfo {
  Strategy strategy;
  std::string_view name;
  unsigned ops;  ///< OpKind bits
};
/// Entries of the strategy table (codes 0 .. kStrategyCount - 1).
inline constexpr std::size_t kStrategyCount = 9;
const std::array<StrategyInfo, kStrategyCount>& strategy_table();
/// The entry of a strategy code; nullptr for a code that names none.
const StrategyInfo* find_strategy(int code);
/// True when `op` takes strategy `s` (explicitly; automatic resolves to one of them).
bool accepts(OpKind op, Strategy s);

std::string_view strategy_name(Strategy s);
/// Parses a strategy name (as printed by strategy_name; "auto" is taken for
/// automatic too); throws tessera::Error.
Strategy parse_strategy(std::string_view name);

/// D[M, N] = AllGather(A)[M, K] · Bᵀ. With swiglu, B is the fused gate/up
/// weight with gate and up interleaved by rows (row 2j = gate_j, row 2j+1 =
/// up_j), N even, and D[M, N/2] = SiLU(gate)·up. With b_kn, B is [K, N]
/// and D = AllGather(A)·B (not with swiglu).
struct AgGemmArgs {
  const void* a = nullptr;   ///< this rank's shard [m_local, K], row stride lda
  const void* b = nullptr;   ///< [N, K] (b_kn: [K, N]), row stride ldb
  void* d = nullptr;         ///< [M, N] (or [M, N/2] with swiglu), row stride ldd
  std::int64_t m = 0;        ///< total (gathered) rows
  std::int64_t m_local = 0;  ///< rows of this rank's shard
  std::int64_t n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldd = 0;  ///< elements; 0 = packed
  DType dtype = DType::bf16;
  bool swiglu = false;
  bool b_kn = false;           ///< B given as [K, N] row-major (ldb >= N, N % 8 == 0)
  void* gathered_a = nullptr;  ///< optional out: the gathered A [M, K], packed
};

/// D_local[m_local, N] = rows of this rank's shard of Σ_ranks A_r[M, K] · B_rᵀ
/// (with b_kn: Σ_ranks A_r · B_r, B_r [K, N]).
struct GemmRsArgs {
  const void* a = nullptr;  ///< [M, K] (this rank's K shard), row stride lda
  const void* b = nullptr;  ///< [N, K] (b_kn: [K, N]), row stride ldb
  void* d = nullptr;        ///< [m_local, N], row stride ldd
  std::int64_t m = 0, m_local = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldd = 0;
  DType dtype = DType::bf16;
  bool b_kn = false;  ///< B given as [K, N] row-major (ldb >= N, N % 8 == 0)
};

/// D[M, N] = Σ_ranks A_r[M, K] · B_rᵀ on every rank (GEMM + AllReduce: the
/// row-parallel GEMM of a tensor-parallel layer without sequence parallelism).
/// Every rank ends with the same D, bit for bit.
struct GemmArArgs {
  const void* a = nullptr;  ///< [M, K] (this rank's K shard), row stride lda
  const void* b = nullptr;  ///< [N, K], row stride ldb
  void* d = nullptr;        ///< [M, N], row stride ldd: the full sum
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldd = 0;
  DType dtype = DType::bf16;
};

/// Tensor-parallel MLP: out = RS( SiLU(AG(x)·Wgᵀ) ⊙ (AG(x)·Wuᵀ) · Wdᵀ ).
struct MlpArgs {
  const void* x = nullptr;          ///< [m_local, H] this rank's token shard
  const void* w_gate_up = nullptr;  ///< [2·I_local, H], gate/up interleaved by rows
  const void* w_down = nullptr;     ///< [H, I_local]
  void* out = nullptr;              ///< [m_local, H]
  std::int64_t m = 0, m_local = 0;  ///< tokens (S) and this rank's share
  std::int64_t h = 0;               ///< hidden size
  std::int64_t i_local = 0;         ///< intermediate size per rank (I / R)
  DType dtype = DType::bf16;
};

/// Rows of shard s (ragged: the last shards may be shorter).
struct ShardRows {
  std::int64_t per_rank = 0;  ///< ceil(M / R)
  std::int64_t lo(int s) const { return s * per_rank; }
  std::int64_t rows(std::int64_t m, int s) const;
};
ShardRows shard_rows(std::int64_t m, int world);

/// Host checks (throw tessera::Error naming the op and the value): dtype
/// bf16/f16, pointers non-null and 16-byte aligned (TMA), K % 8 == 0,
/// leading dimensions multiples of 8 and >= row length, world in [1, 16],
/// m_local equal to this rank's ragged shard, every shard non-empty,
/// swiglu ⇒ N even; b_kn ⇒ N % 8 == 0, ldb >= N, not with swiglu (the
/// gate/up interleave is by rows of [N, K]). Upper bounds: M, N, K, H and every leading dimension
/// below 2^31, I/R below 2^30 (checked before 2·I/R is formed), and every
/// operand's rows x leading dimension x 2 bytes at most 2^48 (overflow-checked).
void validate(const AgGemmArgs& a, int rank, int world, const char* op = "ag_gemm");
void validate(const GemmRsArgs& a, int rank, int world, const char* op = "gemm_rs");
void validate(const GemmArArgs& a, int rank, int world, const char* op = "gemm_ar");
void validate(const MlpArgs& a, int rank, int world, const char* op = "mlp");

/// What every rank must agree on (compared byte-wise across ranks).
struct ShapeSignature {
  std::int32_t op = 0;  ///< 1 ag_gemm, 2 gemm_rs, 3 mlp, 4 gemm_ar
  std::int32_t dtype = 0;
  std::int32_t strategy = 0;
  std::int32_t flags = 0;  ///< per op: swiglu, gathered_a requested, b_kn, rs_reduce, channels
  std::int64_t m = 0, n = 0, k = 0;
  bool operator<(const ShapeSignature& o) const;
};

}  // namespace tessera::ops
