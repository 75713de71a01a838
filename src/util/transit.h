// Transit: the sessions of this process that are between two steps: their
// last step came back and their next one has not queued yet. Process-wide,
// since they go on to whichever hop is next on their route.
//
// Why: the sessions of one batch (a gRPC group call, or an in-process
// shard's batch) wake one after another, and the first to reach the next hop
// would go alone and split the cohort (a session once alone stays out of
// phase). So whoever is about to start the next call or batch waits, briefly
// and bounded, until nobody is in transit: the cohort stays one call (one
// batch) per hop. Users: rpc::RemoteEndpoint's grouping
// (ClientOptions::transit_wait_s) and the in-process shards' turns
// (node::Batcher::SetTurnGate).
//
//   // whoever finishes a batch of k answered steps, before waking them:
//   util::Transit::Get().Count(k);
//   // each of those steps' threads, once awake: Adopt();
//   //   on its next step, once queued: Clear();   on an error: Clear()
//   // the next call's leader:
//   util::Transit::Get().Wait(0.002);
//
// A thread carries at most one mark (one session per thread at a time); a
// thread that exits marked is cleared. A lone session never waits on itself
// (its mark is cleared when its step queues). Marks still there when a wait
// runs out are forgotten (no later wait is for them) until they clear: a
// session held up between two steps (a client reading its stream slowly)
// delays the others' next batch once, by the wait's bound, not every batch.
//
// Thread-safety: all members may be called from any thread; marks are per
// thread.
#pragma once

#include <cstdint>

#include "util/mutex.h"

namespace meshnet::util {

class Transit {
 public:
  static Transit& Get();
  // This thread's session got its answer (mark; nothing if marked already) /
  // queued its next step or ended (clear; nothing if not marked).
  void Mark();
  void Clear();
  // k sessions whose marks their threads will Adopt (or Uncount).
  void Count(int64_t k) EXCLUDES(mu_);
  // This thread takes over one counted mark (if it had one already, the
  // count drops back by one: one mark per thread).
  void Adopt();
  void Uncount() EXCLUDES(mu_);
  // Until nobody is in transit but forgotten marks, at most `seconds`; the
  // marks left when it runs out are forgotten.
  void Wait(double seconds) EXCLUDES(mu_);
  // Sessions in transit now (for tests).
  int64_t count() const EXCLUDES(mu_);
  // Whether this thread is marked (for tests).
  static bool marked();

  // While one lives, this thread carries its session from hop to hop (an
  // in-process route's endpoint): a batch that counts its answered steps in
  // transit (node::Batcher's turns) counts this thread's, which adopts the
  // mark. Other callers of a batcher (a gRPC handler's thread) are not
  // counted: they do not go on to a next hop.
  class Carrier {
   public:
    Carrier() : outer_(carrying_) { carrying_ = true; }
    ~Carrier() { carrying_ = outer_; }
    Carrier(const Carrier&) = delete;
    Carrier& operator=(const Carrier&) = delete;

   private:
    bool outer_;
  };
  static bool carrying() { return carrying_; }

 private:
  struct ThreadMark {
    bool on = false;
    ~ThreadMark();
  };
  mutable Mutex mu_;
  CondVar zero_{&mu_};
  int64_t n_ GUARDED_BY(mu_) = 0;
  int64_t forgotten_ GUARDED_BY(mu_) = 0;  // of n_, marks no wait is for (<= n_)
  static thread_local ThreadMark mark_;
  static inline thread_local bool carrying_ = false;
};

}  // namespace meshnet::util
