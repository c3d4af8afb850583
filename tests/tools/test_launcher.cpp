// `tessera run`: the environment each rank sees, per-rank output prefixes,
// exit-code propagation, stopping the other ranks when one fails, signal
// forwarding, bad invocations, and a bootstrap through the launcher.
#include <cuda_runtime_api.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kCli = TESSERA_CLI_PATH;
const std::string kHelper = RANK_HELPER_PATH;

struct Result {
  int code = -1;  // exit code, or 128 + signal
  std::string out, err;
  Clock::duration took{};
  bool timed_out = false;
};

/// Runs `tessera <args>` with extra environment variables, capturing stdout
/// and stderr separately. on_out(pid, stdout so far) runs after each chunk.
Result run_cli(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {},
               std::chrono::milliseconds limit = 30s,
               const std::function<void(pid_t, const std::string&)>& on_out = nullptr) {
  int out[2], err[2];
  if (::pipe(out) != 0 || ::pipe(err) != 0) std::abort();
  std::vector<std::string> argv_s{kCli};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  const auto t0 = Clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::close(out[0]);
    ::close(err[0]);
    for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                          "NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                          "CUDA_MODULE_LOADING", "TESSERA_RUN_GRACE_MS", "TESSERA_JOB_SECRET", "TESSERA_RUN_ID"})
      ::unsetenv(v);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    ::execv(argv[0], argv.data());
    ::_exit(126);
  }
  ::close(out[1]);
  ::close(err[1]);
  Result r;
  int fds[2] = {out[0], err[0]};
  bool open[2] = {true, true};
  const auto deadline = t0 + limit;
  bool termed = false;
  while (open[0] || open[1]) {
    pollfd pf[2];
    int n = 0, which[2];
    for (int i = 0; i < 2; ++i)
      if (open[i]) {
        pf[n] = {fds[i], POLLIN, 0};
        which[n++] = i;
      }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {  // stop the launcher (it forwards to the ranks), then insist
      r.timed_out = true;
      ::kill(pid, termed ? SIGKILL : SIGTERM);
      if (termed) break;
      termed = true;
      continue;
    }
    if (::poll(pf, n, static_cast<int>(std::min<long long>(left, 200))) <= 0) continue;
    for (int j = 0; j < n; ++j) {
      if (pf[j].revents == 0) continue;
      char buf[65536];
      const ssize_t k = ::read(fds[which[j]], buf, sizeof buf);
      if (k <= 0) {
        open[which[j]] = false;
        continue;
      }
      (which[j] == 0 ? r.out : r.err).append(buf, static_cast<std::size_t>(k));
      if (which[j] == 0 && on_out) on_out(pid, r.out);
    }
  }
  ::close(out[0]);
  ::close(err[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.took = Clock::now() - t0;
  r.code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  return r;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string show(const Result& r) {
  return "\n--- exit " + std::to_string(r.code) + (r.timed_out ? " (timed out)" : "") + "\n--- stdout:\n" + r.out +
         "\n--- stderr:\n" + r.err;
}

/// PIDs the helper printed ("[rank R] PID=n", or another KEY=n).
std::vector<pid_t> pids_in(const std::string& out, const std::string& key = "PID") {
  std::vector<pid_t> v;
  const std::regex re("\\] " + key + "=(\\d+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    v.push_back(static_cast<pid_t>(std::stol((*it)[1])));
  return v;
}

/// True when `pid` no longer runs: gone, or a zombie (dead, waiting for
/// whoever adopted it to reap it).
bool dead(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const auto close = line.rfind(')');  // "pid (comm) S ..."
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

bool all_gone(const std::vector<pid_t>& pids) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    bool gone = true;
    for (pid_t p : pids) gone &= dead(p);
    if (gone) return true;
    ::usleep(20 * 1000);
  }
  return false;
}

class LauncherWorld : public ::testing::TestWithParam<int> {};

TEST_P(LauncherWorld, EveryRankSeesItsEnvironment) {
  const int n = GetParam();
  const Result r = run_cli({"run", "-n", std::to_string(n), "--", kHelper, "env", "plain", "-x --y"});
  ASSERT_EQ(r.code, 0) << show(r);
  EXPECT_EQ(r.err, "") << show(r);
  static const std::regex re(
      R"(\[rank (\d+)\] RANK=(\d+) WORLD_SIZE=(\d+) LOCAL_RANK=(\d+) LOCAL_WORLD_SIZE=(\d+) MASTER_ADDR=127\.0\.0\.1 )"
      R"(MASTER_PORT=(\d+) NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 CUDA_MODULE_LOADING=EAGER ARGS=2)");
  std::set<int> seen;
  std::set<std::string> ports;
  int args_seen = 0;
  for (const auto& line : lines_of(r.out)) {
    std::smatch m;
    if (std::regex_match(line, m, re)) {
      const int prefix = std::stoi(m[1]);
      EXPECT_EQ(std::stoi(m[2]), prefix) << line;
      EXPECT_EQ(std::stoi(m[3]), n) << line;
      EXPECT_EQ(std::stoi(m[4]), prefix) << line;
      EXPECT_EQ(std::stoi(m[5]), n) << line;
      const int port = std::stoi(m[6]);
      EXPECT_TRUE(port >= 1 && port <= 65535) << line;
      ports.insert(m[6]);
      EXPECT_TRUE(seen.insert(prefix).second) << "rank " << prefix << " reported twice";
    } else if (std::regex_match(line, std::regex(R"(\[rank \d+\] ARG=(plain|-x --y))"))) {
      ++args_seen;
    } else {
      ADD_FAILURE() << "unexpected line: " << line;
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), n) << show(r);
  for (int i = 0; i < n; ++i) EXPECT_TRUE(seen.count(i)) << "rank " << i << " missing" << show(r);
  EXPECT_EQ(ports.size(), 1u) << "every rank must see the same MASTER_PORT" << show(r);
  EXPECT_EQ(args_seen, 2 * n) << show(r);
}

INSTANTIATE_TEST_SUITE_P(Sizes, LauncherWorld, ::testing::Values(1, 4, 8));

TEST(Launcher, GivenAddressPortAndCallerNvlsSettingsAreKept) {
  const Result r = run_cli({"run", "-n", "2", "--port", "34567", "--master-addr", "localhost", "--", kHelper, "env"},
                           {{"NCCL_NVLS_ENABLE", "1"}, {"RANK", "5"}});
  ASSERT_EQ(r.code, 0) << show(r);
  for (int i = 0; i < 2; ++i) {
    const std::string p = "[rank " + std::to_string(i) + "] RANK=" + std::to_string(i) + " ";
    EXPECT_TRUE(contains(r.out, p)) << show(r);
  }
  EXPECT_EQ(lines_of(r.out).size(), 2u) << show(r);
  for (const auto& line : lines_of(r.out)) {
    EXPECT_TRUE(contains(line, "MASTER_ADDR=localhost MASTER_PORT=34567 ")) << line;
    EXPECT_TRUE(contains(line, "NCCL_NVLS_ENABLE=1 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1")) << line;
  }
}

TEST(Launcher, OutputIsPrefixedLineByLineOnTheRightStream) {
  const int n = 4, count = 300;
  const Result r = run_cli({"run", "-n", std::to_string(n), "--", kHelper, "lines", std::to_string(count)});
  ASSERT_EQ(r.code, 0) << show(r);
  for (const auto& [text, kind] : {std::pair{r.out, std::string("out")}, std::pair{r.err, std::string("err")}}) {
    static const std::regex line_re(R"(\[rank (\d+)\] (out|err) (\d+) (\d+) ([a-z])\5{199})");
    std::map<int, int> per_rank;
    int tails = 0;
    for (const auto& line : lines_of(text)) {
      std::smatch m;
      if (kind == "out" && std::regex_match(line, m, std::regex(R"(\[rank (\d+)\] tail without newline)"))) {
        ++tails;
        continue;
      }
      ASSERT_TRUE(std::regex_match(line, m, line_re)) << "mangled " << kind << " line: " << line.substr(0, 300);
      EXPECT_EQ(m[2], kind) << line.substr(0, 80);
      EXPECT_EQ(m[1], m[3]) << "prefix and content disagree: " << line.substr(0, 80);
      const int r_ = std::stoi(m[1]), i = std::stoi(m[4]);
      EXPECT_EQ(m[5].str()[0], static_cast<char>('a' + (r_ + i) % 26));
      EXPECT_EQ(i, per_rank[r_]++) << "lines of one rank out of order";
    }
    for (int i = 0; i < n; ++i) EXPECT_EQ(per_rank[i], count) << kind << " of rank " << i;
    if (kind == "out") {
      EXPECT_EQ(tails, n);
    }
  }
}

TEST(Launcher, AllRanksSucceedMeansExitZero) {
  const Result r = run_cli({"run", "-n", "3", "--", kHelper, "exit", "0"});
  EXPECT_EQ(r.code, 0) << show(r);
  EXPECT_EQ(r.err, "") << show(r);
}

TEST(Launcher, FailingRankStopsTheOthersAndItsCodeIsReturned) {
  const Result r = run_cli({"run", "-n", "4", "--", kHelper, "fail", "1", "3"}, {}, 20s);
  EXPECT_EQ(r.code, 3) << show(r);
  EXPECT_TRUE(contains(r.err, "tessera run: rank 1 exited with code 3; stopping the other ranks")) << show(r);
  // The failing rank's last words come before the launcher's verdict.
  EXPECT_LT(r.err.find("[rank 1] rank 1 failing on purpose"), r.err.find("tessera run: rank 1")) << show(r);
  EXPECT_LT(r.took, 4s) << "the sleeping ranks should stop at SIGTERM";
  const auto pids = pids_in(r.out);
  EXPECT_EQ(pids.size(), 4u) << show(r);
  EXPECT_TRUE(all_gone(pids)) << "a rank outlived the launcher" << show(r);
}

TEST(Launcher, RankKilledBySignal) {
  const Result r = run_cli({"run", "-n", "3", "--", kHelper, "signal", "2", std::to_string(SIGSEGV)}, {}, 20s);
  EXPECT_EQ(r.code, 128 + SIGSEGV) << show(r);
  EXPECT_TRUE(contains(r.err, "tessera run: rank 2 was killed by SIGSEGV; stopping the other ranks")) << show(r);
  EXPECT_TRUE(all_gone(pids_in(r.out))) << show(r);
}

TEST(Launcher, RanksIgnoringSigtermAreKilledAfterTheGracePeriod) {
  const std::string script = "if [ \"$RANK\" = 0 ]; then sleep 0.3; exit 7; fi; exec \"$0\" stubborn";
  const Result r =
      run_cli({"run", "-n", "3", "--", "sh", "-c", script, kHelper}, {{"TESSERA_RUN_GRACE_MS", "300"}}, 20s);
  EXPECT_EQ(r.code, 7) << show(r);
  EXPECT_TRUE(contains(r.err, "rank 0 exited with code 7; stopping the other ranks")) << show(r);
  EXPECT_TRUE(contains(r.err, "2 rank(s) still running after 300 ms; sending SIGKILL")) << show(r);
  EXPECT_LT(r.took, 5s) << show(r);
  const auto pids = pids_in(r.out);
  EXPECT_EQ(pids.size(), 2u) << show(r);
  EXPECT_TRUE(all_gone(pids)) << show(r);
}

void expect_forwarded(int sig, const std::string& name) {
  bool sent = false;
  const Result r =
      run_cli({"run", "-n", "2", "--", kHelper, "wait-signal"}, {}, 20s, [&](pid_t launcher, const std::string& out) {
        if (!sent && lines_of(out).size() >= 2) {  // both ranks print "ready" first
          ::kill(launcher, sig);
          sent = true;
        }
      });
  ASSERT_TRUE(sent) << show(r);
  EXPECT_EQ(r.code, 128 + sig) << show(r);
  EXPECT_TRUE(contains(r.err, "received " + name + "; forwarding it to the ranks")) << show(r);
  for (int i = 0; i < 2; ++i)
    EXPECT_TRUE(contains(r.out, "[rank " + std::to_string(i) + "] got signal " + std::to_string(sig))) << show(r);
}

TEST(Launcher, ForwardsSigtermToTheRanks) { expect_forwarded(SIGTERM, "SIGTERM"); }
TEST(Launcher, ForwardsSigintToTheRanks) { expect_forwarded(SIGINT, "SIGINT"); }

TEST(Launcher, RanksDieWithAKilledLauncher) {
  bool sent = false;
  // Rank 5 does not exist: both ranks print their pid and sleep forever.
  const Result r = run_cli({"run", "-n", "2", "--", kHelper, "fail", "5", "1"}, {}, 20s,
                           [&](pid_t launcher, const std::string& out) {
                             if (!sent && pids_in(out).size() == 2) {
                               ::kill(launcher, SIGKILL);
                               sent = true;
                             }
                           });
  ASSERT_TRUE(sent) << show(r);
  EXPECT_EQ(r.code, 128 + SIGKILL) << show(r);
  EXPECT_TRUE(all_gone(pids_in(r.out))) << "ranks outlived a killed launcher" << show(r);
}

TEST(Launcher, RanksBootstrapThroughTheLauncher) {
  const Result r = run_cli({"run", "-n", "4", "--", kHelper, "bootstrap"}, {}, 30s);
  ASSERT_EQ(r.code, 0) << show(r);
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(contains(r.out, "[rank " + std::to_string(i) + "] bootstrap ok rank " + std::to_string(i) +
                                    " of 4 via torchrun token 12345"))
        << show(r);
}

TEST(Launcher, AutoUsesTheVisibleGpusOrTwo) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  const int expected = gpus >= 2 ? gpus : 2;
  const Result r = run_cli({"run", "-n", "auto", "--", kHelper, "env"});
  ASSERT_EQ(r.code, 0) << show(r);
  EXPECT_EQ(static_cast<int>(lines_of(r.out).size()), expected) << show(r);
  EXPECT_TRUE(contains(r.out, "WORLD_SIZE=" + std::to_string(expected) + " ")) << show(r);
}

TEST(Launcher, BadInvocationsAreClearErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"run", "-n", "0", "--", kHelper, "exit", "0"}, "-n = 0"},
      {{"run", "-n", "-3", "--", kHelper, "exit", "0"}, "-n"},
      {{"run", "-n", "many", "--", kHelper, "exit", "0"}, "-n = 'many'"},
      {{"run", "-n", "2"}, "command is required"},
      {{"run", "-n", "2", "--port", "70000", "--", kHelper}, "--port"},
      {{"run", "--", kHelper}, "-n"},
  };
  for (const auto& c : cases) {
    const Result r = run_cli(c.args);
    EXPECT_NE(r.code, 0) << show(r);
    EXPECT_TRUE(contains(r.err, c.says)) << "expected '" << c.says << "'" << show(r);
    EXPECT_EQ(r.out.find("[rank"), std::string::npos) << "nothing may start" << show(r);
  }
}

