// The bad-input table: CommIR files through `tessera plan
// file`, `tessera plan` arguments, tuning-cache files, the C API and the ops'
// argument validation. Each input must end in a clear error (a non-zero exit
// with a message, a tessera::Error, -1 from the C API, or a bad cache entry
// ignored) — never a crash (a signal, or an exception that is not a
// tessera::Error), a hang, or silent acceptance.
//
// Every input runs in its own process (the CLI as a child process, library
// calls in a forked child), so a crash or hang is counted, not fatal. The
// test prints the table (group, tried, clear error, crash, hang, accepted)
// and fails unless crash, hang and accepted are all 0.
//
// TESSERA_BAD_INPUT_CLI=path runs the CLI groups against another `tessera`
// binary, and TESSERA_BAD_INPUT_REPORT_ONLY=1 prints the table without
// failing: how the "before" column of the table is measured. Compiled with
// TESSERA_BAD_INPUT_BEFORE, the test uses only the library API that existed
// before the hardening (for the same purpose).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tessera/capi/tessera.h"
#include "tessera/ops/args.hpp"
#include "tessera/ops/tuner.hpp"
#include "tessera/runtime/error.hpp"
#include "tessera/tune/cache.hpp"
#include "tessera/tune/machine_profile.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

enum class Outcome { clear, crash, hang, accepted };

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::clear:
      return "clear error";
    case Outcome::crash:
      return "CRASH";
    case Outcome::hang:
      return "HANG";
    case Outcome::accepted:
      return "ACCEPTED";
  }
  return "?";
}

struct Row {
  int tried = 0, clear = 0, crash = 0, hang = 0, accepted = 0;
  std::vector<std::string> bad;  // "name: outcome (detail)"
};

// Table in first-use order.
std::vector<std::pair<std::string, Row>>& table() {
  static std::vector<std::pair<std::string, Row>> t;
  return t;
}

void record(const std::string& group, const std::string& name, Outcome o, const std::string& detail) {
  auto& t = table();
  auto it = std::find_if(t.begin(), t.end(), [&](const auto& r) { return r.first == group; });
  if (it == t.end()) it = t.insert(t.end(), {group, Row{}});
  Row& r = it->second;
  ++r.tried;
  switch (o) {
    case Outcome::clear:
      ++r.clear;
      break;
    case Outcome::crash:
      ++r.crash;
      break;
    case Outcome::hang:
      ++r.hang;
      break;
    case Outcome::accepted:
      ++r.accepted;
      break;
  }
  if (o != Outcome::clear) r.bad.push_back(name + ": " + outcome_name(o) + (detail.empty() ? "" : " (" + detail + ")"));
}

bool report_only() {
  const char* v = std::getenv("TESSERA_BAD_INPUT_REPORT_ONLY");
  return v && *v && std::string(v) != "0";
}

/// Prints the group's row and fails on anything but clear errors.
void check_group(const std::string& group) {
  for (const auto& [g, r] : table()) {
    if (g != group) continue;
    std::printf("%-28s tried %3d  clear %3d  crash %2d  hang %2d  accepted %2d\n", g.c_str(), r.tried, r.clear, r.crash,
                r.hang, r.accepted);
    for (const auto& b : r.bad) std::printf("    %s\n", b.c_str());
    if (!report_only()) {
      EXPECT_EQ(r.crash, 0) << group;
      EXPECT_EQ(r.hang, 0) << group;
      EXPECT_EQ(r.accepted, 0) << group;
    }
  }
}

// ---- child processes ----------------------------------------------------------

struct Exit {
  bool timed_out = false;
  bool signaled = false;
  int code = 0;  // exit code or signal
  std::string out, err;
  double secs = 0;
};

/// Runs argv with a time limit, capturing stdout and stderr (to files: no pipe deadlock).
Exit spawn(const std::vector<std::string>& args, double limit_s, const fs::path& scratch) {
  const fs::path out = scratch / "stdout", err = scratch / "stderr";
  const auto t0 = Clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1);
    ::dup2(e, 2);
    const int in = ::open("/dev/null", O_RDONLY);
    ::dup2(in, 0);
    std::vector<char*> argv;
    std::vector<std::string> copy = args;
    for (auto& s : copy) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  Exit x;
  int status = 0;
  for (;;) {
    if (::waitpid(pid, &status, WNOHANG) == pid) break;
    if (std::chrono::duration<double>(Clock::now() - t0).count() > limit_s) {
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      x.timed_out = true;
      break;
    }
    ::usleep(5000);
  }
  x.secs = std::chrono::duration<double>(Clock::now() - t0).count();
  x.signaled = WIFSIGNALED(status);
  x.code = x.signaled ? WTERMSIG(status) : WEXITSTATUS(status);
  auto slurp = [](const fs::path& p) {
    std::ifstream in(p);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return s.size() > 4000 ? s.substr(0, 4000) : s;
  };
  x.out = slurp(out);
  x.err = slurp(err);
  return x;
}

