// Drain with verified KV migration, multi-process: `meshnet serve` children on
// 127.0.0.1 (port 0), a route with two replicas of the middle range, sessions
// driven by mesh::Generate in this process. A drained replica hands its
// sessions' KV to the other one; each session continues there without a
// re-prefill and with the output of the in-process run. Every child is killed
// and reaped in teardown; every wait is bounded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "gguf/gguf_reader.h"
#include "mesh/generator.h"
#include "mesh/in_process.h"
#include "rpc/drain.h"
#include "rpc/fake_replica_test_util.h"
#include "rpc/remote.h"
#include "rpc/test_util.h"
#include "tests/rpc/cli_run.h"
#include "tests/rpc/node_process.h"
#include "tests/rpc/session_gate.h"
#include "util/error.h"

namespace meshnet::rpc {
namespace {

using testing::NodeProcess;

const std::string kModel = MESHNET_SHIPPED_MODEL;
const std::string kAdmin = "admin-secret";  // every node's --admin-token
constexpr int kMaxTokens = 48;
constexpr int kPauseAt = 6;  // sessions pause after this many tokens while a node drains

std::vector<int32_t> Prompt(int variant) {
  std::vector<int32_t> p = {1, 403, 407, 261, 378, 429};
  p.push_back(static_cast<int32_t>(10 + 7 * variant));
  return p;
}

mesh::GenerateOptions Options() {
  mesh::GenerateOptions o;
  o.max_tokens = kMaxTokens;
  o.max_recoveries = 20;
  o.backoff_initial_s = 0.01;
  o.backoff_max_s = 0.1;
  return o;
}

std::vector<int32_t> Reference(const std::vector<int32_t>& prompt,
                               KvDtype kv_dtype = KvDtype::kF16) {
  static auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(kModel));
  mesh::InProcessMeshOptions mo;
  mo.split = {{0, 1}, {2, 3}, {4, 4}};
  mo.kv_dtype = kv_dtype;
  mesh::InProcessMesh mesh(file, mo, nullptr);
  mesh::FixedRouteProvider p(mesh.route());
  return mesh::Generate(p, prompt, Options()).generated_ids;
}

// head -> mid -> tail over fixed endpoints; `mid` is one of two replicas.
// Once a replica is marked dead the other one serves. EndpointFor knows both
// replicas (as a provider listing every node does).
class ReplicaProvider final : public mesh::RouteProvider {
 public:
  ReplicaProvider(std::vector<std::shared_ptr<RemoteEndpoint>> hops, int mid)
      : hops_(std::move(hops)), mid_(mid) {}
  mesh::Route Plan() override {
    std::lock_guard<std::mutex> lock(mu_);
    return {{hops_[0], hops_[1 + mid_], hops_[3]}};
  }
  void MarkDead(const mesh::ShardEndpoint& e) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (&e == hops_[1 + mid_].get()) mid_ = 1 - mid_;
  }
  std::shared_ptr<mesh::ShardEndpoint> EndpointFor(const std::string& address) override {
    for (const auto& h : hops_) {
      if (h->name() == address) return h;
    }
    return nullptr;
  }

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<RemoteEndpoint>> hops_;  // head, mid0, mid1, tail
  int mid_;
};

using Gate = testing::SessionGate;  // holds sessions at kPauseAt tokens

