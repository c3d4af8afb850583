#include "support/test_support.hpp"

#include <cuda_runtime_api.h>

#include <execinfo.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "tessera/runtime/error.hpp"

namespace tessera::testing {

namespace {

// A test process that crashes prints the faulting thread's stack to stderr
// before dying (a multi-rank test otherwise shows only a peer's timeout).
// Async-signal-safe: backtrace_symbols_fd writes without allocating.
void print_stack_and_die(int sig) {
  static const char head[] = "\n*** fatal signal in test process; stack:\n";
  (void)!write(STDERR_FILENO, head, sizeof(head) - 1);
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

[[maybe_unused]] const bool crash_handler_installed = [] {
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, print_stack_and_die);
  return true;
}();

}  // namespace

int visible_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

int launched_world_size() {
  for (const char* v : {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"}) {
    if (const char* s = std::getenv(v)) return std::atoi(s);
  }
  return 1;
}

double relative_error(const std::vector<double>& out, const std::vector<double>& ref) {
  if (out.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i]) || !std::isfinite(ref[i])) return std::numeric_limits<double>::infinity();
    const double d = out[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const tessera::Error& e) {
    return e.what();
  }
  return "";
}

std::string pointer_text(const void* p) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", p);
  return b;
}

}  // namespace tessera::testing