std::string first_line(const std::string& s) {
  const auto i = s.find('\n');
  return s.substr(0, std::min<std::size_t>(i, 160));
}

// Library calls: 0 = clear (refused or ignored as required), 10 = accepted,
// 11 = an exception that is not a tessera::Error.
constexpr int kClear = 0, kAccepted = 10, kForeign = 11;

Outcome in_child(const std::function<bool()>& refused, double limit_s, std::string* detail) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (std::freopen("/dev/null", "w", stderr) == nullptr) ::_exit(3);  // warnings of ignored files
    int rc = kAccepted;
    try {
      rc = refused() ? kClear : kAccepted;
    } catch (const tessera::Error&) {
      rc = kClear;
    } catch (...) {
      rc = kForeign;
    }
    ::_exit(rc);
  }
  const auto t0 = Clock::now();
  int status = 0;
  for (;;) {
    if (::waitpid(pid, &status, WNOHANG) == pid) break;
    if (std::chrono::duration<double>(Clock::now() - t0).count() > limit_s) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return Outcome::hang;
    }
    ::usleep(2000);
  }
  if (WIFSIGNALED(status)) {
    *detail = std::string("signal ") + strsignal(WTERMSIG(status));
    return Outcome::crash;
  }
  if (WEXITSTATUS(status) == kForeign) {
    *detail = "an exception that is not a tessera::Error";
    return Outcome::crash;
  }
  return WEXITSTATUS(status) == kClear ? Outcome::clear : Outcome::accepted;
}

struct TempDir {
  fs::path p;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "tessera_bad_XXXXXX").string();
    p = ::mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(p, ec);
  }
};

void write_file(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

std::string cli_path() {
  if (const char* v = std::getenv("TESSERA_BAD_INPUT_CLI"); v && *v) return v;
  return TESSERA_CLI_PATH;
}

// A CLI case: `tessera plan ARGS` must fail with a message (or, for
// `bounded`, finish within the limit having said it stopped at its budget).
struct CliCase {
  std::string name;
  std::vector<std::string> args;
  bool bounded = false;
};

void run_cli_cases(const std::string& group, const std::vector<CliCase>& cases, const fs::path& scratch) {
  for (const auto& c : cases) {
    std::vector<std::string> argv{cli_path(), "plan"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    const double limit = 40;
    const Exit x = spawn(argv, limit, scratch);
    Outcome o;
    std::string detail;
    if (x.timed_out) {
      o = Outcome::hang;
      detail = "killed after " + std::to_string(static_cast<int>(limit)) + " s";
    } else if (x.signaled) {
      o = Outcome::crash;
      detail = std::string("signal ") + strsignal(x.code) + ": " + first_line(x.err);
    } else if (c.bounded) {
      const bool said = x.out.find("stopped at the --budget-s") != std::string::npos;
      o = said || x.code != 0 ? Outcome::clear : Outcome::accepted;
      detail = "exit " + std::to_string(x.code) + " after " + std::to_string(x.secs).substr(0, 4) + " s";
    } else if (x.code == 0) {
      o = Outcome::accepted;
      detail = first_line(x.out);
    } else {
      o = x.err.empty() ? Outcome::accepted : Outcome::clear;  // a failure must say why
      detail = first_line(x.err);
    }
    record(group, c.name, o, detail);
  }
}

// ---- CommIR files ---------------------------------------------------------------

const std::string kGemm = R"(grid gemm {
  mesh 2
  dtype bf16
  axis m = 64 spatial
  axis n = 32 spatial
  axis k = 16 reduction
  buffer A[m, k] : 1 read
  buffer B[k, n] : 1 read
  buffer C[m, n] : 1 write
  body C += A * B
  kernel gemm
  tile m 2
  tile n 2
  loop n0 = n#0 parallel 0
  loop m0 = m#0 shift n0
  shard A n0 along m0 loop
}
)";

