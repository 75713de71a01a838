// Multi-process mesh tests: `meshnet serve` children on 127.0.0.1 (port 0),
// a client route over them in this process, compared token for token with the
// in-process run of the same split. Every child is killed and reaped in
// teardown; every wait is bounded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <map>
#include <memory>
#include <thread>

#include "gguf/gguf_reader.h"
#include "mesh/generator.h"
#include "mesh/in_process.h"
#include "node/identity.h"
#include "rpc/remote.h"
#include "rpc/test_util.h"
#include "tests/rpc/node_process.h"
#include "util/error.h"

namespace meshnet::rpc {
namespace {

using ::testing::HasSubstr;
using testing::NodeProcess;

const std::string kModel = MESHNET_SHIPPED_MODEL;

std::shared_ptr<const gguf::GgufFile> File() {
  static auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(kModel));
  return file;
}

std::vector<int32_t> Prompt(int variant) {
  std::vector<int32_t> p = {1, 403, 407, 261, 378, 429};
  p.push_back(static_cast<int32_t>(10 + 7 * variant));  // distinct per session
  return p;
}

mesh::GenerateOptions Options(int max_tokens, float temperature = 0.0f, uint64_t seed = 0) {
  mesh::GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampling.temperature = temperature;
  o.sampling.seed = seed;
  o.max_recoveries = 1000;
  o.backoff_initial_s = 0.01;
  o.backoff_max_s = 0.1;
  return o;
}

// The in-process reference: the same split, ample budget, no failures.
std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, const mesh::GenerateOptions& o) {
  mesh::InProcessMeshOptions mo;
  mo.split = {{0, 1}, {2, 3}, {4, 4}};
  mesh::InProcessMesh mesh(File(), mo, nullptr);
  mesh::FixedRouteProvider p(mesh.route());
  return mesh::Generate(p, prompt, o).generated_ids;
}

class MeshProcessTest : public ::testing::Test {
 protected:
  std::unique_ptr<NodeProcess> Start(const std::string& layers, std::vector<std::string> extra = {},
                                     const std::string& listen = "127.0.0.1:0",
                                     bool metrics = false) {
    std::vector<std::string> args = {"--model",  kModel, "--layers",  layers,
                                     "--listen", listen, "--threads", "1"};
    if (metrics) extra.insert(extra.end(), {"--metrics-listen", "127.0.0.1:0"});
    args.insert(args.end(), extra.begin(), extra.end());
    const std::string log = dir_.file("node-" + std::to_string(++started_) + ".log");
    return std::make_unique<NodeProcess>(MESHNET_BINARY, args, log, metrics);
  }

  static ClientOptions Client() {
    ClientOptions co;
    // A dead node costs one Info deadline per plan; generous enough for
    // sanitized builds on a busy machine.
    co.info_timeout_s = 5.0;
    co.connect_timeout_s = 2.0;
    co.timeout_s = 60.0;
    return co;
  }

  testing::ScratchDir dir_;
  int started_ = 0;
};

TEST_F(MeshProcessTest, ThreeNodeRouteMatchesInProcess) {
  auto a = Start("0-1"), b = Start("2-3"), c = Start("4-4");
  auto provider = MakeRemoteRouteProvider({c->address(), a->address(), b->address()}, Client());
  for (float temperature : {0.0f, 1.0f}) {
    const auto o = Options(48, temperature, 99);
    const auto got = mesh::Generate(*provider, Prompt(0), o);
    EXPECT_EQ(got.generated_ids, Reference(Prompt(0), o)) << "temperature " << temperature;
    EXPECT_EQ(got.final_route, a->address() + " -> " + b->address() + " -> " + c->address());
    EXPECT_EQ(got.re_prefills + got.failovers, 0);
  }
}

