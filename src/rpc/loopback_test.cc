// Three gRPC nodes in this process on 127.0.0.1 (port 0), a remote route over
// them, and the wire-level contract: status codes, cluster token, TLS and
// mutual TLS, health, metrics, idempotent retries, the stream variant.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "gguf/gguf_reader.h"
#include "mesh/generator.h"
#include "mesh/in_process.h"
#include "node/identity.h"
#include "proto/meshnet.grpc.pb.h"
#include "rpc/codec.h"
#include "rpc/remote.h"
#include "rpc/server.h"
#include "rpc/status.h"
#include "rpc/test_util.h"
#include "util/error.h"

namespace meshnet::rpc {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;

using node::ShippedFile;

const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378, 429};

mesh::InProcessMeshOptions Split(int64_t budget = 8 << 20) {
  mesh::InProcessMeshOptions o;
  o.split = {{0, 1}, {2, 3}, {4, 4}};
  o.kv_config.budget_bytes = budget;
  o.kv_dtype = KvDtype::kF32;  // the budgets in these tests count 4-byte K/V values
  return o;
}

// Generous deadlines: sanitized builds on a busy machine are slow.
ClientOptions Roomy() {
  ClientOptions co;
  co.info_timeout_s = 20.0;
  co.connect_timeout_s = 5.0;
  return co;
}

std::vector<int32_t> InProcessTokens(const mesh::GenerateOptions& o) {
  mesh::InProcessMesh reference(ShippedFile(), Split(), nullptr);
  mesh::FixedRouteProvider p(reference.route());
  return mesh::Generate(p, kPrompt, o).generated_ids;
}

// Three nodes serving 0-1, 2-3, 4-4 of the shipped model.
struct Nodes {
  // `metrics_on_tail`: only the tail exposes /metrics (stopping an exposer
  // takes up to civetweb's 2 s poll quantum).
  explicit Nodes(const NodeServerOptions& base, int64_t budget = 8 << 20,
                 bool metrics_on_tail = false)
      : mesh(ShippedFile(), Split(budget), nullptr) {
    for (int i = 0; i < 3; ++i) {
      NodeServerOptions o = base;
      if (metrics_on_tail && i == 2) o.metrics_listen = "127.0.0.1:0";
      servers.push_back(std::make_unique<NodeServer>(&mesh.node(i), o));
      servers.back()->Start();
      addresses.push_back(servers.back()->bound_address());
    }
  }
  mesh::InProcessMesh mesh;
  std::vector<std::unique_ptr<NodeServer>> servers;
  std::vector<std::string> addresses;
};

