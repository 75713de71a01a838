// Chain forwarding over `meshnet serve` children (rpc/forward.h,
// rpc/returns.h): the same tokens as the star path on routes of 1, 3 and 5
// hops, for one and for 16 concurrent sessions, with and without speculative
// decoding; failover when a node of the chain dies; and what keeps a node
// from being a relay: it forwards only as hop chain_index of the route in
// the request, and only to a node that proves it serves the next layers of
// the same model. Every child is killed and reaped in teardown; every wait
// is bounded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gguf/gguf_reader.h"
#include "mesh/generator.h"
#include "mesh/in_process.h"
#include "mesh/multi_session.h"
#include "node/identity.h"
#include "proto/meshnet.grpc.pb.h"
#include "rpc/auth.h"
#include "rpc/migrate.h"
#include "rpc/remote.h"
#include "rpc/test_util.h"
#include "tests/rpc/cli_run.h"
#include "tests/rpc/node_process.h"
#include "util/error.h"

namespace meshnet::rpc {
namespace {

namespace pb = ::meshnet::v1;
using ::testing::HasSubstr;
using testing::NodeProcess;

const std::string kModel = MESHNET_SHIPPED_MODEL;

std::vector<int32_t> Prompt(int variant) {
  std::vector<int32_t> p = {1, 403, 407, 261, 378, 429};
  p.push_back(static_cast<int32_t>(10 + 7 * variant));  // distinct per session
  return p;
}

mesh::GenerateOptions Options(int max_tokens, float temperature = 0.0f, int speculate = 0) {
  mesh::GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampling.temperature = temperature;
  o.sampling.seed = 11;
  o.speculate = speculate;
  o.max_recoveries = 1000;
  o.backoff_initial_s = 0.01;
  o.backoff_max_s = 0.1;
  return o;
}

class ChainProcessTest : public ::testing::Test {
 protected:
  std::unique_ptr<NodeProcess> Start(const std::string& layers,
                                     std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {
        "--model",   kModel, "--layers",       layers, "--listen",         "127.0.0.1:0",
        "--threads", "1",    "--max-sessions", "32",   "--metrics-listen", "127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    const std::string log = dir_.file("node-" + std::to_string(++started_) + ".log");
    return std::make_unique<NodeProcess>(MESHNET_BINARY, args, log, /*expect_metrics=*/true);
  }

  static ClientOptions Client(bool chain) {
    ClientOptions co;
    co.info_timeout_s = 5.0;
    co.connect_timeout_s = 2.0;
    co.timeout_s = 60.0;
    co.chain = chain;
    return co;
  }

  static double Metric(const NodeProcess& n, const std::string& series) {
    return testing::MetricValue(testing::HttpGet(n.metrics_address(), "/metrics"), series);
  }

  testing::ScratchDir dir_;
  int started_ = 0;
};

std::vector<std::string> Addresses(const std::vector<std::unique_ptr<NodeProcess>>& nodes) {
  std::vector<std::string> out;
  for (const auto& n : nodes) out.push_back(n->address());
  return out;
}

// Greedy and sampled, plain and speculative: the chain's tokens are the
// star's, on routes of 1, 3 and 5 hops; on 3 and 5 every node but the tail
// forwarded and the tail answered on the client's Returns stream.
TEST_F(ChainProcessTest, ChainGivesTheStarsTokensOnOneThreeAndFiveHops) {
  const std::vector<std::vector<std::string>> splits = {
      {"0-4"}, {"0-1", "2-3", "4-4"}, {"0-0", "1-1", "2-2", "3-3", "4-4"}};
  for (const auto& split : splits) {
    std::vector<std::unique_ptr<NodeProcess>> nodes;
    for (const auto& layers : split) nodes.push_back(Start(layers));
    auto star = MakeRemoteRouteProvider(Addresses(nodes), Client(false));
    auto chain = MakeRemoteRouteProvider(Addresses(nodes), Client(true));
    for (const auto& [temperature, speculate] :
         std::vector<std::pair<float, int>>{{0.0f, 0}, {1.0f, 0}, {0.0f, 4}, {1.0f, 4}}) {
      const auto o = Options(96, temperature, speculate);
      const auto want = mesh::Generate(*star, Prompt(1), o);
      const auto got = mesh::Generate(*chain, Prompt(1), o);
      EXPECT_EQ(got.generated_ids, want.generated_ids)
          << split.size() << " hops, temperature " << temperature << ", speculate " << speculate;
      EXPECT_EQ(got.re_prefills + got.failovers, 0);
      if (speculate > 0) EXPECT_GT(got.accepted, 0);
    }
    const size_t hops = nodes.size();
    for (size_t i = 0; i < hops; ++i) {
      const double forwarded = Metric(*nodes[i], "meshnet_chain_forwarded_steps_total");
      if (i + 1 < hops) {
        EXPECT_GT(forwarded, 0) << "hop " << i << " of " << hops;
      } else {
        EXPECT_EQ(forwarded, 0) << "the tail (or a lone node) forwards nothing";
      }
    }
    if (hops > 1) {
      EXPECT_GT(Metric(*nodes.back(), "meshnet_chain_direct_returns_total"), 0)
          << "the tail answered on the Returns stream";
    }
    // A kept session's hops hold exactly its text after rejected drafts.
    auto o = Options(64, 0.0f, 4);
    o.release_at_end = false;
    o.session_id = node::RandomId128();
    o.session_secret = "kept";
    const auto kept = mesh::Generate(*chain, Prompt(2), o);
    EXPECT_LT(kept.accepted, kept.drafted);
    for (const auto& hop : kept.final_hops) {
      EXPECT_EQ(hop->Truncate(o.session_id, o.session_secret, 0, 1 << 20),
                static_cast<int64_t>(kept.kv_tokens.size()))
          << hop->name();
      hop->Release(o.session_id, o.session_secret, 0);
    }
  }
}

// 16 sessions at once along one chain, plain and speculative: each gets the
// star's tokens for its prompt, and every node ends with none of them held.
TEST_F(ChainProcessTest, SixteenConcurrentSessionsOnAChainGetTheStarsTokens) {
  std::vector<std::unique_ptr<NodeProcess>> nodes;
  for (const char* layers : {"0-1", "2-3", "4-4"}) nodes.push_back(Start(layers));
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 16; ++i) prompts.push_back(Prompt(i));
  auto star = MakeRemoteRouteProvider(Addresses(nodes), Client(false));
  auto chain = MakeRemoteRouteProvider(Addresses(nodes), Client(true));
  for (int speculate : {0, 4}) {
    const auto o = Options(24, 0.0f, speculate);
    mesh::MultiSessionDriver star_driver(*star, {});
    const mesh::MultiSessionReport want = star_driver.Run(prompts, o);
    mesh::MultiSessionDriver chain_driver(*chain, {});
    const mesh::MultiSessionReport got = chain_driver.Run(prompts, o);
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(want.sessions[i].ok) << want.sessions[i].error;
      ASSERT_TRUE(got.sessions[i].ok) << got.sessions[i].error;
      EXPECT_EQ(got.sessions[i].result.generated_ids, want.sessions[i].result.generated_ids)
          << "session " << i << ", speculate " << speculate;
    }
  }
  EXPECT_GE(Metric(*nodes[0], "meshnet_chain_forwarded_steps_total"), 2 * 16 * 24 / 5.0)
      << "the chain's steps went along the chain";
  for (const auto& n : nodes) {
    EXPECT_EQ(RemoteEndpoint(n->address(), Client(false)).Info().live_sessions, 0) << n->address();
  }
}

// A middle node dies mid-generation on a chain: the hop before it names it
// in its answer, the client re-plans through the standby and re-prefills,
// and the tokens are those of an undisturbed run.
TEST_F(ChainProcessTest, AKilledMiddleNodeOnAChainFailsOverToTheStandby) {
  auto a = Start("0-1"), b1 = Start("2-3"), b2 = Start("2-3"), c = Start("4-4");
  const std::vector<std::string> all = {a->address(), b1->address(), b2->address(), c->address()};
  const auto o = Options(40);
  const auto want = mesh::Generate(*MakeRemoteRouteProvider(all, Client(false)), Prompt(2), o);
  auto chain = MakeRemoteRouteProvider(all, Client(true));
  RemoteEndpoint probe1(b1->address(), Client(false)), probe2(b2->address(), Client(false));
  int seen = 0;
  std::string killed;
  mesh::GenerateEvents ev;
  ev.on_token = [&](int32_t) {
    if (++seen != 12) return;
    NodeProcess* victim = probe1.Info().live_sessions == 1 ? b1.get() : b2.get();
    killed = victim->address();
    victim->Stop(SIGKILL);
  };
  const auto got = mesh::Generate(*chain, Prompt(2), o, ev);
  EXPECT_EQ(got.generated_ids, want.generated_ids);
  EXPECT_GE(got.failovers, 1);
  EXPECT_FALSE(killed.empty());
  EXPECT_THAT(got.final_route, ::testing::Not(HasSubstr(killed)));
}

// A plain TCP listener that records every byte sent to it (not a node).
class Recorder {
 public:
  Recorder() {
    fd_ = testing::ListenOnLoopback(16, &port_);
    thread_ = std::thread([this] { Run(); });
  }
  ~Recorder() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
  }

