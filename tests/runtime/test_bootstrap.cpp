// Bootstrap over loopback with real processes (fork): collectives with
// contents checked on every rank, and every failure mode giving an error that
// names the culprit rank within the timeout instead of a hang.
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../../src/runtime/hmac.hpp"
#include "tessera/runtime/bootstrap.hpp"
#include "tessera/runtime/error.hpp"

namespace {

using namespace std::chrono_literals;
using tessera::runtime::Bootstrap;
using tessera::runtime::LaunchInfo;
using Clock = std::chrono::steady_clock;

LaunchInfo info(int rank, int world, int port, const std::string& secret = "") {
  LaunchInfo li;
  li.job_secret = secret;
  li.secret_source = secret.empty() ? "" : "the test's secret";
  li.rank = rank;
  li.world = world;
  li.local_rank = rank;
  li.local_world = world;
  li.master_addr = "127.0.0.1";
  li.master_port = port;
  li.source = "test";
  return li;
}

/// What one forked rank reported: "" = success, otherwise its failure text.
struct Outcome {
  std::string text;
  bool ok() const { return text.empty(); }
  bool says(const std::string& s) const { return text.find(s) != std::string::npos; }
};

/// Runs body(rank) in `world` forked processes and collects what each
/// reports (body returns "" for success or a failure description; a thrown
/// tessera::Error becomes "Error: <what>"). Kills everything still running
/// after `limit` and reports it as "HANG". `spawn_delay(rank)` staggers starts.
std::vector<Outcome> run_ranks(int world, const std::function<std::string(int)>& body,
                               std::chrono::milliseconds limit = 30s,
                               const std::function<std::chrono::milliseconds(int)>& spawn_delay = nullptr) {
  std::vector<pid_t> pids(world, -1);
  std::vector<int> fds(world, -1);
  for (int r = 0; r < world; ++r) {
    if (spawn_delay) std::this_thread::sleep_for(spawn_delay(r));
    int p[2];
    if (::pipe(p) != 0) std::abort();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      std::string result;
      try {
        result = body(r);
      } catch (const tessera::Error& e) {
        result = std::string("Error: ") + e.what();
      } catch (const std::exception& e) {
        result = std::string("std::exception: ") + e.what();
      }
      std::size_t off = 0;
      while (off < result.size()) {
        const ssize_t k = ::write(p[1], result.data() + off, result.size() - off);
        if (k <= 0) break;
        off += static_cast<std::size_t>(k);
      }
      ::_exit(result.empty() ? 0 : 1);
    }
    ::close(p[1]);
    pids[r] = pid;
    fds[r] = p[0];
  }
  std::vector<Outcome> out(world);
  std::vector<bool> open(world, true);
  const auto deadline = Clock::now() + limit;
  for (;;) {
    std::vector<pollfd> pf;
    std::vector<int> who;
    for (int r = 0; r < world; ++r)
      if (open[r]) {
        pf.push_back({fds[r], POLLIN, 0});
        who.push_back(r);
      }
    if (pf.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      for (int r : who) {
        ::kill(pids[r], SIGKILL);
        out[r].text += "HANG (killed after the test's time limit)";
        ::close(fds[r]);
        open[r] = false;
      }
      break;
    }
    if (::poll(pf.data(), pf.size(), static_cast<int>(left)) <= 0) continue;
    for (std::size_t i = 0; i < pf.size(); ++i) {
      if (pf[i].revents == 0) continue;
      char buf[4096];
      const ssize_t k = ::read(fds[who[i]], buf, sizeof buf);
      if (k > 0) {
        out[who[i]].text.append(buf, static_cast<std::size_t>(k));
      } else {
        ::close(fds[who[i]]);
        open[who[i]] = false;
      }
    }
  }
  for (int r = 0; r < world; ++r) {
    int status = 0;
    ::waitpid(pids[r], &status, 0);
    if (out[r].text.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      out[r].text = "died without a report (status " + std::to_string(status) + ")";
  }
  if (std::getenv("TESSERA_TEST_VERBOSE"))  // to read the messages themselves
    for (int r = 0; r < world; ++r)
      std::fprintf(stderr, "  [process %d] %s\n", r, out[r].ok() ? "ok" : out[r].text.c_str());
  return out;
}

std::string describe(const std::vector<Outcome>& o) {
  std::string s;
  for (std::size_t r = 0; r < o.size(); ++r)
    s += "\n  rank " + std::to_string(r) + ": " + (o[r].ok() ? "ok" : o[r].text);
  return s;
}

/// Deterministic content: byte i of the message of (iteration, sender).
unsigned char pattern(int iter, int sender, std::size_t i) {
  return static_cast<unsigned char>((iter * 131 + sender * 17 + i * 7 + (i >> 8)) & 0xff);
}

std::size_t size_for(int iter) {
  static const std::size_t sizes[] = {0, 1, 7, 64, 4096, 65537};
  if (iter % 25 == 24) return std::size_t(1) << 20;  // large enough for partial reads and writes
  return sizes[iter % 6];
}

/// The collectives, 100 times, checking every byte on every rank.
std::string exercise(int rank, int world, int port) {
  auto b = Bootstrap::connect(info(rank, world, port), 20s);
  if (b->rank() != rank || b->world() != world) return "wrong rank/world";
  for (int it = 0; it < 100; ++it) {
    const std::size_t n = size_for(it);
    const int root = it % world;
    std::vector<unsigned char> buf(n, 0xAB);  // poisoned except on the root
    if (rank == root)
      for (std::size_t i = 0; i < n; ++i) buf[i] = pattern(it, root, i);
    b->broadcast(buf.data(), n, root);
    for (std::size_t i = 0; i < n; ++i)
      if (buf[i] != pattern(it, root, i))
        return "broadcast #" + std::to_string(it) + " byte " + std::to_string(i) + " wrong";

    std::vector<unsigned char> in(n), all(n * world, 0xCD);
    for (std::size_t i = 0; i < n; ++i) in[i] = pattern(it, rank, i);
    b->allgather(in.data(), all.data(), n);
    for (int r = 0; r < world; ++r)
      for (std::size_t i = 0; i < n; ++i)
        if (all[r * n + i] != pattern(it, r, i))
          return "allgather #" + std::to_string(it) + " slot " + std::to_string(r) + " byte " + std::to_string(i) +
                 " wrong";
    b->barrier();
  }
  return "";
}

class BootstrapWorld : public ::testing::TestWithParam<int> {};

TEST_P(BootstrapWorld, CollectivesRepeated100Times) {
  const int world = GetParam();
  const int port = tessera::runtime::find_free_tcp_port();
  const auto o = run_ranks(
      world, [&](int r) { return exercise(r, world, port); }, 50s);
  for (const auto& x : o) EXPECT_TRUE(x.ok()) << describe(o);
}

TEST_P(BootstrapWorld, BarrierWaitsForEveryRank) {
  const int world = GetParam();
  const int port = tessera::runtime::find_free_tcp_port();
  const auto o = run_ranks(world, [&](int r) -> std::string {
    auto b = Bootstrap::connect(info(r, world, port), 20s);
    for (int round = 0; round < 3; ++round) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * ((r + round) % world)));
      const std::int64_t enter = Clock::now().time_since_epoch().count();  // steady_clock: one clock per machine
      b->barrier();
      const std::int64_t leave = Clock::now().time_since_epoch().count();
      std::vector<std::int64_t> enters(world), leaves(world);
      b->allgather(&enter, enters.data(), sizeof enter);
      b->allgather(&leave, leaves.data(), sizeof leave);
      for (int i = 0; i < world; ++i)
        for (int j = 0; j < world; ++j)
          if (leaves[i] < enters[j])
            return "rank " + std::to_string(i) + " left barrier before rank " + std::to_string(j) + " entered";
    }
    return "";
  });
  for (const auto& x : o) EXPECT_TRUE(x.ok()) << describe(o);
}

