// tools/plan_command.hpp — `tessera plan` as a function, so that tests and the
// fuzzer run it in-process (tools/cmd_plan.cpp).
//
// Contract: every bad argument or input is rejected with a tessera::Error
// naming the argument and the value (CLI11's own parse errors are converted);
// numbers are range-checked, input files must be regular files of at most
// 1 MiB (CommIR) / 1 MiB JSON of nesting depth <= 64 (profiles), and the
// schedule search stops after --budget-s seconds (default 10) with the best
// plan found so far.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace tessera::tools {

inline constexpr double kDefaultPlanBudgetS = 10.0;

/// Adds `plan` and its subcommands to `root`; option values live in state
/// created by this call (a fresh App starts from the defaults). Output goes to `out`.
void add_plan_command(CLI::App& root, std::FILE* out = stdout);

/// Runs `tessera plan <args>` (args start after "plan"). Returns normally on
/// success or --help; throws tessera::Error for every rejection.
void run_plan(const std::vector<std::string>& args, std::FILE* out);

}  // namespace tessera::tools
