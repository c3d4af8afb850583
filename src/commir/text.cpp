// Printer and parser of the CommIR textual form (see text.hpp).
#include "tessera/commir/text.hpp"

#include <fmt/format.h>

#include <charconv>
#include <set>
#include <sstream>

#include "tessera/runtime/error.hpp"

namespace tessera::commir {
namespace {

std::string dim_text(const Dim& d) { return d.group > 1 ? fmt::format("{}/{}", d.axis, d.group) : d.axis; }

// Splits a line into tokens: identifiers/numbers and the punctuation [ ] , = : ( ) * + / #.
std::vector<std::string> tokens(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) out.push_back(cur);
    cur.clear();
  };
  for (char c : line) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-') {
      cur += c;
    } else {
      flush();
      if (!std::isspace(static_cast<unsigned char>(c))) out.push_back(std::string(1, c));
    }
  }
  flush();
  return out;
}

DType parse_dtype(const std::string& s, int line) {
  if (s == "bf16") return DType::bf16;
  if (s == "f16") return DType::f16;
  if (s == "f32") return DType::f32;
  TESSERA_FAIL("parse: line {}: unknown dtype '{}' (bf16, f16, f32)", line, s);
}

}  // namespace

std::string print(const Grid& g) {
  std::string s = fmt::format("grid {} {{\n", g.name);
  if (!g.mesh.empty()) s += fmt::format("  mesh {}\n", mesh_string(g.mesh));
  s += fmt::format("  dtype {}\n", dtype_name(g.dtype));
  for (const auto& a : g.axes)
    s += fmt::format("  axis {} = {} {}\n", a.name, a.extent, a.kind == AxisKind::spatial ? "spatial" : "reduction");
  for (const auto& b : g.buffers) {
    std::string dims;
    for (std::size_t i = 0; i < b.dims.size(); ++i) dims += (i ? ", " : "") + dim_text(b.dims[i]);
    s += fmt::format("  buffer {}[{}] : {} {}\n", b.name, dims, b.elem, b.access == Access::read ? "read" : "write");
  }
  const Body& body = g.body;
  if (body.kind == BodyKind::contract && body.ins.size() == 2) {
    s += fmt::format("  body {} += {} * {}\n", body.out, body.ins[0], body.ins[1]);
  } else if (body.kind == BodyKind::attend && body.ins.size() == 3) {
    s += fmt::format("  body {} = attend({}, {}, {})\n", body.out, body.ins[0], body.ins[1], body.ins[2]);
  } else if (body.kind == BodyKind::add) {
    std::string rhs;
    for (std::size_t i = 0; i < body.ins.size(); ++i) rhs += (i ? " + " : "") + body.ins[i];
    s += fmt::format("  body {} = {}\n", body.out, rhs);
  }
  if (!g.kernel.empty()) s += fmt::format("  kernel {}\n", g.kernel);
  for (const auto& [axis, ns] : g.tiling) {
    s += fmt::format("  tile {}", axis);
    for (auto n : ns) s += fmt::format(" {}", n);
    s += "\n";
  }
  for (const auto& l : g.loops) {
    s += fmt::format("  loop {} =", l.name);
    for (std::size_t i = 0; i < l.factors.size(); ++i)
      s += fmt::format("{} {}#{}", i ? " *" : "", l.factors[i].axis, l.factors[i].level);
    if (l.parallel()) s += fmt::format(" parallel {}", l.mesh_level);
    if (!l.shift_by.empty()) s += fmt::format(" shift {}", l.shift_by);
    s += "\n";
  }
  for (const auto& p : g.placements) {
    if (p.kind == PlacementKind::replicate)
      s += fmt::format("  replicate {} {}\n", p.buffer, p.loop);
    else
      s += fmt::format("  shard {} {} along {} {}\n", p.buffer, p.loop, p.along, p.along_is_loop ? "loop" : "axis");
  }
  return s + "}\n";
}

namespace {

// Drops a comment: '#' inside "axis#level" is part of a factor; a comment
// starts with "# " or at column 0 / after spaces.
void strip_comment(std::string& raw) {
  const auto h = raw.find('#');
  if (h == std::string::npos) return;
  const auto first = raw.find_first_not_of(" \t");
  if (first == h)
    raw.clear();
  else if (auto c = raw.find(" #"); c != std::string::npos && (c + 2 >= raw.size() || raw[c + 2] == ' '))
    raw.resize(c);
}

// One statement of a CommIR text: its tokens and the checks that name its
// line; the statements with a structure of their own parse here.
struct Statement {
  const std::vector<std::string>& t;
  const std::string& raw;
  int line;

