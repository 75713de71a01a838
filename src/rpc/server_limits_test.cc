// SessionRateLimiter on an injected clock: bursts, refill, retry hints,
// re-prefills free, peers independent, idle peers forgotten.
#include "rpc/server_limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "util/error.h"

namespace meshnet::rpc {
namespace {

using ::testing::HasSubstr;

// The error Open throws, or kind kInvalidArgument with "none" if it passed.
Error OpenError(SessionRateLimiter& r, const std::string& peer, const std::string& id) {
  try {
    r.Open(peer, id);
  } catch (const Error& e) {
    return e;
  }
  return Error(ErrorKind::kInvalidArgument, "none");
}

TEST(SessionRateLimiterTest, BurstThenOnePerIntervalWithARetryHint) {
  FakeClock clock(100.0);
  SessionRateLimiter r(60, &clock);  // one per second after a burst of 60
  for (int i = 0; i < 60; ++i) r.Open("ipv4:10.0.0.1", "s" + std::to_string(i));
  Error e = OpenError(r, "ipv4:10.0.0.1", "s60");
  EXPECT_EQ(e.kind(), ErrorKind::kResourceExhausted);
  EXPECT_THAT(e.what(),
              HasSubstr("too many new sessions from ipv4:10.0.0.1 (limit 60 per minute)"));
  EXPECT_THAT(e.what(), HasSubstr("retry in 1000 ms"));
  clock.Advance(0.25);
  EXPECT_THAT(OpenError(r, "ipv4:10.0.0.1", "s60").what(), HasSubstr("retry in 750 ms"));
  clock.Advance(0.75);
  r.Open("ipv4:10.0.0.1", "s60");  // the token that refilled
  EXPECT_EQ(OpenError(r, "ipv4:10.0.0.1", "s61").kind(), ErrorKind::kResourceExhausted);
  EXPECT_EQ(r.refused(), 3);
  clock.Advance(60.0);  // the bucket is full again, not fuller
  for (int i = 0; i < 60; ++i) r.Open("ipv4:10.0.0.1", "t" + std::to_string(i));
  EXPECT_EQ(OpenError(r, "ipv4:10.0.0.1", "t60").kind(), ErrorKind::kResourceExhausted);
}

TEST(SessionRateLimiterTest, ReopeningASessionWithinAMinuteIsFree) {
  FakeClock clock;
  SessionRateLimiter r(2, &clock);
  r.Open("p", "a");
  r.Open("p", "b");
  for (int i = 0; i < 10; ++i) r.Open("p", "a");  // re-prefills, retries: free
  EXPECT_EQ(OpenError(r, "p", "c").kind(), ErrorKind::kResourceExhausted);
  clock.Advance(59.0);
  r.Open("p", "b");  // still within its minute
  clock.Advance(1.0);
  // A minute on, "a" counts as a new open again; the bucket has refilled 2.
  r.Open("p", "a");
  r.Open("p", "c");
  EXPECT_EQ(OpenError(r, "p", "d").kind(), ErrorKind::kResourceExhausted);
}

TEST(SessionRateLimiterTest, PeersHaveTheirOwnBudgets) {
  FakeClock clock;
  SessionRateLimiter r(3, &clock);
  for (int i = 0; i < 3; ++i) r.Open("greedy", std::to_string(i));
  EXPECT_EQ(OpenError(r, "greedy", "x").kind(), ErrorKind::kResourceExhausted);
  for (int i = 0; i < 3; ++i) r.Open("other", std::to_string(i));
  r.Open("greedy", "0");  // the greedy peer's open sessions go on
}

TEST(SessionRateLimiterTest, IdlePeersAreForgotten) {
  FakeClock clock;
  SessionRateLimiter r(5, &clock);
  for (int i = 0; i < 3000; ++i) r.Open("peer" + std::to_string(i), "s");
  EXPECT_LE(r.peers(), 3000);
  clock.Advance(61.0);
  for (int i = 0; i < 3000; ++i) r.Open("late" + std::to_string(i), "s");
  // Every early peer is full and idle again: swept as new peers arrive.
  EXPECT_LE(r.peers(), 3000);
  EXPECT_GE(r.peers(), 1);
}

TEST(SessionRateLimiterTest, LimitMustBeInRange) {
  for (int64_t bad : {int64_t{0}, int64_t{-1}, kMaxNewSessionsPerMinute + 1}) {
    try {
      SessionRateLimiter r(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_THAT(e.what(), HasSubstr("--max-new-sessions-per-minute must be in 1..1000000"));
    }
  }
}

}  // namespace
}  // namespace meshnet::rpc
