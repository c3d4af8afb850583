// tessera/kernels/gemm/epilogue.cuh — what happens to a finished tile (the
// Epilogue policy).
//
// Concept:
//   static constexpr bool kNotify;     // call tile_done() after the stores
//   static constexpr bool kSysScope;   // stores must be visible system-wide
//                                      // (peer GPU / host) before tile_done
//   __device__ void store8(const TileInfo& t, int row, int col,
//                          const float (&v)[8], int valid) const;
//   __device__ void tile_done(const TileInfo& t) const;
// An epilogue with a per-tile bind() (below) gives its store8 on the bound
// object instead; the kernel then calls only that one.
//
// store8 receives the f32 accumulators of D[row, col .. col+7]; col is a
// multiple of 8; only the first `valid` (1..8) are inside the problem
// (valid < 8 only in the last tile column when N % 8 != 0). The kernel has
// already masked row < M and col < N. Consumer threads call it for their
// share of the tile (the kernel regroups the wgmma fragments within each lane
// quad so every call covers 8 consecutive columns: 16-byte stores for 16-bit
// outputs).
//
// Visibility contract when kNotify: after its last store8 of the tile each
// consumer thread that stored it (both warpgroups; with the ping-pong
// schedule only the one that owns the tile) arrives on a named barrier
// (bar.arrive: no waiting); a
// notifier warp of the producer warpgroup waits on it (bar.sync), executes
// fence.acq_rel.gpu (fence.acq_rel.sys when kSysScope) and then calls
// tile_done(t) on one lane. tile_done must publish with a STRONG write at the
// matching scope: the kernel's fence followed by that write is a release
// pattern (PTX memory model), so StdEpilogue uses red.relaxed.{gpu,sys}.add —
// a red.release there would execute a second, redundant fence (one more
// MEMBAR per tile). A tile_done with a release write (the ops' RsEpilogue)
// is correct too, only slower. The barrier orders the consumers' stores
// before the notifier's fence, and the fence's cumulativity makes them
// visible, at that scope, to any thread that acquire-reads the flag value
// tile_done wrote. The consumers never stall on the fence: they bar.arrive
// (no wait) and the next tile's wgmma runs while the notifier waits.
//
// Device code reached from an Epilogue must not call functions (no printf):
// a call anywhere in the kernel serializes its wgmma (ptxas warning C7510).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "tessera/link/memory_order.cuh"
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
// Each OutConv<T> has: Pair, pack/unpack (2 values), one/to_float (1 value),
// store8/load8 (8 values, 16-byte aligned for 16-bit T, 32-byte for float) and
// store4 (4 values: 8-byte / 16-byte aligned).
/// The 16-bit types share their vector loads/stores; each specialization
/// gives only its conversions (pack / unpack / one / to_float).
template <class T, class PairT, class Conv>
struct OutConv16 {
  using Pair = PairT;
  __device__ static uint32_t bits(Pair p) { return *reinterpret_cast<uint32_t*>(&p); }
  __device__ static void store8(T* p, const float (&v)[8]) {
    uint4 u;
    u.x = bits(Conv::pack(v[0], v[1]));
    u.y = bits(Conv::pack(v[2], v[3]));
    u.z = bits(Conv::pack(v[4], v[5]));
    u.w = bits(Conv::pack(v[6], v[7]));
    *reinterpret_cast<uint4*>(p) = u;
  }
  __device__ static void store4(T* p, const float (&v)[4]) {
    uint2 u;
    u.x = bits(Conv::pack(v[0], v[1]));
    u.y = bits(Conv::pack(v[2], v[3]));
    *reinterpret_cast<uint2*>(p) = u;
  }
  __device__ static void load8(const T* p, float (&v)[8]) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = Conv::unpack(*reinterpret_cast<const Pair*>(&w[i]));
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
};
template <>
struct OutConv<__nv_bfloat16> : OutConv16<__nv_bfloat16, __nv_bfloat162, OutConv<__nv_bfloat16>> {
  __device__ static Pair pack(float a, float b) { return __floats2bfloat162_rn(a, b); }
  __device__ static float2 unpack(Pair p) { return __bfloat1622float2(p); }
  __device__ static __nv_bfloat16 one(float a) { return __float2bfloat16_rn(a); }
  __device__ static float to_float(__nv_bfloat16 a) { return __bfloat162float(a); }
};
template <>
struct OutConv<__half> : OutConv16<__half, __half2, OutConv<__half>> {
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
  __device__ static void store8(float* p, const float (&v)[8]) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
  __device__ static void store4(float* p, const float (&v)[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  }
  __device__ static void load8(const float* p, float (&v)[8]) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x;
    v[1] = a.y;
    v[2] = a.z;
    v[3] = a.w;
    v[4] = b.x;
    v[5] = b.y;
    v[6] = b.z;
    v[7] = b.w;
  }
};