// Speculative decoding over three meshnet serve nodes (verify and rewind on
// the wire): the in-process run's tokens, greedy and sampled, with drafts
// accepted and rejected; a kept session's hops hold exactly its text.
TEST_F(MeshProcessTest, SpeculationOverNodesMatchesInProcess) {
  auto a = Start("0-1"), b = Start("2-3"), c = Start("4-4");
  auto provider = MakeRemoteRouteProvider({a->address(), b->address(), c->address()}, Client());
  for (float temperature : {0.0f, 1.0f}) {
    auto o = Options(96, temperature, 5);
    const std::vector<int32_t> want = Reference(Prompt(1), o);
    o.speculate = 4;
    const auto got = mesh::Generate(*provider, Prompt(1), o);
    EXPECT_EQ(got.generated_ids, want) << "temperature " << temperature;
    EXPECT_GT(got.accepted, 0);
    EXPECT_LT(got.accepted, got.drafted);
    EXPECT_EQ(got.re_prefills + got.failovers, 0);
  }
  auto o = Options(64);
  o.speculate = 4;
  o.release_at_end = false;
  o.session_id = "0123456789abcdef0123456789abcdef";
  o.session_secret = "secret";
  const auto kept = mesh::Generate(*provider, Prompt(2), o);
  for (const auto& hop : kept.final_hops) {
    hop->Park(o.session_id, o.session_secret, 0);  // kept, idle: the state stays
    // Truncating to more than it holds says how much it holds.
    EXPECT_EQ(hop->Truncate(o.session_id, o.session_secret, 0, 1 << 20),
              static_cast<int64_t>(kept.kv_tokens.size()))
        << hop->name();
    hop->Release(o.session_id, o.session_secret, 0);
  }
}

// A long prompt sent in pipelined pieces over the nodes (prefill_chunk)
// gives the in-process run's tokens, greedy and sampled; so does the chunked
// re-prefill of the whole history after a node restarted with an empty cache.
TEST_F(MeshProcessTest, ChunkedPrefillOverNodesMatchesInProcess) {
  auto a = Start("0-1"), b = Start("2-3"), c = Start("4-4");
  auto provider = MakeRemoteRouteProvider({a->address(), b->address(), c->address()}, Client());
  std::vector<int32_t> prompt = Prompt(6);
  for (int i = 0; i < 40; ++i) prompt.push_back(static_cast<int32_t>(20 + (i * 37) % 400));
  for (float temperature : {0.0f, 1.0f}) {
    auto o = Options(24, temperature, 17);
    const auto reference = Reference(prompt, o);
    o.prefill_chunk = 9;
    const auto got = mesh::Generate(*provider, prompt, o);
    EXPECT_EQ(got.generated_ids, reference) << "temperature " << temperature;
    EXPECT_EQ(got.re_prefills + got.failovers, 0);
  }
  auto o = Options(30, 0.7f, 3);
  const auto reference = Reference(prompt, o);
  o.prefill_chunk = 16;
  int seen = 0;
  mesh::GenerateEvents ev;
  ev.on_token = [&](int32_t) {
    if (++seen != 10) return;
    const std::string port = b->port();
    b->Stop(SIGKILL);
    b = Start("2-3", {}, "127.0.0.1:" + port);  // same address, empty cache
  };
  const auto got = mesh::Generate(*provider, prompt, o, ev);
  EXPECT_EQ(got.generated_ids, reference);
  EXPECT_GE(got.re_prefills + got.failovers, 1);
}

TEST_F(MeshProcessTest, KilledMiddleNodeFailsOverToStandby) {
  auto a = Start("0-1"), b1 = Start("2-3"), b2 = Start("2-3"), c = Start("4-4");
  auto provider =
      MakeRemoteRouteProvider({a->address(), b1->address(), b2->address(), c->address()}, Client());
  RemoteEndpoint probe1(b1->address(), Client()), probe2(b2->address(), Client());
  const auto o = Options(40);
  int seen = 0;
  std::string killed;
  mesh::GenerateEvents ev;
  ev.on_token = [&](int32_t) {
    if (++seen != 12) return;
    // Kill whichever standby-pair member holds the session right now.
    NodeProcess* victim = probe1.Info().live_sessions == 1 ? b1.get() : b2.get();
    ASSERT_EQ(probe1.Info().live_sessions + probe2.Info().live_sessions, 1);
    killed = victim->address();
    victim->Stop(SIGKILL);
  };
  const auto got = mesh::Generate(*provider, Prompt(1), o, ev);
  EXPECT_EQ(got.generated_ids, Reference(Prompt(1), o));
  EXPECT_GE(got.failovers, 1);
  EXPECT_THAT(got.final_route, ::testing::Not(HasSubstr(killed)));
  EXPECT_FALSE(killed.empty());
}

