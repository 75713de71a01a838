// The registry contract (registry_contract.h) on the embedded backend and on
// a real etcd, plus what only etcd has: a restart of the cluster.
#include "registry/registry_contract.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <openssl/evp.h>

#include "registry/etcd_registry.h"
#include "registry/etcd_test_util.h"
#include "registry/memory_registry.h"

namespace meshnet::registry::testing {
namespace {

struct MemoryBackend {
  std::string Unavailable() { return ""; }
  std::unique_ptr<Registry> Make() { return std::make_unique<MemoryRegistry>(); }
  double MinTtl() { return 1.0; }
  bool LeaseSecrets() { return true; }
};

struct EtcdBackend {
  EtcdServer server;
  std::string Unavailable() {
    return server.available() ? "" : "etcd is not installed (scripts/install-deps.sh)";
  }
  std::unique_ptr<Registry> Make() {
    return std::make_unique<EtcdRegistry>(ParseEtcdUrl(server.url("/contract")));
  }
  double MinTtl() { return 2.0; }  // etcd's minimum lease TTL with default timings
  bool LeaseSecrets() { return false; }
};

// The same contract with etcd auth on: every call carries root's token.
struct EtcdAuthBackend {
  EtcdServer server;
  EtcdAuthBackend() {
    if (server.available()) server.EnableAuth("root-secret");
  }
  std::string Unavailable() {
    return server.available() ? "" : "etcd is not installed (scripts/install-deps.sh)";
  }
  std::unique_ptr<Registry> Make() {
    EtcdSecurity sec;
    sec.user = "root";
    sec.password = "root-secret";
    return std::make_unique<EtcdRegistry>(ParseEtcdUrl(server.url("/contract")), 5.0, sec);
  }
  double MinTtl() { return 2.0; }
  bool LeaseSecrets() { return false; }
};

using Backends = ::testing::Types<MemoryBackend, EtcdBackend, EtcdAuthBackend>;
INSTANTIATE_TYPED_TEST_SUITE_P(Registry, RegistryContract, Backends);

TEST(EtcdUrl, Parses) {
  const EtcdAddress a = ParseEtcdUrl("etcd://127.0.0.1:2379/mesh/a/");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 2379);
  EXPECT_EQ(a.prefix, "/mesh/a");
  EXPECT_FALSE(a.tls);
  EXPECT_EQ(ParseEtcdUrl("etcd://h:1").prefix, "/meshnet");
  const EtcdAddress s = ParseEtcdUrl("etcds://10.1.2.3:2379/p");
  EXPECT_TRUE(s.tls);
  EXPECT_EQ(s.host, "10.1.2.3");
  EXPECT_EQ(s.port, 2379);
  EXPECT_EQ(s.prefix, "/p");
  for (const char* bad : {"http://h:1", "etcd://h", "etcd://h:0/x", "etcd://:5/x", "etcd://h:x",
                          "etcdss://h:1", "etcds://h"}) {
    EXPECT_THROW(ParseEtcdUrl(bad), Error) << bad;
  }
}

TEST(EtcdRegistry, UnreachableIsUnavailable) {
  EtcdRegistry r(ParseEtcdUrl("etcd://127.0.0.1:" + std::to_string(FreePort()) + "/x"), 1.0);
  try {
    r.List();
    ADD_FAILURE() << "listed without etcd";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnavailable) << e.what();
  }
}

TEST(EtcdRegistry, PrefixesAreSeparate) {
  EtcdServer server;
  MESHNET_REQUIRE_ETCD(server);
  EtcdRegistry a(ParseEtcdUrl(server.url("/a"))), b(ParseEtcdUrl(server.url("/b")));
  a.Announce(Rec("10.0.0.1:1", "m", 0, 4), 30);
  EXPECT_EQ(a.List().nodes.size(), 1u);
  EXPECT_TRUE(b.List().nodes.empty());
}

std::string B64(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3), '\0');
  out.resize(EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                             reinterpret_cast<const unsigned char*>(in.data()),
                             static_cast<int>(in.size())));
  return out;
}

// What any etcd writer can do: put `rec` under `key`, with `lease` (0: none).
void PutRaw(EtcdServer& server, const std::string& key, const NodeRecord& rec,
            const std::string& lease = "0") {
  httplib::Client cli("127.0.0.1", server.port());
  const nlohmann::json body = {
      {"key", B64(key)}, {"value", B64(ToJson(rec).dump())}, {"lease", lease}};
  const auto res = cli.Post("/v3/kv/put", body.dump(), "application/json");
  ASSERT_TRUE(res && res->status == 200) << (res ? res->body : "no answer");
}

