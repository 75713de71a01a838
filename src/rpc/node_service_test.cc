// NodeService without a network: the codec + NodeCore's validation + binding
// + idempotency path on the shipped stories260K model (5 layers, split 0-1 /
// 2-3 / 4-4).
#include "rpc/node_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "gguf/gguf_reader.h"
#include "mesh/generator.h"
#include "mesh/in_process.h"
#include "node/identity.h"
#include "rpc/test_util.h"
#include "util/thread_pool.h"

namespace meshnet::rpc {
namespace {

using ::testing::HasSubstr;

using node::ShippedFile;

mesh::InProcessMeshOptions Split(int64_t budget = 8 << 20) {
  mesh::InProcessMeshOptions o;
  o.split = {{0, 1}, {2, 3}, {4, 4}};
  o.kv_config.budget_bytes = budget;
  o.kv_config.max_sessions = 64;
  o.kv_dtype = KvDtype::kF32;  // the budgets in these tests count 4-byte K/V values
  return o;
}

// A ShardEndpoint that goes through the wire encoding and a NodeService, as a
// remote node does, without gRPC.
class CoreEndpoint final : public mesh::ShardEndpoint {
 public:
  explicit CoreEndpoint(NodeService* core) : core_(core) {}
  std::string name() const override { return "core"; }
  mesh::ShardInfo Info() override {
    pb::InfoResponse r;
    core_->Info(&r);
    return DecodeInfo(r);
  }
  mesh::StepResult Step(mesh::StepRequest request) override {
    pb::StepRequest req;
    EncodeStepRequest(request, KvDtype::kF32, KvDtype::kF32, true, &req);
    pb::StepResponse resp;
    core_->Step(req, &resp);
    return DecodeStepResponse(resp, request.route_epoch);
  }
  void Release(const std::string& id, const std::string& secret, int64_t epoch) override {
    pb::ReleaseRequest req;
    req.set_session_id(id);
    req.set_session_secret(secret);
    req.set_route_epoch(epoch);
    pb::ReleaseResponse resp;
    core_->Release(req, &resp);
  }

 private:
  NodeService* core_;
};

class NodeServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Build(Split()); }

  void Build(const mesh::InProcessMeshOptions& o, node::NodeCoreOptions co = {}) {
    cores_.clear();
    mesh_ = std::make_unique<mesh::InProcessMesh>(ShippedFile(), o, nullptr);
    for (int i = 0; i < 3; ++i) {
      cores_.push_back(std::make_unique<NodeService>(&mesh_->node(i), co));
    }
  }

  mesh::Route CoreRoute() {
    mesh::Route r;
    for (auto& c : cores_) r.hops.push_back(std::make_shared<CoreEndpoint>(c.get()));
    return r;
  }

  int64_t SeqLen(int i, const std::string& id, int64_t epoch) {
    auto r = mesh_->manager(i).Resolve(id, epoch);
    auto* h = std::get_if<kv::SessionHandle>(&r);
    return h ? h->seq_len() : -1;
  }

  // A head prefill request for `tokens`.
  pb::StepRequest HeadRequest(const std::string& id, const std::string& secret,
                              std::vector<int32_t> tokens, uint64_t step, bool prefill,
                              int64_t expected = 0) {
    mesh::StepRequest r;
    r.session_id = id;
    r.session_secret = secret;
    r.step_id = step;
    r.prefill = prefill;
    if (!prefill) r.expected_seq_len = expected;
    r.token_ids = std::move(tokens);
    pb::StepRequest req;
    EncodeStepRequest(r, KvDtype::kF32, KvDtype::kF32, false, &req);
    return req;
  }

  std::unique_ptr<mesh::InProcessMesh> mesh_;
  std::vector<std::unique_ptr<NodeService>> cores_;
};

const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378, 429};