INSTANTIATE_TEST_SUITE_P(Loopback, BootstrapWorld, ::testing::Values(2, 3, 4));

TEST(Bootstrap, SingleProcessUsesNoSocket) {
  auto b = Bootstrap::connect(info(0, 1, 0), 100ms);  // port 0: nothing may listen
  int v = 42;
  b->broadcast(&v, sizeof v, 0);
  EXPECT_EQ(v, 42);
  int all = -1;
  b->allgather(&v, &all, sizeof v);
  EXPECT_EQ(all, 42);
  b->barrier();
  EXPECT_THROW(b->broadcast(&v, sizeof v, 1), tessera::Error);
}

TEST(Bootstrap, InvalidArgumentsAreRejected) {
  EXPECT_THROW(Bootstrap::connect(info(2, 2, 1234), 1s), tessera::Error);
  EXPECT_THROW(Bootstrap::connect(info(-1, 2, 1234), 1s), tessera::Error);
  EXPECT_THROW(Bootstrap::connect(info(0, 0, 1234), 1s), tessera::Error);
  EXPECT_THROW(Bootstrap::connect(info(1, 2, 0), 1s), tessera::Error);
  EXPECT_THROW(Bootstrap::connect(info(1, 2, 70000), 1s), tessera::Error);
  LaunchInfo no_addr = info(1, 2, 1234);
  no_addr.master_addr.clear();
  EXPECT_THROW(Bootstrap::connect(no_addr, 1s), tessera::Error);
  EXPECT_THROW(Bootstrap::connect(info(0, 1, 0), 0ms), tessera::Error);
}

