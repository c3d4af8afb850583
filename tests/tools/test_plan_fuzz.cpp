// Seeded, time-bounded fuzzing of the CommIR parser, validation, lowering,
// the schedule search and `tessera plan`'s argument handling, in-process.
//
// Per run: at least kTexts generated and mutated CommIR texts and kArgLists
// generated and mutated `plan` argument lists (TESSERA_FUZZ_SEED picks the
// seed, default 24; TESSERA_FUZZ_SCALE multiplies the counts). Every input
// must either work or throw tessera::Error. The inputs run in a forked child:
// a signal there is a crash, an input past kPerInputS seconds (SIGALRM) a
// hang; both are reported with the input that caused them.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "fuzz_plan.hpp"
#include "tessera/commir/schedules.hpp"

namespace {

using namespace tessera::commir;
namespace fs = std::filesystem;

constexpr int kTexts = 10000, kArgLists = 10000;
constexpr unsigned kPerInputS = 5;  // per-input deadline (alarm)
constexpr int kTotalLimitS = 240;   // the whole child, generous for a loaded CI machine

// Shared with the child: the input being run, and the tallies.
struct Shared {
  int texts = 0, arg_lists = 0, accepted = 0, rejected = 0, bugs = 0;
  char current[8192];
  char bug[8][1024];
};

void set_current(Shared* sh, const std::string& what) {
  const std::size_t n = std::min(what.size(), sizeof sh->current - 1);
  std::memcpy(sh->current, what.data(), n);
  sh->current[n] = '\0';
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + ("'" + x + "'");
  return s;
}

// ---- generation -------------------------------------------------------------

const std::vector<std::string> kNumbers = {"0",
                                           "1",
                                           "2",
                                           "3",
                                           "4",
                                           "7",
                                           "8",
                                           "16",
                                           "64",
                                           "4096",
                                           "65536",
                                           "2147483647",
                                           "2147483648",
                                           "4294967296",
                                           "4294967298",
                                           "1099511627776",
                                           "1099511627777",
                                           "9223372036854775807",
                                           "9223372036854775808",
                                           "18446744073709551616",
                                           "99999999999999999999999",
                                           "-1",
                                           "-0",
                                           "00",
                                           "1e3",
                                           "0x10",
                                           "",
                                           " ",
                                           "nan"};

struct Gen {
  std::mt19937_64 rng;
  explicit Gen(std::uint64_t seed) : rng(seed) {}
  std::size_t below(std::size_t n) { return n ? static_cast<std::size_t>(rng() % n) : 0; }
  bool chance(int percent) { return static_cast<int>(below(100)) < percent; }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[below(v.size())];
  }
  std::string number() { return chance(60) ? std::to_string(1 + below(chance(50) ? 8 : 300)) : pick(kNumbers); }
  std::string name() {
    static const std::vector<std::string> n = {"m",  "n",  "k",  "q",   "kv", "h",  "b",  "A", "B",
                                               "C",  "Q",  "K",  "V",   "O",  "X1", "X2", "Y", "m0",
                                               "n0", "k0", "q0", "kv0", "h0", "m1", "q1", "x"};
    return pick(n);
  }
};

/// Valid starting points: bare operators and every named schedule on small meshes.
std::vector<std::string> seed_corpus() {
  std::vector<std::string> c;
  for (auto mesh : std::vector<std::vector<int>>{{2}, {4}, {2, 2}, {2, 4}}) {
    const Grid gm = make_gemm(64, 32, 16, mesh);
    const Grid ga = make_attention(2, 8, 2, 32, 24, 16, mesh);
    c.push_back(print(gm));
    c.push_back(print(ga));
    for (const auto& n : schedule_names("gemm", static_cast<int>(mesh.size()))) c.push_back(print(scheduled(gm, n)));
    for (const auto& n : schedule_names("attention", static_cast<int>(mesh.size())))
      c.push_back(print(scheduled(ga, n)));
  }
  c.push_back(
      "grid add {\n  mesh 2\n  axis i = 64 spatial\n  buffer X1[i] : 4 read\n  buffer X2[i] : 4 read\n"
      "  buffer Y[i] : 4 write\n  body Y = X1 + X2\n}\n");
  return c;
}

