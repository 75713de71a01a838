#include "rpc/registry_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "proto/meshnet.grpc.pb.h"
#include "rpc/auth.h"
#include "rpc/grpc_listen.h"
#include "rpc/prove.h"
#include "rpc/registry_codec.h"
#include "rpc/remote.h"
#include "rpc/server.h"
#include "rpc/server_auth.h"
#include "rpc/status.h"
#include "util/error.h"
#include "util/host_port.h"
#include "util/mutex.h"
#include "util/secret.h"

namespace meshnet::rpc {

namespace {

constexpr double kMaxWaitS = 60.0;

// Calls in progress, at most `total` at once and `per_peer` per caller
// (PeerAddressKey: an IPv4 address or an IPv6 /64); TryEnter refuses at once
// when either is reached.
class CallSlots {
 public:
  CallSlots(int total, int per_peer) : total_(total), per_peer_(per_peer) {}
  bool TryEnter(const std::string& peer) {
    MutexLock lock(&mu_);
    int& mine = by_peer_[peer];
    if (running_ >= total_ || mine >= per_peer_) {
      if (mine == 0) by_peer_.erase(peer);
      ++refused_;
      return false;
    }
    ++mine;
    ++running_;
    return true;
  }
  void Leave(const std::string& peer) {
    MutexLock lock(&mu_);
    --running_;
    auto it = by_peer_.find(peer);
    if (it != by_peer_.end() && --it->second <= 0) by_peer_.erase(it);
  }
  int64_t refused() const {
    MutexLock lock(&mu_);
    return refused_;
  }

