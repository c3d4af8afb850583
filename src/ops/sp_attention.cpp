// Sequence-parallel attention: the registry of its strategies
// (src/ops/sp_attention/, one file each; sp_attention.hpp describes the plan
// and the protocol), the steps the gathered-KV strategies share, the checks
// and automatic's choice.
#include "tessera/ops/sp_attention.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "sp_attention/sp_attention.hpp"
#include "sp_attention_kernels.hpp"
#include "tessera/kernels/attention.hpp"
#include "tessera/link/host_primitives.hpp"
#include "tessera/ops/plan.hpp"
#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops {

// SpStrategy's codes are the strategy table's.
static_assert(static_cast<int>(SpStrategy::automatic) == static_cast<int>(Strategy::automatic) &&
              static_cast<int>(SpStrategy::sequential) == static_cast<int>(Strategy::sequential) &&
              static_cast<int>(SpStrategy::fused_ce) == static_cast<int>(Strategy::fused_ce) &&
              static_cast<int>(SpStrategy::ring) == static_cast<int>(Strategy::ring) &&
              static_cast<int>(SpStrategy::ulysses) == static_cast<int>(Strategy::ulysses) &&
              static_cast<int>(SpStrategy::two_level) == static_cast<int>(Strategy::two_level));

const SpRegistry& sp_attention_registry() {
  static const SpRegistry r(OpKind::sp_attention, "sp_attention",
                            {&sp::sequential, &sp::fused_ce, &sp::ring, &sp::ulysses, &sp::two_level});
  return r;
}

std::vector<Strategy> sp_attention_candidates(int world, bool lsa, bool heads_divide, bool two_level) {
  return sp_attention_registry().candidates(
      {.world = world, .lsa = lsa, .heads_divide = heads_divide, .two_level_mesh = two_level});
}

SpAttnContext::Impl::Impl(runtime::ProcessGroup& g) : pg(g) {
  TESSERA_CHECK(pg.world() <= runtime::kMaxPeers, "sp_attention: world {} > {}", pg.world(), runtime::kMaxPeers);
  TESSERA_CHECK(pg.lsa_reachable(), "sp_attention: not every rank is load/store reachable (lsa size {} of {})",
                pg.lsa_size(), pg.world());
  TESSERA_CHECK(pg.comm_stream_count() >= 1, "sp_attention: the process group has no communication stream");
  data = std::make_unique<runtime::Signals>(pg, kSlots);
  control = std::make_unique<runtime::Signals>(pg, 1);
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&ev_ready, cudaEventDisableTiming));
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&ev_comm_done, cudaEventDisableTiming));
}

SpAttnContext::Impl::~Impl() {
  for (auto& [key, table] : tables) cudaFree(table);
  if (ev_ready) cudaEventDestroy(ev_ready);
  if (ev_comm_done) cudaEventDestroy(ev_comm_done);
}

