// 32 concurrent greedy generations through nodes that batch their steps
// across sessions: in-process (3 shards) and over 3 gRPC nodes on 127.0.0.1,
// each generation equal token for token to its solo run, and the nodes
// really ran steps of several sessions in one batch.
#include <gtest/gtest.h>

#include <thread>

#include "gguf/gguf_reader.h"
#include "mesh/generator.h"
#include "mesh/in_process.h"
#include "rpc/remote.h"
#include "rpc/server.h"
#include "rpc/test_util.h"
#include "util/thread_pool.h"

namespace meshnet::rpc {
namespace {

constexpr int kSessions = 32;
constexpr int kTokens = 16;

using node::ShippedFile;

std::vector<int32_t> PromptOf(int i) {
  std::vector<int32_t> p = {1};
  for (int t = 1; t < 3 + i % 7; ++t)
    p.push_back(static_cast<int32_t>(260 + (i * 37 + t * 11) % 240));
  return p;
}

mesh::InProcessMeshOptions Split() {
  mesh::InProcessMeshOptions o;
  o.split = {{0, 1}, {2, 3}, {4, 4}};
  o.kv_config.max_sessions = 2 * kSessions;
  o.kv_config.budget_bytes = 32 << 20;
  return o;
}

mesh::GenerateOptions Greedy() {
  mesh::GenerateOptions o;
  o.max_tokens = kTokens;
  return o;
}

std::vector<std::vector<int32_t>> Solo() {
  mesh::InProcessMesh mesh(ShippedFile(), Split(), nullptr);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < kSessions; ++i) {
    mesh::FixedRouteProvider p(mesh.route());
    out.push_back(mesh::Generate(p, PromptOf(i), Greedy()).generated_ids);
  }
  return out;
}

// Runs the 32 generations at once, all through one provider. Their prompts
// are held at each node until all 32 are queued there, so every node runs
// them as one batch (and the decode steps that follow overlap as they may).
std::vector<std::vector<int32_t>> Concurrent(mesh::InProcessMesh& mesh,
                                             mesh::RouteProvider& provider) {
  std::vector<std::vector<int32_t>> out(kSessions);
  std::vector<std::thread> threads;
  for (int n = 0; n < mesh.num_shards(); ++n) mesh.node(n).batcher().Hold();
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      try {
        out[i] = mesh::Generate(provider, PromptOf(i), Greedy()).generated_ids;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "session " << i << ": " << e.what();
      }
    });
  }
  for (int n = 0; n < mesh.num_shards(); ++n) {
    mesh.node(n).batcher().WaitPending(kSessions);
    mesh.node(n).batcher().Resume();
  }
  for (auto& t : threads) t.join();
  return out;
}

void ExpectBatched(mesh::InProcessMesh& mesh) {
  for (int i = 0; i < mesh.num_shards(); ++i) {
    const node::BatchStats& s = mesh.node(i).batcher().stats();
    EXPECT_EQ(s.max_sessions.load(), kSessions) << "node " << i;
    EXPECT_LT(s.batches.load(), s.steps.load()) << "node " << i;
  }
}

TEST(BatchedRoute, InProcessSessionsEqualTheirSoloRuns) {
  const auto solo = Solo();
  ThreadPool pool(2);
  mesh::InProcessMesh mesh(ShippedFile(), Split(), &pool);
  mesh::FixedRouteProvider provider(mesh.route());
  const auto got = Concurrent(mesh, provider);
  for (int i = 0; i < kSessions; ++i) EXPECT_EQ(got[i], solo[i]) << "session " << i;
  ExpectBatched(mesh);
}

// The 32 sessions over three gRPC nodes, the client with `pipeline_depth`
// (1: one cohort, its decode steps carried hop to hop by one thread).
void GrpcNodesEqualSolo(int pipeline_depth) {
  const auto solo = Solo();
  ThreadPool pool(2);
  mesh::InProcessMesh mesh(ShippedFile(), Split(), &pool);
  std::vector<std::unique_ptr<NodeServer>> servers;
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) {
    NodeServerOptions o;
    o.listen = "127.0.0.1:0";
    o.max_calls_per_peer = 2 * kSessions;
    servers.push_back(std::make_unique<NodeServer>(&mesh.node(i), o));
    servers.back()->Start();
    addresses.push_back(servers.back()->bound_address());
  }
  ClientOptions co;
  co.info_timeout_s = 20.0;
  co.connect_timeout_s = 5.0;
  co.timeout_s = 60.0;
  co.pipeline_depth = pipeline_depth;
  auto provider = MakeRemoteRouteProvider(addresses, co);
  EXPECT_EQ(provider->carrier() != nullptr, pipeline_depth == 1);
  const auto got = Concurrent(mesh, *provider);
  for (int i = 0; i < kSessions; ++i) EXPECT_EQ(got[i], solo[i]) << "session " << i;
  ExpectBatched(mesh);
  for (int i = 0; i < 3; ++i) {  // decode steps went in group calls
    EXPECT_GT(servers[i]->counters().grouped_calls.load(), 0) << "node " << i;
  }
}

TEST(BatchedRoute, GrpcNodesSessionsEqualTheirSoloRuns) { GrpcNodesEqualSolo(0); }

TEST(BatchedRoute, CarriedCohortOverGrpcNodesEqualsTheSoloRuns) { GrpcNodesEqualSolo(1); }

}  // namespace
}  // namespace meshnet::rpc