/// A grammar-based grid: random statements, mostly well-formed.
std::string generate_text(Gen& g) {
  std::string s = "grid " + (g.chance(95) ? g.name() : g.number()) + " {\n";
  const int lines = static_cast<int>(g.below(14));
  for (int i = 0; i < lines; ++i) {
    switch (g.below(10)) {
      case 0:
        s += "  mesh " + g.number() + (g.chance(50) ? "x" + g.number() : "") + "\n";
        break;
      case 1:
        s += std::string("  dtype ") + (g.chance(80) ? "bf16" : "f64") + "\n";
        break;
      case 2:
        s += "  axis " + g.name() + " = " + g.number() + (g.chance(50) ? " spatial" : " reduction") + "\n";
        break;
      case 3: {
        s += "  buffer " + g.name() + "[";
        const int d = static_cast<int>(g.below(4));
        for (int j = 0; j < d; ++j) s += (j ? ", " : "") + g.name() + (g.chance(15) ? "/" + g.number() : "");
        s += "] : " + g.number() + (g.chance(60) ? " read" : " write") + "\n";
        break;
      }
      case 4:
        s += g.chance(40)   ? "  body " + g.name() + " += " + g.name() + " * " + g.name() + "\n"
             : g.chance(50) ? "  body " + g.name() + " = attend(" + g.name() + ", " + g.name() + ", " + g.name() + ")\n"
                            : "  body " + g.name() + " = " + g.name() + " + " + g.name() + "\n";
        break;
      case 5:
        s += "  kernel " + std::string(g.chance(80) ? "gemm" : "attention") + "\n";
        break;
      case 6:
        s += "  tile " + g.name() + " " + g.number() + (g.chance(30) ? " " + g.number() : "") + "\n";
        break;
      case 7:
        s += "  loop " + g.name() + " = " + g.name() + "#" + g.number() +
             (g.chance(20) ? " * " + g.name() + "#" + g.number() : "") +
             (g.chance(40) ? " parallel " + g.number() : "") + (g.chance(20) ? " shift " + g.name() : "") + "\n";
        break;
      case 8:
        s += "  shard " + g.name() + " " + g.name() + " along " + g.name() + (g.chance(50) ? " loop" : " axis") + "\n";
        break;
      default:
        s += "  replicate " + g.name() + " " + g.name() + "\n";
        break;
    }
  }
  return s + (g.chance(95) ? "}\n" : "");
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t j = s.find('\n', i);
    out.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return out;
}

/// One to three random edits of a text: numbers, names, lines, bytes.
std::string mutate_text(Gen& g, std::string s) {
  const int edits = 1 + static_cast<int>(g.below(3));
  for (int e = 0; e < edits; ++e) {
    switch (g.below(9)) {
      case 0: {  // replace a number
        std::vector<std::size_t> at;
        for (std::size_t i = 0; i < s.size(); ++i)
          if (std::isdigit(static_cast<unsigned char>(s[i])) &&
              (i == 0 || !std::isalnum(static_cast<unsigned char>(s[i - 1]))))
            at.push_back(i);
        if (at.empty()) break;
        const std::size_t i = at[g.below(at.size())];
        std::size_t j = i;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
        s.replace(i, j - i, g.pick(kNumbers));
        break;
      }
      case 1: {  // replace a name (a word that starts with a letter) by another
        std::vector<std::size_t> at;
        for (std::size_t i = 0; i < s.size(); ++i)
          if (std::isalpha(static_cast<unsigned char>(s[i])) &&
              (i == 0 || !std::isalnum(static_cast<unsigned char>(s[i - 1]))))
            at.push_back(i);
        if (at.empty()) break;
        const std::size_t i = at[g.below(at.size())];
        std::size_t j = i;
        while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
        s.replace(i, j - i, g.name());
        break;
      }
      case 2:
      case 3: {  // delete, duplicate or swap lines
        auto lines = split_lines(s);
        if (lines.size() < 2) break;
        const std::size_t a = g.below(lines.size()), b = g.below(lines.size());
        const int op = static_cast<int>(g.below(3));
        if (op == 0)
          lines.erase(lines.begin() + static_cast<long>(a));
        else if (op == 1)
          lines.insert(lines.begin() + static_cast<long>(a), lines[b]);
        else
          std::swap(lines[a], lines[b]);
        s.clear();
        for (const auto& l : lines) s += l + "\n";
        break;
      }
      case 4:
        s.resize(g.below(s.size() + 1));
        break;   // truncate
      case 5: {  // random bytes
        const int n = 1 + static_cast<int>(g.below(4));
        for (int i = 0; i < n; ++i) {
          static const std::string punct = "[](),=:*+/#{}x \n\t\r\x01\xff-.";
          const char c = g.chance(70) ? punct[g.below(punct.size())] : static_cast<char>(g.below(256));
          s.insert(s.begin() + static_cast<long>(g.below(s.size() + 1)), c);
        }
        break;
      }
      case 6: {  // delete a short span
        if (s.empty()) break;
        const std::size_t i = g.below(s.size());
        s.erase(i, 1 + g.below(8));
        break;
      }
      case 7: {  // insert a generated statement line
        const auto lines = split_lines(generate_text(g));
        if (lines.size() > 2) {
          auto ls = split_lines(s);
          ls.insert(ls.begin() + static_cast<long>(g.below(ls.size() + 1)), lines[1 + g.below(lines.size() - 2)]);
          s.clear();
          for (const auto& l : ls) s += l + "\n";
        }
        break;
      }
      default: {  // repeat a line many times (size limits)
        auto lines = split_lines(s);
        if (lines.empty()) break;
        const std::string l = lines[g.below(lines.size())];
        const int n = g.chance(90) ? 20 : 2000;
        std::string add;
        for (int i = 0; i < n; ++i) add += l + "\n";
        s += add;
        break;
      }
    }
  }
  return s;
}