namespace {

/// The device copy of make()'s table under `key`, made once per context.
template <class Make>
const std::int32_t* device_table(runtime::ProcessGroup& pg, std::map<std::vector<std::int64_t>, std::int32_t*>& tables,
                                 std::vector<std::int64_t> key, Make make) {
  if (auto it = tables.find(key); it != tables.end()) return it->second;
  TESSERA_CHECK(!runtime::stream_capturing(pg.stream()),
                "sp_attention: a new shape's device table inside a CUDA-graph capture: run the same call once eagerly "
                "before capturing it");
  const std::vector<std::int32_t> host = make();
  std::int32_t* dev = nullptr;
  TESSERA_CUDA_CHECK(cudaMalloc(&dev, host.size() * sizeof(std::int32_t)));
  tables[std::move(key)] = dev;
  // Synchronous: once per shape, before the kernel that reads it is queued.
  TESSERA_CUDA_CHECK(cudaMemcpy(dev, host.data(), host.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
  return dev;
}

enum TableTag : std::int64_t { kArrivalOrderTable = 0, kFlagTable = 1 };

}  // namespace

const std::int32_t* SpAttnContext::Impl::arrival_order(const SpAttnPlan& plan, std::int64_t kv_len, int block_rows) {
  return device_table(pg, tables, {kArrivalOrderTable, plan.seq, plan.world, plan.rank, kv_len, block_rows},
                      [&] { return kv_arrival_order(plan, kv_len, block_rows); });
}

const std::int32_t* SpAttnContext::Impl::flag_table(const SpAttnPlan& plan, SpKvLayout layout, int block_rows,
                                                    std::int64_t heads_kv, int head_groups) {
  return device_table(pg, tables,
                      {kFlagTable, static_cast<std::int64_t>(layout), plan.seq, plan.world, plan.rank, plan.causal,
                       block_rows, heads_kv, head_groups},
                      [&] { return sp_kv_flag_table(plan, layout, block_rows, heads_kv, head_groups, kSlots); });
}

void SpAttnContext::Impl::drain(const char* what) { detail::drain_streams(pg, {data.get(), control.get()}, what); }

void SpAttnContext::Impl::begin_call() {
  const CallStart st = flag_call_start(true, runtime::capture_id(pg.stream()), captured, reset_capture);
  if (st.captured && !captured) staging.keep_replaced();  // a graph holds the staging's address from now on
  captured = st.captured;
  reset_capture = st.reset_capture;
  if (st.reset) reset_flags();
}

void SpAttnContext::Impl::reset_flags() {
  cudaStream_t s = pg.stream();
  // Every call joins its communication stream back into the compute stream,
  // so a barrier there follows all of this rank's earlier work.
  pg.align_streams(s);
  data->zero_local(s);
  control->zero_local(s);
  pg.align_streams(s);
  epoch = 0;
  last_fused = {};  // the kernel-only diagnostic needs a fused call first again
}

SpAttnContext::SpAttnContext(runtime::ProcessGroup& pg) : impl_(std::make_unique<Impl>(pg)) {}
SpAttnContext::~SpAttnContext() = default;

namespace sp {

std::size_t gathered_kv_bytes(const SpAttnArgs& a) {
  return static_cast<std::size_t>(a.batch * a.seq * a.heads_kv * a.head_dim) * dtype_size(a.dtype);
}

Call begin(SpAttnContext::Impl& c, const SpAttnArgs& a) {
  Call k{c, a, plan_sp_attention(a.seq, c.pg.world(), c.pg.rank(), a.causal)};
  k.world = c.pg.world();
  k.rank = c.pg.rank();
  k.st = c.pg.stream();
  k.B = a.batch;
  k.C = k.plan.chunk;
  k.S = a.seq;
  k.L = 2 * k.C;
  k.kv_row = static_cast<std::size_t>(a.heads_kv * a.head_dim) * dtype_size(a.dtype);
  k.kv_bytes = static_cast<std::size_t>(k.B * k.S) * k.kv_row;
  k.head_groups = detail::sp_head_groups(a);
  detail::grow_symmetric(c.ws, 2 * k.kv_bytes, c.pg, {c.data.get(), c.control.get()}, "sp_attention: workspace growth",
                         c.captured ? &c.replaced : nullptr);
  k.epoch = ++c.epoch;
  k.ws_k = c.ws.local();
  k.ws_v = k.ws_k + k.kv_bytes;
  return k;
}

void copy_chunk_rows(cudaStream_t s, void* dst, const void* src, int i, std::int64_t g0, std::int64_t B, std::int64_t C,
                     std::int64_t S, std::size_t row_bytes, std::int64_t r0, std::int64_t rows) {
  TESSERA_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<unsigned char*>(dst) + (g0 + r0) * row_bytes, S * row_bytes,
                                       static_cast<const unsigned char*>(src) + (i * C + r0) * row_bytes,
                                       2 * C * row_bytes, rows * row_bytes, B, cudaMemcpyDefault, s));
}

void copy_chunk(cudaStream_t s, void* dst, const void* src, int i, std::int64_t g0, std::int64_t B, std::int64_t C,
                std::int64_t S, std::size_t row_bytes) {
  copy_chunk_rows(s, dst, src, i, g0, B, C, S, row_bytes, 0, C);
}

namespace {

/// Head group `g` of `depth` slices of `rows` token rows: source slices
/// src_slice rows apart, destination slices dst_slice rows apart, rows one
/// token's heads (k.kv_row bytes) apart on both sides. One 3D copy.
void copy_heads_3d(const Call& k, cudaStream_t s, unsigned char* dst, std::int64_t dst_slice, const unsigned char* src,
                   std::int64_t src_slice, std::int64_t rows, std::int64_t depth, int g) {
  const std::size_t piece = k.kv_row / static_cast<std::size_t>(k.head_groups);
  cudaMemcpy3DParms p{};
  p.srcPtr = make_cudaPitchedPtr(const_cast<unsigned char*>(src) + g * piece, k.kv_row, piece,
                                 static_cast<std::size_t>(src_slice));
  p.dstPtr = make_cudaPitchedPtr(dst + g * piece, k.kv_row, piece, static_cast<std::size_t>(dst_slice));
  p.extent = make_cudaExtent(piece, static_cast<std::size_t>(rows), static_cast<std::size_t>(depth));
  p.kind = cudaMemcpyDefault;
  TESSERA_CUDA_CHECK(cudaMemcpy3DAsync(&p, s));
}

}  // namespace

void copy_heads(const Call& k, cudaStream_t s, void* dst_base, const void* src_shard, int dst, int g) {
  auto* out = static_cast<unsigned char*>(dst_base);
  const auto* in = static_cast<const unsigned char*>(src_shard);
  if (k.shard_layout()) {  // the shard whole into its slot; the batch is the depth
    const std::int64_t row0 = sp_shard_slot(k.world, dst, k.rank) * k.L;
    copy_heads_3d(k, s, out + row0 * k.kv_row, k.S, in, k.L, k.L, k.B, g);
    return;
  }
  // Global order, per batch entry: the two chunks are the depth, C rows
  // apart in the shard and (chunks[1] - chunks[0]) x C in the gathered tensor.
  const std::int64_t gap = (k.plan.chunks[1] - k.plan.chunks[0]) * k.C;
  for (std::int64_t b = 0; b < k.B; ++b)
    copy_heads_3d(k, s, out + (b * k.S + k.plan.chunks[0] * k.C) * k.kv_row, gap, in + b * k.L * k.kv_row, k.C, k.C, 2,
                  g);
}

void choose_fused_layout(Call& k) {
  const int block_rows = detail::sp_attention_kv_block_rows(static_cast<int>(k.a.head_dim));
  const auto knob = [](const char* name, int hi) { return env::find_int(name, 0, hi).value_or(1); };
  const bool shard =
      !k.a.causal && knob("TESSERA_SP_SHARD_LAYOUT", 1) != 0 && sp_kv_table_fits(k.plan, SpKvLayout::shard, block_rows);
  // Causal, the table wait visits blocks descending, which is the order the
  // chunks land only at R = 2 (one peer). At R > 2 a part's lower chunks
  // come from its lower-ranked owners, whose pushes land last, so the
  // arrival-ordered chunk walk stays (TESSERA_SP_TABLE_WAIT=2 forces the
  // table wait there, A/B).
  const int table = knob("TESSERA_SP_TABLE_WAIT", 2);
  k.table_wait = shard || (k.a.causal && table != 0 && (k.world == 2 || table == 2) &&
                           sp_kv_table_fits(k.plan, SpKvLayout::global, block_rows));
  k.own_in_place = k.world > 1 && !k.table_wait && knob("TESSERA_SP_OWN_IN_PLACE", 1) != 0;
}

void copy_own(const Call& k, cudaStream_t s) {
  if (k.shard_layout()) {  // the shard whole: "chunk 0" of L rows
    const std::int64_t row0 = sp_shard_slot(k.world, k.rank, k.rank) * k.L;
    for (const auto& [dst, src] : {std::pair{k.ws_k, k.a.k}, std::pair{k.ws_v, k.a.v}})
      copy_chunk_rows(s, dst, src, 0, row0, k.B, k.C, k.S, k.kv_row, 0, k.L);
    return;
  }
  for (int i = 0; i < 2; ++i) {
    copy_chunk(s, k.ws_k, k.a.k, i, k.plan.chunks[i] * k.C, k.B, k.C, k.S, k.kv_row);
    copy_chunk(s, k.ws_v, k.a.v, i, k.plan.chunks[i] * k.C, k.B, k.C, k.S, k.kv_row);
  }
}

void copy_own_edges(const Call& k, cudaStream_t s) {
  const int block_rows = detail::sp_attention_kv_block_rows(static_cast<int>(k.a.head_dim));
  for (int i = 0; i < 2; ++i) {
    const std::int64_t g = k.plan.chunks[i] * k.C;
    for (const auto& [lo, hi] : sp_own_edge_rows(g, k.C, block_rows)) {
      copy_chunk_rows(s, k.ws_k, k.a.k, i, g, k.B, k.C, k.S, k.kv_row, lo - g, hi - lo);
      copy_chunk_rows(s, k.ws_v, k.a.v, i, g, k.B, k.C, k.S, k.kv_row, lo - g, hi - lo);
    }
  }
}

void wait_peers_done(const Call& k, cudaStream_t s) {
  if (k.epoch > 1)
    for (int p = 0; p < k.world; ++p)
      if (p != k.rank) link::rank_wait(s, *k.c.control, p, 0, k.epoch - 1);
}

namespace {

/// The table-wait kernel of call k. Its waits have no timeout of their
/// own, so every flag they read is noted as a host wait on the compute
/// stream: a bounded synchronize that times out releases it and names it.
void launch_table_part(const Call& k, const kernels::AttentionArgs& ka, int block_rows) {
  detail::SpKvTable f;
  f.flags = k.c.data->view().flag_from(0, 0);
  f.table = k.c.flag_table(k.plan, k.shard_layout() ? SpKvLayout::shard : SpKvLayout::global, block_rows, k.a.heads_kv,
                           k.head_groups);
  f.blocks_per_head = static_cast<int>((k.S + block_rows - 1) / block_rows);
  f.epoch = k.epoch;
  for (int src = 0; src < k.world; ++src)
    if (src != k.rank)
      for (int g = 0; g < k.head_groups; ++g)
        k.c.data->note_host_wait({k.st, src, detail::sp_kv_flag_slot(g), k.epoch, "sp_attention KV wait"});
  detail::launch_sp_attention_table(ka, f, k.st);
}

}  // namespace

void run_parts(const Call& k, bool hooked) {
  const SpAttnArgs& a = k.a;
  const int R = k.world;
  const std::size_t q_row = static_cast<std::size_t>(a.heads_q * a.head_dim) * dtype_size(a.dtype);
  detail::SpKvFlags f;
  f.flags = k.c.data->view().flag_from(0, 0);
  f.slots = SpAttnContext::Impl::kSlots;
  f.world = R;
  f.rank = k.rank;
  f.chunk = k.C;
  f.epoch = k.epoch;
  f.heads_per_group = static_cast<int>(a.heads_kv) / k.head_groups;
  if (hooked && k.own_in_place && !k.table_wait) {
    f.own_k = a.k;
    f.own_v = a.v;
    f.own_stride = {k.L * a.heads_kv * a.head_dim, a.heads_kv * a.head_dim, a.head_dim};
    for (int i = 0; i < 2; ++i) f.own_start[i] = k.plan.chunks[i] * k.C;
  }
  const int block_rows = detail::sp_attention_kv_block_rows(static_cast<int>(a.head_dim));
  // A causal plan's two parts (the zig-zag chunks) run as one launch, Q
  // rows >= C at the second chunk's offset, when C is a multiple of the
  // kernel's 128 query rows: one grid lets a part's CTAs whose KV is here
  // run while the other's wait for peers (TESSERA_SP_ONE_LAUNCH=0: a launch
  // per part, A/B). Its KV length is the second part's; the first part's
  // rows mask the extra keys.
  static const bool one_launch = env::find_int("TESSERA_SP_ONE_LAUNCH", 0, 1).value_or(1) != 0;
  std::vector<SpAttnPlan::Part> launches = k.plan.parts;
  std::int64_t q_split = 0, q_offset_split = 0;
  if (one_launch && launches.size() == 2 && k.C % 128 == 0 && launches[1].local_row0 == launches[0].rows) {
    q_split = launches[0].rows;
    q_offset_split = launches[1].q_offset - q_split;
    launches = {{0, launches[0].rows + launches[1].rows, launches[0].q_offset,
                 std::max(launches[0].kv_len, launches[1].kv_len)}};
  }
  for (const SpAttnPlan::Part& part : launches) {
    f.order = hooked && R > 1 && k.arrival_order && !k.table_wait ? k.c.arrival_order(k.plan, part.kv_len, block_rows)
                                                                  : nullptr;
    kernels::AttentionArgs ka;
    ka.q = static_cast<const unsigned char*>(a.q) + part.local_row0 * q_row;
    ka.o = static_cast<unsigned char*>(a.o) + part.local_row0 * q_row;
    ka.k = k.ws_k;
    ka.v = k.ws_v;
    ka.batch = k.B;
    ka.seqlen_q = part.rows;
    ka.seqlen_k = part.kv_len;
    ka.heads_q = a.heads_q;
    ka.heads_kv = a.heads_kv;
    ka.head_dim = a.head_dim;
    ka.q_stride = ka.o_stride = {k.L * a.heads_q * a.head_dim, a.heads_q * a.head_dim, a.head_dim};
    ka.k_stride = ka.v_stride = {k.S * a.heads_kv * a.head_dim, a.heads_kv * a.head_dim, a.head_dim};
    ka.dtype = a.dtype;
    ka.causal = a.causal;
    ka.q_offset = part.q_offset;
    ka.q_split = q_split;
    ka.q_offset_split = q_offset_split;
    ka.softmax_scale = a.softmax_scale;
    if (a.lse) {
      ka.lse = a.lse + part.local_row0;
      ka.lse_batch_stride = a.heads_q * k.L;
      ka.lse_head_stride = k.L;
    }
    if (hooked && R > 1 && k.table_wait)
      launch_table_part(k, ka, block_rows);
    else if (hooked && R > 1)
      detail::launch_sp_attention_part(ka, f, k.st);
    else
      kernels::attention(ka, k.st);
  }
}

void finish(const Call& k) {
  if (k.world > 1)
    for (int p = 0; p < k.world; ++p)
      if (p != k.rank) link::rank_notify(k.st, *k.c.control, p, 0, k.epoch);
}

}  // namespace sp