class DrainProcessTest : public ::testing::Test {
 protected:
  std::unique_ptr<NodeProcess> Start(const std::string& layers, std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "--model",          kModel,        "--layers",       layers,
        "--threads",        "1",           "--max-sessions", "32",
        "--metrics-listen", "127.0.0.1:0", "--grace",        "60",
        "--admin-token",    kAdmin,        "--kv-dtype",     std::string(KvDtypeName(kv_dtype_))};
    args.insert(args.end(), extra.begin(), extra.end());
    const std::string log = dir_.file("node-" + std::to_string(++started_) + ".log");
    return std::make_unique<NodeProcess>(MESHNET_BINARY, args, log, /*expect_metrics=*/true);
  }
  static ClientOptions Client() {
    ClientOptions co;
    co.info_timeout_s = 5.0;
    co.timeout_s = 60.0;
    return co;
  }
  static double Metric(const NodeProcess& n, const std::string& series) {
    return testing::MetricValue(testing::HttpGet(n.metrics_address(), "/metrics"), series);
  }
  // Starts head, replica 0, replica 1 (replica 0 drains to replica 1 on
  // SIGTERM) and tail.
  // `replica_extra`: flags of the replica the drain moves sessions to.
  void StartMesh(const std::vector<std::string>& drain_extra = {},
                 const std::vector<std::string>& replica_extra = {}) {
    head_ = Start("0-1", {});
    tail_ = Start("4-4", {});
    mid1_ = Start("2-3", replica_extra);
    std::vector<std::string> extra = {"--drain-to", mid1_->address()};
    extra.insert(extra.end(), drain_extra.begin(), drain_extra.end());
    mid0_ = Start("2-3", extra);
    for (NodeProcess* n : {head_.get(), mid0_.get(), mid1_.get(), tail_.get()}) {
      hops_.push_back(std::make_shared<RemoteEndpoint>(n->address(), Client()));
    }
  }

  // Waits (bounded) until replica 0 has moved or ended `n` sessions, or is
  // gone (it exits once every moved session's client was told).
  void WaitDrained(int n) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < until) {
      const std::string m = testing::HttpGet(mid0_->metrics_address(), "/metrics");
      if (m.empty()) return;
      if (testing::MetricValue(m, "meshnet_sessions_moved_total") +
              testing::MetricValue(m, "meshnet_sessions_ended_total") >=
          n) {
        return;
      }
      // A metrics poll: the drain runs in another process, nothing to wait on.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "the drain did not finish\n" << mid0_->Log();
  }

  // Runs `n` sessions (session i on replica i % 2), drains replica 0 by
  // SIGTERM once all are paused mid-generation, then lets them finish.
  std::vector<mesh::GenerateResult> RunAndDrain(int n, int* drain_status) {
    Gate gate(n);
    std::vector<std::future<mesh::GenerateResult>> runs;
    for (int i = 0; i < n; ++i) {
      runs.push_back(std::async(std::launch::async, [this, i, &gate] {
        ReplicaProvider provider(hops_, i % 2);
        int seen = 0;
        mesh::GenerateEvents ev;
        ev.on_token = [&](int32_t) {
          if (++seen == kPauseAt) gate.Arrive();
        };
        return mesh::Generate(provider, Prompt(i), Options(), ev);
      }));
    }
    EXPECT_TRUE(gate.AllArrived());
    prefill_before_[0] = Metric(*mid1_, "meshnet_prefill_tokens_total");
    prefill_before_[1] = Metric(*head_, "meshnet_prefill_tokens_total");
    std::thread stopper([&] { *drain_status = mid0_->Stop(SIGTERM, 120); });
    // The drained node keeps answering until each moved session was told.
    WaitDrained((n + 1) / 2);
    gate.Open();
    std::vector<mesh::GenerateResult> out;
    for (auto& r : runs) out.push_back(r.get());
    stopper.join();
    return out;
  }

  testing::ScratchDir dir_;
  KvDtype kv_dtype_ = KvDtype::kF16;  // every node's
  int started_ = 0;
  std::unique_ptr<NodeProcess> head_, mid0_, mid1_, tail_;
  std::vector<std::shared_ptr<RemoteEndpoint>> hops_;
  double prefill_before_[2] = {0, 0};
};

// The replica takes the KV over its transfer port (the default), or with
// --kv-transfer-port -1 over the gRPC stream: the same outcome either way;
// and so with every node's KV in q8_0 (over gRPC) or q4_0 (over the port):
// their blocks move as they are, and the output is the in-process run's with
// that dtype.
struct DrainCase {
  bool over_grpc;
  KvDtype kv_dtype;
};
class DrainPathTest : public DrainProcessTest, public ::testing::WithParamInterface<DrainCase> {};

