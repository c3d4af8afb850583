// CPU tests of the signal layer's index maps: tile order, waves, groups and
// the AllReduce / ReduceScatter / All-to-All reorders, including a CPU
// simulation of each collective against the non-overlapped reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "tessera/runtime/error.hpp"
#include "tessera/signal/a2a.hpp"
#include "tessera/signal/comm_driver.hpp"
#include "tessera/signal/epilogue_tables.hpp"
#include "tessera/signal/group_plan.hpp"
#include "tessera/signal/reorder.hpp"
#include "tessera/signal/wave_model.hpp"
#include "signal/fast_gather.hpp"  // internal (src/): the kernels' form of the gather maps

using namespace tessera::signal;

namespace {

struct Shape {
  std::int64_t m, n;
  int bm, bn, sms, swizzle;
  Raster raster;
};

const std::vector<Shape> kShapes = {
    {1000, 520, 128, 64, 7, 1, Raster::AlongN},    // ragged M and N
    {64, 64, 64, 64, 3, 1, Raster::AlongN},        // one tile
    {333, 1000, 64, 128, 5, 3, Raster::AlongM},    // ragged, swizzled along M
    {4096, 96, 128, 128, 11, 4, Raster::AlongN},   // N narrower than a tile
    {777, 1288, 128, 128, 13, 8, Raster::AlongN},  // swizzle > tile rows of the last panel
};

std::mt19937_64& rng() {
  static std::mt19937_64 g{std::random_device{}()};
  return g;
}

// Random partitions of W waves: single, per-wave, equal(3) and two random ones.
std::vector<GroupPlan> partitions(const WaveModel& wm) {
  std::vector<GroupPlan> out{GroupPlan::single(wm), GroupPlan::per_wave(wm)};
  if (wm.waves() >= 3) out.push_back(GroupPlan::equal(wm, 3));
  for (int rep = 0; rep < 2; ++rep) {
    std::vector<int> w;
    int left = wm.waves();
    while (left > 0) {
      const int k = std::uniform_int_distribution<int>(1, left)(rng());
      w.push_back(k);
      left -= k;
    }
    out.emplace_back(wm, w);
  }
  return out;
}

// Small integers so that sums are exact in double whatever the order.
std::vector<double> random_matrix(std::int64_t elems) {
  std::uniform_int_distribution<int> d(-1000, 1000);
  std::vector<double> v(elems);
  for (auto& x : v) x = d(rng());
  return v;
}

// Un-reorder through any post-communication gather map.
template <class Map>
std::vector<double> gather(const Map& map, const std::vector<double>& recv) {
  std::vector<double> out(map.rows() * map.cols(), std::nan(""));
  const int chunks = static_cast<int>((map.cols() + map.chunk_width() - 1) / map.chunk_width());
  for (std::int64_t r = 0; r < map.rows(); ++r)
    for (int c = 0; c < chunks; ++c) {
      const std::int64_t src = map.chunk_offset(r, c);
      const std::int64_t w =
          std::min<std::int64_t>(map.chunk_width(), map.cols() - std::int64_t(c) * map.chunk_width());
      for (std::int64_t k = 0; k < w; ++k) out[r * map.cols() + c * map.chunk_width() + k] = recv.at(src + k);
    }
  return out;
}

}  // namespace

TEST(TileOrder, IsABijectionForEveryRasterAndSwizzle) {
  for (int mt : {1, 2, 5, 9})
    for (int nt : {1, 3, 8})
      for (int s : {1, 2, 3, 4, 8})
        for (Raster r : {Raster::AlongN, Raster::AlongM}) {
          TileOrder o{mt, nt, s, r};
          std::vector<int> seen(mt * nt, 0);
          for (int b = 0; b < o.tiles(); ++b) {
            const TileCoord t = o.tile_at(b);
            ASSERT_TRUE(t.m >= 0 && t.m < mt && t.n >= 0 && t.n < nt) << mt << "x" << nt << " s=" << s << " b=" << b;
            ++seen[t.m * nt + t.n];
            ASSERT_EQ(o.index_of(t.m, t.n), b);
          }
          for (int k : seen) ASSERT_EQ(k, 1);
        }
}