TEST(Bootstrap, ConnectTimesOutWhenRankZeroNeverShowsUp) {
  const int port = tessera::runtime::find_free_tcp_port();
  const auto t0 = Clock::now();
  try {
    (void)Bootstrap::connect(info(1, 2, port), 300ms);
    FAIL() << "connected to nobody";
  } catch (const tessera::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("could not connect to rank 0 at 127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
    EXPECT_NE(msg.find("300 ms"), std::string::npos) << msg;
  }
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 3s);
}

TEST(Bootstrap, RankZeroNamesTheRanksThatNeverConnected) {
  const int port = tessera::runtime::find_free_tcp_port();
  // Rank 2 of 3 never starts.
  // Rank 1 waits longer than rank 0, so what it reports is rank 0's verdict.
  const auto o = run_ranks(
      2,
      [&](int r) {
        Bootstrap::connect(info(r, 3, port), r == 0 ? 700ms : 5000ms);
        return std::string();
      },
      10s);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(o[r].says("Error:") && o[r].says("rank(s) 2") && o[r].says("127.0.0.1:" + std::to_string(port)))
        << describe(o);
  }
}

TEST(Bootstrap, DeadPeerIsNamedInsteadOfAHang) {
  const int world = 3, port = tessera::runtime::find_free_tcp_port();
  const auto t0 = Clock::now();
  const auto o = run_ranks(world, [&](int r) -> std::string {
    auto b = Bootstrap::connect(info(r, world, port), 20s);
    b->barrier();
    if (r == 2) ::_exit(0);  // dies before the allgather
    int v = r, all[3];
    try {
      b->allgather(&v, all, sizeof v);
    } catch (const tessera::Error& e) {
      std::string msg = e.what();
      // The Bootstrap is now unusable, and says so.
      try {
        b->barrier();
        msg += " | barrier after failure succeeded";
      } catch (const tessera::Error& again) {
        if (std::string(again.what()).find("unusable") == std::string::npos) msg += " | no 'unusable' note";
      }
      throw tessera::Error(msg);
    }
    return "allgather succeeded with a dead rank";
  });
  EXPECT_LT(Clock::now() - t0, 10s) << "the dead rank must be detected at once, not after the timeout";
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(o[r].says("Error:") && o[r].says("rank 2") && o[r].says("closed its connection") && !o[r].says("|"))
        << describe(o);
  }
  EXPECT_TRUE(o[2].ok()) << describe(o);
}

TEST(Bootstrap, DeadRankZeroIsNamed) {
  const int world = 3, port = tessera::runtime::find_free_tcp_port();
  const auto o = run_ranks(world, [&](int r) -> std::string {
    auto b = Bootstrap::connect(info(r, world, port), 20s);
    if (r == 0) ::_exit(0);
    std::vector<char> buf(16);
    b->broadcast(buf.data(), buf.size(), 1);  // rank 1 sends to the dead rank 0, rank 2 waits on it
    b->barrier();
    return "collectives succeeded without rank 0";
  });
  for (int r = 1; r < world; ++r) EXPECT_TRUE(o[r].says("Error:") && o[r].says("rank 0 (127.0.0.1:")) << describe(o);
}