TEST_F(NodeServiceTest, GenerationThroughTheWireMatchesInProcess) {
  for (float temperature : {0.0f, 0.8f}) {
    mesh::GenerateOptions o;
    o.max_tokens = 24;
    o.sampling.temperature = temperature;
    o.sampling.seed = 5;
    mesh::InProcessMesh reference(ShippedFile(), Split(), nullptr);
    mesh::FixedRouteProvider local(reference.route());
    const auto want = mesh::Generate(local, kPrompt, o).generated_ids;
    mesh::FixedRouteProvider wire(CoreRoute());
    const auto got = mesh::Generate(wire, kPrompt, o).generated_ids;
    EXPECT_EQ(got, want) << "temperature " << temperature;
    EXPECT_EQ(want.size(), 24u);
  }
}

TEST_F(NodeServiceTest, RetriedStepIsAnsweredFromTheFirstResult) {
  const std::string id = node::RandomId128();
  NodeService& head = *cores_[0];
  pb::StepResponse first, again;
  head.Step(HeadRequest(id, "s", kPrompt, 1, true), &first);
  ASSERT_TRUE(first.has_bundle());
  EXPECT_FALSE(first.replayed());
  EXPECT_EQ(SeqLen(0, id, 0), 6);
  head.Step(HeadRequest(id, "s", kPrompt, 1, true), &again);
  EXPECT_TRUE(again.replayed());
  EXPECT_EQ(again.bundle().payload(), first.bundle().payload());

  pb::StepResponse d1, d2;
  head.Step(HeadRequest(id, "s", {300}, 2, false, 6), &d1);
  ASSERT_TRUE(d1.has_bundle());
  EXPECT_EQ(SeqLen(0, id, 0), 7);
  head.Step(HeadRequest(id, "s", {300}, 2, false, 6), &d2);
  EXPECT_TRUE(d2.replayed());
  EXPECT_EQ(d2.bundle().payload(), d1.bundle().payload());
  EXPECT_EQ(SeqLen(0, id, 0), 7) << "a retried decode must not append twice";

  // The same key with a different input is refused, and changes nothing.
  pb::StepResponse bad;
  EXPECT_THROW(head.Step(HeadRequest(id, "s", {301}, 2, false, 6), &bad), Error);
  EXPECT_EQ(SeqLen(0, id, 0), 7);
  EXPECT_EQ(head.counters().steps_replayed.load(), 2);
}

TEST_F(NodeServiceTest, ConcurrentRetriesRunTheStepOnce) {
  const std::string id = node::RandomId128();
  NodeService& head = *cores_[0];
  pb::StepResponse p;
  head.Step(HeadRequest(id, "s", kPrompt, 1, true), &p);
  const pb::StepRequest decode = HeadRequest(id, "s", {42}, 2, false, 6);
  constexpr int kThreads = 6;
  std::vector<pb::StepResponse> out(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        head.Step(decode, &out[t]);
      } catch (const Error& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  int fresh = 0;
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(errors[t], "") << t;
    ASSERT_TRUE(out[t].has_bundle());
    EXPECT_EQ(out[t].bundle().payload(), out[0].bundle().payload());
    fresh += out[t].replayed() ? 0 : 1;
  }
  EXPECT_EQ(fresh, 1);
  EXPECT_EQ(SeqLen(0, id, 0), 7);
}

