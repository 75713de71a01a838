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
#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "node/node.h"
#include "proto/meshnet.grpc.pb.h"
#include "rpc/auth.h"
#include "rpc/codec.h"
#include "rpc/forward.h"
#include "rpc/grpc_listen.h"
#include "rpc/kv_transfer.h"
#include "rpc/metrics.h"
#include "rpc/migrate.h"
#include "rpc/node_service.h"
#include "rpc/prove.h"
#include "rpc/returns.h"
#include "rpc/server_auth.h"
#include "rpc/server_limits.h"
#include "rpc/server_trim.h"
#include "rpc/status.h"
#include "shard/step_cancel.h"
#include "util/error.h"
#include "util/fanout.h"
#include "util/host_port.h"
#include "util/mutex.h"
#include "util/secret.h"
#include "util/signing_key.h"

namespace meshnet::rpc {

namespace {

constexpr int kMetricsThreads = 8;
constexpr std::string_view kDataPath = "/meshnet.v1.MeshNode/Step";
constexpr std::string_view kImportPath = "/meshnet.v1.MeshNode/ImportSession";
constexpr std::string_view kAdminPath = "/meshnet.v1.MeshNode/Drain";
constexpr int kMetricsRequestTimeoutMs = 3000;

// "host:port" -> host ("[::1]:0" -> "[::1]").
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

// The peer a per-peer limit applies to: the identity of its client
// certificate under mutual TLS, else its address without the port.
std::string PeerKey(const grpc::ServerContext& ctx) {
  const auto auth = ctx.auth_context();
  if (auth && auth->IsPeerAuthenticated()) {
    const auto ids = auth->GetPeerIdentity();
    if (!ids.empty()) return "x509:" + std::string(ids.front().data(), ids.front().size());
  }
  return PeerHost(ctx.peer());
}

// Concurrent calls per client address, so that one client cannot hold every
// handler thread; calls over the limit are refused at once (kResourceExhausted).
class PeerLimits {
 public:
  explicit PeerLimits(int max_calls) : max_calls_(max_calls) {}

  // Holds one call slot of `peer` for its lifetime; throws when none is free.
  class Slot {
   public:
    Slot(PeerLimits* limits, std::string host) : limits_(limits), host_(std::move(host)) {
      std::lock_guard<std::mutex> lock(limits_->mu_);
      int& n = limits_->calls_[host_];
      if (n >= limits_->max_calls_) {
        throw Error(ErrorKind::kResourceExhausted,
                    "too many concurrent calls from " + host_ + " (limit " +
                        std::to_string(limits_->max_calls_) + "); retry in 100 ms");
      }
      ++n;
    }
    ~Slot() {
      std::lock_guard<std::mutex> lock(limits_->mu_);
      auto it = limits_->calls_.find(host_);
      if (--it->second == 0) limits_->calls_.erase(it);
    }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    PeerLimits* limits_;
    std::string host_;
  };

