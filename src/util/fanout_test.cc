#include "util/fanout.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace meshnet::util {
namespace {

// Items that each wait (bounded) until all `n` are running at once.
struct Rendezvous {
  explicit Rendezvous(int64_t n) : n(n) {}
  // True if all n arrived within the deadline.
  bool Arrive() {
    std::unique_lock<std::mutex> lock(mu);
    if (++arrived == n) cv.notify_all();
    return cv.wait_for(lock, std::chrono::seconds(20), [this] { return arrived >= n; });
  }
  const int64_t n;
  std::mutex mu;
  std::condition_variable cv;
  int64_t arrived = 0;
};

TEST(Fanout, RunsEveryItemOnceAndAllAtOnce) {
  Fanout fanout(16);
  constexpr int64_t kN = 12;
  Rendezvous rv(kN);
  std::vector<int> runs(kN, 0);
  std::vector<char> together(kN, 0);
  std::vector<std::thread::id> where(kN);
  fanout.Run(kN, [&](int64_t i) {
    ++runs[i];
    where[i] = std::this_thread::get_id();
    together[i] = rv.Arrive();
  });
  for (int64_t i = 0; i < kN; ++i) {
    EXPECT_EQ(runs[i], 1) << i;
    EXPECT_TRUE(together[i]) << i;  // no item waited for another to finish
  }
  EXPECT_EQ(where[0], std::this_thread::get_id());  // item 0 runs on the caller
  EXPECT_EQ(std::set<std::thread::id>(where.begin(), where.end()).size(), size_t{kN});
}

TEST(Fanout, KeepsItsThreadsForTheNextCall) {
  Fanout fanout(16);
  for (int round = 0; round < 5; ++round) {
    Rendezvous rv(6);
    std::atomic<int> ok{0};
    fanout.Run(6, [&](int64_t) { ok += rv.Arrive() ? 1 : 0; });
    EXPECT_EQ(ok.load(), 6);
  }
  EXPECT_LE(fanout.threads(), 5);
}

TEST(Fanout, FinishesWhenThreadsRunOut) {
  for (int cap : {0, 1, 3}) {
    Fanout fanout(cap);
    std::vector<std::atomic<int>> runs(10);
    fanout.Run(10, [&](int64_t i) { runs[i].fetch_add(1); });
    for (auto& r : runs) EXPECT_EQ(r.load(), 1) << "cap " << cap;
    EXPECT_LE(fanout.threads(), cap);
  }
}

TEST(Fanout, CallsFromSeveralThreadsAtOnce) {
  Fanout fanout(8);
  constexpr int kCallers = 4, kItems = 5;
  std::atomic<int> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&] {
      for (int r = 0; r < 20; ++r) fanout.Run(kItems, [&](int64_t) { total.fetch_add(1); });
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), kCallers * kItems * 20);
  EXPECT_LE(fanout.threads(), 8);
}

TEST(Fanout, NothingToRun) {
  Fanout fanout(4);
  bool ran = false;
  fanout.Run(0, [&](int64_t) { ran = true; });
  EXPECT_FALSE(ran);
  EXPECT_EQ(fanout.threads(), 0);
}

}  // namespace
}  // namespace meshnet::util
