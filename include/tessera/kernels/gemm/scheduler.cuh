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
/// a sequence of segments, each one tile's K blocks [k0, k1). Every CTA has
/// at least one iteration (units <= sk iterations), so begin() is strictly
/// increasing. A tile split over CTAs first_unit(t) .. last_unit(t) is
/// reduced by its last CTA (the one holding K block k_blocks - 1): each
/// earlier CTA stores its segment, its only partial one, into its own f32
/// slot and raises its flag; the last adds those slots in CTA order to its
/// accumulators and stores the tile (kernel_stream_k.cuh). Pure arithmetic:
/// the producer and the consumers evaluate it independently. Tile indices
/// below (first_unit, last_unit, split) are stream-K-local: position
/// dp_tiles + t.
struct StreamKScheduler {
  static constexpr bool kStreamK = true;
  RasterScheduler inner;
  int tiles = 1;
  int k_blocks = 1;
  int units = 1;
  int dp_tiles = 0;
  int iters = 1;  ///< stream-K iterations: (tiles - dp_tiles) * k_blocks
  int j_min = 0;  ///< the fewest tile starts (K block 0) in one CTA's range
  /// iters = q * units + r, and FastDivmods by k_blocks, units and q: the
  /// walk's per-segment arithmetic divides only through these, so no
  /// division routine is called in a kernel's loop (a call pushes the
  /// loop's uniform values into vector registers).
  int q = 1, r = 0;
  FastDivmod k_div, units_div, q_div;

  /// units is clamped to [1, tiles * k_blocks]; at least `min_blocks` K blocks
  /// per CTA where there are fewer tiles than CTAs (shorter ranges cost more
  /// partial traffic than they balance). Needs (tiles + 1) * k_blocks < 2^31
  /// (the host checks it before a launch).
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
    s.iters = (s.tiles - s.dp_tiles) * s.k_blocks;
    s.q = s.iters / s.units;
    s.r = s.iters % s.units;
    s.k_div = FastDivmod::make(static_cast<uint32_t>(s.k_blocks));
    s.units_div = FastDivmod::make(static_cast<uint32_t>(s.units));
    s.q_div = FastDivmod::make(static_cast<uint32_t>(s.q));
    s.j_min = s.tiles;
    for (int b = 0; b < s.units; ++b) {
      const int starts = s.starts_before(b + 1) - s.starts_before(b);
      s.j_min = starts < s.j_min ? starts : s.j_min;
    }
    return s;
  }
  /// First stream-K iteration of CTA b (b in [0, units]; begin(units) = iters):
  /// floor(b * iters / units).
  __host__ __device__ __forceinline__ int begin(int b) const {
    return q * b + static_cast<int>(units_div.div(static_cast<uint32_t>(r * b)));
  }
  /// Stream-K tiles that start (K block 0) in the ranges of CTAs 0 .. b - 1.
  __host__ __device__ __forceinline__ int starts_before(int b) const {
    return static_cast<int>(k_div.div(static_cast<uint32_t>(begin(b) + k_blocks - 1)));
  }
  /// The CTA whose range holds iteration it: the largest b with begin(b) <=
  /// it. begin(b) >= q * b bounds it by it / q; a few steps down find it.
  __host__ __device__ __forceinline__ int unit_of(int it) const {
    int b = static_cast<int>(q_div.div(static_cast<uint32_t>(it)));
    b = b < units - 1 ? b : units - 1;
    while (begin(b) > it) --b;
    return b;
  }
  /// The schedule position (of `inner`, after the data-parallel head) of
  /// stream-K tile t. CTA b starts its tiles in range order at about the
  /// same times as the others (the walk below): its j-th goes to position
  /// j * units + b while every CTA has a j-th, the rest after those. So
  /// the tiles the CTAs start together are neighbours in `inner`'s order
  /// and share its panels, as a data-parallel wave does; in range order
  /// they would spread over every panel and re-read them from DRAM.
  __host__ __device__ __forceinline__ int position(int t) const {
    const int b = first_unit(t), before = starts_before(b);
    return position_of_start(b, before, t - before);
  }
  /// position() of the j-th tile starting in CTA b's range, where `before`
  /// (starts_before(b)) tiles start in earlier ranges.
  __host__ __device__ __forceinline__ int position_of_start(int b, int before, int j) const {
    if (j < j_min) return j * units + b;
    return j_min * units + (before - j_min * b) + (j - j_min);
  }
  /// The first and the last CTA working on stream-K tile t; the last one
  /// reduces a split tile, the others contribute to it.
  __host__ __device__ __forceinline__ int first_unit(int t) const { return unit_of(t * k_blocks); }
  __host__ __device__ __forceinline__ int last_unit(int t) const { return unit_of(t * k_blocks + k_blocks - 1); }
  /// Whether stream-K tile t is split over several CTAs.
  __host__ __device__ __forceinline__ bool split(int t) const { return first_unit(t) != last_unit(t); }
  /// Whether any stream-K tile is split: unless every range boundary
  /// begin(b) = q b + floor(r b / units) is a whole tile, i.e. r = 0 and q
  /// a multiple of k_blocks (floor(r b / units) takes every value 0 .. r - 1,
  /// so r >= 1 puts a boundary inside a tile once k_blocks > 1).
  __host__ __device__ __forceinline__ bool any_split() const { return k_blocks > 1 && (r != 0 || q % k_blocks != 0); }
};

