// MoE routing kernels (tessera/kernels/moe_routing.hpp).
//
// permute() is a stable counting sort in three launches over blocks of
// kBlock consecutive entries: count (per block and expert), scan (one CTA:
// per-expert prefix over blocks, then the expert offsets), scatter (each
// entry's rank among its block's entries of the same expert, from warp
// match masks, plus the two prefixes). Blocks, warps and lanes follow entry
// order, so the order within an expert is the entry order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

#include "convert.cuh"
#include "tessera/kernels/gemm/host_detail.hpp"
#include "tessera/kernels/moe_routing.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::kernels::moe {
namespace {

constexpr int kBlock = 256;  // entries per permute block (one per thread)
constexpr int kWarps = kBlock / 32;
constexpr int kLaneSlots = kMaxExperts / 32;  // logits per lane in topk_gating

__device__ __forceinline__ float load_f32(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::f16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

/// One warp per token: expert e = j * 32 + lane is held in v[j].
__global__ void topk_gating_kernel(TopKArgs a, std::int64_t ld) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
  const int slots = (a.experts + 31) / 32;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32; t < a.tokens;
       t += warps) {
    float v[kLaneSlots];
    float mx = -FLT_MAX;
#pragma unroll
    for (int j = 0; j < kLaneSlots; ++j) {
      const int e = j * 32 + lane;
      v[j] = (j < slots && e < a.experts) ? load_f32(a.logits, a.logits_dtype, t * ld + e) : -FLT_MAX;
      mx = fmaxf(mx, v[j]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kLaneSlots; ++j) {
      const int e = j * 32 + lane;
      v[j] = (j < slots && e < a.experts) ? __expf(v[j] - mx) : -1.f;  // -1: not an expert
      sum += fmaxf(v[j], 0.f);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    float picked_sum = 0.f, picked[kMaxTopK];
    int ids[kMaxTopK];
    for (int s = 0; s < a.k; ++s) {
      // Lane-local best (largest value, lowest expert on ties), then the warp's.
      float best = -2.f;
      int best_e = a.experts;
#pragma unroll
      for (int j = 0; j < kLaneSlots; ++j)
        if (v[j] > best) best = v[j], best_e = j * 32 + lane;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
        if (ob > best || (ob == best && oe < best_e)) best = ob, best_e = oe;
      }
      if (best_e % 32 == lane) {
#pragma unroll
        for (int j = 0; j < kLaneSlots; ++j)
          if (j == best_e / 32) v[j] = -1.f;
      }
      picked[s] = best / sum;
      ids[s] = best_e;
      picked_sum += picked[s];
    }
    if (lane == 0) {
      const float scale = a.renormalize ? 1.f / picked_sum : 1.f;
      for (int s = 0; s < a.k; ++s) {
        a.expert_ids[t * a.k + s] = ids[s];
        a.weights[t * a.k + s] = picked[s] * scale;
      }
    }
  }
}

__device__ __forceinline__ bool valid_expert(int e, int experts) { return e >= 0 && e < experts; }

/// counts[e * blocks + b] = entries of block b routed to expert e.
__global__ void permute_count_kernel(PermuteArgs a, std::int64_t entries, std::int32_t* counts, int blocks) {
  extern __shared__ std::int32_t block_count[];  // [E]
  for (int e = threadIdx.x; e < a.experts; e += blockDim.x) block_count[e] = 0;
  __syncthreads();
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (i < entries) {
    const int e = a.expert_ids[i];
    if (valid_expert(e, a.experts))
      atomicAdd(&block_count[e], 1);
    else if (a.invalid != nullptr)
      atomicAdd(a.invalid, 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < a.experts; e += blockDim.x)
    counts[static_cast<std::int64_t>(e) * blocks + blockIdx.x] = block_count[e];
}

constexpr int kScanUnroll = 4;  // 32-block steps whose loads permute_scan_kernel issues together

/// One CTA: counts become per-expert exclusive prefixes over blocks, and
/// expert_offsets the exclusive prefix over experts of their totals. A warp
/// scans one expert's row of block counts, 32 blocks per step, the loads of
/// kScanUnroll steps issued together: a thread walking a row alone waits
/// for one L2 round trip per block (20 us for 160 blocks).
__global__ void permute_scan_kernel(PermuteArgs a, std::int32_t* counts, int blocks) {
  __shared__ std::int32_t totals[kMaxExperts];
  __shared__ std::int32_t warp_sums[32];
  {
    const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int e = threadIdx.x / 32; e < a.experts; e += warps) {
      std::int32_t* row = counts + static_cast<std::int64_t>(e) * blocks;
      std::int32_t run = 0;
      for (int b0 = 0; b0 < blocks; b0 += 32 * kScanUnroll) {
        std::int32_t c[kScanUnroll];
#pragma unroll
        for (int j = 0; j < kScanUnroll; ++j) {
          const int b = b0 + 32 * j + lane;
          c[j] = b < blocks ? row[b] : 0;
        }
#pragma unroll
        for (int j = 0; j < kScanUnroll; ++j) {
          std::int32_t incl = c[j];
#pragma unroll
          for (int o = 1; o < 32; o <<= 1) {
            const std::int32_t n = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += n;
          }
          const int b = b0 + 32 * j + lane;
          if (b < blocks) row[b] = run + incl - c[j];
          run += __shfl_sync(0xffffffffu, incl, 31);
        }
      }
      if (lane == 0) {
        totals[e] = run;
        if (a.expert_counts != nullptr) a.expert_counts[e] = run;
        if (a.capacity > 0 && run > a.capacity && a.overflow != nullptr) atomicMax(a.overflow, run);
      }
    }
  }
  __syncthreads();
  // Exclusive scan of totals[0..E) by one CTA of kMaxExperts threads at most.
  const int e = threadIdx.x;
  const std::int32_t mine = e < a.experts ? totals[e] : 0;
  std::int32_t incl = mine;
  const int lane = e % 32, warp = e / 32;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const std::int32_t n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    std::int32_t w = lane < static_cast<int>(blockDim.x / 32) ? warp_sums[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const std::int32_t n = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += n;
    }
    warp_sums[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  const std::int32_t before = (warp > 0 ? warp_sums[warp - 1] : 0) + incl - mine;
  if (e < a.experts) a.expert_offsets[e] = before;
  if (e == a.experts - 1) a.expert_offsets[a.experts] = before + mine;
}

__global__ void permute_scatter_kernel(PermuteArgs a, std::int64_t entries, const std::int32_t* prefix, int blocks) {
  extern __shared__ std::int32_t warp_count[];  // [kWarps][E]
  for (int i = threadIdx.x; i < kWarps * a.experts; i += blockDim.x) warp_count[i] = 0;
  __syncthreads();
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int raw = i < entries ? a.expert_ids[i] : -1;
  const bool valid = i < entries && valid_expert(raw, a.experts);
  // Invalid lanes get keys no valid expert has, distinct per lane.
  const int key = valid ? raw : a.experts + lane;
  const unsigned same = __match_any_sync(0xffffffffu, key);
  const int rank_in_warp = __popc(same & ((1u << lane) - 1u));
  if (valid && rank_in_warp == 0) warp_count[warp * a.experts + raw] = __popc(same);
  __syncthreads();
  if (i >= entries) return;
  if (!valid) {
    a.entry_row[i] = -1;
    return;
  }
  std::int32_t row =
      a.expert_offsets[raw] + prefix[static_cast<std::int64_t>(raw) * blocks + blockIdx.x] + rank_in_warp;
  for (int w = 0; w < warp; ++w) row += warp_count[w * a.experts + raw];
  a.entry_row[i] = row;
  a.sorted_entry[row] = static_cast<std::int32_t>(i);
}

/// One warp per sorted row: the row's token is read once, then the warp
/// copies the row in 16-byte vectors, four in flight per lane. Rows
/// beyond the sorted total are left untouched.
template <class T>
__global__ void __launch_bounds__(256, 4) gather_rows_kernel(GatherArgs a) {
  const std::int64_t total = a.expert_offsets[a.experts];
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
  const std::int64_t vecs = a.cols / 8;  // 16-byte vectors per row
  for (std::int64_t p = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32; p < total;
       p += warps) {
    const std::int64_t t = a.sorted_entry[p] / a.k;
    const T* src = static_cast<const T*>(a.x) + t * a.ldx;
    T* dst = static_cast<T*>(a.gathered) + p * a.ldg;
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    std::int64_t c = lane;
    for (; c + 96 < vecs; c += 128) {
      const uint4 v0 = __ldg(s4 + c), v1 = __ldg(s4 + c + 32), v2 = __ldg(s4 + c + 64), v3 = __ldg(s4 + c + 96);
      d4[c] = v0;
      d4[c + 32] = v1;
      d4[c + 64] = v2;
      d4[c + 96] = v3;
    }
    for (; c < vecs; c += 32) d4[c] = __ldg(s4 + c);
    for (std::int64_t j = vecs * 8 + lane; j < a.cols; j += 32) dst[j] = src[j];
  }
}

/// Threads over max(E, entries): the first E also do expert e's counts.
__global__ void block_layout_kernel(BlockLayoutArgs a, std::int64_t entries) {
  const int G = a.experts / a.blocks;
  const std::int64_t cap = a.capacity;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < entries || i < a.experts;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if (i < a.experts) {
      const int e = static_cast<int>(i), b = e / G;
      const std::int64_t start = a.expert_offsets[b * G];
      const std::int64_t lo = a.expert_offsets[e] - start, hi = a.expert_offsets[e + 1] - start;
      a.block_counts[e] = static_cast<std::int32_t>((hi < cap ? hi : cap) - (lo < cap ? lo : cap));
      if (e == b * G && a.overflow != nullptr) {
        const std::int64_t total = a.expert_offsets[(b + 1) * G] - start;
        if (total > cap) {
          atomicAdd(&a.overflow[0], static_cast<std::int32_t>(total - cap));
          atomicMax(&a.overflow[1], static_cast<std::int32_t>(total));
        }
      }
    }
    if (i < entries) {
      const std::int32_t row = a.entry_row[i];
      std::int32_t slot = -1;
      if (row >= 0) {
        const int b = a.expert_ids[i] / G;  // a placed entry has a valid id
        const std::int64_t pos = row - a.expert_offsets[b * G];
        if (pos < cap) slot = static_cast<std::int32_t>(b * cap + pos);
      }
      a.entry_slot[i] = slot;
    }
  }
}

template <class T>
__global__ void scatter_rows_kernel(ScatterArgs a) {
  const std::int64_t vecs = a.cols / 8;  // 16-byte vectors per row
  const std::int64_t tail0 = vecs * 8;
  const std::int64_t per_row = vecs + (a.cols - tail0);
  const std::int64_t work = a.entries * per_row;
  for (std::int64_t w = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; w < work;
       w += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = w / per_row, c = w % per_row;
    const std::int32_t slot = a.entry_slot[i];
    if (slot < 0) continue;
    const T* src = static_cast<const T*>(a.x) + (i / a.k) * a.ldx;
    T* dst = static_cast<T*>(a.dst) + static_cast<std::int64_t>(slot) * a.ldd;
    if (c < vecs)
      reinterpret_cast<uint4*>(dst)[c] = reinterpret_cast<const uint4*>(src)[c];
    else
      dst[tail0 + (c - vecs)] = src[tail0 + (c - vecs)];
  }
}

using detail::from_f32;
using detail::to_f32;

/// One warp per token: lane s < k reads slot s's row and weight once, the
/// warp then walks the columns in 16-byte vectors (8 per lane), issuing the
/// loads of four slots before it adds them, in slot order (the sum is the
/// same, bit for bit, whatever the grid). Addends follow the slots.
template <class T>
__global__ void combine_kernel(CombineArgs a) {
  constexpr int kBatch = 4;
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
  const std::int64_t groups = (a.cols + 7) / 8;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32; t < a.tokens;
       t += warps) {
    std::int32_t my_row = -1;
    float my_weight = 0.f;
    if (lane < a.k) {
      my_row = a.entry_row[t * a.k + lane];
      my_weight = my_row < 0 ? 0.f : a.weights[t * a.k + lane];
    }
    // The column loop runs the same trips on every lane (the shuffles
    // need the whole warp); lanes past the last column group idle.
    for (std::int64_t g0 = 0; g0 < groups; g0 += 32) {
      const std::int64_t g = g0 + lane;
      const bool active = g < groups;
      const std::int64_t c0 = g * 8;
      const int n = !active ? 0 : (a.cols - c0 < 8 ? static_cast<int>(a.cols - c0) : 8);
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int s0 = 0; s0 < a.k; s0 += kBatch) {
        uint4 v[kBatch];
        float w[kBatch];
        bool used[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          // Every lane takes part in the shuffles; idle lanes and slots past
          // k or without a row load nothing.
          const std::int32_t r = __shfl_sync(0xffffffffu, my_row, (s0 + b) & 31);
          w[b] = __shfl_sync(0xffffffffu, my_weight, (s0 + b) & 31);
          v[b] = make_uint4(0u, 0u, 0u, 0u);
          used[b] = n > 0 && s0 + b < a.k && r >= 0;
          if (used[b] && n == 8) {
            v[b] = __ldg(
                reinterpret_cast<const uint4*>(static_cast<const T*>(a.y) + static_cast<std::int64_t>(r) * a.ldy + c0));
          } else if (used[b]) {  // the row's last, partial group: scalar loads, same order
            const T* row = static_cast<const T*>(a.y) + static_cast<std::int64_t>(r) * a.ldy + c0;
#pragma unroll
            for (int j = 0; j < 8; ++j)
              if (j < n) acc[j] += w[b] * to_f32(row[j]);
            used[b] = false;
          }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          if (!used[b]) continue;
          const T* e = reinterpret_cast<const T*>(&v[b]);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[j] += w[b] * to_f32(e[j]);
        }
      }
      if (!active) continue;
      for (int j = 0; j < a.addends; ++j) {
        const T* row = static_cast<const T*>(a.addend) + j * a.addend_stride + t * a.ld_add + c0;
        if (n == 8) {
          const uint4 u = __ldg(reinterpret_cast<const uint4*>(row));
          const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
          for (int q = 0; q < 8; ++q) acc[q] += to_f32(e[q]);
        } else {
#pragma unroll
          for (int q = 0; q < 8; ++q)
            if (q < n) acc[q] += to_f32(row[q]);
        }
      }
      T* o = static_cast<T*>(a.out) + t * a.ldo + c0;
      if (n == 8) {
        uint4 u;
        T* e = reinterpret_cast<T*>(&u);
#pragma unroll
        for (int j = 0; j < 8; ++j) e[j] = from_f32<T>(acc[j]);
        *reinterpret_cast<uint4*>(o) = u;
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (j < n) o[j] = from_f32<T>(acc[j]);
      }
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

int grid_for(std::int64_t work, int threads) {
  const std::int64_t blocks = (work + threads - 1) / threads;
  const std::int64_t cap = static_cast<std::int64_t>(detail::sm_count()) * 8;
  return static_cast<int>(blocks < 1 ? 1 : (blocks < cap ? blocks : cap));
}

void check_common(const char* op, std::int64_t tokens, int experts, int k) {
  TESSERA_CHECK(tokens >= 0 && tokens < (std::int64_t{1} << 31), "{}: tokens = {} out of range [0, 2^31)", op, tokens);
  TESSERA_CHECK(experts >= 1 && experts <= kMaxExperts, "{}: experts = {} out of range [1, {}]", op, experts,
                kMaxExperts);
  TESSERA_CHECK(k >= 1 && k <= kMaxTopK && k <= experts, "{}: k = {} out of range [1, min({}, experts = {})]", op, k,
                kMaxTopK, experts);
  TESSERA_CHECK(tokens * k < (std::int64_t{1} << 31), "{}: tokens * k = {} does not fit the int32 row indices", op,
                tokens * k);
}

void check_rows(const char* op, const void* p, std::int64_t ld, std::int64_t cols, DType t, const char* name) {
  TESSERA_CHECK(t == DType::bf16 || t == DType::f16, "{}: dtype {} not supported (bf16 or f16)", op, dtype_name(t));
  TESSERA_CHECK(p != nullptr && aligned16(p), "{}: {} = {} must be non-null and 16-byte aligned", op, name, p);
  TESSERA_CHECK(ld >= cols && ld % 8 == 0, "{}: the row stride of {} ({}) must be >= cols = {} and a multiple of 8", op,
                name, ld, cols);
}

}  // namespace

void topk_gating(const TopKArgs& a, cudaStream_t stream) {
  check_common("moe::topk_gating", a.tokens, a.experts, a.k);
  TESSERA_CHECK(a.logits != nullptr && a.expert_ids != nullptr && a.weights != nullptr,
                "moe::topk_gating: logits, expert_ids and weights must be non-null");
  TESSERA_CHECK(a.logits_dtype == DType::f32 || a.logits_dtype == DType::bf16 || a.logits_dtype == DType::f16,
                "moe::topk_gating: logits dtype {} not supported", dtype_name(a.logits_dtype));
  const std::int64_t ld = a.ld_logits ? a.ld_logits : a.experts;
  TESSERA_CHECK(ld >= a.experts, "moe::topk_gating: ld_logits = {} < experts = {}", ld, a.experts);
  if (a.tokens == 0) return;
  constexpr int kThreads = 256;
  topk_gating_kernel<<<grid_for(a.tokens * 32, kThreads), kThreads, 0, stream>>>(a, ld);
  detail::check_launch("moe::topk_gating: kernel launch");
}

std::size_t permute_workspace_bytes(std::int64_t entries, int experts) {
  const std::int64_t blocks = (entries + kBlock - 1) / kBlock;
  return static_cast<std::size_t>(blocks) * static_cast<std::size_t>(experts) * sizeof(std::int32_t);
}

void permute(const PermuteArgs& a, cudaStream_t stream) {
  check_common("moe::permute", a.tokens, a.experts, a.k);
  TESSERA_CHECK(
      a.expert_ids != nullptr && a.expert_offsets != nullptr && a.sorted_entry != nullptr && a.entry_row != nullptr,
      "moe::permute: expert_ids, expert_offsets, sorted_entry and entry_row must be non-null");
  TESSERA_CHECK(a.capacity >= 0, "moe::permute: capacity = {} must be >= 0", a.capacity);
  const std::int64_t entries = a.tokens * a.k;
  const std::size_t need = permute_workspace_bytes(entries, a.experts);
  TESSERA_CHECK(need == 0 || (a.workspace != nullptr && a.workspace_bytes >= need),
                "moe::permute: workspace of {} bytes given, {} needed (permute_workspace_bytes)", a.workspace_bytes,
                need);
  const int blocks = static_cast<int>((entries + kBlock - 1) / kBlock);
  auto* counts = static_cast<std::int32_t*>(a.workspace);
  const std::size_t count_smem = static_cast<std::size_t>(a.experts) * sizeof(std::int32_t);
  const std::size_t scatter_smem = static_cast<std::size_t>(kWarps) * a.experts * sizeof(std::int32_t);
  if (blocks > 0) {
    permute_count_kernel<<<blocks, kBlock, count_smem, stream>>>(a, entries, counts, blocks);
    detail::check_launch("moe::permute: count kernel launch");
  }
  permute_scan_kernel<<<1, kMaxExperts, 0, stream>>>(a, counts, blocks);
  detail::check_launch("moe::permute: scan kernel launch");
  if (blocks > 0) {
    permute_scatter_kernel<<<blocks, kBlock, scatter_smem, stream>>>(a, entries, counts, blocks);
    detail::check_launch("moe::permute: scatter kernel launch");
  }
}

void gather_rows(const GatherArgs& a, cudaStream_t stream) {
  TESSERA_CHECK(a.experts >= 1 && a.experts <= kMaxExperts, "moe::gather_rows: experts = {} out of range [1, {}]",
                a.experts, kMaxExperts);
  TESSERA_CHECK(a.k >= 1 && a.k <= kMaxTopK, "moe::gather_rows: k = {} out of range [1, {}]", a.k, kMaxTopK);
  TESSERA_CHECK(a.max_rows >= 0 && a.max_rows < (std::int64_t{1} << 31),
                "moe::gather_rows: max_rows = {} out of range [0, 2^31)", a.max_rows);
  check_rows("moe::gather_rows", a.x, a.ldx, a.cols, a.dtype, "x");
  check_rows("moe::gather_rows", a.gathered, a.ldg, a.cols, a.dtype, "gathered");
  TESSERA_CHECK(a.cols >= 1, "moe::gather_rows: cols = {} must be >= 1", a.cols);
  TESSERA_CHECK(a.sorted_entry != nullptr && a.expert_offsets != nullptr,
                "moe::gather_rows: sorted_entry and expert_offsets must be non-null");
  if (a.max_rows == 0) return;
  constexpr int kThreads = 256;
  const int grid = grid_for(a.max_rows * 32, kThreads);  // a warp per row
  if (a.dtype == DType::f16)
    gather_rows_kernel<__half><<<grid, kThreads, 0, stream>>>(a);
  else
    gather_rows_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
  detail::check_launch("moe::gather_rows: kernel launch");
}

void block_layout(const BlockLayoutArgs& a, cudaStream_t stream) {
  check_common("moe::block_layout", a.tokens, a.experts, a.k);
  TESSERA_CHECK(a.blocks >= 1 && a.experts % a.blocks == 0,
                "moe::block_layout: blocks = {} must be >= 1 and divide experts = {}", a.blocks, a.experts);
  TESSERA_CHECK(a.capacity >= 0 && a.capacity * a.blocks < (std::int64_t{1} << 31),
                "moe::block_layout: capacity = {} (times blocks = {}) out of range [0, 2^31)", a.capacity, a.blocks);
  TESSERA_CHECK(
      a.expert_ids != nullptr && a.expert_offsets != nullptr && a.entry_row != nullptr && a.block_counts != nullptr &&
          a.entry_slot != nullptr,
      "moe::block_layout: expert_ids, expert_offsets, entry_row, block_counts and entry_slot must be non-null");
  const std::int64_t entries = a.tokens * a.k;
  constexpr int kThreads = 256;
  block_layout_kernel<<<grid_for(entries > a.experts ? entries : a.experts, kThreads), kThreads, 0, stream>>>(a,
                                                                                                              entries);
  detail::check_launch("moe::block_layout: kernel launch");
}

void scatter_rows(const ScatterArgs& a, cudaStream_t stream) {
  TESSERA_CHECK(a.k >= 1 && a.k <= kMaxTopK, "moe::scatter_rows: k = {} out of range [1, {}]", a.k, kMaxTopK);
  TESSERA_CHECK(a.entries >= 0 && a.entries < (std::int64_t{1} << 31),
                "moe::scatter_rows: entries = {} out of range [0, 2^31)", a.entries);
  check_rows("moe::scatter_rows", a.x, a.ldx, a.cols, a.dtype, "x");
  check_rows("moe::scatter_rows", a.dst, a.ldd, a.cols, a.dtype, "dst");
  TESSERA_CHECK(a.cols >= 1, "moe::scatter_rows: cols = {} must be >= 1", a.cols);
  TESSERA_CHECK(a.entry_slot != nullptr, "moe::scatter_rows: entry_slot must be non-null");
  if (a.entries == 0) return;
  constexpr int kThreads = 256;
  const int grid = grid_for(a.entries * (a.cols / 8 + a.cols % 8), kThreads);
  if (a.dtype == DType::f16)
    scatter_rows_kernel<__half><<<grid, kThreads, 0, stream>>>(a);
  else
    scatter_rows_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
  detail::check_launch("moe::scatter_rows: kernel launch");
}

void combine(const CombineArgs& a, cudaStream_t stream) {
  TESSERA_CHECK(a.k >= 1 && a.k <= kMaxTopK, "moe::combine: k = {} out of range [1, {}]", a.k, kMaxTopK);
  TESSERA_CHECK(a.tokens >= 0 && a.tokens * a.k < (std::int64_t{1} << 31),
                "moe::combine: tokens = {} (times k = {}) out of range", a.tokens, a.k);
  check_rows("moe::combine", a.y, a.ldy, a.cols, a.dtype, "y");
  check_rows("moe::combine", a.out, a.ldo, a.cols, a.dtype, "out");
  TESSERA_CHECK(a.cols >= 1, "moe::combine: cols = {} must be >= 1", a.cols);
  TESSERA_CHECK(a.entry_row != nullptr && a.weights != nullptr, "moe::combine: entry_row and weights must be non-null");
  TESSERA_CHECK(a.addends >= 0, "moe::combine: addends = {} must be >= 0", a.addends);
  if (a.addends > 0) {
    check_rows("moe::combine", a.addend, a.ld_add, a.cols, a.dtype, "addend");
    TESSERA_CHECK(a.addend_stride >= a.tokens * a.ld_add && a.addend_stride % 8 == 0,
                  "moe::combine: addend_stride = {} must be a multiple of 8 and >= tokens ({}) x ld_add ({})",
                  a.addend_stride, a.tokens, a.ld_add);
  }
  if (a.tokens == 0) return;
  constexpr int kThreads = 256;
  const int grid = grid_for(a.tokens * 32, kThreads);  // a warp per token
  if (a.dtype == DType::f16)
    combine_kernel<__half><<<grid, kThreads, 0, stream>>>(a);
  else
    combine_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
  detail::check_launch("moe::combine: kernel launch");
}

}  // namespace tessera::kernels::moe
