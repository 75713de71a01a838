// The registry contract (registry/registry_contract.h) over TLS, against an
// etcd with --client-cert-auth; and what only the TLS path has: a client that does not trust etcd's
// certificate, or has no client certificate for --client-cert-auth, is refused with a clear error;
// bad TLS settings are refused before any connection.
#include <gtest/gtest.h>

#include "registry/etcd_registry.h"
#include "registry/etcd_test_util.h"
#include "registry/registry_contract.h"
#include "tests/rpc/etcd_tls_util.h"

namespace meshnet::registry::testing {
namespace {

// The same contract over TLS: etcd with --client-cert-auth, reached by
// etcds:// with the CA, a client certificate and its key.
struct EtcdTlsBackend {
  rpc::testing::ScratchDir dir;
  rpc::testing::TestPki pki;
  EtcdServer server{MakeEtcdPki(dir, &pki)};
  std::string Unavailable() {
    return server.available() ? "" : "etcd is not installed (scripts/install-deps.sh)";
  }
  std::unique_ptr<Registry> Make() {
    return std::make_unique<EtcdRegistry>(
        ParseEtcdUrl(server.url("/contract")), 5.0,
        EtcdSecurity{pki.ca_cert, pki.client_cert, pki.client_key});
  }
  double MinTtl() { return 2.0; }
  bool LeaseSecrets() { return false; }
};

INSTANTIATE_TYPED_TEST_SUITE_P(EtcdTls, RegistryContract, ::testing::Types<EtcdTlsBackend>);

class EtcdTlsTest : public ::testing::Test {
 protected:
  EtcdAddress Address() const { return ParseEtcdUrl(server_.url("/tls")); }
  rpc::testing::ScratchDir dir_;
  rpc::testing::TestPki pki_;
  EtcdServer server_{MakeEtcdPki(dir_, &pki_)};
};

TEST_F(EtcdTlsTest, TrustedClientAnnouncesAndLists) {
  MESHNET_REQUIRE_ETCD(server_);
  EtcdRegistry r(Address(), 5.0, {pki_.ca_cert, pki_.client_cert, pki_.client_key});
  EXPECT_EQ(r.name(), server_.url("/tls"));
  const Lease lease = r.Announce(Rec("10.0.0.1:1", "m", 0, 4), 30);
  ASSERT_EQ(r.List("m").nodes.size(), 1u);
  r.Withdraw(lease);
  EXPECT_TRUE(r.List("m").nodes.empty());
}

TEST_F(EtcdTlsTest, WrongCaIsRefusedWithItsReason) {
  MESHNET_REQUIRE_ETCD(server_);
  EtcdRegistry r(Address(), 5.0, {pki_.other_ca_cert, pki_.client_cert, pki_.client_key});
  for (int call = 0; call < 2; ++call) {  // a plain call, then the watch
    try {
      if (call == 0) r.List();
      if (call == 1) r.WaitForChange(0, 2.0);
      ADD_FAILURE() << "etcd was trusted under the wrong CA (call " << call << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
      const std::string msg = e.what();
      EXPECT_NE(msg.find("server certificate not trusted"), std::string::npos) << msg;
      EXPECT_NE(msg.find(pki_.other_ca_cert), std::string::npos) << msg;
    }
  }
}

TEST_F(EtcdTlsTest, NoClientCertificateIsRefused) {
  MESHNET_REQUIRE_ETCD(server_);
  EtcdRegistry r(Address(), 5.0, {pki_.ca_cert, "", ""});
  try {
    r.Announce(Rec("10.0.0.1:1", "m", 0, 4), 30);
    ADD_FAILURE() << "announced without a client certificate";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("client certificate"), std::string::npos) << e.what();
  }
  EtcdRegistry trusted(Address(), 5.0, {pki_.ca_cert, pki_.client_cert, pki_.client_key});
  EXPECT_TRUE(trusted.List().nodes.empty());  // nothing got in
}

TEST_F(EtcdTlsTest, PlainHttpToATlsEtcdFails) {
  MESHNET_REQUIRE_ETCD(server_);
  EtcdAddress plain = Address();
  plain.tls = false;
  EtcdRegistry r(plain, 2.0);
  EXPECT_THROW(r.List(), Error);
}

TEST(EtcdTls, BadSettingsAreRefusedUpFront) {
  rpc::testing::ScratchDir dir;
  const rpc::testing::TestPki pki = rpc::testing::MakeTestPki(dir);
  const EtcdAddress tls = ParseEtcdUrl("etcds://127.0.0.1:2379/x");
  auto refused = [](const EtcdAddress& a, EtcdSecurity t, const std::string& want) {
    try {
      EtcdRegistry r(a, 1.0, std::move(t));
      ADD_FAILURE() << "accepted; wanted an error with '" << want << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused(ParseEtcdUrl("etcd://127.0.0.1:2379/x"), {pki.ca_cert, "", ""}, "etcds://");
  refused(tls, {pki.ca_cert, pki.client_cert, ""}, "go together");
  refused(tls, {dir.file("missing.pem"), "", ""}, "missing.pem");
  refused(tls, {pki.ca_cert, pki.client_cert, pki.ca_cert}, "not a PEM certificate");
  EtcdRegistry ok(tls, 1.0, {pki.ca_cert, pki.client_cert, pki.client_key});  // no connection yet
  EXPECT_EQ(ok.name(), "etcds://127.0.0.1:2379/x");
}

}  // namespace
}  // namespace meshnet::registry::testing
