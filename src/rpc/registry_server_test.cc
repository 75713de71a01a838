// The embedded registry over gRPC: the registry contract through
// RemoteRegistry, the cluster token, the check of an announcement against the
// node's Info, and the Announcer keeping a real node registered.
#include "rpc/registry_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "gguf/gguf_reader.h"
#include "mesh/in_process.h"
#include "registry/announcer.h"
#include "registry/registry_contract.h"
#include "registry/status_http.h"
#include "rpc/registry_client.h"
#include "rpc/server.h"
#include "rpc/test_util.h"
#include "util/mutex.h"
#include "util/signing_key.h"

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
  bool LeaseSecrets() { return true; }
};

// The same over the registry's TLS listener with client certificates: every
// contract test (leases bound to their announcer, replayed renewals, forged
// and unsigned records, draining set by the owner only) holds over TLS too.
struct GrpcTlsBackend {
  testing::ScratchDir dir;
  testing::TestPki pki = testing::MakeTestPki(dir);
  std::unique_ptr<RegistryServer> server;
  GrpcTlsBackend() {
    RegistryServerOptions o;
    o.verify_nodes = false;
    o.tls_cert = pki.server_cert;
    o.tls_key = pki.server_key;
    o.tls_ca = pki.ca_cert;
    server = std::make_unique<RegistryServer>(o);
    server->Start();
  }
  std::string Unavailable() { return ""; }
  std::unique_ptr<registry::Registry> Make() {
    ClientOptions mtls;
    mtls.tls_ca = pki.ca_cert;
    mtls.tls_cert = pki.client_cert;
    mtls.tls_key = pki.client_key;
    return std::make_unique<RemoteRegistry>(server->bound_address(), mtls);
  }
  double MinTtl() { return 1.0; }
  bool LeaseSecrets() { return true; }
};

}  // namespace
}  // namespace meshnet::rpc

namespace meshnet::registry::testing {
using GrpcBackends = ::testing::Types<rpc::GrpcBackend, rpc::GrpcTlsBackend>;
INSTANTIATE_TYPED_TEST_SUITE_P(Grpc, RegistryContract, GrpcBackends);
}  // namespace meshnet::registry::testing

