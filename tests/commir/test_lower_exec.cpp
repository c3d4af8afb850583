// Every named strategy lowers and its plan, run on the CPU executor, matches
// the un-parallelized loop nest on meshes 2, 4, 2x2 and 2x4, with regular and
// ragged shapes, MHA and GQA.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>

#include "tessera/commir/cpu_executor.hpp"
#include "tessera/commir/schedules.hpp"
#include "tessera/commir/text.hpp"
#include "tessera/commir/transforms.hpp"

using namespace tessera::commir;

namespace {

std::uint64_t fresh_seed() { return std::random_device{}(); }

void check(const Grid& op, const std::string& sched, const std::string& label) {
  SCOPED_TRACE(label + " schedule " + sched + " mesh " + mesh_string(op.mesh));
  Grid g = scheduled(op, sched);
  ASSERT_EQ(parse(print(g)), g);
  Plan p;
  try {
    p = lower(g);
  } catch (const std::exception& e) {
    FAIL() << label << " " << sched << " on " << mesh_string(op.mesh) << ": " << e.what() << "\n" << print(g);
  }
  const auto seed = fresh_seed();
  const Tensors in = random_inputs(g, seed);
  const Tensors ref = reference(g, in);
  CpuRun run;
  try {
    run = run_cpu(p, in, ref);
  } catch (const std::exception& e) {
    FAIL() << label << " " << sched << " on " << mesh_string(op.mesh) << ": " << e.what() << "\n" << describe(p, 30);
  }
  EXPECT_LT(run.max_rel_error, 1e-12) << "seed " << seed << "\n" << describe(p, 12);
  EXPECT_GT(run.checked_elements, 0);
  for (std::size_t r = 0; r < run.peak_bytes.size(); ++r)
    EXPECT_LE(run.peak_bytes[r], p.ranks[r].peak_bytes) << "rank " << r << " measured peak above the static footprint";
}

struct Shape {
  std::int64_t a, b, c;
};

}  // namespace

TEST(CommirExec, GemmStrategiesAllMeshes) {
  const std::vector<std::vector<int>> meshes{{2}, {4}, {2, 2}, {2, 4}};
  // Regular and ragged (extents not divisible by the mesh) shapes.
  const std::vector<Shape> shapes{{16, 16, 16}, {13, 10, 11}, {9, 17, 8}};
  for (const auto& mesh : meshes)
    for (const auto& s : shapes)
      for (const auto& name : schedule_names("gemm", static_cast<int>(mesh.size())))
        check(make_gemm(s.a, s.b, s.c, mesh, tessera::DType::f32), name,
              fmt::format("gemm {}x{}x{}", s.a, s.b, s.c));
}

TEST(CommirExec, AttentionStrategiesAllMeshes) {
  const std::vector<std::vector<int>> meshes{{2}, {4}, {2, 2}, {2, 4}};
  struct A {
    std::int64_t b, h, hkv, q, kv, d;
  };
  // MHA and GQA, regular and ragged sequence lengths.
  const std::vector<A> shapes{{1, 8, 8, 16, 16, 4}, {2, 8, 2, 11, 13, 3}, {1, 8, 4, 9, 10, 2}};
  for (const auto& mesh : meshes)
    for (const auto& s : shapes)
      for (const auto& name : schedule_names("attention", static_cast<int>(mesh.size())))
        check(make_attention(s.b, s.h, s.hkv, s.q, s.kv, s.d, mesh, tessera::DType::f32), name,
              fmt::format("attention b{} h{} hkv{} q{} kv{} d{}", s.b, s.h, s.hkv, s.q, s.kv, s.d));
}