TEST_F(NodeServiceTest, WrongSecretIsRefusedEverywhere) {
  const std::string id = node::RandomId128();
  NodeService& head = *cores_[0];
  pb::StepResponse r;
  head.Step(HeadRequest(id, "owner", kPrompt, 1, true), &r);
  auto expect_denied = [](const std::function<void()>& f) {
    try {
      f();
      ADD_FAILURE() << "expected permission denied";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
    }
  };
  expect_denied([&] { head.Step(HeadRequest(id, "thief", {5}, 2, false, 6), &r); });
  expect_denied([&] { head.Step(HeadRequest(id, "thief", kPrompt, 3, true), &r); });
  // Even a replay of the owner's own step id needs the owner's secret.
  expect_denied([&] { head.Step(HeadRequest(id, "thief", kPrompt, 1, true), &r); });
  pb::TruncateRequest tr;
  tr.set_session_id(id);
  tr.set_session_secret("thief");
  tr.set_length(1);
  pb::TruncateResponse tresp;
  expect_denied([&] { head.Truncate(tr, &tresp); });
  pb::ReleaseRequest rr;
  rr.set_session_id(id);
  rr.set_session_secret("thief");
  pb::ReleaseResponse rresp;
  expect_denied([&] { head.Release(rr, &rresp); });
  EXPECT_EQ(SeqLen(0, id, 0), 6) << "nothing changed";

  tr.set_session_secret("owner");
  head.Truncate(tr, &tresp);
  EXPECT_EQ(tresp.seq_len(), 1);
  rr.set_session_secret("owner");
  head.Release(rr, &rresp);
  EXPECT_TRUE(rresp.released());
  EXPECT_EQ(SeqLen(0, id, 0), -1);
}

TEST_F(NodeServiceTest, MalformedInputIsRejectedAndChangesNothing) {
  const std::string id = node::RandomId128();
  // A real bundle from the head, then a good middle step to have state.
  pb::StepResponse h;
  cores_[0]->Step(HeadRequest(id, "s", kPrompt, 1, true), &h);
  ASSERT_TRUE(h.has_bundle());
  pb::StepRequest mid;
  mid.set_session_id(id);
  mid.set_session_secret("s");
  mid.set_step_id(1);
  mid.set_prefill(true);
  *mid.mutable_bundle() = h.bundle();
  pb::StepResponse ok;
  cores_[1]->Step(mid, &ok);
  ASSERT_TRUE(ok.has_bundle());
  const kv::HotKvStats before = mesh_->manager(1).Stats();

  struct Case {
    const char* what;
    std::function<void(pb::StepRequest&)> mutate;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"bad checksum", [](pb::StepRequest& r) { (*r.mutable_bundle()->mutable_payload())[3] ^= 1; },
       "checksum"},
      {"size vs shape", [](pb::StepRequest& r) { r.mutable_bundle()->set_n_tokens(5); }, "needs"},
      {"wrong dtype", [](pb::StepRequest& r) { r.mutable_bundle()->set_dtype(pb::Dtype(7)); },
       "dtype"},
      {"wrong next layer", [](pb::StepRequest& r) { r.mutable_bundle()->set_next_layer(3); },
       "layer"},
      {"normalized", [](pb::StepRequest& r) { r.mutable_bundle()->set_normalized(true); },
       "normalized"},
      {"epoch disagrees", [](pb::StepRequest& r) { r.mutable_bundle()->set_route_epoch(9); },
       "epoch"},
      {"tokens to a middle", [](pb::StepRequest& r) { r.mutable_tokens()->add_ids(1); }, "bundle"},
      {"bad session id", [](pb::StepRequest& r) { r.set_session_id("xyz"); }, "session id"},
  };
  for (const Case& c : cases) {
    pb::StepRequest bad = mid;
    bad.set_step_id(2);
    c.mutate(bad);
    pb::StepResponse resp;
    try {
      cores_[1]->Step(bad, &resp);
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const Error& e) {
      EXPECT_TRUE(e.kind() == ErrorKind::kInvalidArgument ||
                  e.kind() == ErrorKind::kBoundaryContract)
          << c.what << ": " << e.what();
      EXPECT_THAT(e.what(), HasSubstr(c.needle)) << c.what;
    }
    const kv::HotKvStats after = mesh_->manager(1).Stats();
    EXPECT_EQ(after.bytes_in_use, before.bytes_in_use) << c.what;
    EXPECT_EQ(after.live_sessions, before.live_sessions) << c.what;
    EXPECT_EQ(SeqLen(1, id, 0), 6) << c.what;
  }

  // Head-side problems.
  pb::StepResponse resp;
  EXPECT_THROW(cores_[0]->Step(HeadRequest(id, "s", {1, 512}, 2, true), &resp), Error);
  EXPECT_THROW(cores_[0]->Step(HeadRequest(id, "s", {-1}, 2, false, 6), &resp), Error);
  pb::StepRequest bundle_to_head = mid;
  EXPECT_THROW(cores_[0]->Step(bundle_to_head, &resp), Error);
  EXPECT_EQ(SeqLen(0, id, 0), 6);
}

