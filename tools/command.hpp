// tools/command.hpp — how `tessera` subcommands plug into the CLI.
//
// Each subcommand lives in its own source file and registers itself with
// TESSERA_REGISTER_COMMAND; main() builds the CLI11 tree from the registry.
// Use tools::subcommand(app, "bench") to hang a command under a group.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace tessera::tools {

using CommandAdder = std::function<void(CLI::App& root)>;

/// Registers `add` to be called with the root app at start-up; returns true.
bool register_command(CommandAdder add);

/// The subcommand `name` of `parent`, created (with `description`) if absent.
CLI::App& subcommand(CLI::App& parent, const std::string& name, const std::string& description);

}  // namespace tessera::tools

#define TESSERA_CMD_CONCAT_(a, b) a##b
#define TESSERA_CMD_CONCAT(a, b) TESSERA_CMD_CONCAT_(a, b)
/// Usage at namespace scope: TESSERA_REGISTER_COMMAND([](CLI::App& root) { ... });
#define TESSERA_REGISTER_COMMAND(...)                                       \
  static const bool TESSERA_CMD_CONCAT(tessera_cmd_registered_, __LINE__) = \
      ::tessera::tools::register_command(__VA_ARGS__)