// etcd lets every writer write any key: a record a writer made up (under an
// impostor's key, or a real record edited to "draining") is not listed; the
// node's own record, written by the node, is.
TEST(EtcdRegistry, RecordsNotSignedByTheirNodeAreNotListed) {
  EtcdServer server;
  MESHNET_REQUIRE_ETCD(server);
  EtcdRegistry r(ParseEtcdUrl(server.url("/p")));
  const NodeRecord honest = Rec("10.0.0.1:1", "m", 0, 4);
  r.Announce(honest, 30);
  auto put = [&](const std::string& key, const NodeRecord& rec) {
    ASSERT_NO_FATAL_FAILURE(PutRaw(server, key, rec));
  };
  NodeRecord edited = honest;
  edited.draining = true;  // not re-signed: the writer has no node key
  put("/p/nodes/m/10.0.0.1:1", edited);
  NodeRecord made_up = Rec("10.0.0.2:1", "m", 0, 4);
  made_up.public_key = honest.public_key;  // claims the honest node's key
  put("/p/nodes/m/10.0.0.2:1", made_up);
  NodeRecord misplaced = Rec("10.0.0.3:1", "m", 0, 4);  // validly signed, under another key
  put("/p/nodes/m/10.0.0.9:1", misplaced);
  EXPECT_TRUE(r.List("m").nodes.empty()) << "edited, made-up or misplaced records listed";
  r.Announce(Signed(honest), 30);  // the node's next announcement is listed again
  const auto listed = r.List("m").nodes;
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_FALSE(listed[0].draining);
}

// A node's own, validly signed record outlives its node only as long as a
// lease would: put back by a writer with no lease, or under a lease the
// writer keeps alive but signed longer ago than the TTL cap plus clock skew
// (or dated ahead), it is not listed.
TEST(EtcdRegistry, StaleOrLeaselessRecordsAreNotListed) {
  EtcdServer server;
  MESHNET_REQUIRE_ETCD(server);
  EtcdRegistry r(ParseEtcdUrl(server.url("/p")));
  const NodeRecord honest = Rec("10.0.0.1:1", "m", 0, 4);
  const std::string key = "/p/nodes/m/10.0.0.1:1";
  r.Withdraw(r.Announce(honest, 30));  // the node stopped (or its lease expired)
  ASSERT_TRUE(r.List("m").nodes.empty());
  ASSERT_NO_FATAL_FAILURE(PutRaw(server, key, honest));  // back, with no lease
  EXPECT_TRUE(r.List("m").nodes.empty()) << "a record with no lease is listed";
  httplib::Client cli("127.0.0.1", server.port());
  const auto granted = cli.Post("/v3/lease/grant", R"({"TTL": 60})", "application/json");
  ASSERT_TRUE(granted && granted->status == 200);
  const std::string writers_lease = nlohmann::json::parse(granted->body).value("ID", "");
  ASSERT_FALSE(writers_lease.empty());
  auto signed_at = [](NodeRecord rec, int64_t ms) {  // signed by the node, at `ms`
    rec.signed_at_ms = ms;
    rec.signature = KeyFor(rec.address).Sign(RecordSignedText(rec));
    return rec;
  };
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const auto window_ms = static_cast<int64_t>(kMaxLeaseTtlS * 1000) + kListClockSkewMs;
  for (const int64_t at :
       {now - window_ms - 10000, now - 3600000, now + kListClockSkewMs + 10000}) {
    ASSERT_NO_FATAL_FAILURE(PutRaw(server, key, signed_at(honest, at), writers_lease));
    EXPECT_TRUE(r.List("m").nodes.empty())
        << "a record signed " << (now - at) / 1000 << " s ago is listed under a writer's lease";
  }
  r.Announce(Signed(honest), 30);  // the node's next announcement is listed again
  EXPECT_EQ(r.List("m").nodes.size(), 1u);
}

TEST(EtcdRegistry, LeasesAndRecordsSurviveARestart) {
  EtcdServer server;
  MESHNET_REQUIRE_ETCD(server);
  EtcdRegistry r(ParseEtcdUrl(server.url()));
  NodeRecord n = Rec("10.0.0.1:1", "m", 0, 4);
  const Lease lease = r.Announce(n, 10);
  server.Restart();
  ASSERT_NO_FATAL_FAILURE(RenewAcrossRestart(r, lease, n));
  ASSERT_EQ(r.List("m").nodes.size(), 1u);
  server.Kill();
  EXPECT_THROW(r.List(), Error);
}

}  // namespace
}  // namespace meshnet::registry::testing
