// A reservation that would fit, but whose room is pinned by another
// in-flight step, waits for the pin to go (the lock released) instead of
// failing; it fails with budget-exceeded only once the wait runs out.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <variant>

#include "kv/hot_kv_state.h"
#include "kv/kv_test_util.h"
#include "util/error.h"

namespace meshnet::kv {
namespace {

using ::meshnet::kv::testing::MiniRecipe;

TEST(PinnedWait, ReservationWaitsForPinnedRoomThenProceeds) {
  FakeClock clock;
  HotKvStateConfig c;
  c.block_tokens = 4;
  c.budget_bytes = 8 * 4 * MiniRecipe().BytesPerToken();
  c.pinned_wait_seconds = 60;  // far beyond the test: only the unpin can end the wait
  HotKvStateManager m(MiniRecipe(), c, &clock);
  m.Open("a", 0);
  m.Open("b", 0);
  KvStep a = std::get<KvStep>(m.BeginStep("a", 0, 28));  // 7 of 8 blocks, pinned
  std::atomic<bool> b_done{false};
  std::thread waiter([&] {
    StepResult r = m.BeginStep("b", 0, 8);  // 2 blocks: fits only once a's room returns
    EXPECT_TRUE(std::holds_alternative<KvStep>(r));
    b_done = true;
  });
  EXPECT_FALSE(b_done.load());  // cannot finish while a pins the room
  a.Rollback();                 // a's blocks return and wake the waiter
  waiter.join();
  EXPECT_TRUE(b_done.load());
  EXPECT_EQ(m.Stats().blocks_used, 0);  // b's step ended (rolled back) in the thread
}

TEST(PinnedWait, ShortageFailsOnceTheWaitRunsOut) {
  FakeClock clock;
  HotKvStateConfig c;
  c.block_tokens = 4;
  c.budget_bytes = 8 * 4 * MiniRecipe().BytesPerToken();
  c.pinned_wait_seconds = 0.05;
  HotKvStateManager m(MiniRecipe(), c, &clock);
  m.Open("a", 0);
  m.Open("b", 0);
  KvStep a = std::get<KvStep>(m.BeginStep("a", 0, 28));
  try {
    m.BeginStep("b", 0, 8);
    FAIL() << "expected budget-exceeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBudgetExceeded);
  }
  EXPECT_TRUE(a.valid());
  EXPECT_EQ(m.Get("b", 0).seq_len(), 0);  // untouched
  c.pinned_wait_seconds = -1;
  EXPECT_THROW(c.Validate(), Error);
}

}  // namespace
}  // namespace meshnet::kv
