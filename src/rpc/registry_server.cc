#include "rpc/registry_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "proto/meshnet.grpc.pb.h"
#include "rpc/auth.h"
#include "rpc/grpc_listen.h"
#include "rpc/registry_codec.h"
#include "rpc/remote.h"
#include "rpc/server.h"
#include "rpc/server_auth.h"
#include "rpc/status.h"
#include "util/error.h"
#include "util/mutex.h"
#include "util/secret.h"

namespace meshnet::rpc {

namespace {

constexpr double kMaxWaitS = 60.0;

class RegistryService final : public pb::Registry::Service {
 public:
  RegistryService(registry::MemoryRegistry* reg, const std::string& token)
      : reg_(reg), token_digest_(token.empty() ? "" : SecretDigest(BearerValue(token))) {}

  grpc::Status Announce(grpc::ServerContext* ctx, const pb::RegistryAnnounceRequest* req,
                        pb::RegistryAnnounceResponse* out) override {
    return Run(ctx, [&] {
      const registry::NodeRecord r = DecodeRecord(req->record());
      out->set_lease(reg_->Announce(r, req->ttl_s()));
      spdlog::info("event=announce node={} layers={}-{} model={} lease={}", r.address,
                   r.start_layer, r.end_layer, r.model_id.substr(0, 12), out->lease());
    });
  }
  grpc::Status Renew(grpc::ServerContext* ctx, const pb::RegistryRenewRequest* req,
                     pb::RegistryRenewResponse* out) override {
    return Run(ctx,
               [&] { out->set_renewed(reg_->Renew(req->lease(), DecodeRecord(req->record()))); });
  }
  grpc::Status Withdraw(grpc::ServerContext* ctx, const pb::RegistryWithdrawRequest* req,
                        pb::RegistryWithdrawResponse*) override {
    return Run(ctx, [&] { reg_->Withdraw(req->lease()); });
  }
  grpc::Status List(grpc::ServerContext* ctx, const pb::RegistryListRequest* req,
                    pb::RegistryListResponse* out) override {
    return Run(ctx, [&] {
      const registry::Snapshot s = reg_->List(req->model_id());
      out->set_revision(s.revision);
      for (const auto& r : s.nodes) EncodeRecord(r, out->add_nodes());
    });
  }
  grpc::Status WaitForChange(grpc::ServerContext* ctx, const pb::RegistryWaitRequest* req,
                             pb::RegistryWaitResponse* out) override {
    return Run(ctx, [&] {
      const double total = std::clamp(req->timeout_ms() / 1000.0, 0.0, kMaxWaitS);
      const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(total);
      int64_t rev = req->since();
      // In slices, so a cancelled call (client gone, server stopping) ends soon.
      while (rev == req->since() && !ctx->IsCancelled()) {
        const double left =
            std::chrono::duration<double>(end - std::chrono::steady_clock::now()).count();
        if (left <= 0) break;
        rev = reg_->WaitForChange(req->since(), std::min(left, 0.25));
      }
      out->set_revision(rev);
    });
  }
  grpc::Status SetDraining(grpc::ServerContext* ctx, const pb::RegistrySetDrainingRequest* req,
                           pb::RegistrySetDrainingResponse* out) override {
    return Run(ctx, [&] { out->set_found(reg_->SetDraining(req->address(), req->draining())); });
  }

 private:
  template <typename F>
  grpc::Status Run(grpc::ServerContext* ctx, F&& body) {
    if (!PresentsToken(*ctx, token_digest_)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong cluster token");
    }
    return RunToStatus(ctx, "registry_refused", /*info=*/true, body);
  }

