// tessera/kernels/gemm/epilogue.cuh — what happens to a finished tile (the
// Epilogue policy).
//
// Concept:
//   static constexpr bool kNotify;     // call tile_done() after the stores
//   static constexpr bool kSysScope;   // stores must be visible system-wide
//                                      // (peer GPU / host) before tile_done
//   __device__ void store_pair(const TileInfo& t, int row, int col,
//                              float v0, float v1, bool has_v1) const;
//   __device__ void tile_done(const TileInfo& t) const;
//
// store_pair receives accumulator values for D[row, col] (v0) and
// D[row, col + 1] (v1; meaningful only when has_v1, i.e. col + 1 < N). The
// kernel has already masked row < M and col < N and guarantees col is even.
// Every consumer thread calls it for its share of the tile.
//
// Visibility contract when kNotify: after its last store_pair of the tile
// each consumer thread executes fence.acq_rel.gpu (fence.acq_rel.sys when
// kSysScope), the consumer warpgroups meet at a named barrier, then ONE thread
// calls tile_done(t). tile_done must publish with a release operation at the
// matching scope (StdEpilogue uses red.release.{gpu,sys}.add). By fence
// cumulativity, an observer that acquire-reads the flag value written by
// tile_done sees every store of the tile.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "tessera/kernels/gemm/ptx.cuh"
#include "tessera/kernels/gemm/tile.cuh"

namespace tessera::kernels::engine {

/// Feature bits of StdEpilogue (combine with |).
enum EpiFeature : unsigned {
  kEpiPlain = 0,
  kEpiAddPartial = 1u << 0,  ///< D = acc + C (C: local or peer buffer, OutT)
  kEpiBias = 1u << 1,        ///< acc += bias[col] (bias: OutT, length N)
  kEpiSwiGLU = 1u << 2,      ///< D[r, c/2] = SiLU(acc[r, c]) * acc[r, c+1] (c even)
  kEpiReorder = 1u << 3,     ///< store the tile into slot reorder[tile] of a group buffer
  kEpiNotify = 1u << 4,      ///< flags[f(tile)] += notify_add after the tile is visible (.gpu)
  kEpiNotifySys = 1u << 5,   ///< the same at .sys scope (peer GPUs / host observe)
};

template <class T>
struct OutConv;
template <>
struct OutConv<__nv_bfloat16> {
  using Pair = __nv_bfloat162;
  __device__ static Pair pack(float a, float b) { return __floats2bfloat162_rn(a, b); }
  __device__ static float2 unpack(Pair p) { return __bfloat1622float2(p); }
  __device__ static __nv_bfloat16 one(float a) { return __float2bfloat16_rn(a); }
  __device__ static float to_float(__nv_bfloat16 a) { return __bfloat162float(a); }
};
template <>
struct OutConv<__half> {
  using Pair = __half2;
  __device__ static Pair pack(float a, float b) { return __floats2half2_rn(a, b); }
  __device__ static float2 unpack(Pair p) { return __half22float2(p); }
  __device__ static __half one(float a) { return __float2half_rn(a); }
  __device__ static float to_float(__half a) { return __half2float(a); }
};
template <>
struct OutConv<float> {
  using Pair = float2;
  __device__ static Pair pack(float a, float b) { return make_float2(a, b); }
  __device__ static float2 unpack(Pair p) { return p; }
  __device__ static float one(float a) { return a; }
  __device__ static float to_float(float a) { return a; }
};

/// The standard epilogue: every feature is a compile-time bit, so an unused
/// one emits no code.
///
/// Addressing: without kEpiReorder, D[row, col] lives at d + row*ldd + col
/// (d may be a peer GPU's pointer: the stores then go over NVLink).
/// With kEpiReorder, tile (m, n) is written as a dense bm x bn block (row
/// stride bn) at d + reorder[m * tiles_n + n] * bm * bn: tiles of one wave
/// group land contiguously so one collective can send them. Edge tiles are
/// written only where row < M, col < N; the rest of their block is untouched.
/// With kEpiSwiGLU the output has N/2 columns (N even; gate and up
/// interleaved column-wise in B: column 2j is gate_j, 2j+1 is up_j) and the
/// output column is col/2; with kEpiReorder the block is bm x bn/2.
///
/// Notify: flag index = tile_to_flag ? tile_to_flag[tile] : tile, where tile =
/// m * tiles_n + n. A per-tile flag uses the identity; a wave-group counter
/// maps all tiles of a group to the group's counter (observers wait for
/// count >= epoch * tiles_in_group).
template <class OutT, unsigned kFeatures = kEpiPlain>
struct StdEpilogue {
  static constexpr bool kAddPartial = (kFeatures & kEpiAddPartial) != 0;
  static constexpr bool kBias = (kFeatures & kEpiBias) != 0;
  static constexpr bool kSwiGLU = (kFeatures & kEpiSwiGLU) != 0;
  static constexpr bool kReorder = (kFeatures & kEpiReorder) != 0;
  static constexpr bool kSysScope = (kFeatures & kEpiNotifySys) != 0;
  static constexpr bool kNotify = kSysScope || (kFeatures & kEpiNotify) != 0;
  static_assert(!(kSwiGLU && kAddPartial), "SwiGLU with a partial add is not supported");
  using Conv = OutConv<OutT>;
  using Pair = typename Conv::Pair;