TEST_P(DrainPathTest, DrainedReplicaHandsSixteenSessionsOverWithoutRePrefill) {
  const bool over_grpc = GetParam().over_grpc;
  kv_dtype_ = GetParam().kv_dtype;
  StartMesh({}, over_grpc ? std::vector<std::string>{"--kv-transfer-port", "-1"}
                          : std::vector<std::string>{});
  int status = -1;
  const std::vector<mesh::GenerateResult> results = RunAndDrain(16, &status);
  int moved = 0;
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(results[i].generated_ids, Reference(Prompt(i), kv_dtype_)) << "session " << i;
    EXPECT_EQ(results[i].re_prefills, 0) << "session " << i;
    EXPECT_EQ(results[i].failovers, 0) << "session " << i;
    EXPECT_EQ(results[i].moves, i % 2 == 0 ? 1 : 0) << "session " << i;
    moved += results[i].moves;
  }
  EXPECT_EQ(moved, 8);
  ASSERT_TRUE(WIFEXITED(status)) << mid0_->Log();
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // No re-prefill anywhere: the replica and the head ran no prefill positions
  // after the drain began.
  EXPECT_EQ(Metric(*mid1_, "meshnet_prefill_tokens_total"), prefill_before_[0]);
  EXPECT_EQ(Metric(*head_, "meshnet_prefill_tokens_total"), prefill_before_[1]);
  // The moved KV was checksum-verified by the importer.
  EXPECT_EQ(Metric(*mid1_, "meshnet_sessions_imported_total"), 8);
  EXPECT_GE(Metric(*mid1_, "meshnet_import_chunks_verified_total"), 8);
  EXPECT_GT(Metric(*mid1_, "meshnet_import_bytes_total"), 0);
  EXPECT_EQ(Metric(*mid1_, "meshnet_imports_rejected_total"), 0);
  EXPECT_EQ(Metric(*mid1_, "meshnet_kv_transfers_total"), over_grpc ? 0 : 8);
}

INSTANTIATE_TEST_SUITE_P(Paths, DrainPathTest,
                         ::testing::Values(DrainCase{false, KvDtype::kF16},
                                           DrainCase{true, KvDtype::kF16},
                                           DrainCase{true, KvDtype::kQ8_0},
                                           DrainCase{false, KvDtype::kQ4_0}),
                         [](const auto& info) {
                           std::string name = info.param.over_grpc ? "Grpc" : "TransferPort";
                           if (info.param.kv_dtype == KvDtype::kQ8_0) name += "Q8_0";
                           if (info.param.kv_dtype == KvDtype::kQ4_0) name += "Q4_0";
                           return name;
                         });

TEST_F(DrainProcessTest, CorruptedTransferIsRejectedAndTheSessionRePrefills) {
  // The drained node flips one byte of its first export in flight.
  setenv("MESHNET_TEST_CORRUPT_EXPORT", "0", 1);
  StartMesh();
  unsetenv("MESHNET_TEST_CORRUPT_EXPORT");
  int status = -1;
  const std::vector<mesh::GenerateResult> results = RunAndDrain(4, &status);
  int moved = 0, recovered = 0;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(results[i].generated_ids, Reference(Prompt(i))) << "session " << i;
    moved += results[i].moves;
    recovered += results[i].re_prefills + results[i].failovers > 0 ? 1 : 0;
  }
  EXPECT_EQ(moved, 1) << "the other session on the drained replica moved";
  EXPECT_EQ(recovered, 1) << "the corrupted one re-prefilled elsewhere";
  EXPECT_EQ(Metric(*mid1_, "meshnet_imports_rejected_total"), 1);
  EXPECT_EQ(Metric(*mid1_, "meshnet_sessions_imported_total"), 1);
  EXPECT_EQ(Metric(*mid1_, "meshnet_kv_transfers_total"), 1) << "over the transfer port";
  ASSERT_TRUE(WIFEXITED(status)) << mid0_->Log();
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST_F(DrainProcessTest, AdminDrainWithoutReplicaEndsSessionsAndClientsRePrefillElsewhere) {
  StartMesh();
  Gate gate(2);
  std::vector<std::future<mesh::GenerateResult>> runs;
  for (int i = 0; i < 2; ++i) {
    runs.push_back(std::async(std::launch::async, [this, i, &gate] {
      ReplicaProvider provider(hops_, 0);
      int seen = 0;
      mesh::GenerateEvents ev;
      ev.on_token = [&](int32_t) {
        if (++seen == kPauseAt) gate.Arrive();
      };
      return mesh::Generate(provider, Prompt(i), Options(), ev);
    }));
  }
  ASSERT_TRUE(gate.AllArrived());
  const DrainReport r = RequestDrain(mid0_->address(), {}, Client(), kAdmin);
  gate.Open();
  EXPECT_EQ(r.sessions, 2);
  EXPECT_EQ(r.ended, 2);
  EXPECT_EQ(r.moved, 0);
  for (int i = 0; i < 2; ++i) {
    const mesh::GenerateResult got = runs[i].get();
    EXPECT_EQ(got.generated_ids, Reference(Prompt(i)));
    EXPECT_GE(got.re_prefills + got.failovers, 1);
    EXPECT_THAT(got.final_route, ::testing::HasSubstr(mid1_->address()));
  }
  // A draining node takes no new session.
  ReplicaProvider provider(hops_, 0);
  const auto got = mesh::Generate(provider, Prompt(5), Options());
  EXPECT_EQ(got.failovers, 1);
  EXPECT_EQ(Metric(*mid0_, "meshnet_draining"), 1);
}

