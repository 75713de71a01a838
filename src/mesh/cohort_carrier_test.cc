// The cohort carrier against scripted hops (no model): which steps go in
// which group call, and that a step stopped early (a miss, an error, a
// redirect, another route) is handed back at its own hop without touching
// the others.
#include "mesh/cohort_carrier.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "mesh/route_step.h"
#include "util/error.h"

namespace meshnet::mesh {
namespace {

constexpr double kTransitWaitS = 0.002;

// The tail's token for a session's carried value: a function of every hop it
// went through, so a step that skipped or repeated a hop gets another one.
int32_t TokenFor(float value) { return static_cast<int32_t>(value) % 1000; }

// Hop k adds k + 1 to the value (the token, at the head); the tail answers
// TokenFor(value). Per session: a miss or an error instead, or "moved".
class ScriptHop : public ShardEndpoint {
 public:
  ScriptHop(std::string name, int index, bool tail)
      : name_(std::move(name)), index_(index), tail_(tail) {}
  std::string name() const override { return name_; }
  ShardInfo Info() override { return {}; }

  StepResult Step(StepRequest req) override {
    std::lock_guard<std::mutex> lock(mu_);
    seen_.insert(req.session_id);
    if (errors_.count(req.session_id)) {
      throw Error(ErrorKind::kUnavailable, name_ + " is down for " + req.session_id);
    }
    if (auto it = misses_.find(req.session_id); it != misses_.end()) {
      kv::CacheMiss miss{req.session_id, req.route_epoch, it->second.first, ""};
      miss.moved_to = it->second.second;
      return miss;
    }
    const float in =
        req.bundle ? req.bundle->residual.at(0) : static_cast<float>(req.token_ids.at(0));
    const float value = in + static_cast<float>(index_ + 1);
    if (tail_) {
      shard::TailOutput out;
      out.token_id = TokenFor(value);
      return out;
    }
    shard::BoundaryBundle b;
    b.n_tokens = 1;
    b.n_embd = 1;
    b.residual = {value};
    return b;
  }

  std::vector<GroupAnswer> StepGroup(std::span<const StepRequest> requests) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      group_sizes_.push_back(requests.size());
      if (hold_first_ && group_sizes_.size() == 1) {
        cv_.notify_all();
        cv_.wait(lock, [&] { return !hold_first_; });
      }
    }
    return ShardEndpoint::StepGroup(requests);
  }

  void Release(const std::string&, const std::string&, int64_t) override {}

  // Test side.
  void HoldFirstCall() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_first_ = true;
  }
  void WaitHeld() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !group_sizes_.empty(); });
  }
  void Resume() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_first_ = false;
    cv_.notify_all();
  }
  std::vector<size_t> group_sizes() {
    std::lock_guard<std::mutex> lock(mu_);
    return group_sizes_;
  }
  std::set<std::string> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }
  void MissFor(const std::string& s, kv::CacheMissReason r, std::string moved_to = "") {
    std::lock_guard<std::mutex> lock(mu_);
    misses_[s] = {r, std::move(moved_to)};
  }
  void ErrorFor(const std::string& s) {
    std::lock_guard<std::mutex> lock(mu_);
    errors_.insert(s);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::string name_;
  int index_;
  bool tail_;
  bool hold_first_ = false;
  std::vector<size_t> group_sizes_;
  std::set<std::string> seen_;
  std::set<std::string> errors_;
  std::map<std::string, std::pair<kv::CacheMissReason, std::string>> misses_;
};

Route ThreeHops(std::shared_ptr<ScriptHop>* hops) { return Route{{hops[0], hops[1], hops[2]}}; }

struct Hops {
  std::shared_ptr<ScriptHop> h[3] = {std::make_shared<ScriptHop>("h0", 0, false),
                                     std::make_shared<ScriptHop>("h1", 1, false),
                                     std::make_shared<ScriptHop>("h2", 2, true)};
};

std::string Session(int i) { return "s" + std::to_string(i); }

StepRequest Decode(int i) {
  StepRequest r;
  r.session_id = Session(i);
  r.session_secret = "secret";
  r.step_id = 1;
  r.token_ids = {i};
  return r;
}

