// A small program for the launcher tests, started by `tessera run`. Usage:
//   rank_helper env                      print the launch variables and the pid
//   rank_helper lines N                  N long lines to stdout and N to stderr, written
//                                        in odd pieces, then a line without newline
//   rank_helper fail R CODE              rank R exits with CODE after 200 ms; the others
//                                        sleep (effectively) forever
//   rank_helper signal R SIG             rank R kills itself with SIG; the others sleep
//   rank_helper stubborn                 ignore SIGTERM and sleep forever
//   rank_helper wait-signal              print "ready", exit 0 on SIGINT/SIGTERM after
//                                        printing which signal arrived
//   rank_helper bootstrap                detect_launch_info + Bootstrap + allgather check
//   rank_helper exit CODE                exit with CODE at once
//   rank_helper grandchildren R CODE     start a child that stays in the rank's process
//                                        group and a setsid daemon (double fork), print
//                                        "GRANDCHILD=<pid>" and "DAEMON=<pid>", then: rank R
//                                        exits with CODE after 200 ms and the others sleep;
//                                        R = -1: every rank exits CODE after 200 ms
//   rank_helper secret                   print TESSERA_JOB_SECRET and TESSERA_RUN_ID
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tessera/runtime/bootstrap.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/runtime/launch.hpp"

namespace {

int rank() { return std::getenv("RANK") ? std::atoi(std::getenv("RANK")) : -1; }

const char* var(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "<unset>";
}

[[noreturn]] void sleep_forever() {
  for (;;) ::pause();
}

void print_pid() {
  std::printf("PID=%d\n", static_cast<int>(::getpid()));
  std::fflush(stdout);
}

void write_raw(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t k = ::write(fd, s.data() + off, s.size() - off);
    if (k <= 0) std::exit(90);
    off += static_cast<std::size_t>(k);
  }
}

volatile sig_atomic_t g_signal = 0;
void remember(int sig) { g_signal = sig; }

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "env") {
    std::printf(
        "RANK=%s WORLD_SIZE=%s LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s MASTER_ADDR=%s MASTER_PORT=%s "
        "NCCL_NVLS_ENABLE=%s NVSHMEM_DISABLE_NVLS=%s TORCH_SYMM_MEM_DISABLE_MULTICAST=%s CUDA_MODULE_LOADING=%s "
        "ARGS=%d\n",
        var("RANK"), var("WORLD_SIZE"), var("LOCAL_RANK"), var("LOCAL_WORLD_SIZE"), var("MASTER_ADDR"),
        var("MASTER_PORT"), var("NCCL_NVLS_ENABLE"), var("NVSHMEM_DISABLE_NVLS"),
        var("TORCH_SYMM_MEM_DISABLE_MULTICAST"), var("CUDA_MODULE_LOADING"), argc - 2);
    for (int i = 2; i < argc; ++i) std::printf("ARG=%s\n", argv[i]);
    return 0;
  }
  if (mode == "lines" && argc == 3) {
    const int n = std::atoi(argv[2]);
    const int r = rank();
    for (int i = 0; i < n; ++i) {
      for (int fd : {1, 2}) {
        // "<out|err> <rank> <i> " then 200 copies of a letter: one line, three writes.
        std::string line = (fd == 1 ? "out " : "err ") + std::to_string(r) + " " + std::to_string(i) + " " +
                           std::string(200, static_cast<char>('a' + (r + i) % 26)) + "\n";
        const std::size_t a = line.size() / 3, b = 2 * line.size() / 3;
        write_raw(fd, line.substr(0, a));
        write_raw(fd, line.substr(a, b - a));
        write_raw(fd, line.substr(b));
      }
    }
    write_raw(1, "tail without newline");
    return 0;
  }
  if (mode == "fail" && argc == 4) {
    print_pid();
    if (rank() == std::atoi(argv[2])) {
      ::usleep(200 * 1000);
      std::fprintf(stderr, "rank %d failing on purpose\n", rank());
      return std::atoi(argv[3]);
    }
    sleep_forever();
  }
  if (mode == "signal" && argc == 4) {
    print_pid();
    if (rank() == std::atoi(argv[2])) {
      const rlimit no_core{0, 0};
      ::setrlimit(RLIMIT_CORE, &no_core);  // a crash test should not write core files
      ::usleep(100 * 1000);
      ::signal(std::atoi(argv[3]), SIG_DFL);
      ::raise(std::atoi(argv[3]));
      return 99;
    }
    sleep_forever();
  }
  if (mode == "stubborn") {
    ::signal(SIGTERM, SIG_IGN);
    print_pid();
    sleep_forever();
  }
  if (mode == "wait-signal") {
    struct sigaction sa {};
    sa.sa_handler = remember;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    std::printf("ready\n");
    std::fflush(stdout);
    while (g_signal == 0) ::pause();
    std::printf("got signal %d\n", static_cast<int>(g_signal));
    return 0;
  }
  if (mode == "bootstrap") {
    try {
      const auto li = tessera::runtime::detect_launch_info();
      auto b = tessera::runtime::Bootstrap::connect(li, std::chrono::seconds(20));
      std::vector<int> all(li.world, -1);
      const int mine = li.rank * 7 + 1;
      b->allgather(&mine, all.data(), sizeof mine);
      for (int r = 0; r < li.world; ++r) {
        if (all[r] != r * 7 + 1) {
          std::fprintf(stderr, "allgather slot %d = %d\n", r, all[r]);
          return 3;
        }
      }
      int token = li.rank == li.world - 1 ? 12345 : 0;
      b->broadcast(&token, sizeof token, li.world - 1);
      b->barrier();
      std::printf("bootstrap ok rank %d of %d via %s token %d\n", li.rank, li.world, li.source.c_str(), token);
      return token == 12345 ? 0 : 4;
    } catch (const tessera::Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 2;
    }
  }
  if (mode == "exit" && argc == 3) return std::atoi(argv[2]);
  if (mode == "secret") {
    std::printf("SECRET=%s RUN_ID=%s\n", var("TESSERA_JOB_SECRET"), var("TESSERA_RUN_ID"));
    return 0;
  }
  if (mode == "grandchildren" && argc == 4) {
    auto quiet = [] {  // a grandchild holds none of the rank's output pipes
      const int devnull = ::open("/dev/null", O_RDWR);
      for (int fd = 0; fd < 3; ++fd) ::dup2(devnull, fd);
    };
    const pid_t child = ::fork();
    if (child == 0) {
      quiet();
      sleep_forever();
    }
    int report[2];
    if (::pipe(report) != 0) return 91;
    const pid_t middle = ::fork();
    if (middle == 0) {  // the classic daemon: setsid, fork again, the middle exits
      ::setsid();
      const pid_t daemon = ::fork();
      if (daemon == 0) {
        quiet();
        sleep_forever();
      }
      (void)!::write(report[1], &daemon, sizeof daemon);
      ::_exit(0);
    }
    pid_t daemon = -1;
    if (::read(report[0], &daemon, sizeof daemon) != static_cast<ssize_t>(sizeof daemon)) return 92;
    ::waitpid(middle, nullptr, 0);
    std::printf("GRANDCHILD=%d\nDAEMON=%d\n", static_cast<int>(child), static_cast<int>(daemon));
    print_pid();
    const int who = std::atoi(argv[2]);
    if (who == -1 || who == rank()) {
      ::usleep(200 * 1000);
      return std::atoi(argv[3]);
    }
    sleep_forever();
  }
  std::fprintf(stderr, "rank_helper: bad arguments\n");
  return 64;
}