// A node stopped (SIGSTOP) while its session's client waits: the client's
// step times out, it fails over to the other replica and finishes with the
// in-process text while the node is still stopped (its release there times
// out: the client's exit does not wait for the node); once the node resumes,
// it notices it was stopped and ends the sessions not stepped again within
// its active window (2 s here), instead of keeping them until the TTL (600 s).
TEST_F(DrainProcessTest, AStoppedNodeDropsTheSessionsItsClientsGaveUp) {
  StartMesh({"--active-window", "2"});
  ClientOptions quick = Client();
  quick.timeout_s = 2.0;
  quick.step_retries = 0;
  std::vector<std::shared_ptr<RemoteEndpoint>> hops;
  for (NodeProcess* n : {head_.get(), mid0_.get(), mid1_.get(), tail_.get()}) {
    hops.push_back(std::make_shared<RemoteEndpoint>(n->address(), quick));
  }
  Gate gate(1);
  auto run = std::async(std::launch::async, [&] {
    ReplicaProvider provider(hops, 0);
    int seen = 0;
    mesh::GenerateEvents ev;
    ev.on_token = [&](int32_t) {
      if (++seen == kPauseAt) gate.Arrive();
    };
    return mesh::Generate(provider, Prompt(3), Options(), ev);
  });
  ASSERT_TRUE(gate.AllArrived());
  EXPECT_EQ(Metric(*mid0_, "meshnet_kv_live_sessions"), 1);
  ASSERT_EQ(kill(mid0_->pid(), SIGSTOP), 0);
  const auto stopped = std::chrono::steady_clock::now();
  gate.Open();
  const mesh::GenerateResult got = run.get();  // returns while the node is stopped
  // Stopped long enough to count as a stall (over 10 s), whatever the run took.
  const auto stall_end = stopped + std::chrono::seconds(12);
  if (std::chrono::steady_clock::now() < stall_end) std::this_thread::sleep_until(stall_end);
  kill(mid0_->pid(), SIGCONT);
  EXPECT_EQ(got.generated_ids, Reference(Prompt(3)));
  EXPECT_GE(got.failovers, 1);
  EXPECT_THAT(got.final_route, ::testing::HasSubstr(mid1_->address()));
  double live = -1;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < until) {
    live = Metric(*mid0_, "meshnet_kv_live_sessions");
    if (live == 0) break;
    // A metrics poll: the resumed node works in another process.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(live, 0) << "the resumed node still holds the abandoned session\n" << mid0_->Log();
  EXPECT_NE(mid0_->Log().find("event=node_was_stopped"), std::string::npos);
}