 private:
  const int max_calls_;
  std::mutex mu_;
  std::unordered_map<std::string, int> calls_;  // GUARDED_BY(mu_)
};

// Every method synchronous but Returns (a callback reactor: an open stream
// pins no handler thread).
class MeshNodeService final
    : public pb::MeshNode::WithCallbackMethod_Returns<pb::MeshNode::Service> {
 public:
  MeshNodeService(NodeService* core, const NodeServerOptions& o, const SigningKey* key,
                  std::shared_ptr<const TokenGate> gate)
      : core_(core),
        key_(key),
        gate_(std::move(gate)),
        peers_(o.max_calls_per_peer),
        session_rate_(o.max_new_sessions_per_minute),
        max_streams_(o.max_streams),
        returns_(o.max_return_streams),
        forwarder_(o.peers, ForwarderSelf(*core)),
        fanout_(o.max_rpc_threads) {}

  static Forwarder::Self ForwarderSelf(NodeService& core) {
    const node::NodeInfo info = core.core().Info();
    return Forwarder::Self{info.shard.model_id, info.shard.end_layer};
  }

  // Chain forwarding's direct return (rpc/returns.h).
  grpc::ServerWriteReactor<pb::StepReturn>* Returns(grpc::CallbackServerContext* ctx,
                                                    const pb::ReturnsRequest* req) override {
    const bool authorized = gate_->Admits(kDataPath, *ctx);
    if (!authorized) core_->counters().CountError(ErrorKind::kPermissionDenied);
    return returns_.Open(ctx, req->return_id(), authorized);
  }

  grpc::Status Info(grpc::ServerContext* ctx, const pb::InfoRequest*,
                    pb::InfoResponse* out) override {
    return Run(ctx, [&] {
      core_->Info(out);
      out->set_public_key(key_->public_key());
      out->set_address(address_);
    });
  }

  // Open to every caller: answers a challenge with the node's signed identity
  // (rpc/prove.h). Under the caller's per-peer call limit.
  grpc::Status Prove(grpc::ServerContext* ctx, const pb::ProveRequest* req,
                     pb::ProveResponse* out) override {
    return RunToStatus(ctx, "call_failed", /*info=*/false, [&] {
      if (req->challenge().size() < 16 || req->challenge().size() > 64) {
        ThrowInvalidArgument("a challenge holds 16..64 bytes");
      }
      if (address_.empty()) {
        throw Error(ErrorKind::kUnavailable,
                    "this node listens on an address that names no host (0.0.0.0, [::]): it "
                    "cannot prove an address");
      }
      PeerLimits::Slot slot(&peers_, PeerKey(*ctx));
      pb::InfoResponse* info = out->mutable_info();
      core_->Info(info);
      info->set_public_key(key_->public_key());
      info->set_address(address_);
      out->set_signature(key_->Sign(ProveSignedText(req->challenge(), *info)));
      if (!gate_->token_digest().empty()) {
        out->set_member_proof(
            MemberProof(gate_->token_digest(), req->challenge(), key_->public_key()));
      }
    });
  }

  grpc::Status Step(grpc::ServerContext* ctx, const pb::StepRequest* req,
                    pb::StepResponse* out) override {
    return Run(ctx, [&] {
      NoteMessageBytes(req->ByteSizeLong());  // a large one: trim the heap after the call
      LimitedStep(ctx, PeerKey(*ctx), *req, out);
    });
  }

  // Each step as its own Step call would run (auth checked once, each step
  // under its own per-peer slot and cancel check). Decode steps of distinct
  // sessions (what clients group) run from this thread, queued in the
  // batcher together (StepManyHere); any other call runs its steps all at
  // once on the fanout's threads, so that the batcher sees them together.
  grpc::Status StepMany(grpc::ServerContext* ctx, const pb::StepManyRequest* req,
                        pb::StepManyResponse* out) override {
    if (grpc::Status s = CheckToken(ctx); !s.ok()) return s;
    const int n = req->steps_size();
    for (const pb::StepRequest& r : req->steps()) {
      if (r.chain_route_size() > 0) {
        return ToStatus(Error(ErrorKind::kInvalidArgument, "a chain step goes in a Step call"),
                        ctx);
      }
    }
    if (n < 1 || n > kMaxStepsPerCall) {
      return ToStatus(Error(ErrorKind::kInvalidArgument, "StepMany takes 1.." +
                                                             std::to_string(kMaxStepsPerCall) +
                                                             " steps, got " + std::to_string(n)),
                      ctx);
    }
    node::NodeCounters& counters = core_->counters();
    counters.grouped_calls.fetch_add(1, std::memory_order_relaxed);
    counters.grouped_steps.fetch_add(n, std::memory_order_relaxed);
    for (int i = 0; i < n; ++i) out->add_outcomes();
    NoteMessageBytes(req->ByteSizeLong());  // on the handler's thread, which ends the call
    const std::string peer = PeerKey(*ctx);
    if (DecodeStepsOfDistinctSessions(*req)) {
      StepManyHere(ctx, peer, *req, out);
      return grpc::Status::OK;
    }
    // The batch waits for the call's decode steps, not for its prompts (which
    // may wait for an admission slot first).
    node::Batcher& batcher = core_->core().node().batcher();
    batcher.ExpectSteps(std::count_if(req->steps().begin(), req->steps().end(),
                                      [](const pb::StepRequest& r) { return !r.prefill(); }));
    fanout_.Run(n, [&](int64_t i) {
      pb::StepOutcome& o = *out->mutable_outcomes(static_cast<int>(i));
      std::optional<node::Batcher::Arrival> arrival;
      if (!req->steps(static_cast<int>(i)).prefill()) arrival.emplace(&batcher);
      SetOutcome(
          *ctx,
          [&] { LimitedStep(ctx, peer, req->steps(static_cast<int>(i)), o.mutable_response()); },
          &o);
    });
    return grpc::Status::OK;
  }

  // Decode steps only (no prompt, which may wait for an admission slot), each
  // of its own session: the call can run on the handler's thread alone.
  static bool DecodeStepsOfDistinctSessions(const pb::StepManyRequest& req) {
    std::set<std::string_view> seen;
    for (const pb::StepRequest& r : req.steps()) {
      if (r.prefill() || !seen.insert(r.session_id()).second) return false;
    }
    return true;
  }

  // The steps of a StepMany call as their own calls would run them (each
  // under its own per-peer slot; one cancel check, the call's), on this
  // thread: their checks and answers one after another, their rows queued
  // in the batcher at once (NodeService::StepMany).
  void StepManyHere(grpc::ServerContext* ctx, const std::string& peer,
                    const pb::StepManyRequest& req, pb::StepManyResponse* out) {
    const int n = req.steps_size();
    std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
    std::deque<PeerLimits::Slot> slots;
    std::vector<int> which;
    for (int i = 0; i < n; ++i) {
      try {
        slots.emplace_back(&peers_, peer);
        which.push_back(i);
      } catch (...) {
        errors[static_cast<size_t>(i)] = std::current_exception();
      }
    }
    {
      shard::ScopedStepCancel cancel([ctx] { return ctx->IsCancelled(); });
      const InFlight counted(&in_flight_, static_cast<int64_t>(which.size()));
      try {
        core_->StepMany(req, which, out, errors);
      } catch (...) {  // e.g. out of memory: the steps with neither answer nor error fail
        for (const int i : which) {
          if (!errors[static_cast<size_t>(i)] && !out->outcomes(i).has_response()) {
            errors[static_cast<size_t>(i)] = std::current_exception();
          }
        }
      }
    }
    for (int i = 0; i < n; ++i) {
      const std::exception_ptr& e = errors[static_cast<size_t>(i)];
      if (e)
        SetOutcome(
            *ctx, [&] { std::rethrow_exception(e); }, out->mutable_outcomes(i));
    }
  }

  // Runs `body` (one step of a StepMany) and sets its outcome to what the
  // step's own call would end with (RunToStatus), not on ctx, which the
  // other steps share.
  static void SetOutcome(const grpc::ServerContext& ctx, const std::function<void()>& body,
                         pb::StepOutcome* o) {
    std::optional<ErrorKind> kind;
    const grpc::Status s = RunCaught(ctx, "call_failed", /*info=*/false, body, &kind);
    if (s.ok()) return;
    o->clear_response();
    o->set_code(s.error_code());
    o->set_kind(kind ? std::string(ErrorKindName(*kind)) : "");
    o->set_message(s.error_message());
  }

  grpc::Status StepStream(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<pb::StepResponse, pb::StepRequest>* stream) override {
    if (grpc::Status s = CheckToken(ctx); !s.ok()) return s;
    // Each open stream pins a handler thread while it waits for a request:
    // at most max_streams at once, so idle streams cannot starve Info/Step.
    if (open_streams_.fetch_add(1) >= max_streams_) {
      open_streams_.fetch_sub(1);
      return ToStatus(Error(ErrorKind::kResourceExhausted, "too many open StepStreams (limit " +
                                                               std::to_string(max_streams_) +
                                                               "); use unary Step"),
                      ctx);
    }
    struct Close {
      std::atomic<int>* n;
      ~Close() { n->fetch_sub(1); }
    } close{&open_streams_};
    const std::string peer = PeerKey(*ctx);
    pb::StepRequest req;
    pb::StepResponse out;
    while (stream->Read(&req)) {
      out.Clear();
      grpc::Status s = Run(
          ctx,
          [&] {
            NoteMessageBytes(req.ByteSizeLong());
            LimitedStep(ctx, peer, req, &out);
          },
          /*check_token=*/false);
      if (!s.ok()) return s;
      if (!stream->Write(out)) break;
    }
    return grpc::Status::OK;
  }

  grpc::Status Truncate(grpc::ServerContext* ctx, const pb::TruncateRequest* req,
                        pb::TruncateResponse* out) override {
    return Run(ctx, [&] {
      PeerLimits::Slot slot(&peers_, PeerKey(*ctx));
      core_->Truncate(*req, out);
    });
  }

  grpc::Status Release(grpc::ServerContext* ctx, const pb::ReleaseRequest* req,
                       pb::ReleaseResponse* out) override {
    return Run(ctx, [&] { core_->Release(*req, out); });
  }

  grpc::Status ExportSession(grpc::ServerContext* ctx, const pb::ExportSessionRequest* req,
                             grpc::ServerWriter<pb::SessionChunk>* writer) override {
    return Run(ctx, [&] {
      PeerLimits::Slot slot(&peers_, PeerHost(ctx->peer()));
      core_->ExportSession(*req, [&](const pb::SessionChunk& m) { return writer->Write(m); });
    });
  }

  // A pusher that could not use the transfer port streams here instead: its
  // offer there (same session) is dropped first, so the two do not collide.
  grpc::Status ImportSession(grpc::ServerContext* ctx, grpc::ServerReader<pb::SessionChunk>* reader,
                             pb::ImportSessionResponse* out) override {
    return Run(
        ctx,
        [&] {
          PeerLimits::Slot slot(&peers_, PeerHost(ctx->peer()));
          shard::ScopedStepCancel cancel([ctx] { return ctx->IsCancelled(); });
          bool first = true;
          core_->ImportSession(
              [&](pb::SessionChunk* m) {
                if (!reader->Read(m)) return false;
                if (first && m->has_header() && kv_transfer_ != nullptr) {
                  kv_transfer_->DropOffers(m->header().session_id());
                }
                first = false;
                return true;
              },
              out);
        },
        /*check_token=*/true, kImportPath);
  }

  grpc::Status OfferImport(grpc::ServerContext* ctx, const pb::OfferImportRequest* req,
                           pb::OfferImportResponse* out) override {
    if (grpc::Status s = CheckToken(ctx, kImportPath); !s.ok()) return s;
    if (kv_transfer_ == nullptr) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          "this node has no KV transfer port (TLS, or --kv-transfer-port -1): "
                          "use ImportSession");
    }
    return Run(
        ctx,
        [&] {
          PeerLimits::Slot slot(&peers_, PeerHost(ctx->peer()));
          shard::ScopedStepCancel cancel([ctx] { return ctx->IsCancelled(); });
          const KvOffer offer = kv_transfer_->Offer(DecodeExportHeader(req->header()));
          out->set_ticket(offer.ticket);
          out->set_port(offer.port);
          out->set_ticket_ttl_ms(static_cast<int64_t>(offer.ttl_s * 1000));
        },
        /*check_token=*/false);
  }

