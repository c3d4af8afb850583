// TCP rendezvous (star through rank 0). Protocol and failure contract:
// include/tessera/runtime/bootstrap.hpp.
#include "tessera/runtime/bootstrap.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "hmac.hpp"
#include "socket.hpp"
#include "tessera/runtime/env.hpp"
#include "tessera/runtime/error.hpp"

namespace tessera::runtime {

using net::Deadline;
using net::IoResult;
using net::IoStatus;

namespace {

constexpr std::uint32_t kHelloMagic = 0x54534232;      // "TSB2"
constexpr std::uint32_t kChallengeMagic = 0x54534332;  // "TSC2"
constexpr std::uint32_t kFrameMagic = 0x5453464d;      // "TSFM"
constexpr std::uint32_t kVersion = 2;
constexpr std::uint32_t kMaxReason = 64 * 1024;
constexpr std::size_t kNonce = 16;
/// Connections that have not completed the handshake, at most; beyond that
/// the oldest is closed (so idle connections cannot exhaust descriptors or
/// hold the real ranks out).
constexpr std::size_t kMaxPending = 32;
/// A connection must complete its handshake this long after it was accepted.
constexpr std::chrono::milliseconds kHandshakeLimit{5000};

// Both ends of a job run on the same architecture, so fields travel in host
// byte order; a byte-swapped magic reads as "not a tessera peer".
//
// Handshake (mutual challenge/response over the job secret K, which never
// travels): the peer sends Hello with a fresh nonce Nc; rank 0 checks the
// plain fields, answers Challenge with its nonce Ns and
// HMAC(K, "server" | Nc | Ns | world | rank) — the peer refuses a rank 0
// that cannot produce it — and the peer answers with
// HMAC(K, "client" | Nc | Ns | world | rank), which rank 0 checks in constant
// time before the rank takes its slot. The final HelloReply comes once the
// whole world has connected.
struct Hello {
  std::uint32_t magic, version, world, rank;
  std::uint8_t nonce[kNonce];
};
struct Challenge {
  std::uint32_t magic, version;
  std::uint8_t nonce[kNonce];
  std::uint8_t proof[32];
};
struct Proof {
  std::uint8_t mac[32];
};
enum class Status : std::uint32_t { ok = 0, rejected = 1 };
struct HelloReply {
  std::uint32_t magic, version, status, world, reason_len;  // reason bytes follow
};

/// The MAC one side sends: role is "server" or "client".
crypto::Digest handshake_mac(const std::string& key, const char* role, const std::uint8_t* nc, const std::uint8_t* ns,
                             std::uint32_t world, std::uint32_t rank) {
  std::string msg = std::string("tessera-bootstrap-v2|") + role + "|";
  msg.append(reinterpret_cast<const char*>(nc), kNonce);
  msg.append(reinterpret_cast<const char*>(ns), kNonce);
  msg += fmt::format("|{}|{}", world, rank);
  return crypto::hmac_sha256(key, msg);
}

enum class Op : std::uint32_t { broadcast = 1, allgather = 2, barrier = 3, abort = 0xdead };
struct Frame {
  std::uint32_t magic;
  Op op;
  std::uint32_t seq;
  std::int32_t root;
  std::uint64_t bytes;  // payload bytes that follow; for abort: the reason's length
};
static_assert(sizeof(Frame) == 24);

const char* op_name(Op op) {
  switch (op) {
    case Op::broadcast:
      return "broadcast";
    case Op::allgather:
      return "allgather";
    case Op::barrier:
      return "barrier";
    case Op::abort:
      return "abort";
  }
  return "unknown-op";
}

/// "broadcast #3 (root 1, 16 bytes)" — what a frame says a rank is doing.
std::string describe(Op op, std::uint32_t seq, int root, std::uint64_t bytes) {
  switch (op) {
    case Op::broadcast:
      return fmt::format("broadcast #{} (root {}, {} bytes)", seq, root, bytes);
    case Op::allgather:
      return fmt::format("allgather #{} ({} bytes per rank)", seq, bytes);
    case Op::barrier:
      return fmt::format("barrier #{}", seq);
    default:
      return fmt::format("{} #{}", op_name(op), seq);
  }
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

}  // namespace

struct Bootstrap::Impl {
  int rank = 0, world = 1;
  std::string address;  // rank 0's host:port
  std::chrono::milliseconds timeout{0};
  std::vector<net::Fd> peers;          // rank 0: peers[r] = socket to rank r; others: peers[0] = socket to rank 0
  std::vector<std::string> peer_addr;  // rank 0: where rank r connected from
  std::uint32_t seq = 0;
  std::string broken;      // reason of an earlier failure; non-empty = unusable
  std::string key;         // the job secret (HMAC key); never sent
  std::string key_source;  // where it came from, for messages
  std::string bind_host;   // TESSERA_BOOTSTRAP_BIND ("" = MASTER_ADDR itself)