TEST(Launcher, ProgramThatCannotBeExecuted) {
  const Result r = run_cli({"run", "-n", "3", "--", "/nonexistent/tessera-prog", "x"}, {}, 10s);
  EXPECT_EQ(r.code, 127) << show(r);
  EXPECT_TRUE(contains(r.err, "tessera run: cannot execute '/nonexistent/tessera-prog': No such file or directory"))
      << show(r);
  EXPECT_LT(r.took, 3s);
}

// ---- no process outlives the job --------------------------------------------

/// Every pid the grandchildren helper printed: ranks, grandchildren, daemons.
std::vector<pid_t> job_pids(const std::string& out) {
  std::vector<pid_t> all;
  for (const char* key : {"PID", "GRANDCHILD", "DAEMON"})
    for (pid_t p : pids_in(out, key)) all.push_back(p);
  return all;
}

std::string alive(const std::vector<pid_t>& pids) {
  std::string s;
  for (pid_t p : pids)
    if (!dead(p)) s += " " + std::to_string(p);
  return s.empty() ? "none" : s;
}

TEST(LauncherDescendants, NoneSurvivesARankFailure) {
  const Result r = run_cli({"run", "-n", "3", "--", kHelper, "grandchildren", "1", "5"}, {}, 20s);
  EXPECT_EQ(r.code, 5) << show(r);
  const auto pids = job_pids(r.out);
  EXPECT_EQ(pids.size(), 9u) << show(r);
  EXPECT_TRUE(all_gone(pids)) << "still running:" << alive(pids) << show(r);
}

