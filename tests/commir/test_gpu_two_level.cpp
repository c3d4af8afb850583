// GPU executor, attention on two-level meshes: every
// schedule `tessera plan attention` names for a 2-D mesh (cp, cp_ag, ring =
// two_level, ulysses, tree, tree_rs over both levels, and usp: Ulysses inside
// level 1, the K/V ring across level 0) on every 2-D factorization of the
// launched world — at R = 2 the degenerate 1x2 and 2x1, at R = 4 2x2, 1x4 and
// 4x1 — and the schedules `tessera plan attention` lists for the default 2-D
// mesh of the world (its top 8 and its Pareto front; every ranked candidate
// simulates exactly in commir_gpu_program). The per-level transfers are NCCL
// point-to-point groups among the ranks that share the other coordinate,
// over the world communicator. Shapes, data and bound as
// commir_gpu_executor's attention tests: fresh bf16-rounded inputs, non-input
// blocks poisoned before each of 4 runs, this rank's O against the CPU
// executor's result (which equals the float64 reference to 1e-12), relative
// L2 error < 1e-2.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>

#include "commir/attention_gpu_check.hpp"
#include "support/test_support.hpp"
#include "tessera/commir/schedules.hpp"
#include "tessera/commir/tuner.hpp"

using namespace tessera::commir;
using namespace tessera::commir::gpu_check;

namespace {

// Every a x b = world, a the outer level.
std::vector<std::vector<int>> two_level_meshes(int world) {
  std::vector<std::vector<int>> m;
  for (int a = 1; a <= world; ++a)
    if (world % a == 0) m.push_back({a, world / a});
  return m;
}

// The mesh `tessera bench commir --attention` picks for the world: the
// smallest outer level of at least 2 that leaves an inner level of at least
// 2, else 1 x world.
std::vector<int> default_mesh(int world) {
  for (int a = 2; a * 2 <= world; ++a)
    if (world % a == 0) return {a, world / a};
  return {1, world};
}

}  // namespace

TEST(CommirGpu, TwoLevelAttentionPlans) {
  const int world = tessera::testing::launched_world_size();
  TESSERA_REQUIRE_GPUS(2);
  if (world < 2) GTEST_SKIP() << "start with tessera run -n 2 (one process per GPU)";
  auto pg = tessera::runtime::ProcessGroup::from_environment();
  for (const AttnShape sh : {AttnShape{2, 8, 2, 256, 64}, AttnShape{1, 8, 8, 384, 128}})
    for (const auto& mesh : two_level_meshes(pg->world())) {
      const Grid op = make_attention(sh.b, sh.h, sh.hkv, sh.s, sh.s, sh.d, mesh);
      const AttnData d = attn_data(*pg, op);
      for (const std::string& name : schedule_names("attention", 2)) {
        const std::string label = fmt::format("{} on {}", name, mesh_string(mesh));
        SCOPED_TRACE(fmt::format("{} b{} h{} hkv{} s{} d{}", label, sh.b, sh.h, sh.hkv, sh.s, sh.d));
        const Plan plan = lower(scheduled(op, name));
        ASSERT_LT(run_cpu(plan, d.in, d.ref).max_rel_error, 1e-12);  // the CPU executor's result is the reference
        run_attention_plan(*pg, plan, label, sh, d);
      }
    }
}

// What `tessera plan attention --mesh AxB` lists for the default 2-D mesh:
// the 8 fastest predicted schedules and the Pareto front (time vs memory).
TEST(CommirGpu, TunerTwoLevelAttentionCandidates) {
  const int world = tessera::testing::launched_world_size();
  TESSERA_REQUIRE_GPUS(2);
  if (world < 2) GTEST_SKIP() << "start with tessera run -n 2 (one process per GPU)";
  auto pg = tessera::runtime::ProcessGroup::from_environment();
  const AttnShape sh{1, 8, 2, 256, 64};
  const std::vector<int> mesh = default_mesh(pg->world());
  const Grid op = make_attention(sh.b, sh.h, sh.hkv, sh.s, sh.s, sh.d, mesh);
  const AttnData d = attn_data(*pg, op);
  const TuneResult res = tune(op, builtin_profile("h100"));  // deterministic: the same list on every rank
  ASSERT_GT(res.ranked.size(), 0u);
  std::vector<const Candidate*> listed;
  std::set<std::string> seen;
  for (std::size_t i = 0; i < res.ranked.size() && i < 8; ++i)
    if (seen.insert(res.ranked[i].script).second) listed.push_back(&res.ranked[i]);
  for (const Candidate& c : res.pareto)
    if (seen.insert(c.script).second) listed.push_back(&c);
  for (const Candidate* c : listed) {
    const std::string label = fmt::format("{} on {}", c->script, mesh_string(mesh));
    SCOPED_TRACE(label);
    const Plan plan = lower(c->grid);
    ASSERT_LT(run_cpu(plan, d.in, d.ref).max_rel_error, 1e-12);
    run_attention_plan(*pg, plan, label, sh, d);
  }
}
