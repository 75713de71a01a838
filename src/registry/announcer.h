// Announcer: keeps one node announced in a registry. A thread announces the
// record `describe()` returns (signed by the node: registry/record.h) under a
// lease of `ttl_s` (or the shorter TTL the registry grants), then renews it
// every third of that with a fresh record (load, free KV, draining); a lease
// found gone is announced again, an unreachable registry is retried at the
// next beat (the node keeps serving). Stop() withdraws the record. The lease
// and its secret never leave this object.
//
//   Announcer a(registry.get(), [&](bool draining) { return SignedRecordOf(node, draining); },
//               10.0);
//   a.Start();
//   ...
//   a.SetDraining(true);   // a drain: heartbeat at once with draining set
//   a.Stop();
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "registry/registry.h"
#include "util/mutex.h"

namespace meshnet::registry {

class Announcer {
 public:
  // `describe(draining)`: the node's record with that draining flag, signed.
  Announcer(Registry* registry, std::function<NodeRecord(bool draining)> describe, double ttl_s);
  ~Announcer();  // Stop()
  Announcer(const Announcer&) = delete;
  Announcer& operator=(const Announcer&) = delete;

  void Start();
  // Withdraws the record (best effort) and joins the thread. Idempotent.
  void Stop();
  // Sets the record's draining flag and heartbeats now; waits (up to
  // `wait_s`) for that heartbeat, and returns whether it reached the registry.
  bool SetDraining(bool draining, double wait_s = 5.0);
  // Announcements made so far (1 after the first; more after lost leases).
  int64_t announcements() const;
  // Whether the last heartbeat (or announcement) reached the registry.
  bool registered() const;

 private:
  void Run();
  // One announcement or renewal; false when the registry was unreachable.
  bool Beat(Lease& lease, bool draining);

  Registry* registry_;
  std::function<NodeRecord(bool)> describe_;
  double ttl_s_;
  mutable Mutex mu_;
  CondVar wake_{&mu_};
  bool stop_ GUARDED_BY(mu_) = false;
  bool draining_ GUARDED_BY(mu_) = false;
  bool beat_now_ GUARDED_BY(mu_) = false;
  int64_t announcements_ GUARDED_BY(mu_) = 0;
  bool registered_ GUARDED_BY(mu_) = false;
  int64_t beats_started_ GUARDED_BY(mu_) = 0;
  int64_t beats_done_ GUARDED_BY(mu_) = 0;
  double period_s_ GUARDED_BY(mu_) = 0;  // a third of the granted TTL
  std::thread thread_;
};

}  // namespace meshnet::registry