  Deadline deadline() const { return net::Clock::now() + timeout; }

  std::string where() const { return fmt::format("bootstrap (rank {} of {}, rank 0 at {})", rank, world, address); }

  /// Records the failure, tells the other side(s) when we can, and throws.
  [[noreturn]] void fail(const std::string& what) {
    broken = what;
    send_abort(what);
    close_gracefully();
    TESSERA_FAIL("{}: {}", where(), what);
  }

  /// Closes every socket so that the abort just sent is delivered. Closing a
  /// socket with unread input makes the kernel send RST, and an RST can make
  /// the peer drop the abort before reading it; so: half-close, then read and
  /// discard until each peer closes too (it does once it read the abort), at
  /// most ~500 ms in all.
  void close_gracefully() {
    const Deadline d = net::Clock::now() + std::min(timeout, std::chrono::milliseconds(500));
    for (auto& fd : peers)
      if (fd.valid()) ::shutdown(fd.get(), SHUT_WR);
    for (auto& fd : peers) {
      char sink[4096];
      while (fd.valid()) {
        IoResult res;
        const long k = net::recv_some(fd.get(), sink, sizeof sink, res);
        if (k == 0 || res.status != IoStatus::ok) break;  // EOF or error: done with this one
        if (k < 0) {
          pollfd p{fd.get(), POLLIN, 0};
          if (::poll(&p, 1, net::ms_left(d)) <= 0) break;  // deadline (or poll error)
        }
      }
      fd.reset();
    }
  }

  /// Best effort: rank 0 tells every peer, others tell rank 0; short deadline.
  void send_abort(const std::string& reason) {
    const std::string text = reason.substr(0, kMaxReason);
    const Frame f{kFrameMagic, Op::abort, seq, rank, text.size()};
    const Deadline d = net::Clock::now() + std::min(timeout, std::chrono::milliseconds(1000));
    for (auto& fd : peers) {
      if (!fd.valid()) continue;
      if (net::send_all(fd.get(), &f, sizeof f, d).status == IoStatus::ok)
        (void)net::send_all(fd.get(), text.data(), text.size(), d);
    }
  }

  std::string io_failure(const IoResult& r, int peer, const std::string& during) const {
    const std::string who =
        peer == 0 ? fmt::format("rank 0 ({})", address)
                  : fmt::format("rank {}{}", peer,
                                rank == 0 && peer < static_cast<int>(peer_addr.size()) && !peer_addr[peer].empty()
                                    ? " (" + peer_addr[peer] + ")"
                                    : "");
    switch (r.status) {
      case IoStatus::closed:
        return fmt::format("{} closed its connection during {} — did that process exit or fail?", who, during);
      case IoStatus::timeout:
        return fmt::format("timed out after {} ms waiting for {} during {}", timeout.count(), who, during);
      default:
        return fmt::format("socket error with {} during {}: {}", who, during, net::errno_text(r.err));
    }
  }

  void send_or_fail(int peer, const void* data, std::size_t n, const std::string& during) {
    const IoResult r = net::send_all(peers[peer].get(), data, n, deadline());
    if (r.status != IoStatus::ok) fail(io_failure(r, peer, during));
  }

  void send_frame(int peer, Op op, int root, std::uint64_t bytes, const void* payload, const std::string& during) {
    const Frame f{kFrameMagic, op, seq, root, bytes};
    send_or_fail(peer, &f, sizeof f, during);
    if (bytes > 0) send_or_fail(peer, payload, bytes, during);
  }

  /// Reads an abort frame's reason from `peer` (bounded).
  std::string read_abort_reason(int peer, const Frame& f) {
    std::string reason(std::min<std::uint64_t>(f.bytes, kMaxReason), '\0');
    const Deadline d = net::Clock::now() + std::min(timeout, std::chrono::milliseconds(1000));
    (void)net::recv_all(peers[peer].get(), reason.data(), reason.size(), d);
    return reason;
  }

