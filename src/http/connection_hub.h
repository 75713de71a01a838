// The connections of a hardened HTTP server (http/hardened_server.h) between
// requests: one poller thread accepts them (refusing beyond the total and
// per-address caps), drives each one's TLS handshake, request head and
// lingering close without blocking (http/connection.h), and hands a
// connection whose head is complete to the workers, which take it with
// TakeReady and give it back with Return. Slow, idle and oversized clients
// therefore cost a socket and at most one head's bytes, never a thread.
//
// Stop: no more accepts; every connection not in a worker closes at once;
// workers finish their request; at the hard deadline the connections still
// in workers are shut down so their reads and writes fail.
//
// Thread-safety: Run on one thread; TakeReady, Return and Stop from any.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "http/connection.h"
#include "http/tls_context.h"
#include "util/mutex.h"

namespace meshnet::http {

struct HubLimits {
  int max_connections = 512;        // open at once, all addresses
  int max_connections_per_ip = 64;  // from one IPv4 address or IPv6 /64
  size_t max_ready = 64;            // complete heads waiting for a worker (then 503)
};

class ConnectionHub {
 public:
  // `listen_fd` is a bound, listening, non-blocking socket (owned: closed on
  // Stop); `tls` may be null (plain HTTP).
  ConnectionHub(int listen_fd, const TlsContext* tls, ConnectionLimits limits, HubLimits hub,
                RefusalBody render);
  ~ConnectionHub();
  ConnectionHub(const ConnectionHub&) = delete;
  ConnectionHub& operator=(const ConnectionHub&) = delete;

  // The poller loop; returns once stopped and every connection is closed.
  void Run();
  // A connection with a complete head (the worker serves it), or nullptr
  // once the hub is stopping and nothing is ready.
  std::unique_ptr<Connection> TakeReady();
  // A worker is done with a request: `keep` for the next request on the same
  // connection, else it is closed (after a linger).
  void Return(std::unique_ptr<Connection> conn, bool keep);
  void Stop(Clock::time_point hard_deadline);
  bool stopping() const;
  int open_connections() const;

 private:
  void AcceptSome();
  // A connection whose Advance said kReady: queued for a worker (or 503).
  void Dispatch(std::unique_ptr<Connection> conn);
  void Destroy(std::unique_ptr<Connection> conn);
  void TakeReturned();
  void PollOnce();
  void CloseAllWaiting();
  bool Finished();
  void Wake();

  int listen_fd_;
  const int wake_fd_;
  const TlsContext* tls_;
  const ConnectionLimits limits_;
  const HubLimits hub_;
  const RefusalBody render_;
  Clock::time_point accept_paused_until_{};
  std::vector<std::unique_ptr<Connection>> waiting_;  // the poller's (Run's thread only)

  mutable Mutex mu_;
  CondVar ready_cv_{&mu_};
  std::deque<std::unique_ptr<Connection>> ready_ GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Connection>> returned_ GUARDED_BY(mu_);
  std::unordered_set<Connection*> active_ GUARDED_BY(mu_);  // in workers
  std::unordered_map<std::string, int> per_ip_ GUARDED_BY(mu_);
  int open_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  Clock::time_point hard_deadline_ GUARDED_BY(mu_) = Clock::time_point::max();
  bool shut_active_ GUARDED_BY(mu_) = false;
};

}  // namespace meshnet::http
