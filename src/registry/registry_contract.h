// The registry contract: one typed test suite every backend passes
// (INSTANTIATE_TYPED_TEST_SUITE_P with a backend type B that has
//   std::string Unavailable();             // "" or why it cannot run
//   std::unique_ptr<Registry> Make();      // a fresh, empty registry view
//   double MinTtl();                       // the shortest TTL it honours
//   bool LeaseSecrets();                   // whether writes check the lease secret
// ). Times are real: leases expire on the wall clock; every wait is bounded.
// Records are signed with a key per address (KeyFor), as nodes sign theirs.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "registry/registry.h"
#include "util/error.h"
#include "util/signing_key.h"

namespace meshnet::registry::testing {

// One node key per address, for the life of the test process.
inline const SigningKey& KeyFor(const std::string& address) {
  static std::mutex mu;
  static std::map<std::string, SigningKey> keys;
  std::lock_guard<std::mutex> lock(mu);
  auto it = keys.find(address);
  if (it == keys.end()) it = keys.emplace(address, SigningKey::Generate()).first;
  return it->second;
}

// `r` signed with its address's key (after a test changed a signed field).
inline NodeRecord Signed(NodeRecord r) {
  SignRecord(KeyFor(r.address), &r);
  return r;
}

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
  if (!address.empty()) SignRecord(KeyFor(address), &r);
  return r;
}

