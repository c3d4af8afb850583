// The TP MoE layer's sequential strategy (tessera/ops/moe.hpp).
#include "tessera/ops/moe.hpp"

#include <algorithm>
#include <array>
#include <fmt/format.h>
#include <nccl.h>

#include <cstdint>
#include <string>

#include "moe_scratch.hpp"
#include "tessera/kernels/grouped_gemm.hpp"
#include "tessera/kernels/moe_routing.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::ops {

using detail::Scratch;
constexpr std::int64_t kMaxDim = detail::kMoeMaxDim;

struct MoeContext::Impl {
  Scratch x_full, ids_full, w_full, offsets, counts, sorted, rows, permute_ws, gathered, inter, expert_out, partial,
      flags;
  std::int32_t* flags_ptr = nullptr;  ///< [0] invalid ids, [1] unused, [2..5] gate/up status, [6..9] down status
  std::int64_t last_entries = 0;
};

MoeContext::MoeContext(runtime::ProcessGroup& pg) : pg_(&pg), impl_(std::make_unique<Impl>()) {}
MoeContext::~MoeContext() = default;

void validate(const MoeTpArgs& a, int world) {
  detail::validate_moe_sizes(
      "moe_tp", world, a.dtype, a.tokens_local, a.hidden, "inter_local", a.inter_local, a.experts,
      static_cast<int>(std::min<std::int64_t>(kernels::moe::kMaxExperts, kernels::kGroupedMaxGroups)), a.topk,
      kernels::moe::kMaxTopK);
  const std::int64_t tokens = a.tokens_local * world;
  TESSERA_CHECK(tokens * a.topk < kMaxDim, "moe_tp: tokens ({}) * topk ({}) must stay below 2^31", tokens, a.topk);
  TESSERA_CHECK(tokens * a.topk <= (std::int64_t{1} << 60) / (a.hidden + 2 * a.inter_local),
                "moe_tp: the expert buffers of {} rows x (hidden {} + 2 x inter_local {}) overflow 64-bit sizes",
                tokens * a.topk, a.hidden, a.inter_local);
  TESSERA_CHECK(a.x_shard != nullptr && a.out_shard != nullptr, "moe_tp: x_shard and out_shard must be non-null");
  TESSERA_CHECK(a.expert_ids != nullptr && a.weights != nullptr, "moe_tp: expert_ids and weights must be non-null");
  TESSERA_CHECK(a.w_gate_up != nullptr && a.w_down != nullptr, "moe_tp: w_gate_up and w_down must be non-null");
  for (const void* p : {a.x_shard, a.w_gate_up, a.w_down, static_cast<const void*>(a.out_shard)})
    TESSERA_CHECK((reinterpret_cast<std::uintptr_t>(p) & 15u) == 0, "moe_tp: pointer {} is not 16-byte aligned", p);
}