/// Optional per-tile binding. An Epilogue may define
///   __device__ Bound bind(const TileInfo& t) const;
/// returning a small object with
///   __device__ void store8(int row, int col, const float (&v)[8], int valid) const;
/// The kernel binds once per tile, before the tile's stores (bind_tile), and
/// then calls the bound object's store8 for every 8 values (epi_store8). Why:
/// a thread makes 16 (ping-pong) to 32 store8 calls per tile, and the compiler
/// must assume each call's store may alias any table the epilogue reads, so
/// per-tile lookups written inside store8 (a reorder slot, a segment base, an
/// owner) are reloaded after every store. bind() does them once. Epilogues
/// without bind() are called exactly as before (the kernels measured with
/// them keep their SASS).
template <class Epi, class = void>
struct HasBind : std::false_type {};
template <class Epi>
struct HasBind<Epi, std::void_t<decltype(std::declval<const Epi&>().bind(std::declval<const TileInfo&>()))>>
    : std::true_type {};

struct NotBound {};

template <class Epi>
__device__ __forceinline__ auto bind_tile(const Epi& epi, const TileInfo& t) {
  if constexpr (HasBind<Epi>::value)
    return epi.bind(t);
  else
    return NotBound{};
}

/// Optional load-ahead form of a bound epilogue (ping-pong kernels only: the
/// cooperative path keeps its measured code). A Bound with
///   static constexpr int kLoadAhead;   // column blocks per batch (divides BN / 32)
///   using Loaded = ...;                // what one load returns
///   __device__ Loaded load(int row, int col) const;
///   __device__ void store8(int row, int col, const float (&v)[8], int valid, const Loaded& l) const;
/// is called as: load() for kLoadAhead consecutive column blocks of a row,
/// then store8() for each with its Loaded value. An epilogue that reads
/// memory per 8 values (the owner's add of GEMM+RS) otherwise pays one
/// memory latency per store8 in sequence: the compiler cannot hoist a load
/// above the previous store8's store, which might alias it.
template <class Bound, class = void>
struct HasLoadAhead : std::false_type {};
template <class Bound>
struct HasLoadAhead<Bound, std::void_t<decltype(Bound::kLoadAhead), typename Bound::Loaded>> : std::true_type {};

/// Optional column form of a bound epilogue (the swapped-operand kernels,
/// whose tile rows are D's columns). A Bound with
///   static constexpr bool kStoresColumns = true;
///   using OutType = ...;               // __nv_bfloat16 or __half
///   __device__ void store_column8(int row, int col, const uint4& packed, int valid) const;
/// receives the tile's rows row .. row + 7 of column col as 16-bit values in
/// the output type, packed in pairs (the low half first), of which the first
/// `valid` (1..8) are in the problem; row is a multiple of 8. The store loop
/// (store_tile_columns, kernel_common.cuh) transposes in registers, so the
/// epilogue writes 16 contiguous bytes where store8 would write 8 elements
/// one column of D apart.
template <class Bound, class = void>
struct HasColumnStore : std::false_type {};
template <class Bound>
struct HasColumnStore<Bound, std::enable_if_t<Bound::kStoresColumns>> : std::true_type {};

/// Optional two-way binding: bind() may return EitherBound<A, B>, meaning the
/// whole tile is stored through `a`, or through `b` when use_b. The ping-pong
/// kernel then emits one store loop per bound type and picks one per tile, so
/// neither loop carries the other's code or branch (GEMM+RS: remote tiles
/// store plainly into the staging slabs, own tiles add the peers' slabs with
/// load-ahead). Each of A and B is a bound object as above (with or without
/// load-ahead). EitherBound's own store8 branches per call; the cooperative
/// path, which keeps its measured single loop, uses that.
template <class A, class B>
struct EitherBound {
  A a;
  B b;
  bool use_b;
  __device__ __forceinline__ void store8(int row, int col, const float (&v)[8], int valid) const {
    if (use_b)
      b.store8(row, col, v, valid);
    else
      a.store8(row, col, v, valid);
  }
};
template <class T>
struct IsEitherBound : std::false_type {};
template <class A, class B>
struct IsEitherBound<EitherBound<A, B>> : std::true_type {};

template <class Epi, class Bound>
__device__ __forceinline__ void epi_store8(const Epi& epi, const Bound& bound, const TileInfo& t, int row, int col,
                                           const float (&v)[8], int valid) {
  if constexpr (HasBind<Epi>::value)
    bound.store8(row, col, v, valid);
  else
    epi.store8(t, row, col, v, valid);
}