  /// Checks a frame received from `peer` against what this rank is doing.
  void check_frame(int peer, const Frame& f, Op op, int root, std::uint64_t bytes, const std::string& during) {
    if (f.magic != kFrameMagic)
      fail(fmt::format("rank {} sent a malformed message during {} (bad magic 0x{:08x})", peer, during, f.magic));
    if (f.op == Op::abort) {
      const std::string reason = read_abort_reason(peer, f);
      if (peer == 0) fail(fmt::format("{} aborted by rank 0: {}", during, reason));
      fail(fmt::format("{}: rank {} failed: {}", during, peer, reason));
    }
    if (f.op != op || f.seq != seq || f.root != root || f.bytes != bytes)
      fail(fmt::format("mismatched collectives: rank {} called {} but rank {} called {}", peer,
                       describe(f.op, f.seq, f.root, f.bytes), rank, during));
  }

  /// Rank 0: receives one frame + payload from each rank in `from`, all at
  /// once (so the first dead or late rank is named whatever the order).
  /// dest(r) is where rank r's payload goes.
  template <class Dest>
  void gather_at_root(const std::vector<int>& from, Op op, int root, std::uint64_t bytes, Dest dest,
                      const std::string& during) {
    struct State {
      int rank;
      Frame frame{};
      std::size_t got = 0;  // bytes of frame + payload received
    };
    std::vector<State> st;
    for (int r : from) st.push_back({r});
    const Deadline d = deadline();
    const std::size_t total = sizeof(Frame) + bytes;
    for (;;) {
      std::vector<pollfd> pfds;
      std::vector<State*> who;
      for (auto& s : st) {
        if (s.got < total) {
          pfds.push_back({peers[s.rank].get(), POLLIN, 0});
          who.push_back(&s);
        }
      }
      if (pfds.empty()) return;
      const int rc = ::poll(pfds.data(), pfds.size(), net::ms_left(d));
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) fail(fmt::format("poll() during {}: {}", during, net::errno_text(errno)));
      if (rc == 0) {
        std::vector<int> late;
        for (State* s : who) late.push_back(s->rank);
        fail(fmt::format("timed out after {} ms during {} waiting for rank(s) {}", timeout.count(), during,
                         join_ranks(late)));
      }
      for (std::size_t i = 0; i < pfds.size(); ++i) {
        if (pfds[i].revents == 0) continue;
        State& s = *who[i];
        IoResult res;
        const bool in_header = s.got < sizeof(Frame);
        char* buf = in_header ? reinterpret_cast<char*>(&s.frame) + s.got
                              : static_cast<char*>(dest(s.rank)) + (s.got - sizeof(Frame));
        const std::size_t want = in_header ? sizeof(Frame) - s.got : total - s.got;
        const long k = net::recv_some(pfds[i].fd, buf, want, res);
        if (res.status == IoStatus::ok && k == 0) res.status = IoStatus::closed;
        if (res.status != IoStatus::ok) fail(io_failure(res, s.rank, during));
        if (k < 0) continue;
        s.got += static_cast<std::size_t>(k);
        if (in_header && s.got == sizeof(Frame)) check_frame(s.rank, s.frame, op, root, bytes, during);
      }
    }
  }

  /// Non-root: receives rank 0's frame (which must say op/root/bytes) and
  /// then `payload` bytes into `out`.
  void recv_from_root(Op op, int root, std::uint64_t bytes, void* out, std::size_t payload, const std::string& during) {
    Frame f{};
    IoResult r = net::recv_all(peers[0].get(), &f, sizeof f, deadline());
    if (r.status != IoStatus::ok) fail(io_failure(r, 0, during));
    check_frame(0, f, op, root, bytes, during);
    if (payload == 0) return;
    r = net::recv_all(peers[0].get(), out, payload, deadline());
    if (r.status != IoStatus::ok) fail(io_failure(r, 0, during));
  }

  void check_usable() const {
    TESSERA_CHECK(broken.empty(), "{}: unusable after an earlier failure: {}", where(), broken);
  }