TEST_F(MeshProcessTest, RestartedNodeLosesItsCacheAndTheSessionRePrefills) {
  auto a = Start("0-1"), b = Start("2-3"), c = Start("4-4");
  auto provider = MakeRemoteRouteProvider({a->address(), b->address(), c->address()}, Client());
  const auto o = Options(40, 0.7f, 5);
  int seen = 0;
  mesh::GenerateEvents ev;
  ev.on_token = [&](int32_t) {
    if (++seen != 15) return;
    const std::string port = b->port();
    b->Stop(SIGKILL);
    b = Start("2-3", {}, "127.0.0.1:" + port);  // same address, empty cache
  };
  const auto got = mesh::Generate(*provider, Prompt(2), o, ev);
  EXPECT_EQ(got.generated_ids, Reference(Prompt(2), o));
  EXPECT_GE(got.re_prefills + got.failovers, 1);
  EXPECT_GE(got.re_prefills, 1) << "the restarted node answers with a CacheMiss";
}

TEST_F(MeshProcessTest, SixteenConcurrentSessionsUnderEvictionStayCorrectAndInBudget) {
  // Head/middle: 512 B per token, 16-token blocks (8 KiB): 96 KiB holds 12
  // blocks, about 6 of the 16 sessions. The tail holds twice as many.
  const std::vector<std::string> kv = {"--kv-budget", "96KiB", "--max-sessions", "16"};
  std::vector<std::unique_ptr<NodeProcess>> nodes;
  for (const char* layers : {"0-1", "2-3", "4-4"}) {
    nodes.push_back(Start(layers, kv, "127.0.0.1:0", /*metrics=*/true));
  }
  auto provider = MakeRemoteRouteProvider(
      {nodes[0]->address(), nodes[1]->address(), nodes[2]->address()}, Client());
  constexpr int kSessions = 16;
  std::vector<std::vector<int32_t>> want(kSessions), got(kSessions);
  std::vector<mesh::GenerateOptions> opts;
  for (int s = 0; s < kSessions; ++s) {
    opts.push_back(Options(24, s % 2 ? 0.8f : 0.0f, 1000 + s));
    want[s] = Reference(Prompt(s), opts[s]);
  }
  std::vector<std::string> errors(kSessions);
  std::atomic<int> recoveries{0};
  std::vector<std::thread> threads;
  for (int s = 0; s < kSessions; ++s) {
    threads.emplace_back([&, s] {
      try {
        auto r = mesh::Generate(*provider, Prompt(s), opts[s]);
        got[s] = r.generated_ids;
        recoveries += r.re_prefills;
      } catch (const std::exception& e) {
        errors[s] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int s = 0; s < kSessions; ++s) {
    EXPECT_EQ(errors[s], "") << "session " << s;
    EXPECT_EQ(got[s], want[s]) << "session " << s;
  }
  EXPECT_GT(recoveries.load(), 0) << "the budget was meant to force evictions";
  double evictions = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const NodeInfo info = RemoteEndpoint(nodes[i]->address(), Client()).InfoFull();
    EXPECT_LE(info.kv_bytes_reserved_peak, info.shard.kv_budget_bytes) << "node " << i;
    EXPECT_EQ(info.shard.kv_budget_bytes, 96 << 10);
    const std::string metrics = testing::HttpGet(nodes[i]->metrics_address(), "/metrics");
    ASSERT_THAT(metrics, HasSubstr("meshnet_kv_evictions_total"));
    ASSERT_THAT(metrics, HasSubstr("meshnet_step_room_waits_total"));
    // Idle sessions are evicted, active ones preempted for earlier ones.
    evictions +=
        testing::MetricValue(metrics, "meshnet_kv_evictions_total{reason=\"evicted-lru\"}") +
        testing::MetricValue(metrics, "meshnet_kv_evictions_total{reason=\"preempted\"}");
    EXPECT_LE(testing::MetricValue(metrics, "meshnet_kv_bytes_reserved_peak"), 96 << 10);
  }
  EXPECT_GT(evictions, 0);
}

TEST_F(MeshProcessTest, MalformedInputIsRejectedWhileOtherSessionsKeepGoing) {
  auto a = Start("0-1"), b = Start("2-3"), c = Start("4-4");
  auto provider = MakeRemoteRouteProvider({a->address(), b->address(), c->address()}, Client());
  const auto o = Options(30);
  const auto want = Reference(Prompt(3), o);

  RemoteEndpoint middle(b->address(), Client());
  int seen = 0;
  std::vector<std::string> refusals;
  mesh::GenerateEvents ev;
  ev.on_token = [&](int32_t) {
    if (++seen != 10) return;
    // Another client sends malformed steps to the middle node mid-generation.
    shard::BoundaryBundle good;
    good.architecture_adapter = "llama";
    good.tensor_name = "residual";
    good.n_tokens = 1;
    good.n_embd = 64;
    good.residual.assign(64, 0.5f);
    good.positions = {0};
    good.next_layer = 2;
    std::vector<std::function<void(mesh::StepRequest&)>> breakers = {
        [](mesh::StepRequest& r) { r.bundle->next_layer = 3; },
        [](mesh::StepRequest& r) { r.bundle->normalized = true; },
        [](mesh::StepRequest& r) { r.bundle->n_embd = 32; },
        [](mesh::StepRequest& r) { r.bundle->residual.resize(63); },
        [](mesh::StepRequest& r) { r.bundle->tensor_name = "hidden"; },
        [](mesh::StepRequest& r) { r.bundle->positions = {4}; },
        [](mesh::StepRequest& r) {
          r.bundle.reset();
          r.token_ids = {1};
        },
        [](mesh::StepRequest& r) { r.session_id = "short"; },
    };
    for (auto& brk : breakers) {
      mesh::StepRequest r;
      r.session_id = node::RandomId128();
      r.session_secret = "x";
      r.prefill = true;
      r.bundle = good;
      brk(r);
      try {
        middle.Step(r);
        refusals.push_back("accepted");
      } catch (const Error& e) {
        refusals.push_back(e.kind() == ErrorKind::kInvalidArgument ||
                                   e.kind() == ErrorKind::kBoundaryContract
                               ? "ok"
                               : std::string(ErrorKindName(e.kind())) + ": " + e.what());
      }
    }
  };
  const auto got = mesh::Generate(*provider, Prompt(3), o, ev);
  EXPECT_EQ(got.generated_ids, want);
  EXPECT_EQ(got.re_prefills + got.failovers, 0) << "the node's other sessions were untouched";
  EXPECT_EQ(refusals, std::vector<std::string>(8, "ok"));
}

TEST_F(MeshProcessTest, WrongTokenOrSessionSecretIsRefused) {
  const std::vector<std::string> tok = {"--auth-token", "s3cr3t-cluster"};
  auto a = Start("0-1", tok), b = Start("2-3", tok), c = Start("4-4", tok);
  const std::vector<std::string> addrs = {a->address(), b->address(), c->address()};
  ClientOptions bad = Client();
  bad.auth_token = "guess";
  try {
    MakeRemoteRouteProvider(addrs, bad)->Plan();
    ADD_FAILURE() << "a wrong token planned a route";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
  }
  ClientOptions good = Client();
  good.auth_token = "s3cr3t-cluster";
  auto provider = MakeRemoteRouteProvider(addrs, good);
  auto o = Options(12);
  o.session_id = node::RandomId128();
  o.session_secret = "owner-secret";
  o.release_at_end = false;
  EXPECT_EQ(mesh::Generate(*provider, Prompt(4), o).generated_ids, Reference(Prompt(4), o));

  // Another client with the right cluster token but not the session's secret.
  RemoteEndpoint head(a->address(), good);
  mesh::StepRequest r;
  r.session_id = o.session_id;
  r.session_secret = "not-the-owner";
  r.token_ids = {5};
  r.expected_seq_len = static_cast<int64_t>(Prompt(4).size() + 11);
  r.step_id = 77;
  for (int attempt = 0; attempt < 3; ++attempt) {
    try {
      if (attempt == 0) head.Step(r);
      if (attempt == 1) head.Truncate(r.session_id, r.session_secret, 0, 1);
      if (attempt == 2) head.ReleaseOrThrow(r.session_id, r.session_secret, 0);
      ADD_FAILURE() << "attempt " << attempt << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
    }
  }
  EXPECT_EQ(head.Info().live_sessions, 1) << "the owner's state is intact";
  EXPECT_TRUE(head.ReleaseOrThrow(o.session_id, "owner-secret", 0));
}

// A test process that dies without cleaning up (a crash, ctest's timeout)
// takes its nodes with it: a NodeProcess child dies with its parent.
TEST_F(MeshProcessTest, NodesDieWithACrashedTestProcess) {
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  const pid_t helper = fork();
  ASSERT_GE(helper, 0);
  if (helper == 0) {  // the "test": starts a node, reports its pid, dies as a crash would
    close(report[0]);
    pid_t node = -1;
    try {
      node = Start("0-4").release()->pid();  // never destroyed
    } catch (...) {
    }
    const bool sent = write(report[1], &node, sizeof node) == sizeof node;
    _exit(sent && node > 0 ? 0 : 1);  // no destructors, no atexit
  }
  close(report[1]);
  pid_t node = -1;
  const ssize_t got = read(report[0], &node, sizeof node);
  close(report[0]);
  int status = 0;
  ASSERT_EQ(waitpid(helper, &status, 0), helper);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the helper could not start a node";
  ASSERT_EQ(got, static_cast<ssize_t>(sizeof node));
  // Wait (bounded) for the node's exit; ESRCH: already gone and reaped.
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, node, 0));
  if (pidfd < 0 && errno == ENOSYS) GTEST_SKIP() << "no pidfd_open on this kernel";
  if (pidfd < 0) {
    ASSERT_EQ(errno, ESRCH);
    return;
  }
  pollfd p{pidfd, POLLIN, 0};
  const int ready = poll(&p, 1, 10000);
  close(pidfd);
  EXPECT_EQ(ready, 1) << "node " << node << " outlived its test process by 10 s";
  if (ready != 1) kill(node, SIGKILL);
}