  // Set before the server starts (never changed while it serves).
  void set_kv_transfer(KvTransferListener* listener) { kv_transfer_ = listener; }
  void set_address(std::string canonical) { address_ = std::move(canonical); }

  grpc::Status Drain(grpc::ServerContext* ctx, const pb::DrainRequest* req,
                     pb::DrainResponse* out) override {
    return Run(
        ctx, [&] { core_->Drain(*req, out); }, /*check_token=*/true, kAdminPath);
  }

  grpc::Status Undrain(grpc::ServerContext* ctx, const pb::UndrainRequest*,
                       pb::UndrainResponse* out) override {
    return Run(
        ctx, [&] { out->set_was_draining(core_->Undrain()); }, /*check_token=*/true, kAdminPath);
  }

 private:
  // Steps counted in in_flight_ while it lives.
  class InFlight {
   public:
    InFlight(std::atomic<int64_t>* n, int64_t k) : n_(n), k_(k) {
      n_->fetch_add(k_, std::memory_order_relaxed);
    }
    ~InFlight() { n_->fetch_sub(k_, std::memory_order_relaxed); }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;

   private:
    std::atomic<int64_t>* n_;
    int64_t k_;
  };

  // A step under the caller's per-peer limit, cancelled between layers and
  // prefill chunks once its call is (deadline passed, client gone, or the
  // server's shutdown grace over). `peer`: PeerKey(*ctx), read once per call
  // (the context's auth_context() is not safe from several threads at once).
  void LimitedStep(grpc::ServerContext* ctx, const std::string& peer, const pb::StepRequest& req,
                   pb::StepResponse* out) {
    const bool chained = req.chain_route_size() > 0;
    if (chained) Forwarder::CheckChain(req, address_);
    if (req.prefill()) session_rate_.Open(peer, req.session_id());
    PeerLimits::Slot slot(&peers_, peer);
    {
      shard::ScopedStepCancel cancel([ctx] { return ctx->IsCancelled(); });
      const InFlight counted(&in_flight_, 1);
      core_->Step(req, out);
    }
    if (chained) Chain(*ctx, req, out);
  }

