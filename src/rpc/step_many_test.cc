// StepMany: the steps of several sessions in one call. On the node: each
// step gets its own outcome (one step's error is its own) and the steps of
// a call are computed in one batch. On the client: decode steps that wait for
// a node while a call to it is out go as one StepMany, and their answers
// equal those of single Step calls.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "gguf/gguf_reader.h"
#include "mesh/in_process.h"
#include "proto/meshnet.grpc.pb.h"
#include "rpc/codec.h"
#include "rpc/remote.h"
#include "rpc/server.h"
#include "rpc/test_util.h"
#include "util/error.h"

namespace meshnet::rpc {
namespace {

using node::ShippedFile;

const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378, 429};
constexpr int kSessions = 6;

std::string SessionId(int i) {
  std::string id = "5e55100000000000000000000000000";
  id += static_cast<char>('0' + i);
  return id;
}

// The head (layers 0-1) of the shipped model in a node served on 127.0.0.1,
// with float32 KV; `group_wait_s`: how long its batches wait for a call's
// steps (long here, so that "one batch" does not depend on thread timing).
struct Head {
  explicit Head(double group_wait_s = 30.0) : mesh(ShippedFile(), Options(group_wait_s), nullptr) {
    mesh.node(0).batcher().SetObserver([this](const node::BatchView& v) {
      std::lock_guard<std::mutex> lock(mu);
      batch_sizes.push_back(static_cast<int>(v.session_ids.size()));
    });
    NodeServerOptions o;
    server = std::make_unique<NodeServer>(&mesh.node(0), o);
    server->Start();
  }
  static mesh::InProcessMeshOptions Options(double group_wait_s) {
    mesh::InProcessMeshOptions o;
    o.split = {{0, 1}, {2, 4}};
    o.kv_dtype = KvDtype::kF32;
    o.kv_config.max_sessions = 64;
    o.batch.group_wait_s = group_wait_s;
    return o;
  }
  // One StepMany call on a channel of its own; fails the test if it fails.
  pb::StepManyResponse Call(const pb::StepManyRequest& req) {
    auto stub = pb::MeshNode::NewStub(
        grpc::CreateChannel(server->bound_address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    pb::StepManyResponse resp;
    const grpc::Status s = stub->StepMany(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }
  std::vector<int> Batches() {
    std::lock_guard<std::mutex> lock(mu);
    return batch_sizes;
  }
  void ClearBatches() {
    std::lock_guard<std::mutex> lock(mu);
    batch_sizes.clear();
  }

  mesh::InProcessMesh mesh;
  std::unique_ptr<NodeServer> server;
  std::mutex mu;
  std::vector<int> batch_sizes;
};

mesh::StepRequest Prefill(int i) {
  mesh::StepRequest r;
  r.session_id = SessionId(i);
  r.session_secret = "secret";
  r.step_id = 1;
  r.prefill = true;
  r.token_ids = kPrompt;
  r.token_ids.push_back(300 + i);
  return r;
}

mesh::StepRequest Decode(int i, const std::string& secret = "secret") {
  mesh::StepRequest r;
  r.session_id = SessionId(i);
  r.session_secret = secret;
  r.step_id = 2;
  r.expected_seq_len = static_cast<int64_t>(kPrompt.size()) + 1;
  r.token_ids = {400 + i};
  return r;
}

pb::StepRequest Wire(const mesh::StepRequest& r) {
  pb::StepRequest req;
  EncodeStepRequest(r, KvDtype::kF32, KvDtype::kF32, false, &req);
  return req;
}

// The decode answers of every session, each step in a Step call of its own
// (a fresh node: the reference).
std::vector<shard::BoundaryBundle> SingleAnswers() {
  Head head;
  RemoteEndpoint ep(head.server->bound_address(), ClientOptions{});
  std::vector<shard::BoundaryBundle> out;
  for (int i = 0; i < kSessions; ++i) {
    ep.Step(Prefill(i));
    out.push_back(std::get<shard::BoundaryBundle>(ep.Step(Decode(i))));
  }
  return out;
}

void ExpectNear(const shard::BoundaryBundle& got, const shard::BoundaryBundle& want, int i) {
  ASSERT_EQ(got.n_tokens, want.n_tokens) << "session " << i;
  ASSERT_EQ(got.positions, want.positions) << "session " << i;
  ASSERT_EQ(got.residual.size(), want.residual.size());
  for (size_t k = 0; k < want.residual.size(); ++k) {
    ASSERT_NEAR(got.residual[k], want.residual[k], 1e-4 * (1 + std::fabs(want.residual[k])))
        << "session " << i << " value " << k;
  }
}

// One StepMany with the six sessions' decode steps, a miss, a step with the
// wrong secret and one with a bad token: each gets its own outcome, and the
// six run as one batch. The wrong secret is for session 0 (`distinct` false:
// a second step of a session in the call, which runs the steps on the
// fanout's threads) or for session 9 of its own (every session distinct: the
// steps run from the handler's thread). Returns the call, for a repeat.
pb::StepManyRequest ExpectOwnOutcomes(Head& head, bool distinct) {
  const auto want = SingleAnswers();
  RemoteEndpoint ep(head.server->bound_address(), ClientOptions{});
  for (int i = 0; i < kSessions; ++i) ep.Step(Prefill(i));
  ep.Step(Prefill(9));
  head.ClearBatches();
  pb::StepManyRequest req;
  for (int i = 0; i < kSessions; ++i) *req.add_steps() = Wire(Decode(i));
  *req.add_steps() = Wire(Decode(7));                                   // never opened: a miss
  *req.add_steps() = Wire(Decode(distinct ? 9 : 0, "another secret"));  // not the opener's
  mesh::StepRequest bad = Decode(8);
  bad.token_ids = {1 << 30};  // outside the vocabulary
  *req.add_steps() = Wire(bad);
  pb::StepManyResponse resp = head.Call(req);
  EXPECT_EQ(resp.outcomes_size(), kSessions + 3);
  if (resp.outcomes_size() != kSessions + 3) return req;
  for (int i = 0; i < kSessions; ++i) {
    const pb::StepOutcome& o = resp.outcomes(i);
    EXPECT_EQ(o.code(), 0) << o.message();
    if (o.code() == 0) {
      ExpectNear(std::get<shard::BoundaryBundle>(DecodeStepResponse(o.response(), 0)), want[i], i);
    }
  }
  EXPECT_EQ(resp.outcomes(kSessions).code(), 0);
  EXPECT_TRUE(resp.outcomes(kSessions).response().has_miss());
  EXPECT_EQ(resp.outcomes(kSessions + 1).code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(resp.outcomes(kSessions + 1).kind(), ErrorKindName(ErrorKind::kPermissionDenied));
  EXPECT_EQ(resp.outcomes(kSessions + 2).code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(resp.outcomes(kSessions + 2).message().empty());
  // The six decode steps ran as one batch (the failed ones never queued).
  EXPECT_EQ(head.Batches(), std::vector<int>{kSessions});
  return req;
}

TEST(StepManyTest, EachStepGetsItsOwnOutcomeInOneBatch) {
  Head head;
  ExpectOwnOutcomes(head, /*distinct=*/false);
}

TEST(StepManyTest, DistinctSessionsRunInOneBatchFromTheHandlersThread) {
  Head head;
  const pb::StepManyRequest req = ExpectOwnOutcomes(head, /*distinct=*/true);
  // Sent again: the answered steps replay from the idempotency cache, as
  // single calls' would; nothing is recomputed.
  const pb::StepManyResponse again = head.Call(req);
  ASSERT_EQ(again.outcomes_size(), kSessions + 3);
  for (int i = 0; i < kSessions; ++i) EXPECT_TRUE(again.outcomes(i).response().replayed()) << i;
  EXPECT_EQ(head.Batches(), std::vector<int>{kSessions});
  EXPECT_EQ(head.server->counters().steps_replayed.load(), kSessions);
}

TEST(StepManyTest, RefusesEmptyAndOversizedCalls) {
  Head head;
  auto stub = pb::MeshNode::NewStub(
      grpc::CreateChannel(head.server->bound_address(), grpc::InsecureChannelCredentials()));
  for (int n : {0, kMaxStepsPerCall + 1}) {
    pb::StepManyRequest req;
    for (int i = 0; i < n; ++i) *req.add_steps() = Wire(Decode(i % 8));
    grpc::ClientContext ctx;
    pb::StepManyResponse resp;
    const grpc::Status s = stub->StepMany(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << n;
    EXPECT_EQ(resp.outcomes_size(), 0);
  }
  EXPECT_TRUE(head.Batches().empty());
}

template <class Pred>
void Until(Pred pred) {  // bounded poll on the client's and gate's own counts
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!pred() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  ASSERT_TRUE(pred());
}

// Steps that wait for a node while a call to it is out: one StepMany, whose
// answers equal single calls'; with grouping off, one call each.
void RunWaitingSteps(bool group, int64_t* grouped_calls, int64_t* grouped_steps) {
  const auto want = SingleAnswers();
  Head head;
  ClientOptions co;
  co.group_steps = group;
  RemoteEndpoint ep(head.server->bound_address(), co);
  for (int i = 0; i < kSessions; ++i) ep.Step(Prefill(i));
  node::Batcher& batcher = head.mesh.node(0).batcher();
  batcher.Hold();  // the first decode step's call stays out
  std::vector<shard::BoundaryBundle> got(kSessions);
  std::vector<std::thread> threads;
  auto run = [&](int i) {
    threads.emplace_back([&, i] {
      try {
        got[i] = std::get<shard::BoundaryBundle>(ep.Step(Decode(i)));
      } catch (const std::exception& e) {
        ADD_FAILURE() << "session " << i << ": " << e.what();
      }
    });
  };
  run(0);
  batcher.WaitPending(1);
  for (int i = 1; i < kSessions; ++i) run(i);
  if (group) {
    // The others queue at the client behind the call that is out.
    Until([&] { return ep.steps_waiting() == kSessions - 1; });
  } else {
    batcher.WaitPending(kSessions);  // each sent its own call
  }
  batcher.Resume();
  for (auto& t : threads) t.join();
  for (int i = 0; i < kSessions; ++i) ExpectNear(got[i], want[i], i);
  const node::NodeCounters& c = head.server->counters();
  *grouped_calls = c.grouped_calls.load();
  *grouped_steps = c.grouped_steps.load();
}

TEST(StepManyTest, ClientGroupsTheStepsWaitingForANode) {
  int64_t calls = 0, steps = 0;
  RunWaitingSteps(/*group=*/true, &calls, &steps);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(steps, kSessions - 1);
  RunWaitingSteps(/*group=*/false, &calls, &steps);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(steps, 0);
}

// RemoteEndpoint::StepGroup (what the cohort carrier calls): the six
// sessions' decode steps, one for a session the node never saw and one with
// the wrong secret, in one StepMany call; each answer is its own, and the
// six equal single calls' and run as one batch.
TEST(StepManyTest, AGroupOfStepsIsOneCallWithItsOwnAnswers) {
  const auto want = SingleAnswers();
  Head head;
  RemoteEndpoint ep(head.server->bound_address(), ClientOptions{});
  for (int i = 0; i <= kSessions; ++i) ep.Step(Prefill(i));
  std::vector<mesh::StepRequest> steps;
  for (int i = 0; i < kSessions; ++i) steps.push_back(Decode(i));
  steps.push_back(Decode(8));                   // never opened: a miss
  steps.push_back(Decode(kSessions, "wrong"));  // open, with the wrong secret: an error
  std::vector<mesh::GroupAnswer> got = ep.StepGroup(steps);
  ASSERT_EQ(got.size(), steps.size());
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_FALSE(got[i].error) << i;
    ASSERT_TRUE(got[i].result.has_value()) << i;
    ExpectNear(std::get<shard::BoundaryBundle>(*got[i].result), want[i], i);
  }
  ASSERT_TRUE(got[kSessions].result.has_value());
  EXPECT_TRUE(std::holds_alternative<kv::CacheMiss>(*got[kSessions].result));
  ASSERT_TRUE(got[kSessions + 1].error);
  EXPECT_THROW(std::rethrow_exception(got[kSessions + 1].error), Error);
  const node::NodeCounters& c = head.server->counters();
  EXPECT_EQ(c.grouped_calls.load(), 1);
  EXPECT_EQ(c.grouped_steps.load(), kSessions + 2);
  EXPECT_EQ(head.Batches().back(), kSessions);  // the six decode steps: one batch
}

// A group of more steps than one call takes goes as calls of at most 32,
// one after another: each grouped step takes one of the node's per-peer call
// slots (32 by default), and one call of 40 had 8 steps refused as busy.
TEST(StepManyTest, AGroupLargerThanACallGoesInCallsOf32) {
  constexpr int kMany = 40;
  Head head;
  RemoteEndpoint ep(head.server->bound_address(), ClientOptions{});
  std::vector<mesh::StepRequest> steps;
  for (int i = 0; i < kMany; ++i) {
    char id[33];
    std::snprintf(id, sizeof(id), "%032x", 0x5e551000 + i);
    mesh::StepRequest p = Prefill(0);
    p.session_id = id;
    ep.Step(p);
    steps.push_back(Decode(0));
    steps.back().session_id = id;
  }
  const std::vector<mesh::GroupAnswer> got = ep.StepGroup(steps);
  ASSERT_EQ(got.size(), steps.size());
  for (int i = 0; i < kMany; ++i) {
    ASSERT_FALSE(got[i].error) << i;
    ASSERT_TRUE(got[i].result.has_value()) << i;
    EXPECT_TRUE(std::holds_alternative<shard::BoundaryBundle>(*got[i].result)) << i;
  }
  const node::NodeCounters& c = head.server->counters();
  EXPECT_EQ(c.grouped_calls.load(), 2);
  EXPECT_EQ(c.grouped_steps.load(), kMany);
}

// Both nodes of the shipped model (layers 0-1 and 2-4), each served on
// 127.0.0.1, with float32 KV; `observed` gets "h" or "t" per batch, in order.
struct TwoNodes {
  TwoNodes() : mesh(ShippedFile(), Head::Options(30.0), nullptr) {
    for (int i = 0; i < 2; ++i) {
      mesh.node(i).batcher().SetObserver([this, i](const node::BatchView&) {
        std::lock_guard<std::mutex> lock(mu);
        observed += i == 0 ? "h" : "t";
      });
      servers.push_back(std::make_unique<NodeServer>(&mesh.node(i), NodeServerOptions{}));
      servers.back()->Start();
    }
  }
  std::string Observed() {
    std::lock_guard<std::mutex> lock(mu);
    return observed;
  }
  mesh::InProcessMesh mesh;
  std::vector<std::unique_ptr<NodeServer>> servers;
  std::mutex mu;
  std::string observed;
};

// A session's decode step for the tail: the head's answer to Decode(i).
mesh::StepRequest TailDecode(int i, shard::BoundaryBundle bundle) {
  mesh::StepRequest r = Decode(i);
  r.token_ids.clear();
  r.bundle = std::move(bundle);
  return r;
}

// Every session prefilled on both nodes, on a thread of its own: a thread
// whose step came back counts as a session between steps (in transit) until
// it steps again or ends.
void OpenAll(RemoteEndpoint& head, RemoteEndpoint& tail) {
  std::thread([&] {
    for (int i = 0; i < kSessions; ++i) {
      auto b = std::get<shard::BoundaryBundle>(head.Step(Prefill(i)));
      mesh::StepRequest r = Prefill(i);
      r.token_ids.clear();
      r.bundle = std::move(b);
      tail.Step(r);
    }
  }).join();
}

// Both nodes behind one client with pipeline_depth 1, every session open,
// and session 0's head answer for its tail step.
class PipelineDepthOneTest : public ::testing::Test {
 protected:
  PipelineDepthOneTest()
      : gate(MakePipelineGate(Options())),
        head(nodes.servers[0]->bound_address(), Options(), gate),
        tail(nodes.servers[1]->bound_address(), Options(), gate) {
    OpenAll(head, tail);
    std::thread([&] { b0 = std::get<shard::BoundaryBundle>(head.Step(Decode(0))); }).join();
  }
  static ClientOptions Options() {
    ClientOptions co;
    co.pipeline_depth = 1;
    return co;
  }
  TwoNodes nodes;
  std::shared_ptr<util::RankGate> gate;
  RemoteEndpoint head, tail;
  shard::BoundaryBundle b0;
};

// pipeline_depth 1: while a call to the tail is out, the head's next call
// waits (the steps that come meanwhile join it), and goes when that one ends.
TEST_F(PipelineDepthOneTest, OneCallOutAtATime) {
  node::Batcher& tail_batcher = nodes.mesh.node(1).batcher();
  tail_batcher.Hold();
  std::vector<std::thread> threads;
  threads.emplace_back([&] { tail.Step(TailDecode(0, b0)); });
  tail_batcher.WaitPending(1);  // the tail's call is out
  const std::string before = nodes.Observed();
  for (int i = 1; i < kSessions; ++i) threads.emplace_back([&, i] { head.Step(Decode(i)); });
  Until([&] { return gate->waiters() == 1 && head.steps_waiting() == kSessions - 1; });
  EXPECT_EQ(gate->holders(), 1);
  EXPECT_EQ(nodes.Observed(), before);  // the head computed nothing meanwhile
  tail_batcher.Resume();
  for (auto& t : threads) t.join();
  EXPECT_EQ(nodes.Observed(), before + "th");
  EXPECT_EQ(nodes.servers[0]->counters().grouped_steps.load(), kSessions - 1);
  EXPECT_EQ(nodes.servers[0]->counters().grouped_calls.load(), 1);
  EXPECT_EQ(gate->holders(), 0);
}

// A free place goes to the call to the earliest layers.
TEST_F(PipelineDepthOneTest, TheEarliestLayersGoFirst) {
  const std::string before = nodes.Observed();
  gate->Acquire(0);  // the test holds the only place
  std::vector<std::thread> threads;
  threads.emplace_back([&] { tail.Step(TailDecode(0, b0)); });  // rank 2: first in line
  Until([&] { return gate->waiters() == 1; });
  threads.emplace_back([&] { head.Step(Decode(1)); });  // rank 0
  Until([&] { return gate->waiters() == 2; });
  gate->Release();
  for (auto& t : threads) t.join();
  EXPECT_EQ(nodes.Observed(), before + "ht");
}

// The members of a group call go on to the next node as one call: its
// leader counts them in transit before they wake (before, a member woken
// first led the next call before its siblings were counted, and went alone).
TEST(PipelineDepthTest, AGroupGoesOnAsOneCall) {
  TwoNodes nodes;
  ClientOptions co;
  co.transit_wait_s = 30;  // scheduling never ends the wait here; the count does
  RemoteEndpoint head(nodes.servers[0]->bound_address(), co);
  RemoteEndpoint tail(nodes.servers[1]->bound_address(), co);
  // A thread whose step came back is in transit until it steps again or ends
  // a session: this one's steps in earlier tests of the process end here.
  head.Release(SessionId(9), "secret", 0);
  OpenAll(head, tail);
  node::Batcher& head_batcher = nodes.mesh.node(0).batcher();
  head_batcher.Hold();
  std::vector<std::thread> threads;
  threads.emplace_back([&] { head.Step(Decode(0)); });  // session 0 stops after the head
  head_batcher.WaitPending(1);
  for (int i = 1; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      auto b = std::get<shard::BoundaryBundle>(head.Step(Decode(i)));
      tail.Step(TailDecode(i, std::move(b)));
    });
  }
  Until([&] { return head.steps_waiting() == kSessions - 1; });
  head_batcher.Resume();
  for (auto& t : threads) t.join();
  EXPECT_EQ(nodes.servers[1]->counters().grouped_calls.load(), 1);
  EXPECT_EQ(nodes.servers[1]->counters().grouped_steps.load(), kSessions - 1);
}

TEST(PipelineDepthTest, RefusesBadOptions) {
  ClientOptions co;
  co.pipeline_depth = -1;
  EXPECT_THROW(co.Validate(), Error);
  co.pipeline_depth = 0;
  EXPECT_EQ(MakePipelineGate(co), nullptr);
  co.transit_wait_s = -1;
  EXPECT_THROW(co.Validate(), Error);
}

}  // namespace
}  // namespace meshnet::rpc
