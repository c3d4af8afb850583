// AG+GEMM decomposition: per-shard cuBLASLt GEMMs on the compute stream,
// each after its shard's flag, while the comm stream pushes my shard to every
// peer on the copy engine (one channel per source). With a packed A my rows'
// GEMM and the pushes read A itself, so no copy-in precedes them.
#include "ag_gemm.hpp"
#include "tessera/link/host_primitives.hpp"

namespace tessera::ops::ag {

namespace {

void run(TpContext::Impl& c, const AgGemmArgs& a, const OpOptions&) {
  Call k = begin(c, a, 1);
  k.epoch = ++c.ag_epoch;
  const bool from_input = k.lda == a.k;
  stage_shard(k, from_input);
  const unsigned char* my_src = from_input ? static_cast<const unsigned char*>(a.a) : k.my_rows();
  fork_comm(k);
  push_copy_engine(k, my_src);
  for (int src : k.plan.recv_from) {
    const std::int64_t rlo = k.plan.shards.lo(src), rows = k.plan.shards.rows(a.m, src);
    if (src != k.rank) link::rank_wait(k.st, *c.ag_flags, src, 0, k.epoch);
    local_gemm(a, src == k.rank ? my_src : k.ws + rlo * k.row_bytes, rows,
               static_cast<unsigned char*>(a.d) + rlo * k.ldd * k.es,
               k.tmp ? static_cast<unsigned char*>(k.tmp) + rlo * swiglu_tmp_ld(a.n) * k.es : nullptr, k.st);
  }
  finish(k, {.from_input = from_input, .join_comm = true, .notify = true});
}

}  // namespace

const TpStrategy<AgGemmArgs> decomposition{.strategy = Strategy::decomposition, .needs = {.lsa = true}, .launch = &run};

}  // namespace tessera::ops::ag
