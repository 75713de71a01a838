#include "util/rank_gate.h"

#include "util/error.h"

namespace meshnet::util {

RankGate::RankGate(int depth) : depth_(depth) {
  if (depth < 1) {
    throw Error(ErrorKind::kInvalidArgument,
                "pipeline depth must be at least 1, got " + std::to_string(depth));
  }
}

void RankGate::GrantLocked() {
  bool any = false;
  while (holders_ < depth_ && !waiters_.empty()) {
    const auto& [arrival, oldest] = *by_arrival_.begin();
    const uint64_t ticket = grants_ - arrival >= kMaxBypass ? oldest : by_rank_.begin()->second;
    const Waiter w = waiters_.at(ticket);
    by_rank_.erase({w.rank, ticket});
    by_arrival_.erase({w.grants_at_arrival, ticket});
    waiters_.erase(ticket);
    granted_.insert(ticket);
    ++grants_;
    ++holders_;
    any = true;
  }
  if (any) changed_.SignalAll();
}

int64_t RankGate::Acquire(int64_t rank) {
  MutexLock lock(&mu_);
  const int64_t arrival = grants_;
  WaitLocked(rank, arrival);
  return arrival;
}

bool RankGate::Yield(int64_t rank, int64_t arrival) {
  MutexLock lock(&mu_);
  if (by_rank_.empty() || by_rank_.begin()->first >= rank) return false;
  if (grants_ - arrival >= kMaxBypass) return false;  // it waited long enough
  --holders_;
  WaitLocked(rank, arrival);
  return true;
}

void RankGate::WaitLocked(int64_t rank, int64_t arrival) {
  const uint64_t ticket = next_ticket_++;
  waiters_.emplace(ticket, Waiter{rank, arrival});
  by_rank_.emplace(rank, ticket);
  by_arrival_.emplace(arrival, ticket);
  GrantLocked();
  while (granted_.count(ticket) == 0) changed_.Wait();
  granted_.erase(ticket);
}

void RankGate::Release() {
  MutexLock lock(&mu_);
  --holders_;
  GrantLocked();
}

int64_t RankGate::holders() const {
  MutexLock lock(&mu_);
  return holders_;
}

int64_t RankGate::waiters() const {
  MutexLock lock(&mu_);
  return static_cast<int64_t>(waiters_.size());
}

}  // namespace meshnet::util