const std::vector<std::string> kMeshes = {"2",           "4",
                                          "2x2",         "2x4",
                                          "1",           "8",
                                          "0",           "2x0",
                                          "x",           "2x",
                                          "x2",          "",
                                          "2x2x2x2",     "4096x4096x4096",
                                          "99999999999", "4096",
                                          "16x16",       "2x2x2x2x2x2x2x2x2",
                                          "-2",          "2x-2",
                                          "3",           "1x1x1"};

/// A `plan` argument list: a subcommand and options with assorted values.
std::vector<std::string> generate_args(Gen& g, const std::vector<std::string>& files) {
  static const std::vector<std::string> subs = {"gemm", "attention", "file", "mlp", "profiles", "bogus", "--help"};
  std::vector<std::string> a;
  if (g.chance(97)) a.push_back(g.pick(subs));
  const std::string sub = a.empty() ? "" : a[0];
  if (sub == "file" && g.chance(95)) a.push_back(g.pick(files));
  const int n = static_cast<int>(g.below(5));
  for (int i = 0; i < n; ++i) {
    static const std::vector<std::string> opts = {
        "--mesh",      "--machine",    "--profile",      "--schedule", "--layout", "--top",
        "--memory-gb", "--plan-steps", "--budget-s",     "-m",         "-n",       "-k",
        "--batch",     "--heads",      "--kv-heads",     "--seq",      "--kv-len", "--head-dim",
        "--tokens",    "--hidden",     "--intermediate", "--bogus"};
    const std::string o = g.pick(opts);
    a.push_back(o);
    if (o == "--mesh")
      a.push_back(g.chance(70) ? g.pick(std::vector<std::string>{"2", "4", "2x2", "1"}) : g.pick(kMeshes));
    else if (o == "--machine")
      a.push_back(g.pick(std::vector<std::string>{"h100", "h200x2", "a100", "l4", "tpu", ""}));
    else if (o == "--profile")
      a.push_back(g.pick(files));
    else if (o == "--schedule" || o == "--layout")
      a.push_back(g.pick(std::vector<std::string>{"ring", "ag_gemm", "gemm_rs", "cp", "ulysses", "usp", "nope",
                                                  "tile(m,2) parallelize(m0,0) patch(gemm)", "tile(m,0)",
                                                  "tile(q,99999999999999999999)", "patch(", "tile(m,2)) x(", ""}));
    else if (o == "--budget-s" || o == "--memory-gb")
      a.push_back(g.pick(std::vector<std::string>{"0.01", "0", "-1", "nan", "inf", "1e308", "abc", "0.001", "1"}));
    else if (o != "--bogus")
      a.push_back(g.number());
  }
  if (g.chance(5) && !a.empty()) a.erase(a.begin() + static_cast<long>(g.below(a.size())));  // drop a token
  return a;
}

// ---- running ----------------------------------------------------------------

template <class F>
void run_one(Shared* sh, const std::string& what, F&& f) {
  set_current(sh, what);
  ::alarm(kPerInputS);
  try {
    f();
    ++sh->accepted;
  } catch (const tessera::Error&) {
    ++sh->rejected;
  } catch (const std::exception& e) {
    if (sh->bugs < 8)
      std::snprintf(sh->bug[sh->bugs], sizeof sh->bug[0], "%s: %s\n--- input ---\n%.700s", typeid(e).name(), e.what(),
                    what.c_str());
    ++sh->bugs;
  } catch (...) {
    if (sh->bugs < 8) std::snprintf(sh->bug[sh->bugs], sizeof sh->bug[0], "unknown exception\n%.700s", what.c_str());
    ++sh->bugs;
  }
  ::alarm(0);
}

