// The multi-session driver over three `meshnet serve` children on 127.0.0.1
// (port 0): 32 concurrent greedy sessions through one client process (one
// channel per node, shared) each equal their solo in-process run; two or more
// nodes have a step in progress at once; every session is released on every
// node when the run ends, also when it is cancelled. Children are killed and
// reaped in teardown; every wait is bounded.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>

#include "gguf/gguf_reader.h"
#include "mesh/generator.h"
#include "mesh/in_process.h"
#include "mesh/multi_session.h"
#include "mesh/test_util.h"
#include "rpc/remote.h"
#include "rpc/test_util.h"
#include "tests/rpc/node_process.h"

namespace meshnet::rpc {
namespace {

using testing::NodeProcess;

const std::string kModel = MESHNET_SHIPPED_MODEL;

std::vector<std::vector<int32_t>> Prompts(int n) {
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p = {1, 403, 407, 261, 378, 429};
    p.push_back(static_cast<int32_t>(10 + 7 * i));  // distinct per session
    out.push_back(p);
  }
  return out;
}

mesh::GenerateOptions Greedy(int max_tokens) {
  mesh::GenerateOptions o;
  o.max_tokens = max_tokens;
  o.backoff_initial_s = 0.01;
  return o;
}

// Solo runs on the same split in this process.
std::vector<std::vector<int32_t>> Solo(const std::vector<std::vector<int32_t>>& prompts,
                                       const mesh::GenerateOptions& o) {
  auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(kModel));
  mesh::InProcessMeshOptions mo;
  mo.split = {{0, 1}, {2, 3}, {4, 4}};
  mesh::InProcessMesh mesh(file, mo, nullptr);
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : prompts) {
    mesh::FixedRouteProvider provider(mesh.route());
    out.push_back(mesh::Generate(provider, p, o).generated_ids);
  }
  return out;
}

class MultiSessionProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* layers : {"0-1", "2-3", "4-4"}) {
      const std::vector<std::string> args = {"--model",        kModel,        "--layers",  layers,
                                             "--listen",       "127.0.0.1:0", "--threads", "1",
                                             "--max-sessions", "64"};
      const std::string log = dir_.file(std::string("node-") + layers + ".log");
      nodes_.push_back(std::make_unique<NodeProcess>(MESHNET_BINARY, args, log));
      addresses_.push_back(nodes_.back()->address());
    }
  }

  static ClientOptions Client() {
    ClientOptions co;
    co.info_timeout_s = 5.0;
    co.connect_timeout_s = 2.0;
    co.timeout_s = 60.0;
    return co;
  }

  int64_t LiveSessions() {
    int64_t n = 0;
    for (const auto& a : addresses_) n += RemoteEndpoint(a, Client()).Info().live_sessions;
    return n;
  }

  testing::ScratchDir dir_;
  std::vector<std::unique_ptr<NodeProcess>> nodes_;
  std::vector<std::string> addresses_;
};

TEST_F(MultiSessionProcessTest, ThirtyTwoSessionsOverThreeNodesEqualTheirSoloRuns) {
  const auto prompts = Prompts(32);
  const auto o = Greedy(24);
  const auto solo = Solo(prompts, o);
  auto provider = MakeRemoteRouteProvider(addresses_, Client());
  mesh::MultiSessionDriver driver(*provider, {});
  const mesh::MultiSessionReport r = driver.Run(prompts, o);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(r.sessions[i].ok) << i << ": " << r.sessions[i].error;
    EXPECT_EQ(r.sessions[i].result.generated_ids, solo[i]) << "session " << i;
    EXPECT_EQ(r.sessions[i].result.final_route,
              addresses_[0] + " -> " + addresses_[1] + " -> " + addresses_[2]);
  }
  EXPECT_EQ(LiveSessions(), 0) << "every session is released on every node";
}

TEST_F(MultiSessionProcessTest, NodesComputeAtTheSameTime) {
  // One endpoint (one channel) per node, shared by every session.
  mesh::Route route;
  for (const auto& a : addresses_)
    route.hops.push_back(std::make_shared<RemoteEndpoint>(a, Client()));
  mesh::testing::HopActivity activity(3);
  mesh::FixedRouteProvider provider(mesh::testing::Observed(route, &activity));
  mesh::MultiSessionDriver driver(provider, {});
  const mesh::MultiSessionReport r = driver.Run(Prompts(12), Greedy(24));
  EXPECT_EQ(r.failed(), 0);
  RecordProperty("max_busy_hops", activity.max_busy_hops());
  EXPECT_GE(activity.max_busy_hops(), 2) << "a serializing client keeps one node busy at a time";
  EXPECT_EQ(LiveSessions(), 0);
}

TEST_F(MultiSessionProcessTest, CancelledRunReleasesEverySessionOnEveryNode) {
  auto provider = MakeRemoteRouteProvider(addresses_, Client());
  std::atomic<int> tokens{0};
  mesh::GenerateOptions o = Greedy(200);
  o.cancelled = [&] { return tokens.load() >= 30; };
  mesh::MultiSessionEvents ev;
  ev.on_token = [&](int, int32_t) { ++tokens; };
  mesh::MultiSessionDriver driver(*provider, {.max_in_flight = 8});
  const mesh::MultiSessionReport r = driver.Run(Prompts(10), o, ev);
  EXPECT_EQ(r.failed(), 10);
  for (const auto& s : r.sessions) EXPECT_EQ(s.error, "cancelled");
  EXPECT_EQ(LiveSessions(), 0);
}

}  // namespace
}  // namespace meshnet::rpc
