// tessera — command-line tool: run, bench, plan, ...
#include <cstdio>
#include <exception>
#include <vector>

#include "command.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::tools {

static std::vector<CommandAdder>& registry() {
  static std::vector<CommandAdder> r;
  return r;
}

bool register_command(CommandAdder add) {
  registry().push_back(std::move(add));
  return true;
}

CLI::App& subcommand(CLI::App& parent, const std::string& name, const std::string& description) {
  for (CLI::App* s : parent.get_subcommands({})) {
    if (s->get_name() == name) return *s;
  }
  CLI::App* s = parent.add_subcommand(name, description);
  s->require_subcommand(1);
  return *s;
}

}  // namespace tessera::tools

int main(int argc, char** argv) {
  // Under `tessera run` stdout is a pipe, which stdio buffers fully: a rank
  // killed by a timeout would lose everything it printed. Line buffering
  // keeps a long benchmark's progress visible and in the logs.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"tessera: tile-granular overlap of communication and computation on multi-GPU machines"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tessera 0.1.0");
  for (auto& add : tessera::tools::registry()) add(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "tessera: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {  // e.g. std::out_of_range, std::bad_alloc: still an error, not an abort
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "tessera: error: unknown exception\n");
    return 1;
  }
  return 0;
}