TEST_F(MeshProcessTest, ServeRejectsBadFlagsAndStopsGracefully) {
  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {"--layers", "3-1"},
           {"--layers", "0-9"},
           {"--layers", "0-1", "--kv-budget", "lots"},
           {"--layers", "0-1", "--kv-dtype", "int4"},
           {"--layers", "0-1", "--listen", "127.0.0.1:99999"},
           {"--layers", "0-1", "--listen", "nohost"},
           {"--layers", "0-1", "--metrics-listen", "127.0.0.1:x"},
           {"--layers", "0-1", "--max-sessions", "0"},
           {"--layers", "0-1", "--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"},
           {"--layers", "0-1", "--tls-cert", "/nonexistent.pem"},
       }) {
    std::vector<std::string> args = {"--model", kModel, "--threads", "1"};
    args.insert(args.end(), bad.begin(), bad.end());
    EXPECT_THROW(NodeProcess(MESHNET_BINARY, args, dir_.file("bad.log")), std::runtime_error)
        << bad.back();
  }
  auto a = Start("0-4");
  auto provider = MakeRemoteRouteProvider({a->address()}, Client());
  EXPECT_EQ(mesh::Generate(*provider, Prompt(5), Options(4)).generated_ids.size(), 4u);
  // Close the client's connection first: the gRPC server waits (about 5 s) for
  // connected idle clients to go away after its GOAWAY, in-flight calls or not.
  provider.reset();
  const auto t0 = std::chrono::steady_clock::now();
  const int status = a->Stop(SIGTERM);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << a->Log();
  EXPECT_THAT(a->Log(), HasSubstr("event=stopped"));
}

}  // namespace
}  // namespace meshnet::rpc
