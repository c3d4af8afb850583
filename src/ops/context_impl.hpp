// src/ops/context_impl.hpp — what a TpContext owns: signals, symmetric and
// local workspaces, epochs, events, the validated-shape set and the tuner's
// memo. Internal to src/ops.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tessera/ops/tp_mlp.hpp"
#include "tessera/runtime/signals.hpp"
#include "tessera/runtime/symmetric_heap.hpp"
#include "strategy_registry.hpp"
#include "tessera/tune/cache.hpp"
#include "tuning.hpp"

namespace tessera::ops {

/// A growable local device buffer (cudaMalloc).
class LocalBuffer {
 public:
  LocalBuffer() = default;
  ~LocalBuffer();
  LocalBuffer(const LocalBuffer&) = delete;
  LocalBuffer& operator=(const LocalBuffer&) = delete;
  /// Grows to at least `bytes`; contents are undefined after growth. The
  /// old contents may still be in use: before freeing them it waits, with a
  /// bound, for `owner`'s streams (TpContext::Impl::drain) or, without an
  /// owner, for `sync_stream` — never an unbounded synchronization, since
  /// cudaFree waits for the whole device.
  void* ensure(std::size_t bytes, cudaStream_t sync_stream);
  void* get() const { return p_; }
  TpContext::Impl* owner = nullptr;

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

struct TpContext::Impl {
  explicit Impl(runtime::ProcessGroup& pg);
  ~Impl();

  runtime::ProcessGroup& pg;
  /// Every rank load/store reachable (ProcessGroup::lsa_reachable, which
  /// TESSERA_NO_LSA / TESSERA_TOPOLOGY=net turn off). Without it the context
  /// allocates no symmetric memory and no Signals (those members stay
  /// empty), and only the NCCL-based strategy (sequential) runs.
  const bool lsa;
  LocalBuffer ag_local;                           ///< without lsa: sequential AG+GEMM's gathered A (instead of ag_ws)
  std::unique_ptr<runtime::Signals> ag_flags;     ///< kMaxChannels slots: per-source channel flags
  std::unique_ptr<runtime::Signals> control;      ///< kControlSlots
  std::unique_ptr<runtime::Signals> rs_counters;  ///< slots = tile rows (grown)
  /// fused_ce GEMM+RS, slot = band of tile rows (grown): own row = this
  /// rank's band tile counters (GEMM epilogue adds, copy stream waits for
  /// rs_band_total[band]); row src = src's "band copied" flags (epoch).
  std::unique_ptr<runtime::Signals> rs_bands;
  std::vector<std::uint64_t> rs_band_total;   ///< tiles counted per slot since the flags were last zeroed
  runtime::SymBuffer<unsigned char> ag_ws;    ///< gathered A: [R·ceil(M/R), K]
  runtime::SymBuffer<unsigned char> rs_recv;  ///< receive slabs: [R][ceil(M/R)][ld_recv]
  runtime::SymBuffer<unsigned char> ar_recv;  ///< gemm_ar: the owners' reduced rows, same layout
  LocalBuffer staging;                        ///< sequential/decomposition partials, pre-activation GEMM outputs
  LocalBuffer rs_out;                         ///< sequential RS output when it cannot land in D directly
  LocalBuffer hidden;                         ///< mlp: the intermediate activation [M, I/R]
  LocalBuffer push_done;                      ///< SM pusher's per-chunk CTA counters (zero between calls)
  std::uint64_t ag_epoch = 0;
  std::uint64_t rs_epoch = 0;
  /// The last fused_ce call's epoch (0: none since the flags were made) and
  /// AG channel count: what OpOptions::diag_kernel_only replays.
  std::uint64_t ag_ce_epoch = 0, rs_ce_epoch = 0;
  int ag_ce_channels = 0;
  cudaEvent_t ev_ready = nullptr, ev_comm_done = nullptr, ev_rx_done = nullptr;
  /// Ring RS's add/push chain: non-blocking, highest priority, so its small
  /// add kernels get SMs as soon as the concurrent GEMM's CTAs retire (a
  /// normal-priority stream would queue behind the GEMM's remaining waves and
  /// lag the ring by a GEMM per hop). Every call joins it back into pg.stream().
  cudaStream_t ring_stream = nullptr;
  std::set<ShapeSignature> validated;
  detail::TuneState tune;  ///< the tuner's choices of this process and its cache