void fuzz_child(Shared* sh, std::uint64_t seed, int texts, int arg_lists, const fs::path& dir) {
  Gen g(seed);
  std::FILE* null_out = std::fopen("/dev/null", "w");
  std::FILE* saved_stderr = stderr;
  (void)saved_stderr;
  const auto corpus = seed_corpus();
  // Files for `plan file` and `--profile`: corpus texts, mutated texts, JSON.
  std::vector<std::string> files;
  auto write = [&](const std::string& name, const std::string& text) {
    const fs::path p = dir / name;
    std::ofstream(p, std::ios::binary) << text;
    files.push_back(p.string());
  };
  for (std::size_t i = 0; i < corpus.size(); ++i) write("c" + std::to_string(i) + ".cir", corpus[i]);
  write("deep.json", std::string(100000, '[') + std::string(100000, ']'));
  write("big_int.json", R"({"memory_gb": 80, "gemm_tflops": 700, "attention_tflops": 600, "gpus_per_node": 4294967304,
    "intra": {"p2p_gbps": 400, "coll_gbps": 400, "latency_us": 10}, "inter": {"p2p_gbps": 12, "coll_gbps": 12, "latency_us": 20}})");
  write("ok.json", tessera::commir::profile_json(builtin_profile("h100")));
  write("notjson.json", "{ memory_gb: ");
  files.push_back("/dev/zero");
  files.push_back("/dev/null");
  files.push_back(dir.string());
  files.push_back((dir / "missing.cir").string());
  const std::size_t fixed_files = files.size();
  const fs::path mutated = dir / "mutated.cir";

  // CommIR texts: half mutated corpus entries, a quarter generated, a quarter generated then mutated.
  for (int i = 0; i < texts; ++i) {
    std::string t;
    const auto kind = g.below(4);
    if (kind <= 1)
      t = mutate_text(g, g.pick(corpus));
    else if (kind == 2)
      t = generate_text(g);
    else
      t = mutate_text(g, generate_text(g));
    const bool search = g.chance(3);
    run_one(sh, t, [&] { tessera::fuzz::one_text(t, search); });
    ++sh->texts;
    if (i % 50 == 0) {  // the same text through `plan file`
      std::ofstream(mutated, std::ios::binary | std::ios::trunc) << t;
      const std::vector<std::string> args{"file", mutated.string(), "--budget-s", "0.005", "--top", "2"};
      run_one(sh, "plan " + join(args) + "\n--- file ---\n" + t, [&] { tessera::fuzz::one_args(args, null_out); });
    }
  }
  // Argument lists: generated, and mutated by the same generator's tokens.
  std::vector<std::string> mutated_files = files;
  mutated_files.resize(fixed_files);
  mutated_files.push_back(mutated.string());
  for (int i = 0; i < arg_lists; ++i) {
    std::vector<std::string> a = generate_args(g, mutated_files);
    if (std::find(a.begin(), a.end(), "--budget-s") == a.end()) {
      // Keep searches short (the default budget is tested by test_bad_inputs).
      a.push_back("--budget-s");
      a.push_back("0.005");
    }
    run_one(sh, "plan " + join(a), [&] { tessera::fuzz::one_args(a, null_out); });
    ++sh->arg_lists;
  }
  std::fclose(null_out);
}

std::uint64_t env_u64(const char* name, std::uint64_t def) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : def;
}

}  // namespace

TEST(PlanFuzz, TextsAndArgumentsWorkOrRaiseTesseraError) {
  const std::uint64_t seed = env_u64("TESSERA_FUZZ_SEED", 24);
  const int scale = static_cast<int>(std::max<std::uint64_t>(1, env_u64("TESSERA_FUZZ_SCALE", 1)));
  const int texts = kTexts * scale, arg_lists = kArgLists * scale;
  const fs::path dir = fs::temp_directory_path() / ("tessera_fuzz_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  void* mem = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* sh = new (mem) Shared{};
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Warnings of ignored files would flood the log: the child's stderr goes away.
    if (std::FILE* f = std::freopen("/dev/null", "w", stderr); f == nullptr) ::_exit(3);
    fuzz_child(sh, seed, texts, arg_lists, dir);
    ::_exit(0);
  }
  int status = 0;
  bool killed = false;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(kTotalLimitS)) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      killed = true;
      break;
    }
    ::usleep(20000);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::error_code ec;
  fs::remove_all(dir, ec);
  std::printf("plan fuzz: seed %llu, %d texts, %d argument lists in %.1f s: %d worked, %d tessera::Error, %d other\n",
              static_cast<unsigned long long>(seed), sh->texts, sh->arg_lists, secs, sh->accepted, sh->rejected,
              sh->bugs);
  const std::string current = sh->current;
  EXPECT_FALSE(killed) << "the fuzz run passed " << kTotalLimitS << " s; last input:\n" << current;
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    ADD_FAILURE() << (sig == SIGALRM ? "hang: an input ran past " + std::to_string(kPerInputS) + " s"
                                     : std::string("crash: signal ") + strsignal(sig))
                  << " on input:\n"
                  << current;
  } else if (!killed) {
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  for (int i = 0; i < std::min(sh->bugs, 8); ++i) ADD_FAILURE() << "not a tessera::Error: " << sh->bug[i];
  EXPECT_EQ(sh->bugs, 0);
  EXPECT_GE(sh->texts, texts);
  EXPECT_GE(sh->arg_lists, arg_lists);
  ::munmap(mem, sizeof(Shared));
}