TEST(TileOrder, SwizzleOneIsRowMajorAndPanelsWalkDownFirst) {
  TileOrder rm{3, 4, 1, Raster::AlongN};
  for (int b = 0; b < 12; ++b) EXPECT_EQ(rm.tile_at(b).m * 4 + rm.tile_at(b).n, b);
  TileOrder sw{4, 3, 2, Raster::AlongN};  // panel of 2 rows: (0,0),(1,0),(0,1),(1,1),...
  EXPECT_EQ(sw.tile_at(1).m, 1);
  EXPECT_EQ(sw.tile_at(1).n, 0);
  EXPECT_EQ(sw.tile_at(2).m, 0);
  EXPECT_EQ(sw.tile_at(2).n, 1);
  EXPECT_EQ(sw.tile_at(6).m, 2);
}

TEST(WaveModel, WavesAndGroups) {
  WaveModel wm(GemmTiling{1000, 520, 128, 64}, 7);  // 8 x 9 = 72 tiles
  EXPECT_EQ(wm.tiles(), 72);
  EXPECT_EQ(wm.waves(), 11);  // 10 full + 2 tiles
  EXPECT_EQ(wm.tiles_in_wave(10), 2);
  GroupPlan gp(wm, {2, 5, 4});
  EXPECT_EQ(gp.tile_starts(), (std::vector<int>{0, 14, 49, 72}));
  EXPECT_EQ(gp.tiles_in(2), 23);
  for (int b = 0; b < wm.tiles(); ++b) EXPECT_EQ(gp.group_of_tile(b), b < 14 ? 0 : (b < 49 ? 1 : 2));
  EXPECT_EQ(gp.counter_target(1, 3), 3u * 35u);
  EXPECT_THROW(gp.counter_target(1, 0), tessera::Error);
  EXPECT_THROW(gp.counter_target(0, std::uint64_t(1) << 32), tessera::Error);
  EXPECT_THROW(GroupPlan(wm, {2, 5}), tessera::Error);
  EXPECT_THROW(GroupPlan(wm, {0, 11}), tessera::Error);
  EXPECT_THROW(WaveModel(GemmTiling{0, 5, 128, 128}, 7), tessera::Error);
  EXPECT_THROW(WaveModel(GemmTiling{5, 5, 128, 128}, 0), tessera::Error);
  // Rescaled to a model with fewer SMs (more waves): same shape of partition.
  const WaveModel wm2 = wm.with_sms(3);  // 24 waves
  const GroupPlan r = gp.rescaled(wm2);
  EXPECT_EQ(r.waves(), 24);
  EXPECT_EQ(r.groups(), 3);
  EXPECT_EQ(GroupPlan::single(wm).rescaled(wm2).groups(), 1);
}

TEST(ArMap, BijectionRoundTripAndSimulatedAllReduce) {
  for (const Shape& s : kShapes) {
    const WaveModel wm(GemmTiling{s.m, s.n, s.bm, s.bn}, s.sms, s.swizzle, s.raster);
    const ArMap map = make_ar_map(wm);
    // Bijection: every valid element lands in one slot; element_at inverts.
    std::vector<int> hits(map.buffer_elems(), 0);
    for (std::int64_t i = 0; i < s.m; ++i)
      for (std::int64_t j = 0; j < s.n; ++j) {
        const std::int64_t o = map.offset(i, j);
        ASSERT_TRUE(o >= 0 && o < map.buffer_elems());
        ++hits[o];
        const Element e = map.element_at(o);
        ASSERT_TRUE(e.valid && e.i == i && e.j == j);
      }
    std::int64_t valid = 0;
    for (std::int64_t o = 0; o < map.buffer_elems(); ++o) {
      ASSERT_LE(hits[o], 1);
      ASSERT_EQ(hits[o] == 1, map.element_at(o).valid) << o;
      valid += hits[o];
    }
    ASSERT_EQ(valid, s.m * s.n);

    for (int R : {2, 4, 8})
      for (const GroupPlan& gp : partitions(wm)) {
        std::vector<std::vector<double>> in(R);
        std::vector<double> ref(s.m * s.n, 0.0);
        std::vector<std::vector<double>> buf(R, std::vector<double>(map.buffer_elems(), std::nan("")));
        for (int r = 0; r < R; ++r) {
          in[r] = random_matrix(s.m * s.n);
          for (std::int64_t i = 0; i < s.m; ++i)
            for (std::int64_t j = 0; j < s.n; ++j) {
              buf[r][map.offset(i, j)] = in[r][i * s.n + j];  // the epilogue's store
              ref[i * s.n + j] += in[r][i * s.n + j];
            }
        }
        // Round trip without communication.
        ASSERT_EQ(gather(map, buf[0]), in[0]);
        // One in-place AllReduce per group, on its span only, in random group order.
        std::vector<int> order(gp.groups());
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng());
        std::vector<double> sum(map.buffer_elems(), std::nan(""));
        for (int g : order)
          for (std::int64_t o = gp.tile_begin(g) * map.tile_elems();
               o < (gp.tile_begin(g) + gp.tiles_in(g)) * map.tile_elems(); ++o) {
            double acc = 0;
            for (int r = 0; r < R; ++r) acc += buf[r][o];
            sum[o] = acc;
          }
        ASSERT_EQ(gather(map, sum), ref) << "M=" << s.m << " N=" << s.n << " R=" << R << " groups " << gp.str();
      }
  }
}

