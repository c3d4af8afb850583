// `tessera run -n N [--port P] [--master-addr A] -- prog args...`
// Starts N local ranks with torchrun-style environment (tools/launcher.hpp).
#include <memory>

#include "command.hpp"
#include "launcher.hpp"
#include "tessera/runtime/env.hpp"

namespace {

struct RunArgs {
  std::string nprocs;
  int port = 0;
  std::string master_addr = "127.0.0.1";
  std::vector<std::string> command;
};

TESSERA_REGISTER_COMMAND([](CLI::App& root) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* run = root.add_subcommand(
      "run",
      "Start N local processes (ranks) of a program with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, "
      "MASTER_ADDR and MASTER_PORT set; prefix their output with [rank R]; stop all of them when one fails "
      "(exit code = the failing rank's). Put the program after `--`.");
  run->add_option("-n,--nprocs", args->nprocs,
                  "number of ranks (>= 1), or `auto` = number of visible GPUs (2 if there are fewer than 2)")
      ->required();
  run->add_option("--port", args->port, "MASTER_PORT for the rendezvous (default: a free port)")
      ->check(CLI::Range(1, 65535));
  run->add_option("--master-addr", args->master_addr, "MASTER_ADDR for the rendezvous")->capture_default_str();
  run->add_option("command", args->command, "program and its arguments (after --)")->required();
  run->footer(
      "Environment: TESSERA_RUN_GRACE_MS (default 5000) = how long the other ranks get after SIGTERM before "
      "SIGKILL. NCCL_NVLS_ENABLE=0, NVSHMEM_DISABLE_NVLS=1, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and "
      "CUDA_MODULE_LOADING=EAGER are set unless "
      "already set.\n");
  run->callback([args] {
    tessera::tools::RunOptions o;
    o.nprocs = tessera::tools::parse_nprocs(args->nprocs);
    o.master_port = args->port;
    o.master_addr = args->master_addr;
    o.command = args->command;
    o.grace = std::chrono::milliseconds(tessera::env::get_int("TESSERA_RUN_GRACE_MS", 5000, 0, INT32_MAX));
    const int rc = tessera::tools::run_local(o);
    if (rc != 0) throw CLI::RuntimeError(rc);  // main() returns it without printing anything
  });
});

}  // namespace
