// The registry contract: one typed test suite every backend passes
// (INSTANTIATE_TYPED_TEST_SUITE_P with a backend type B that has
//   std::string Unavailable();             // "" or why it cannot run
//   std::unique_ptr<Registry> Make();      // a fresh, empty registry view
//   double MinTtl();                       // the shortest TTL it honours
// ). Times are real: leases expire on the wall clock; every wait is bounded.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "registry/registry.h"
#include "util/error.h"

namespace meshnet::registry::testing {

inline NodeRecord Rec(const std::string& address, const std::string& model, int a, int b,
                      int total = 5) {
  NodeRecord r;
  r.address = address;
  r.model_id = model;
  r.architecture = "llama";
  r.start_layer = a;
  r.end_layer = b;
  r.total_layers = total;
  r.recipe_fingerprint = "recipe-" + model;
  r.kv_budget_bytes = 1 << 20;
  r.kv_bytes_free = 1 << 20;
  r.sessions_free = 8;
  r.version = "test";
  r.instance_id = "inst-" + address;
  return r;
}

inline double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Renews `lease` right after its etcd restarted. etcd may still be electing
// itself, so kUnavailable is retried with bounded pauses for up to 20 s; any
// other error, or a renewal refused (the lease lost), fails the test.
inline void RenewAcrossRestart(Registry& r, LeaseId lease, const NodeRecord& n) {
  const auto t0 = std::chrono::steady_clock::now();
  bool renewed = false;
  while (!renewed && Since(t0) < 20) {
    try {
      renewed = r.Renew(lease, n);
      ASSERT_TRUE(renewed) << "the lease did not survive the restart";
    } catch (const Error& e) {
      ASSERT_EQ(e.kind(), ErrorKind::kUnavailable) << e.what();  // e.g. never kPermissionDenied
      r.WaitForChange(1 << 30, 0.1);  // bounded pause (fails fast while etcd is down)
    }
  }
  ASSERT_TRUE(renewed);
}

template <typename B>
class RegistryContract : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = std::make_unique<B>();
    const std::string why = backend_->Unavailable();
    if (!why.empty()) {
      if (std::getenv("MESHNET_NO_ETCD") != nullptr) GTEST_SKIP() << why;
      FAIL() << why << " (set MESHNET_NO_ETCD=1 to skip)";
    }
    reg_ = backend_->Make();
  }
  // Waits (on WaitForChange, bounded) until `address` is listed or not.
  double WaitListed(const std::string& address, bool listed, double timeout_s) {
    const auto t0 = std::chrono::steady_clock::now();
    while (Since(t0) < timeout_s) {
      const Snapshot s = reg_->List();
      bool found = false;
      for (const auto& r : s.nodes) found = found || r.address == address;
      if (found == listed) return Since(t0);
      reg_->WaitForChange(s.revision, 0.5);
    }
    return -1;
  }

  std::unique_ptr<B> backend_;
  std::unique_ptr<Registry> reg_;
};

TYPED_TEST_SUITE_P(RegistryContract);

TYPED_TEST_P(RegistryContract, AnnouncedNodesAreListedByModel) {
  Registry& r = *this->reg_;
  const int64_t rev0 = r.List().revision;
  r.Announce(Rec("10.0.0.1:1", "modelA", 0, 1), 30);
  r.Announce(Rec("10.0.0.2:1", "modelA", 2, 4), 30);
  r.Announce(Rec("10.0.0.3:1", "modelB", 0, 4), 30);
  const Snapshot all = r.List();
  EXPECT_GT(all.revision, rev0);
  ASSERT_EQ(all.nodes.size(), 3u);
  const Snapshot a = r.List("modelA");
  ASSERT_EQ(a.nodes.size(), 2u);
  EXPECT_EQ(a.nodes[0].address, "10.0.0.1:1");
  EXPECT_EQ(a.nodes[1].start_layer, 2);
  EXPECT_EQ(a.nodes[1].recipe_fingerprint, "recipe-modelA");
  EXPECT_EQ(r.List("modelB").nodes.size(), 1u);
  EXPECT_TRUE(r.List("modelC").nodes.empty());
}

TYPED_TEST_P(RegistryContract, RenewUpdatesLoadAndRefusesIdentityChange) {
  Registry& r = *this->reg_;
  NodeRecord n = Rec("10.0.0.1:1", "m", 0, 4);
  const LeaseId lease = r.Announce(n, 30);
  n.kv_bytes_free = 1234;
  n.in_flight_steps = 3;
  ASSERT_TRUE(r.Renew(lease, n));
  const Snapshot s = r.List("m");
  ASSERT_EQ(s.nodes.size(), 1u);
  EXPECT_EQ(s.nodes[0].kv_bytes_free, 1234);
  EXPECT_EQ(s.nodes[0].in_flight_steps, 3);
  NodeRecord other = n;
  other.end_layer = 3;  // claims another range under the same lease
  try {
    r.Renew(lease, other);
    ADD_FAILURE() << "a renewal changed the announced range";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
  }
  EXPECT_FALSE(r.Renew(lease + 1000003, n));  // no such lease
}

TYPED_TEST_P(RegistryContract, WithdrawAndReannounce) {
  Registry& r = *this->reg_;
  const NodeRecord n = Rec("10.0.0.1:1", "m", 0, 4);
  const LeaseId first = r.Announce(n, 30);
  const LeaseId second = r.Announce(n, 30);  // a restarted node: replaces the record
  EXPECT_NE(first, second);
  EXPECT_EQ(r.List("m").nodes.size(), 1u);
  EXPECT_FALSE(r.Renew(first, n));
  EXPECT_TRUE(r.Renew(second, n));
  r.Withdraw(second);
  EXPECT_TRUE(r.List("m").nodes.empty());
  EXPECT_FALSE(r.Renew(second, n));
  r.Withdraw(second);  // again: no error
}

