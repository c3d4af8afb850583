// src/runtime/socket.hpp — private TCP helpers for the bootstrap: an owning
// file descriptor, deadline-bounded connect/accept/send/recv on non-blocking
// sockets. Every call that can block takes a deadline and polls; EINTR is
// retried, partial reads/writes are continued, SIGPIPE is never raised
// (MSG_NOSIGNAL).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>

namespace tessera::runtime::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

/// Owns one file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

/// Milliseconds left until `d` (0 if passed), clamped for poll().
int ms_left(Deadline d);

/// Outcome of a bounded I/O call that did not throw.
enum class IoStatus { ok, closed, timeout, error };

struct IoResult {
  IoStatus status = IoStatus::ok;
  int err = 0;           // errno for IoStatus::error
  std::size_t done = 0;  // bytes transferred
};

/// Sends/receives exactly `n` bytes before `deadline` (non-blocking socket).
IoResult send_all(int fd, const void* data, std::size_t n, Deadline deadline);
IoResult recv_all(int fd, void* data, std::size_t n, Deadline deadline);

/// One non-blocking receive attempt into [data, data+n): bytes read (> 0),
/// 0 when the peer closed, -1 when nothing is available; errno-style errors
/// are returned as IoResult through `res` (status error).
long recv_some(int fd, void* data, std::size_t n, IoResult& res);

/// Listening socket for rank 0 on host:port: binds exactly an address `host`
/// resolves to (the first that binds), never the wildcard — unless
/// `bind_host` is given: then that address ("*" = every interface).
/// SO_REUSEADDR. Throws tessera::Error naming host:port and why (port taken,
/// address not local).
Fd listen_on(const std::string& host, int port, int backlog, const std::string& bind_host = "");

/// Accepts one connection if one arrives before `deadline` (else invalid Fd).
/// `peer` receives "ip:port" of the other end. Out of file descriptors
/// (EMFILE, ENFILE) or memory: returns an invalid Fd with the errno in
/// `accept_errno` (0 otherwise) instead of throwing, so the caller can close
/// idle connections and go on.
Fd accept_until(int listen_fd, Deadline deadline, std::string* peer, int* accept_errno = nullptr);

/// Connects to host:port, retrying refused/unreachable attempts until
/// `deadline`. Returns an invalid Fd on timeout with the last error in
/// `last_error`. Throws on a host name that cannot be resolved at all.
Fd connect_until(const std::string& host, int port, Deadline deadline, std::string* last_error);

/// A TCP port on which nothing listens right now (bind to port 0, read it back).
int free_port();

/// "host:port" (IPv6 literals bracketed).
std::string address_string(const std::string& host, int port);

/// Human-readable errno text.
std::string errno_text(int err);

}  // namespace tessera::runtime::net