inline double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Renews `lease` right after its etcd restarted. etcd may still be electing
// itself, so kUnavailable is retried with bounded pauses for up to 20 s; any
// other error, or a renewal refused (the lease lost), fails the test.
inline void RenewAcrossRestart(Registry& r, const Lease& lease, const NodeRecord& n) {
  const auto t0 = std::chrono::steady_clock::now();
  bool renewed = false;
  while (!renewed && Since(t0) < 20) {
    try {
      renewed = r.Renew(lease, Signed(n));  // every heartbeat signs anew
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
  const Lease lease = r.Announce(n, 30);
  n.kv_bytes_free = 1234;  // load: not signed
  n.in_flight_steps = 3;
  n = Signed(n);  // a heartbeat's record is signed anew
  ASSERT_TRUE(r.Renew(lease, n));
  const Snapshot s = r.List("m");
  ASSERT_EQ(s.nodes.size(), 1u);
  EXPECT_EQ(s.nodes[0].kv_bytes_free, 1234);
  EXPECT_EQ(s.nodes[0].in_flight_steps, 3);
  NodeRecord other = n;
  other.end_layer = 3;  // claims another range under the same lease, signed by the node
  try {
    r.Renew(lease, Signed(other));
    ADD_FAILURE() << "a renewal changed the announced range";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
  }
  Lease none = lease;
  none.id = lease.id ^ 0x5a5a5a5a;
  EXPECT_FALSE(r.Renew(none, n));  // no such lease
}

TYPED_TEST_P(RegistryContract, WithdrawAndReannounce) {
  Registry& r = *this->reg_;
  const NodeRecord n = Rec("10.0.0.1:1", "m", 0, 4);
  const Lease first = r.Announce(n, 30);
  const NodeRecord again = Signed(n);          // a restarted node signs its record anew
  const Lease second = r.Announce(again, 30);  // and replaces the record
  EXPECT_NE(first.id, second.id);
  EXPECT_EQ(r.List("m").nodes.size(), 1u);
  EXPECT_FALSE(r.Renew(first, n));
  EXPECT_TRUE(r.Renew(second, Signed(again)));
  r.Withdraw(second);
  EXPECT_TRUE(r.List("m").nodes.empty());
  EXPECT_FALSE(r.Renew(second, again));
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
  const Lease lease = r.Announce(n, ttl);
  const auto t0 = std::chrono::steady_clock::now();
  while (Since(t0) < 2.5 * ttl) {
    ASSERT_TRUE(r.Renew(lease, Signed(n))) << "lease lost at " << Since(t0) << " s";
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

// The draining flag is the owner's: its own (signed) renewal sets and clears
// it; nobody else can write a record.
TYPED_TEST_P(RegistryContract, TheOwnerSetsDrainingAndReplicasAreFound) {
  Registry& r = *this->reg_;
  NodeRecord self = Rec("10.0.0.1:1", "m", 2, 3);
  const Lease lease = r.Announce(self, 30);
  NodeRecord roomy = Rec("10.0.0.2:1", "m", 2, 3);
  roomy.kv_bytes_free = 900;
  NodeRecord roomier = Rec("10.0.0.3:1", "m", 2, 3);
  roomier.kv_bytes_free = 5000;
  NodeRecord full = Rec("10.0.0.4:1", "m", 2, 3);
  full.kv_bytes_free = 10;
  r.Announce(roomy, 30);
  const Lease roomier_lease = r.Announce(roomier, 30);
  r.Announce(full, 30);
  r.Announce(Rec("10.0.0.5:1", "m", 0, 1), 30);   // another range
  r.Announce(Rec("10.0.0.6:1", "m2", 2, 3), 30);  // another model
  const auto replicas = FindReplicas(r, self, 100);
  ASSERT_EQ(replicas.size(), 2u);
  EXPECT_EQ(replicas[0].address, "10.0.0.3:1");  // most free first
  EXPECT_EQ(replicas[1].address, "10.0.0.2:1");
  EXPECT_EQ(replicas[0].public_key, KeyFor("10.0.0.3:1").public_key());

  roomier.draining = true;
  ASSERT_TRUE(r.Renew(roomier_lease, Signed(roomier)));
  EXPECT_EQ(FindReplicas(r, self, 100).size(), 1u);
  auto self_draining = [&] {
    for (const NodeRecord& n : r.List("m").nodes) {
      if (n.address == self.address) return n.draining;
    }
    ADD_FAILURE() << "self is not listed";
    return false;
  };
  self.draining = true;
  ASSERT_TRUE(r.Renew(lease, Signed(self)));
  EXPECT_TRUE(self_draining());
  self.draining = false;
  ASSERT_TRUE(r.Renew(lease, Signed(self)));  // the owner undrains
  EXPECT_FALSE(self_draining());
}

// A record not signed by the key it names is refused, announced or renewed:
// nobody but the node can say what it serves or that it drains.
TYPED_TEST_P(RegistryContract, UnsignedOrForgedRecordsAreRefused) {
  Registry& r = *this->reg_;
  NodeRecord n = Rec("10.0.0.1:1", "m", 0, 4);
  const Lease lease = r.Announce(n, 30);
  NodeRecord forged = n;
  forged.draining = true;  // a stranger's edit, not re-signed
  NodeRecord unsigned_rec = Rec("10.0.0.2:1", "m", 0, 4);
  unsigned_rec.signature.clear();
  NodeRecord other_key = Rec("10.0.0.3:1", "m", 0, 4);
  SignRecord(KeyFor("10.0.0.9:1"), &other_key);  // signed, but by someone else's key
  other_key.public_key = KeyFor("10.0.0.3:1").public_key();
  for (const NodeRecord& bad : {forged, unsigned_rec, other_key}) {
    try {
      r.Announce(bad, 30);
      ADD_FAILURE() << "announced " << ToJson(bad).dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
    }
  }
  try {
    r.Renew(lease, forged);
    ADD_FAILURE() << "renewed with a forged record";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
  }
  const Snapshot s = r.List("m");
  ASSERT_EQ(s.nodes.size(), 1u);
  EXPECT_FALSE(s.nodes[0].draining);
}

// Writes need the lease's secret (backends that have them); lease ids are
// not neighbours; the TTL is capped; one record per node key.
TYPED_TEST_P(RegistryContract, LeasesBelongToTheirAnnouncer) {
  Registry& r = *this->reg_;
  NodeRecord n = Rec("10.0.0.1:1", "m", 0, 4);
  const Lease lease = r.Announce(n, 86400);
  EXPECT_LE(lease.ttl_s, kMaxLeaseTtlS);
  EXPECT_GT(lease.ttl_s, 0);
  if (this->backend_->LeaseSecrets()) {
    EXPECT_EQ(lease.secret.size(), 16u);
    Lease guessed = lease;
    guessed.secret = std::string(16, 'x');
    for (auto write : {+[](Registry&g, const Lease&l, const NodeRecord&rec) { g.Renew(l, rec); },
                       +[](Registry&g, const Lease&l, const NodeRecord&) { g.Withdraw(l); }}) {
      try {
        write(r, guessed, n);
        ADD_FAILURE() << "a write without the lease secret was accepted";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
      }
    }
    std::set<LeaseId> ids = {lease.id};
    for (int i = 2; i <= 4; ++i)
      ids.insert(r.Announce(Rec("10.0.0." + std::to_string(i) + ":1", "m", 0, 4), 30).id);
    for (auto a = ids.begin(), b = std::next(ids.begin()); b != ids.end(); ++a, ++b) {
      EXPECT_GT(*b - *a, 1000) << "lease ids close together: guessable";
    }
  }
  EXPECT_TRUE(r.Renew(lease, Signed(n)));
  if (this->backend_->LeaseSecrets()) {
    // Anyone may List; a listed record announced again (to take the lease
    // from its node, then withdraw it) is refused as a replay.
    const NodeRecord listed = r.List("m").nodes.front();
    try {
      const Lease stolen = r.Announce(listed, 30);
      r.Withdraw(stolen);
      ADD_FAILURE() << "a replayed record took the node's lease";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
    }
    EXPECT_TRUE(r.Renew(lease, Signed(n))) << "the node lost its lease";
  }
  // The same node key announced under another address: one record.
  NodeRecord moved = n;
  moved.address = "10.0.0.1:2";
  SignRecord(KeyFor("10.0.0.1:1"), &moved);
  r.Announce(moved, 30);
  int with_key = 0;
  for (const NodeRecord& x : r.List("m").nodes) with_key += x.public_key == n.public_key;
  EXPECT_EQ(with_key, 1);
}

// A renewal is newer than the record it replaces (as an announcement is):
// the announced record, an older one or an earlier renewal sent again is
// refused as a replay; a heartbeat signed anew is not.
TYPED_TEST_P(RegistryContract, ReplayedRenewalsAreRefused) {
  Registry& r = *this->reg_;
  const NodeRecord older = Rec("10.0.0.1:1", "m", 0, 4);
  const NodeRecord announced = Signed(older);
  const Lease lease = r.Announce(announced, 30);
  auto expect_refused = [&](const NodeRecord& replay) {
    try {
      r.Renew(lease, replay);
      ADD_FAILURE() << "a renewal signed at " << replay.signed_at_ms
                    << " replaced a record signed no earlier";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
    }
  };
  expect_refused(announced);
  expect_refused(older);
  const NodeRecord renewed = Signed(announced);
  EXPECT_TRUE(r.Renew(lease, renewed));
  expect_refused(renewed);
  EXPECT_TRUE(r.Renew(lease, Signed(announced)));
  ASSERT_EQ(r.List("m").nodes.size(), 1u);
}

REGISTER_TYPED_TEST_SUITE_P(RegistryContract, AnnouncedNodesAreListedByModel,
                            RenewUpdatesLoadAndRefusesIdentityChange, WithdrawAndReannounce,
                            BadRecordsAreRefused, UnrenewedLeaseExpiresWithinTtl,
                            HeartbeatsKeepALeaseAlive, WatchWakesOnChange,
                            TheOwnerSetsDrainingAndReplicasAreFound,
                            UnsignedOrForgedRecordsAreRefused, LeasesBelongToTheirAnnouncer,
                            ReplayedRenewalsAreRefused);

}  // namespace meshnet::registry::testing