std::string edit(std::string s, const std::string& from, const std::string& to) {
  const auto i = s.find(from);
  if (i == std::string::npos) {
    ADD_FAILURE() << "test bug: '" << from << "' not in the base grid";
    return s;
  }
  return s.replace(i, from.size(), to);
}

}  // namespace

TEST(BadInputs, CommirFilesThroughPlanFile) {
  TempDir d;
  const fs::path scratch = d.p;
  struct F {
    std::string name, text;
  };
  const std::string K = kGemm;
  std::vector<F> files = {
      {"empty file", ""},
      {"comment only", "# nothing\n"},
      {"header only (truncated)", "grid g {\n"},
      {"no closing brace", edit(K, "}\n", "")},
      {"truncated mid-line", K.substr(0, K.find("buffer B") + 12)},
      {"truncated body 'C +='", edit(edit(K, "body C += A * B", "body C +="), "  kernel gemm\n", "")},
      {"truncated body 'C += A *'", edit(K, "body C += A * B", "body C += A *")},
      {"no body", edit(edit(K, "  body C += A * B\n", ""), "  kernel gemm\n", "")},
      {"empty grid", "grid g {\n}\n"},
      {"tile n 0", edit(K, "tile n 2", "tile n 0")},
      {"A[m/0, k]", edit(K, "A[m, k]", "A[m/0, k]")},
      {"buffer A[] : 1 read", edit(K, "A[m, k]", "A[]")},
      {"extent 0", edit(K, "m = 64", "m = 0")},
      {"extent 2^64+", edit(K, "m = 64", "m = 99999999999999999999")},
      {"extents 2^32", edit(edit(edit(edit(edit(K, "m = 64", "m = 4294967296"), "n = 32", "n = 4294967296"), "k = 16",
                                      "k = 4294967296"),
                                 "  mesh 2\n", "  mesh 2x4\n"),
                            "kernel gemm", "kernel gemm")},
      {"group 2^40", edit(K, "A[m, k]", "A[m/1099511627776, k]")},
      {"elem 0", edit(K, "A[m, k] : 1", "A[m, k] : 0")},
      {"elem 2^40", edit(K, "A[m, k] : 1", "A[m, k] : 1099511627776")},
      {"factor level 2^40", edit(K, "m#0", "m#1099511627776")},
      {"parallel level 2^40", edit(K, "parallel 0", "parallel 1099511627776")},
      {"duplicate axis", edit(K, "  axis k = 16 reduction\n", "  axis k = 16 reduction\n  axis k = 8 reduction\n")},
      {"duplicate buffer",
       edit(K, "  buffer C[m, n] : 1 write\n", "  buffer C[m, n] : 1 write\n  buffer C[m, n] : 1 write\n")},
      {"buffer indexed by an unknown axis", edit(K, "B[k, n]", "B[k, z]")},
      {"buffer indexes one axis twice", edit(K, "C[m, n]", "C[m, m]")},
      {"body names an unknown buffer", edit(K, "body C += A * B", "body C += A * Z")},
      {"body writes a read buffer", edit(K, "body C += A * B", "body A += C * B")},
      {"buffer unused by the body",
       edit(K, "  buffer C[m, n] : 1 write\n", "  buffer C[m, n] : 1 write\n  buffer D[m, n] : 1 read\n")},
      {"add body ending in '+'",
       "grid add {\n  mesh 2\n  axis i = 64 spatial\n  buffer X1[i] : 1 read\n  buffer Y[i] : 1 write\n"
       "  body Y = X1 +\n}\n"},
      {"kernel does not match the body", edit(K, "kernel gemm", "kernel attention")},
      {"unknown kernel", edit(K, "kernel gemm", "kernel conv")},
      {"dtype f64", edit(K, "dtype bf16", "dtype f64")},
      {"duplicate mesh", edit(K, "  mesh 2\n", "  mesh 2\n  mesh 4\n")},
      {"duplicate tile of one axis", edit(K, "  tile n 2\n", "  tile n 2\n  tile n 2\n")},
      {"mesh 4096x4096x4096", edit(K, "mesh 2", "mesh 4096x4096x4096")},
      {"mesh 0", edit(K, "mesh 2", "mesh 0")},
      {"mesh 99999999999", edit(K, "mesh 2", "mesh 99999999999")},
      {"loop shifts itself", edit(K, "shift n0", "shift m0")},
      {"shift by an unknown loop", edit(K, "shift n0", "shift zz")},
      {"parallel level beyond the mesh", edit(K, "parallel 0", "parallel 3")},
      {"parallel extent differs from the mesh", edit(K, "mesh 2", "mesh 4")},
      {"factor covered by two loops", edit(K, "  shard A", "  loop m9 = m#0\n  shard A")},
      {"two loops on one mesh level",
       edit(edit(K, "loop m0 = m#0 shift n0", "loop m0 = m#0 parallel 0"), "  shard A n0 along m0 loop\n", "")},
      {"shard of an unknown buffer", edit(K, "shard A n0", "shard Z n0")},
      {"shard along an unknown loop", edit(K, "along m0 loop", "along zz loop")},
      {"shard on a sequential loop", edit(K, "shard A n0 along m0 loop", "shard A m0 along m axis")},
      {"duplicate placement",
       edit(K, "  shard A n0 along m0 loop\n", "  shard A n0 along m0 loop\n  replicate A n0\n")},
      {"replicate of an unknown buffer",
       edit(K, "  shard A n0 along m0 loop\n", "  shard A n0 along m0 loop\n  replicate Z n0\n")},
      {"1000 tile levels", edit(
                               K, "tile m 2",
                               "tile m 2" +
                                   [] {
                                     std::string s;
                                     for (int i = 0; i < 1000; ++i) s += " 1";
                                     return s;
                                   }())},
      {"text after the closing brace", K + "axis z = 4 spatial\n"},
      {"NUL and binary bytes", std::string("grid g {\n  axis m = 4 spatial\0\xff\xfe\n}\n", 35)},
      {"2 MiB of comments", K + std::string(2 << 20, '#')},
  };
  for (const auto& f : files) {
    const fs::path p = scratch / "case.cir";
    write_file(p, f.text);
    run_cli_cases("CommIR files via plan file", {{f.name, {"file", p.string()}}}, scratch);
  }
  // Files that are not regular files.
  const fs::path fifo = scratch / "fifo.cir";
  ::mkfifo(fifo.c_str(), 0600);
  run_cli_cases("CommIR files via plan file",
                {{"/dev/zero", {"file", "/dev/zero"}},
                 {"a FIFO", {"file", fifo.string()}},
                 {"a directory", {"file", scratch.string()}},
                 {"a missing file", {"file", (scratch / "no.cir").string()}}},
                scratch);
  check_group("CommIR files via plan file");
}

