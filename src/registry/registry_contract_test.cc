// The registry contract (registry_contract.h) on the embedded backend and on
// a real etcd, plus what only etcd has: a restart of the cluster.
#include "registry/registry_contract.h"

#include <gtest/gtest.h>

#include "registry/etcd_registry.h"
#include "registry/etcd_test_util.h"
#include "registry/memory_registry.h"

namespace meshnet::registry::testing {
namespace {

struct MemoryBackend {
  std::string Unavailable() { return ""; }
  std::unique_ptr<Registry> Make() { return std::make_unique<MemoryRegistry>(); }
  double MinTtl() { return 1.0; }
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

TEST(EtcdRegistry, LeasesAndRecordsSurviveARestart) {
  EtcdServer server;
  MESHNET_REQUIRE_ETCD(server);
  EtcdRegistry r(ParseEtcdUrl(server.url()));
  NodeRecord n = Rec("10.0.0.1:1", "m", 0, 4);
  const LeaseId lease = r.Announce(n, 10);
  server.Restart();
  ASSERT_NO_FATAL_FAILURE(RenewAcrossRestart(r, lease, n));
  ASSERT_EQ(r.List("m").nodes.size(), 1u);
  server.Kill();
  EXPECT_THROW(r.List(), Error);
}

}  // namespace
}  // namespace meshnet::registry::testing