  void connect_as_root(Deadline d);
  void connect_as_peer(Deadline d);
  struct RootHandshake;
};

// ---- handshake ---------------------------------------------------------------

// Rank 0's side of the handshake (connect_as_root): the connections still
// handshaking, the refused ones (reported on a timeout), and the steps of
// its poll loop.
struct Bootstrap::Impl::RootHandshake {
  // One connection that has not finished the handshake.
  struct Pending {
    net::Fd fd;
    std::string from;
    Deadline limit;  // must finish the handshake by then
    Hello hello{};
    std::size_t got = 0;  // bytes of hello (then of proof) received
    bool challenged = false;
    std::uint8_t nonce[kNonce] = {};  // ours (Ns)
    Proof proof{};
  };
  Impl& b;
  net::Fd listener;
  std::vector<Pending> pending;
  std::vector<std::string> notes;  // refused connections, reported on timeout
  int connected = 0;

  RootHandshake(Impl& impl, net::Fd l) : b(impl), listener(std::move(l)) {}

  void note(std::string n) {
    if (notes.size() < 16)
      notes.push_back(std::move(n));
    else if (notes.size() == 16)
      notes.push_back("(more refused connections not listed)");
  }

  IoResult reply(int fd, Status status, const std::string& reason) const {
    const HelloReply rep{kHelloMagic, kVersion, static_cast<std::uint32_t>(status), static_cast<std::uint32_t>(b.world),
                         static_cast<std::uint32_t>(reason.size())};
    const Deadline rd = net::Clock::now() + std::chrono::milliseconds(1000);
    IoResult r = net::send_all(fd, &rep, sizeof rep, rd);
    if (r.status == IoStatus::ok) r = net::send_all(fd, reason.data(), reason.size(), rd);
    return r;
  }

  void refuse(Pending& p, const std::string& why) {  // tell that connection why, close it, nothing else
    note(fmt::format("refused {}: {}", p.from, why));
    (void)reply(p.fd.get(), Status::rejected, why);
    p.fd.reset();
  }

  // A complete hello: plain checks, then the challenge (with our proof).
  void on_hello(Pending& p) {
    const Hello& h = p.hello;
    const int world = b.world;
    if (h.version != kVersion)
      return refuse(p, fmt::format("protocol version {} differs from rank 0's {}", h.version, kVersion));
    if (h.world != static_cast<std::uint32_t>(world))
      return refuse(p, fmt::format("this job has world size {} but the connecting process (rank {}) has world size "
                                   "{} — is MASTER_PORT shared by two jobs?",
                                   world, h.rank, h.world));
    if (h.rank == 0 || h.rank >= static_cast<std::uint32_t>(world))
      return refuse(p, fmt::format("rank {} is out of range [1, {})", h.rank, world));
    Challenge c{kChallengeMagic, kVersion, {}, {}};
    crypto::random_bytes(p.nonce, kNonce);
    std::memcpy(c.nonce, p.nonce, kNonce);
    const crypto::Digest mine = handshake_mac(b.key, "server", h.nonce, p.nonce, h.world, h.rank);
    std::memcpy(c.proof, mine.data(), mine.size());
    // 64 bytes into a fresh socket's empty send buffer: never blocks for long.
    if (net::send_all(p.fd.get(), &c, sizeof c, net::Clock::now() + std::chrono::milliseconds(500)).status !=
        IoStatus::ok) {
      note(fmt::format("a connection from {} went away during the handshake", p.from));
      p.fd.reset();
      return;
    }
    p.challenged = true;
    p.got = 0;
  }

  // A complete proof: constant-time check, then the rank takes its slot.
  void on_proof(Pending& p) {
    const Hello& h = p.hello;
    const crypto::Digest want = handshake_mac(b.key, "client", h.nonce, p.nonce, h.world, h.rank);
    if (!crypto::equal_constant_time(want.data(), p.proof.mac, want.size()))
      return refuse(p, fmt::format("authentication failed for rank {}: the process does not know this job's secret "
                                   "({}; every rank must see the same TESSERA_JOB_SECRET)",
                                   h.rank, b.key_source));
    if (b.peers[h.rank].valid())
      return refuse(p, fmt::format("rank {} is already connected from {}", h.rank, b.peer_addr[h.rank]));
    b.peers[h.rank] = std::move(p.fd);
    b.peer_addr[h.rank] = p.from;
    ++connected;
  }

