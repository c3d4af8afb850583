// src/ops/tuning.hpp — the measuring half of the ops tuner (tuner.hpp holds
// the choice and its cache entries): every operator with an `automatic`
// strategy (TpContext's GEMM operators, sp_attention) resolves through
// tune_choice, so all of them measure, agree across ranks and cache alike.
// Internal to src/ops.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/ops/args.hpp"
#include "tessera/ops/tuner.hpp"
#include "tessera/runtime/process_group.hpp"
#include "tessera/tune/cache.hpp"
#include "tessera/tune/key.hpp"

namespace tessera::ops::detail {

/// A context's tuner state: the choices of this process (by key) and the
/// on-disk cache, opened at first use.
struct TuneState {
  std::map<std::string, Strategy> memo;  ///< measured or read from the cache
  /// Choices taken from a neighbour (tune_on_miss off): reused by later such
  /// calls, but a call that may tune measures the shape anyway.
  std::map<std::string, Strategy> guessed;
  nlohmann::json measured = nlohmann::json::object();  ///< choices this process measured (cache entry form)
  std::unique_ptr<tune::Cache> cache;
};

/// One operator call's question to the tuner.
struct TuneQuery {
  std::string prefix;               ///< tune::key_prefix(machine, dtype, "ops.<op>")
  std::vector<std::int64_t> shape;  ///< the key's shape: `sized` dimensions, then flags
  std::size_t sized = 0;            ///< leading dimensions a neighbour may differ in (by ratio)
  bool use_cache = true;            ///< OpOptions::use_cache
  bool tune_on_miss = true;         ///< OpOptions::tune_on_miss
};

/// The machine part of every choice key (GPU model, topology, world).
tune::MachineId machine_id(runtime::ProcessGroup& pg);

/// What tune_choice needs from its operator: `drain(what)` waits, bounded,
/// for every stream the operator uses (throws on a stuck wait); `run(s)`
/// enqueues one call of the operator with strategy `s` on pg.stream().
struct TuneHooks {
  std::function<void(const char*)> drain;
  std::function<void(Strategy)> run;
};

/// Median over `reps` of one call of each candidate (after `warmup`), max
/// over ranks, timed run by run behind the TunerLoad GEMMs (tuning.cpp).
/// `load_ms` (optional) receives the load GEMMs' median time; `evidence`
/// (optional) each candidate's paired evidence against the first candidate
/// (the largest median ratio and the smallest win share over ranks).
std::map<Strategy, double> time_candidates(runtime::ProcessGroup& pg, const TuneHooks& hooks,
                                           const std::vector<Strategy>& candidates, int warmup, int reps,
                                           double* load_ms = nullptr,
                                           std::map<Strategy, PairedEvidence>* evidence = nullptr);

/// The strategy for q's key (prefix + shape): this process's memo, else the
/// on-disk cache when every rank holds the same valid choice (`use_cache`),
/// else — with tune_on_miss — measured now and stored, or — without — the
/// nearest measured shape's choice (tuner.hpp's nearest_choice), or
/// the baseline, agreed by one host exchange. Collective: every rank calls
/// it with the same query and candidates. The first candidate is the
/// baseline (normally sequential): the default without a measurement and the
/// time any other must beat. A single candidate is taken without measuring.
Strategy tune_choice(runtime::ProcessGroup& pg, TuneState& st, const TuneQuery& q,
                     const std::vector<Strategy>& candidates, const TuneHooks& hooks, TuneReport* report);

/// The choice an earlier tune_choice made for `q`'s key in this process
/// (measured, from the cache or guessed), which every rank agreed on; no
/// exchange, so it may be asked inside a CUDA-graph capture.
std::optional<Strategy> agreed_choice(const TuneState& st, const TuneQuery& q);

}  // namespace tessera::ops::detail
