// src/ops/strategy_registry.hpp — an operator's strategies as data: each
// strategy's launcher lives in its own file as a StrategyEntry, and the
// operator's registry lists the entries. The operator dispatches through
// find() and the tuner measures candidates(), so no operator switches over
// strategies. A registry holds exactly the strategies the strategy table
// (args.hpp) gives its operator, checked when it is built. The launcher type
// is the operator's own (its context and arguments), and an operator that
// asks more of a strategy than its launcher names that in `Info` (sp_attention:
// its workspace), so operators with other contexts (the TP operators,
// sp_attention, the MoE layers) hold registries of the same kind. Internal to
// src/ops.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <vector>

#include "tessera/ops/args.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops::detail {

/// What the tuner knows of a call when it lists the candidates.
struct CandidateQuery {
  int world = 1;
  bool lsa = true;              ///< every rank load/store reachable
  bool tile_row_shards = true;  ///< every shard boundary on a tile row of the operator's tile
  bool heads_divide = true;     ///< attention: heads_q and heads_kv multiples of the world size
  bool two_level_mesh = true;   ///< attention: two_level's degree u has 1 < u < R (neither the ring nor Ulysses)
};

/// When the tuner measures a strategy: the conditions its protocol needs.
struct StrategyNeeds {
  int min_world = 1;             ///< fewer ranks: nothing for it to overlap, or it is another candidate there
  bool lsa = false;              ///< symmetric memory, peer stores or copies
  bool tile_row_shards = false;  ///< no tile with two owners
  bool heads_divide = false;     ///< head-sharded layouts
  bool two_level_mesh = false;   ///< a u x R/u mesh of its own
  constexpr bool met_by(const CandidateQuery& q) const {
    return q.world >= min_world && (q.lsa || !lsa) && (q.tile_row_shards || !tile_row_shards) &&
           (q.heads_divide || !heads_divide) && (q.two_level_mesh || !two_level_mesh);
  }
};

/// Nothing asked of a strategy beyond its launcher (the TP operators).
struct NoStrategyInfo {};

/// One strategy of an operator: its code, when the tuner measures it, its
/// launcher (enqueues one call on the operator's stream; arguments and
/// options already validated) and what else the operator asks of it.
template <class Launch, class Info = NoStrategyInfo>
struct StrategyEntry {
  Strategy strategy = Strategy::sequential;
  StrategyNeeds needs{};
  Launch launch = nullptr;
  /// Runs OpOptions::diag_kernel_only (replays its kernel without communication).
  bool diag_kernel_only = false;
  Info info{};
};

/// An operator's strategies, in candidate order: the first is the tuner's
/// baseline and must be sequential.
template <class Launch, class Info = NoStrategyInfo>
class StrategyRegistry {
 public:
  using Entry = StrategyEntry<Launch, Info>;

  /// Throws tessera::Error when the entries and the strategy table disagree
  /// for `op` (a missing or extra strategy, a duplicate, no sequential first).
  StrategyRegistry(OpKind op, const char* name, std::initializer_list<const Entry*> entries)
      : name_(name), entries_(entries) {
    TESSERA_CHECK(!entries_.empty() && entries_.front()->strategy == Strategy::sequential,
                  "{}: the strategy registry must start with sequential (the tuner's baseline)", name_);
    for (const StrategyInfo& i : strategy_table()) {
      if (i.strategy == Strategy::automatic) continue;
      const auto n =
          std::count_if(entries_.begin(), entries_.end(), [&](const Entry* e) { return e->strategy == i.strategy; });
      TESSERA_CHECK(n == (accepts(op, i.strategy) ? 1 : 0),
                    "{}: strategy {} is registered {} times, but the strategy table {} it for this operator", name_,
                    i.name, n, accepts(op, i.strategy) ? "lists" : "does not list");
    }
  }

  /// The entry of `s`; throws tessera::Error naming the operator when it has none.
  const Entry& find(Strategy s) const {
    for (const Entry* e : entries_)
      if (e->strategy == s) return *e;
    TESSERA_FAIL("{}: strategy {} cannot run here", name_, strategy_name(s));
  }

  /// The strategies the tuner measures for `q`, baseline first.
  std::vector<Strategy> candidates(const CandidateQuery& q) const {
    std::vector<Strategy> c;
    for (const Entry* e : entries_)
      if (e->needs.met_by(q)) c.push_back(e->strategy);
    return c;
  }

  /// Every registered strategy, in candidate order.
  std::vector<Strategy> strategies() const {
    std::vector<Strategy> s;
    for (const Entry* e : entries_) s.push_back(e->strategy);
    return s;
  }

  const char* name() const { return name_; }

 private:
  const char* name_;
  std::vector<const Entry*> entries_;
};

}  // namespace tessera::ops::detail
