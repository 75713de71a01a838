// SessionAdmission: which sessions may hold KV state on a node right now.
//
// The KV manager evicts the least recently used session when a new one needs
// room (its reference semantics, kept for traces). On a busy node that victim
// may be mid-generation. Admission control sits in front: a session is
// *active* while it has a step within `active_window_s`; at most
// `max_active` sessions (the manager's max_sessions) are active at once, so
// the manager's LRU victim is always an idle session, never an active one.
//
//  * Admit(id): called before a session's first step (its opening prefill).
//    An active session passes at once. A new one passes when fewer than
//    max_active sessions are active; otherwise it waits, first come first
//    served, up to max_wait_s, in a queue of at most max_waiting. When the
//    wait runs out or the queue is full: Error(kResourceExhausted) with a
//    retry hint ("retry in N ms"), and the caller's state is untouched.
//  * Touch(id): a step of an admitted session (keeps it active).
//  * Release(id): its state is gone (released, dropped): the slot frees now.
//    A session whose client vanished frees its slot active_window_s after
//    its last step.
//
// Thread-safety: all methods are thread-safe; Admit blocks only the caller.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

#include "util/clock.h"

namespace meshnet::node {

struct AdmissionOptions {
  int64_t max_active = 0;  // 0: the KV manager's max_sessions (NodeCore fills it in)
  double active_window_s = 30.0;
  double max_wait_s = 10.0;
  int64_t max_waiting = 16;

  void Validate() const;  // Error(kInvalidArgument) naming the field
};

class SessionAdmission {
 public:
  explicit SessionAdmission(AdmissionOptions options,
                            const meshnet::Clock* clock = meshnet::SteadyClock::Default());

  // See the header comment. `cancelled` is polled while waiting (the call's
  // client gone, shutdown): then Error(kUnavailable).
  void Admit(const std::string& session_id, const std::function<bool()>& cancelled = {});
  void Touch(const std::string& session_id);
  void Release(const std::string& session_id);

  int64_t active() const;   // sessions active now
  int64_t waiting() const;  // callers queued in Admit
  const AdmissionOptions& options() const { return options_; }

 private:
  int64_t ActiveLocked(double now);           // prunes sessions idle past the window
  double NextExpiryLocked(double now) const;  // seconds until an active one goes idle

  const AdmissionOptions options_;
  const meshnet::Clock* clock_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::unordered_map<std::string, double> last_step_;  // GUARDED_BY(mu_)
  std::deque<uint64_t> queue_;                         // GUARDED_BY(mu_): tickets, FIFO
  uint64_t next_ticket_ = 0;                           // GUARDED_BY(mu_)
};

}  // namespace meshnet::node