  // A chain step this node ran (`out`: its answer): the tail's output also
  // goes on the client's Returns stream; a bundle goes on to the next hop,
  // whose answer (the route's) becomes this call's.
  void Chain(const grpc::ServerContext& ctx, const pb::StepRequest& req, pb::StepResponse* out) {
    out->set_chain_hop(req.chain_index());
    out->set_route_compute_micros(req.chain_compute_micros() + out->compute_micros());
    const bool last = req.chain_index() + 1 == req.chain_route_size();
    if (last || !out->has_bundle()) {
      if (last && out->has_tail() && !req.return_id().empty()) {
        pb::StepReturn answer;
        answer.set_session_id(req.session_id());
        answer.set_step_id(req.step_id());
        *answer.mutable_response() = *out;
        if (returns_.Push(req.return_id(), answer)) {
          core_->counters().chain_returns.fetch_add(1, std::memory_order_relaxed);
        }
      }
      return;  // a miss, or a bundle from the last hop (the client refuses it)
    }
    pb::StepRequest next = req;
    next.clear_tokens();
    next.mutable_bundle()->Swap(out->mutable_bundle());
    next.set_chain_compute_micros(out->route_compute_micros());
    out->Clear();
    forwarder_.Forward(ctx.deadline(), &next, out);
    core_->counters().chain_forwarded.fetch_add(1, std::memory_order_relaxed);
  }