TEST(BadInputs, PlanArguments) {
  TempDir d;
  const fs::path deep = d.p / "deep.json", big = d.p / "big.json";
  write_file(deep, std::string(200000, '[') + std::string(200000, ']'));
  write_file(big, R"({"memory_gb": 80, "gemm_tflops": 700, "attention_tflops": 600, "gpus_per_node": 4294967304,
    "intra": {"p2p_gbps": 400, "coll_gbps": 400, "latency_us": 10}, "inter": {"p2p_gbps": 12, "coll_gbps": 12, "latency_us": 20}})");
  const std::vector<CliCase> cases = {
      {"--mesh 4096x4096x4096", {"gemm", "--mesh", "4096x4096x4096"}},
      {"--mesh 99999999999", {"gemm", "--mesh", "99999999999"}},
      {"--mesh 0", {"gemm", "--mesh", "0"}},
      {"--mesh ''", {"gemm", "--mesh", ""}},
      {"--mesh 2x", {"gemm", "--mesh", "2x"}},
      {"--mesh x2", {"gemm", "--mesh", "x2"}},
      {"--mesh -2", {"gemm", "--mesh", "-2"}},
      {"--mesh of 9 levels", {"gemm", "--mesh", "1x1x1x1x1x1x1x1x1"}},
      {"--mesh 2x2x2x2 (default budget)", {"gemm", "--mesh", "2x2x2x2"}, true},
      {"--mesh 2x2x2x2 --budget-s 1", {"gemm", "--mesh", "2x2x2x2", "--budget-s", "1"}, true},
      {"-m -n -k 2^32", {"gemm", "-m", "4294967296", "-n", "4294967296", "-k", "4294967296"}},
      {"-m 2^64+", {"gemm", "-m", "99999999999999999999"}},
      {"-m 0", {"gemm", "-m", "0"}},
      {"--top 0", {"gemm", "--top", "0", "--mesh", "2"}},
      {"--top -1", {"gemm", "--top", "-1", "--mesh", "2"}},
      {"mlp --top 0", {"mlp", "--top", "0", "--mesh", "2"}},
      {"--plan-steps -5", {"gemm", "--plan-steps", "-5", "--mesh", "2"}},
      {"--memory-gb -1", {"gemm", "--memory-gb", "-1", "--mesh", "2"}},
      {"--memory-gb nan", {"gemm", "--memory-gb", "nan", "--mesh", "2"}},
      {"--memory-gb 1e-9 (nothing fits)", {"gemm", "--memory-gb", "0.000000001", "--mesh", "2"}},
      {"--budget-s 0", {"gemm", "--budget-s", "0"}},
      {"--budget-s nan", {"gemm", "--budget-s", "nan"}},
      {"attention --kv-len -5", {"attention", "--kv-len", "-5", "--mesh", "2"}},
      {"attention --kv-heads 5", {"attention", "--heads", "32", "--kv-heads", "5", "--mesh", "2"}},
      {"attention --head-dim 2^40", {"attention", "--head-dim", "1099511627776", "--mesh", "2"}},
      {"mlp --tokens 2^50", {"mlp", "--tokens", "1125899906842624", "--mesh", "2"}},
      {"--machine tpu", {"gemm", "--machine", "tpu"}},
      {"--profile /dev/zero", {"gemm", "--profile", "/dev/zero", "--mesh", "2"}},
      {"--profile missing", {"gemm", "--profile", (d.p / "missing.json").string()}},
      {"--profile nested 200000 deep", {"gemm", "--profile", deep.string(), "--mesh", "2"}},
      {"--profile gpus_per_node 2^32+8", {"gemm", "--profile", big.string(), "--mesh", "2"}},
      {"--schedule nope", {"gemm", "--schedule", "nope", "--mesh", "2"}},
      {"--schedule tile(m,0)", {"gemm", "--schedule", "tile(m,0)", "--mesh", "2"}},
      {"--schedule tile(m,2^64+)", {"gemm", "--schedule", "tile(m,99999999999999999999)", "--mesh", "2"}},
      {"--schedule parallelize(m0,2^40)",
       {"gemm", "--schedule", "tile(m,2) parallelize(m0,1099511627776)", "--mesh", "2"}},
      {"--layout nope", {"gemm", "--layout", "nope", "--mesh", "2"}},
      {"file /dev/zero", {"file", "/dev/zero"}},
      {"file without a path", {"file"}},
      {"unknown option", {"gemm", "--bogus"}},
      {"unknown subcommand", {"bogus"}},
  };
  run_cli_cases("plan arguments", cases, d.p);
  check_group("plan arguments");
}

