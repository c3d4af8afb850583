// tessera/kernels/gemm/scheduler.cuh — tile schedulers (the Scheduler policy).
//
// The GEMM runs a persistent grid: CTA b processes the tiles at positions
// b, b + gridDim.x, b + 2*gridDim.x, ... of a schedule of length
// tiles_m * tiles_n. A Scheduler maps a schedule position to the output tile
// (tile_m, tile_n) it computes. Its producer and consumer warps evaluate it
// independently, so it must be a pure function of (position, its own fields).
//
// Concept (all members __host__ __device__, trivially copyable):
//   TileCoord tile(int pos, int tiles_m, int tiles_n) const;
// The number of CTAs (the SM cap) is a launch option, not a scheduler field:
// see GemmOptions::max_ctas.
//
// Every schedule must be a permutation of all tiles; the kernel does not check
// that (PermutedScheduler's host side does — see validate_permutation()).
#pragma once

#include <cstdint>

#include "tessera/kernels/gemm/fast_divmod.cuh"

namespace tessera::kernels::engine {

struct TileCoord {
  int m;  ///< tile row index (rows [m*BM, (m+1)*BM))
  int n;  ///< tile column index
};

/// Raster order with grouping ("swizzle") and a rotation.
///  * along_m = false (default): tile rows are cut into bands of `group` rows;
///    bands run top to bottom, and inside a band the schedule walks down the
///    band's rows first, then moves one tile column right. Concurrent CTAs
///    then share `group` A row-panels and a few B column-panels in L2.
///    group = 1 is plain row-major order.
///  * along_m = true: the same with the roles of rows and columns swapped.
///  * rotate_m rotates tile rows: the schedule's row r computes tile row
///    (r + rotate_m) % tiles_m — "my rows first" for rank-rotated AG+GEMM.
///    0 <= rotate_m < tiles_m (launch_config reduces it modulo tiles_m), so
///    the rotation is one compare and subtract, not a division per tile.
///  * prepare(tiles_m, tiles_n) makes the divisions by the band size and the
///    band widths FastDivmods. launch_config (the only launch path of
///    gemm_kernel) calls it, and device code relies on it: the kernel has no
///    division left. An unprepared scheduler on the host (models, tests)
///    divides plainly, with equal results.
struct RasterScheduler {
  int group = 8;
  bool along_m = false;
  int rotate_m = 0;
  FastDivmod per_band_div;    ///< group * minor tiles
  FastDivmod width_div;       ///< group
  FastDivmod last_width_div;  ///< the last band's width (major tiles % group, or group)

  void prepare(int tiles_m, int tiles_n) {
    const int major_tiles = along_m ? tiles_n : tiles_m;
    const int minor_tiles = along_m ? tiles_m : tiles_n;
    rotate_m %= tiles_m;
    per_band_div = FastDivmod::make(static_cast<uint32_t>(group * minor_tiles));
    width_div = FastDivmod::make(static_cast<uint32_t>(group));
    const int last = major_tiles % group;
    last_width_div = FastDivmod::make(static_cast<uint32_t>(last ? last : group));
  }

  __host__ __device__ __forceinline__ TileCoord tile(int pos, int tiles_m, int tiles_n) const {
    // Work in a (major, minor) frame: major = the dimension cut into bands.
    const int major_tiles = along_m ? tiles_n : tiles_m;
    const int minor_tiles = along_m ? tiles_m : tiles_n;
    const int per_band = group * minor_tiles;
#if defined(__CUDA_ARCH__)
    constexpr bool kFast = true;  // launch_config prepared it
#else
    const bool kFast = per_band_div.mul != 0;
#endif
    const int band = kFast ? static_cast<int>(per_band_div.div(static_cast<uint32_t>(pos))) : pos / per_band;
    const int first = band * group;
    const bool last = major_tiles - first < group;
    const int width = last ? major_tiles - first : group;
    const int in_band = pos - band * per_band;
    const int minor = kFast ? static_cast<int>((last ? last_width_div : width_div).div(static_cast<uint32_t>(in_band)))
                            : in_band / width;
    const int major = first + in_band - minor * width;
    TileCoord t = along_m ? TileCoord{minor, major} : TileCoord{major, minor};
    if (rotate_m) {
      t.m += rotate_m;
      if (t.m >= tiles_m) t.m -= tiles_m;
    }
    return t;
  }
};

/// Split-K over a RasterScheduler: the schedule has tiles * splits work
/// units; unit pos computes output tile inner.tile(pos % tiles) over K blocks
/// [split * kb_per_split, (split + 1) * kb_per_split), split = pos / tiles.
/// Every unit runs the same number of K blocks (the ping-pong ring arithmetic
/// needs that): blocks past K are out of bounds, TMA zero-fills them and they
/// add nothing. make() guarantees every split holds at least one real block.
/// The epilogue sees TileInfo::pos = the unit and derives the split from it
/// (SplitKEpilogue, splitk.cuh). kSplitK tells the kernel to take the K range
/// and the unit count from here (sched_units / sched_k_blocks below).
struct SplitKScheduler {
  static constexpr bool kSplitK = true;
  RasterScheduler inner;
  int splits = 1;
  int kb_per_split = 1;
  int tiles = 1;
  FastDivmod tiles_div;