  /// Once per signature: every rank passes the same bytes (else tessera::Error).
  void check_agreement(const ShapeSignature& sig, const char* op);
  /// Collective growth of the symmetric workspaces (synchronizes and
  /// barriers first: peers may still be reading or writing the old ones).
  /// Without lsa, ensure_ag_ws grows the local ag_local instead.
  void ensure_ag_ws(std::size_t bytes);
  /// AG+GEMM's gathered-A workspace: ag_ws.local(), or ag_local without lsa.
  unsigned char* ag_workspace() const;
  void ensure_rs(std::size_t recv_bytes, int tile_rows);
  /// Collective growth of rs_bands to >= `bands` slots (totals restart at 0).
  void ensure_rs_bands(int bands);
  void ensure_ar(std::size_t recv_bytes);
  /// Waits for the compute, comm and ring streams, bounded by
  /// TESSERA_WAIT_TIMEOUT_MS (link::synchronize's diagnostics with lsa,
  /// runtime::bounded_sync without). On failure the context is broken and
  /// the process group aborted (ncclCommAbort), and the Error names the rank
  /// and `what` (used before growth and during tuning).
  /// drain() before a workspace grows; an error inside a CUDA-graph capture
  /// (the growth must happen in an eager call first).
  void before_growth(const char* what);
  /// A CUDA-graph capture ran an operator of this context. From then on a
  /// growing workspace is retired instead of freed (a graph may hold its
  /// address) and freed with the context, and every eager call resets the
  /// flags (begin_call).
  bool captured = false;
  /// The capture whose first call enqueued reset_flags (0: none yet).
  unsigned long long reset_capture = 0;
  /// Every strategy's call starts here (run_ag_gemm, run_gemm_rs,
  /// run_gemm_ar): reset_flags where flag_call_start (plan.hpp) says so — at
  /// the first call of a capture (enqueued into the graph, so every replay
  /// starts from zeroed flags and epoch 1) and on every eager call after a
  /// capture (a replay, which the host does not see, may have left its
  /// epochs in the flags).
  void begin_call();
  /// Enqueues on the compute stream: a stream barrier (every rank's earlier
  /// calls done, so no write of theirs into our flags is still coming), the
  /// zeroing of our flags and counters, a second barrier (every rank zeroed
  /// before any rank's next call writes a flag); restarts the host's epochs
  /// and band totals at 0.
  void reset_flags();
  void retire(runtime::SymBuffer<unsigned char>& b);
  void retire(std::unique_ptr<runtime::Signals>& s);
  std::vector<runtime::SymBuffer<unsigned char>> retired_buffers;
  std::vector<std::unique_ptr<runtime::Signals>> retired_signals;
  std::vector<void*> retired_local;  ///< LocalBuffer allocations (cudaFree at teardown)
  void drain(const char* what);
  /// Throws if an earlier drain failed (see `broken`).
  void check_usable(const char* what) const;
  std::string broken;  ///< why a drain failed; non-empty: every operator call refuses
  cudaStream_t comm() const { return pg.comm_stream(0); }
};

/// A TP operator's strategy launcher: enqueues one call with one strategy
/// (src/ops/<operator>/<strategy>.cpp); validation and agreement are done
/// by the caller.
template <class Args>
using TpLaunch = void (*)(TpContext::Impl&, const Args&, const OpOptions&);
template <class Args>
using TpRegistry = detail::StrategyRegistry<TpLaunch<Args>>;
template <class Args>
using TpStrategy = detail::StrategyEntry<TpLaunch<Args>>;

/// The TP operators' registries (ag_gemm.cpp, gemm_rs.cpp, gemm_ar.cpp).
const TpRegistry<AgGemmArgs>& ag_gemm_registry();
const TpRegistry<GemmRsArgs>& gemm_rs_registry();
const TpRegistry<GemmArArgs>& gemm_ar_registry();

/// One call of strategy `s` through the operator's registry (an error
/// naming the operator for a strategy it does not have).
void run_ag_gemm(TpContext::Impl& c, const AgGemmArgs& a, Strategy s, const OpOptions& o);
void run_gemm_rs(TpContext::Impl& c, const GemmRsArgs& a, Strategy s, const OpOptions& o);
void run_gemm_ar(TpContext::Impl& c, const GemmArArgs& a, Strategy s, const OpOptions& o);

}  // namespace tessera::ops