TYPED_TEST_P(RegistryContract, BadRecordsAreRefused) {
  Registry& r = *this->reg_;
  for (const NodeRecord& bad :
       {Rec("", "m", 0, 1), Rec("a:1", "", 0, 1), Rec("a:1", "m", 2, 1), Rec("a:1", "m", 0, 5)}) {
    try {
      r.Announce(bad, 30);
      ADD_FAILURE() << "accepted " << ToJson(bad).dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    }
  }
  EXPECT_THROW(r.Announce(Rec("a:1", "m", 0, 1), -1), Error);
  EXPECT_TRUE(r.List().nodes.empty());
}

TYPED_TEST_P(RegistryContract, UnrenewedLeaseExpiresWithinTtl) {
  Registry& r = *this->reg_;
  const double ttl = this->backend_->MinTtl();
  const auto t0 = std::chrono::steady_clock::now();
  r.Announce(Rec("10.0.0.9:1", "m", 0, 4), ttl);
  ASSERT_EQ(r.List("m").nodes.size(), 1u);
  const double gone = this->WaitListed("10.0.0.9:1", false, ttl + 5);
  ASSERT_GE(gone, 0) << "still listed " << ttl + 5 << " s after a " << ttl << " s lease";
  EXPECT_LE(Since(t0), ttl + 2.0);  // within the TTL plus the expiry check's slack
  EXPECT_GE(Since(t0), ttl * 0.5);  // not dropped early
}

TYPED_TEST_P(RegistryContract, HeartbeatsKeepALeaseAlive) {
  Registry& r = *this->reg_;
  const double ttl = this->backend_->MinTtl();
  NodeRecord n = Rec("10.0.0.8:1", "m", 0, 4);
  const LeaseId lease = r.Announce(n, ttl);
  const auto t0 = std::chrono::steady_clock::now();
  while (Since(t0) < 2.5 * ttl) {
    ASSERT_TRUE(r.Renew(lease, n)) << "lease lost at " << Since(t0) << " s";
    ASSERT_EQ(r.List("m").nodes.size(), 1u);
    r.WaitForChange(r.List().revision + 1000000, ttl / 4);  // a bounded pause
  }
}

TYPED_TEST_P(RegistryContract, WatchWakesOnChange) {
  Registry& r = *this->reg_;
  const int64_t rev = r.List().revision;
  EXPECT_EQ(r.WaitForChange(rev, 0.2), rev);  // nothing changed: times out
  std::atomic<int64_t> woke{-1};
  std::thread waiter([&] { woke = r.WaitForChange(rev, 20); });
  const auto t0 = std::chrono::steady_clock::now();
  r.Announce(Rec("10.0.0.7:1", "m", 0, 4), 30);
  waiter.join();
  EXPECT_GT(woke.load(), rev);
  EXPECT_LT(Since(t0), 10.0);
}

TYPED_TEST_P(RegistryContract, DrainingIsStickyAndReplicasAreFound) {
  Registry& r = *this->reg_;
  NodeRecord self = Rec("10.0.0.1:1", "m", 2, 3);
  const LeaseId lease = r.Announce(self, 30);
  NodeRecord roomy = Rec("10.0.0.2:1", "m", 2, 3);
  roomy.kv_bytes_free = 900;
  NodeRecord roomier = Rec("10.0.0.3:1", "m", 2, 3);
  roomier.kv_bytes_free = 5000;
  NodeRecord full = Rec("10.0.0.4:1", "m", 2, 3);
  full.kv_bytes_free = 10;
  r.Announce(roomy, 30);
  r.Announce(roomier, 30);
  r.Announce(full, 30);
  r.Announce(Rec("10.0.0.5:1", "m", 0, 1), 30);   // another range
  r.Announce(Rec("10.0.0.6:1", "m2", 2, 3), 30);  // another model
  const auto replicas = FindReplicas(r, self, 100);
  ASSERT_EQ(replicas.size(), 2u);
  EXPECT_EQ(replicas[0].address, "10.0.0.3:1");  // most free first
  EXPECT_EQ(replicas[1].address, "10.0.0.2:1");

  ASSERT_TRUE(r.SetDraining("10.0.0.3:1", true));
  EXPECT_EQ(FindReplicas(r, self, 100).size(), 1u);
  EXPECT_FALSE(r.SetDraining("10.9.9.9:1", true));
  ASSERT_TRUE(r.SetDraining(self.address, true));
  ASSERT_TRUE(r.Renew(lease, self));  // the heartbeat does not clear it
  auto self_draining = [&] {
    for (const NodeRecord& n : r.List("m").nodes) {
      if (n.address == self.address) return n.draining;
    }
    ADD_FAILURE() << "self is not listed";
    return false;
  };
  EXPECT_TRUE(self_draining());
  ASSERT_TRUE(r.SetDraining(self.address, false));
  EXPECT_FALSE(self_draining());
}

REGISTER_TYPED_TEST_SUITE_P(RegistryContract, AnnouncedNodesAreListedByModel,
                            RenewUpdatesLoadAndRefusesIdentityChange, WithdrawAndReannounce,
                            BadRecordsAreRefused, UnrenewedLeaseExpiresWithinTtl,
                            HeartbeatsKeepALeaseAlive, WatchWakesOnChange,
                            DrainingIsStickyAndReplicasAreFound);

}  // namespace meshnet::registry::testing