namespace {

// A cache file case: set up `dir` (and maybe the file), then the check
// returns true when the cache refused or ignored the bad data.
std::string cache_doc(const std::string& version, const std::string& entries = R"({"k": {"strategy": "sequential"}})") {
  return R"({"tessera_cache": "ops", "version": )" + version + R"(, "entries": )" + entries + "}";
}

bool cache_ignores(const fs::path& dir, tessera::tune::OnCorrupt policy = tessera::tune::OnCorrupt::Warn) {
  tessera::tune::Cache c("ops", 2, dir, policy);
  return !c.get("k").has_value();
}

bool refuses_strategy(const nlohmann::json& entry, const std::vector<tessera::ops::Strategy>& candidates) {
#ifdef TESSERA_BAD_INPUT_BEFORE
  (void)candidates;
  return !tessera::ops::choice_from_json(entry).has_value();
#else
  return !tessera::ops::choice_from_json(entry, candidates).has_value();
#endif
}

}  // namespace

TEST(BadInputs, CacheFiles) {
  using tessera::tune::OnCorrupt;
  struct C {
    std::string name;
    std::function<bool(const fs::path& dir)> refused;  // runs in the child
  };
  const auto file_with = [](const std::string& text) {
    return [text](const fs::path& dir) {
      write_file(dir / "ops.json", text);
      return cache_ignores(dir, OnCorrupt::Throw);
    };
  };
  const auto ignored_with = [](const std::string& text) {
    return [text](const fs::path& dir) {
      write_file(dir / "ops.json", text);
      return cache_ignores(dir, OnCorrupt::Warn);
    };
  };
  const std::vector<C> cases = {
      {"truncated JSON", file_with(cache_doc("2").substr(0, 40))},
      {"binary bytes", file_with(std::string("\x00\xff\xfe{[", 5))},
      {"top-level array", file_with("[1, 2, 3]")},
      {"another cache's name", file_with(R"({"tessera_cache": "plans", "version": 2, "entries": {"k": 1}})")},
      {"entries not an object", file_with(cache_doc("2", "[1, 2]"))},
      {"version a string", ignored_with(cache_doc("\"2\""))},
      {"version 2.5", ignored_with(cache_doc("2.5"))},
      {"version 2^32+2 (reads as 2?)", ignored_with(cache_doc("4294967298"))},
      {"version -2^32+2 (reads as 2?)", ignored_with(cache_doc("-4294967294"))},
      {"version 2^64+2", ignored_with(cache_doc("18446744073709551618"))},
      {"nested 100000 deep",
       ignored_with(cache_doc("2", R"({"k": )" + std::string(100000, '[') + std::string(100000, ']') + "}"))},
      {"nested 100000 deep (top level)", ignored_with(std::string(100000, '[') + std::string(100000, ']'))},
      {"file is a symlink to a valid cache",
       [](const fs::path& dir) {
         write_file(dir / "victim.json", cache_doc("2"));
         fs::create_symlink(dir / "victim.json", dir / "ops.json");
         return cache_ignores(dir);
       }},
      {"file is a symlink to /dev/zero",
       [](const fs::path& dir) {
         fs::create_symlink("/dev/zero", dir / "ops.json");
         return cache_ignores(dir);
       }},
      {"file is a FIFO",
       [](const fs::path& dir) {
         ::mkfifo((dir / "ops.json").c_str(), 0600);
         return cache_ignores(dir);
       }},
      {"file is a directory",
       [](const fs::path& dir) {
         fs::create_directory(dir / "ops.json");
         return cache_ignores(dir, OnCorrupt::Throw);
       }},
      {"file of 65 MiB",
       [](const fs::path& dir) {
         { std::ofstream(dir / "ops.json") << cache_doc("2"); }
         fs::resize_file(dir / "ops.json", std::uintmax_t{65} << 20);
         return cache_ignores(dir, OnCorrupt::Throw);
       }},
      {"cache directory is a symlink (write)",
       [](const fs::path& dir) {
         fs::create_directory(dir / "real");
         fs::create_symlink(dir / "real", dir / "link");
         tessera::tune::Cache c("ops", 2, dir / "link", OnCorrupt::Throw);
         c.put("k", 1);
         return !fs::exists(dir / "real" / "ops.json");
       }},
      {"predictable temporary file (symlink planted)",
       [](const fs::path& dir) {
         write_file(dir / "victim", "precious");
         fs::create_symlink(dir / "victim", dir / ("ops.json.tmp." + std::to_string(::getpid())));
         tessera::tune::Cache c("ops", 2, dir, OnCorrupt::Warn);
         c.put("k", 1);
         std::ifstream in(dir / "victim");
         std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
         return s == "precious";
       }},
      {"lock file is a symlink",
       [](const fs::path& dir) {
         write_file(dir / "victim", "precious");
         fs::create_symlink(dir / "victim", dir / "ops.json.lock");
         tessera::tune::Cache c("ops", 2, dir, OnCorrupt::Warn);
         c.put("k", 1);  // must refuse to lock through the link
         return false;
       }},
      {"strategy that is not a candidate (ring at R=2)",
       [](const fs::path&) {
         return refuses_strategy({{"strategy", "ring"}, {"times_ms", {{"ring", 1.0}, {"sequential", 2.0}}}},
                                 tessera::ops::gemm_rs_candidates(2));
       }},
      {"strategy absent from its own times",
       [](const fs::path&) {
         return refuses_strategy({{"strategy", "fused_sm"}, {"times_ms", {{"sequential", 2.0}}}},
                                 tessera::ops::gemm_rs_candidates(4));
       }},
      {"negative measured time",
       [](const fs::path&) {
         return refuses_strategy({{"strategy", "fused_sm"}, {"times_ms", {{"fused_sm", -1.0}, {"sequential", 2.0}}}},
                                 tessera::ops::gemm_rs_candidates(4));
       }},
      {"strategy 'auto'",
       [](const fs::path&) {
         return refuses_strategy({{"strategy", "auto"}}, tessera::ops::gemm_rs_candidates(4));
       }},
      {"strategy a number",
       [](const fs::path&) {
         return refuses_strategy({{"strategy", 5}}, tessera::ops::gemm_rs_candidates(4));
       }},
      {"machine profile world 2^32+2 (reads as 2?)",
       [](const fs::path& dir) {
         using tessera::tune::MachineProfile;
         MachineProfile p;
         p.machine = {"GPU", "NV", 2};
         p.sm_count = 132;
         p.nccl_sms = 16;
         p.per_group_overhead = 1e-6;
         p.curves[tessera::tune::Collective::AllGather] =
             tessera::tune::BandwidthCurve({{1 << 20, 1e-5}, {1 << 26, 3e-4}});
         p.gemms.push_back({4096, 4096, 4096, 128, 128, 1, 132, 1e-4, 1e-3});
         nlohmann::json j = p;
         j["world"] = 4294967298ULL;
         tessera::tune::Cache c("machine_profile", MachineProfile::kCacheVersion, dir);
         c.put(tessera::tune::key_prefix(p.machine, tessera::DType::bf16, "profile"), j);
         const auto back =
             MachineProfile::load(tessera::tune::Cache("machine_profile", MachineProfile::kCacheVersion, dir),
                                  p.machine, tessera::DType::bf16);
         return !back.has_value();
       }},
  };
  for (const auto& c : cases) {
    TempDir d;
    std::string detail;
    const Outcome o = in_child([&] { return c.refused(d.p); }, 20, &detail);
    record("cache files", c.name, o, detail);
  }
  check_group("cache files");
}