// Issue 32, HIGH 1 at the command's level: `meshnet admin drain --to` a host
// that passes for a replica (it relays a real replica's Info and signed
// Prove) sends it no session and never the cluster token; the sessions end
// instead. The cluster token is no operator credential, and undrain reopens
// the node.
TEST_F(DrainProcessTest, AdminDrainToAFakeReplicaSendsItNothing) {
  const std::string token = "cluster-token-of-this-test-0123456789";
  auto src = Start("0-4", {"--auth-token", token});
  auto real = Start("0-4", {"--auth-token", token});
  testing::FakeReplica fake(real->address(), token);
  ClientOptions co = Client();
  co.auth_token = token;
  RemoteEndpoint ep(src->address(), co);
  auto open_sessions = [&] {
    for (int i = 0; i < 2; ++i) {
      mesh::StepRequest r;
      r.session_id = "0123456789abcdef0123456789abcde" + std::to_string(i);
      r.session_secret = "secret";
      r.prefill = true;
      r.token_ids = Prompt(i);
      ep.Step(r);
    }
  };
  open_sessions();
  ASSERT_EQ(Metric(*src, "meshnet_kv_live_sessions"), 2);
  auto admin = [&](const std::string& verb, const std::string& credential,
                   const std::string& to = "") {
    std::vector<std::string> args = {"admin", verb, src->address(), "--admin-token", credential};
    if (verb == "drain") args.insert(args.end(), {"--to", to.empty() ? fake.address() : to});
    return testing::RunCli(MESHNET_BINARY, args, 60);
  };
  const testing::CliResult denied = admin("drain", token);
  EXPECT_NE(denied.exit_code, 0) << "the cluster token drained the node";
  EXPECT_EQ(Metric(*src, "meshnet_draining"), 0);
  EXPECT_EQ(Metric(*src, "meshnet_kv_live_sessions"), 2);

  const testing::CliResult drained = admin("drain", kAdmin);
  EXPECT_EQ(drained.exit_code, 0) << drained.out << drained.err;
  const std::vector<std::string> calls = fake.calls();
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "OfferImport") +
                std::count(calls.begin(), calls.end(), "ImportSession"),
            0);
  EXPECT_EQ(fake.chunks(), 0);
  EXPECT_FALSE(fake.saw_token()) << "the cluster token was sent to an unproven host";
  EXPECT_EQ(Metric(*real, "meshnet_sessions_imported_total"), 0);
  EXPECT_EQ(Metric(*src, "meshnet_kv_live_sessions"), 0);
  EXPECT_EQ(Metric(*src, "meshnet_draining"), 1);

  const testing::CliResult reopened = admin("undrain", kAdmin);
  EXPECT_EQ(reopened.exit_code, 0) << reopened.out << reopened.err;
  EXPECT_EQ(Metric(*src, "meshnet_draining"), 0);

  // The same sessions again, drained to the fake and the real replica: they
  // all go to the real one (this setup does move sessions), none to the fake.
  open_sessions();
  const testing::CliResult moved = admin("drain", kAdmin, fake.address() + "," + real->address());
  EXPECT_EQ(moved.exit_code, 0) << moved.out << moved.err;
  EXPECT_EQ(Metric(*real, "meshnet_sessions_imported_total"), 2);
  EXPECT_EQ(fake.chunks(), 0);
  EXPECT_FALSE(fake.saw_token());
}

// A client follows "moved to" only to a node it was given: a node cannot
// redirect a session (and its secret) to an arbitrary address.
TEST(RemoteRouteProviderMoves, OnlyListedNodesAreFollowed) {
  auto provider = MakeRemoteRouteProvider({"127.0.0.1:1", "127.0.0.1:2"}, ClientOptions{});
  const auto listed = provider->EndpointFor("127.0.0.1:2");
  ASSERT_NE(listed, nullptr);
  EXPECT_EQ(listed->name(), "127.0.0.1:2");
  EXPECT_EQ(provider->EndpointFor("10.1.2.3:7000"), nullptr);
  EXPECT_EQ(provider->EndpointFor(""), nullptr);
}

}  // namespace
}  // namespace meshnet::rpc
