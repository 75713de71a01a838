// RemoteRouteProvider's survey of the nodes (ClientOptions::survey_max_age_s):
// plans within the age reuse one survey and count the sessions planned since
// as load, concurrent plans share one survey in flight, and a survey with a
// silent node, or a node marked dead, is not reused. The nodes are fake
// MeshNode services that answer Info only and count the calls, on 127.0.0.1.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "proto/meshnet.grpc.pb.h"
#include "rpc/codec.h"
#include "rpc/remote.h"
#include "util/error.h"

namespace meshnet::rpc {
namespace {

// Answers Info for layers [start, end] of a 4-layer model; counts the calls.
class InfoOnlyNode final : public pb::MeshNode::Service {
 public:
  InfoOnlyNode(int start, int end) {
    info_.shard.model_id = "fake-model";
    info_.shard.architecture = "llama";
    info_.shard.start_layer = start;
    info_.shard.end_layer = end;
    info_.shard.total_layers = 4;
    info_.instance_id = "fake-" + std::to_string(start) + "-" + std::to_string(end);
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  ~InfoOnlyNode() override { server_->Shutdown(); }

  grpc::Status Info(grpc::ServerContext*, const pb::InfoRequest*, pb::InfoResponse* out) override {
    calls_.fetch_add(1);
    EncodeNodeInfo(info_, out);
    return grpc::Status::OK;
  }

  const std::string& address() const { return address_; }
  int calls() const { return calls_.load(); }

 private:
  node::NodeInfo info_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::atomic<int> calls_{0};
};

ClientOptions Options(double max_age_s) {
  ClientOptions co;
  co.info_timeout_s = 20.0;  // sanitized builds on a busy machine
  co.connect_timeout_s = 5.0;
  co.survey_max_age_s = max_age_s;
  return co;
}

std::vector<std::string> Names(const mesh::Route& r) {
  std::vector<std::string> out;
  for (const auto& hop : r.hops) out.push_back(hop->name());
  return out;
}

TEST(RouteSurveyTest, PlansWithinTheAgeShareOneSurvey) {
  InfoOnlyNode head(0, 1), tail(2, 3);
  const std::vector<std::string> addresses = {head.address(), tail.address()};
  auto provider = MakeRemoteRouteProvider(addresses, Options(600));
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(Names(provider->Plan()), addresses);
  }
  EXPECT_EQ(head.calls(), 1);
  EXPECT_EQ(tail.calls(), 1);

  // Age 0: every plan asks every node (the behaviour before the cache).
  auto every = MakeRemoteRouteProvider(addresses, Options(0));
  for (int i = 0; i < 3; ++i) every->Plan();
  EXPECT_EQ(head.calls(), 4);
  EXPECT_EQ(tail.calls(), 4);
}

TEST(RouteSurveyTest, ConcurrentPlansShareTheSurveyInFlight) {
  InfoOnlyNode head(0, 1), tail(2, 3);
  auto provider = MakeRemoteRouteProvider({head.address(), tail.address()}, Options(600));
  std::vector<std::thread> threads;
  std::atomic<int> planned{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      if (provider->Plan().hops.size() == 2) planned.fetch_add(1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(planned.load(), 8);
  EXPECT_EQ(head.calls(), 1);
  EXPECT_EQ(tail.calls(), 1);
}

TEST(RouteSurveyTest, SessionsPlannedFromOneSurveySpreadOverReplicas) {
  // Two replicas of each range, equally loaded in the survey: without the
  // sessions planned since counted as load, every plan would pick the same
  // (lexicographically first) replicas.
  InfoOnlyNode head_a(0, 1), head_b(0, 1), tail_a(2, 3), tail_b(2, 3);
  auto provider = MakeRemoteRouteProvider(
      {head_a.address(), head_b.address(), tail_a.address(), tail_b.address()}, Options(600));
  std::map<std::string, int> uses;
  for (int i = 0; i < 8; ++i) {
    for (const std::string& name : Names(provider->Plan())) ++uses[name];
  }
  for (const InfoOnlyNode* n : {&head_a, &head_b, &tail_a, &tail_b}) {
    EXPECT_EQ(uses[n->address()], 4) << n->address();
    EXPECT_EQ(n->calls(), 1) << n->address();
  }
}

TEST(RouteSurveyTest, ADeadMarkOrASilentNodeIsNotReused) {
  InfoOnlyNode head(0, 1), tail(2, 3), spare_tail(2, 3);
  auto provider =
      MakeRemoteRouteProvider({head.address(), tail.address(), spare_tail.address()}, Options(600));
  const mesh::Route first = provider->Plan();
  ASSERT_EQ(first.hops.size(), 2u);
  const std::string used_tail = first.hops[1]->name();
  provider->MarkDead(*first.hops[1]);
  const mesh::Route second = provider->Plan();  // asks again: the dead tail is left out
  ASSERT_EQ(second.hops.size(), 2u);
  EXPECT_NE(second.hops[1]->name(), used_tail);
  EXPECT_EQ(head.calls(), 2);

  // A node that does not answer: each plan asks again (it may be back).
  ClientOptions quick = Options(600);
  quick.info_timeout_s = 0.5;
  quick.connect_timeout_s = 0.2;
  auto partial = MakeRemoteRouteProvider({head.address(), tail.address(), "127.0.0.1:1"}, quick);
  partial->Plan();
  partial->Plan();
  EXPECT_EQ(head.calls(), 4);
}

TEST(RouteSurveyTest, MaxAgeIsValidated) {
  for (double bad : {-1.0, 1e9, std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_THROW(Options(bad).Validate(), Error) << bad;
  }
  EXPECT_NO_THROW(Options(0).Validate());
}

}  // namespace
}  // namespace meshnet::rpc