namespace {

/// The Ulysses degree of two_level for `a` under `o`: checked when two_level
/// runs or is a candidate (an explicit degree the shape cannot take is an
/// error naming two_level_inner either way).
int two_level_degree(const SpAttnArgs& a, int world, const SpAttnOptions& o) {
  return two_level_inner_degree(a, world, o.two_level_inner);
}

/// two_level is a schedule of its own (not the ring or Ulysses) at this degree.
bool two_level_distinct(int u, int world) { return u > 1 && u < world; }

bool heads_divide(const SpAttnArgs& a, int world) { return a.heads_q % world == 0 && a.heads_kv % world == 0; }

/// The strategy codes sp_attention takes, as its errors list them
/// ("automatic 0, sequential 1, ... or two_level 8").
std::string accepted_codes() {
  std::vector<std::string> codes;
  for (const StrategyInfo& i : strategy_table())
    if (accepts(OpKind::sp_attention, i.strategy))
      codes.push_back(fmt::format("{} {}", i.name, static_cast<int>(i.strategy)));
  std::string s;
  for (std::size_t j = 0; j < codes.size(); ++j) {
    if (j > 0) s += j + 1 == codes.size() ? " or " : ", ";
    s += codes[j];
  }
  return s;
}

/// The strategies that run inside a CUDA-graph capture: the ones on this
/// context's flags (ring, Ulysses and two_level have contexts of their own).
bool capturable(Strategy s) { return s == Strategy::automatic || s == Strategy::sequential || s == Strategy::fused_ce; }

void validate(SpAttnContext::Impl& c, const SpAttnArgs& a, SpStrategy strategy, int u) {
  const Strategy s = static_cast<Strategy>(strategy);
  TESSERA_CHECK(accepts(OpKind::sp_attention, s), "sp_attention: strategy code {} ({})", static_cast<int>(strategy),
                accepted_codes());
  // two_level's degree is part of what the ranks must agree on.
  const int code = static_cast<int>(strategy) + (strategy == SpStrategy::two_level ? 256 * u : 0);
  if (runtime::stream_capturing(c.pg.stream()))
    TESSERA_CHECK(capturable(s),
                  "sp_attention: strategy {} cannot be captured into a CUDA graph (its own context's "
                  "flags carry per-call epochs); sequential, fused_ce and automatic can",
                  sp_strategy_name(strategy));
  detail::validate_zigzag(c.pg, a, "sp_attention", code, sp_strategy_name(strategy), c.validated,
                          detail::ZigzagCapture::allowed);
  detail::check_sp_heads(a, c.pg.world(), strategy);
}

/// One call with a concrete strategy; `a` is validated; `u`: two_level's degree.
void run_sp_attention(SpAttnContext::Impl& c, const SpAttnArgs& a, SpStrategy strategy, int u) {
  c.begin_call();
  sp_attention_registry().find(static_cast<Strategy>(strategy)).launch(c, a, u);
}

}  // namespace