TEST_F(NodeServiceTest, StepOverTheWholeBudgetIsInvalid) {
  // 2 owned layers * 2 * 4 kv heads * 8 dims * 4 bytes = 512 bytes per token,
  // 16-token blocks: 16 KiB holds two blocks (32 tokens).
  Build(Split(16 << 10));
  const std::string id = node::RandomId128();
  std::vector<int32_t> long_prompt(33, 7);
  pb::StepResponse resp;
  try {
    cores_[0]->Step(HeadRequest(id, "s", long_prompt, 1, true), &resp);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    EXPECT_THAT(e.what(), HasSubstr("budget"));
  }
  EXPECT_EQ(mesh_->manager(0).Stats().live_sessions, 0);
  long_prompt.resize(32);
  cores_[0]->Step(HeadRequest(id, "s", long_prompt, 1, true), &resp);
  EXPECT_TRUE(resp.has_bundle());
}

TEST_F(NodeServiceTest, UnboundSessionsMissAndBindingsAreBounded) {
  node::NodeCoreOptions co;
  co.max_bindings = 2;
  Build(Split(), co);
  NodeService& head = *cores_[0];
  pb::StepResponse r;
  // A decode for a session nobody opened: a miss, not an error.
  head.Step(HeadRequest(node::RandomId128(), "s", {3}, 1, false, 0), &r);
  ASSERT_TRUE(r.has_miss());
  EXPECT_EQ(r.miss().reason(), pb::CACHE_MISS_UNKNOWN_SESSION);

  const std::string a = node::RandomId128(), b = node::RandomId128(), c = node::RandomId128();
  for (const auto& id : {a, b, c}) head.Step(HeadRequest(id, "s", kPrompt, 1, true), &r);
  EXPECT_EQ(head.bindings(), 2);
  EXPECT_EQ(SeqLen(0, a, 0), -1) << "dropping a binding releases its state";
  EXPECT_EQ(SeqLen(0, c, 0), 6);
  r.Clear();
  head.Step(HeadRequest(a, "other", {3}, 2, false, 6), &r);
  EXPECT_TRUE(r.has_miss()) << "an unbound id is a miss for anyone, never someone else's state";
}

TEST_F(NodeServiceTest, InfoDescribesTheShard) {
  pb::InfoResponse info;
  cores_[1]->Info(&info);
  EXPECT_EQ(info.start_layer(), 2);
  EXPECT_EQ(info.end_layer(), 3);
  EXPECT_EQ(info.total_layers(), 5);
  EXPECT_EQ(info.architecture(), "llama");
  EXPECT_EQ(info.model_id(), node::ModelIdentity(*ShippedFile()));
  EXPECT_EQ(info.recipe_fingerprint(), mesh_->adapter(1).recipe().Fingerprint());
  EXPECT_EQ(info.kv_budget_bytes(), 8 << 20);
  EXPECT_EQ(info.kv_bytes_free(), 8 << 20);
  EXPECT_GT(info.kv_tokens_free(), 0);
  EXPECT_EQ(info.protocol_version(), 1u);
  EXPECT_EQ(info.instance_id().size(), 32u);
  EXPECT_EQ(info.vocab_size(), 512);
}

}  // namespace
}  // namespace meshnet::rpc
