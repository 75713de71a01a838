// The embedded registry over gRPC: the registry contract through
// RemoteRegistry, the cluster token, the check of an announcement against the
// node's Info, and the Announcer keeping a real node registered.
#include "rpc/registry_server.h"

#include <gtest/gtest.h>

#include "gguf/gguf_reader.h"
#include "mesh/in_process.h"
#include "registry/announcer.h"
#include "registry/registry_contract.h"
#include "rpc/registry_client.h"
#include "rpc/server.h"
#include "rpc/test_util.h"

namespace meshnet::rpc {
namespace {

using registry::NodeRecord;
using registry::testing::Rec;
using registry::testing::Since;

struct GrpcBackend {
  std::unique_ptr<RegistryServer> server;
  GrpcBackend() {
    RegistryServerOptions o;
    o.verify_nodes = false;  // the contract's records name no real nodes
    server = std::make_unique<RegistryServer>(o);
    server->Start();
  }
  std::string Unavailable() { return ""; }
  std::unique_ptr<registry::Registry> Make() {
    return std::make_unique<RemoteRegistry>(server->bound_address(), ClientOptions{});
  }
  double MinTtl() { return 1.0; }
};

}  // namespace
}  // namespace meshnet::rpc

namespace meshnet::registry::testing {
using GrpcBackends = ::testing::Types<rpc::GrpcBackend>;
INSTANTIATE_TYPED_TEST_SUITE_P(Grpc, RegistryContract, GrpcBackends);
}  // namespace meshnet::registry::testing

namespace meshnet::rpc {
namespace {

using node::ShippedFile;

// One in-process node (layers 0-1 of the shipped model) served over gRPC.
struct OneNode {
  explicit OneNode(const std::string& token = "") : mesh(ShippedFile(), Options(), nullptr) {
    NodeServerOptions o;
    o.auth_token = token;
    server = std::make_unique<NodeServer>(&mesh.node(0), o);
    server->Start();
  }
  static mesh::InProcessMeshOptions Options() {
    mesh::InProcessMeshOptions mo;
    mo.split = {{0, 1}, {2, 4}};
    return mo;
  }
  mesh::InProcessMesh mesh;
  std::unique_ptr<NodeServer> server;
};

TEST(RegistryServer, RefusesAnAnnouncementTheNodeDoesNotBackUp) {
  OneNode node;
  RegistryServerOptions o;
  RegistryServer reg(o);
  reg.Start();
  RemoteRegistry client(reg.bound_address(), ClientOptions{});
  const NodeRecord honest = NodeRecordOf(*node.server);
  EXPECT_EQ(honest.start_layer, 0);
  EXPECT_EQ(honest.end_layer, 1);
  client.Announce(honest, 30);
  for (auto lie : {+[](NodeRecord& r) { r.end_layer = 4; },
                   +[](NodeRecord& r) { r.model_id = "0123456789abcdef"; },
                   +[](NodeRecord& r) { r.recipe_fingerprint = "other"; },
                   +[](NodeRecord& r) { r.instance_id = "someone-else"; }}) {
    NodeRecord r = honest;
    lie(r);
    try {
      client.Announce(r, 30);
      ADD_FAILURE() << "accepted " << registry::ToJson(r).dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
    }
  }
  NodeRecord nobody = honest;
  nobody.address = "127.0.0.1:1";  // nothing listens there
  EXPECT_THROW(client.Announce(nobody, 30), Error);
  const auto listed = client.List().nodes;
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].end_layer, 1);  // the honest record is untouched
}

TEST(RegistryServer, ChecksTheClusterTokenBothWays) {
  OneNode node("s3cret");
  RegistryServerOptions o;
  o.auth_token = "s3cret";
  o.node_client.auth_token = "s3cret";
  RegistryServer reg(o);
  reg.Start();
  try {
    RemoteRegistry(reg.bound_address(), ClientOptions{}).List();
    ADD_FAILURE() << "listed without the token";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
  }
  ClientOptions with;
  with.auth_token = "s3cret";
  RemoteRegistry client(reg.bound_address(), with);
  client.Announce(NodeRecordOf(*node.server), 30);
  EXPECT_EQ(client.List().nodes.size(), 1u);
}

TEST(Announcer, KeepsANodeRegisteredAndWithdrawsOnStop) {
  OneNode node;
  RegistryServer reg(RegistryServerOptions{});
  reg.Start();
  RemoteRegistry client(reg.bound_address(), ClientOptions{});
  registry::Announcer a(
      &client, [&] { return NodeRecordOf(*node.server); }, 1.0);
  a.Start();
  const auto t0 = std::chrono::steady_clock::now();
  int64_t rev = 0;
  while (reg.registry().List().nodes.empty() && Since(t0) < 10) {
    rev = reg.registry().WaitForChange(rev, 1.0);
  }
  ASSERT_EQ(reg.registry().List().nodes.size(), 1u);
  // Three TTLs later it is still there, under its first lease (renewed).
  const auto t1 = std::chrono::steady_clock::now();
  while (Since(t1) < 3.0) reg.registry().WaitForChange(1 << 30, 3.0 - Since(t1));
  EXPECT_EQ(reg.registry().List().nodes.size(), 1u);
  EXPECT_EQ(a.announcements(), 1);
  a.SetDraining(true);
  const auto t2 = std::chrono::steady_clock::now();
  while (!reg.registry().List().nodes[0].draining && Since(t2) < 5) {
    reg.registry().WaitForChange(reg.registry().List().revision, 1.0);
  }
  EXPECT_TRUE(reg.registry().List().nodes[0].draining);
  a.Stop();
  EXPECT_TRUE(reg.registry().List().nodes.empty());
}

TEST(OpenRegistry, PicksTheBackendFromTheSpec) {
  EXPECT_EQ(OpenRegistry("etcd://127.0.0.1:2379/x", {})->name(), "etcd://127.0.0.1:2379/x");
  EXPECT_EQ(OpenRegistry("127.0.0.1:7000", {})->name(), "127.0.0.1:7000");
  for (const char* bad : {"http://a:1", "a", "a:1,b:2", "a:99999"}) {
    EXPECT_THROW(OpenRegistry(bad, {}), Error) << bad;
  }
}

}  // namespace
}  // namespace meshnet::rpc