std::string_view sp_strategy_name(SpStrategy s) {
  return accepts(OpKind::sp_attention, static_cast<Strategy>(s)) ? strategy_name(static_cast<Strategy>(s)) : "unknown";
}

std::size_t sp_attention_workspace_bytes(const SpAttnArgs& a, int world, SpStrategy s, int two_level_inner) {
  TESSERA_CHECK(world >= 1, "sp_attention_workspace_bytes: world {}", world);
  TESSERA_CHECK(s != SpStrategy::automatic && accepts(OpKind::sp_attention, static_cast<Strategy>(s)),
                "sp_attention_workspace_bytes: strategy {} (a concrete strategy)", sp_strategy_name(s));
  return sp_attention_registry().find(static_cast<Strategy>(s)).info.workspace(a, world, two_level_inner);
}

namespace {

/// `candidates` within the workspace limit (all when there is none); throws
/// naming each one's need when none fits.
std::vector<Strategy> within_limit(const SpAttnArgs& a, int world, const std::vector<Strategy>& candidates,
                                   std::size_t limit, int u) {
  if (limit == 0) return candidates;
  std::vector<Strategy> fit;
  std::string needs;
  for (Strategy s : candidates) {
    const std::size_t need = sp_attention_workspace_bytes(a, world, static_cast<SpStrategy>(s), u);
    if (need <= limit) fit.push_back(s);
    needs += fmt::format("{}{} {:.3f} GiB", needs.empty() ? "" : ", ", strategy_name(s),
                         static_cast<double>(need) / (1u << 30));
  }
  TESSERA_CHECK(!fit.empty(), "sp_attention: no strategy fits the workspace limit of {:.3f} GiB per rank ({})",
                static_cast<double>(limit) / (1u << 30), needs);
  return fit;
}

}  // namespace

