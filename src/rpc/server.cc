// NodeServer: the MeshNode service over NodeService (node::NodeCore), the
// health service and the metrics exposer. The service methods only check the
// cluster token, delegate to NodeService and turn meshnet::Error into a gRPC
// status (rpc/status.h).
#include "rpc/server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <prometheus/exposer.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "node/node.h"
#include "proto/meshnet.grpc.pb.h"
#include "rpc/auth.h"
#include "rpc/codec.h"
#include "rpc/metrics.h"
#include "rpc/node_service.h"
#include "rpc/status.h"
#include "util/error.h"
#include "util/secret.h"

namespace meshnet::rpc {

namespace {

constexpr int kMetricsThreads = 8;
constexpr int kMetricsRequestTimeoutMs = 3000;

// "host:port" -> host ("[::1]:0" -> "[::1]").
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

class MeshNodeService final : public pb::MeshNode::Service {
 public:
  MeshNodeService(NodeService* core, const std::string& auth_token)
      : core_(core),
        token_digest_(auth_token.empty() ? "" : SecretDigest(BearerValue(auth_token))) {}

  grpc::Status Info(grpc::ServerContext* ctx, const pb::InfoRequest*,
                    pb::InfoResponse* out) override {
    return Run(ctx, [&] { core_->Info(out); });
  }

  grpc::Status Step(grpc::ServerContext* ctx, const pb::StepRequest* req,
                    pb::StepResponse* out) override {
    return Run(ctx, [&] { core_->Step(*req, out); });
  }

  grpc::Status StepStream(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<pb::StepResponse, pb::StepRequest>* stream) override {
    if (grpc::Status s = CheckToken(ctx); !s.ok()) return s;
    pb::StepRequest req;
    pb::StepResponse out;
    while (stream->Read(&req)) {
      out.Clear();
      grpc::Status s = Run(
          ctx, [&] { core_->Step(req, &out); }, /*check_token=*/false);
      if (!s.ok()) return s;
      if (!stream->Write(out)) break;
    }
    return grpc::Status::OK;
  }

  grpc::Status Truncate(grpc::ServerContext* ctx, const pb::TruncateRequest* req,
                        pb::TruncateResponse* out) override {
    return Run(ctx, [&] { core_->Truncate(*req, out); });
  }

  grpc::Status Release(grpc::ServerContext* ctx, const pb::ReleaseRequest* req,
                       pb::ReleaseResponse* out) override {
    return Run(ctx, [&] { core_->Release(*req, out); });
  }

 private:
  grpc::Status CheckToken(grpc::ServerContext* ctx) const {
    if (token_digest_.empty()) return grpc::Status::OK;
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    const std::string presented =
        it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
    // Digest comparison: constant time in the token's content and length.
    if (!SecretMatches(presented, token_digest_)) {
      core_->counters().CountError(ErrorKind::kPermissionDenied);
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong cluster token");
    }
    return grpc::Status::OK;
  }

  template <typename F>
  grpc::Status Run(grpc::ServerContext* ctx, F&& body, bool check_token = true) {
    if (check_token) {
      if (grpc::Status s = CheckToken(ctx); !s.ok()) return s;
    }
    try {
      body();
      return grpc::Status::OK;
    } catch (const Error& e) {
      spdlog::debug("event=call_failed peer={} kind={} message=\"{}\"", ctx->peer(),
                    ErrorKindName(e.kind()), e.what());
      return ToStatus(e, ctx);
    } catch (const std::exception& e) {
      spdlog::error("event=call_crashed peer={} message=\"{}\"", ctx->peer(), e.what());
      return grpc::Status(grpc::StatusCode::INTERNAL, e.what());
    }
  }

  NodeService* core_;
  std::string token_digest_;  // SHA-256 of "Bearer <token>"; empty: no token required
};

}  // namespace

struct NodeServer::Impl {
  NodeServerOptions options;
  NodeService node_service;
  MeshNodeService service;
  std::shared_ptr<NodeMetrics> metrics;
  std::unique_ptr<prometheus::Exposer> exposer;
  std::unique_ptr<grpc::Server> server;
  std::string bound;
  std::string metrics_bound;
  std::mutex shutdown_mu;
  bool stopped = false;