TEST(RsMap, BijectionRoundTripAndSimulatedReduceScatter) {
  for (const Shape& s : kShapes)
    for (int R : {2, 4, 8}) {
      const WaveModel wm(GemmTiling{s.m, s.n, s.bm, s.bn}, s.sms, s.swizzle, s.raster);
      const RsMap map = make_rs_map(wm, R);
      for (const GroupPlan& gp : partitions(wm)) {
        const GroupSpans spans = gp.host_view();
        std::vector<int> hits(map.send_elems(), 0);
        for (std::int64_t i = 0; i < s.m; ++i)
          for (std::int64_t j = 0; j < s.n; ++j) {
            const std::int64_t o = map.send_offset(i, j, spans);
            ASSERT_TRUE(o >= 0 && o < map.send_elems());
            ++hits[o];
            const Element e = map.send_element_at(o, spans);
            ASSERT_TRUE(e.valid && e.i == i && e.j == j) << i << "," << j << " -> " << o << " -> " << e.i << "," << e.j;
          }
        for (std::int64_t o = 0; o < map.send_elems(); ++o) {
          ASSERT_LE(hits[o], 1);
          ASSERT_EQ(hits[o] == 1, map.send_element_at(o, spans).valid);
        }
        // Simulated reduce-scatter per group (random order) into per-rank receive buffers.
        std::vector<std::vector<double>> send(R, std::vector<double>(map.send_elems(), std::nan("")));
        std::vector<double> ref(s.m * s.n, 0.0);
        for (int r = 0; r < R; ++r) {
          const auto in = random_matrix(s.m * s.n);
          for (std::int64_t i = 0; i < s.m; ++i)
            for (std::int64_t j = 0; j < s.n; ++j) {
              send[r][map.send_offset(i, j, spans)] = in[i * s.n + j];
              ref[i * s.n + j] += in[i * s.n + j];
            }
        }
        std::vector<std::vector<double>> recv(R, std::vector<double>(map.recv_elems(), std::nan("")));
        std::vector<int> order(gp.groups());
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng());
        for (int g : order) {
          const std::int64_t count = gp.tiles_in(g) * map.sub_elems();  // recvcount
          const std::int64_t sbase = gp.tile_begin(g) * map.tile_elems();
          const std::int64_t rbase = gp.tile_begin(g) * map.sub_elems();
          for (int dst = 0; dst < R; ++dst)
            for (std::int64_t k = 0; k < count; ++k) {
              double acc = 0;
              for (int r = 0; r < R; ++r) acc += send[r][sbase + dst * count + k];
              recv[dst][rbase + k] = acc;
            }
        }
        // Every rank owns whole rows; together they own every row exactly once.
        std::vector<int> row_owner(s.m, -1);
        for (int r = 0; r < R; ++r) {
          const RsShard shard{map, r};
          const auto local = gather(shard, recv[r]);
          for (std::int64_t l = 0; l < shard.rows(); ++l) {
            const std::int64_t i = map.global_row(r, l);
            ASSERT_LT(i, s.m);
            ASSERT_EQ(map.owner(i), r);
            ASSERT_EQ(row_owner[i], -1);
            row_owner[i] = r;
            for (std::int64_t j = 0; j < s.n; ++j) {
              ASSERT_EQ(local[l * s.n + j], ref[i * s.n + j]) << "rank " << r << " row " << i << " col " << j;
              ASSERT_EQ(map.recv_offset(i, j), shard.chunk_offset(l, int(j / s.bn)) + j % s.bn);
            }
          }
        }
        for (std::int64_t i = 0; i < s.m; ++i) ASSERT_GE(row_owner[i], 0) << "row " << i << " owned by no rank";
      }
    }
  EXPECT_THROW(make_rs_map(WaveModel(GemmTiling{256, 256, 100, 128}, 4), 8), tessera::Error);
}