SpStrategy resolve_sp_attention(SpAttnContext& ctx, const SpAttnArgs& a, const SpAttnOptions& o, TuneReport* report) {
  SpAttnContext::Impl& c = ctx.impl();
  const int R = c.pg.world();
  // two_level's degree: checked (before any launch) when it runs or may run.
  const bool explicit_two_level = o.strategy == SpStrategy::two_level;
  int u = explicit_two_level ? two_level_degree(a, R, o) : 1;
  validate(c, a, o.strategy, u);
  if (o.strategy == SpStrategy::automatic) u = two_level_degree(a, R, o);
  if (o.strategy != SpStrategy::automatic) {
    const std::size_t need = sp_attention_workspace_bytes(a, R, o.strategy, u);
    TESSERA_CHECK(o.workspace_limit_bytes == 0 || need <= o.workspace_limit_bytes,
                  "sp_attention: strategy {} needs {:.3f} GiB of workspace per rank, over the limit of {:.3f} GiB",
                  sp_strategy_name(o.strategy), static_cast<double>(need) / (1u << 30),
                  static_cast<double>(o.workspace_limit_bytes) / (1u << 30));
    return o.strategy;
  }
  const bool two_level = two_level_distinct(u, R);
  const std::vector<Strategy> all = sp_attention_candidates(R, c.pg.lsa_reachable(), heads_divide(a, R), two_level);
  const std::vector<Strategy> candidates = within_limit(a, R, all, o.workspace_limit_bytes, u);
  const detail::TuneHooks hooks{[&](const char* what) { c.drain(what); },
                                [&](Strategy s) { run_sp_attention(c, a, static_cast<SpStrategy>(s), u); }};
  // seq, batch and the head counts are compared by ratio for a neighbour's
  // choice; head_dim and causal are flags.
  detail::TuneQuery q{tune::key_prefix(detail::machine_id(c.pg), a.dtype, "ops.sp_attention"),
                      {a.seq, a.batch, a.heads_q, a.heads_kv, a.head_dim, a.causal ? 1 : 0},
                      4,
                      o.use_cache,
                      o.tune_on_miss};
  if (candidates != all) {  // a limit left some out: a choice among fewer is keyed apart
    std::int64_t mask = 0;
    for (Strategy s : candidates) mask |= std::int64_t{1} << static_cast<int>(s);
    q.shape.push_back(mask);
  }
  // A two_level measured at an explicit degree is keyed apart from the
  // chosen degree's (negative: never a mask).
  if (two_level && o.two_level_inner != 0) q.shape.push_back(-u);
  if (runtime::stream_capturing(c.pg.stream())) {
    // No tuning and no host exchange inside a capture: the choice the ranks
    // agreed on for this shape in an eager call, where it can be captured,
    // else sequential (the same on every rank: the agreed choices are).
    const std::optional<Strategy> agreed = detail::agreed_choice(c.tune, q);
    const Strategy s = agreed && capturable(*agreed) ? *agreed : Strategy::sequential;
    if (report) report->chosen = s, report->from_cache = agreed.has_value();
    return static_cast<SpStrategy>(s);
  }
  return static_cast<SpStrategy>(detail::tune_choice(c.pg, c.tune, q, candidates, hooks, report));
}

