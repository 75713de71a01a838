// HotKvStateConfig::active_seconds: room under the byte budget comes from idle
// sessions first, then from active ones that arrived after the requester (the
// latest first, as CacheMiss kPreempted); when only earlier active sessions'
// room would do, a session with state is preempted itself and a new context
// waits, then fails busy (kResourceExhausted).
// With 0 the reference's LRU over every unpinned session (the other kv tests).
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <variant>

#include "kv/hot_kv_state.h"
#include "kv/kv_test_util.h"
#include "util/error.h"

namespace meshnet::kv {
namespace {

using ::meshnet::kv::testing::MiniRecipe;

constexpr int kBlockTokens = 4;

HotKvStateConfig Protecting(int64_t budget_blocks, double wait_s) {
  HotKvStateConfig c;
  c.block_tokens = kBlockTokens;
  c.budget_bytes = budget_blocks * kBlockTokens * MiniRecipe().BytesPerToken();
  c.max_sessions = 64;
  c.ttl_seconds = 0;
  c.active_seconds = 10;
  c.pinned_wait_seconds = wait_s;
  return c;
}

// Opens `id` and commits `tokens` positions to it.
void Grow(HotKvStateManager& m, const std::string& id, int64_t tokens, bool open) {
  if (open) m.Open(id, 0);
  KvStep s = std::get<KvStep>(m.BeginStep(id, 0, tokens));
  ASSERT_FALSE(s.Commit().has_value());
}

std::string Reason(HotKvStateManager& m, const std::string& id) {
  StepResult r = m.BeginStep(id, 0, 0);
  if (auto* miss = std::get_if<CacheMiss>(&r))
    return std::string(CacheMissReasonName(miss->reason));
  return "live";
}

TEST(ActiveProtection, IdleSessionsGoFirstLeastRecentlyUsedFirst) {
  FakeClock clock;
  HotKvStateManager m(MiniRecipe(), Protecting(4, 0), &clock);
  Grow(m, "old-idle", 4, true);  // 1 block each
  Grow(m, "idle", 4, true);
  clock.Advance(20);  // both idle now
  Grow(m, "active-a", 4, true);
  Grow(m, "active-b", 4, true);
  Grow(m, "active-a", 4, false);  // needs a 5th block: the least recent idle one goes
  EXPECT_EQ(Reason(m, "old-idle"), "evicted-lru");
  EXPECT_EQ(Reason(m, "idle"), "live");
  EXPECT_EQ(Reason(m, "active-b"), "live");
}

TEST(ActiveProtection, GrowthPreemptsTheLatestArrivalNotTheLeastRecentlyUsed) {
  FakeClock clock;
  HotKvStateManager m(MiniRecipe(), Protecting(4, 0), &clock);
  Grow(m, "first", 4, true);
  Grow(m, "second", 4, true);
  Grow(m, "third", 4, true);
  clock.Advance(1);
  Grow(m, "third", 0, false);   // third is now the most recently used...
  Grow(m, "second", 0, false);  // ...then second: first is the LRU one
  Grow(m, "first", 8, false);   // 2 more blocks: third (the latest arrival) goes, then none
  EXPECT_EQ(Reason(m, "third"), "preempted");
  EXPECT_EQ(Reason(m, "second"), "live");
  EXPECT_EQ(m.Stats().evictions[static_cast<int>(CacheMissReason::kPreempted)], 1);
  EXPECT_EQ(m.Stats().evictions[static_cast<int>(CacheMissReason::kEvictedLru)], 0);
}

TEST(ActiveProtection, TheLatestSessionGrowingIntoEarlierOnesRoomIsPreemptedItself) {
  FakeClock clock;
  HotKvStateManager m(MiniRecipe(), Protecting(4, 60), &clock);  // a wait would hang the test
  Grow(m, "first", 8, true);
  Grow(m, "second", 8, true);
  StepResult r = m.BeginStep("second", 0, 1);  // a 5th block: only first's room could serve
  ASSERT_TRUE(std::holds_alternative<CacheMiss>(r));
  EXPECT_EQ(std::get<CacheMiss>(r).reason, CacheMissReason::kPreempted);
  EXPECT_EQ(Reason(m, "second"), "preempted");
  EXPECT_EQ(Reason(m, "first"), "live");
  EXPECT_EQ(m.Stats().blocks_used, 2);
}

TEST(ActiveProtection, ALaterSessionWaitsThenIsBusyAndTakesNothing) {
  FakeClock clock;
  HotKvStateManager m(MiniRecipe(), Protecting(4, 0.05), &clock);
  Grow(m, "first", 8, true);
  Grow(m, "second", 8, true);
  m.Open("late", 0);
  try {
    m.BeginStep("late", 0, 4);
    FAIL() << "expected busy";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kResourceExhausted);
    EXPECT_NE(std::string(e.what()).find("active sessions that arrived before it"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(Reason(m, "first"), "live");
  EXPECT_EQ(Reason(m, "second"), "live");
  EXPECT_GE(m.Stats().room_waits, 1);
}

// A parked session (kept by its client for a later prompt) gives its room
// first, although it stepped within the window and arrived earlier: the
// later session that would have been busy gets it; the parked one answers
// evicted-lru. A step un-parks a session.
TEST(ActiveProtection, ParkedSessionsGiveTheirRoomFirst) {
  FakeClock clock;
  HotKvStateManager m(MiniRecipe(), Protecting(4, 0.05), &clock);
  Grow(m, "kept-a", 4, true);
  Grow(m, "kept-b", 4, true);
  Grow(m, "first", 8, true);
  EXPECT_TRUE(m.Park("kept-a", 0));
  EXPECT_TRUE(m.Park("kept-b", 0));
  EXPECT_FALSE(m.Park("nobody", 0));
  Grow(m, "kept-b", 4, false);  // a step: kept-b is active again (and takes kept-a's block)
  EXPECT_EQ(Reason(m, "kept-a"), "evicted-lru");
  m.Open("late", 0);
  try {
    m.BeginStep("late", 0, 4);  // kept-b and first: earlier, active, not parked
    FAIL() << "expected busy";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kResourceExhausted);
  }
  EXPECT_TRUE(m.Park("kept-b", 0));
  Grow(m, "late", 4, false);
  EXPECT_EQ(Reason(m, "kept-b"), "evicted-lru");
  EXPECT_EQ(Reason(m, "first"), "live");
  EXPECT_EQ(m.InvariantViolation(), "");
}

TEST(ActiveProtection, AWaitingReservationProceedsWhenAnEarlierSessionEnds) {
  FakeClock clock;
  HotKvStateManager m(MiniRecipe(), Protecting(4, 60), &clock);  // only the release ends it
  Grow(m, "first", 8, true);
  Grow(m, "second", 8, true);
  m.Open("late", 0);
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    StepResult r = m.BeginStep("late", 0, 8);
    EXPECT_TRUE(std::holds_alternative<KvStep>(r));
    done = true;
  });
  EXPECT_FALSE(done.load());
  EXPECT_TRUE(m.Release("first", 0));  // its blocks return and wake the waiter
  waiter.join();
  EXPECT_TRUE(done.load());
  EXPECT_EQ(Reason(m, "second"), "live");
}

TEST(ActiveProtection, ASessionKeepsItsArrivalAcrossReOpens) {
  FakeClock clock;
  HotKvStateManager m(MiniRecipe(), Protecting(4, 0), &clock);
  Grow(m, "early", 4, true);
  Grow(m, "late", 8, true);
  Grow(m, "early", 4, true);   // re-opened (a re-prefill): still earlier than "late"
  Grow(m, "early", 8, false);  // 3 blocks with late's 2: late goes
  EXPECT_EQ(Reason(m, "late"), "preempted");
}

TEST(ActiveProtection, ValidatesItsRange) {
  HotKvStateConfig c;
  c.active_seconds = -1;
  EXPECT_THROW(c.Validate(), Error);
  c.active_seconds = 86401;
  EXPECT_THROW(c.Validate(), Error);
  c.active_seconds = 30;
  EXPECT_NO_THROW(c.Validate());
}

}  // namespace
}  // namespace meshnet::kv