  void expect(bool ok, const char* what) const {
    TESSERA_CHECK(ok, "parse: line {}: expected {} in '{}'", line, what,
                  raw.size() > 120 ? raw.substr(0, 120) + "..." : raw);
  }
  std::int64_t num(const std::string& s) const {
    expect(!s.empty() && s.find_first_not_of("0123456789") == std::string::npos, "a non-negative integer");
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    TESSERA_CHECK(ec == std::errc() && end == s.data() + s.size() && v <= kMaxExtent,
                  "parse: line {}: number {} is too large (at most 2^40)", line, s.substr(0, 40));
    return v;
  }

  // buffer NAME [ axis[/group], ... ] : ELEM read|write
  Buffer buffer() const {
    expect(t.size() >= 7 && t[2] == "[", "'buffer NAME[dims] : ELEM read|write'");
    Buffer b;
    b.name = t[1];
    std::size_t i = 3;
    while (i < t.size() && t[i] != "]") {
      Dim d{t[i], 1};
      ++i;
      if (i < t.size() && t[i] == "/") {
        expect(i + 1 < t.size(), "a group size after '/'");
        d.group = num(t[i + 1]);
        i += 2;
      }
      b.dims.push_back(d);
      expect(b.dims.size() <= static_cast<std::size_t>(kMaxDims), "at most 8 dimensions");
      if (i < t.size() && t[i] == ",") ++i;
    }
    expect(i + 4 == t.size() && t[i] == "]" && t[i + 1] == ":", "'] : ELEM read|write' to end the buffer");
    b.elem = num(t[i + 2]);
    expect(t[i + 3] == "read" || t[i + 3] == "write", "read or write");
    b.access = t[i + 3] == "read" ? Access::read : Access::write;
    return b;
  }

  // body C += A * B | body O = attend(Q, K, V) | body Y = X1 + X2 ...
  Body body() const {  // t.size() >= 4, checked by the caller
    Body b;
    b.out = t[1];
    if (t[2] == "+" && t[3] == "=") {
      expect(t.size() == 7 && t[5] == "*", "'body C += A * B'");
      b.kind = BodyKind::contract;
      b.ins = {t[4], t[6]};
    } else if (t[2] == "=" && t[3] == "attend") {
      expect(t.size() == 11 && t[4] == "(" && t[6] == "," && t[8] == "," && t[10] == ")", "'body O = attend(Q, K, V)'");
      b.kind = BodyKind::attend;
      b.ins = {t[5], t[7], t[9]};
    } else {
      expect(t[2] == "=", "'=' or '+='");
      b.kind = BodyKind::add;
      expect(t.size() % 2 == 0, "'body Y = X1 + X2 ...' (a summand after every '+')");
      for (std::size_t i = 3; i < t.size(); i += 2) {
        b.ins.push_back(t[i]);
        expect(i + 1 == t.size() || t[i + 1] == "+", "'+' between summands");
      }
    }
    return b;
  }

  // loop NAME = axis#level [* ...] [parallel L] [shift P]
  Loop loop() const {
    expect(t.size() >= 6 && t[2] == "=", "'loop NAME = axis#level [* ...] [parallel L] [shift P]'");
    Loop l;
    l.name = t[1];
    std::size_t i = 3;
    while (i + 2 < t.size() && t[i + 1] == "#") {
      const std::int64_t level = num(t[i + 2]);
      expect(level < kMaxTileLevels, "a tiling level below 16");
      l.factors.push_back({t[i], static_cast<int>(level)});
      expect(l.factors.size() <= static_cast<std::size_t>(kMaxAxes * kMaxTileLevels), "fewer factors");
      i += 3;
      if (i < t.size() && t[i] == "*")
        ++i;
      else
        break;
    }
    expect(!l.factors.empty(), "a factor axis#level");
    while (i < t.size()) {
      expect(i + 1 < t.size() && (t[i] == "parallel" || t[i] == "shift"), "'parallel L' or 'shift P'");
      if (t[i] == "parallel") {
        expect(!l.parallel(), "one 'parallel L'");
        const std::int64_t level = num(t[i + 1]);
        expect(level < kMaxMeshLevels, "a mesh level below 8");
        l.mesh_level = static_cast<int>(level);
      } else {
        expect(l.shift_by.empty(), "one 'shift P'");
        l.shift_by = t[i + 1];
      }
      i += 2;
    }
    return l;
  }
};

}  // namespace