TEST(Bootstrap, StuckPeerTimesOutNamingIt) {
  const int world = 3, port = tessera::runtime::find_free_tcp_port();
  const auto t0 = Clock::now();
  const auto o = run_ranks(world, [&](int r) -> std::string {
    // Rank 2 waits longer than rank 0, so it reports rank 0's verdict.
    auto b = Bootstrap::connect(info(r, world, port), r == 2 ? 5000ms : 600ms);
    if (r == 1) {
      std::this_thread::sleep_for(3s);  // alive but never joins the barrier
      return "";
    }
    b->barrier();
    return "barrier passed without rank 1";
  });
  EXPECT_LT(Clock::now() - t0, 6s);
  EXPECT_TRUE(o[0].says("timed out after 600 ms") && o[0].says("rank(s) 1")) << describe(o);
  EXPECT_TRUE(o[2].says("Error:") && o[2].says("rank(s) 1")) << describe(o);  // forwarded by rank 0
}

TEST(Bootstrap, MismatchedWorldSizeIsRejectedAndTheJobStillAssembles) {
  const int port = tessera::runtime::find_free_tcp_port();
  // Rank 0 of a 2-rank job; this process first poses as rank 1 of a 3-rank job.
  std::string stray_error;
  const auto o = run_ranks(
      2,
      [&](int r) -> std::string {
        auto b = Bootstrap::connect(info(r, 2, port), 10s);
        int v = r * 10, all[2];
        b->allgather(&v, all, sizeof v);
        return all[0] == 0 && all[1] == 10 ? "" : "wrong allgather";
      },
      20s,
      [&](int r) {
        if (r == 1) {
          try {
            (void)Bootstrap::connect(info(1, 3, port), 5s);
          } catch (const tessera::Error& e) {
            stray_error = e.what();
          }
        }
        return 0ms;
      });
  EXPECT_NE(stray_error.find("world size 2"), std::string::npos) << stray_error;
  EXPECT_NE(stray_error.find("world size 3"), std::string::npos) << stray_error;
  for (const auto& x : o) EXPECT_TRUE(x.ok()) << describe(o);
}

/// Connects a raw TCP socket to 127.0.0.1:port, retrying for up to 5 s.
int raw_connect(int port) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return s;
    ::close(s);
    std::this_thread::sleep_for(50ms);
  }
  return -1;
}

TEST(Bootstrap, StrayConnectionsDoNotDisturbTheJob) {
  const int port = tessera::runtime::find_free_tcp_port();
  int garbage = -1, silent = -1;
  const auto o = run_ranks(
      2,
      [&](int r) -> std::string {
        auto b = Bootstrap::connect(info(r, 2, port), 10s);
        b->barrier();
        return "";
      },
      20s,
      [&](int r) {
        if (r == 1) {  // rank 0 is up: one stray speaks HTTP, one says nothing and stays open
          garbage = raw_connect(port);
          silent = raw_connect(port);
          const char req[] = "GET / HTTP/1.0\r\n\r\n";
          if (garbage >= 0) (void)!::write(garbage, req, sizeof req - 1);
        }
        return 0ms;
      });
  EXPECT_GE(garbage, 0);
  EXPECT_GE(silent, 0);
  for (const auto& x : o) EXPECT_TRUE(x.ok()) << describe(o);
  ::close(garbage);
  ::close(silent);
}

TEST(Bootstrap, DuplicateRankIsRejected) {
  const int port = tessera::runtime::find_free_tcp_port();
  // Processes: rank 0, rank 1, rank 1 again, then (later) rank 2 of 3.
  const int as_rank[] = {0, 1, 1, 2};
  const auto o = run_ranks(
      4,
      [&](int i) -> std::string {
        auto b = Bootstrap::connect(info(as_rank[i], 3, port), 10s);
        b->barrier();
        return "";
      },
      20s, [](int i) { return i == 3 ? 300ms : 0ms; });
  EXPECT_TRUE(o[0].ok() && o[3].ok()) << describe(o);
  const int rejected = o[1].says("rank 1 is already connected") + o[2].says("rank 1 is already connected");
  EXPECT_EQ(rejected, 1) << describe(o);
  EXPECT_TRUE(o[1].ok() || o[2].ok()) << describe(o);
}

