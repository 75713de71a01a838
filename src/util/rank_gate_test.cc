#include "util/rank_gate.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "util/error.h"

namespace meshnet::util {
namespace {

// Spins (yielding) until pred() or 20 s; the gate's own counts are the
// synchronization, no sleep stands in for it.
template <class Pred>
bool Eventually(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

// Threads that take a place with a rank, note their name in the order the
// places came, and give the place back.
struct Takers {
  explicit Takers(RankGate* g) : gate(g) {}
  ~Takers() {
    for (auto& t : threads) t.join();
  }
  // Starts one and returns once it waits in the gate.
  void Start(int name, int64_t rank) {
    const int64_t before = gate->waiters();
    threads.emplace_back([this, name, rank] {
      RankGate::Hold hold(gate, rank);
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(name);
    });
    EXPECT_TRUE(Eventually([&] { return gate->waiters() == before + 1; }));
  }
  std::vector<int> Order() {
    std::lock_guard<std::mutex> lock(mu);
    return order;
  }
  RankGate* gate;
  std::vector<std::thread> threads;
  std::mutex mu;
  std::vector<int> order;
};

TEST(RankGate, HoldsAtMostDepthPlaces) {
  RankGate gate(2);
  gate.Acquire(0);
  gate.Acquire(0);
  EXPECT_EQ(gate.holders(), 2);
  {
    Takers t(&gate);
    t.Start(1, 0);  // a third waits
    EXPECT_EQ(gate.holders(), 2);
    EXPECT_TRUE(t.Order().empty());
    gate.Release();
    EXPECT_TRUE(Eventually([&] { return t.Order().size() == 1; }));
  }
  gate.Release();
  EXPECT_EQ(gate.holders(), 0);
  EXPECT_EQ(gate.waiters(), 0);
}

TEST(RankGate, LowestRankFirstThenFirstCome) {
  RankGate gate(1);
  gate.Acquire(0);
  Takers t(&gate);
  t.Start(1, 8);
  t.Start(2, 4);
  t.Start(3, 8);
  t.Start(4, 0);
  gate.Release();
  EXPECT_TRUE(Eventually([&] { return t.Order().size() == 4; }));
  EXPECT_EQ(t.Order(), (std::vector<int>{4, 2, 1, 3}));
}

TEST(RankGate, NobodyWaitsPastMaxBypass) {
  RankGate gate(1);
  gate.Acquire(0);
  Takers t(&gate);
  t.Start(100, 100);  // the high rank arrives first...
  constexpr int kLow = RankGate::kMaxBypass + 4;
  for (int i = 0; i < kLow; ++i) t.Start(i, 0);  // ...then a crowd of low ranks
  gate.Release();
  EXPECT_TRUE(Eventually([&] { return t.Order().size() == kLow + 1; }));
  const std::vector<int> order = t.Order();
  for (int i = 0; i < RankGate::kMaxBypass; ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ(order[RankGate::kMaxBypass], 100);  // its turn after kMaxBypass others
}

TEST(RankGate, YieldHandsThePlaceToALowerRankOnly) {
  RankGate gate(1);
  const int64_t arrival = gate.Acquire(8);
  EXPECT_FALSE(gate.Yield(8, arrival));  // nobody waits
  Takers t(&gate);
  t.Start(1, 9);
  EXPECT_FALSE(gate.Yield(8, arrival));  // a higher rank waits: keep the place
  t.Start(2, 4);
  EXPECT_TRUE(gate.Yield(8, arrival));  // rank 4 went first, then this caller
  EXPECT_EQ(t.Order(), std::vector<int>{2});
  EXPECT_EQ(gate.holders(), 1);
  gate.Release();
  EXPECT_TRUE(Eventually([&] { return t.Order().size() == 2; }));
}

TEST(RankGate, HoldWithoutAGateDoesNothing) {
  RankGate::Hold hold(nullptr, 3);
  EXPECT_FALSE(hold.Yield());
}

TEST(RankGate, RefusesDepthBelowOne) {
  EXPECT_THROW(RankGate(0), Error);
  EXPECT_THROW(RankGate(-1), Error);
}

}  // namespace
}  // namespace meshnet::util
