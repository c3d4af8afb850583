#include "tessera/signal/a2a.hpp"

#include "tessera/runtime/error.hpp"

namespace tessera::signal {

ArMap make_ar_map(const WaveModel& model) {
  const GemmTiling& t = model.tiling();
  return ArMap{model.order(), t.m, t.n, t.tile_m, t.tile_n};
}

RsMap make_rs_map(const WaveModel& model, int ranks) {
  const GemmTiling& t = model.tiling();
  TESSERA_CHECK(ranks > 0, "make_rs_map: rank count must be positive, got {}", ranks);
  TESSERA_CHECK(t.tile_m % ranks == 0,
                "make_rs_map: tile height {} is not divisible by {} ranks; sub-tiles must hold whole rows", t.tile_m,
                ranks);
  return RsMap{model.order(), t.m, t.n, t.tile_m, t.tile_n, ranks};
}

A2aPlan::A2aPlan(std::int64_t n, int bm, int bn, int sms, int swizzle, Raster raster,
                 std::vector<std::vector<int>> dest, const std::vector<std::vector<int>>& waves_per_group)
    : n_(n), bm_(bm), bn_(bn), dest_(std::move(dest)) {
  const int R = ranks();
  TESSERA_CHECK(R > 0, "A2aPlan: needs at least one rank");
  TESSERA_CHECK(waves_per_group.size() == dest_.size(), "A2aPlan: {} ranks of destinations but {} group partitions", R,
                waves_per_group.size());
  for (int q = 0; q < R; ++q) {
    const auto M = static_cast<std::int64_t>(dest_[q].size());
    TESSERA_CHECK(M > 0, "A2aPlan: rank {} has no rows; every rank needs >= 1 row", q);
    for (std::int64_t i = 0; i < M; ++i)
      TESSERA_CHECK(dest_[q][i] >= 0 && dest_[q][i] < R, "A2aPlan: rank {} row {} has destination {} outside [0, {})",
                    q, i, dest_[q][i], R);
    models_.emplace_back(GemmTiling{M, n, bm, bn}, sms, swizzle, raster);
    plans_.emplace_back(models_.back(), waves_per_group[q]);
    if (q == 0) groups_ = plans_.back().groups();
    TESSERA_CHECK(plans_.back().groups() == groups_,
                  "A2aPlan: rank {} has {} groups, rank 0 has {}; all ranks must "
                  "run the same number of grouped exchanges",
                  q, plans_.back().groups(), groups_);
  }
  const int G = groups_;
  const int Nt = models_[0].tiling().tiles_n();

  // Send side: row slots, per-tile pool offsets, pool bases, group spans.
  row_slot_.resize(R);
  tile_pool_off_.resize(R);
  pool_base_.resize(R);
  send_off_.resize(R);
  send_cnt_.resize(R);
  send_total_.resize(R);
  for (int q = 0; q < R; ++q) {
    const WaveModel& wm = models_[q];
    const int Mt = wm.tiling().tiles_m(), T = wm.tiles();
    std::vector<std::int64_t> count(std::size_t(Mt) * R, 0);  // rows per (tile row, dest)
    row_slot_[q].resize(dest_[q].size());
    for (std::size_t i = 0; i < dest_[q].size(); ++i)
      row_slot_[q][i] = static_cast<int>(count[(i / bm) * R + dest_[q][i]]++);
    std::vector<std::int64_t> fill(R, 0);
    tile_pool_off_[q].resize(std::size_t(T) * R);
    for (int b = 0; b < T; ++b) {
      const int tm = wm.order().tile_at(b).m;
      for (int d = 0; d < R; ++d) {
        tile_pool_off_[q][std::size_t(b) * R + d] = fill[d];
        fill[d] += count[std::size_t(tm) * R + d] * bn;
      }
    }
    pool_base_[q].resize(R);
    std::int64_t base = 0;
    for (int d = 0; d < R; ++d) {
      pool_base_[q][d] = base;
      base += fill[d];
    }
    send_total_[q] = base;
    send_off_[q].resize(std::size_t(G) * R);
    send_cnt_[q].resize(std::size_t(G) * R);
    const GroupPlan& gp = plans_[q];
    for (int g = 0; g < G; ++g)
      for (int d = 0; d < R; ++d) {
        const int s = gp.tile_begin(g), e = s + gp.tiles_in(g);
        const std::int64_t lo = tile_pool_off_[q][std::size_t(s) * R + d];
        const std::int64_t hi = e < T ? tile_pool_off_[q][std::size_t(e) * R + d] : fill[d];
        send_off_[q][std::size_t(g) * R + d] = pool_base_[q][d] + lo;
        send_cnt_[q][std::size_t(g) * R + d] = hi - lo;
      }
  }

  // Receive side: spans by (group, source), reference output rows, chunk table.
  recv_off_.resize(R);
  recv_total_.resize(R);
  out_src_.resize(R);
  chunk_src_.resize(R);
  for (int s = 0; s < R; ++s) {
    recv_off_[s].resize(std::size_t(G) * R);
    std::int64_t off = 0;
    for (int g = 0; g < G; ++g)
      for (int q = 0; q < R; ++q) {
        recv_off_[s][std::size_t(g) * R + q] = off;
        off += send_count(q, g, s);
      }
    recv_total_[s] = off;
    for (int q = 0; q < R; ++q)
      for (std::size_t i = 0; i < dest_[q].size(); ++i)
        if (dest_[q][i] == s) out_src_[s].push_back({q, static_cast<std::int64_t>(i)});
    chunk_src_[s].resize(out_src_[s].size() * Nt);
    for (std::size_t o = 0; o < out_src_[s].size(); ++o) {
      const auto [q, i] = out_src_[s][o];
      for (int c = 0; c < Nt; ++c) {
        const int b = models_[q].order().index_of(static_cast<int>(i / bm), c);
        const int g = plans_[q].group_of_tile(b);
        const std::int64_t pos =
            pool_base_[q][s] + tile_pool_off_[q][std::size_t(b) * R + s] + std::int64_t(row_slot_[q][i]) * bn;
        chunk_src_[s][o * Nt + c] = recv_off_[s][std::size_t(g) * R + q] + (pos - send_offset(q, g, s));
      }
    }
  }
}

A2aSendMap A2aPlan::send_map(int q) const {
  return A2aSendMap{
      models_.at(q).order(), bm_, bn_, ranks(), dest_[q].data(), row_slot_[q].data(), tile_pool_off_[q].data(),
      pool_base_[q].data()};
}

A2aRecvMap A2aPlan::recv_map(int s) const { return A2aRecvMap{out_rows(s), n_, bn_, chunk_src_.at(s).data()}; }

}  // namespace tessera::signal