TEST(Bootstrap, MismatchedCollectivesAreReported) {
  const int port = tessera::runtime::find_free_tcp_port();
  const auto o = run_ranks(2, [&](int r) -> std::string {
    auto b = Bootstrap::connect(info(r, 2, port), 10s);
    std::vector<char> in(r == 0 ? 8 : 16), out(in.size() * 2);
    b->allgather(in.data(), out.data(), in.size());
    return "mismatched allgather succeeded";
  });
  EXPECT_TRUE(
      o[0].says("mismatched collectives: rank 1 called allgather #1 (16 bytes per rank) but rank 0 called "
                "allgather #1 (8 bytes per rank)"))
      << describe(o);
  EXPECT_TRUE(o[1].says("mismatched collectives")) << describe(o);

  const int port2 = tessera::runtime::find_free_tcp_port();
  const auto o2 = run_ranks(2, [&](int r) -> std::string {
    auto b = Bootstrap::connect(info(r, 2, port2), 10s);
    int v = 0;
    if (r == 0)
      b->barrier();
    else
      b->broadcast(&v, sizeof v, 1);
    return "barrier matched a broadcast";
  });
  EXPECT_TRUE(o2[0].says("rank 1 called broadcast #1 (root 1, 4 bytes) but rank 0 called barrier #1")) << describe(o2);
}

TEST(Bootstrap, CheckSameNamesTheDisagreeingRank) {
  const int world = 3, port = tessera::runtime::find_free_tcp_port();
  const auto o = run_ranks(world, [&](int r) -> std::string {
    auto b = Bootstrap::connect(info(r, world, port), 10s);
    const long shape[2] = {4096, r == 2 ? 1024 : 512};
    b->check_same(shape, sizeof shape, "the GEMM shape");
    return "check_same passed";
  });
  for (const auto& x : o) EXPECT_TRUE(x.says("the GEMM shape differs") && x.says("rank(s) 2")) << describe(o);
}

// ---- the handshake's cryptography ------------------------------------------

std::string hex(const tessera::runtime::crypto::Digest& d) {
  return tessera::runtime::crypto::to_hex(d.data(), d.size());
}