 public:
  int64_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }

 private:
  // The credentials' TokenGate refused tokenless calls before their bodies
  // were read; this second check keeps the handlers safe on their own.
  grpc::Status CheckToken(grpc::ServerContext* ctx, std::string_view path = kDataPath) const {
    // Digest comparison: constant time in the token's content and length.
    if (!gate_->Admits(path, *ctx)) {
      core_->counters().CountError(ErrorKind::kPermissionDenied);
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          path == kAdminPath
                              ? "admin calls need the node's --admin-token (none set: refused)"
                              : "missing or wrong cluster token");
    }
    return grpc::Status::OK;
  }

  template <typename F>
  grpc::Status Run(grpc::ServerContext* ctx, F&& body, bool check_token = true,
                   std::string_view path = kDataPath) {
    if (check_token) {
      if (grpc::Status s = CheckToken(ctx, path); !s.ok()) return s;
    }
    return RunToStatus(ctx, "call_failed", /*info=*/false, body);
  }

  NodeService* core_;
  const SigningKey* key_;
  std::shared_ptr<const TokenGate> gate_;
  KvTransferListener* kv_transfer_ = nullptr;
  std::string address_;  // canonical bound address; empty when it names no host
  PeerLimits peers_;
  SessionRateLimiter session_rate_;
  const int max_streams_;
  std::atomic<int> open_streams_{0};
  ReturnHub returns_;
  Forwarder forwarder_;
  std::atomic<int64_t> in_flight_{0};  // steps running (the registry's load signal)
  util::Fanout fanout_;                // StepMany's steps, each on a thread of its own
};

// The largest message a step of this shard needs: a full-context bundle
// (f32 rows, positions) or the prompt's ids, and the logits row, plus 1 MiB.
int64_t ShardMessageBytes(const node::Node& node) {
  const auto& hp = node.shard().hparams();
  const int64_t ctx = hp.context_length;
  return ctx * (hp.n_embd * 4 + 8 + 4) + int64_t{hp.vocab_size} * 4 + (int64_t{1} << 20);
}

}  // namespace