 private:
  const int total_;
  const int per_peer_;
  mutable Mutex mu_;
  int running_ GUARDED_BY(mu_) = 0;
  int64_t refused_ GUARDED_BY(mu_) = 0;
  std::unordered_map<std::string, int> by_peer_ GUARDED_BY(mu_);
};

// A few threads that run the announcements' verifications (each a call to
// the announced node), so that no gRPC handler thread waits for a node.
// The queue is bounded by CallSlots (a task per admitted call).
class VerifyWorkers {
 public:
  explicit VerifyWorkers(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~VerifyWorkers() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
      wake_.SignalAll();
    }
    for (auto& t : threads_) t.join();
  }
  void Submit(std::function<void()> task) {
    MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
    wake_.Signal();
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> task;
      {
        MutexLock lock(&mu_);
        while (!stop_ && tasks_.empty()) wake_.Wait();
        if (tasks_.empty()) return;  // stopping, nothing left
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }
  Mutex mu_;
  CondVar wake_{&mu_};
  bool stop_ GUARDED_BY(mu_) = false;
  std::deque<std::function<void()>> tasks_ GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

// Announce is a callback method (its verification runs on VerifyWorkers);
// the rest are synchronous and quick.
class RegistryService final
    : public pb::Registry::WithCallbackMethod_Announce<pb::Registry::Service> {
 public:
  RegistryService(registry::MemoryRegistry* reg, const RegistryServerOptions& o)
      : reg_(reg),
        token_digest_(o.auth_token.empty() ? "" : SecretDigest(BearerValue(o.auth_token))),
        verifying_(o.max_verifying, o.max_verifying_per_peer),
        waits_(std::min(o.max_waits, std::max(1, o.max_rpc_threads / 4)), o.max_waits_per_peer),
        workers_(std::max(1, o.max_verifying)) {}

  grpc::ServerUnaryReactor* Announce(grpc::CallbackServerContext* ctx,
                                     const pb::RegistryAnnounceRequest* req,
                                     pb::RegistryAnnounceResponse* out) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (!PresentsToken(*ctx, token_digest_)) {
      reactor->Finish(
          grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong cluster token"));
      return reactor;
    }
    const std::string peer = PeerAddressKey(ctx->peer());
    if (!verifying_.TryEnter(peer)) {
      Fail(ctx, reactor,
           Error(ErrorKind::kResourceExhausted,
                 "registry busy verifying announcements (from " + peer + " or all); retry later"));
      return reactor;
    }
    workers_.Submit([this, ctx, reactor, req, out, peer] {
      try {
        const registry::NodeRecord r = DecodeRecord(req->record());
        const registry::Lease lease = reg_->Announce(r, req->ttl_s());
        out->set_lease(lease.id);
        out->set_lease_secret(lease.secret);
        out->set_ttl_s(lease.ttl_s);
        spdlog::info("event=announce node={} layers={}-{} model={} lease={}", r.address,
                     r.start_layer, r.end_layer, r.model_id.substr(0, 12), lease.id);
        verifying_.Leave(peer);
        reactor->Finish(grpc::Status::OK);
      } catch (const Error& e) {
        verifying_.Leave(peer);
        spdlog::info("event=registry_refused peer={} kind={} message=\"{}\"", ctx->peer(),
                     ErrorKindName(e.kind()), e.what());
        Fail(ctx, reactor, e);
      } catch (const std::exception& e) {
        verifying_.Leave(peer);
        reactor->Finish(grpc::Status(grpc::StatusCode::INTERNAL, e.what()));
      }
    });
    return reactor;
  }
  grpc::Status Renew(grpc::ServerContext* ctx, const pb::RegistryRenewRequest* req,
                     pb::RegistryRenewResponse* out) override {
    return Run(ctx, [&] {
      out->set_renewed(
          reg_->Renew(LeaseOf(req->lease(), req->lease_secret()), DecodeRecord(req->record())));
    });
  }
  grpc::Status Withdraw(grpc::ServerContext* ctx, const pb::RegistryWithdrawRequest* req,
                        pb::RegistryWithdrawResponse*) override {
    return Run(ctx, [&] { reg_->Withdraw(LeaseOf(req->lease(), req->lease_secret())); });
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
      const std::string peer = PeerAddressKey(ctx->peer());
      if (!waits_.TryEnter(peer)) {
        throw Error(ErrorKind::kResourceExhausted,
                    "too many long polls (from " + peer + " or all); retry later");
      }
      struct Leave {
        CallSlots* slots;
        const std::string& peer;
        ~Leave() { slots->Leave(peer); }
      } leave{&waits_, peer};
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
  int64_t announces_refused() const { return verifying_.refused(); }
  int64_t long_polls_refused() const { return waits_.refused(); }

 private:
  static registry::Lease LeaseOf(int64_t id, const std::string& secret) {
    return registry::Lease{id, secret, 0};
  }
  static void Fail(grpc::CallbackServerContext* ctx, grpc::ServerUnaryReactor* reactor,
                   const Error& e) {
    ctx->AddTrailingMetadata(kErrorKindKey, std::string(ErrorKindName(e.kind())));
    reactor->Finish(ToStatus(e));
  }
  template <typename F>
  grpc::Status Run(grpc::ServerContext* ctx, F&& body) {
    if (!PresentsToken(*ctx, token_digest_)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong cluster token");
    }
    return RunToStatus(ctx, "registry_refused", /*info=*/true, body);
  }

  registry::MemoryRegistry* reg_;
  std::string token_digest_;
  CallSlots verifying_;
  CallSlots waits_;
  VerifyWorkers workers_;  // last: joined first, while the rest still lives
};

std::string Mismatch(const char* what, const std::string& announced, const std::string& actual) {
  return std::string(what) + " announced " + announced + " but the node's answer says " + actual;
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
  if (max_verifying < 1 || max_verifying_per_peer < 1 || max_waits < 1 || max_waits_per_peer < 1) {
    ThrowInvalidArgument("registry call limits must be >= 1");
  }
  node_client.Validate();
}

registry::NodeRecord VerifyAnnouncement(const registry::NodeRecord& r,
                                        const ClientOptions& node_client) {
  ProvenNode proven;
  try {
    proven = ProveNode(r.address, node_client, r.public_key);
  } catch (const Error& e) {
    throw Error(e.kind() == ErrorKind::kPermissionDenied ? e.kind() : ErrorKind::kUnavailable,
                "cannot verify " + r.address + ": " + e.what());
  }
  const mesh::ShardInfo& s = proven.info.shard;
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
  if (why.empty() && proven.info.instance_id != r.instance_id) {
    why = Mismatch("instance", r.instance_id, proven.info.instance_id);
  }
  if (!why.empty()) {
    throw Error(ErrorKind::kPermissionDenied, "announcement of " + r.address + " refused: " + why);
  }
  registry::NodeRecord out = r;  // the load as the node itself answered, not as announced
  out.kv_budget_bytes = s.kv_budget_bytes;
  out.kv_bytes_free = s.kv_bytes_free;
  out.live_sessions = s.live_sessions;
  return out;
}

registry::NodeRecord NodeRecordOf(const NodeServer& server, bool draining) {
  const node::NodeInfo info = server.Info();
  registry::NodeRecord r;
  r.address = server.advertised_address();
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
  r.draining = draining;
  registry::SignRecord(server.node_key(), &r);
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
                                         return VerifyAnnouncement(r, c);
                                       })
                                 : nullptr),
        service(&reg, options) {}
};

RegistryServer::RegistryServer(RegistryServerOptions options) {
  options.Validate();
  impl_ = std::make_unique<Impl>(std::move(options));
}

RegistryServer::~RegistryServer() { Shutdown(); }

registry::MemoryRegistry& RegistryServer::registry() { return impl_->reg; }
std::string RegistryServer::bound_address() const { return impl_->bound; }
int64_t RegistryServer::announces_refused() const { return impl_->service.announces_refused(); }
int64_t RegistryServer::long_polls_refused() const { return impl_->service.long_polls_refused(); }

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
