// SessionAdmission: active sessions keep their slots, new ones queue (FIFO,
// bounded) and are refused with a retry hint when the wait runs out.
#include "node/admission.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "util/error.h"

namespace meshnet::node {
namespace {

AdmissionOptions Options(int64_t max_active, double wait_s, int64_t queue) {
  AdmissionOptions o;
  o.max_active = max_active;
  o.max_wait_s = wait_s;
  o.max_waiting = queue;
  o.active_window_s = 30.0;
  return o;
}

std::string RefusalOf(SessionAdmission& a, const std::string& id) {
  try {
    a.Admit(id);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kResourceExhausted) << e.what();
    return e.what();
  }
  return "admitted";
}

TEST(Admission, ActiveSessionsKeepTheirSlotsAndReAdmitAtOnce) {
  FakeClock clock;
  SessionAdmission a(Options(2, 0.0, 4), &clock);
  a.Admit("a");
  a.Admit("b");
  EXPECT_EQ(a.active(), 2);
  a.Admit("a");  // a re-prefill of an active session
  EXPECT_NE(RefusalOf(a, "c").find("retry in"), std::string::npos);
  clock.Advance(20);
  a.Touch("a");
  clock.Advance(15);  // b idle for 35 s, a for 15 s: b's slot is free
  a.Admit("c");
  EXPECT_EQ(a.active(), 2);
  EXPECT_NE(RefusalOf(a, "d"), "admitted");
}

TEST(Admission, AWaiterIsAdmittedWhenASessionIsReleased) {
  SessionAdmission a(Options(1, 60.0, 4));
  a.Admit("a");
  std::thread waiter([&] { a.Admit("b"); });
  while (a.waiting() == 0) std::this_thread::yield();  // b is queued
  a.Release("a");
  waiter.join();
  EXPECT_EQ(a.active(), 1);
  EXPECT_EQ(a.waiting(), 0);
}

TEST(Admission, FullQueueAndCancelledWaitersAreRefusedAtOnce) {
  SessionAdmission a(Options(1, 60.0, 0));
  a.Admit("a");
  EXPECT_NE(RefusalOf(a, "b").find("wait queue is full"), std::string::npos);
  SessionAdmission c(Options(1, 60.0, 4));
  c.Admit("a");
  try {
    c.Admit("b", [] { return true; });
    ADD_FAILURE() << "admitted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnavailable);
  }
  EXPECT_EQ(c.waiting(), 0);
}

TEST(Admission, OptionsAreValidated) {
  EXPECT_THROW(SessionAdmission(Options(0, 1, 1)), Error);
  EXPECT_THROW(SessionAdmission(Options(1, -1, 1)), Error);
  EXPECT_THROW(SessionAdmission(Options(1, 1, -1)), Error);
}

}  // namespace
}  // namespace meshnet::node