  // Handshakes that take too long: closed, nothing else.
  void expire() {
    const auto now = net::Clock::now();
    for (auto& p : pending)
      if (p.limit <= now) {
        note(fmt::format("a connection from {} did not complete the handshake within {} ms", p.from,
                         std::chrono::duration_cast<std::chrono::milliseconds>(kHandshakeLimit).count()));
        p.fd.reset();
      }
    std::erase_if(pending, [](const Pending& p) { return !p.fd.valid(); });
  }

  // The job did not complete in time: every connected rank is told why.
  [[noreturn]] void time_out() {
    std::vector<int> missing;
    for (int r = 1; r < b.world; ++r)
      if (!b.peers[r].valid()) missing.push_back(r);
    std::string why = fmt::format("timed out after {} ms waiting for rank(s) {} to connect to {}", b.timeout.count(),
                                  join_ranks(missing), b.address);
    for (const auto& n : notes) why += "; " + n;
    for (int r = 1; r < b.world; ++r)
      if (b.peers[r].valid()) (void)reply(b.peers[r].get(), Status::rejected, why);
    b.broken = why;
    TESSERA_FAIL("{}: {}", b.where(), why);
  }

  // Handshakes in progress: what arrived on pending[i - 1] (pfds[i]).
  void read(const std::vector<pollfd>& pfds) {
    for (std::size_t i = 1; i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      Pending& p = pending[i - 1];
      char* buf = p.challenged ? reinterpret_cast<char*>(&p.proof) : reinterpret_cast<char*>(&p.hello);
      const std::size_t want = p.challenged ? sizeof(Proof) : sizeof(Hello);
      IoResult res;
      const long k = net::recv_some(p.fd.get(), buf + p.got, want - p.got, res);
      if (k == 0 || res.status != IoStatus::ok) {
        note(fmt::format("a connection from {} closed before completing the handshake", p.from));
        p.fd.reset();
        continue;
      }
      if (k < 0) continue;
      p.got += static_cast<std::size_t>(k);
      if (!p.challenged && p.got >= sizeof(std::uint32_t) && p.hello.magic != kHelloMagic) {
        note(fmt::format("a connection from {} was not a tessera bootstrap peer (magic 0x{:08x})", p.from,
                         p.hello.magic));
        p.fd.reset();  // not ours: just close it
        continue;
      }
      if (p.got < want) continue;
      if (!p.challenged)
        on_hello(p);
      else
        on_proof(p);
    }
    std::erase_if(pending, [](const Pending& p) { return !p.fd.valid(); });
  }