 private:
  void Run() {
    std::vector<int> conns;
    while (!stop_) {
      std::vector<pollfd> fds = {{fd_, POLLIN, 0}};
      for (int c : conns) fds.push_back({c, POLLIN, 0});
      poll(fds.data(), fds.size(), 50);
      if (fds[0].revents & POLLIN) conns.push_back(accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC));
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
        char buf[4096];
        const ssize_t n = recv(fds[i].fd, buf, sizeof buf, 0);
        if (n > 0) {
          std::lock_guard<std::mutex> lock(mu_);
          bytes_.append(buf, static_cast<size_t>(n));
        }
      }
    }
    for (int c : conns) close(c);
  }
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::string bytes_;
};

pb::StepRequest Prefill(const std::string& secret) {
  pb::StepRequest r;
  r.set_session_id(node::RandomId128());
  r.set_session_secret(secret);
  r.set_prefill(true);
  for (int32_t id : Prompt(3)) r.mutable_tokens()->add_ids(id);
  r.set_omit_logits(true);
  return r;
}

// What keeps a node from being a relay: a route it is not on at its index,
// a next hop that is not a node of the next layers (another range, or no
// meshnet node at all: it gets nothing of the client's), malformed chains.
TEST_F(ChainProcessTest, ANodeForwardsOnlyAlongTheRouteToProvenNodesOfTheNextLayers) {
  auto a = Start("0-1"), b = Start("2-3"), c = Start("4-4");
  auto channel = MakeChannel(a->address(), Client(false));
  auto stub = pb::MeshNode::NewStub(channel);
  auto call = [&](pb::MeshNode::Stub& s, const pb::StepRequest& req, pb::StepResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return s.Step(&ctx, req, out);
  };
  {  // a forwards to c, which serves layer 4, not 2: refused before any step reaches c
    pb::StepRequest req = Prefill("secret-1");
    for (const auto& n : {a.get(), c.get()}) req.add_chain_route(n->address());
    pb::StepResponse out;
    ASSERT_TRUE(call(*stub, req, &out).ok());
    EXPECT_EQ(out.chain_hop(), 1);
    EXPECT_EQ(out.chain_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(out.chain_message(), HasSubstr("layers from 4"));
    EXPECT_EQ(RemoteEndpoint(c->address(), Client(false)).InfoFull().steps_served, 0);
  }
  {  // the next hop is no node: it hears a Prove at most, never the step
    Recorder recorder;
    pb::StepRequest req = Prefill("the-secret-marker-42");
    req.add_chain_route(a->address());
    req.add_chain_route(recorder.address());
    req.add_chain_route(c->address());
    pb::StepResponse out;
    ASSERT_TRUE(call(*stub, req, &out).ok());
    EXPECT_EQ(out.chain_hop(), 1);
    EXPECT_NE(out.chain_code(), 0);
    EXPECT_FALSE(out.has_tail());
    EXPECT_THAT(recorder.bytes(), ::testing::Not(HasSubstr("the-secret-marker-42")));
    EXPECT_THAT(recorder.bytes(), ::testing::Not(HasSubstr(req.session_id())));
    // The failed proof is remembered: the next step to it is refused at once,
    // not after another Prove's deadline (the node's Info deadline, 2 s).
    req = Prefill("the-secret-marker-42");
    req.add_chain_route(a->address());
    req.add_chain_route(recorder.address());
    req.add_chain_route(c->address());
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(call(*stub, req, &out).ok());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    EXPECT_EQ(out.chain_hop(), 1);
    EXPECT_NE(out.chain_code(), 0);
    EXPECT_THAT(recorder.bytes(), ::testing::Not(HasSubstr("the-secret-marker-42")));
  }
  {  // a step sent to b whose route names a at b's place is refused by b
    auto b_stub = pb::MeshNode::NewStub(MakeChannel(b->address(), Client(false)));
    pb::StepRequest req = Prefill("secret-3");
    for (const auto& n : {a.get(), a.get(), c.get()}) req.add_chain_route(n->address());
    req.set_chain_index(1);
    pb::StepResponse out;
    const grpc::Status s = call(*b_stub, req, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(), HasSubstr("not this node"));
  }
  {  // malformed chains
    pb::StepRequest req = Prefill("secret-4");
    for (int i = 0; i < 17; ++i) req.add_chain_route(a->address());
    pb::StepResponse out;
    EXPECT_EQ(call(*stub, req, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    req.clear_chain_route();
    req.add_chain_route(a->address());
    req.add_chain_route(b->address());
    req.set_chain_index(2);
    EXPECT_EQ(call(*stub, req, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    req.set_chain_index(0);
    req.set_return_id("short");
    EXPECT_EQ(call(*stub, req, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    pb::StepManyRequest many;
    *many.add_steps() = Prefill("secret-5");
    many.mutable_steps(0)->add_chain_route(a->address());
    many.mutable_steps(0)->add_chain_route(b->address());
    pb::StepManyResponse many_out;
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->StepMany(&ctx, many, &many_out).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  {  // and a well-formed chain goes through to the tail's token
    pb::StepRequest req = Prefill("secret-6");
    for (const auto& n : {a.get(), b.get(), c.get()}) req.add_chain_route(n->address());
    pb::StepResponse out;
    ASSERT_TRUE(call(*stub, req, &out).ok());
    EXPECT_EQ(out.chain_code(), 0) << out.chain_message();
    EXPECT_EQ(out.chain_hop(), 2);
    EXPECT_TRUE(out.has_tail());
    EXPECT_GT(out.route_compute_micros(), out.compute_micros()) << "every hop's compute";
  }
  {  // with a Returns stream open on the tail, the answer also comes on it, whole
    auto c_stub = pb::MeshNode::NewStub(MakeChannel(c->address(), Client(false)));
    grpc::ClientContext rctx;
    rctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    pb::ReturnsRequest rreq;
    rreq.set_return_id(std::string(16, 'z'));
    auto returns = c_stub->Returns(&rctx, rreq);
    pb::StepReturn opened, answer;
    ASSERT_TRUE(returns->Read(&opened));
    pb::StepRequest req = Prefill("secret-7");
    for (const auto& n : {a.get(), b.get(), c.get()}) req.add_chain_route(n->address());
    req.set_return_id(rreq.return_id());
    req.set_step_id(42);
    pb::StepResponse out;
    ASSERT_TRUE(call(*stub, req, &out).ok());
    ASSERT_TRUE(returns->Read(&answer));
    EXPECT_EQ(answer.session_id(), req.session_id());
    EXPECT_EQ(answer.step_id(), 42u);
    EXPECT_EQ(answer.response().tail().token_id(), out.tail().token_id());
    EXPECT_EQ(answer.response().route_compute_micros(), out.route_compute_micros())
        << "the direct return carries every hop's compute too";
    rctx.TryCancel();
    while (returns->Read(&answer)) {
    }
    returns->Finish();
  }
}

// The Returns stream: the cluster token, an id of 16..64 bytes, one stream
// per id; its first message says it is open.
TEST_F(ChainProcessTest, ReturnsStreamsNeedTheTokenAndADistinctId) {
  const std::vector<std::string> tok = {"--auth-token", "chain-token"};
  auto a = Start("0-4", tok);
  ClientOptions co = Client(false);
  co.auth_token = "chain-token";
  auto stub = pb::MeshNode::NewStub(MakeChannel(a->address(), co));
  auto open = [&](const std::string& id, const std::string& token, grpc::ClientContext* ctx) {
    if (!token.empty()) ctx->AddMetadata("authorization", BearerValue(token));
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    pb::ReturnsRequest req;
    req.set_return_id(id);
    return stub->Returns(ctx, req);
  };
  const std::string id(16, 'r');
  grpc::ClientContext held_ctx;
  auto held = open(id, "chain-token", &held_ctx);
  pb::StepReturn first;
  ASSERT_TRUE(held->Read(&first));
  EXPECT_TRUE(first.session_id().empty());
  for (const auto& [bad_id, token, code] :
       std::vector<std::tuple<std::string, std::string, grpc::StatusCode>>{
           {id, "chain-token", grpc::StatusCode::ALREADY_EXISTS},
           {"short", "chain-token", grpc::StatusCode::INVALID_ARGUMENT},
           {std::string(16, 's'), "guess", grpc::StatusCode::UNAUTHENTICATED},
           {std::string(16, 't'), "", grpc::StatusCode::UNAUTHENTICATED}}) {
    grpc::ClientContext ctx;
    auto reader = open(bad_id, token, &ctx);
    pb::StepReturn msg;
    EXPECT_FALSE(reader->Read(&msg));
    EXPECT_EQ(reader->Finish().error_code(), code) << bad_id << " / " << token;
  }
  held_ctx.TryCancel();
  pb::StepReturn more;
  EXPECT_FALSE(held->Read(&more));
  held->Finish();
}

// `meshnet generate --forwarding chain` prints the star's text, plainly and
// speculatively; a forwarding it does not know is refused.
TEST_F(ChainProcessTest, GenerateForwardingChainPrintsTheStarsText) {
  auto a = Start("0-1"), b = Start("2-3"), c = Start("4-4");
  const std::string nodes = a->address() + "," + b->address() + "," + c->address();
  for (const char* speculate : {"0", "4"}) {
    std::vector<nlohmann::json> out;
    for (const char* forwarding : {"star", "chain"}) {
      const testing::CliResult r = testing::RunCli(
          MESHNET_BINARY,
          {"generate", "--model", kModel, "--nodes", nodes, "--prompt", "Once upon a time", "-n",
           "64", "--speculate", speculate, "--forwarding", forwarding, "--output", "json"},
          120);
      ASSERT_EQ(r.exit_code, 0) << forwarding << ": " << r.err;
      out.push_back(nlohmann::json::parse(r.out));
    }
    EXPECT_EQ(out[1]["generated_ids"], out[0]["generated_ids"]) << "speculate " << speculate;
    EXPECT_EQ(out[1]["text"], out[0]["text"]);
    // The chain's passes say the hops' compute; the rest of their time is links.
    EXPECT_FALSE(out[0]["route"].contains("measured_passes"));
    EXPECT_EQ(out[1]["route"]["measured_passes"], out[1]["route"]["passes"]);
    EXPECT_GT(out[1]["route"]["compute_seconds"].get<double>(), 0);
    EXPECT_GT(out[1]["route"]["link_seconds"].get<double>(), 0);
    EXPECT_LT(out[1]["route"]["compute_seconds"].get<double>(),
              out[1]["route"]["seconds"].get<double>());
    if (std::string(speculate) != "0") {
      EXPECT_GT(out[1]["route"]["tokens_per_pass"].get<double>(), 1.0);
    }
  }
  EXPECT_GT(Metric(*a, "meshnet_chain_forwarded_steps_total"), 0);
  const testing::CliResult bad = testing::RunCli(
      MESHNET_BINARY, {"generate", "--nodes", nodes, "--prompt", "x", "--forwarding", "ring"}, 60);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.err, HasSubstr("--forwarding"));
}

}  // namespace
}  // namespace meshnet::rpc