  registry::MemoryRegistry* reg_;
  std::string token_digest_;
};

std::string Mismatch(const char* what, const std::string& announced, const std::string& actual) {
  return std::string(what) + " announced " + announced + " but the node's Info says " + actual;
}

}  // namespace

void RegistryServerOptions::Validate() const {
  if (!insecure && !IsLoopbackListen(listen) && auth_token.empty() && tls_ca.empty()) {
    ThrowInvalidArgument("registry --listen " + listen +
                         " is not loopback: give --auth-token or --tls-ca (or --insecure)");
  }
  if (tls_cert.empty() != tls_key.empty()) {
    ThrowInvalidArgument("--tls-cert and --tls-key go together");
  }
  node_client.Validate();
}

void VerifyAnnouncement(const registry::NodeRecord& r, const ClientOptions& node_client) {
  RemoteEndpoint node(r.address, node_client);
  NodeInfo info;
  try {
    info = node.InfoFull();
  } catch (const Error& e) {
    throw Error(e.kind() == ErrorKind::kPermissionDenied ? e.kind() : ErrorKind::kUnavailable,
                "cannot verify " + r.address + ": " + e.what());
  }
  const mesh::ShardInfo& s = info.shard;
  std::string why;
  if (s.model_id != r.model_id) why = Mismatch("model", r.model_id, s.model_id);
  auto range = [](int a, int b, int n) {
    return std::to_string(a) + "-" + std::to_string(b) + " of " + std::to_string(n);
  };
  if (why.empty() && (s.start_layer != r.start_layer || s.end_layer != r.end_layer ||
                      s.total_layers != r.total_layers)) {
    why = Mismatch("layers", range(r.start_layer, r.end_layer, r.total_layers),
                   range(s.start_layer, s.end_layer, s.total_layers));
  }
  if (why.empty() && s.recipe_fingerprint != r.recipe_fingerprint) {
    why = Mismatch("KV recipe", r.recipe_fingerprint, s.recipe_fingerprint);
  }
  if (why.empty() && info.instance_id != r.instance_id) {
    why = Mismatch("instance", r.instance_id, info.instance_id);
  }
  if (!why.empty()) {
    throw Error(ErrorKind::kPermissionDenied, "announcement of " + r.address + " refused: " + why);
  }
}

registry::NodeRecord NodeRecordOf(const NodeServer& server) {
  const node::NodeInfo info = server.Info();
  registry::NodeRecord r;
  r.address = server.bound_address();
  r.model_id = info.shard.model_id;
  r.architecture = info.shard.architecture;
  r.start_layer = info.shard.start_layer;
  r.end_layer = info.shard.end_layer;
  r.total_layers = info.shard.total_layers;
  r.recipe_fingerprint = info.shard.recipe_fingerprint;
  r.kv_budget_bytes = info.shard.kv_budget_bytes;
  r.kv_bytes_free = info.shard.kv_bytes_free;
  r.live_sessions = info.shard.live_sessions;
  r.sessions_free = std::max<int64_t>(0, server.max_sessions() - info.shard.live_sessions);
  r.in_flight_steps = server.steps_in_flight();
  r.version = info.shard.version;
  r.instance_id = info.instance_id;
  return r;
}

struct RegistryServer::Impl {
  RegistryServerOptions options;
  registry::MemoryRegistry reg;
  RegistryService service;
  std::unique_ptr<grpc::Server> server;
  std::string bound;
  Mutex mu;
  bool stopped GUARDED_BY(mu) = false;

  explicit Impl(RegistryServerOptions o)
      : options(std::move(o)),
        reg(options.verify_nodes ? registry::MemoryRegistry::Verifier(
                                       [c = options.node_client](const registry::NodeRecord& r) {
                                         VerifyAnnouncement(r, c);
                                       })
                                 : nullptr),
        service(&reg, options.auth_token) {}
};

RegistryServer::RegistryServer(RegistryServerOptions options) {
  options.Validate();
  impl_ = std::make_unique<Impl>(std::move(options));
}

RegistryServer::~RegistryServer() { Shutdown(); }

registry::MemoryRegistry& RegistryServer::registry() { return impl_->reg; }
std::string RegistryServer::bound_address() const { return impl_->bound; }

void RegistryServer::Start() {
  Impl& m = *impl_;
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!m.options.tls_cert.empty()) {
    grpc::SslServerCredentialsOptions ssl(
        m.options.tls_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                 : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    if (!m.options.tls_ca.empty()) ssl.pem_root_certs = ReadPemFile(m.options.tls_ca, "TLS CA");
    ssl.pem_key_cert_pairs.push_back({ReadPemFile(m.options.tls_key, "TLS key"),
                                      ReadPemFile(m.options.tls_cert, "TLS certificate")});
    creds = grpc::SslServerCredentials(ssl);
  }
  grpc::ServerBuilder builder;
  builder.RegisterService(&m.service);
  int port = 0;
  m.server = StartListening(builder, m.options.listen, creds, m.options.max_rpc_threads,
                            "meshnet-registry", " for the registry (address in use?)", &port);
  const size_t colon = m.options.listen.rfind(':');
  m.bound = m.options.listen.substr(0, colon) + ":" + std::to_string(port);
  spdlog::info("event=registry_serving listen={} token={} tls={} verify={}", m.bound,
               !m.options.auth_token.empty(), !m.options.tls_cert.empty(), m.options.verify_nodes);
}

void RegistryServer::Shutdown() {
  if (!impl_) return;
  MutexLock lock(&impl_->mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  if (impl_->server) {
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    impl_->server->Wait();
  }
}

}  // namespace meshnet::rpc
