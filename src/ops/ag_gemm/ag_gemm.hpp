// src/ops/ag_gemm/ag_gemm.hpp — what AllGather+GEMM's strategies share
// (ag_gemm.cpp): one call's geometry and workspace, the shard copy-in, the
// local GEMM, the copy-engine pushes and the end of a call. Each strategy's
// launcher is in its own file here and registered in ag_gemm.cpp.
//
// Every strategy but decomposition on a packed A starts by copying this
// rank's shard into its rows of the symmetric gathered-A workspace (packed,
// row stride K) on the compute stream (decomposition reads and pushes A
// itself); every strategy ends by telling every peer kAgFree = epoch once
// its GEMM has read the workspace; a rank pushes into a peer only after that
// peer's kAgFree reached the previous epoch. Internal to src/ops.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../context_impl.hpp"
#include "tessera/kernels/gemm.hpp"

namespace tessera::ops::ag {

/// One AG+GEMM call: the plan and the gathered-A workspace (grown by begin()).
struct Call {
  TpContext::Impl& c;
  const AgGemmArgs& a;
  AgPlan plan;
  int world = 1, rank = 0;
  cudaStream_t st = nullptr;
  std::int64_t es = 0, row_bytes = 0;  ///< element size; bytes of a row of A
  std::int64_t lo = 0;                 ///< first gathered row of this rank's shard
  std::int64_t n_out = 0, ldd = 0, lda = 0;
  unsigned char* ws = nullptr;  ///< the gathered A (ag_workspace())
  std::uint64_t epoch = 0;      ///< set by the strategy
  void* tmp = nullptr;          ///< swiglu: the pre-activation GEMM output (stage_shard())
  unsigned char* my_rows() const { return ws + lo * row_bytes; }
};

/// The plan for `channels` channels and the workspace grown to it.
Call begin(TpContext::Impl& c, const AgGemmArgs& a, int channels);
/// My shard into my rows of the workspace (compute stream, an SM copy).
void copy_in(const Call& k);
/// The copy-in unless `skip` (the strategy reads A in place), then the
/// swiglu staging buffer.
void stage_shard(Call& k, bool skip_copy_in);
/// Leading dimension of the swiglu staging buffer: N rounded up to 8 elements.
std::int64_t swiglu_tmp_ld(std::int64_t n);
/// B's layout and row stride (packed: K for [N, K], N for b_kn's [K, N]).
kernels::BLayout b_layout(const AgGemmArgs& a);
std::int64_t b_ld(const AgGemmArgs& a);
/// cuBLASLt D[rows, N] = A[rows, K] · Bᵀ (b_kn: A · B), or with swiglu through `tmp`
/// ([rows, N]) and the SiLU·up kernel into D[rows, N/2].
void local_gemm(const AgGemmArgs& a, const void* a_rows, std::int64_t rows, void* d_rows, void* tmp, cudaStream_t s);
/// The comm stream waits for the compute stream's work so far.
void fork_comm(const Call& k);
/// Copy-engine pushes of my shard (packed rows from `src`: my rows of the
/// workspace, or A itself) to every peer, channel by channel, each followed
/// by a flag store (value = epoch) on the destination.
void push_copy_engine(const Call& k, const unsigned char* src);
/// The fused kernel (kAgTile ping-pong, per-tile waits on the
/// channels' flags), leaving `max_ctas` SMs (0: all); with `from_input` my
/// rows are read from A in place.
void launch_fused(const Call& k, int max_ctas, bool from_input);

/// How a call ends.
struct Finish {
  bool from_input = false;  ///< the shard was never copied in (gathered_a needs it)
  bool join_comm = true;    ///< the compute stream waits for the comm stream's pushes
  bool notify = true;       ///< peers told kAgFree = epoch
};
/// gathered_a, the comm join and the kAgFree notifies.
void finish(const Call& k, const Finish& f);

/// The strategies (one file each).
extern const TpStrategy<AgGemmArgs> sequential;
extern const TpStrategy<AgGemmArgs> decomposition;
extern const TpStrategy<AgGemmArgs> fused_ce;
extern const TpStrategy<AgGemmArgs> fused_sm;

}  // namespace tessera::ops::ag