/// One segment of a CTA's work: K blocks [k0, k1) of the tile at walk index
/// `tile` (the data-parallel head's positions, then dp_tiles + the
/// stream-K-local tile), which sits at `position` of `inner`'s schedule.
/// A segment that ends a split tile (k0 > 0, k1 == k_blocks) also names
/// the tile's first CTA, `lo`.
struct StreamKSegment {
  int tile, k0, k1;
  int position;
  int lo;
};

/// CTA b's segments, its data-parallel tiles first: at(s, i) for i in
/// [0, count). A stream-K range that starts inside a tile and runs
/// into the next walks that leading segment (the tile's end, which this CTA
/// reduces) last. Then CTAs stream K in step, as the data-parallel kernel
/// does: a range's other segments start at K block 0 and the deferred one
/// ends with the range, so where every range holds a tile start the CTAs
/// read K blocks at one of two offsets at any time (t and t + k_blocks -
/// range length) and CTAs sharing an A or B panel read it together (a range
/// inside one tile keeps its own offset). CTAs whose K offsets differ
/// re-read each panel from DRAM once it outgrows the L2: rotating each
/// CTA's K start in the data-parallel kernel made it 1.3-2.1x slower
/// (docs/design/gemm.md). And a range of at least one tile reduces last:
/// the contribution it adds was stored before its deferred segment began.
///
/// Iteration indices fit in int (the host rejects (tiles + 1) x K blocks
/// of 2^31 or more).
struct StreamKWalk {
  int b;
  int dp_count;  ///< data-parallel tiles (whole waves)
  int first;     ///< the first stream-K tile starting (K block 0) in the range
  int starts;    ///< how many start there
  int count;     ///< segments: dp_count + starts (+ 1 with a leading segment)
  __host__ __device__ __forceinline__ StreamKWalk(const StreamKScheduler& s, int cta)
      : b(cta), dp_count(s.dp_tiles / s.units), first(s.starts_before(cta)) {
    starts = s.starts_before(b + 1) - first;
    count = dp_count + starts + (first * s.k_blocks > s.begin(b) ? 1 : 0);
  }
  /// Segment i (0 <= i < count) of the walk, from the counters alone: a
  /// kernel's loop over i is then as uniform as the data-parallel tile walk,
  /// and its ring state stays in uniform registers (a walk carrying its
  /// position between calls left an R2UR move before every wgmma).
  __host__ __device__ __forceinline__ StreamKSegment at(const StreamKScheduler& s, int i) const {
    if (i < dp_count) {
      const int pos = b + i * s.units;
      return StreamKSegment{pos, 0, s.k_blocks, pos, b};
    }
    const int j = i - dp_count, end = s.begin(b + 1);
    if (j < starts) {
      const int t = first + j;
      const int rest = end - t * s.k_blocks;
      return StreamKSegment{s.dp_tiles + t, 0, rest < s.k_blocks ? rest : s.k_blocks,
                            s.dp_tiles + s.position_of_start(b, first, j), b};
    }
    const int t = first - 1, t0 = t * s.k_blocks;  // the range began inside tile first - 1
    return StreamKSegment{s.dp_tiles + t, s.begin(b) - t0, end - t0 < s.k_blocks ? end - t0 : s.k_blocks,
                          s.dp_tiles + s.position(t), s.first_unit(t)};
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
