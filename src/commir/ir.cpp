// CommIR grid lookups and the canonical operators.
#include "tessera/commir/ir.hpp"

#include <algorithm>
#include <sstream>

#include "tessera/runtime/error.hpp"

namespace tessera::commir {

bool Buffer::indexed_by(const std::string& a) const {
  return std::any_of(dims.begin(), dims.end(), [&](const Dim& d) { return d.axis == a; });
}

const Axis* Grid::find_axis(const std::string& n) const {
  for (const auto& a : axes)
    if (a.name == n) return &a;
  return nullptr;
}
const Buffer* Grid::find_buffer(const std::string& n) const {
  for (const auto& b : buffers)
    if (b.name == n) return &b;
  return nullptr;
}
Loop* Grid::find_loop(const std::string& n) {
  for (auto& l : loops)
    if (l.name == n) return &l;
  return nullptr;
}
const Loop* Grid::find_loop(const std::string& n) const {
  for (const auto& l : loops)
    if (l.name == n) return &l;
  return nullptr;
}
int Grid::loop_index(const std::string& n) const {
  for (std::size_t i = 0; i < loops.size(); ++i)
    if (loops[i].name == n) return static_cast<int>(i);
  return -1;
}
const Axis& Grid::axis(const std::string& n, const char* what) const {
  const Axis* a = find_axis(n);
  TESSERA_CHECK(a, "{}: grid '{}' has no axis '{}'", what, name, n);
  return *a;
}
const Buffer& Grid::buffer(const std::string& n, const char* what) const {
  const Buffer* b = find_buffer(n);
  TESSERA_CHECK(b, "{}: grid '{}' has no buffer '{}'", what, name, n);
  return *b;
}
const Loop& Grid::loop(const std::string& n, const char* what) const {
  const Loop* l = find_loop(n);
  TESSERA_CHECK(l, "{}: grid '{}' has no loop '{}'", what, name, n);
  return *l;
}
std::int64_t Grid::loop_extent(const Loop& l) const {
  std::int64_t e = 1;
  for (const auto& f : l.factors) e *= factor_extent(f);
  return e;
}
const Loop* Grid::parallel_loop(int level) const {
  for (const auto& l : loops)
    if (l.mesh_level == level) return &l;
  return nullptr;
}
const Placement* Grid::placement(const std::string& b, const std::string& l) const {
  for (const auto& p : placements)
    if (p.buffer == b && p.loop == l) return &p;
  return nullptr;
}
bool Grid::loop_indexes(const Loop& l, const Buffer& b) const {
  return std::any_of(l.factors.begin(), l.factors.end(), [&](const Factor& f) { return b.indexed_by(f.axis); });
}
std::int64_t Grid::min_cell(const std::string& a) const {
  std::int64_t size = axis(a).extent;
  auto it = tiling.find(a);
  if (it != tiling.end())
    for (std::int64_t n : it->second) size /= n;  // floor(len/n) is the smallest balanced part
  return size;
}
int Grid::world() const {
  int w = 1;
  for (int m : mesh) w *= m;
  return w;
}

Grid make_gemm(std::int64_t m, std::int64_t n, std::int64_t k, std::vector<int> mesh, DType dt) {
  TESSERA_CHECK(m > 0 && n > 0 && k > 0, "make_gemm: extents must be positive, got m={} n={} k={}", m, n, k);
  Grid g;
  g.name = "gemm";
  g.dtype = dt;
  g.mesh = std::move(mesh);
  g.axes = {{"m", m, AxisKind::spatial}, {"n", n, AxisKind::spatial}, {"k", k, AxisKind::reduction}};
  g.buffers = {{"A", {{"m"}, {"k"}}, 1, Access::read},
               {"B", {{"k"}, {"n"}}, 1, Access::read},
               {"C", {{"m"}, {"n"}}, 1, Access::write}};
  g.body = {BodyKind::contract, "C", {"A", "B"}};
  return g;
}

Grid make_attention(std::int64_t batch, std::int64_t heads, std::int64_t kv_heads, std::int64_t q_len,
                    std::int64_t kv_len, std::int64_t head_dim, std::vector<int> mesh, DType dt) {
  TESSERA_CHECK(batch > 0 && heads > 0 && kv_heads > 0 && q_len > 0 && kv_len > 0 && head_dim > 0,
                "make_attention: extents must be positive");
  TESSERA_CHECK(heads % kv_heads == 0, "make_attention: heads ({}) must be a multiple of kv_heads ({})", heads,
                kv_heads);
  Grid g;
  g.name = "attention";
  g.dtype = dt;
  g.mesh = std::move(mesh);
  g.axes = {{"b", batch, AxisKind::spatial},
            {"h", heads, AxisKind::spatial},
            {"q", q_len, AxisKind::spatial},
            {"kv", kv_len, AxisKind::reduction}};
  const std::int64_t grp = heads / kv_heads;
  g.buffers = {{"Q", {{"b"}, {"h"}, {"q"}}, head_dim, Access::read},
               {"K", {{"b"}, {"h", grp}, {"kv"}}, head_dim, Access::read},
               {"V", {{"b"}, {"h", grp}, {"kv"}}, head_dim, Access::read},
               {"O", {{"b"}, {"h"}, {"q"}}, head_dim, Access::write}};
  g.body = {BodyKind::attend, "O", {"Q", "K", "V"}};
  return g;
}

std::vector<int> parse_mesh(const std::string& text) {
  std::vector<int> mesh;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, 'x')) {
    TESSERA_CHECK(!item.empty() && item.find_first_not_of("0123456789") == std::string::npos,
                  "mesh '{}': expected sizes separated by 'x', e.g. 2x4", text);
    const int v = std::stoi(item);
    TESSERA_CHECK(v >= 1 && v <= 4096, "mesh '{}': level size {} out of range", text, v);
    mesh.push_back(v);
  }
  TESSERA_CHECK(!mesh.empty(), "mesh '{}': empty", text);
  return mesh;
}

std::string mesh_string(const std::vector<int>& mesh) {
  std::string s;
  for (std::size_t i = 0; i < mesh.size(); ++i) s += (i ? "x" : "") + std::to_string(mesh[i]);
  return s;
}

}  // namespace tessera::commir
