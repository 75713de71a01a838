// Announcer: keeps one node announced in a registry. A thread announces the
// record `describe()` returns under a lease of `ttl_s`, then renews it every
// ttl_s / 3 with a fresh record (load, free KV); a lease found gone is
// announced again, an unreachable registry is retried at the next beat (the
// node keeps serving). Stop() withdraws the record.
//
//   Announcer a(registry.get(), [&] { return RecordOf(node); }, 10.0);
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
  Announcer(Registry* registry, std::function<NodeRecord()> describe, double ttl_s);
  ~Announcer();  // Stop()
  Announcer(const Announcer&) = delete;
  Announcer& operator=(const Announcer&) = delete;

  void Start();
  // Withdraws the record (best effort) and joins the thread. Idempotent.
  void Stop();
  // Sets the record's draining flag and heartbeats now.
  void SetDraining(bool draining);
  // Announcements made so far (1 after the first; more after lost leases).
  int64_t announcements() const;
  // Whether the last heartbeat (or announcement) reached the registry.
  bool registered() const;

 private:
  void Run();
  // One announcement or renewal; false when the registry was unreachable.
  bool Beat(LeaseId& lease);

  Registry* registry_;
  std::function<NodeRecord()> describe_;
  double ttl_s_;
  mutable Mutex mu_;
  CondVar wake_{&mu_};
  bool stop_ GUARDED_BY(mu_) = false;
  bool draining_ GUARDED_BY(mu_) = false;
  bool beat_now_ GUARDED_BY(mu_) = false;
  int64_t announcements_ GUARDED_BY(mu_) = 0;
  bool registered_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace meshnet::registry
