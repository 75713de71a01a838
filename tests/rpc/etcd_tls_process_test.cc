// `meshnet serve` and `meshnet status` against an etcd that requires TLS with
// client certificates (--client-cert-auth): the node registers over
// etcds://, status sees it (with --etcd-* or with the cluster's --tls-*
// files), and a status that does not trust etcd's certificate exits 2 with
// the reason. The etcd and the node are killed and reaped in teardown; every
// wait is bounded.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "registry/etcd_registry.h"
#include "registry/etcd_test_util.h"
#include "rpc/test_util.h"
#include "tests/rpc/cli_run.h"
#include "tests/rpc/etcd_tls_util.h"
#include "tests/rpc/node_process.h"
#include "util/error.h"

namespace meshnet::rpc {
namespace {

using registry::testing::EtcdServer;
using registry::testing::MakeEtcdPki;

class EtcdTlsProcessTest : public ::testing::Test {
 protected:
  // The addresses `meshnet status ... --output json` lists ("" on failure).
  std::vector<std::string> StatusAddresses(const std::vector<std::string>& flags) {
    std::vector<std::string> args = {"status", "--registry", etcd_.url("/mesh"), "--output",
                                     "json"};
    args.insert(args.end(), flags.begin(), flags.end());
    const testing::CliResult r = testing::RunCli(MESHNET_BINARY, args, 30);
    EXPECT_FALSE(r.timed_out);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> out;
    const auto j = nlohmann::json::parse(r.out, nullptr, false);
    if (j.is_discarded()) return out;
    for (const auto& m : j.value("models", nlohmann::json::array())) {
      for (const auto& n : m.value("nodes", nlohmann::json::array())) {
        out.push_back(n.value("address", ""));
      }
    }
    return out;
  }

  testing::ScratchDir dir_;
  testing::TestPki pki_;
  EtcdServer etcd_{MakeEtcdPki(dir_, &pki_)};
};

TEST_F(EtcdTlsProcessTest, ServeRegistersOverTlsAndStatusSeesIt) {
  MESHNET_REQUIRE_ETCD(etcd_);
  const std::vector<std::string> etcd_flags = {"--etcd-ca",      pki_.ca_cert, "--etcd-cert",
                                               pki_.client_cert, "--etcd-key", pki_.client_key};
  std::vector<std::string> args = {"--model",    MESHNET_SHIPPED_MODEL, "--layers",    "0-4",
                                   "--listen",   "127.0.0.1:0",         "--threads",   "1",
                                   "--registry", etcd_.url("/mesh"),    "--lease-ttl", "2"};
  args.insert(args.end(), etcd_flags.begin(), etcd_flags.end());
  testing::NodeProcess node(MESHNET_BINARY, args, dir_.file("node.log"));

  // Wait (on the registry's watch, bounded) for the announcement.
  registry::EtcdRegistry reg(registry::ParseEtcdUrl(etcd_.url("/mesh")), 5.0,
                             {pki_.ca_cert, pki_.client_cert, pki_.client_key});
  const auto t0 = std::chrono::steady_clock::now();
  registry::Snapshot s = reg.List();
  while (s.nodes.empty() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    reg.WaitForChange(s.revision, 1.0);
    s = reg.List();
  }
  ASSERT_EQ(s.nodes.size(), 1u) << node.Log();
  EXPECT_EQ(s.nodes[0].address, node.address());

  EXPECT_EQ(StatusAddresses(etcd_flags), std::vector<std::string>{node.address()});
  // Without --etcd-*, etcds:// uses the cluster TLS flags.
  EXPECT_EQ(StatusAddresses({"--tls-ca", pki_.ca_cert, "--tls-cert", pki_.client_cert, "--tls-key",
                             pki_.client_key}),
            std::vector<std::string>{node.address()});

  const testing::CliResult wrong =
      testing::RunCli(MESHNET_BINARY,
                      {"status", "--registry", etcd_.url("/mesh"), "--etcd-ca", pki_.other_ca_cert,
                       "--etcd-cert", pki_.client_cert, "--etcd-key", pki_.client_key},
                      30);
  EXPECT_EQ(wrong.exit_code, 2) << wrong.err;
  EXPECT_NE(wrong.err.find("meshnet: error: "), std::string::npos) << wrong.err;
  EXPECT_NE(wrong.err.find("server certificate not trusted"), std::string::npos) << wrong.err;
}

}  // namespace
}  // namespace meshnet::rpc