TEST(BadInputs, CApi) {
  struct C {
    std::string name;
    std::function<int()> call;  // the C call's return code; -1 with a message is a clear error
  };
  char buf[256] = {};
  tessera_session* out = nullptr;
  const std::int64_t huge = std::int64_t{1} << 40;
  const std::vector<C> cases = {
      {"ag_gemm m = -1", [&] { return tessera_ag_gemm(nullptr, buf, buf, buf, -1, 0, 8, 8, 0, 0, 0, 0); }},
      {"ag_gemm m = 2^40", [&] { return tessera_ag_gemm(nullptr, buf, buf, buf, huge, 0, 8, 8, 0, 0, 0, 0); }},
      {"ag_gemm ldd = -8", [&] { return tessera_ag_gemm(nullptr, buf, buf, buf, 8, 8, 8, 8, -8, 0, 0, 0); }},
      {"ag_gemm strategy 99", [&] { return tessera_ag_gemm(nullptr, buf, buf, buf, 8, 8, 8, 8, 0, 0, 0, 99); }},
      {"gemm_rs m_local = -1", [&] { return tessera_gemm_rs(nullptr, buf, buf, buf, 8, -1, 8, 8, 0, 0); }},
      {"gemm_rs n = 2^40", [&] { return tessera_gemm_rs(nullptr, buf, buf, buf, 8, 8, huge, 8, 0, 0); }},
      {"ag_gemm flags 0x10", [&] { return tessera_ag_gemm(nullptr, buf, buf, buf, 8, 8, 8, 8, 0, 0, 16, 0); }},
      {"gemm_rs_ex2 flags 0x1",
       [&] { return tessera_gemm_rs_ex2(nullptr, nullptr, buf, buf, buf, 8, 8, 8, 8, 0, 0, 1); }},
      {"gemm_ar k = 2^62", [&] { return tessera_gemm_ar(nullptr, buf, buf, buf, 8, 8, std::int64_t{1} << 62, 0, 0); }},
      {"gemm_ar dtype 7", [&] { return tessera_gemm_ar(nullptr, buf, buf, buf, 8, 8, 8, 7, 0); }},
      {"mlp i_local = 2^62",
       [&] { return tessera_mlp(nullptr, buf, buf, buf, buf, 8, 8, 8, std::int64_t{1} << 62, 0, 0, 0); }},
      {"mlp h = -8", [&] { return tessera_mlp(nullptr, buf, buf, buf, buf, 8, 8, -8, 8, 0, 0, 0); }},
      {"resolve with a null out",
       [&] { return tessera_resolve(nullptr, 0, 8, 8, 8, 8, 0, 0, buf, buf, buf, nullptr); }},
      {"session_create world 0", [&] { return tessera_session_create(0, 0, 0, 1, 0, "127.0.0.1", 29500, &out); }},
      {"session_create rank 5 of 2", [&] { return tessera_session_create(5, 2, 0, 1, 0, "127.0.0.1", 29500, &out); }},
      {"session_create world 2^31-1",
       [&] { return tessera_session_create(0, 2147483647, 0, 1, 0, "127.0.0.1", 0, &out); }},
      {"session_create null address", [&] { return tessera_session_create(0, 1, 0, 1, 0, nullptr, 29500, &out); }},
      {"session_create port 70000", [&] { return tessera_session_create(0, 1, 0, 1, 0, "127.0.0.1", 70000, &out); }},
      {"session_create local rank 3 of 2",
       [&] { return tessera_session_create(0, 1, 3, 2, 0, "127.0.0.1", 29500, &out); }},
      {"session_create null out", [&] { return tessera_session_create(0, 1, 0, 1, 0, "127.0.0.1", 29500, nullptr); }},
  };
  for (const auto& c : cases) {
    std::string detail;
    const Outcome o = in_child(
        [&] {
          const int rc = c.call();
          return rc == -1 && tessera_last_error() != nullptr && *tessera_last_error() != '\0';
        },
        20, &detail);
    record("C API", c.name, o, detail);
  }
  check_group("C API");
}