// Every hop adds its index + 1 to the token: 1 + 2 + 3.
int32_t Expected(int i) { return TokenFor(static_cast<float>(i + 6)); }

int32_t TailToken(const CohortCarrier::Carried& c) {
  EXPECT_TRUE(c.result.has_value());
  return std::get<shard::TailOutput>(*c.result).token_id;
}

template <class Pred>
void Until(Pred pred) {  // bounded poll on the carrier's own count
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!pred()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "timed out";
    std::this_thread::yield();
  }
}

// While one cohort is out, the steps that come meanwhile wait and then go
// through every hop as one group call per hop, each with its own answer.
TEST(CohortCarrier, StepsThatComeMeanwhileGoAsOneCallPerHop) {
  constexpr int kSessions = 6;
  Hops hops;
  const Route route = ThreeHops(hops.h);
  CohortCarrier carrier(kTransitWaitS);
  hops.h[0]->HoldFirstCall();
  std::vector<CohortCarrier::Carried> got(kSessions);
  std::vector<std::thread> threads;
  threads.emplace_back([&] { got[0] = carrier.Carry(route, Decode(0)); });
  hops.h[0]->WaitHeld();
  for (int i = 1; i < kSessions; ++i) {
    threads.emplace_back([&, i] { got[i] = carrier.Carry(route, Decode(i)); });
  }
  Until([&] { return carrier.waiting() == kSessions - 1; });
  hops.h[0]->Resume();
  for (auto& t : threads) t.join();
  for (auto& h : hops.h) {
    EXPECT_EQ(h->group_sizes(), (std::vector<size_t>{1, kSessions - 1})) << h->name();
  }
  for (int i = 0; i < kSessions; ++i) {
    EXPECT_EQ(got[i].hop, 2u) << i;
    EXPECT_FALSE(got[i].error) << i;
    EXPECT_EQ(TailToken(got[i]), Expected(i)) << i;
  }
  EXPECT_EQ(carrier.waiting(), 0);
}

// A miss and an error at the middle hop stop those two steps there, with
// the request that hop got; the others reach the tail unchanged.
TEST(CohortCarrier, AStepStoppedAtAHopIsHandedBackThere) {
  Hops hops;
  const Route route = ThreeHops(hops.h);
  hops.h[1]->MissFor(Session(1), kv::CacheMissReason::kEvictedLru);
  hops.h[1]->ErrorFor(Session(2));
  CohortCarrier carrier(kTransitWaitS);
  hops.h[0]->HoldFirstCall();
  std::vector<CohortCarrier::Carried> got(4);
  std::vector<std::thread> threads;
  threads.emplace_back([&] { got[0] = carrier.Carry(route, Decode(0)); });
  hops.h[0]->WaitHeld();
  for (int i = 1; i < 4; ++i)
    threads.emplace_back([&, i] { got[i] = carrier.Carry(route, Decode(i)); });
  Until([&] { return carrier.waiting() == 3; });
  hops.h[0]->Resume();
  for (auto& t : threads) t.join();
  EXPECT_EQ(hops.h[1]->group_sizes(), (std::vector<size_t>{1, 3}));
  EXPECT_EQ(hops.h[2]->group_sizes(), (std::vector<size_t>{1, 1}));  // s1 and s2 stopped
  EXPECT_EQ(hops.h[2]->seen(), (std::set<std::string>{Session(0), Session(3)}));
  EXPECT_EQ(got[1].hop, 1u);
  ASSERT_TRUE(got[1].result.has_value());
  EXPECT_EQ(std::get<kv::CacheMiss>(*got[1].result).reason, kv::CacheMissReason::kEvictedLru);
  ASSERT_TRUE(got[1].request.bundle.has_value());  // what hop 1 was sent: the head's bundle
  EXPECT_EQ(got[1].request.bundle->residual, std::vector<float>{2.0f});
  EXPECT_EQ(got[2].hop, 1u);
  ASSERT_TRUE(got[2].error);
  EXPECT_THROW(std::rethrow_exception(got[2].error), Error);
  for (int i : {0, 3}) EXPECT_EQ(TailToken(got[i]), Expected(i)) << i;
}