Grid parse(const std::string& text) {
  TESSERA_CHECK(text.size() <= kMaxTextBytes, "parse: the text has {} bytes (at most {})", text.size(), kMaxTextBytes);
  TESSERA_CHECK(text.find('\0') == std::string::npos, "parse: the text contains a NUL byte (not a CommIR text file?)");
  Grid g;
  std::set<std::string> seen;  // statements allowed once: mesh, dtype, body, kernel, tile <axis>
  std::istringstream in(text);
  std::string raw;
  int line = 0;
  bool open = false, closed = false;
  while (std::getline(in, raw)) {
    ++line;
    strip_comment(raw);
    const auto t = tokens(raw);
    if (t.empty()) continue;
    const Statement st{t, raw, line};
    const auto expect = [&](bool ok, const char* what) { st.expect(ok, what); };
    const auto num = [&](const std::string& v) { return st.num(v); };
    auto once = [&](const std::string& what) {
      TESSERA_CHECK(seen.insert(what).second, "parse: line {}: a second '{}' statement", line, what);
    };
    const std::string& kw = t[0];
    if (!open) {
      expect(kw == "grid" && t.size() == 3 && t[2] == "{", "'grid NAME {'");
      g.name = t[1];
      open = true;
      continue;
    }
    expect(!closed, "nothing after the closing '}'");
    if (kw == "}") {
      closed = true;
    } else if (kw == "mesh") {
      expect(t.size() == 2, "'mesh AxB'");
      once("mesh");
      g.mesh = parse_mesh(t[1]);
    } else if (kw == "dtype") {
      expect(t.size() == 2, "'dtype T'");
      once("dtype");
      g.dtype = parse_dtype(t[1], line);
    } else if (kw == "axis") {
      expect(t.size() == 5 && t[2] == "=" && (t[4] == "spatial" || t[4] == "reduction"),
             "'axis NAME = N spatial|reduction'");
      expect(g.axes.size() < static_cast<std::size_t>(kMaxAxes), "at most 16 axes");
      g.axes.push_back({t[1], num(t[3]), t[4] == "spatial" ? AxisKind::spatial : AxisKind::reduction});
    } else if (kw == "buffer") {
      Buffer b = st.buffer();
      expect(g.buffers.size() < static_cast<std::size_t>(kMaxBuffers), "at most 16 buffers");
      g.buffers.push_back(std::move(b));
    } else if (kw == "body") {
      expect(t.size() >= 4, "a body");
      once("body");
      g.body = st.body();
    } else if (kw == "kernel") {
      expect(t.size() == 2, "'kernel NAME'");
      once("kernel");
      g.kernel = t[1];
    } else if (kw == "tile") {
      expect(t.size() >= 3, "'tile AXIS N...'");
      once("tile " + t[1]);
      expect(t.size() - 2 <= static_cast<std::size_t>(kMaxTileLevels), "at most 16 tiling levels");
      for (std::size_t i = 2; i < t.size(); ++i) g.tiling[t[1]].push_back(num(t[i]));
    } else if (kw == "loop") {
      Loop l = st.loop();
      expect(g.loops.size() < static_cast<std::size_t>(kMaxLoops), "at most 64 loops");
      g.loops.push_back(std::move(l));
    } else if (kw == "shard") {
      expect(t.size() == 6 && t[3] == "along" && (t[5] == "loop" || t[5] == "axis"),
             "'shard BUF LOOP along X loop|axis'");
      expect(g.placements.size() < static_cast<std::size_t>(kMaxPlacements), "at most 256 placements");
      g.placements.push_back({t[1], t[2], PlacementKind::shard, t[4], t[5] == "loop"});
    } else if (kw == "replicate") {
      expect(t.size() == 3, "'replicate BUF LOOP'");
      expect(g.placements.size() < static_cast<std::size_t>(kMaxPlacements), "at most 256 placements");
      g.placements.push_back({t[1], t[2], PlacementKind::replicate, "", false});
    } else {
      TESSERA_FAIL("parse: line {}: unknown statement '{}'", line, kw);
    }
  }
  TESSERA_CHECK(open, "parse: missing 'grid NAME {{' ... '}}' (empty text)");
  TESSERA_CHECK(closed, "parse: missing the closing '}}' (truncated text?)");
  // Consistency (tiling covered once by the loops, names, sizes, placements).
  validate(g, "parse");
  return g;
}

}  // namespace tessera::commir
