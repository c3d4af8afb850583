// Named strategies as CommIR schedule scripts.
#include "tessera/commir/schedules.hpp"

#include <fmt/format.h>

#include "tessera/commir/transforms.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::commir {

std::vector<std::string> schedule_names(const std::string& op, int levels) {
  if (op == "gemm") return {"ag_gemm", "gemm_rs", "gemm_ar", "async_ag_gemm", "async_gemm_rs", "bcast_gemm"};
  if (op == "attention") {
    std::vector<std::string> v{"cp", "cp_ag", "ring", "ulysses", "tree", "tree_rs"};
    if (levels == 2) {
      v.push_back("usp");
      v.push_back("two_level");
    }
    return v;
  }
  TESSERA_FAIL("schedules: unknown operator '{}' (gemm, attention)", op);
}

std::string schedule_script(const std::string& name, const std::vector<int>& mesh) {
  TESSERA_CHECK(mesh.size() == 1 || mesh.size() == 2, "schedule {}: meshes of 1 or 2 levels are supported, got {}",
                name, mesh_string(mesh));
  const bool two = mesh.size() == 2;
  const int p = mesh.back(), p0 = mesh[0];
  // Outer level of a two-level mesh for GEMM: split m.
  const std::string outer = two ? fmt::format("tile(m,{}) parallelize(m0,0) ", p0) : "";
  const int lv = two ? 1 : 0;
  const std::string mt = two ? "m1" : "m0";
  if (name == "ag_gemm") return outer + fmt::format("tile(n,{}) parallelize(n0,{}) shard(A,n0,m) patch(gemm)", p, lv);
  if (name == "gemm_rs") return outer + fmt::format("tile(k,{}) parallelize(k0,{}) shard(C,k0,m) patch(gemm)", p, lv);
  if (name == "gemm_ar") return outer + fmt::format("tile(k,{}) parallelize(k0,{}) patch(gemm)", p, lv);
  if (name == "async_ag_gemm")
    return outer + fmt::format("tile(n,{}) parallelize(n0,{}) tile(m,{}) shift({},n0) patch(gemm)", p, lv, p, mt);
  if (name == "async_gemm_rs")
    return outer + fmt::format("tile(k,{}) parallelize(k0,{}) tile(m,{}) shift({},k0) patch(gemm)", p, lv, p, mt);
  if (name == "bcast_gemm")
    return outer + fmt::format("tile(n,{}) parallelize(n0,{}) tile(m,{}) shard(A,n0,{}) patch(gemm)", p, lv, p, mt);
  // Attention.
  if (name == "cp")
    return two ? fmt::format("tile(q,{}) tile(q,{}) parallelize(q0,0) parallelize(q1,1) patch(attention)", p0, p)
               : fmt::format("tile(q,{}) parallelize(q0,0) patch(attention)", p);
  if (name == "cp_ag")
    return schedule_script("cp", mesh) +
           (two ? " shard(K,q0,kv) shard(V,q0,kv) shard(K,q1,kv) shard(V,q1,kv)" : " shard(K,q0,kv) shard(V,q0,kv)");
  if (name == "ring" || name == "two_level")
    return two ? fmt::format(
                     "tile(q,{}) tile(q,{}) parallelize(q0,0) parallelize(q1,1) tile(kv,{}) tile(kv,{}) "
                     "shift(kv0,q0) shift(kv1,q1) patch(attention)",
                     p0, p, p0, p)
               : fmt::format("tile(q,{}) parallelize(q0,0) tile(kv,{}) shift(kv0,q0) patch(attention)", p, p);
  if (name == "ulysses") {
    auto a2a = [](const std::string& h) {
      return fmt::format(" shard(Q,{0},q) shard(K,{0},kv) shard(V,{0},kv) shard(O,{0},q)", h);
    };
    return two ? fmt::format("tile(h,{}) tile(h,{}) parallelize(h0,0) parallelize(h1,1) patch(attention)", p0, p) +
                     a2a("h0") + a2a("h1")
               : fmt::format("tile(h,{}) parallelize(h0,0) patch(attention)", p) + a2a("h0");
  }
  if (name == "usp") {
    TESSERA_CHECK(two, "schedule usp: needs a two-level mesh (ring across level 0, Ulysses inside level 1)");
    return fmt::format(
        "tile(q,{0}) parallelize(q0,0) tile(h,{1}) parallelize(h0,1) tile(kv,{0}) shift(kv0,q0) "
        "shard(Q,h0,q) shard(K,h0,kv) shard(V,h0,kv) shard(O,h0,q) patch(attention)",
        p0, p);
  }
  if (name == "tree")
    return two ? fmt::format("tile(kv,{}) tile(kv,{}) parallelize(kv0,0) parallelize(kv1,1) patch(attention)", p0, p)
               : fmt::format("tile(kv,{}) parallelize(kv0,0) patch(attention)", p);
  if (name == "tree_rs")
    return schedule_script("tree", mesh) + (two ? " shard(O,kv0,h) shard(O,kv1,h)" : " shard(O,kv0,h)");
  TESSERA_FAIL("schedule: unknown schedule '{}'", name);
}

Grid scheduled(Grid g, const std::string& name) {
  commir::apply(g, schedule_script(name, g.mesh));
  return g;
}

}  // namespace tessera::commir