TEST(A2aPlan, PoolsAreBijectiveAndSimulatedAllToAllMatchesReference) {
  for (const Shape& s : kShapes)
    for (int R : {2, 4, 8}) {
      // Uneven, MoE-like: per-rank row counts differ, destinations skewed.
      std::vector<std::vector<int>> dest(R);
      std::vector<std::vector<int>> parts(R);
      std::vector<double> weight(R);
      for (int d = 0; d < R; ++d) weight[d] = 1.0 + 3.0 * d * d;  // rank R-1 gets most tokens
      std::discrete_distribution<int> pick(weight.begin(), weight.end());
      for (int q = 0; q < R; ++q) {
        const std::int64_t m = std::max<std::int64_t>(1, s.m - q * 37);
        dest[q].resize(m);
        for (auto& d : dest[q]) d = pick(rng());
      }
      // Same number of groups everywhere: the min wave count, random split per rank.
      int G = 1 << 30;
      for (int q = 0; q < R; ++q)
        G = std::min(G, WaveModel(GemmTiling{std::int64_t(dest[q].size()), s.n, s.bm, s.bn}, s.sms).waves());
      G = std::uniform_int_distribution<int>(1, G)(rng());
      for (int q = 0; q < R; ++q) {
        const int W = WaveModel(GemmTiling{std::int64_t(dest[q].size()), s.n, s.bm, s.bn}, s.sms).waves();
        parts[q] = GroupPlan::equal(WaveModel(GemmTiling{std::int64_t(dest[q].size()), s.n, s.bm, s.bn}, s.sms), G)
                       .waves_per_group();
        ASSERT_EQ(std::accumulate(parts[q].begin(), parts[q].end(), 0), W);
      }
      const A2aPlan plan(s.n, s.bm, s.bn, s.sms, s.swizzle, s.raster, dest, parts);
      std::vector<std::vector<double>> in(R), send(R);
      for (int q = 0; q < R; ++q) {
        const std::int64_t m = static_cast<std::int64_t>(dest[q].size());
        in[q] = random_matrix(m * s.n);
        send[q].assign(plan.send_elems(q), std::nan(""));
        std::vector<int> hits(plan.send_elems(q), 0);
        const A2aSendMap map = plan.send_map(q);
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < s.n; ++j) {
            const std::int64_t o = map.offset(i, j);
            ASSERT_TRUE(o >= 0 && o < plan.send_elems(q));
            ASSERT_EQ(hits[o]++, 0) << "rank " << q << " element " << i << "," << j << " collides";
            send[q][o] = in[q][i * s.n + j];
            // The element lies in its destination's span of its tile's group.
            const int b = plan.model(q).order().index_of(int(i / s.bm), int(j / s.bn));
            const int g = plan.plan(q).group_of_tile(b);
            const int d = dest[q][i];
            ASSERT_GE(o, plan.send_offset(q, g, d));
            ASSERT_LT(o, plan.send_offset(q, g, d) + plan.send_count(q, g, d));
          }
      }
      // Exchange, one grouped send/recv round per group, random group order.
      std::vector<std::vector<double>> recv(R);
      for (int r = 0; r < R; ++r) recv[r].assign(plan.recv_elems(r), std::nan(""));
      std::vector<int> order(plan.groups());
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng());
      for (int g : order)
        for (int q = 0; q < R; ++q)
          for (int d = 0; d < R; ++d)
            for (std::int64_t k = 0; k < plan.send_count(q, g, d); ++k)
              recv[d][plan.recv_offset(d, g, q) + k] = send[q][plan.send_offset(q, g, d) + k];
      // Un-reorder on every rank == the non-overlapped reference all-to-all.
      for (int r = 0; r < R; ++r) {
        std::vector<double> ref;
        for (int q = 0; q < R; ++q)
          for (std::size_t i = 0; i < dest[q].size(); ++i)
            if (dest[q][i] == r) ref.insert(ref.end(), in[q].begin() + i * s.n, in[q].begin() + (i + 1) * s.n);
        ASSERT_EQ(gather(plan.recv_map(r), recv[r]), ref) << "rank " << r << " R=" << R << " M=" << s.m;
      }
    }
}

TEST(A2aPlan, RejectsBadRouting) {
  EXPECT_THROW(A2aPlan(64, 64, 64, 4, 1, Raster::AlongN, {{0, 2}, {1, 1}}, {{1}, {1}}), tessera::Error);
  EXPECT_THROW(A2aPlan(64, 64, 64, 4, 1, Raster::AlongN, {{0, 1}, {}}, {{1}, {1}}), tessera::Error);
}

