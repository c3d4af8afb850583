// `tessera run`: fork/exec N ranks, relay their output line by line with a
// rank prefix, stop everyone when one fails. Contract: tools/launcher.hpp.
//
// One thread, one poll() loop over the ranks' stdout/stderr pipes and a
// self-pipe that the signal handler writes (SIGCHLD, SIGINT, SIGTERM,
// SIGHUP), so no work happens inside the handler.
#include "launcher.hpp"

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "tessera/runtime/bootstrap.hpp"
#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"

extern char** environ;

namespace tessera::tools {
namespace {

using Clock = std::chrono::steady_clock;

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  (void)!::write(g_signal_pipe[1], &b, 1);  // full pipe: a wake-up is already pending
  errno = saved;
}

std::string signal_name(int sig) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  if (const char* abbrev = ::sigabbrev_np(sig)) return std::string("SIG") + abbrev;
#endif
  return fmt::format("signal {}", sig);
}

/// write() all of it; output that nobody reads any more (EPIPE) is dropped.
void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void say(const std::string& msg) {
  const std::string line = "tessera run: " + msg + "\n";
  write_all(STDERR_FILENO, line.data(), line.size());
}

// ---- no descendant outlives the job -------------------------------------------
//
// Three mechanisms (launcher.hpp states what each covers):
//  - each rank leads its own process group, and the launcher signals whole
//    groups;
//  - the launcher is a child subreaper (PR_SET_CHILD_SUBREAPER): orphaned
//    descendants (a rank's children once the rank exits, double-forked or
//    setsid daemons) are re-parented to it, and the final sweep kills them;
//  - a watchdog process (forked before the ranks, in its own process group)
//    outlives a launcher killed by SIGKILL: it sees its pipe from the
//    launcher close without the "job over" byte, and kills every rank's
//    process group and every process whose environment carries this job's
//    TESSERA_JOB_SECRET (the ranks' descendants inherit it).
// The job marker scan and the watchdog use only async-signal-safe calls
// (the launcher may have CUDA threads when it forks the watchdog).

constexpr int kMaxGroups = 4096;
pid_t g_groups[kMaxGroups];  // the watchdog's copy of the ranks' process groups
char g_marker[160];          // "TESSERA_RUN_ID=<hex>" + NUL, set before fork
std::size_t g_marker_len = 0;
char g_environ_buf[1 << 16];  // one /proc/<pid>/environ at a time

/// True when `hay` (n bytes of NUL-separated "K=V" strings) holds g_marker as
/// a whole entry.
bool has_marker(const char* hay, std::size_t n) {
  std::size_t i = 0;
  while (i < n) {
    std::size_t j = i;
    while (j < n && hay[j] != '\0') ++j;
    if (j - i == g_marker_len && std::memcmp(hay + i, g_marker, g_marker_len) == 0) return true;
    i = j + 1;
  }
  return false;
}

/// Sends `sig` to every process (but this one and `spare`) whose initial
/// environment holds the job marker; returns how many. Async-signal-safe.
int kill_marked(int sig, pid_t spare) {
  if (g_marker_len == 0) return 0;
  const int dir = ::open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return 0;
  const pid_t self = ::getpid();
  int hits = 0;
  char dents[8192];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, dir, dents, sizeof dents);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      struct Dirent64 {
        unsigned long long ino;
        long long off;
        unsigned short reclen;
        unsigned char type;
        char name[1];
      };
      const auto* d = reinterpret_cast<const Dirent64*>(dents + off);
      off += d->reclen;
      pid_t pid = 0;
      bool numeric = d->name[0] != '\0';
      for (const char* c = d->name; *c; ++c) {
        if (*c < '0' || *c > '9') {
          numeric = false;
          break;
        }
        pid = pid * 10 + (*c - '0');
      }
      if (!numeric || pid == self || pid == spare) continue;
      char path[64] = "/proc/";
      std::size_t len = 6;
      for (const char* c = d->name; *c && len < 40; ++c) path[len++] = *c;
      std::memcpy(path + len, "/environ", 9);
      const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      std::size_t got = 0;
      for (;;) {
        const ssize_t k = ::read(fd, g_environ_buf + got, sizeof g_environ_buf - got);
        if (k <= 0) break;
        got += static_cast<std::size_t>(k);
        if (got == sizeof g_environ_buf) break;  // a huge environment: its start is checked
      }
      ::close(fd);
      if (has_marker(g_environ_buf, got) && ::kill(pid, sig) == 0) ++hits;
    }
  }
  ::close(dir);
  return hits;
}

