// RankGate: at most `depth` holders at a time; when a place frees, the
// waiter with the lowest rank gets it (first come among equal ranks), unless
// the longest waiter has seen kMaxBypass places go to others: then it goes
// first (nobody starves behind a stream of lower ranks).
//
//   util::RankGate gate(1);
//   {
//     util::RankGate::Hold hold(&gate, /*rank=*/layer);  // blocks for a place
//     ... one call ...
//   }
//
// The client's pipeline depth (rpc::ClientOptions::pipeline_depth): at most
// `depth` step calls of a route in flight, the call to the earliest layers
// first, so a cohort of sessions that falls behind another one catches up
// with it at the next node (they wait at the same node and go as one call)
// instead of trailing it forever. Written here: no Debian library has a
// priority semaphore.
//
// Thread-safety: all members may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <utility>

#include "util/mutex.h"

namespace meshnet::util {

class RankGate {
 public:
  // depth >= 1.
  explicit RankGate(int depth);
  RankGate(const RankGate&) = delete;
  RankGate& operator=(const RankGate&) = delete;

  // Blocks until this caller holds a place. Returns its arrival mark (for
  // Yield).
  int64_t Acquire(int64_t rank) EXCLUDES(mu_);
  void Release() EXCLUDES(mu_);
  // A holder about to use its place: if someone of a lower rank waits now,
  // hands it the place and waits for the next one (true); else false. It
  // keeps its first arrival (`arrival`, from Acquire) for the starvation
  // rule, so yielding never starves it.
  bool Yield(int64_t rank, int64_t arrival) EXCLUDES(mu_);

  static constexpr int64_t kMaxBypass = 16;

  int depth() const { return depth_; }
  int64_t holders() const EXCLUDES(mu_);
  int64_t waiters() const EXCLUDES(mu_);

  class Hold {
   public:
    Hold(RankGate* gate, int64_t rank) : gate_(gate), rank_(rank) {
      if (gate_) arrival_ = gate_->Acquire(rank);
    }
    ~Hold() {
      if (gate_) gate_->Release();
    }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    bool Yield() { return gate_ && gate_->Yield(rank_, arrival_); }

   private:
    RankGate* gate_;
    int64_t rank_;
    int64_t arrival_ = 0;
  };

 private:
  // Waits, queued as `rank` since grant number `arrival`, for a place.
  void WaitLocked(int64_t rank, int64_t arrival) REQUIRES(mu_);
  // Hands free places to the best waiters.
  void GrantLocked() REQUIRES(mu_);

  const int depth_;
  mutable Mutex mu_;
  CondVar changed_{&mu_};
  int64_t holders_ GUARDED_BY(mu_) = 0;
  uint64_t next_ticket_ GUARDED_BY(mu_) = 0;
  int64_t grants_ GUARDED_BY(mu_) = 0;  // places handed out so far
  struct Waiter {
    int64_t rank;
    int64_t grants_at_arrival;
  };
  std::map<uint64_t, Waiter> waiters_ GUARDED_BY(mu_);                 // by ticket
  std::set<std::pair<int64_t, uint64_t>> by_rank_ GUARDED_BY(mu_);     // (rank, ticket)
  std::set<std::pair<int64_t, uint64_t>> by_arrival_ GUARDED_BY(mu_);  // (arrival, ticket)
  std::set<uint64_t> granted_ GUARDED_BY(mu_);                         // tickets let in
};

}  // namespace meshnet::util