std::unique_ptr<pb::MeshNode::Stub> RawStub(const std::string& address) {
  return pb::MeshNode::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

pb::StepRequest HeadPrefill(const std::string& id, const std::string& secret, int64_t epoch,
                            uint64_t step, std::vector<int32_t> tokens = kPrompt) {
  mesh::StepRequest r;
  r.session_id = id;
  r.session_secret = secret;
  r.route_epoch = epoch;
  r.step_id = step;
  r.prefill = true;
  r.token_ids = std::move(tokens);
  pb::StepRequest req;
  EncodeStepRequest(r, KvDtype::kF32, KvDtype::kF32, false, &req);
  return req;
}

std::string Trailer(const grpc::ClientContext& ctx) {
  const auto& t = ctx.GetServerTrailingMetadata();
  auto it = t.find(kErrorKindKey);
  return it == t.end() ? "" : std::string(it->second.data(), it->second.size());
}

TEST(LoopbackTest, RemoteRouteMatchesInProcessTokenForToken) {
  Nodes nodes(NodeServerOptions{});
  auto provider = MakeRemoteRouteProvider(nodes.addresses, Roomy());
  for (float temperature : {0.0f, 0.9f}) {
    mesh::GenerateOptions o;
    o.max_tokens = 32;
    o.sampling.temperature = temperature;
    o.sampling.seed = 17;
    const auto want = InProcessTokens(o);
    const auto got = mesh::Generate(*provider, kPrompt, o);
    EXPECT_EQ(got.generated_ids, want) << "temperature " << temperature;
    EXPECT_EQ(got.final_route,
              nodes.addresses[0] + " -> " + nodes.addresses[1] + " -> " + nodes.addresses[2]);
  }
  // Released at the end: no node holds state.
  for (auto& ep : provider->endpoints()) EXPECT_EQ(ep->Info().live_sessions, 0);
}

// Penalties and logit bias over gRPC, with a client that does not ask for
// logits by default: those steps ask for the tail's row (omit_logits off),
// and the tokens equal the in-process route's.
TEST(LoopbackTest, AdjustedSamplingAsksForTheLogitsRow) {
  Nodes nodes(NodeServerOptions{});
  auto provider = MakeRemoteRouteProvider(nodes.addresses, Roomy());
  mesh::GenerateOptions o;
  o.max_tokens = 24;
  o.adjustments.frequency_penalty = 1.5f;
  o.adjustments.bias = {{300, 8.0f}};
  o.sampling.temperature = 0.8f;
  o.sampling.seed = 5;
  const auto want = InProcessTokens(o);
  EXPECT_EQ(mesh::Generate(*provider, kPrompt, o).generated_ids, want);
  mesh::GenerateOptions plain;
  plain.max_tokens = 24;
  EXPECT_NE(InProcessTokens(plain), want);
}

TEST(LoopbackTest, HalfPrecisionWireRuns) {
  Nodes nodes(NodeServerOptions{});
  for (KvDtype t : {KvDtype::kF16, KvDtype::kBF16}) {
    ClientOptions co = Roomy();
    co.wire_dtype = t;
    auto provider = MakeRemoteRouteProvider(nodes.addresses, co);
    mesh::GenerateOptions o;
    o.max_tokens = 8;
    EXPECT_EQ(mesh::Generate(*provider, kPrompt, o).generated_ids.size(), 8u);
  }
}

TEST(LoopbackTest, StatusCodesOnTheWire) {
  Nodes nodes(NodeServerOptions{}, 16 << 10);  // head/middle hold 32 tokens
  auto head = RawStub(nodes.addresses[0]);
  const std::string id = node::RandomId128();

  {  // open at epoch 2
    grpc::ClientContext ctx;
    pb::StepResponse resp;
    ASSERT_TRUE(head->Step(&ctx, HeadPrefill(id, "s", 2, 1), &resp).ok());
    ASSERT_TRUE(resp.has_bundle());
  }
  {  // malformed: INVALID_ARGUMENT
    grpc::ClientContext ctx;
    pb::StepResponse resp;
    auto req = HeadPrefill(id, "s", 2, 2, {1, 99999});
    const grpc::Status s = head->Step(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(Trailer(ctx), "invalid-argument");
  }
  {  // wrong secret: PERMISSION_DENIED
    grpc::ClientContext ctx;
    pb::StepResponse resp;
    EXPECT_EQ(head->Step(&ctx, HeadPrefill(id, "x", 2, 3), &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {  // stale epoch: ABORTED, and the client maps it back
    grpc::ClientContext ctx;
    pb::StepResponse resp;
    EXPECT_EQ(head->Step(&ctx, HeadPrefill(id, "s", 1, 4), &resp).error_code(),
              grpc::StatusCode::ABORTED);
    EXPECT_EQ(Trailer(ctx), "stale-epoch");
    RemoteEndpoint ep(nodes.addresses[0], Roomy());
    mesh::StepRequest r;
    r.session_id = id;
    r.session_secret = "s";
    r.route_epoch = 1;
    r.step_id = 5;
    r.prefill = true;
    r.token_ids = kPrompt;
    try {
      ep.Step(r);
      ADD_FAILURE() << "stale epoch accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kStaleEpoch) << e.what();
    }
  }
  {  // Truncate of a session that is gone: NOT_FOUND with the miss
    RemoteEndpoint ep(nodes.addresses[0], Roomy());
    try {
      ep.Truncate(node::RandomId128(), "s", 0, 1);
      ADD_FAILURE() << "truncate of nothing succeeded";
    } catch (const kv::CacheMissError& e) {
      EXPECT_EQ(e.miss().reason, kv::CacheMissReason::kUnknownSession);
    }
    EXPECT_EQ(ep.Truncate(id, "s", 2, 2), 2);
  }
  {  // a session growing past the budget: RESOURCE_EXHAUSTED (evicts `id`: run last)
    const std::string big = node::RandomId128();
    grpc::ClientContext ctx;
    pb::StepResponse resp;
    ASSERT_TRUE(
        head->Step(&ctx, HeadPrefill(big, "s", 0, 1, std::vector<int32_t>(32, 5)), &resp).ok());
    grpc::ClientContext ctx2;
    auto more = HeadPrefill(big, "s", 0, 2, {5});
    more.set_prefill(false);
    more.set_has_expected_seq_len(true);
    more.set_expected_seq_len(32);
    EXPECT_EQ(head->Step(&ctx2, more, &resp).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_EQ(Trailer(ctx2), "budget-exceeded");
  }
}

TEST(LoopbackTest, RetriedStepIsReplayedNotRerun) {
  Nodes nodes(NodeServerOptions{});
  auto head = RawStub(nodes.addresses[0]);
  const std::string id = node::RandomId128();
  pb::StepResponse a, b;
  grpc::ClientContext c1, c2;
  const auto req = HeadPrefill(id, "s", 0, 1);
  ASSERT_TRUE(head->Step(&c1, req, &a).ok());
  ASSERT_TRUE(head->Step(&c2, req, &b).ok());
  EXPECT_FALSE(a.replayed());
  EXPECT_TRUE(b.replayed());
  EXPECT_EQ(a.bundle().payload(), b.bundle().payload());
}

TEST(LoopbackTest, StreamVariantAnswersInOrder) {
  Nodes nodes(NodeServerOptions{});
  auto head = RawStub(nodes.addresses[0]);
  grpc::ClientContext ctx;
  auto stream = head->StepStream(&ctx);
  const std::string id = node::RandomId128();
  pb::StepResponse resp;
  ASSERT_TRUE(stream->Write(HeadPrefill(id, "s", 0, 1)));
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_TRUE(resp.has_bundle());
  EXPECT_EQ(resp.bundle().n_tokens(), 6);
  auto dec = HeadPrefill(id, "s", 0, 2, {7});
  dec.set_prefill(false);
  dec.set_has_expected_seq_len(true);
  dec.set_expected_seq_len(6);
  ASSERT_TRUE(stream->Write(dec));
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_EQ(resp.bundle().positions(0), 6);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(LoopbackTest, ClusterTokenIsCheckedOnEveryCall) {
  NodeServerOptions so;
  so.auth_token = "correct horse";
  Nodes nodes(so);
  for (const char* token : {"", "wrong", "correct hors", "correct horse!"}) {
    ClientOptions co = Roomy();
    co.auth_token = token;
    RemoteEndpoint ep(nodes.addresses[0], co);
    try {
      ep.Info();
      ADD_FAILURE() << "token '" << token << "' accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
    }
    mesh::StepRequest r;
    r.session_id = node::RandomId128();
    r.session_secret = "s";
    r.prefill = true;
    r.token_ids = kPrompt;
    EXPECT_THROW(ep.Step(r), Error);
    try {
      MakeRemoteRouteProvider(nodes.addresses, co)->Plan();
      ADD_FAILURE() << "planned with token '" << token << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kPermissionDenied) << e.what();
    }
  }
  ClientOptions co = Roomy();
  co.auth_token = "correct horse";
  auto provider = MakeRemoteRouteProvider(nodes.addresses, co);
  mesh::GenerateOptions o;
  o.max_tokens = 8;
  EXPECT_EQ(mesh::Generate(*provider, kPrompt, o).generated_ids, InProcessTokens(o));
}

TEST(LoopbackTest, TlsAndMutualTls) {
  ScratchDir dir;
  const testing::TestPki pki = testing::MakeTestPki(dir);
  mesh::GenerateOptions o;
  o.max_tokens = 6;
  const auto want = InProcessTokens(o);
  auto run = [&](const std::vector<std::string>& addrs, const ClientOptions& co) {
    auto p = MakeRemoteRouteProvider(addrs, co);
    return mesh::Generate(*p, kPrompt, o).generated_ids;
  };
  // Calls expected to fail wait out a short deadline (Info waits for a
  // connection that never becomes ready); calls expected to succeed get room
  // for slow (sanitized) builds.
  ClientOptions quick;
  quick.info_timeout_s = 1.0;
  quick.connect_timeout_s = 0.5;
  ClientOptions roomy;
  roomy.info_timeout_s = 20.0;

  NodeServerOptions tls;
  tls.tls_cert = pki.server_cert;
  tls.tls_key = pki.server_key;
  {
    Nodes nodes(tls);
    ClientOptions co = roomy;
    co.tls_ca = pki.ca_cert;
    EXPECT_EQ(run(nodes.addresses, co), want);
    EXPECT_THROW(run(nodes.addresses, quick), Error) << "plaintext client on a TLS node";
    co = quick;
    co.tls_ca = pki.other_ca_cert;
    EXPECT_THROW(run(nodes.addresses, co), Error) << "node cert from an untrusted CA";
  }
  NodeServerOptions mtls = tls;
  mtls.tls_ca = pki.ca_cert;
  {
    Nodes nodes(mtls);
    ClientOptions co = quick;
    co.tls_ca = pki.ca_cert;
    EXPECT_THROW(run(nodes.addresses, co), Error) << "no client certificate";
    co.tls_cert = pki.other_client_cert;
    co.tls_key = pki.other_client_key;
    EXPECT_THROW(run(nodes.addresses, co), Error) << "client cert from another CA";
    co.tls_cert = pki.client_cert;
    co.tls_key = pki.client_key;
    co.info_timeout_s = roomy.info_timeout_s;
    EXPECT_EQ(run(nodes.addresses, co), want);
  }
  ClientOptions bad = quick;
  bad.tls_ca = dir.file("missing.pem");
  EXPECT_THROW(RemoteEndpoint("127.0.0.1:1", bad), Error);
}

TEST(LoopbackTest, HealthAndMetrics) {
  Nodes nodes(NodeServerOptions{}, 8 << 20, /*metrics_on_tail=*/true);
  {  // grpc.health.v1.Health/Check with an empty request -> status SERVING (field 1 = 1)
    auto channel = grpc::CreateChannel(nodes.addresses[1], grpc::InsecureChannelCredentials());
    grpc::GenericStub stub(channel);
    grpc::ClientContext ctx;
    grpc::ByteBuffer request, response;
    grpc::Slice empty("", 0);
    request = grpc::ByteBuffer(&empty, 1);
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) {
                     std::lock_guard<std::mutex> l(mu);
                     status = s;
                     done = true;
                     cv.notify_one();
                   });
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return done; });
    ASSERT_TRUE(status.ok()) << status.error_message();
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(response.Dump(&slices).ok());
    std::string bytes;
    for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    EXPECT_EQ(bytes, std::string("\x08\x01", 2));
  }
  auto provider = MakeRemoteRouteProvider(nodes.addresses, Roomy());
  mesh::GenerateOptions o;
  o.max_tokens = 5;
  o.release_at_end = false;
  mesh::Generate(*provider, kPrompt, o);
  const std::string text = testing::HttpGet(nodes.servers[2]->metrics_address(), "/metrics");
  ASSERT_THAT(text, HasSubstr("meshnet_kv_bytes_budget"));
  EXPECT_EQ(testing::MetricValue(text, "meshnet_steps_total{result=\"tail\"}"), 5);
  EXPECT_EQ(testing::MetricValue(text, "meshnet_kv_live_sessions"), 1);
  EXPECT_EQ(testing::MetricValue(text, "meshnet_kv_bytes_budget"), 8 << 20);
  EXPECT_GT(testing::MetricValue(text, "meshnet_kv_bytes_reserved"), 0);
  EXPECT_EQ(testing::MetricValue(text, "meshnet_kv_misses_total{reason=\"evicted-lru\"}"), 0);
  EXPECT_EQ(testing::MetricValue(text, "meshnet_step_latency_seconds_count"), 5);
  // Continuous batching: a lone session's prompt and its 4 decode steps, one
  // batch each.
  EXPECT_EQ(testing::MetricValue(text, "meshnet_batches_total"), 5);
  EXPECT_EQ(testing::MetricValue(text, "meshnet_batch_steps_total"), 5);
  EXPECT_EQ(testing::MetricValue(text, "meshnet_batch_rows_total"),
            static_cast<double>(std::size(kPrompt) + 4));
  EXPECT_EQ(testing::MetricValue(text, "meshnet_batch_max_sessions"), 1);
  EXPECT_GT(testing::MetricValue(text, "meshnet_batch_busy_seconds_total"), 0);
}

}  // namespace
}  // namespace meshnet::rpc