TEST(LauncherDescendants, NoneSurvivesSuccess) {
  const Result r = run_cli({"run", "-n", "2", "--", kHelper, "grandchildren", "-1", "0"}, {}, 20s);
  EXPECT_EQ(r.code, 0) << show(r);
  const auto pids = job_pids(r.out);
  EXPECT_EQ(pids.size(), 6u) << show(r);
  EXPECT_TRUE(all_gone(pids)) << "still running:" << alive(pids) << show(r);
}

TEST(LauncherDescendants, NoneSurvivesASigkilledLauncher) {
  bool sent = false;
  // Rank 7 does not exist: every rank starts its descendants and sleeps.
  const Result r = run_cli({"run", "-n", "2", "--", kHelper, "grandchildren", "7", "1"}, {}, 20s,
                           [&](pid_t launcher, const std::string& out) {
                             if (!sent && pids_in(out).size() == 2) {
                               ::kill(launcher, SIGKILL);
                               sent = true;
                             }
                           });
  ASSERT_TRUE(sent) << show(r);
  EXPECT_EQ(r.code, 128 + SIGKILL) << show(r);
  const auto pids = job_pids(r.out);
  EXPECT_EQ(pids.size(), 6u) << show(r);
  EXPECT_TRUE(all_gone(pids)) << "still running:" << alive(pids) << show(r);
}

TEST(Launcher, EveryRankGetsTheSameFreshJobSecret) {
  std::set<std::string> secrets;
  for (int run = 0; run < 2; ++run) {
    const Result r = run_cli({"run", "-n", "3", "--", kHelper, "secret"});
    ASSERT_EQ(r.code, 0) << show(r);
    std::set<std::string> mine;
    static const std::regex re(R"(\] SECRET=([0-9a-f]{64}) RUN_ID=([0-9a-f]{32}))");
    for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), re); it != std::sregex_iterator(); ++it)
      mine.insert((*it)[1]);
    EXPECT_EQ(mine.size(), 1u) << "one 256-bit secret per job" << show(r);
    secrets.insert(mine.begin(), mine.end());
  }
  EXPECT_EQ(secrets.size(), 2u) << "each job gets a fresh secret";
  const Result given =
      run_cli({"run", "-n", "2", "--", kHelper, "secret"}, {{"TESSERA_JOB_SECRET", "caller-chosen-secret-0123456789"}});
  EXPECT_EQ(lines_of(given.out).size(), 2u) << show(given);
  for (const auto& line : lines_of(given.out))
    EXPECT_TRUE(contains(line, "SECRET=caller-chosen-secret-0123456789 ")) << line;
}

}  // namespace