void sp_attention(SpAttnContext& ctx, const SpAttnArgs& a, const SpAttnOptions& o) {
  const SpStrategy s = resolve_sp_attention(ctx, a, o);  // checks everything first
  const int u = s == SpStrategy::two_level ? two_level_degree(a, ctx.impl().pg.world(), o) : 1;
  run_sp_attention(ctx.impl(), a, s, u);
}

void sp_attention(SpAttnContext& ctx, const SpAttnArgs& a, SpStrategy s) {
  SpAttnOptions o;
  o.strategy = s;
  sp_attention(ctx, a, o);
}

namespace detail {

void validate_zigzag_shape(const SpAttnArgs& a, int world, const char* op) {
  TESSERA_CHECK(world >= 1, "{}: world = {} must be >= 1", op, world);
  TESSERA_CHECK(a.seq >= 2 * world && a.seq % (2 * world) == 0,
                "{}: seq = {} must be a positive multiple of 2 x world = {} (zig-zag chunks)", op, a.seq, 2 * world);
  TESSERA_CHECK(reinterpret_cast<std::uintptr_t>(a.lse) % alignof(float) == 0,
                "{}: lse = {} is not aligned to its 4-byte (float32) elements", op, static_cast<const void*>(a.lse));
  // The kernel's own checks (dtype, head dim, GQA divisibility, pointers)
  // on one shard's shapes; its device check comes last.
  kernels::AttentionArgs k;
  k.q = a.q;
  k.k = a.k;
  k.v = a.v;
  k.o = a.o;
  k.batch = a.batch;
  k.seqlen_q = k.seqlen_k = a.seq / world;
  k.heads_q = a.heads_q;
  k.heads_kv = a.heads_kv;
  k.head_dim = a.head_dim;
  k.dtype = a.dtype;
  k.causal = a.causal;
  k.softmax_scale = a.softmax_scale;
  kernels::validate(k, op);
}

int sp_head_groups(const SpAttnArgs& a) {
  static const std::optional<int> forced = env::find_int("TESSERA_SP_HEAD_GROUPS", 1, kSpMaxHeadGroups);
  if (!forced) return sp_attention_head_groups(a.heads_kv, a.head_dim, dtype_size(a.dtype));
  TESSERA_CHECK(a.heads_kv % *forced == 0, "sp_attention: TESSERA_SP_HEAD_GROUPS = {} does not divide heads_kv = {}",
                *forced, a.heads_kv);
  return *forced;
}

void agree_zigzag(const SpAttnArgs& a, const char* op, int strategy, std::string_view strategy_name,
                  std::set<ZigzagSignature>& agreed, const CheckSameOnAllRanks& check_same) {
  static_assert(std::has_unique_object_representations_v<ZigzagSignature>, "compared byte-wise across ranks");
  const int groups = sp_head_groups(a);
  const ZigzagSignature sig{a.batch,  a.seq,    a.heads_q, a.heads_kv, a.head_dim, static_cast<std::int64_t>(a.dtype),
                            a.causal, strategy, groups};
  if (agreed.count(sig)) return;
  check_same(fmt::format("{}: shapes and strategy (batch {}, seq {}, heads {}/{}, head_dim {}, dtype "
                         "{}, causal {}, strategy {}, KV head groups {})",
                         op, a.batch, a.seq, a.heads_q, a.heads_kv, a.head_dim, dtype_name(a.dtype), a.causal,
                         strategy_name, groups),
             sig.data(), sizeof sig);
  agreed.insert(sig);
}

void validate_zigzag(runtime::ProcessGroup& pg, const SpAttnArgs& a, const char* op, int strategy,
                     std::string_view strategy_name, std::set<ZigzagSignature>& agreed, ZigzagCapture capture) {
  const bool capturing = runtime::stream_capturing(pg.stream());
  TESSERA_CHECK(!capturing || capture == ZigzagCapture::allowed,
                "{}: cannot be captured into a CUDA graph (its flags carry a per-call epoch that a replay would "
                "repeat); call it eagerly",
                op);
  validate_zigzag_shape(a, pg.world(), op);
  agree_zigzag(a, op, strategy, strategy_name, agreed,
               [&pg, capturing, op](const std::string& what, const void* data, std::size_t n) {
                 // The agreement is a host exchange, which a capture cannot hold.
                 TESSERA_CHECK(!capturing,
                               "{}: these shapes and strategy never ran eagerly on this context; call it once "
                               "eagerly before capturing it into a CUDA graph (the ranks' agreement on {} cannot run "
                               "inside a capture)",
                               op, what);
                 pg.check_same_on_all_ranks(what, data, n);
               });
}

void check_sp_heads(const SpAttnArgs& a, int world, SpStrategy strategy) {
  const Strategy s = static_cast<Strategy>(strategy);
  if (s != Strategy::automatic && sp_attention_registry().find(s).needs.heads_divide)
    TESSERA_CHECK(heads_divide(a, world),
                  "sp_attention: strategy {} needs heads_q = {} and heads_kv = {} to be multiples of the world size {}",
                  sp_strategy_name(strategy), a.heads_q, a.heads_kv, world);
}

}  // namespace detail

}  // namespace tessera::ops