TEST(BootstrapCrypto, Sha256AndHmacMatchPublishedVectors) {
  namespace c = tessera::runtime::crypto;
  EXPECT_EQ(hex(c::sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(c::sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(c::sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // RFC 4231 test cases 2 and 6 (short key; key longer than a block).
  EXPECT_EQ(hex(c::hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hex(c::hmac_sha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  const char a[] = "0123456789abcdef", b[] = "0123456789abcdeX";
  EXPECT_TRUE(c::equal_constant_time(a, a, 16));
  EXPECT_FALSE(c::equal_constant_time(a, b, 16));
  unsigned char r1[16] = {}, r2[16] = {};
  c::random_bytes(r1, sizeof r1);
  c::random_bytes(r2, sizeof r2);
  EXPECT_NE(std::memcmp(r1, r2, 16), 0);
}

// ---- attacks on the rendezvous -----------------------------------------------
// The wire format as an attacker sees it (bootstrap.cpp): everything but the
// secret is public.
struct WireHello {
  std::uint32_t magic, version, world, rank;
  std::uint8_t nonce[16];
};
struct WireChallenge {
  std::uint32_t magic, version;
  std::uint8_t nonce[16];
  std::uint8_t proof[32];
};
struct WireReply {
  std::uint32_t magic, version, status, world, reason_len;
};
constexpr std::uint32_t kWireHello = 0x54534232, kWireChallenge = 0x54534332, kWireVersion = 2;

const std::string kSecret = "0123456789abcdef0123456789abcdef-test-secret";

bool read_exactly(int fd, void* p, std::size_t n, std::chrono::milliseconds limit) {
  const auto end = Clock::now() + limit;
  std::size_t got = 0;
  while (got < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
    pollfd pf{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&pf, 1, static_cast<int>(left)) <= 0) return false;
    const ssize_t k = ::read(fd, static_cast<char*>(p) + got, n - got);
    if (k <= 0) return false;
    got += static_cast<std::size_t>(k);
  }
  return true;
}

/// True when the peer closes `fd` (EOF or reset) within `limit`.
bool closed_by_peer(int fd, std::chrono::milliseconds limit) {
  const auto end = Clock::now() + limit;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
    pollfd pf{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&pf, 1, static_cast<int>(left)) <= 0) return false;
    char buf[256];
    const ssize_t k = ::read(fd, buf, sizeof buf);
    if (k <= 0) return true;
  }
}

/// The job the attacks try to join: rank 0 broadcasts a stand-in for the
/// NCCL unique id, everyone checks it and meets at a barrier.
std::string real_job(int r, int world, int port, std::chrono::milliseconds timeout = 15s) {
  auto b = Bootstrap::connect(info(r, world, port, kSecret), timeout);
  char id[128] = {};
  if (r == 0) std::snprintf(id, sizeof id, "nccl-unique-id-stand-in");
  b->broadcast(id, sizeof id, 0);
  if (std::string(id) != "nccl-unique-id-stand-in") return "wrong broadcast";
  b->barrier();
  return "";
}

TEST(BootstrapAttack, FakeRankWithThePublicHelloIsRefusedAndTheRealRankJoins) {
  const int port = tessera::runtime::find_free_tcp_port();
  std::string attacker;  // what the attacker learnt
  const auto o = run_ranks(
      2, [&](int r) { return real_job(r, 2, port); }, 30s,
      [&](int r) {
        if (r != 1) return 0ms;
        // Rank 0 is starting: pose as rank 1 with the public hello.
        const int s = raw_connect(port);
        if (s < 0) {
          attacker = "could not connect";
          return 0ms;
        }
        WireHello h{kWireHello, kWireVersion, 2, 1, {}};
        (void)!::write(s, &h, sizeof h);
        WireChallenge c{};
        if (!read_exactly(s, &c, sizeof c, 5s) || c.magic != kWireChallenge) {
          attacker = "no challenge";
        } else {
          unsigned char guess[32];
          tessera::runtime::crypto::random_bytes(guess, sizeof guess);  // cannot compute the proof
          (void)!::write(s, guess, sizeof guess);
          WireReply rep{};
          if (read_exactly(s, &rep, sizeof rep, 5s)) {
            std::string reason(std::min<std::uint32_t>(rep.reason_len, 4096), '\0');
            (void)read_exactly(s, reason.data(), reason.size(), 1s);
            attacker = "status " + std::to_string(rep.status) + ": " + reason;
          }
          if (!closed_by_peer(s, 5s)) attacker += " | connection left open";
        }
        ::close(s);
        return 0ms;  // now the real rank 1
      });
  for (const auto& x : o) EXPECT_TRUE(x.ok()) << describe(o);
  EXPECT_NE(attacker.find("status 1: authentication failed for rank 1"), std::string::npos) << attacker;
  EXPECT_EQ(attacker.find("connection left open"), std::string::npos) << attacker;
  EXPECT_EQ(attacker.find("nccl-unique-id"), std::string::npos) << attacker;
}

TEST(BootstrapAttack, RankWithAnotherSecretIsRefusedAndTheJobCompletes) {
  const int port = tessera::runtime::find_free_tcp_port();
  // Processes: rank 0, rank 1 with a different secret, the real rank 1 later.
  const auto o = run_ranks(
      3,
      [&](int i) -> std::string {
        if (i == 1) {
          auto b = Bootstrap::connect(info(1, 2, port, "another-job-secret-0123456789"), 10s);
          return "joined with the wrong secret";
        }
        return real_job(i == 0 ? 0 : 1, 2, port);
      },
      30s, [](int i) { return i == 2 ? 500ms : 0ms; });
  EXPECT_TRUE(o[0].ok() && o[2].ok()) << describe(o);
  EXPECT_TRUE(o[1].says("could not prove that it knows this rank's job secret")) << describe(o);
}

/// Listens on 127.0.0.1:port like an impostor rank 0; `answer` says what it
/// does with each connection ("silent" reads and says nothing, "forge" sends
/// a challenge with a made-up proof, "accept" sends an OK reply at once).
class Impostor {
 public:
  Impostor(int port, std::string answer) : answer_(std::move(answer)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd_, 16) == 0;
    thread_ = std::thread([this] { serve(); });
  }
  ~Impostor() {
    stop_ = true;
    thread_.join();
    for (int c : conns_) ::close(c);
    ::close(fd_);
  }
  bool ok() const { return ok_; }

 private:
  void serve() {
    while (!stop_) {
      pollfd pf{fd_, POLLIN, 0};
      if (::poll(&pf, 1, 50) <= 0) continue;
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      conns_.push_back(c);
      WireHello h{};
      if (!read_exactly(c, &h, sizeof h, 2s)) continue;
      if (answer_ == "forge") {
        WireChallenge ch{kWireChallenge, kWireVersion, {}, {}};
        tessera::runtime::crypto::random_bytes(ch.proof, sizeof ch.proof);
        (void)!::write(c, &ch, sizeof ch);
      } else if (answer_ == "accept") {
        WireReply rep{kWireHello, kWireVersion, 0, h.world, 0};
        (void)!::write(c, &rep, sizeof rep);
      }
    }
  }
  std::string answer_;
  int fd_ = -1;
  bool ok_ = false;
  std::atomic<bool> stop_{false};
  std::vector<int> conns_;
  std::thread thread_;
};

TEST(BootstrapAttack, ImpostorRankZeroIsDetectedByTheRanks) {
  for (const std::string answer : {"forge", "accept", "silent"}) {
    const int port = tessera::runtime::find_free_tcp_port();
    Impostor imp(port, answer);
    ASSERT_TRUE(imp.ok());
    const auto t0 = Clock::now();
    const auto o = run_ranks(
        3, [&](int r) { return real_job(r, 3, port, 1500ms); }, 20s);
    EXPECT_LT(Clock::now() - t0, 8s) << answer;
    // The real rank 0 cannot take the port and says why.
    EXPECT_TRUE(o[0].says("cannot listen on 127.0.0.1:" + std::to_string(port)) &&
                o[0].says("another process holds MASTER_PORT"))
        << answer << describe(o);
    for (int r = 1; r < 3; ++r)
      EXPECT_TRUE(o[r].says("is not this job's rank 0") || o[r].says("could not prove that it knows"))
          << answer << describe(o);
  }
}

/// Opens n connections to 127.0.0.1:port without waiting for them (non-blocking connect).
std::vector<int> flood(int port, int n) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    (void)::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
    v.push_back(s);
  }
  return v;
}

TEST(BootstrapAttack, IdleConnectionFloodDoesNotExhaustRankZero) {
  const int port = tessera::runtime::find_free_tcp_port();
  std::vector<int> idle;
  const auto o = run_ranks(
      3,
      [&](int r) -> std::string {
        if (r == 0) {  // few descriptors: 200 idle connections would exhaust them many times over
          const rlimit lim{40, 40};
          if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) return "setrlimit failed";
        }
        return real_job(r, 3, port, 20s);
      },
      40s,
      [&](int r) {
        if (r == 1) {
          std::this_thread::sleep_for(200ms);  // rank 0 listens
          idle = flood(port, 200);
          std::this_thread::sleep_for(300ms);
        }
        return 0ms;
      });
  for (const auto& x : o) EXPECT_TRUE(x.ok()) << describe(o);
  for (int s : idle) ::close(s);
}

