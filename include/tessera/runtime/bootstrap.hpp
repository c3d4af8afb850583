// tessera/runtime/bootstrap.hpp — a small TCP rendezvous between the ranks of
// a job: used to exchange the NCCL unique id and for host-side collectives
// (e.g. checking that every rank passes the same shapes).
//
// Topology: a star. Rank 0 listens on master_addr:master_port, the others
// connect to it; every collective goes through rank 0. Meant for a few small
// messages at set-up, not for bulk data.
//
// Listening: rank 0 binds exactly MASTER_ADDR (one of its addresses), never
// every interface, unless TESSERA_BOOTSTRAP_BIND names the local address to
// bind ("*" = every interface, an explicit opt-in). A port already taken is
// an error naming it (another job, or an impostor).
//
// Handshake, authenticated both ways with the job secret (LaunchInfo::
// job_secret; runtime/launch.hpp says where it comes from), which never
// travels: each connecting rank sends {magic, protocol version, world size,
// rank, nonce}; rank 0 refuses (with a reason the peer reports) a wrong
// version, a different world size or an out-of-range rank, otherwise answers
// with its own nonce and an HMAC-SHA-256 of both nonces, world and rank under
// the secret. The rank refuses a rank 0 that cannot produce it ("not this
// job's rank 0": an impostor or another job on MASTER_PORT), then proves its
// own knowledge the same way (another label); rank 0 compares in constant
// time and only then lets it take its rank (a duplicate is refused). A
// refusal, garbage, or a connection that does not finish its handshake
// within 5 s closes that connection and nothing else; at most 32 connections
// may be handshaking at once (the oldest is closed beyond that, and when rank
// 0 runs out of file descriptors), so idle connections cannot exhaust rank 0
// or keep the real ranks out. Rank 0 answers the valid ranks only once the
// whole world has connected, so connect() returns on every rank only when
// the job is assembled. What this does not do: encrypt or authenticate the
// later traffic (an attacker would have to hijack an established TCP
// connection), or protect a derived (non-secret) key; with an empty
// job_secret the key is TESSERA_JOB_SECRET if set, else derived from the
// rendezvous address (no protection beyond accidents).
//
// Collectives carry {op, sequence number, root, byte count}; ranks that call
// different collectives, or pass different sizes, get an error naming both
// sides instead of silently exchanging garbage.
//
// Failure contract: every blocking step (connect, handshake, each collective)
// is bounded by the timeout given to connect(); a peer that exits (its socket
// closes) is detected at once. Both give a tessera::Error naming the rank(s)
// and the address. When rank 0 detects a failure it forwards the reason to
// the surviving ranks, so all of them report the same culprit. A Bootstrap
// that has thrown is broken: later calls throw too.
//
// Not thread-safe: one thread per process calls the collectives, in the same
// order on every rank.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "tessera/runtime/launch.hpp"

namespace tessera::runtime {

/// TESSERA_BOOTSTRAP_TIMEOUT_MS (default 60000, must be >= 1).
std::chrono::milliseconds default_bootstrap_timeout();

/// A TCP port on which nothing listens right now (the OS picks it). Another
/// process may take it before it is used; good enough for local launches.
int find_free_tcp_port();

class Bootstrap {
 public:
  /// Rank 0 listens on info.master_addr:info.master_port; the others connect,
  /// retrying until `timeout`. world == 1 uses no socket at all.
  static std::unique_ptr<Bootstrap> connect(const LaunchInfo& info, std::chrono::milliseconds timeout);
  /// Same, with default_bootstrap_timeout().
  static std::unique_ptr<Bootstrap> connect(const LaunchInfo& info);

  int rank() const { return rank_; }
  int world() const { return world_; }
  /// "host:port" of rank 0.
  const std::string& address() const { return address_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// Copies `bytes` from rank `root` into `data` on every rank.
  virtual void broadcast(void* data, std::size_t bytes, int root);
  /// out[r * bytes_per_rank ...] = rank r's `in`, on every rank. `out` holds
  /// world * bytes_per_rank bytes; in and out may not overlap.
  virtual void allgather(const void* in, void* out, std::size_t bytes_per_rank);
  /// Returns once every rank has entered the barrier.
  virtual void barrier();
  /// Throws a tessera::Error naming `what` and the ranks whose `bytes` bytes
  /// at `data` differ from rank 0's (the same error on every rank).
  virtual void check_same(const void* data, std::size_t bytes, const std::string& what);

  virtual ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  struct Impl;  // sockets and protocol state (src/runtime/bootstrap.cpp)

 protected:
  /// For subclasses that exchange by other means (NcclBootstrap,
  /// runtime/nccl_bootstrap.hpp): they override the four exchanges above.
  Bootstrap(int rank, int world, std::string address, std::chrono::milliseconds timeout);

 private:
  int rank_ = 0, world_ = 1;
  std::string address_;
  std::chrono::milliseconds timeout_{0};
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::runtime