void moe_tp(MoeContext& ctx, const MoeTpArgs& a) {
  runtime::ProcessGroup& pg = ctx.group();
  const int R = pg.world();
  validate(a, R);
  // No padding: every byte is compared across ranks.
  const std::array<std::int64_t, 6> shape{a.tokens_local, a.hidden, a.inter_local,
                                          a.experts,      a.topk,   static_cast<std::int64_t>(a.dtype)};
  pg.check_same_on_all_ranks(
      fmt::format("moe_tp: shape (tokens_local {}, hidden {}, inter_local {}, experts {}, topk {})", a.tokens_local,
                  a.hidden, a.inter_local, a.experts, a.topk),
      shape);

  MoeContext::Impl& m = ctx.impl();
  const cudaStream_t s = pg.stream();
  const std::int64_t T = a.tokens_local * R, k = a.topk, H = a.hidden, I = a.inter_local, E = a.experts;
  const std::int64_t entries = T * k;
  const std::size_t es = dtype_size(a.dtype);

  // 1. All-gather tokens and routing (rank order = token order).
  auto* x_full = static_cast<unsigned char*>(m.x_full.get(static_cast<std::size_t>(T * H) * es + 16, pg));
  auto* ids_full = m.ids_full.get<std::int32_t>(entries, pg);
  auto* w_full = m.w_full.get<float>(entries, pg);
  TESSERA_NCCL_CHECK(ncclAllGather(a.x_shard, x_full, static_cast<std::size_t>(a.tokens_local * H),
                                   runtime::nccl_dtype(a.dtype), pg.nccl(), s));
  TESSERA_NCCL_CHECK(
      ncclAllGather(a.expert_ids, ids_full, static_cast<std::size_t>(a.tokens_local * k), ncclInt32, pg.nccl(), s));
  TESSERA_NCCL_CHECK(
      ncclAllGather(a.weights, w_full, static_cast<std::size_t>(a.tokens_local * k), ncclFloat32, pg.nccl(), s));

  // 2. Expert sort, on the device.
  m.flags_ptr = m.flags.get<std::int32_t>(16, pg);
  TESSERA_CUDA_CHECK(cudaMemsetAsync(m.flags_ptr, 0, 16 * sizeof(std::int32_t), s));
  kernels::moe::PermuteArgs p;
  p.expert_ids = ids_full;
  p.tokens = T;
  p.experts = a.experts;
  p.k = a.topk;
  p.expert_offsets = m.offsets.get<std::int32_t>(E + 1, pg);
  p.expert_counts = m.counts.get<std::int32_t>(E, pg);
  p.sorted_entry = m.sorted.get<std::int32_t>(entries, pg);
  p.entry_row = m.rows.get<std::int32_t>(entries, pg);
  p.invalid = m.flags_ptr;
  p.workspace_bytes = kernels::moe::permute_workspace_bytes(entries, a.experts);
  p.workspace = m.permute_ws.get(p.workspace_bytes + 16, pg);
  kernels::moe::permute(p, s);

  // 3. Gather, then the two grouped GEMMs.
  void* gathered = m.gathered.get(static_cast<std::size_t>(entries * H) * es + 16, pg);
  kernels::moe::GatherArgs g;
  g.x = x_full;
  g.ldx = H;
  g.gathered = gathered;
  g.ldg = H;
  g.cols = H;
  g.sorted_entry = p.sorted_entry;
  g.expert_offsets = p.expert_offsets;
  g.experts = a.experts;
  g.k = a.topk;
  g.max_rows = entries;
  g.dtype = a.dtype;
  kernels::moe::gather_rows(g, s);

  void* inter = m.inter.get(static_cast<std::size_t>(entries * I) * es + 16, pg);
  void* expert_out = m.expert_out.get(static_cast<std::size_t>(entries * H) * es + 16, pg);
  if (entries > 0) {
    kernels::GroupedGemmArgs up;
    up.a = gathered;
    up.b = a.w_gate_up;
    up.d = inter;
    up.group_rows = p.expert_counts;
    up.status = m.flags_ptr + 2;
    up.groups = E;
    up.n = 2 * I;
    up.k = H;
    up.max_rows = entries;
    kernels::GroupedGemmOptions uo;
    uo.epilogue = kernels::GroupedEpilogueKind::SwiGLU;
    kernels::grouped_gemm(up, uo, s);

    kernels::GroupedGemmArgs down;
    down.a = inter;
    down.b = a.w_down;
    down.d = expert_out;
    down.group_rows = p.expert_counts;
    down.status = m.flags_ptr + 6;
    down.groups = E;
    down.n = H;
    down.k = I;
    down.max_rows = entries;
    kernels::grouped_gemm(down, {}, s);
  }

  // 4. Combine into this rank's partial of every token, then reduce-scatter.
  void* partial = m.partial.get(static_cast<std::size_t>(T * H) * es + 16, pg);
  kernels::moe::CombineArgs c;
  c.y = expert_out;
  c.ldy = H;
  c.entry_row = p.entry_row;
  c.weights = w_full;
  c.out = partial;
  c.ldo = H;
  c.tokens = T;
  c.cols = H;
  c.k = a.topk;
  c.dtype = a.dtype;
  kernels::moe::combine(c, s);
  TESSERA_NCCL_CHECK(ncclReduceScatter(partial, a.out_shard, static_cast<std::size_t>(a.tokens_local * H),
                                       runtime::nccl_dtype(a.dtype), ncclSum, pg.nccl(), s));
  m.last_entries = entries;
}

void MoeContext::check_status() {
  Impl& m = *impl_;
  if (m.flags_ptr == nullptr) return;
  const cudaStream_t s = pg_->stream();
  std::int32_t invalid = 0;
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(&invalid, m.flags_ptr, sizeof(invalid), cudaMemcpyDeviceToHost, s));
  pg_->synchronize(s, "moe_tp: check_status");
  TESSERA_CHECK(invalid == 0, "moe_tp: {} routed entries had an expert id outside [0, experts) and were left out",
                invalid);
  if (m.last_entries > 0) {
    kernels::check_grouped_gemm_status(m.flags_ptr + 2, s, "moe_tp: gate/up grouped GEMM");
    kernels::check_grouped_gemm_status(m.flags_ptr + 6, s, "moe_tp: down grouped GEMM");
  }
}

}  // namespace tessera::ops
