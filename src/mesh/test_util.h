// Test-only helpers for multi-session tests (header-only; never linked into
// the library): an endpoint decorator that records how many hops of a route
// have a step in progress at once, to show that a client pipelines sessions
// across the hops instead of running one step of the whole mesh at a time.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "mesh/endpoint.h"
#include "mesh/generator.h"
#include "util/mutex.h"

namespace meshnet::mesh::testing {

// Shared by the observed hops of one route.
class HopActivity {
 public:
  explicit HopActivity(int hops) : active_(static_cast<size_t>(hops), 0) {}

  void Enter(int hop) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    ++active_[static_cast<size_t>(hop)];
    const int busy = static_cast<int>(
        std::count_if(active_.begin(), active_.end(), [](int n) { return n > 0; }));
    max_busy_hops_ = std::max(max_busy_hops_, busy);
    ++steps_;
  }
  void Exit(int hop) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    --active_[static_cast<size_t>(hop)];
  }
  // The most hops that had a step in progress at the same moment.
  int max_busy_hops() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return max_busy_hops_;
  }
  int64_t steps() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return steps_;
  }

 private:
  Mutex mu_;
  std::vector<int> active_ GUARDED_BY(mu_);
  int max_busy_hops_ GUARDED_BY(mu_) = 0;
  int64_t steps_ GUARDED_BY(mu_) = 0;
};

// Forwards to `inner`, marking the hop busy for the duration of each Step
// (for a remote hop: the call, which spans the node's compute).
class ObservedEndpoint final : public ShardEndpoint {
 public:
  ObservedEndpoint(std::shared_ptr<ShardEndpoint> inner, int hop, HopActivity* activity)
      : inner_(std::move(inner)), hop_(hop), activity_(activity) {}
  std::string name() const override { return inner_->name(); }
  ShardInfo Info() override { return inner_->Info(); }
  StepResult Step(StepRequest request) override {
    activity_->Enter(hop_);
    struct Exit {
      HopActivity* a;
      int hop;
      ~Exit() { a->Exit(hop); }
    } exit{activity_, hop_};
    return inner_->Step(std::move(request));
  }
  void Release(const std::string& id, const std::string& secret, int64_t epoch) override {
    inner_->Release(id, secret, epoch);
  }

 private:
  std::shared_ptr<ShardEndpoint> inner_;
  int hop_;
  HopActivity* activity_;
};

// `route` with every hop observed by `activity` (hop i is route.hops[i]).
inline Route Observed(const Route& route, HopActivity* activity) {
  Route out;
  for (size_t i = 0; i < route.hops.size(); ++i) {
    out.hops.push_back(
        std::make_shared<ObservedEndpoint>(route.hops[i], static_cast<int>(i), activity));
  }
  return out;
}

}  // namespace meshnet::mesh::testing