  // New connections: take all that are queued.
  void accept_all() {
    for (;;) {
      std::string from;
      int err = 0;
      net::Fd fd = net::accept_until(listener.get(), net::Clock::now(), &from, &err);
      if (!fd.valid() && err != 0) {
        // Out of descriptors: drop the oldest unfinished handshake, or back
        // off briefly when there is none (the peers hold them).
        if (!pending.empty()) {
          note(fmt::format("closed an idle connection from {}: out of file descriptors ({})", pending.front().from,
                           net::errno_text(err)));
          pending.erase(pending.begin());
        } else {
          ::poll(nullptr, 0, 10);
        }
        break;
      }
      if (!fd.valid()) break;
      if (pending.size() >= kMaxPending) {  // the oldest goes: a real rank finishes in well under a second
        note(fmt::format("closed an idle connection from {}: more than {} connections were handshaking",
                         pending.front().from, kMaxPending));
        pending.erase(pending.begin());
      }
      pending.push_back(
          {std::move(fd), from, net::Clock::now() + std::min<std::chrono::milliseconds>(b.timeout, kHandshakeLimit)});
    }
  }
};

void Bootstrap::Impl::connect_as_root(Deadline d) {
  const auto colon = address.rfind(':');
  const std::string host = address.substr(0, colon);
  RootHandshake hs(*this, net::listen_on(host.front() == '[' ? host.substr(1, host.size() - 2) : host,
                                         std::stoi(address.substr(colon + 1)), std::min(world + 16, 4096), bind_host));
  while (hs.connected < world - 1) {
    hs.expire();
    Deadline wake = d;
    for (const auto& p : hs.pending) wake = std::min(wake, p.limit);
    std::vector<pollfd> pfds{{hs.listener.get(), POLLIN, 0}};
    for (auto& p : hs.pending) pfds.push_back({p.fd.get(), POLLIN, 0});
    const int rc = ::poll(pfds.data(), pfds.size(), net::ms_left(wake));
    if (rc < 0 && errno == EINTR) continue;
    TESSERA_CHECK(rc >= 0, "{}: poll(): {}", where(), net::errno_text(errno));
    if (rc == 0 && net::ms_left(d) == 0) hs.time_out();
    hs.read(pfds);
    if (pfds[0].revents != 0) hs.accept_all();
  }
  hs.listener.reset();  // the job is complete: later strays get "connection refused"
  hs.pending.clear();
  for (int r = 1; r < world; ++r) {
    const IoResult res = hs.reply(peers[r].get(), Status::ok, "");
    if (res.status != IoStatus::ok) fail(io_failure(res, r, "the handshake"));
  }
}

void Bootstrap::Impl::connect_as_peer(Deadline d) {
  const auto colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  if (host.front() == '[') host = host.substr(1, host.size() - 2);
  std::string last_error = "none";
  net::Fd fd = net::connect_until(host, std::stoi(address.substr(colon + 1)), d, &last_error);
  TESSERA_CHECK(fd.valid(),
                "{}: could not connect to rank 0 at {} within {} ms (last error: {}). Is rank 0 running, and are "
                "MASTER_ADDR/MASTER_PORT the same on every rank?",
                where(), address, timeout.count(), last_error);
  peers.resize(1);
  peers[0] = std::move(fd);
  auto fail_quietly = [&](const std::string& why) {  // rank 0 already knows (or is not ours); send it nothing
    broken = why;
    peers[0].reset();
    TESSERA_FAIL("{}: {}", where(), why);
  };
  auto not_rank0 = [&](const std::string& what) {
    fail_quietly(
        fmt::format("the process listening on {} is not this job's rank 0: {} (another job or another "
                    "program holds MASTER_PORT; the job secret is {})",
                    address, what, key_source));
  };
  // Reads rank 0's refusal (a HelloReply whose magic `first4` was read already).
  auto read_refusal = [&](std::uint32_t first4) {
    HelloReply rep{};
    rep.magic = first4;
    IoResult r = net::recv_all(peers[0].get(), reinterpret_cast<char*>(&rep) + 4, sizeof rep - 4, d);
    if (r.status != IoStatus::ok) fail_quietly(io_failure(r, 0, "the handshake"));
    if (rep.status == static_cast<std::uint32_t>(Status::ok)) not_rank0("it accepted this rank without authentication");
    std::string reason(std::min(rep.reason_len, kMaxReason), '\0');
    (void)net::recv_all(peers[0].get(), reason.data(), reason.size(), net::Clock::now() + std::chrono::seconds(1));
    fail_quietly(fmt::format("rank 0 at {} refused this rank: {}", address, reason));
  };

  Hello h{kHelloMagic, kVersion, static_cast<std::uint32_t>(world), static_cast<std::uint32_t>(rank), {}};
  crypto::random_bytes(h.nonce, kNonce);
  IoResult r = net::send_all(peers[0].get(), &h, sizeof h, d);
  if (r.status != IoStatus::ok) fail_quietly(io_failure(r, 0, "the handshake"));

  Challenge c{};
  r = net::recv_all(peers[0].get(), &c.magic, sizeof c.magic, d);
  if (r.status == IoStatus::timeout)
    not_rank0(fmt::format("it accepted the connection but sent no challenge within {} ms", timeout.count()));
  if (r.status != IoStatus::ok) fail_quietly(io_failure(r, 0, "the handshake"));
  if (c.magic == kHelloMagic) read_refusal(c.magic);
  if (c.magic != kChallengeMagic) not_rank0(fmt::format("it answered with magic 0x{:08x}", c.magic));
  r = net::recv_all(peers[0].get(), reinterpret_cast<char*>(&c) + 4, sizeof c - 4, d);
  if (r.status != IoStatus::ok) fail_quietly(io_failure(r, 0, "the handshake"));
  const crypto::Digest expect = handshake_mac(key, "server", h.nonce, c.nonce, h.world, h.rank);
  if (c.version != kVersion || !crypto::equal_constant_time(expect.data(), c.proof, expect.size()))
    fail_quietly(
        fmt::format("the process listening on {} could not prove that it knows this rank's job secret "
                    "({}): it is not this job's rank 0 (another job or another program on MASTER_PORT), "
                    "or the ranks were given different secrets",
                    address, key_source));

  Proof p{};
  const crypto::Digest mine = handshake_mac(key, "client", h.nonce, c.nonce, h.world, h.rank);
  std::memcpy(p.mac, mine.data(), mine.size());
  r = net::send_all(peers[0].get(), &p, sizeof p, d);
  if (r.status != IoStatus::ok) fail_quietly(io_failure(r, 0, "the handshake"));

  HelloReply rep{};
  r = net::recv_all(peers[0].get(), &rep, sizeof rep, d);
  if (r.status == IoStatus::timeout)
    fail_quietly(
        fmt::format("connected to rank 0 at {}, but the job did not assemble within {} ms (rank 0 is "
                    "still waiting for other ranks)",
                    address, timeout.count()));
  if (r.status != IoStatus::ok) fail_quietly(io_failure(r, 0, "the handshake"));
  if (rep.magic != kHelloMagic) not_rank0("bad reply after authentication");
  if (rep.status != static_cast<std::uint32_t>(Status::ok)) {
    std::string reason(std::min(rep.reason_len, kMaxReason), '\0');
    (void)net::recv_all(peers[0].get(), reason.data(), reason.size(), net::Clock::now() + std::chrono::seconds(1));
    fail_quietly(fmt::format("rank 0 at {} refused this rank: {}", address, reason));
  }
}

// ---- public interface ------------------------------------------------------------

std::chrono::milliseconds default_bootstrap_timeout() {
  return std::chrono::milliseconds(env::get_int("TESSERA_BOOTSTRAP_TIMEOUT_MS", 60000, 1, INT32_MAX));
}

int find_free_tcp_port() { return net::free_port(); }

Bootstrap::Bootstrap(int rank, int world, std::string address, std::chrono::milliseconds timeout)
    : rank_(rank), world_(world), address_(std::move(address)), timeout_(timeout), impl_(std::make_unique<Impl>()) {
  impl_->rank = rank;
  impl_->world = world;
  impl_->address = address_;
  impl_->timeout = timeout;
}

Bootstrap::~Bootstrap() = default;

std::unique_ptr<Bootstrap> Bootstrap::connect(const LaunchInfo& info) {
  return connect(info, default_bootstrap_timeout());
}

std::unique_ptr<Bootstrap> Bootstrap::connect(const LaunchInfo& info, std::chrono::milliseconds timeout) {
  TESSERA_CHECK(info.world >= 1 && info.rank >= 0 && info.rank < info.world,
                "bootstrap: invalid rank {} for world size {}", info.rank, info.world);
  TESSERA_CHECK(timeout.count() >= 1, "bootstrap: timeout must be at least 1 ms (got {} ms)", timeout.count());
  if (info.world > 1) {
    TESSERA_CHECK(!info.master_addr.empty(), "bootstrap: world size is {} but no master address is set", info.world);
    TESSERA_CHECK(info.master_port >= 1 && info.master_port <= 65535,
                  "bootstrap: master port {} is out of range [1, 65535]", info.master_port);
  }
  detail::set_current_rank(info.rank);
  const std::string addr = net::address_string(info.master_addr, info.master_port);
  std::unique_ptr<Bootstrap> b(new Bootstrap(info.rank, info.world, addr, timeout));
  if (info.world == 1) return b;
  Impl& m = *b->impl_;
  if (!info.job_secret.empty()) {
    m.key = info.job_secret;
    m.key_source = info.secret_source.empty() ? "given by the caller" : info.secret_source;
  } else if (auto env_secret = env::get("TESSERA_JOB_SECRET"); env_secret && !env_secret->empty()) {
    // A LaunchInfo made by hand (C API, tests): the job's secret if exported.
    m.key = *env_secret;
    m.key_source = "TESSERA_JOB_SECRET";
  } else {  // nothing: only accidents are kept out
    m.key = "tessera-unauthenticated|" + addr;
    m.key_source = "none given: derived from the rendezvous address (not a secret)";
  }
  m.bind_host = env::get("TESSERA_BOOTSTRAP_BIND").value_or("");
  const Deadline d = net::Clock::now() + timeout;
  if (info.rank == 0) {
    b->impl_->peers.resize(info.world);
    b->impl_->peer_addr.resize(info.world);
    b->impl_->connect_as_root(d);
  } else {
    b->impl_->connect_as_peer(d);
  }
  return b;
}

void Bootstrap::broadcast(void* data, std::size_t bytes, int root) {
  Impl& m = *impl_;
  m.check_usable();
  TESSERA_CHECK(root >= 0 && root < world_, "{}: broadcast root {} is out of range [0, {})", m.where(), root, world_);
  TESSERA_CHECK(data != nullptr || bytes == 0, "{}: broadcast of {} bytes from a null pointer", m.where(), bytes);
  ++m.seq;
  if (world_ == 1) return;
  const std::string during = describe(Op::broadcast, m.seq, root, bytes);
  if (rank_ == 0) {
    if (root != 0)
      m.gather_at_root(
          {root}, Op::broadcast, root, bytes, [&](int) { return data; }, during);
    for (int r = 1; r < world_; ++r)
      if (r != root) m.send_frame(r, Op::broadcast, root, bytes, data, during);
  } else if (rank_ == root) {
    m.send_frame(0, Op::broadcast, root, bytes, data, during);
  } else {
    m.recv_from_root(Op::broadcast, root, bytes, data, bytes, during);
  }
}

void Bootstrap::allgather(const void* in, void* out, std::size_t bytes_per_rank) {
  Impl& m = *impl_;
  m.check_usable();
  TESSERA_CHECK((in != nullptr && out != nullptr) || bytes_per_rank == 0,
                "{}: allgather of {} bytes per rank with a null pointer", m.where(), bytes_per_rank);
  TESSERA_CHECK(bytes_per_rank <= SIZE_MAX / static_cast<std::size_t>(world_),
                "{}: allgather of {} bytes per rank overflows", m.where(), bytes_per_rank);
  ++m.seq;
  char* o = static_cast<char*>(out);
  if (bytes_per_rank > 0) std::memmove(o + rank_ * bytes_per_rank, in, bytes_per_rank);
  if (world_ == 1) return;
  const std::string during = describe(Op::allgather, m.seq, -1, bytes_per_rank);
  const std::size_t total = bytes_per_rank * world_;
  if (rank_ == 0) {
    std::vector<int> from;
    for (int r = 1; r < world_; ++r) from.push_back(r);
    m.gather_at_root(
        from, Op::allgather, -1, bytes_per_rank, [&](int r) -> void* { return o + r * bytes_per_rank; }, during);
    // Peers check the frame against bytes_per_rank; the payload is all ranks'.
    for (int r = 1; r < world_; ++r) {
      const Frame f{kFrameMagic, Op::allgather, m.seq, -1, bytes_per_rank};
      m.send_or_fail(r, &f, sizeof f, during);
      if (total > 0) m.send_or_fail(r, o, total, during);
    }
  } else {
    m.send_frame(0, Op::allgather, -1, bytes_per_rank, o + rank_ * bytes_per_rank, during);
    m.recv_from_root(Op::allgather, -1, bytes_per_rank, o, total, during);
  }
}

void Bootstrap::barrier() {
  Impl& m = *impl_;
  m.check_usable();
  ++m.seq;
  if (world_ == 1) return;
  const std::string during = describe(Op::barrier, m.seq, -1, 0);
  if (rank_ == 0) {
    std::vector<int> from;
    for (int r = 1; r < world_; ++r) from.push_back(r);
    m.gather_at_root(
        from, Op::barrier, -1, 0, [](int) -> void* { return nullptr; }, during);
    for (int r = 1; r < world_; ++r) m.send_frame(r, Op::barrier, -1, 0, nullptr, during);
  } else {
    m.send_frame(0, Op::barrier, -1, 0, nullptr, during);
    m.recv_from_root(Op::barrier, -1, 0, nullptr, 0, during);
  }
}

void Bootstrap::check_same(const void* data, std::size_t bytes, const std::string& what) {
  std::vector<unsigned char> all(bytes * world_);
  allgather(data, all.data(), bytes);
  std::vector<int> differ;
  for (int r = 1; r < world_; ++r)
    if (std::memcmp(all.data(), all.data() + r * bytes, bytes) != 0) differ.push_back(r);
  TESSERA_CHECK(differ.empty(), "{}: {} differs between ranks: rank(s) {} disagree with rank 0", impl_->where(), what,
                join_ranks(differ));
}

}  // namespace tessera::runtime
