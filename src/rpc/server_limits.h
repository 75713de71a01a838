// SessionRateLimiter: how many sessions one peer may open on a node per
// minute (issue 8, "secure by default"), beside the per-peer limit on
// concurrent calls (rpc/server.cc).
//
// A peer (a client address, or the identity of its client certificate) has a
// token bucket of `per_minute` sessions that refills at per_minute / 60 per
// second: a burst of up to per_minute opens passes, then one every
// 60 / per_minute seconds. Opening a session is a prefill step; a prefill of
// a session this peer opened within the last minute (a re-prefill after a
// cache miss, a retry after a busy node, a resent step) costs nothing, so a
// client's recoveries are not held against it. Over the limit: Error
// (kResourceExhausted) with a retry hint ("retry in N ms"), which the client
// treats as a busy node (backoff, no recovery); the peer's other steps and
// other peers go on.
//
// Memory: per peer, at most 2 x per_minute remembered session ids (those
// opened in the last minute); peers idle for a minute are dropped.
//
// Thread-safety: Open() is thread-safe; the clock must be too.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "util/clock.h"

namespace meshnet::rpc {

inline constexpr int64_t kDefaultNewSessionsPerMinute = 3000;
inline constexpr int64_t kMaxNewSessionsPerMinute = 1000000;

class SessionRateLimiter {
 public:
  // `per_minute` in 1..kMaxNewSessionsPerMinute (Error(kInvalidArgument)).
  explicit SessionRateLimiter(int64_t per_minute,
                              const meshnet::Clock* clock = meshnet::SteadyClock::Default());

  // Charges `peer` for opening `session_id` (see the header comment); throws
  // Error(kResourceExhausted) with a retry hint when its budget is spent.
  void Open(const std::string& peer, const std::string& session_id);

  int64_t peers() const;  // peers remembered now
  int64_t refused() const;

 private:
  struct Peer {
    double tokens = 0;
    double updated = 0;                              // when `tokens` was last refilled
    std::unordered_map<std::string, double> opened;  // session id -> when charged
  };
  void RefillLocked(Peer& p, double now) const;
  void ForgetOldLocked(Peer& p, double now) const;
  void SweepLocked(double now);

  const double per_minute_;
  const double per_second_;
  const meshnet::Clock* clock_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Peer> peers_;  // GUARDED_BY(mu_)
  size_t sweep_at_ = 1024;                       // GUARDED_BY(mu_)
  int64_t refused_ = 0;                          // GUARDED_BY(mu_)
};

}  // namespace meshnet::rpc
