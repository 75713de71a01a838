// Multi-process registry tests: `meshnet serve --registry ...` children on
// 127.0.0.1 announce themselves to a `meshnet registry` child (or to a real
// etcd), and a client that knows only the registry plans routes by the model's
// identity. Compared token for token with the in-process route. Every child is
// killed and reaped in teardown; every wait is bounded.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "gguf/gguf_reader.h"
#include "mesh/generator.h"
#include "mesh/in_process.h"
#include "node/identity.h"
#include "registry/etcd_test_util.h"
#include "rpc/drain.h"
#include "rpc/registry_client.h"
#include "rpc/registry_route.h"
#include "rpc/test_util.h"
#include "tests/rpc/cli_run.h"
#include "tests/rpc/node_process.h"
#include "tests/rpc/session_gate.h"
#include "util/error.h"

namespace meshnet::rpc {
namespace {

using registry::testing::EtcdServer;
using testing::NodeProcess;

const std::string kModel = MESHNET_SHIPPED_MODEL;
const std::string kAdmin = "admin-secret";                          // every node's --admin-token
constexpr double kTtl = 2.0;                                        // --lease-ttl of the nodes
const char* const kLayers[] = {"0-0", "1-1", "2-3", "2-3", "4-4"};  // two replicas of 2-3

std::shared_ptr<const gguf::GgufFile> File() {
  static auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(kModel));
  return file;
}

std::vector<int32_t> Prompt(int variant) {
  return {1, 403, 407, 261, 378, 429, static_cast<int32_t>(10 + 7 * variant)};
}

mesh::GenerateOptions Options(int max_tokens) {
  mesh::GenerateOptions o;
  o.max_tokens = max_tokens;
  o.max_recoveries = 100;
  o.backoff_initial_s = 0.01;
  o.backoff_max_s = 0.1;
  return o;
}

std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_tokens) {
  mesh::InProcessMeshOptions mo;
  mo.split = {{0, 0}, {1, 1}, {2, 3}, {4, 4}};
  mesh::InProcessMesh mesh(File(), mo, nullptr);
  mesh::FixedRouteProvider p(mesh.route());
  return mesh::Generate(p, prompt, Options(max_tokens)).generated_ids;
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// GetParam(): true = etcd backend, false = `meshnet registry`.
class RegistryMeshTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) {
      etcd_ = std::make_unique<EtcdServer>();
      MESHNET_REQUIRE_ETCD(*etcd_);
      spec_ = etcd_->url("/mesh");
    } else {
      registry_ = std::make_unique<NodeProcess>(
          MESHNET_BINARY, std::vector<std::string>{"--listen", "127.0.0.1:0"},
          dir_.file("registry.log"), false, 30, "registry", "registry on ");
      spec_ = registry_->address();
    }
    ClientOptions co = Client();
    reg_ = OpenRegistry(spec_, co);
    for (const char* layers : kLayers) nodes_.push_back(Start(layers));
    ASSERT_TRUE(WaitForNodes(5, 30)) << "the five nodes did not register";
  }

  std::unique_ptr<NodeProcess> Start(const std::string& layers) {
    const std::vector<std::string> args = {
        "--model",          kModel,        "--layers",   layers, "--listen",       "127.0.0.1:0",
        "--threads",        "1",           "--registry", spec_,  "--lease-ttl",    "2",
        "--metrics-listen", "127.0.0.1:0", "--grace",    "60",   "--max-sessions", "32",
        "--admin-token",    kAdmin};
    return std::make_unique<NodeProcess>(MESHNET_BINARY, args,
                                         dir_.file("node-" + std::to_string(++started_) + ".log"),
                                         /*expect_metrics=*/true);
  }

  static ClientOptions Client() {
    ClientOptions co;
    co.info_timeout_s = 5.0;
    co.connect_timeout_s = 2.0;
    co.timeout_s = 30.0;
    co.expected_model_id = node::ModelIdentity(*File());
    return co;
  }

  std::shared_ptr<RegistryRouteProvider> Provider() {
    return std::make_shared<RegistryRouteProvider>(
        std::shared_ptr<registry::Registry>(OpenRegistry(spec_, Client())),
        node::ModelIdentity(*File()), Client());
  }

  // Waits on the registry's watch (bounded) until `n` nodes are listed.
  bool WaitForNodes(size_t n, double timeout_s) {
    const auto t0 = std::chrono::steady_clock::now();
    while (Since(t0) < timeout_s) {
      int64_t rev = 0;
      try {
        const registry::Snapshot s = reg_->List();
        if (s.nodes.size() == n) return true;
        rev = s.revision;
      } catch (const Error&) {  // etcd restarting: ask again after a bounded wait
      }
      try {
        reg_->WaitForChange(rev, 0.5);
      } catch (const Error&) {
      }
    }
    return false;
  }

  bool Listed(const std::string& address) {
    for (const auto& r : reg_->List().nodes) {
      if (r.address == address) return true;
    }
    return false;
  }

  static double Metric(const NodeProcess& n, const std::string& series) {
    return testing::MetricValue(testing::HttpGet(n.metrics_address(), "/metrics"), series);
  }

  // The registry's record of `address` (nullopt when not listed).
  std::optional<registry::NodeRecord> Record(const std::string& address) {
    for (const auto& r : reg_->List().nodes) {
      if (r.address == address) return r;
    }
    return std::nullopt;
  }

  // Waits (bounded) until `n` has moved or ended `count` sessions, or is gone
  // (it exits once every moved session's client was told).
  static bool WaitDrained(const NodeProcess& n, int64_t count) {
    const auto t0 = std::chrono::steady_clock::now();
    while (Since(t0) < 60) {
      const std::string m = testing::HttpGet(n.metrics_address(), "/metrics");
      if (m.empty()) return true;
      if (testing::MetricValue(m, "meshnet_sessions_moved_total") +
              testing::MetricValue(m, "meshnet_sessions_ended_total") >=
          static_cast<double>(count)) {
        return true;
      }
      // A metrics poll: the drain runs in another process, nothing to wait on.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  void DrainAReplicaMidGeneration(bool by_signal);

  // After a drain of nodes_[2]: no node but it ran a prefill since
  // `prefill_before`, and `replica` imported `moved` sessions, all verified.
  void ExpectNoPrefillAndVerifiedImports(const std::vector<double>& prefill_before,
                                         const NodeProcess& replica, int64_t moved) {
    for (size_t k = 0; k < nodes_.size(); ++k) {
      if (k == 2) continue;
      EXPECT_EQ(Metric(*nodes_[k], "meshnet_prefill_tokens_total"), prefill_before[k])
          << "node " << k;
    }
    EXPECT_EQ(Metric(replica, "meshnet_sessions_imported_total"), moved);
    EXPECT_GE(Metric(replica, "meshnet_import_chunks_verified_total"), moved);
    EXPECT_EQ(Metric(replica, "meshnet_imports_rejected_total"), 0);
    // Plain TCP nodes: every session's KV came over the replica's transfer port.
    EXPECT_EQ(Metric(replica, "meshnet_kv_transfers_total"), moved);
  }

  void TearDown() override {
    for (auto& n : nodes_) {
      if (HasFailure() && n && n->running()) std::cerr << n->Log();
    }
  }

  testing::ScratchDir dir_;
  std::unique_ptr<EtcdServer> etcd_;
  std::unique_ptr<NodeProcess> registry_;
  std::string spec_;
  std::unique_ptr<registry::Registry> reg_;
  std::vector<std::unique_ptr<NodeProcess>> nodes_;
  int started_ = 0;
};

TEST_P(RegistryMeshTest, AClientKnowingOnlyTheRegistryGeneratesTheInProcessText) {
  auto provider = Provider();
  const auto got = mesh::Generate(*provider, Prompt(0), Options(24));
  EXPECT_EQ(got.generated_ids, Reference(Prompt(0), 24));
  EXPECT_EQ(got.failovers, 0);
  const std::string metrics = provider->MetricsText();
  for (const auto& n : nodes_) {
    EXPECT_NE(metrics.find("meshnet_route_node_cost{node=\"" + n->address() + "\"}"),
              std::string::npos)
        << metrics;
  }
  // Four hops: 0-0, 1-1, one of the 2-3 replicas, 4-4.
  EXPECT_EQ(std::count(got.final_route.begin(), got.final_route.end(), '>'), 3) << got.final_route;
}

TEST_P(RegistryMeshTest, SixteenSessionsSpreadOverBothReplicas) {
  auto provider = Provider();
  std::vector<std::future<std::vector<int32_t>>> runs;
  for (int i = 0; i < 16; ++i) {
    runs.push_back(std::async(std::launch::async, [&, i] {
      return mesh::Generate(*provider, Prompt(i % 4), Options(8)).generated_ids;
    }));
  }
  std::vector<std::vector<int32_t>> want;
  for (int v = 0; v < 4; ++v) want.push_back(Reference(Prompt(v), 8));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(runs[i].get(), want[i % 4]) << "session " << i;
  const auto planned = provider->planned();
  auto sent = [&](const std::string& address) {
    const auto it = planned.find(address);
    return it == planned.end() ? int64_t{0} : it->second;
  };
  const int64_t a = sent(nodes_[2]->address());
  const int64_t b = sent(nodes_[3]->address());
  EXPECT_EQ(a + b, 16);
  std::cout << "sessions per replica of 2-3: " << a << " / " << b << "\n";
  EXPECT_GE(a, 5) << "replica " << nodes_[2]->address() << " got " << a << " of 16";
  EXPECT_GE(b, 5) << "replica " << nodes_[3]->address() << " got " << b << " of 16";
}

TEST_P(RegistryMeshTest, AKilledNodeDisappearsWithinTheTtlAndSessionsFailOver) {
  auto provider = Provider();
  constexpr int kTokens = 40;
  std::promise<void> halfway;
  std::promise<void> killed;
  std::shared_future<void> killed_f = killed.get_future().share();
  std::atomic<int> seen{0};
  mesh::GenerateEvents events;
  events.on_token = [&](int32_t) {
    if (++seen != 5) return;
    halfway.set_value();
    killed_f.wait();  // the session pauses mid-generation until its node is gone
  };
  auto run = std::async(std::launch::async, [&] {
    return mesh::Generate(*provider, Prompt(1), Options(kTokens), events);
  });
  ASSERT_EQ(halfway.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  // The session's replica of 2-3 is the one it planned first.
  const auto planned = provider->planned();
  const auto used = planned.find(nodes_[2]->address());
  NodeProcess& victim = used != planned.end() && used->second > 0 ? *nodes_[2] : *nodes_[3];
  NodeProcess& survivor = &victim == nodes_[2].get() ? *nodes_[3] : *nodes_[2];
  const std::string gone = victim.address();
  const auto t0 = std::chrono::steady_clock::now();
  victim.Stop(SIGKILL);
  killed.set_value();
  // Watched while the session fails over: when does the registry drop it?
  auto dropped_after =
      std::async(std::launch::async, [&] { return WaitForNodes(4, kTtl + 10) ? Since(t0) : -1.0; });
  const mesh::GenerateResult got = run.get();
  EXPECT_EQ(got.generated_ids, Reference(Prompt(1), kTokens));
  EXPECT_GE(got.failovers, 1);
  EXPECT_NE(got.final_route.find(survivor.address()), std::string::npos) << got.final_route;

  const double dropped = dropped_after.get();
  ASSERT_GE(dropped, 0) << "the killed node is still registered";
  std::cout << "killed node unlisted after " << dropped << " s (lease TTL " << kTtl << " s)\n";
  EXPECT_FALSE(Listed(gone));
  EXPECT_LE(dropped, kTtl + 1.5) << "the registry dropped the node after " << dropped << " s";
  // A new session (a new client) avoids it.
  auto fresh = Provider();
  const auto next = mesh::Generate(*fresh, Prompt(2), Options(8));
  EXPECT_EQ(next.failovers, 0);
  EXPECT_EQ(next.final_route.find(gone), std::string::npos) << next.final_route;
  EXPECT_EQ(next.generated_ids, Reference(Prompt(2), 8));
}

TEST_P(RegistryMeshTest, TheClientKeepsItsViewWhileTheRegistryIsDown) {
  auto provider = Provider();
  const auto first = mesh::Generate(*provider, Prompt(3), Options(8));
  if (GetParam()) {
    // etcd restarts during a generation: the session is unaffected, the nodes
    // stay registered (leases survive; a lost one is announced again).
    std::promise<void> started;
    std::promise<void> restarted;
    std::shared_future<void> restarted_f = restarted.get_future().share();
    std::atomic<int> seen{0};
    mesh::GenerateEvents events;
    events.on_token = [&](int32_t) {
      if (++seen != 3) return;
      started.set_value();
      restarted_f.wait();  // mid-generation while etcd restarts
    };
    auto run = std::async(std::launch::async, [&] {
      return mesh::Generate(*provider, Prompt(0), Options(48), events);
    });
    ASSERT_EQ(started.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
    etcd_->Restart();
    restarted.set_value();
    EXPECT_EQ(run.get().generated_ids, Reference(Prompt(0), 48));
    ASSERT_TRUE(WaitForNodes(5, 20)) << "nodes lost after the etcd restart";
    etcd_->Kill();
  } else {
    registry_->Stop(SIGKILL);
  }
  // The registry is down now: plans use the cached view.
  const auto cached = mesh::Generate(*provider, Prompt(3), Options(8));
  EXPECT_TRUE(provider->used_cache());
  EXPECT_EQ(cached.generated_ids, first.generated_ids);
}

// Sixteen sessions spread over the two replicas of 2-3; replica nodes_[2] is
// drained mid-generation (`meshnet admin drain` naming no target, or SIGTERM)
// and finds the other replica in the registry: every session finishes with
// the in-process text, no prefill ran anywhere after the drain began, and the
// replica verified every moved session's checksums.
void RegistryMeshTest::DrainAReplicaMidGeneration(bool by_signal) {
  constexpr int kSessions = 16;
  constexpr int kTokens = 40;
  constexpr int kPauseAt = 6;
  auto provider = Provider();
  testing::SessionGate gate(kSessions);
  std::vector<std::future<mesh::GenerateResult>> runs;
  for (int i = 0; i < kSessions; ++i) {
    runs.push_back(std::async(std::launch::async, [&, i] {
      int seen = 0;
      mesh::GenerateEvents ev;
      ev.on_token = [&](int32_t) {
        if (++seen == kPauseAt) gate.Arrive();
      };
      return mesh::Generate(*provider, Prompt(i % 4), Options(kTokens), ev);
    }));
  }
  ASSERT_TRUE(gate.AllArrived());
  NodeProcess& drained = *nodes_[2];
  NodeProcess& replica = *nodes_[3];
  const auto planned = provider->planned();
  const int64_t on_drained = planned.count(drained.address()) ? planned.at(drained.address()) : 0;
  const int64_t on_replica = planned.count(replica.address()) ? planned.at(replica.address()) : 0;
  std::cout << "sessions per replica of 2-3: " << on_drained << " / " << on_replica << "\n";
  EXPECT_EQ(on_drained + on_replica, kSessions);
  EXPECT_GE(on_drained, 5);
  EXPECT_GE(on_replica, 5);
  std::vector<double> prefill_before;
  for (const auto& n : nodes_) prefill_before.push_back(Metric(*n, "meshnet_prefill_tokens_total"));

  std::thread stopper;
  int status = -1;
  if (by_signal) {
    stopper = std::thread([&] { status = drained.Stop(SIGTERM, 120); });
    EXPECT_TRUE(WaitDrained(drained, on_drained)) << drained.Log();
  } else {
    const DrainReport r = RequestDrain(drained.address(), {}, Client(), kAdmin);
    std::string notes;
    for (const auto& n : r.notes) notes += n + "\n";
    EXPECT_EQ(r.sessions, on_drained);
    EXPECT_EQ(r.moved, on_drained) << notes << drained.Log();
    EXPECT_EQ(r.ended, 0);
    // The registry shows the drain, and planners leave the node out.
    const auto rec = Record(drained.address());
    ASSERT_TRUE(rec.has_value());
    EXPECT_TRUE(rec->draining);
  }
  gate.Open();
  int64_t moves = 0;
  for (int i = 0; i < kSessions; ++i) {
    const mesh::GenerateResult got = runs[i].get();
    EXPECT_EQ(got.generated_ids, Reference(Prompt(i % 4), kTokens)) << "session " << i;
    EXPECT_EQ(got.re_prefills, 0) << "session " << i;
    EXPECT_EQ(got.failovers, 0) << "session " << i;
    moves += got.moves;
  }
  EXPECT_EQ(moves, on_drained);
  if (stopper.joinable()) stopper.join();
  if (by_signal) {
    ASSERT_TRUE(WIFEXITED(status)) << drained.Log();
    EXPECT_EQ(WEXITSTATUS(status), 0);
    EXPECT_FALSE(Listed(drained.address())) << "a drained node withdraws its record";
  }
  ExpectNoPrefillAndVerifiedImports(prefill_before, replica, on_drained);
}

TEST_P(RegistryMeshTest, AdminDrainMovesSessionsToAReplicaFoundInTheRegistry) {
  DrainAReplicaMidGeneration(/*by_signal=*/false);
}

TEST_P(RegistryMeshTest, SigtermDrainMovesSessionsToAReplicaFoundInTheRegistry) {
  DrainAReplicaMidGeneration(/*by_signal=*/true);
}

// `meshnet status --registry`: every node with its range and state, and the
// routes that can serve the model (two: one per replica of 2-3), as text and
// as JSON; a drained replica shows as draining and leaves one route.
TEST_P(RegistryMeshTest, StatusListsNodesRangesAndRoutesAndShowsADrain) {
  auto status = [&](const std::string& output) {
    const testing::CliResult r =
        testing::RunCli(MESHNET_BINARY, {"status", "--registry", spec_, "--output", output}, 30);
    EXPECT_FALSE(r.timed_out);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out;
  };
  const std::string text = status("text");
  for (size_t k = 0; k < nodes_.size(); ++k) {
    EXPECT_NE(text.find(nodes_[k]->address() + " "), std::string::npos) << text;
  }
  EXPECT_NE(text.find("routes: 2\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("draining"), std::string::npos) << text;
  const nlohmann::json j = nlohmann::json::parse(status("json"));
  ASSERT_EQ(j["models"].size(), 1u) << j.dump();
  const nlohmann::json& m = j["models"][0];
  EXPECT_EQ(m["model_id"], node::ModelIdentity(*File()));
  ASSERT_EQ(m["nodes"].size(), 5u);
  std::multiset<std::string> ranges;
  for (const auto& n : m["nodes"]) {
    ranges.insert(std::to_string(n["start_layer"].get<int>()) + "-" +
                  std::to_string(n["end_layer"].get<int>()));
  }
  EXPECT_EQ(ranges, std::multiset<std::string>(std::begin(kLayers), std::end(kLayers)));
  EXPECT_EQ(m["route_count"], 2);
  for (const auto& route : m["routes"]) EXPECT_EQ(route.size(), 4u) << route.dump();

  const DrainReport r = RequestDrain(nodes_[2]->address(), {}, Client(), kAdmin);
  EXPECT_EQ(r.sessions, 0);
  const std::string after = status("text");
  const size_t at = after.find(nodes_[2]->address() + " ");
  ASSERT_NE(at, std::string::npos) << after;
  EXPECT_NE(after.substr(at, after.find('\n', at) - at).find("draining"), std::string::npos)
      << after;
  EXPECT_NE(after.find("routes: 1\n"), std::string::npos) << after;
}

INSTANTIATE_TEST_SUITE_P(Backends, RegistryMeshTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Etcd" : "Embedded";
                         });

}  // namespace
}  // namespace meshnet::rpc
