#include "socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "tessera/runtime/error.hpp"

namespace tessera::runtime::net {

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);  // close() is not retried on EINTR on Linux: the fd is gone either way
  fd_ = -1;
}

int ms_left(Deadline d) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d - Clock::now()).count();
  if (left <= 0) return 0;
  return static_cast<int>(std::min<long long>(left, 1 << 30));
}

std::string errno_text(int err) { return fmt::format("{} (errno {})", std::strerror(err), err); }

std::string address_string(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

namespace {

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  TESSERA_CHECK(flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0, "bootstrap: fcntl(O_NONBLOCK): {}",
                errno_text(errno));
}

void tune_stream_socket(int fd) {
  const int one = 1;
  // Small host-side messages: send them now rather than coalescing (Nagle).
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/// Waits for `events` on fd; returns poll's revents, 0 once the deadline passed.
short wait_for(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, ms_left(deadline));
    if (rc > 0) return p.revents;
    if (rc == 0 || ms_left(deadline) == 0) return 0;
    if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // never spin on a poll error
  }
}

std::string sockaddr_string(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
  }
  return address_string(host, port);
}

struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head) ::freeaddrinfo(head);
  }
};

/// getaddrinfo; returns its error code (0 on success).
int resolve(const std::string& host, int port, bool passive, AddrInfoList& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string service = std::to_string(port);
  // "*" with `passive`: the wildcard addresses.
  return ::getaddrinfo(passive && host == "*" ? nullptr : host.c_str(), service.c_str(), &hints, &out.head);
}

}  // namespace

IoResult send_all(int fd, const void* data, std::size_t n, Deadline deadline) {
  IoResult r;
  const char* p = static_cast<const char*>(data);
  while (r.done < n) {
    const ssize_t k = ::send(fd, p + r.done, n - r.done, MSG_NOSIGNAL);
    if (k > 0) {
      r.done += static_cast<std::size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const short ev = wait_for(fd, POLLOUT, deadline);
      if (ev == 0) {
        r.status = IoStatus::timeout;
        return r;
      }
      continue;  // writable, or an error that the next send() reports
    }
    r.err = k < 0 ? errno : 0;
    r.status = (r.err == EPIPE || r.err == ECONNRESET) ? IoStatus::closed : IoStatus::error;
    return r;
  }
  return r;
}

long recv_some(int fd, void* data, std::size_t n, IoResult& res) {
  for (;;) {
    const ssize_t k = ::recv(fd, data, n, 0);
    if (k >= 0) return static_cast<long>(k);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return -1;
    res.err = errno;
    res.status = errno == ECONNRESET ? IoStatus::closed : IoStatus::error;
    return 0;
  }
}

IoResult recv_all(int fd, void* data, std::size_t n, Deadline deadline) {
  IoResult r;
  char* p = static_cast<char*>(data);
  while (r.done < n) {
    const long k = recv_some(fd, p + r.done, n - r.done, r);
    if (r.status != IoStatus::ok) return r;
    if (k > 0) {
      r.done += static_cast<std::size_t>(k);
      continue;
    }
    if (k == 0) {
      r.status = IoStatus::closed;
      return r;
    }
    if (wait_for(fd, POLLIN, deadline) == 0) {
      r.status = IoStatus::timeout;
      return r;
    }
  }
  return r;
}

