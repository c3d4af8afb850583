// What one fuzz input exercises, shared by the CI fuzz test
// (test_plan_fuzz.cpp) and the libFuzzer target (fuzz_plan_libfuzzer.cpp).
//
// Contract under test: CommIR text and `tessera plan` argument lists either
// work or are rejected with a tessera::Error. Anything else escaping these
// functions (another exception type, a signal, a hang) is a bug.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "plan_command.hpp"
#include "tessera/commir/text.hpp"
#include "tessera/commir/tuner.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::fuzz {

/// Parses `text`; when it parses, prints it back (the round trip must hold),
/// lowers and estimates it when it is scheduled, or searches it briefly
/// (`search` true) when it is a bare operator with a mesh.
inline void one_text(const std::string& text, bool search) {
  using namespace tessera::commir;
  const Grid g = parse(text);
  const Grid again = parse(print(g));
  if (!(again == g)) throw std::logic_error("fuzz: parse(print(g)) != g for\n" + print(g));  // a bug, not a rejection
  static const MachineProfile prof = builtin_profile("h100");
  if (!g.loops.empty()) {
    if (g.kernel.empty() || g.mesh.empty()) return;
    const Plan p = lower(g);
    (void)estimate(p, prof);
    (void)describe(p, 4);
  } else if (search && !g.mesh.empty()) {
    TuneOptions o;
    o.budget_s = 0.005;
    o.extra_tiling = false;
    (void)commir::tune(g, prof, o);
  }
}

/// Runs `tessera plan <args>` in-process with output to `out`.
inline void one_args(const std::vector<std::string>& args, std::FILE* out) { tools::run_plan(args, out); }

}  // namespace tessera::fuzz
