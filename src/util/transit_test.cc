#include "util/transit.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

namespace meshnet::util {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Each test leaves nobody in transit (the instance is process-wide).
TEST(Transit, MarkAndClearCountOncePerThread) {
  Transit& t = Transit::Get();
  ASSERT_EQ(t.count(), 0);
  t.Mark();
  t.Mark();  // one mark per thread
  EXPECT_EQ(t.count(), 1);
  EXPECT_TRUE(Transit::marked());
  t.Clear();
  t.Clear();
  EXPECT_EQ(t.count(), 0);
  EXPECT_FALSE(Transit::marked());
}

TEST(Transit, AdoptTakesOverACountedMarkAndAThreadExitingMarkedIsCleared) {
  Transit& t = Transit::Get();
  t.Count(2);  // a batch's two answered steps, before their threads wake
  std::thread([&] {
    t.Adopt();
    EXPECT_TRUE(Transit::marked());
  }).join();  // exits marked: cleared
  EXPECT_EQ(t.count(), 1);
  t.Mark();   // marked by itself first...
  t.Adopt();  // ...then adopting: still one mark
  EXPECT_EQ(t.count(), 1);
  t.Clear();
  EXPECT_EQ(t.count(), 0);
}

TEST(Transit, WaitReturnsWhenTheLastMarkClears) {
  Transit& t = Transit::Get();
  t.Count(1);
  std::promise<void> adopted, go;
  std::thread member([&] {
    t.Adopt();
    adopted.set_value();
    go.get_future().wait();
    t.Clear();  // its next step queued
  });
  adopted.get_future().wait();
  std::future<void> waiter = std::async(std::launch::async, [&] { t.Wait(60); });
  EXPECT_EQ(t.count(), 1);
  go.set_value();
  const auto start = std::chrono::steady_clock::now();
  waiter.get();
  EXPECT_LT(SecondsSince(start), 30) << "woken by the clear, not by its bound";
  member.join();
  EXPECT_EQ(t.count(), 0);
}

// A session held up between two steps (a slow client) delays one wait, not
// every one after it.
TEST(Transit, MarksLeftWhenAWaitRunsOutAreNotWaitedForAgain) {
  Transit& t = Transit::Get();
  std::promise<void> marked, go;
  std::thread stuck([&] {
    t.Mark();
    marked.set_value();
    go.get_future().wait();
    t.Clear();
  });
  marked.get_future().wait();
  auto start = std::chrono::steady_clock::now();
  t.Wait(0.02);  // runs out: the stuck mark is forgotten
  EXPECT_GE(SecondsSince(start), 0.02);
  start = std::chrono::steady_clock::now();
  t.Wait(60);
  EXPECT_LT(SecondsSince(start), 30) << "waited again for a forgotten mark";
  // A new session in transit is waited for (the forgotten one does not hide it).
  t.Mark();
  EXPECT_EQ(t.count(), 2);
  start = std::chrono::steady_clock::now();
  t.Wait(0.02);
  EXPECT_GE(SecondsSince(start), 0.02) << "the new mark was not waited for";
  t.Clear();
  go.set_value();
  stuck.join();
  EXPECT_EQ(t.count(), 0);
}

}  // namespace
}  // namespace meshnet::util