  /// splits is clamped so that the last split starts inside K.
  static SplitKScheduler make(RasterScheduler r, int tiles_m, int tiles_n, int k_blocks, int splits) {
    SplitKScheduler s;
    r.prepare(tiles_m, tiles_n);
    s.inner = r;
    splits = splits < 1 ? 1 : (splits > k_blocks ? k_blocks : splits);
    s.kb_per_split = (k_blocks + splits - 1) / splits;
    s.splits = (k_blocks + s.kb_per_split - 1) / s.kb_per_split;
    s.tiles = tiles_m * tiles_n;
    s.tiles_div = FastDivmod::make(static_cast<uint32_t>(s.tiles));
    return s;
  }
  __host__ __device__ __forceinline__ int split_of(int pos) const {
    return static_cast<int>(tiles_div.div(static_cast<uint32_t>(pos)));
  }
  __host__ __device__ __forceinline__ TileCoord tile(int pos, int tiles_m, int tiles_n) const {
    return inner.tile(pos - split_of(pos) * tiles, tiles_m, tiles_n);
  }
  __host__ __device__ __forceinline__ int k_begin(int pos) const { return split_of(pos) * kb_per_split; }
};

/// Stream-K with a data-parallel head. The first dp_tiles positions of
/// `inner`'s schedule (whole waves of `units` CTAs, all but the last full
/// one) run data-parallel: CTA b takes positions b, b + units, ... whole, as
/// the persistent kernel does, so concurrent CTAs share A and B panels in
/// L2. The rest (between one and two waves' worth, or every tile when there
/// are fewer tiles than CTAs) runs stream-K: its iteration space, sk_tiles x
/// k_blocks (tile-major: iteration it is K block it % k_blocks of position
/// dp_tiles + it / k_blocks), is cut into `units` contiguous ranges of equal
/// length (+-1), one per CTA: CTA b runs iterations [begin(b), begin(b + 1)),
/// a sequence of segments, each one tile's K blocks [k0, k1): whole tiles in
/// the middle, a partial tile at either end. Every CTA has at least one
/// iteration (units <= sk iterations), so begin() is strictly increasing.
/// The stream-K kernel (kernel_stream_k.cuh) stores whole tiles into D and
/// each partial segment into a slot of an f32 workspace; stream_k_fixup sums
/// the split tiles' slots. Pure arithmetic: producer, consumers and the
/// fixup evaluate it independently. Tile indices below (slot_of, split) are
/// stream-K-local: position dp_tiles + t.
struct StreamKScheduler {
  static constexpr bool kStreamK = true;
  RasterScheduler inner;
  int tiles = 1;
  int k_blocks = 1;
  int units = 1;
  int dp_tiles = 0;
  int64_t iters = 1;  ///< stream-K iterations: (tiles - dp_tiles) * k_blocks