// Steps on another route wait for a cohort of their own.
TEST(CohortCarrier, RoutesDoNotMix) {
  Hops hops;
  auto other_tail = std::make_shared<ScriptHop>("h2b", 2, true);
  const Route a = ThreeHops(hops.h);
  const Route b{{hops.h[0], hops.h[1], other_tail}};
  CohortCarrier carrier(kTransitWaitS);
  hops.h[0]->HoldFirstCall();
  std::vector<CohortCarrier::Carried> got(4);
  std::vector<std::thread> threads;
  threads.emplace_back([&] { got[0] = carrier.Carry(a, Decode(0)); });
  hops.h[0]->WaitHeld();
  threads.emplace_back([&] { got[1] = carrier.Carry(b, Decode(1)); });  // first in line
  Until([&] { return carrier.waiting() == 1; });
  for (int i = 2; i < 4; ++i)
    threads.emplace_back([&, i] { got[i] = carrier.Carry(a, Decode(i)); });
  Until([&] { return carrier.waiting() == 3; });
  hops.h[0]->Resume();
  for (auto& t : threads) t.join();
  EXPECT_EQ(hops.h[0]->group_sizes(), (std::vector<size_t>{1, 1, 2}));
  EXPECT_EQ(hops.h[2]->group_sizes(), (std::vector<size_t>{1, 2}));
  EXPECT_EQ(other_tail->group_sizes(), (std::vector<size_t>{1}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(TailToken(got[i]), Expected(i)) << i;
}

// A provider whose routes' decode steps are carried, knowing one more node.
class CarriedProvider : public RouteProvider {
 public:
  Hops hops;
  std::shared_ptr<ScriptHop> spare = std::make_shared<ScriptHop>("h1-spare", 1, false);
  CohortCarrier carrier_{kTransitWaitS};
  Route Plan() override { return ThreeHops(hops.h); }
  void MarkDead(const ShardEndpoint&) override {}
  std::shared_ptr<ShardEndpoint> EndpointFor(const std::string& address) override {
    return address == spare->name() ? spare : nullptr;
  }
  CohortCarrier* carrier() override { return &carrier_; }
};

StepHead Head(const std::string& session) {
  StepHead h;
  h.session = session;
  h.secret = "secret";
  h.hops = 3;
  return h;
}

// RunRouteStep takes a carried step's outcome as its own call's: a "moved"
// is followed to the node named (the hop replaced), an unreachable hop is
// reported dead, and a plain step reaches the tail.
TEST(CohortCarrier, RouteStepsHandleWhatTheCarrierHandsBack) {
  CarriedProvider p;
  p.hops.h[1]->MissFor(Session(1), kv::CacheMissReason::kMoved, p.spare->name());
  p.hops.h[1]->ErrorFor(Session(2));
  const std::vector<int32_t> tokens[] = {{0}, {1}, {2}};
  Route r0 = p.Plan(), r1 = p.Plan(), r2 = p.Plan();
  const std::string s0 = Session(0), s1 = Session(1), s2 = Session(2);
  StepOutcome plain = RunRouteStep(r0, p, Head(s0), 1, false, tokens[0], 3);
  StepOutcome moved = RunRouteStep(r1, p, Head(s1), 1, false, tokens[1], 3);
  StepOutcome dead = RunRouteStep(r2, p, Head(s2), 1, false, tokens[2], 3);
  ASSERT_TRUE(plain.token.has_value());
  EXPECT_EQ(*plain.token, Expected(0));
  ASSERT_TRUE(moved.token.has_value());
  EXPECT_EQ(*moved.token, Expected(1));
  EXPECT_EQ(moved.moves, 1);
  EXPECT_EQ(r1.hops[1], p.spare);
  EXPECT_EQ(p.spare->seen(), std::set<std::string>{s1});
  EXPECT_FALSE(dead.token.has_value());
  EXPECT_EQ(dead.dead_hop, p.hops.h[1].get());
  // Each went through the carrier: one group call per hop it reached.
  EXPECT_EQ(p.hops.h[0]->group_sizes().size(), 3u);
  EXPECT_EQ(p.hops.h[2]->group_sizes().size(), 1u);
}

}  // namespace
}  // namespace meshnet::mesh