struct NodeServer::Impl {
  NodeServerOptions options;
  NodeService node_service;
  SigningKey key;
  // Every call's credential is checked on its metadata before its message is
  // read (rpc/server_auth.h); the handlers check it again.
  std::shared_ptr<const TokenGate> gate;
  MeshNodeService service;
  std::shared_ptr<NodeMetrics> metrics;
  std::unique_ptr<prometheus::Exposer> exposer;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<KvTransferListener> kv_transfer;
  std::string bound;
  std::string metrics_bound;
  Mutex shutdown_mu;
  bool stopped GUARDED_BY(shutdown_mu) = false;
  // The stall watch (WatchStalls): a thread that notices this process was
  // stopped (SIGSTOP, a suspended VM) and then drops the sessions whose
  // clients gave up meanwhile.
  std::thread stall_watch;
  Mutex stall_mu;
  CondVar stall_wake{&stall_mu};
  bool stall_stop GUARDED_BY(stall_mu) = false;
  void WatchStalls();
  void StopStallWatch();

  Impl(node::Node* node, NodeServerOptions opts)
      : options(std::move(opts)),
        node_service(node, node::NodeCoreOptions{options.max_bindings, options.replay_cache_bytes,
                                                 options.admission}),
        key(options.node_key_file.empty() ? SigningKey::Generate()
                                          : SigningKey::LoadOrCreate(options.node_key_file)),
        gate(std::make_shared<const TokenGate>(options.auth_token, options.admin_token,
                                               key.public_key(),
                                               [c = &node_service.core().counters()] {
                                                 c->CountError(ErrorKind::kPermissionDenied);
                                               })),
        service(&node_service, options, &key, gate),
        max_message_bytes(static_cast<int>(std::min<int64_t>(
            options.max_message_bytes > 0 ? options.max_message_bytes : ShardMessageBytes(*node),
            kMaxMessageBytes))) {}
  int max_message_bytes;

  // The KV transfer port (rpc/kv_transfer.h) on the --listen host; none with
  // TLS or --kv-transfer-port -1. Port 0 that cannot be opened only logs
  // (imports then stream over gRPC); a port given by number must open.
  void StartKvTransfer();
};

// Ticks every 0.5 s. A tick that comes more than kStallS late means the
// process did not run meanwhile: every client whose step timed out gave up
// on this node (failed over or stopped) and will not release its session
// here (its release timed out too). Sessions not stepped within the active
// window after the resumption (clients that are still there step again) are
// then ended with an explicit miss, instead of holding their KV until the TTL.
void NodeServer::Impl::WatchStalls() {
  using SteadyClock = std::chrono::steady_clock;
  constexpr double kStallS = 10.0;
  const auto grace = std::chrono::duration_cast<SteadyClock::duration>(
      std::chrono::duration<double>(std::clamp(options.admission.active_window_s, 1.0, 30.0)));
  auto last = SteadyClock::now();
  std::optional<SteadyClock::time_point> resumed;
  MutexLock lock(&stall_mu);
  while (!stall_stop) {
    stall_wake.WaitUntil(SteadyClock::now() + std::chrono::milliseconds(500));
    const auto now = SteadyClock::now();
    const double gap = std::chrono::duration<double>(now - last).count();
    last = now;
    if (gap > kStallS) {
      spdlog::warn("event=node_was_stopped seconds={:.1f}", gap);
      resumed = now;
    }
    if (resumed && now >= *resumed + grace) {
      const int64_t n = node_service.core().EndSessionsIdleSince(
          *resumed + std::chrono::seconds(1),
          "this node was stopped and the session's client gave up; re-prefill");
      spdlog::info("event=stalled_sessions_ended sessions={}", n);
      resumed.reset();
    }
  }
}

void NodeServer::Impl::StopStallWatch() {
  {
    MutexLock lock(&stall_mu);
    stall_stop = true;
    stall_wake.SignalAll();
  }
  if (stall_watch.joinable()) stall_watch.join();
}

void NodeServer::Impl::StartKvTransfer() {
  if (!options.tls_cert.empty() || options.kv_transfer_port < 0) return;
  KvTransferOptions ko;
  ko.host = HostOf(options.listen);
  ko.port = options.kv_transfer_port;
  try {
    kv_transfer = std::make_unique<KvTransferListener>(&node_service.core(), ko);
    service.set_kv_transfer(kv_transfer.get());
  } catch (const Error& e) {
    if (ko.port != 0) throw;  // a port asked for by number must open
    spdlog::warn("event=kv_transfer_off message=\"{}\" (imports stream over gRPC)", e.what());
  }
}