  /// units is clamped to [1, tiles * k_blocks]; at least `min_blocks` K blocks
  /// per CTA where there are fewer tiles than CTAs (shorter ranges cost more
  /// partial traffic than they balance).
  static StreamKScheduler make(RasterScheduler r, int tiles_m, int tiles_n, int k_blocks, int units,
                               int min_blocks = 1) {
    StreamKScheduler s;
    r.prepare(tiles_m, tiles_n);
    s.inner = r;
    s.tiles = tiles_m * tiles_n;
    s.k_blocks = k_blocks < 1 ? 1 : k_blocks;
    const int64_t all = static_cast<int64_t>(s.tiles) * s.k_blocks;
    int64_t u = units < 1 ? 1 : units;
    if (s.tiles < u) {
      const int64_t most = all / (min_blocks < 1 ? 1 : min_blocks);
      u = most < u ? most : u;
    }
    s.units = static_cast<int>(u < 1 ? 1 : (u > all ? all : u));
    const int waves = s.tiles / s.units;
    s.dp_tiles = waves >= 2 ? (waves - 1) * s.units : 0;
    s.iters = static_cast<int64_t>(s.tiles - s.dp_tiles) * s.k_blocks;
    return s;
  }
  /// First stream-K iteration of CTA b (b in [0, units]; begin(units) = iters).
  __host__ __device__ __forceinline__ int64_t begin(int b) const { return iters * b / units; }
  /// The CTA whose range holds iteration it: the largest b with begin(b) <= it.
  __host__ __device__ __forceinline__ int unit_of(int64_t it) const {
    return static_cast<int>(((it + 1) * units - 1) / iters);
  }
  /// Workspace slot of CTA b's segment of stream-K tile t: 0 for its first
  /// segment, 1 for its last (only partial segments are stored there).
  __host__ __device__ __forceinline__ int slot_of(int b, int t) const { return begin(b) / k_blocks == t ? 0 : 1; }
  /// Whether stream-K tile t is split over several CTAs.
  __host__ __device__ __forceinline__ bool split(int t) const {
    const int64_t first = static_cast<int64_t>(t) * k_blocks;
    return unit_of(first) != unit_of(first + k_blocks - 1);
  }
};

/// One segment of a CTA's work: K blocks [k0, k1) of the tile at schedule
/// position `tile` (whole tiles in the data-parallel head).
struct StreamKSegment {
  int tile, k0, k1;
};

/// Walks CTA b's segments in order, its data-parallel tiles first: next()
/// returns false past the last.
struct StreamKWalk {
  const StreamKScheduler& s;
  int dp_pos;
  int64_t it, end;
  __host__ __device__ __forceinline__ StreamKWalk(const StreamKScheduler& sched, int b)
      : s(sched), dp_pos(b), it(sched.begin(b)), end(sched.begin(b + 1)) {}
  __host__ __device__ __forceinline__ bool next(StreamKSegment& g) {
    if (dp_pos < s.dp_tiles) {
      g = StreamKSegment{dp_pos, 0, s.k_blocks};
      dp_pos += s.units;
      return true;
    }
    if (it >= end) return false;
    const int local = static_cast<int>(it / s.k_blocks);
    g.tile = s.dp_tiles + local;
    g.k0 = static_cast<int>(it - static_cast<int64_t>(local) * s.k_blocks);
    const int64_t left = end - it;
    g.k1 = left < s.k_blocks - g.k0 ? g.k0 + static_cast<int>(left) : s.k_blocks;
    it += g.k1 - g.k0;
    return true;
  }
};

template <class S, class = void>
struct IsStreamK {
  static constexpr bool value = false;
};
template <class S>
struct IsStreamK<S, decltype(void(S::kStreamK))> {
  static constexpr bool value = S::kStreamK;
};

template <class S, class = void>
struct IsSplitK {
  static constexpr bool value = false;
};
template <class S>
struct IsSplitK<S, decltype(void(S::kSplitK))> {
  static constexpr bool value = S::kSplitK;
};

/// Work units of a schedule over tiles_m x tiles_n tiles (tiles, tiles x
/// splits for a split-K scheduler, the CTAs of a stream-K one).
template <class S>
__host__ __device__ __forceinline__ int sched_units(const S& s, int tiles_m, int tiles_n) {
  if constexpr (IsSplitK<S>::value)
    return tiles_m * tiles_n * s.splits;
  else if constexpr (IsStreamK<S>::value)
    return s.units;
  else
    return tiles_m * tiles_n;
}

/// K blocks each unit runs (all of K, or one split's share).
template <class S>
__host__ __device__ __forceinline__ int sched_k_blocks(const S& s, int k_blocks) {
  if constexpr (IsSplitK<S>::value)
    return s.kb_per_split;
  else
    return k_blocks;
}

/// An explicit order: order[pos] is the linear tile id tile_m * tiles_n + tile_n.
/// `order` is device memory of tiles_m * tiles_n ints holding a permutation.
struct PermutedScheduler {
  const int* order = nullptr;

  __host__ __device__ __forceinline__ TileCoord tile(int pos, int /*tiles_m*/, int tiles_n) const {
#if defined(__CUDA_ARCH__)
    const int id = __ldg(order + pos);
#else
    const int id = order[pos];
#endif
    return TileCoord{id / tiles_n, id % tiles_n};
  }
};

}  // namespace tessera::kernels::engine