TEST(EpilogueTables, ReproduceTheMapsOffsets) {
  for (const Shape& s : kShapes) {
    const WaveModel wm(GemmTiling{s.m, s.n, s.bm, s.bn}, s.sms, s.swizzle, s.raster);
    const int Nt = wm.order().tiles_n;
    for (const GroupPlan& gp : partitions(wm)) {
      const auto off = [&](const EpilogueTables& t, std::int64_t i, std::int64_t j) {
        const int lin = int(i / s.bm) * Nt + int(j / s.bn);
        const std::int64_t li = i % s.bm, lj = j % s.bn, r = li / t.sub_rows;
        return t.tile_base[lin] + r * t.seg_stride[lin] + (li - r * t.sub_rows) * t.tile_n + lj;
      };
      const ArMap ar = make_ar_map(wm);
      const EpilogueTables ta = epilogue_tables(wm, gp, ar);
      const std::vector<int> groups = tile_groups(wm, gp);
      ASSERT_EQ(groups, ta.tile_group);
      for (int R : {2, 4, 8}) {
        const RsMap rs = make_rs_map(wm, R);
        const EpilogueTables tr = epilogue_tables(wm, gp, rs);
        for (std::int64_t i = 0; i < s.m; i += 3)
          for (std::int64_t j = 0; j < s.n; ++j) {
            ASSERT_EQ(off(ta, i, j), ar.offset(i, j));
            ASSERT_EQ(off(tr, i, j), rs.send_offset(i, j, gp.host_view()));
            const int b = wm.order().index_of(int(i / s.bm), int(j / s.bn));
            ASSERT_EQ(ta.tile_group[int(i / s.bm) * Nt + int(j / s.bn)], gp.group_of_tile(b));
          }
      }
    }
  }
}

// The un-reorder kernels read the maps through detail::fast_gather, with the
// divisions precomputed as kernels::engine::FastDivmod multiply-shifts (that
// type's arithmetic: GemmScheduler.FastDivmodMatchesDivision): every offset
// must equal the map's own chunk_offset.
TEST(FastGather, EqualsTheMapsChunkOffsets) {
  for (const Shape& s : kShapes)
    for (int swizzle : {1, 3, 8})
      for (Raster raster : {Raster::AlongN, Raster::AlongM}) {
        const WaveModel wm(GemmTiling{s.m, s.n, s.bm, s.bn}, s.sms, swizzle, raster);
        const ArMap ar = make_ar_map(wm);
        const auto far = tessera::signal::detail::fast_gather(ar);
        const int chunks = static_cast<int>((s.n + s.bn - 1) / s.bn);
        for (std::int64_t r = 0; r < s.m; ++r)
          for (int c = 0; c < chunks; ++c) ASSERT_EQ(far.chunk_offset(r, c), ar.chunk_offset(r, c)) << r << "," << c;
        for (int R : {2, 4, 8}) {
          if (s.bm % R) continue;
          const RsMap rs = make_rs_map(wm, R);
          for (int rank = 0; rank < R; ++rank) {
            const RsShard shard{rs, rank};
            const auto fs = tessera::signal::detail::fast_gather(shard);
            ASSERT_EQ(fs.rows(), shard.rows());
            for (std::int64_t l = 0; l < shard.rows(); ++l)
              for (int c = 0; c < chunks; ++c)
                ASSERT_EQ(fs.chunk_offset(l, c), shard.chunk_offset(l, c)) << l << "," << c;
          }
        }
      }
}

// The counter test is cuStreamWaitValue32(GEQ)'s cyclic comparison (so a
// 0xFFFFFFFF "always passes" sentinel never passes a memop wait).
TEST(CounterReached, CyclicLikeStreamMemopGeq) {
  using tessera::signal::counter_reached;
  EXPECT_TRUE(counter_reached(5, 5));
  EXPECT_TRUE(counter_reached(6, 5));
  EXPECT_FALSE(counter_reached(4, 5));
  EXPECT_FALSE(counter_reached(0xFFFFFFFFu, 5));  // -1 - 5 < 0: never satisfied
  EXPECT_TRUE(counter_reached(3, 0xFFFFFFF0u));   // wrapped past the target
  EXPECT_FALSE(counter_reached(0x80000005u, 5));  // 2^31 ahead reads as behind
}