namespace meshnet::rpc {
namespace {

using node::ShippedFile;

// One in-process node (layers 0-1 of the shipped model) served over gRPC.
struct OneNode {
  explicit OneNode(const std::string& token = "") : OneNode(WithToken(token)) {}
  explicit OneNode(const NodeServerOptions& o) : mesh(ShippedFile(), Options(), nullptr) {
    server = std::make_unique<NodeServer>(&mesh.node(0), o);
    server->Start();
  }
  static NodeServerOptions WithToken(const std::string& token) {
    NodeServerOptions o;
    o.auth_token = token;
    return o;
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
    registry::SignRecord(node.server->node_key(), &r);  // even the node's own key cannot lie
    try {
      client.Announce(r, 30);
      ADD_FAILURE() << "accepted " << registry::ToJson(r).dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
    }
  }
  NodeRecord nobody = honest;
  nobody.address = "127.0.0.1:1";  // nothing listens there
  registry::SignRecord(node.server->node_key(), &nobody);
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
      &client, [&](bool draining) { return NodeRecordOf(*node.server, draining); }, 1.0);
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
  EXPECT_TRUE(a.SetDraining(true));  // waits for its heartbeat
  EXPECT_TRUE(reg.registry().List().nodes[0].draining);
  EXPECT_TRUE(a.SetDraining(false));
  EXPECT_FALSE(reg.registry().List().nodes[0].draining);
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

namespace meshnet::rpc {
namespace {

// A listener that takes TCP connections and never says a word: a verifying
// call to it waits for its whole deadline.
class SilentListener {
 public:
  SilentListener() {
    int port = 0;
    fd_ = testing::ListenOnLoopback(512, &port);
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  ~SilentListener() { close(fd_); }
  const std::string& address() const { return address_; }

 private:
  int fd_ = -1;
  std::string address_;
};

// HIGH 2: a host that replays a real node's words (its Info, its signed
// record) is not the node. A record naming the real node's address but
// another key, a record of the real key under another address (the
// replaying host's own, or an alias of the node's), and announced load the
// node does not report are all refused or corrected.
TEST(RegistryServer, OnlyTheKeyHolderAtItsOwnAddressIsListed) {
  OneNode node;
  RegistryServer reg(RegistryServerOptions{});
  reg.Start();
  RemoteRegistry client(reg.bound_address(), ClientOptions{});
  const NodeRecord honest = NodeRecordOf(*node.server);
  const SigningKey impostor = SigningKey::Generate();
  auto refused = [&](NodeRecord r, ErrorKind kind, const std::string& what) {
    try {
      client.Announce(r, 30);
      ADD_FAILURE() << what << ": accepted " << registry::ToJson(r).dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << what << ": " << e.what();
    }
  };
  NodeRecord stolen_address = honest;  // the real node's identity, the impostor's key
  registry::SignRecord(impostor, &stolen_address);
  refused(stolen_address, ErrorKind::kPermissionDenied, "another key at the node's address");
  const std::string port = honest.address.substr(honest.address.rfind(':') + 1);
  NodeRecord alias = honest;
  alias.address = "localhost:" + port;  // a name of the same socket
  registry::SignRecord(node.server->node_key(), &alias);
  refused(alias, ErrorKind::kPermissionDenied, "localhost alias");
  for (const std::string& spelling :
       {"ipv4:127.0.0.1:" + port, "[::ffff:127.0.0.1]:" + port, "0.0.0.0:" + port,
        "127.0.0.1:0" + port, "LOCALHOST:" + port}) {
    NodeRecord r = honest;
    r.address = spelling;
    registry::SignRecord(node.server->node_key(), &r);
    refused(r, ErrorKind::kInvalidArgument, spelling);
  }
  EXPECT_TRUE(client.List().nodes.empty());
  NodeRecord boastful = honest;
  boastful.kv_bytes_free = int64_t{1} << 40;  // load is not signed: taken from the node
  client.Announce(boastful, 86400);
  const auto listed = client.List().nodes;
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].kv_bytes_free, node.server->Info().shard.kv_bytes_free);
  EXPECT_EQ(listed[0].public_key, node.server->node_key().public_key());
}

// HIGH 4: callers announcing an address that accepts TCP and never answers
// hold no handler thread: beyond a few verifications at once they are
// refused at once, and the nodes' heartbeats and lists go on meanwhile.
// Over plaintext and over the registry's mutual-TLS listener (where each
// verification also does a TLS handshake with the announced address).
class AnnounceFlood : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Transports, AnnounceFlood, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Tls" : "Plain"; });

TEST_P(AnnounceFlood, DoesNotStopHeartbeats) {
  testing::ScratchDir dir;
  const testing::TestPki pki = testing::MakeTestPki(dir);
  NodeServerOptions no;
  RegistryServerOptions o;
  o.max_rpc_threads = 16;  // fewer handler threads than flooders
  ClientOptions co;
  co.info_timeout_s = 3.0;
  if (GetParam()) {
    no.tls_cert = o.tls_cert = pki.server_cert;
    no.tls_key = o.tls_key = pki.server_key;
    no.tls_ca = o.tls_ca = co.tls_ca = pki.ca_cert;
    co.tls_cert = pki.client_cert;
    co.tls_key = pki.client_key;
    o.node_client = co;
  }
  OneNode node(no);
  SilentListener silent;
  RegistryServer reg(o);
  reg.Start();
  RemoteRegistry client(reg.bound_address(), co);
  const registry::Lease lease = client.Announce(NodeRecordOf(*node.server), 30);
  NodeRecord fake = NodeRecordOf(*node.server);
  fake.address = silent.address();
  const SigningKey k = SigningKey::Generate();
  registry::SignRecord(k, &fake);
  constexpr int kFlooders = 48;
  std::atomic<int> exhausted{0}, done{0};
  std::vector<std::thread> flood;
  for (int i = 0; i < kFlooders; ++i) {
    flood.emplace_back([&] {
      RemoteRegistry attacker(reg.bound_address(), co);
      for (int j = 0; j < 3; ++j) {
        try {
          attacker.Announce(fake, 30);
        } catch (const Error& e) {
          if (e.kind() == ErrorKind::kResourceExhausted) ++exhausted;
        }
      }
      ++done;
    });
  }
  int renewed = 0;
  while (done.load() < kFlooders) {
    EXPECT_TRUE(client.Renew(lease, NodeRecordOf(*node.server))) << "heartbeat refused";
    EXPECT_EQ(client.List().nodes.size(), 1u);
    ++renewed;
    reg.registry().WaitForChange(1 << 30, 0.1);  // a bounded pause between heartbeats
  }
  for (auto& t : flood) t.join();
  EXPECT_GT(renewed, 0);
  EXPECT_GT(exhausted.load(), 0);
  EXPECT_EQ(reg.announces_refused(), exhausted.load());
}

// Issue 32 (audit): a long poll holds a handler thread while it waits, so
// beyond max_waits at once (from any callers) they are refused at once, and a
// node's heartbeat still gets a thread within its deadline. Every caller here
// is 127.0.0.1, so the per-caller cap is set above the global one.
TEST(RegistryServer, LongPollsDoNotStopHeartbeats) {
  RegistryServerOptions o;
  o.verify_nodes = false;  // the record names no real node
  o.max_rpc_threads = 16;  // fewer handler threads than pollers
  o.max_waits = 4;
  o.max_waits_per_peer = 64;
  RegistryServer reg(o);
  reg.Start();
  ClientOptions co;
  co.info_timeout_s = 2.0;
  RemoteRegistry client(reg.bound_address(), co);
  const NodeRecord n = Rec("10.0.0.1:1", "m", 0, 4);
  const registry::Lease lease = client.Announce(n, 30);
  const int64_t since = client.List().revision;
  constexpr int kPollers = 40;
  Mutex mu;
  CondVar refused_more(&mu);
  int refused = 0;                 // guarded by mu
  std::vector<std::string> other;  // guarded by mu: errors other than the refusal
  std::vector<std::thread> pollers;
  for (int i = 0; i < kPollers; ++i) {
    pollers.emplace_back([&] {
      try {
        RemoteRegistry(reg.bound_address(), co).WaitForChange(since, 30);
      } catch (const Error& e) {
        MutexLock lock(&mu);
        if (e.kind() == ErrorKind::kResourceExhausted) {
          ++refused;
        } else {
          other.push_back(e.what());
        }
        refused_more.SignalAll();
      }
    });
  }
  {  // every poller beyond the cap is refused at once (the admitted ones wait)
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    MutexLock lock(&mu);
    while (refused < kPollers - o.max_waits && refused_more.WaitUntil(until)) {
    }
    EXPECT_EQ(refused, kPollers - o.max_waits)
        << other.size() << " other errors, first: " << (other.empty() ? "" : other[0]);
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    EXPECT_TRUE(client.Renew(lease, registry::testing::Signed(n)));  // a heartbeat
  } catch (const Error& e) {
    ADD_FAILURE() << "heartbeat failed while long polls wait: " << e.what();
  }
  EXPECT_LT(Since(t0), co.info_timeout_s);
  reg.registry().Announce(Rec("10.0.0.2:1", "m", 0, 4), 30);  // a change: the polls end
  for (auto& t : pollers) t.join();
  EXPECT_EQ(reg.long_polls_refused(), kPollers - o.max_waits);
}

// The registry's own TLS listener, with client certificates: a client with
// the cluster's CA and certificate announces (the registry reaching the node
// over mutual TLS too) and lists; one without a certificate, or speaking
// plaintext, gets nothing.
TEST(RegistryServer, ServesOverMutualTls) {
  testing::ScratchDir dir;
  const testing::TestPki pki = testing::MakeTestPki(dir);
  NodeServerOptions no;
  no.tls_cert = pki.server_cert;
  no.tls_key = pki.server_key;
  no.tls_ca = pki.ca_cert;
  OneNode node(no);
  ClientOptions mtls;
  mtls.tls_ca = pki.ca_cert;
  mtls.tls_cert = pki.client_cert;
  mtls.tls_key = pki.client_key;
  RegistryServerOptions o;
  o.tls_cert = pki.server_cert;
  o.tls_key = pki.server_key;
  o.tls_ca = pki.ca_cert;
  o.node_client = mtls;
  RegistryServer reg(o);
  reg.Start();
  RemoteRegistry client(reg.bound_address(), mtls);
  client.Announce(NodeRecordOf(*node.server), 30);
  ASSERT_EQ(client.List().nodes.size(), 1u);
  ClientOptions no_cert;
  no_cert.tls_ca = pki.ca_cert;
  no_cert.info_timeout_s = 5;
  EXPECT_THROW(RemoteRegistry(reg.bound_address(), no_cert).List(), Error);
  ClientOptions plain;
  plain.info_timeout_s = 5;
  EXPECT_THROW(RemoteRegistry(reg.bound_address(), plain).List(), Error);
  ClientOptions other_ca = mtls;
  other_ca.tls_ca = pki.other_ca_cert;
  EXPECT_THROW(RemoteRegistry(reg.bound_address(), other_ca).List(), Error);
}

bool HasIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

// A registry, its page and a node all listening on [::1]: the node announces
// its canonical "[::1]:PORT", proves it, and is listed; the page answers.
TEST(RegistryServer, ListensOnIpv6) {
  if (!HasIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback on this machine";
  NodeServerOptions no;
  no.listen = "[::1]:0";
  OneNode node(no);
  RegistryServerOptions o;
  o.listen = "[::1]:0";
  RegistryServer reg(o);
  reg.Start();
  RemoteRegistry client(reg.bound_address(), ClientOptions{});
  const NodeRecord r = NodeRecordOf(*node.server);
  EXPECT_EQ(r.address.rfind("[::1]:", 0), 0u) << r.address;
  client.Announce(r, 30);
  const auto listed = client.List().nodes;
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].address, r.address);
  registry::StatusHttpServer page(&reg.registry());
  const std::string at = page.Start("[::1]:0");
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  a.sin6_port = htons(static_cast<uint16_t>(std::stoi(at.substr(at.rfind(':') + 1))));
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const std::string req = "GET /status.json HTTP/1.0\r\n\r\n";
  ASSERT_EQ(send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  std::string reply;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;)
    reply.append(buf, static_cast<size_t>(n));
  close(fd);
  EXPECT_NE(reply.find("200"), std::string::npos) << reply.substr(0, 200);
  EXPECT_NE(reply.find(r.address), std::string::npos) << reply.substr(0, 400);
}

}  // namespace
}  // namespace meshnet::rpc
