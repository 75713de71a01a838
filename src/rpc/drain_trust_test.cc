// Who a node drains to, and what it sends: nothing reaches a host that cannot
// prove, on its own connection, that it is a node of the same range (its key,
// the address it was reached by, and with a cluster token the token), and
// the cluster token is never sent to a drain target. Admin calls need the
// admin token, never the cluster token. Sessions live in a NodeCore here;
// targets are real NodeServers and a fake MeshNode that replays a real
// node's answers, all on 127.0.0.1.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "node/identity.h"
#include "node/node.h"
#include "node/node_core.h"
#include "proto/meshnet.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/drain.h"
#include "rpc/fake_replica_test_util.h"
#include "rpc/remote.h"
#include "rpc/server.h"
#include "rpc/test_util.h"
#include "util/error.h"
#include "util/mutex.h"

namespace meshnet::rpc {
namespace {

namespace pb = ::meshnet::v1;
using node::ShippedFile;

const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378, 429, 30, 31};
const std::string kSecret = "the-secret";
const std::string kToken = "cluster-token";
const std::string kAdmin = "admin-token";

std::unique_ptr<node::Node> FullNode(node::LayerRange layers = {0, 4}) {
  node::NodeOptions o;
  o.layers = layers;
  o.kv_config.budget_bytes = 16 << 20;
  o.kv_config.block_tokens = 4;
  o.kv_config.max_sessions = 16;
  return std::make_unique<node::Node>(ShippedFile(), o, nullptr);
}

// A node with live sessions to drain (no transport: DrainSessions pushes).
struct Source {
  Source() : node(FullNode()), core(std::make_unique<node::NodeCore>(node.get())) {}
  void AddSessions(int n) {
    for (int i = 0; i < n; ++i) {
      node::StepRequest r;
      r.session_id = node::RandomId128();
      r.session_secret = kSecret;
      r.prefill = true;
      r.token_ids = kPrompt;
      core->Step(std::move(r));
    }
  }
  DrainReport DrainTo(std::vector<DrainTarget> targets, const std::string& token = kToken) {
    DrainOptions o;
    o.find_replicas = [targets](const node::ShardInfo&, int64_t) { return targets; };
    o.client.auth_token = token;
    o.client.timeout_s = 20;
    o.deadline_s = 30;
    return DrainSessions(*core, o);
  }
  std::unique_ptr<node::Node> node;
  std::unique_ptr<node::NodeCore> core;
};

struct Target {
  explicit Target(const std::string& token = kToken, const std::string& admin = "",
                  node::LayerRange layers = {0, 4})
      : node(FullNode(layers)) {
    NodeServerOptions o;
    o.auth_token = token;
    o.admin_token = admin;
    server = std::make_unique<NodeServer>(node.get(), o);
    server->Start();
  }
  int64_t imported() const { return server->counters().sessions_imported.load(); }
  std::unique_ptr<node::Node> node;
  std::unique_ptr<NodeServer> server;
};

using testing::FakeReplica;

int Count(const std::vector<std::string>& calls, const std::string& method) {
  return static_cast<int>(std::count(calls.begin(), calls.end(), method));
}

// HIGH 1 and 2: a fake that relays the real node's Info and signed Prove gets
// nothing: the signature names the real node's address, not the fake's. The
// drain then reaches the real replica, with a peer proof, not the token.
TEST(DrainTrust, AFakeReplicaGetsNoSessionAndNoToken) {
  Target real;
  FakeReplica fake(real.server->bound_address(), kToken);
  Source src;
  src.AddSessions(3);
  const DrainReport none = src.DrainTo({{fake.address(), ""}});
  EXPECT_EQ(none.sessions, 3);
  EXPECT_EQ(none.moved, 0);
  EXPECT_EQ(none.ended, 3);
  EXPECT_EQ(Count(fake.calls(), "OfferImport") + Count(fake.calls(), "ImportSession"), 0);
  EXPECT_EQ(fake.chunks(), 0);
  EXPECT_FALSE(fake.saw_token()) << "the cluster token was sent to an unproven host";
  ASSERT_FALSE(none.notes.empty());
  EXPECT_NE(none.notes[0].find("proof"), std::string::npos) << none.notes[0];

  Source again;
  again.AddSessions(3);
  const DrainReport r = again.DrainTo({{fake.address(), ""}, {real.server->bound_address(), ""}});
  EXPECT_EQ(r.moved, 3);
  EXPECT_EQ(real.imported(), 3);  // the token gate admitted the peer proof
  EXPECT_FALSE(fake.saw_token());
  EXPECT_EQ(fake.chunks(), 0);
}

// A real node of another cluster (another token), a node whose key is not
// the one the registry's record names, and a node of another range prove
// nothing useful: no session goes there.
TEST(DrainTrust, ARealNodeOfAnotherClusterOrKeyOrRangeGetsNothing) {
  Target stranger("another-token");
  Target real;
  Source src;
  src.AddSessions(2);
  const std::string other_key = SigningKey::Generate().public_key();
  const DrainReport r = src.DrainTo(
      {{stranger.server->bound_address(), ""}, {real.server->bound_address(), other_key}});
  EXPECT_EQ(r.moved, 0);
  EXPECT_EQ(stranger.imported(), 0);
  EXPECT_EQ(real.imported(), 0);
  std::string notes;
  for (const auto& n : r.notes) notes += n + "\n";
  EXPECT_NE(notes.find("does not know this cluster's token"), std::string::npos) << notes;
  EXPECT_NE(notes.find("not the one expected"), std::string::npos) << notes;
  // The right key passes.
  Source src2;
  src2.AddSessions(1);
  EXPECT_EQ(
      src2.DrainTo({{real.server->bound_address(), real.server->node_key().public_key()}}).moved,
      1);
}

// A real node of this cluster, proving its own key, but serving other layers
// (or, alike, another model or KV recipe) gets no session: it is no replica.
TEST(DrainTrust, ARealNodeOfAnotherRangeGetsNothing) {
  Target head(kToken, "", {0, 2});
  Source src;
  src.AddSessions(2);
  const DrainReport r =
      src.DrainTo({{head.server->bound_address(), head.server->node_key().public_key()}});
  EXPECT_EQ(r.moved, 0);
  EXPECT_EQ(head.imported(), 0);
  std::string notes;
  for (const auto& n : r.notes) notes += n + "\n";
  EXPECT_NE(notes.find("is not a replica of this node's layers 0-4"), std::string::npos) << notes;
}

// Without a token on the pusher, the target still has to prove its key and
// address; an import without token or peer proof is refused by a node that
// has a token.
TEST(DrainTrust, ImportsNeedTheTokenOrAPeerProof) {
  Target real;
  Source src;
  src.AddSessions(1);
  const DrainReport r = src.DrainTo({{real.server->bound_address(), ""}}, /*token=*/"");
  EXPECT_EQ(r.moved, 0);
  EXPECT_EQ(real.imported(), 0);
}

// Admin calls: the admin token only. The cluster token is refused, as is
// everything when the node has no admin token (a tokenless node too: it
// cannot be told to drain to an arbitrary host). Undrain reopens the node.
TEST(AdminCalls, NeedTheAdminTokenNotTheClusterToken) {
  Target node(kToken, kAdmin);
  ClientOptions co;
  co.timeout_s = 10;
  for (const std::string& wrong : {std::string(""), kToken, std::string("guess")}) {
    try {
      RequestDrain(node.server->bound_address(), {"127.0.0.1:1"}, co, wrong);
      ADD_FAILURE() << "drained with '" << wrong << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
    }
  }
  const DrainReport r = RequestDrain(node.server->bound_address(), {}, co, kAdmin);
  EXPECT_EQ(r.sessions, 0);
  ClientOptions member = co;
  member.auth_token = kToken;
  RemoteEndpoint client(node.server->bound_address(), member);
  auto prompt = [&] {
    node::StepRequest step;
    step.session_id = node::RandomId128();
    step.session_secret = kSecret;
    step.prefill = true;
    step.token_ids = kPrompt;
    return client.Step(std::move(step));
  };
  EXPECT_THROW(prompt(), Error) << "a draining node takes no new session";
  EXPECT_TRUE(RequestUndrain(node.server->bound_address(), co, kAdmin));
  EXPECT_TRUE(std::holds_alternative<shard::TailOutput>(prompt())) << "undrain reopens the node";
  EXPECT_FALSE(RequestUndrain(node.server->bound_address(), co, kAdmin));

  Target open("", "");  // no token, no admin token
  for (const std::string& any : {std::string(""), kAdmin}) {
    EXPECT_THROW(RequestDrain(open.server->bound_address(), {"127.0.0.1:1"}, co, any), Error);
    EXPECT_THROW(RequestUndrain(open.server->bound_address(), co, any), Error);
  }
}

TEST(AdminCalls, TheAdminTokenMustDifferFromTheClusterToken) {
  auto node = FullNode();
  NodeServerOptions o;
  o.auth_token = kToken;
  o.admin_token = kToken;
  EXPECT_THROW(NodeServer(node.get(), o), Error);
}

// MEDIUM 4: connections to the KV transfer port that never present a ticket
// hold it for about a second, not twenty, one address takes at most four of
// its places, and a push whose port connection fails streams over gRPC: four
// silent clients stop no migration.
TEST(DrainTrust, SilentTransferPortClientsStopNoMigration) {
  Target real;
  ASSERT_GT(real.server->kv_transfer_port(), 0);
  std::vector<int> silent;
  for (int i = 0; i < 4; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(real.server->kv_transfer_port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    silent.push_back(fd);
  }
  Source src;
  src.AddSessions(6);
  const DrainReport r = src.DrainTo({{real.server->bound_address(), ""}});
  std::string notes;
  for (const auto& n : r.notes) notes += n + "\n";
  EXPECT_EQ(r.moved, 6) << notes;
  EXPECT_EQ(real.imported(), 6);
  for (const int fd : silent) close(fd);
}

}  // namespace
}  // namespace meshnet::rpc