TEST(BadInputs, OpsValidation) {
  using namespace tessera::ops;
  const auto ag = [] {
    AgGemmArgs a;
    a.a = reinterpret_cast<const void*>(0x1000);
    a.b = reinterpret_cast<const void*>(0x2000);
    a.d = reinterpret_cast<void*>(0x3000);
    a.m = 8192;
    a.m_local = 4096;
    a.n = 4096;
    a.k = 4096;
    return a;
  };
  const auto mlp = [] {
    MlpArgs m;
    m.x = reinterpret_cast<const void*>(0x1000);
    m.w_gate_up = reinterpret_cast<const void*>(0x2000);
    m.w_down = reinterpret_cast<const void*>(0x3000);
    m.out = reinterpret_cast<void*>(0x4000);
    m.m = 8192;
    m.m_local = 4096;
    m.h = 4096;
    m.i_local = 5504;
    return m;
  };
  struct C {
    std::string name;
    std::function<void()> call;  // must throw tessera::Error
  };
  const std::vector<C> cases = {
      {"lda = 2^40",
       [&] {
         auto a = ag();
         a.lda = std::int64_t{1} << 40;
         validate(a, 0, 2);
       }},
      {"ldd = 2^62",
       [&] {
         auto a = ag();
         a.ldd = std::int64_t{1} << 62;
         validate(a, 0, 2);
       }},
      {"gemm_rs ldb = 2^31 (B bytes past 2^48)",
       [&] {
         GemmRsArgs r;
         r.a = r.b = reinterpret_cast<const void*>(0x1000);
         r.d = reinterpret_cast<void*>(0x2000);
         r.m = 8192, r.m_local = 4096, r.n = 4096 * 64, r.k = 4096, r.ldb = (std::int64_t{1} << 31) - 8;
         validate(r, 0, 2);
       }},
      {"mlp I/R = 2^62 (2*I/R overflows)",
       [&] {
         auto m = mlp();
         m.i_local = std::int64_t{1} << 62;
         validate(m, 0, 2);
       }},
      {"mlp H = 2^40",
       [&] {
         auto m = mlp();
         m.h = std::int64_t{1} << 40;
         validate(m, 0, 2);
       }},
      {"ldd = -8",
       [&] {
         auto a = ag();
         a.ldd = -8;
         validate(a, 0, 2);
       }},
      {"lda not a multiple of 8",
       [&] {
         auto a = ag();
         a.lda = 4100;
         validate(a, 0, 2);
       }},
      {"K = 2^40",
       [&] {
         auto a = ag();
         a.k = std::int64_t{1} << 40;
         validate(a, 0, 2);
       }},
      {"M = 2^40",
       [&] {
         auto a = ag();
         a.m = std::int64_t{1} << 40;
         validate(a, 0, 2);
       }},
  };
  for (const auto& c : cases) {
    std::string detail;
    const Outcome o = in_child(
        [&] {
          c.call();
          return false;  // no error: accepted
        },
        20, &detail);
    record("ops validation", c.name, o, detail);
  }
  check_group("ops validation");
}

TEST(BadInputs, Summary) {
  std::printf("\n| group | tried | clear error | crash | hang | accepted silently |\n|---|---|---|---|---|---|\n");
  for (const auto& [g, r] : table())
    std::printf("| %s | %d | %d | %d | %d | %d |\n", g.c_str(), r.tried, r.clear, r.crash, r.hang, r.accepted);
}