/// The first `valid` (1..8) of 8 consecutive outputs at p: one 16-byte store
/// (32 for f32) when all 8 are valid (p then 16/32-byte aligned), else
/// element by element (the last tile column when N % 8 != 0). For epilogue
/// policies' store8.
template <class OutT>
__device__ __forceinline__ void store_first8(OutT* p, const float (&v)[8], int valid) {
  if (valid == 8) {
    OutConv<OutT>::store8(p, v);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (k < valid) p[k] = OutConv<OutT>::one(v[k]);
  }
}

/// The standard epilogue: every feature is a compile-time bit, so an unused
/// one emits no code. Alignment: d, c and bias 16-byte aligned, ldd and ldc
/// multiples of 8 elements (validate() checks D; C and bias are the caller's).
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
  const OutT* bias = nullptr;         ///< [N] (kEpiBias)
  const int* reorder = nullptr;       ///< tile -> slot (kEpiReorder)
  uint32_t* flags = nullptr;          ///< (kEpiNotify*)
  const int* tile_to_flag = nullptr;  ///< tile -> flag index, nullptr = identity
  uint32_t notify_add = 1;

  __device__ __forceinline__ void store8(const TileInfo& t, int row, int col, const float (&acc)[8], int valid) const {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = acc[i];
    const bool full = valid == 8;
    if constexpr (kBias) {
      if (full) {
        float b[8];
        Conv::load8(bias + col, b);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] += b[i];
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (i < valid) v[i] += Conv::to_float(bias[col + i]);
      }
    }
    if constexpr (kAddPartial) {
      // The partial lives at the un-reordered position in C.
      const OutT* cp = c + static_cast<int64_t>(row) * ldc + col;
      if (full) {
        float p[8];
        Conv::load8(cp, p);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] += p[i];
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (i < valid) v[i] += Conv::to_float(cp[i]);
      }
    }
    constexpr int kOut = kSwiGLU ? 4 : 8;  // outputs per call
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
      // v[2j] = gate, v[2j+1] = up (N even is the caller's contract).
      float o[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) o[j] = v[2 * j] / (1.0f + __expf(-v[2 * j])) * v[2 * j + 1];
      if (full) {
        Conv::store4(d + offset, o);
      } else {
#pragma unroll
        for (int j = 0; j < kOut; ++j)
          if (2 * j + 1 < valid) d[offset + j] = Conv::one(o[j]);
      }
    } else {
      if (full) {
        Conv::store8(d + offset, v);
      } else {
#pragma unroll
        for (int i = 0; i < kOut; ++i)
          if (i < valid) d[offset + i] = Conv::one(v[i]);
      }
    }
  }

  /// Relaxed (strong) add: the release is the kernel's fence.acq_rel that
  /// precedes this call (see the visibility contract at the top).
  __device__ __forceinline__ void tile_done(const TileInfo& t) const {
    if constexpr (kNotify) {
      const int f = tile_to_flag ? tile_to_flag[t.linear()] : t.linear();
      if constexpr (kSysScope)
        link::mo::red_add_relaxed_sys(flags + f, notify_add);
      else
        link::mo::red_add_relaxed_gpu(flags + f, notify_add);
    }
  }
};

/// The plain epilogue of a 16-bit D that the kernels store through shared
/// memory with bulk tensor stores where their shared memory has room for the
/// staging buffers (kernel_common.cuh, store_tile_tma) and `through_smem`
/// is set; otherwise they call its StdEpilogue store8 as for any plain
/// epilogue. d_map: D as a [M rows, N columns] tensor (ldd), box 32 columns
/// x 64 rows, 64-byte swizzle; both set by detail::make_tma_store_map,
/// which keeps through_smem off where N % 8 != 0: there bulk stores wrote
/// into the rows' padding past N (GPU test, 257 columns of 272), and the
/// register loop stores the last unit element by element. No notify: the
/// stores complete asynchronously, so nothing may be published per tile.
template <class OutT>
struct TmaStoreEpilogue : StdEpilogue<OutT> {
  static_assert(sizeof(OutT) == 2, "the TMA-store epilogue stores a 16-bit D");
  bool through_smem = false;
  CUtensorMap d_map;
};
template <class Epi>
struct IsTmaStoreEpilogue : std::false_type {};
template <class OutT>
struct IsTmaStoreEpilogue<TmaStoreEpilogue<OutT>> : std::true_type {};

}  // namespace tessera::kernels::engine