/// The watchdog's life: read rank process groups from `in` until "job over"
/// (a 0) or EOF; on EOF (the launcher died), kill what the job left.
[[noreturn]] void watchdog_main(int in) {
  int count = 0;
  for (;;) {
    std::int32_t v = 0;
    std::size_t got = 0;
    while (got < sizeof v) {
      const ssize_t k = ::read(in, reinterpret_cast<char*>(&v) + got, sizeof v - got);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
      got += static_cast<std::size_t>(k);
    }
    if (got < sizeof v) break;  // EOF: the launcher is gone
    if (v == 0) ::_exit(0);     // the launcher ended the job itself
    if (count < kMaxGroups) g_groups[count++] = v;
  }
  // Ranks die by PDEATHSIG; their groups and the marked descendants here.
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < count; ++i) ::kill(-g_groups[i], SIGKILL);
    if (kill_marked(SIGKILL, -1) == 0 && round > 0) break;
    ::usleep(20 * 1000);
  }
  ::_exit(0);
}

/// The launcher's children that it did not start (adopted as a subreaper).
std::vector<pid_t> children_of_self() {
  std::vector<pid_t> out;
  const pid_t self = ::getpid();
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (const dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    const std::string path = "/proc/" + std::string(e->d_name) + "/stat";
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char buf[512];
    const ssize_t k = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (k <= 0) continue;
    buf[k] = '\0';
    const char* close = std::strrchr(buf, ')');  // "pid (comm) S ppid ..."
    int ppid = 0;
    char state = 0;
    if (close && std::sscanf(close + 1, " %c %d", &state, &ppid) == 2 && ppid == self)
      out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

/// One of a rank's output streams, relayed to `dest` with a prefix per line.
struct Stream {
  int fd = -1;          // read end of the pipe; -1 once closed
  int dest = 1;         // STDOUT_FILENO or STDERR_FILENO
  std::string pending;  // bytes after the last newline

  // Longest line kept whole; a longer one is cut so memory stays bounded.
  static constexpr std::size_t kMaxLine = 1 << 20;

  void emit(const std::string& prefix, const char* data, std::size_t n) {
    std::string out;
    std::size_t start = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (data[i] != '\n') continue;
      out += prefix;
      out += pending;
      out.append(data + start, i + 1 - start);
      pending.clear();
      start = i + 1;
    }
    pending.append(data + start, n - start);
    if (pending.size() >= kMaxLine) {
      out += prefix + pending + "\n";
      pending.clear();
    }
    if (!out.empty()) write_all(dest, out.data(), out.size());  // one write: whole lines only
  }

  /// Reads what is available; returns false at EOF (the stream is then closed).
  bool pump(const std::string& prefix) {
    char buf[65536];
    for (;;) {
      const ssize_t k = ::read(fd, buf, sizeof buf);
      if (k > 0) {
        emit(prefix, buf, static_cast<std::size_t>(k));
        if (static_cast<std::size_t>(k) < sizeof buf) return true;
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      close(prefix);  // EOF or a read error: nothing more will come
      return false;
    }
  }

  void close(const std::string& prefix) {
    if (!pending.empty()) {
      const std::string out = prefix + pending + "\n";
      write_all(dest, out.data(), out.size());
      pending.clear();
    }
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;  // waitpid status once reaped
  Stream out, err;
  std::string prefix;
};

/// The environment of rank r: ours plus the launch variables and `extra`
/// (the job secret and run id).
std::vector<std::string> rank_environment(const RunOptions& o, int port, int r,
                                          const std::vector<std::pair<std::string, std::string>>& extra) {
  std::vector<std::pair<std::string, std::string>> set = {
      {"RANK", std::to_string(r)},       {"WORLD_SIZE", std::to_string(o.nprocs)},
      {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", std::to_string(o.nprocs)},
      {"MASTER_ADDR", o.master_addr},    {"MASTER_PORT", std::to_string(port)}};
  set.insert(set.end(), extra.begin(), extra.end());
  // NVLink multicast stays off on the lent machines unless the caller decides otherwise.
  // Modules load eagerly: overlapped kernels wait on each other, and a
  // lazily loaded kernel's first launch can wait for a running kernel that
  // is itself waiting for it (a deadlock).
  const std::vector<std::pair<std::string, std::string>> defaults = {{"NCCL_NVLS_ENABLE", "0"},
                                                                     {"NVSHMEM_DISABLE_NVLS", "1"},
                                                                     {"TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"},
                                                                     {"CUDA_MODULE_LOADING", "EAGER"}};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    bool replaced = false;
    for (const auto& [k, v] : set) replaced |= key == k;
    if (!replaced) env.push_back(kv);
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  for (const auto& [k, v] : defaults)
    if (std::getenv(k.c_str()) == nullptr) env.push_back(k + "=" + v);
  return env;
}

struct Pipe {
  int rd = -1, wr = -1;
};

Pipe make_pipe() {
  int fds[2];
  TESSERA_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "tessera run: pipe(): {}", std::strerror(errno));
  return {fds[0], fds[1]};
}

/// Forks rank r. Returns its pid, or -1 with `exec_errno` set when the
/// program could not be executed (the child has then exited).
pid_t spawn(const RunOptions& o, int port, const std::vector<std::pair<std::string, std::string>>& extra, Rank& rk,
            int& exec_errno) {
  std::vector<std::string> env_strings = rank_environment(o, port, rk.rank, extra);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = o.command;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  const Pipe out = make_pipe(), err = make_pipe(), status = make_pipe();
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  TESSERA_CHECK(devnull >= 0, "tessera run: open(/dev/null): {}", std::strerror(errno));
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  TESSERA_CHECK(pid >= 0, "tessera run: fork() for rank {}: {}", rk.rank, std::strerror(errno));
  if (pid == 0) {
    // Child: only async-signal-safe calls from here to exec.
    // Own process group: the launcher signals the rank and its children together,
    // and a terminal's Ctrl-C reaches only the launcher, which forwards it once.
    ::setpgid(0, 0);
    // If the launcher itself is killed (SIGKILL), its ranks must not live on
    // (SIGKILL: a rank that ignores SIGTERM would otherwise hang forever).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(128 + SIGKILL);  // it died before prctl took effect
    ::dup2(devnull, STDIN_FILENO);
    ::dup2(out.wr, STDOUT_FILENO);
    ::dup2(err.wr, STDERR_FILENO);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int s : {SIGPIPE, SIGCHLD, SIGINT, SIGTERM, SIGHUP}) ::sigaction(s, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    environ = envp.data();
    ::execvp(argv[0], argv.data());
    const int e = errno;
    (void)!::write(status.wr, &e, sizeof e);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so the group exists before we ever signal it
  ::close(devnull);
  ::close(out.wr);
  ::close(err.wr);
  ::close(status.wr);
  exec_errno = 0;
  for (;;) {  // EOF = exec succeeded (the pipe is close-on-exec); data = exec failed
    const ssize_t k = ::read(status.rd, &exec_errno, sizeof exec_errno);
    if (k < 0 && errno == EINTR) continue;
    if (k != static_cast<ssize_t>(sizeof exec_errno)) exec_errno = 0;
    break;
  }
  ::close(status.rd);
  rk.out = {out.rd, STDOUT_FILENO, {}};
  rk.err = {err.rd, STDERR_FILENO, {}};
  for (int fd : {out.rd, err.rd}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  rk.pid = pid;
  rk.running = true;
  if (exec_errno != 0) return -1;
  return pid;
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) return "was killed by " + signal_name(WTERMSIG(status));
  return fmt::format("exited with code {}", WEXITSTATUS(status));
}

int exit_code_of(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

class Supervisor {
 public:
  Supervisor(const RunOptions& o) : opt_(o) {}

  int run() {
    install_handlers();
    const int port = opt_.master_port != 0 ? opt_.master_port : runtime::find_free_tcp_port();
    // The job secret: the caller's, or 256 fresh bits. The run id marks this
    // job's processes for the sweeps (fresh even when the secret is given,
    // which several jobs may share).
    const char* given = std::getenv("TESSERA_JOB_SECRET");
    secret_ = given && *given ? std::string(given) : random_hex(32);
    run_id_ = random_hex(16);
    const std::string marker = "TESSERA_RUN_ID=" + run_id_;
    std::memcpy(g_marker, marker.c_str(), marker.size() + 1);
    g_marker_len = marker.size();
    preexisting_ = children_of_self();
    (void)::prctl(PR_GET_CHILD_SUBREAPER, &was_subreaper_);
    (void)::prctl(PR_SET_CHILD_SUBREAPER, 1);
    start_watchdog();
    ranks_.resize(opt_.nprocs);
    try {
      for (int r = 0; r < opt_.nprocs; ++r) {
        Rank& rk = ranks_[r];
        rk.rank = r;
        rk.prefix = fmt::format("[rank {}] ", r);
        int exec_errno = 0;
        const pid_t pid = spawn(opt_, port, env_extra(), rk, exec_errno);
        tell_watchdog(rk.pid);
        if (pid < 0) {
          say(fmt::format("cannot execute '{}': {}", opt_.command[0], std::strerror(exec_errno)));
          signal_all(SIGKILL);
          reap_blocking();
          finish();
          return 127;
        }
      }
      loop();
    } catch (...) {  // e.g. out of file descriptors: leave no rank behind
      signal_all(SIGKILL);
      reap_blocking();
      finish();
      throw;
    }
    finish();
    if (failed_rank_ >= 0) return exit_code_of(ranks_[failed_rank_].status);
    if (received_signal_ != 0) return 128 + received_signal_;
    return 0;
  }

 private:
  static std::string random_hex(std::size_t bytes) {
    std::vector<unsigned char> b(bytes);
    std::size_t got = 0;
    while (got < bytes) {
      const ssize_t k = ::getrandom(b.data() + got, bytes - got, 0);
      if (k < 0 && errno == EINTR) continue;
      TESSERA_CHECK(k > 0, "tessera run: getrandom(): {}", std::strerror(errno));
      got += static_cast<std::size_t>(k);
    }
    static const char digits[] = "0123456789abcdef";
    std::string s;
    for (unsigned char c : b) {
      s += digits[c >> 4];
      s += digits[c & 15];
    }
    return s;
  }

  std::vector<std::pair<std::string, std::string>> env_extra() const {
    return {{"TESSERA_JOB_SECRET", secret_}, {"TESSERA_RUN_ID", run_id_}};
  }

  void start_watchdog() {
    int p[2];
    TESSERA_CHECK(::pipe2(p, O_CLOEXEC) == 0, "tessera run: pipe(): {}", std::strerror(errno));
    const pid_t pid = ::fork();
    TESSERA_CHECK(pid >= 0, "tessera run: fork() for the watchdog: {}", std::strerror(errno));
    if (pid == 0) {
      // Async-signal-safe calls only. Own process group: a terminal's or a
      // caller's signal to the launcher's group does not take it too.
      ::setpgid(0, 0);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(sig, &dfl, nullptr);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      const int devnull = ::open("/dev/null", O_RDWR);
      for (int fd = 0; fd < 3; ++fd) ::dup2(devnull, fd);
      ::dup2(p[0], 3);
      // Hold nothing of the launcher's (its output pipes above all).
#ifdef SYS_close_range
      if (::syscall(SYS_close_range, 4u, ~0u, 0) != 0)
#endif
        for (int fd = 4; fd < 65536; ++fd) ::close(fd);
      watchdog_main(3);
    }
    ::close(p[0]);
    watchdog_fd_ = p[1];
    watchdog_ = pid;
  }

  void tell_watchdog(pid_t group) {
    if (watchdog_fd_ < 0 || group <= 0) return;
    const std::int32_t v = group;
    (void)!::write(watchdog_fd_, &v, sizeof v);  // 4 bytes: atomic on a pipe
  }

  /// Kills what the ranks left behind: their process groups, the
  /// descendants adopted by this subreaper, and every process marked with
  /// this job's run id; reaps them. Bounded (2 s).
  void sweep() {
    for (auto& rk : ranks_)
      if (rk.pid > 0) ::kill(-rk.pid, SIGKILL);
    const auto until = Clock::now() + std::chrono::seconds(2);
    for (;;) {
      int hits = 0;
      for (pid_t c : children_of_self()) {
        if (c == watchdog_ || std::find(preexisting_.begin(), preexisting_.end(), c) != preexisting_.end()) continue;
        ::kill(c, SIGKILL);
        ++hits;
      }
      hits += kill_marked(SIGKILL, watchdog_);
      for (;;) {  // reap the adopted ones (ranks are reaped already)
        int status = 0;
        const pid_t pid = ::waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno == EINTR) continue;
        if (pid <= 0) break;
        if (pid == watchdog_) watchdog_ = -1;
      }
      if (hits == 0 || Clock::now() >= until) break;
      ::usleep(10 * 1000);
    }
  }

  void finish() {
    sweep();
    if (watchdog_fd_ >= 0) {
      const std::int32_t over = 0;
      (void)!::write(watchdog_fd_, &over, sizeof over);
      ::close(watchdog_fd_);
      watchdog_fd_ = -1;
    }
    if (watchdog_ > 0) {
      while (::waitpid(watchdog_, nullptr, 0) < 0 && errno == EINTR) {
      }
      watchdog_ = -1;
    }
    (void)::prctl(PR_SET_CHILD_SUBREAPER, was_subreaper_);
    restore_handlers();
  }

  void install_handlers() {
    TESSERA_CHECK(::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) == 0, "tessera run: pipe(): {}", std::strerror(errno));
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&sa.sa_mask);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) ::sigaction(s, &sa, &saved_[s]);
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ign, &saved_[SIGPIPE]);
  }

  void restore_handlers() {
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(s, &saved_[s], nullptr);
    for (int& fd : g_signal_pipe) {
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
  }

  /// Signals each running rank's process group (the rank and its children).
  void signal_all(int sig) {
    for (auto& rk : ranks_)
      if (rk.running && rk.pid > 0) ::kill(-rk.pid, sig);
  }

  void reap_blocking() {
    for (auto& rk : ranks_) {
      if (rk.pid <= 0 || !rk.running) continue;
      while (::waitpid(rk.pid, &rk.status, 0) < 0 && errno == EINTR) {
      }
      rk.running = false;
      rk.out.close(rk.prefix);
      rk.err.close(rk.prefix);
    }
  }

  int running_count() const {
    int n = 0;
    for (const auto& rk : ranks_) n += rk.running;
    return n;
  }

  void start_stopping(int sig) {
    if (!stopping_) kill_at_ = Clock::now() + opt_.grace;
    stopping_ = true;
    signal_all(sig);
  }

  void reap() {
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid < 0 && errno == EINTR) continue;
      if (pid <= 0) return;
      for (auto& rk : ranks_) {
        if (rk.pid != pid) continue;
        rk.running = false;
        rk.status = status;
        // Relay what it wrote before dying, so its last words precede our message.
        if (rk.out.fd >= 0) rk.out.pump(rk.prefix);
        if (rk.err.fd >= 0) rk.err.pump(rk.prefix);
        const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed && !stopping_) {
          failed_rank_ = rk.rank;
          const int others = running_count();
          say(fmt::format("rank {} {}{}", rk.rank, describe_exit(status),
                          others > 0 ? "; stopping the other ranks" : ""));
          start_stopping(SIGTERM);
        }
      }
    }
  }

  void handle_signals() {
    unsigned char buf[64];
    for (;;) {
      const ssize_t k = ::read(g_signal_pipe[0], buf, sizeof buf);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
      for (ssize_t i = 0; i < k; ++i) {
        const int sig = buf[i];
        if (sig == SIGCHLD) continue;  // reap() runs on every wake-up
        if (received_signal_ == 0 && failed_rank_ < 0) {
          received_signal_ = sig;
          say(fmt::format("received {}; forwarding it to the ranks", signal_name(sig)));
        }
        start_stopping(sig);
      }
    }
  }

  void loop() {
    Clock::time_point drain_until{};
    bool draining = false;
    bool killed = false;
    for (;;) {
      reap();
      if (running_count() == 0 && !draining) {
        // Every rank is gone; a grandchild may still hold a pipe open, so
        // relay what remains for a short while instead of waiting for EOF.
        draining = true;
        drain_until = Clock::now() + std::chrono::milliseconds(500);
      }
      std::vector<pollfd> pfds{{g_signal_pipe[0], POLLIN, 0}};
      std::vector<Stream*> streams;
      std::vector<Rank*> owners;
      for (auto& rk : ranks_) {
        for (Stream* s : {&rk.out, &rk.err}) {
          if (s->fd < 0) continue;
          pfds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
          owners.push_back(&rk);
        }
      }
      if (draining && (streams.empty() || Clock::now() >= drain_until)) break;
      int timeout = -1;
      auto until = [&](Clock::time_point t) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count() + 1;
        const int v = static_cast<int>(std::clamp<long long>(ms, 0, 1 << 30));
        timeout = timeout < 0 ? v : std::min(timeout, v);
      };
      if (stopping_ && !killed) until(kill_at_);
      if (draining) until(drain_until);
      const int rc = ::poll(pfds.data(), pfds.size(), timeout);
      TESSERA_CHECK(rc >= 0 || errno == EINTR, "tessera run: poll(): {}", std::strerror(errno));
      if (rc > 0) {
        if (pfds[0].revents != 0) handle_signals();
        for (std::size_t i = 1; i < pfds.size(); ++i)
          if (pfds[i].revents != 0 && streams[i - 1]->fd >= 0) streams[i - 1]->pump(owners[i - 1]->prefix);
      }
      if (stopping_ && !killed && Clock::now() >= kill_at_ && running_count() > 0) {
        say(fmt::format("{} rank(s) still running after {} ms; sending SIGKILL", running_count(), opt_.grace.count()));
        signal_all(SIGKILL);
        killed = true;
      }
    }
    for (auto& rk : ranks_) {
      rk.out.close(rk.prefix);
      rk.err.close(rk.prefix);
    }
  }

  const RunOptions& opt_;
  std::vector<Rank> ranks_;
  struct sigaction saved_[NSIG] = {};
  bool stopping_ = false;
  Clock::time_point kill_at_{};
  int failed_rank_ = -1;
  int received_signal_ = 0;
  std::string secret_, run_id_;
  std::vector<pid_t> preexisting_;  // children this process had before the job
  int was_subreaper_ = 0;
  pid_t watchdog_ = -1;
  int watchdog_fd_ = -1;
};

}  // namespace

int parse_nprocs(const std::string& text) {
  if (text == "auto") {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    return n >= 2 ? n : 2;
  }
  return static_cast<int>(env::parse_int(text, "tessera run -n", 1, 4096));
}

int run_local(const RunOptions& o) {
  TESSERA_CHECK(o.nprocs >= 1, "tessera run: -n must be at least 1 (got {})", o.nprocs);
  TESSERA_CHECK(!o.command.empty() && !o.command[0].empty(),
                "tessera run: no program given (usage: tessera run -n N -- prog args...)");
  TESSERA_CHECK(o.master_port >= 0 && o.master_port <= 65535, "tessera run: --port {} is out of range [1, 65535]",
                o.master_port);
  TESSERA_CHECK(!o.master_addr.empty(), "tessera run: --master-addr is empty");
  TESSERA_CHECK(o.grace.count() >= 0, "tessera run: grace period {} ms is negative", o.grace.count());
  Supervisor s(o);
  return s.run();
}

}  // namespace tessera::tools