TEST(BootstrapAttack, GarbageHellosCloseOnlyTheirConnection) {
  const int port = tessera::runtime::find_free_tcp_port();
  std::vector<int> junk;
  bool closed_early[4] = {};
  const auto o = run_ranks(
      2, [&](int r) { return real_job(r, 2, port); }, 30s,
      [&](int r) {
        if (r != 1) return 0ms;
        auto send = [&](const void* p, std::size_t n) {
          const int s = raw_connect(port);
          if (s >= 0) (void)!::write(s, p, n);
          junk.push_back(s);
        };
        unsigned char random[64];
        tessera::runtime::crypto::random_bytes(random, sizeof random);
        send(random, sizeof random);  // noise
        const WireHello bad_world{kWireHello, kWireVersion, 0xffffffffu, 1, {}};
        send(&bad_world, sizeof bad_world);  // absurd world size
        const WireHello bad_rank{kWireHello, kWireVersion, 2, 0x7fffffff, {}};
        send(&bad_rank, sizeof bad_rank);  // rank out of range
        const WireHello old{kWireHello, 1, 2, 1, {}};
        send(&old, sizeof old);  // another protocol version
        send(&bad_world, 6);     // a truncated hello, then silence
        // Rank 0, still waiting for rank 1, closes each complete bad hello at once.
        for (int i = 0; i < 4; ++i) closed_early[i] = junk[i] >= 0 && closed_by_peer(junk[i], 3s);
        return 0ms;
      });
  for (const auto& x : o) EXPECT_TRUE(x.ok()) << describe(o);
  ASSERT_EQ(junk.size(), 5u);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(closed_early[i]) << "garbage connection " << i << " left open";
  EXPECT_TRUE(closed_by_peer(junk[4], 10s)) << "the truncated hello's connection was left open";
  for (int s : junk) ::close(s);
}

