// etcd auth (the contract itself runs with auth on in registry_contract_test):
// a bad password or no user is refused with a clear error, and a token etcd
// forgot (here: on a restart) is renewed without the caller noticing.
#include <gtest/gtest.h>

#include "registry/etcd_registry.h"
#include "registry/etcd_test_util.h"
#include "registry/registry_contract.h"

namespace meshnet::registry::testing {
namespace {

class EtcdAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MESHNET_REQUIRE_ETCD(server_);
    server_.EnableAuth("root-secret");
  }
  EtcdSecurity User(const std::string& password) const {
    EtcdSecurity s;
    s.user = "root";
    s.password = password;
    return s;
  }
  EtcdAddress Address() const { return ParseEtcdUrl(server_.url("/auth")); }
  EtcdServer server_;
};

TEST_F(EtcdAuthTest, BadPasswordOrNoUserIsPermissionDenied) {
  EtcdRegistry bad(Address(), 5.0, User("wrong"));
  EtcdRegistry anonymous(Address(), 5.0);
  for (Registry* r : {static_cast<Registry*>(&bad), static_cast<Registry*>(&anonymous)}) {
    try {
      r->Announce(Rec("10.0.0.1:1", "m", 0, 4), 30);
      ADD_FAILURE() << "announced without valid credentials";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
      const std::string msg = e.what();
      EXPECT_TRUE(msg.find("authentication failed") != std::string::npos ||
                  msg.find("user name is empty") != std::string::npos)
          << msg;
    }
  }
  EtcdRegistry root(Address(), 5.0, User("root-secret"));
  EXPECT_TRUE(root.List().nodes.empty());  // nothing got in
}

TEST_F(EtcdAuthTest, AForgottenTokenIsRenewed) {
  EtcdRegistry r(Address(), 5.0, User("root-secret"));
  const NodeRecord n = Rec("10.0.0.1:1", "m", 0, 4);
  const Lease lease = r.Announce(n, 30);
  server_.Restart();  // etcd's simple tokens live in memory: the held one is gone
  ASSERT_NO_FATAL_FAILURE(RenewAcrossRestart(r, lease, n));  // never kPermissionDenied
  EXPECT_EQ(r.List("m").nodes.size(), 1u);
}

TEST(EtcdAuth, APasswordWithoutAUserIsRefused) {
  EtcdSecurity s;
  s.password = "x";
  EXPECT_THROW(EtcdRegistry(ParseEtcdUrl("etcd://127.0.0.1:2379/x"), 1.0, s), Error);
}

}  // namespace
}  // namespace meshnet::registry::testing