  OutT* d = nullptr;
  int64_t ldd = 0;
  const OutT* c = nullptr;  ///< partial (kEpiAddPartial), same shape/type as D
  int64_t ldc = 0;
  const OutT* bias = nullptr;        ///< [N] (kEpiBias)
  const int* reorder = nullptr;      ///< tile -> slot (kEpiReorder)
  uint32_t* flags = nullptr;         ///< (kEpiNotify*)
  const int* tile_to_flag = nullptr; ///< tile -> flag index, nullptr = identity
  uint32_t notify_add = 1;

  __device__ __forceinline__ void store_pair(const TileInfo& t, int row, int col, float v0, float v1,
                                             bool has_v1) const {
    if constexpr (kBias) {
      v0 += Conv::to_float(bias[col]);
      if (has_v1) v1 += Conv::to_float(bias[col + 1]);
    }
    int64_t offset;
    if constexpr (kReorder) {
      const int64_t slot = reorder[t.linear()];
      const int bn_out = kSwiGLU ? t.bn / 2 : t.bn;
      const int c_in_tile = kSwiGLU ? (col - t.col0) / 2 : col - t.col0;
      offset = slot * t.bm * bn_out + static_cast<int64_t>(row - t.row0) * bn_out + c_in_tile;
    } else {
      offset = static_cast<int64_t>(row) * ldd + (kSwiGLU ? col / 2 : col);
    }
    if constexpr (kSwiGLU) {
      // v0 = gate, v1 = up (N even is validated on the host, so has_v1 holds).
      const float silu = v0 / (1.0f + __expf(-v0));
      d[offset] = Conv::one(silu * v1);
    } else {
      if constexpr (kAddPartial) {
        // The partial lives at the un-reordered position in C.
        const int64_t coff = static_cast<int64_t>(row) * ldc + col;
        if (has_v1) {
          const float2 p = Conv::unpack(*reinterpret_cast<const Pair*>(c + coff));
          v0 += p.x;
          v1 += p.y;
        } else {
          v0 += Conv::to_float(c[coff]);
        }
      }
      if (has_v1)
        *reinterpret_cast<Pair*>(d + offset) = Conv::pack(v0, v1);
      else
        d[offset] = Conv::one(v0);
    }
  }

  __device__ __forceinline__ void tile_done(const TileInfo& t) const {
    if constexpr (kNotify) {
      const int f = tile_to_flag ? tile_to_flag[t.linear()] : t.linear();
      if constexpr (kSysScope)
        ptx::red_release_sys_add(flags + f, notify_add);
      else
        ptx::red_release_gpu_add(flags + f, notify_add);
    }
  }
};

}  // namespace tessera::kernels::engine