  Impl(node::Node* node, NodeServerOptions opts)
      : options(std::move(opts)),
        node_service(node, node::NodeCoreOptions{options.max_bindings, options.replay_cache_bytes}),
        service(&node_service, options.auth_token) {}
};

NodeServer::NodeServer(node::Node* node, NodeServerOptions options) {
  options.Validate();
  impl_ = std::make_unique<Impl>(node, std::move(options));
}

NodeServer::~NodeServer() { Shutdown(0); }

void NodeServer::Start() {
  Impl& m = *impl_;
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (!m.options.tls_cert.empty()) {
    grpc::SslServerCredentialsOptions ssl(
        m.options.tls_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                 : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    if (!m.options.tls_ca.empty()) {
      ssl.pem_root_certs = ReadPemFile(m.options.tls_ca, "TLS CA");
    }
    ssl.pem_key_cert_pairs.push_back({ReadPemFile(m.options.tls_key, "TLS key"),
                                      ReadPemFile(m.options.tls_cert, "TLS certificate")});
    creds = grpc::SslServerCredentials(ssl);
  } else {
    creds = grpc::InsecureServerCredentials();
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(m.options.listen, creds, &port);
  builder.RegisterService(&m.service);
  // gRPC sets SO_REUSEPORT by default: a second node on the same port would
  // bind too and take a share of this one's connections. Off: it fails.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  grpc::ResourceQuota quota("meshnet-node");
  quota.SetMaxThreads(m.options.max_rpc_threads);
  builder.SetResourceQuota(quota);
  m.server = builder.BuildAndStart();
  if (!m.server || port == 0) {
    m.server.reset();
    throw Error(ErrorKind::kUnavailable,
                "cannot listen on '" + m.options.listen + "' (address in use, or not host:port?)");
  }
  m.bound = HostOf(m.options.listen) + ":" + std::to_string(port);
  if (auto* health = m.server->GetHealthCheckService()) health->SetServingStatus(true);

  if (!m.options.metrics_listen.empty()) {
    try {
      // civetweb's defaults (2 threads, 30 s read timeout) let two half-open
      // requests block /metrics for 30 s: more threads, a short timeout.
      m.exposer = std::make_unique<prometheus::Exposer>(
          std::vector<std::string>{"listening_ports", m.options.metrics_listen, "num_threads",
                                   std::to_string(kMetricsThreads), "request_timeout_ms",
                                   std::to_string(kMetricsRequestTimeoutMs)});
    } catch (const std::exception& e) {
      Shutdown(0);
      throw Error(ErrorKind::kUnavailable,
                  "cannot serve metrics on '" + m.options.metrics_listen + "': " + e.what());
    }
    m.metrics = std::make_shared<NodeMetrics>(&m.node_service.core());
    m.exposer->RegisterCollectable(m.metrics);
    const auto ports = m.exposer->GetListeningPorts();
    m.metrics_bound =
        HostOf(m.options.metrics_listen) + ":" + std::to_string(ports.empty() ? 0 : ports.front());
  }
  spdlog::info("event=serving node={} layers={}-{} listen={} tls={} mtls={} token={} metrics={}",
               m.node_service.core().instance_id().substr(0, 8),
               m.node_service.core().node().role().start_layer,
               m.node_service.core().node().role().end_layer, m.bound, !m.options.tls_cert.empty(),
               !m.options.tls_ca.empty(), !m.options.auth_token.empty(),
               m.metrics_bound.empty() ? "off" : m.metrics_bound);
}

std::string NodeServer::bound_address() const { return impl_->bound; }
std::string NodeServer::metrics_address() const { return impl_->metrics_bound; }
std::string NodeServer::instance_id() const { return impl_->node_service.core().instance_id(); }

void NodeServer::Shutdown(double grace_seconds) {
  if (!impl_) return;
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.shutdown_mu);
  if (m.stopped) return;
  m.stopped = true;
  if (m.server) {
    if (auto* health = m.server->GetHealthCheckService()) health->SetServingStatus(false);
    const auto deadline =
        std::chrono::system_clock::now() +
        std::chrono::milliseconds(static_cast<int64_t>(
            std::clamp(grace_seconds, 0.0, 365.0 * 24 * 3600) * 1000));  // no int64 overflow
    m.server->Shutdown(deadline);  // waits for in-flight calls until the deadline
    m.server->Wait();
    spdlog::info("event=drained listen={}", m.bound);
  }
  m.exposer.reset();
}

}  // namespace meshnet::rpc