NodeServer::NodeServer(node::Node* node, NodeServerOptions options) {
  options.Validate();
  if (options.peers.auth_token.empty()) options.peers.auth_token = options.auth_token;
  impl_ = std::make_unique<Impl>(node, std::move(options));
  impl_->node_service.set_peer_options(impl_->options.peers);
}

DrainReport NodeServer::Drain(DrainOptions options) {
  if (options.client.auth_token.empty()) options.client = impl_->options.peers;
  return DrainSessions(impl_->node_service.core(), options);
}

void NodeServer::SetDrainHooks(ReplicaFinder finder, std::function<void(bool)> on_drain) {
  impl_->node_service.set_drain_hooks(std::move(finder), std::move(on_drain));
}

bool NodeServer::WaitMovesTold(double seconds) {
  return impl_->node_service.core().WaitMovesTold(seconds);
}

NodeServer::~NodeServer() { Shutdown(0); }

void NodeServer::Start() {
  Impl& m = *impl_;
  std::shared_ptr<grpc::ServerCredentials> creds = NodeServerCredentials(m.options, m.gate);

  InstallHeapTrim();  // before the first grpc::Server of the process
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.RegisterService(&m.service);
  builder.SetMaxReceiveMessageSize(m.max_message_bytes);
  builder.SetMaxSendMessageSize(m.max_message_bytes);
  m.StartKvTransfer();
  int port = 0;
  m.server = StartListening(builder, m.options.listen, creds, m.options.max_rpc_threads,
                            "meshnet-node", " (address in use, or not host:port?)", &port);
  m.bound = HostOf(m.options.listen) + ":" + std::to_string(port);
  try {
    m.service.set_address(
        CanonicalHostPort(m.options.advertise.empty() ? m.bound : m.options.advertise));
  } catch (const Error& e) {
    spdlog::warn("event=no_provable_address listen={} message=\"{}\"", m.bound, e.what());
  }
  if (auto* health = m.server->GetHealthCheckService()) health->SetServingStatus(true);
  m.stall_watch = std::thread([&m] { m.WatchStalls(); });

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
  spdlog::info(
      "event=serving node={} layers={}-{} listen={} tls={} mtls={} token={} metrics={} "
      "kv_transfer_port={}",
      m.node_service.core().instance_id().substr(0, 8),
      m.node_service.core().node().role().start_layer,
      m.node_service.core().node().role().end_layer, m.bound, !m.options.tls_cert.empty(),
      !m.options.tls_ca.empty(), !m.options.auth_token.empty(),
      m.metrics_bound.empty() ? "off" : m.metrics_bound,
      m.kv_transfer ? std::to_string(m.kv_transfer->port()) : std::string("off"));
}

std::string NodeServer::bound_address() const { return impl_->bound; }
std::string NodeServer::advertised_address() const {
  try {
    return CanonicalHostPort(impl_->options.advertise.empty() ? impl_->bound
                                                              : impl_->options.advertise);
  } catch (const Error&) {
    return "";
  }
}
std::string NodeServer::metrics_address() const { return impl_->metrics_bound; }
int NodeServer::kv_transfer_port() const {
  return impl_->kv_transfer ? impl_->kv_transfer->port() : 0;
}
std::string NodeServer::instance_id() const { return impl_->node_service.core().instance_id(); }
const SigningKey& NodeServer::node_key() const { return impl_->key; }
node::NodeInfo NodeServer::Info() const { return impl_->node_service.core().Info(); }
int64_t NodeServer::steps_in_flight() const { return impl_->service.in_flight(); }
const node::NodeCounters& NodeServer::counters() const {
  return impl_->node_service.core().counters();
}
int64_t NodeServer::max_sessions() const {
  return impl_->node_service.core().manager().config().max_sessions;
}

void NodeServer::Shutdown(double grace_seconds) {
  if (!impl_) return;
  Impl& m = *impl_;
  MutexLock lock(&m.shutdown_mu);
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
  m.StopStallWatch();
  if (m.kv_transfer) m.kv_transfer->Stop();  // cuts transfers still running; undoes their claims
  m.exposer.reset();
}

}  // namespace meshnet::rpc