Fd listen_on(const std::string& host, int port, int backlog, const std::string& bind_host) {
  const std::string& where = bind_host.empty() ? host : bind_host;
  AddrInfoList target;
  const int gai = resolve(where, port, !bind_host.empty() && bind_host == "*", target);
  TESSERA_CHECK(gai == 0, "bootstrap: cannot resolve {} '{}': {}",
                bind_host.empty() ? "MASTER_ADDR" : "TESSERA_BOOTSTRAP_BIND", where, ::gai_strerror(gai));
  // Bind exactly the given address (the first of its addresses that binds):
  // rank 0 listens where the job said, never on every interface unless
  // TESSERA_BOOTSTRAP_BIND asks for it.
  std::string tried;
  int first_err = 0;
  for (const addrinfo* ai = target.head; ai != nullptr; ai = ai->ai_next) {
    Fd s(::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) {
      if (first_err == 0) first_err = errno;
      continue;
    }
    const int one = 1;
    // SO_REUSEADDR: a port left in TIME_WAIT by the previous job can be bound
    // again (Linux never lets it share a port with a live listener).
    (void)::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ai->ai_family == AF_INET6) {
      const int v6only = bind_host == "*" ? 0 : 1;  // the wildcard: IPv4 too
      (void)::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
    }
    if (::bind(s.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      const int err = errno;
      if (first_err == 0) first_err = err;
      tried += (tried.empty() ? "" : ", ") + sockaddr_string(ai->ai_addr) + ": " + errno_text(err);
      continue;
    }
    TESSERA_CHECK(::listen(s.get(), backlog) == 0, "bootstrap: listen on {}: {}", address_string(host, port),
                  errno_text(errno));
    set_nonblocking(s.get());
    return s;
  }
  TESSERA_FAIL("bootstrap: rank 0 cannot listen on {} ({}){}", address_string(where, port), tried,
               first_err == EADDRINUSE ? " — another process holds MASTER_PORT (another job, or an impostor); choose "
                                         "another port"
               : first_err == EADDRNOTAVAIL
                   ? " — MASTER_ADDR is not an address of this host; give rank 0's own address, or set "
                     "TESSERA_BOOTSTRAP_BIND to the local address to listen on ('*' = every interface)"
                   : "");
}

Fd accept_until(int listen_fd, Deadline deadline, std::string* peer, int* accept_errno) {
  if (accept_errno) *accept_errno = 0;
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      tune_stream_socket(fd);
      if (peer) *peer = sockaddr_string(reinterpret_cast<sockaddr*>(&addr));
      return Fd(fd);
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    // Out of descriptors (EMFILE/ENFILE) or memory: the caller frees some.
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      if (accept_errno) *accept_errno = errno;
      return Fd();
    }
    TESSERA_CHECK(errno == EAGAIN || errno == EWOULDBLOCK, "bootstrap: accept(): {}", errno_text(errno));
    if (wait_for(listen_fd, POLLIN, deadline) == 0) return Fd();
  }
}

Fd connect_until(const std::string& host, int port, Deadline deadline, std::string* last_error) {
  for (;;) {
    AddrInfoList list;
    const int gai = resolve(host, port, false, list);
    if (gai != 0) {
      // A temporary resolver failure is retried; an unknown name is not.
      TESSERA_CHECK(gai == EAI_AGAIN, "bootstrap: cannot resolve MASTER_ADDR '{}': {}", host, ::gai_strerror(gai));
      if (last_error) *last_error = ::gai_strerror(gai);
    }
    for (const addrinfo* ai = list.head; ai != nullptr; ai = ai->ai_next) {
      Fd s(::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      if (!s.valid()) {
        if (last_error) *last_error = errno_text(errno);
        continue;
      }
      int rc = ::connect(s.get(), ai->ai_addr, ai->ai_addrlen);
      int err = rc == 0 ? 0 : errno;
      if (rc != 0 && (err == EINPROGRESS || err == EINTR)) {
        const short ev = wait_for(s.get(), POLLOUT, deadline);
        if (ev == 0) {
          err = ETIMEDOUT;
        } else {
          socklen_t len = sizeof err;
          if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
      }
      if (err == 0) {
        tune_stream_socket(s.get());
        return s;
      }
      if (last_error) *last_error = errno_text(err);
    }
    if (ms_left(deadline) == 0) return Fd();
    // Rank 0 may not be listening yet: retry a little later.
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50, ms_left(deadline))));
  }
}

int free_port() {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  TESSERA_CHECK(s.valid(), "free_port: socket(): {}", errno_text(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  TESSERA_CHECK(::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, "free_port: bind(): {}",
                errno_text(errno));
  socklen_t len = sizeof addr;
  TESSERA_CHECK(::getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0, "free_port: getsockname(): {}",
                errno_text(errno));
  return ntohs(addr.sin_port);
}

}  // namespace tessera::runtime::net