/// A connect() to host:port: true when refused (nothing listens there).
bool refused(const char* host, int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host, &a.sin_addr);
  const bool no = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno == ECONNREFUSED;
  ::close(s);
  return no;
}

/// This host's first IPv4 address that is not loopback ("" if none).
std::string non_loopback_ipv4() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    found = text;
  }
  ::freeifaddrs(list);
  return found;
}

TEST(BootstrapAttack, RankZeroListensOnMasterAddrOnly) {
  // 127.0.0.2 is this host too (all of 127/8 is loopback) but another
  // address; so is a network address, which rank 0 used to answer on every
  // interface for. A wildcard listener would answer on 127.0.0.1.
  std::vector<std::string> addrs{"127.0.0.2"};
  if (const std::string net = non_loopback_ipv4(); !net.empty()) addrs.push_back(net);
  for (const std::string& addr : addrs) {
    const int port = tessera::runtime::find_free_tcp_port();
    bool other_address_refused = false;
    const auto o = run_ranks(
        2,
        [&](int r) -> std::string {
          LaunchInfo li = info(r, 2, port, kSecret);
          li.master_addr = addr;
          auto b = Bootstrap::connect(li, 10s);
          b->barrier();
          return "";
        },
        20s,
        [&](int r) {
          if (r == 1) {
            std::this_thread::sleep_for(300ms);  // rank 0 listens by now
            other_address_refused = refused("127.0.0.1", port);
          }
          return 0ms;
        });
    for (const auto& x : o) EXPECT_TRUE(x.ok()) << addr << describe(o);
    EXPECT_TRUE(other_address_refused) << "rank 0 at " << addr << " listened beyond MASTER_ADDR";
  }
}

TEST(BootstrapAttack, AMasterAddrOfAnotherHostIsAClearError) {
  const int port = tessera::runtime::find_free_tcp_port();
  LaunchInfo li = info(0, 2, port, kSecret);
  li.master_addr = "198.51.100.77";  // TEST-NET-2: documentation only, not an address of this host
  try {
    (void)Bootstrap::connect(li, 2s);
    FAIL() << "listened on an address that is not ours";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not an address of this host"), std::string::npos) << e.what();
  }
}

TEST(BootstrapAttack, AHandMadeLaunchInfoUsesTheExportedSecret) {
  // The C API builds its LaunchInfo itself: TESSERA_JOB_SECRET still keys the
  // handshake, so ranks with different exported secrets do not meet.
  for (const bool same : {true, false}) {
    const int port = tessera::runtime::find_free_tcp_port();
    const auto o = run_ranks(2, [&](int r) -> std::string {
      const std::string secret = same || r == 0 ? "exported-secret-0123456789" : "another-secret-0123456789";
      ::setenv("TESSERA_JOB_SECRET", secret.c_str(), 1);
      auto b = Bootstrap::connect(info(r, 2, port), r == 0 ? 1500ms : 10s);  // no job_secret in the LaunchInfo
      b->barrier();
      return "";
    });
    if (same) {
      for (const auto& x : o) EXPECT_TRUE(x.ok()) << describe(o);
    } else {
      EXPECT_TRUE(o[1].says("could not prove") && o[1].says("TESSERA_JOB_SECRET")) << describe(o);
      EXPECT_TRUE(o[0].says("timed out")) << describe(o);
    }
  }
}
}  // namespace
