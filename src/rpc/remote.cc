#include "rpc/remote.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <deque>
#include <exception>
#include <future>
#include <optional>
#include <set>

#include "mesh/cohort_carrier.h"
#include "mesh/route_planner.h"
#include "proto/meshnet.grpc.pb.h"
#include "rpc/auth.h"
#include "rpc/channel.h"
#include "rpc/client_log.h"
#include "rpc/codec.h"
#include "rpc/migrate.h"
#include "rpc/return_listener.h"
#include "rpc/status.h"
#include "util/error.h"
#include "util/mutex.h"
#include "util/transit.h"

namespace meshnet::rpc {

namespace {

std::chrono::system_clock::time_point After(double seconds) { return DeadlineAfter(seconds); }

// A node's answer as the client's result; a malformed one is the node's
// failure (kUnavailable: the generator treats the hop as dead).
mesh::StepResult DecodeAnswer(const pb::StepResponse& resp, int64_t route_epoch,
                              const std::string& peer, const char* method) {
  try {
    return DecodeStepResponse(resp, route_epoch);
  } catch (const Error& e) {
    throw Error(ErrorKind::kUnavailable,
                peer + ": " + method + ": malformed answer from the node: " + e.what());
  }
}

}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const ClientOptions& o) {
  return MakeClientChannel(address, o);
}

namespace {

NodeInfo DecodeClientInfo(const pb::InfoResponse& r) {
  NodeInfo info;
  static_cast<node::NodeInfo&>(info) = DecodeNodeInfo(r);
  info.protocol_version = r.protocol_version();
  return info;
}

}  // namespace

// ---------------------------------------------------------------------------
// RemoteEndpoint

struct RemoteEndpoint::Impl {
  std::string address;
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::MeshNode::Stub> stub;
  std::string bearer;

  void Prepare(grpc::ClientContext& ctx, double timeout_s, bool wait_for_ready) const {
    ctx.set_deadline(After(timeout_s));
    ctx.set_wait_for_ready(wait_for_ready);
    if (!bearer.empty()) ctx.AddMetadata("authorization", bearer);
  }

  // One unary Step call (with its retries); kUnavailable for a malformed answer.
  mesh::StepResult StepAlone(const pb::StepRequest& req, int64_t route_epoch, uint64_t step_id);

  // --- Grouping (see RemoteEndpoint::Step) ---------------------------------
  struct Waiter;
  // At most this many steps per StepMany: the nodes' default concurrent calls
  // per peer (each grouped step takes one).
  static constexpr size_t kMaxGroupedSteps = 32;
  // The leader takes the queue's first steps (its own first) as the batch
  // of the one call in flight.
  void TakeBatchLocked(std::vector<Waiter*>* batch) REQUIRES(group_mu);
  // One StepMany call with retries: answered (every step's outcome in
  // `resp`), failed as a whole (`failed`), or refused (send each step alone).
  enum class ManyCall { kAnswered, kFailed, kAlone };
  ManyCall CallMany(const pb::StepManyRequest& req, pb::StepManyResponse* resp,
                    std::optional<Error>* failed);
  // CallMany over `batch`: each waiter's outcome, its error, or `alone`.
  void SendMany(const std::vector<Waiter*>& batch);
  // One StepMany call (a lone step or a refused call: single Steps) for
  // StepGroup: each step's answer or error into `answers`.
  void StepGroupCall(std::span<const mesh::StepRequest> requests,
                     std::span<mesh::GroupAnswer> answers);
  // The call is over: wakes its waiters and the next leader.
  void FinishBatch(const std::vector<Waiter*>& batch) EXCLUDES(group_mu);
  // A waiter's outcome as Step's result or error.
  mesh::StepResult OutcomeResult(const pb::StepOutcome& o, int64_t route_epoch) const;
  Mutex group_mu;
  std::deque<Waiter*> group_queue GUARDED_BY(group_mu);
  bool group_sending GUARDED_BY(group_mu) = false;
  std::atomic<bool> node_groups{true};   // false once the node answered UNIMPLEMENTED
  std::shared_ptr<util::RankGate> gate;  // ClientOptions::pipeline_depth, or null

  // --- Chain forwarding (see RemoteEndpoint::ChainStep) ---------------------
  // This node's Returns stream, opened when it is first a route's tail and
  // again (at most every kReopenS) after it ended.
  static constexpr double kReopenS = 2.0;
  std::shared_ptr<ReturnListener> Returns() EXCLUDES(returns_mu);
  Mutex returns_mu;
  std::shared_ptr<ReturnListener> returns GUARDED_BY(returns_mu);
  std::chrono::steady_clock::time_point returns_opened GUARDED_BY(returns_mu);
  struct ChainCall;
  // Sends `call` to this head (the callback marks it replied).
  void StartChainCall(const std::shared_ptr<ChainCall>& call, double hops);
  // One chain call to this head, as an answer for the route's hops.
  mesh::ChainAnswer CallChain(const pb::StepRequest& req, const std::vector<RemoteEndpoint*>& hops,
                              int64_t route_epoch);
  // The chain calls in flight (their callbacks hold this): the endpoint's
  // end cancels them and waits for their callbacks.
  struct ChainCalls {
    Mutex mu;
    CondVar none{&mu};
    std::set<grpc::ClientContext*> live GUARDED_BY(mu);
  };
  std::shared_ptr<ChainCalls> chain_calls = std::make_shared<ChainCalls>();
};

std::shared_ptr<util::RankGate> MakePipelineGate(const ClientOptions& options) {
  if (options.pipeline_depth <= 0) return nullptr;
  return std::make_shared<util::RankGate>(options.pipeline_depth);
}

std::unique_ptr<mesh::CohortCarrier> MakeCohortCarrier(const ClientOptions& options) {
  if (!options.carry_cohorts || options.pipeline_depth != 1 || !options.group_steps ||
      options.want_logits) {
    return nullptr;
  }
  return std::make_unique<mesh::CohortCarrier>(options.transit_wait_s);
}

RemoteEndpoint::RemoteEndpoint(std::string address, const ClientOptions& options,
                               std::shared_ptr<util::RankGate> gate)
    : impl_(std::make_unique<Impl>()) {
  options.Validate();
  impl_->gate = std::move(gate);
  impl_->address = std::move(address);
  impl_->options = options;
  impl_->channel = MakeChannel(impl_->address, options);
  impl_->stub = pb::MeshNode::NewStub(impl_->channel);
  if (!options.auth_token.empty()) impl_->bearer = BearerValue(options.auth_token);
}

RemoteEndpoint::~RemoteEndpoint() {
  Impl::ChainCalls& calls = *impl_->chain_calls;
  MutexLock lock(&calls.mu);
  for (grpc::ClientContext* ctx : calls.live) ctx->TryCancel();
  while (!calls.live.empty()) calls.none.Wait();
}

std::string RemoteEndpoint::name() const { return impl_->address; }

mesh::ShardInfo RemoteEndpoint::Info() { return InfoFull().shard; }

NodeInfo RemoteEndpoint::InfoFull() {
  grpc::ClientContext ctx;
  // Waits for a (re)connection within the deadline: a restarting node counts.
  impl_->Prepare(ctx, impl_->options.info_timeout_s, /*wait_for_ready=*/true);
  pb::InfoResponse resp;
  const grpc::Status s = impl_->stub->Info(&ctx, pb::InfoRequest(), &resp);
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
      s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    // No connection: the node is down, or one side speaks TLS and the other
    // not, which gRPC reports only as a timeout or a closed socket.
    const bool tls = !impl_->options.tls_ca.empty();
    grpc::Status hinted(
        s.error_code(),
        s.error_message() + " (no connection: is the node up? if it is, check TLS: this client " +
            (tls ? "uses TLS (--tls-ca); does the node have --tls-cert?"
                 : "is plaintext; a node started with --tls-cert needs --tls-ca here") +
            ")");
    ThrowForStatus(hinted, ctx, impl_->address, "Info");
  }
  if (!s.ok()) ThrowForStatus(s, ctx, impl_->address, "Info");
  return DecodeClientInfo(resp);
}

mesh::StepResult RemoteEndpoint::Impl::StepAlone(const pb::StepRequest& req, int64_t route_epoch,
                                                 uint64_t step_id) {
  const ClientOptions& o = options;
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext ctx;
    Prepare(ctx, o.timeout_s, /*wait_for_ready=*/false);
    pb::StepResponse resp;
    const grpc::Status s = stub->Step(&ctx, req, &resp);
    if (s.ok()) return DecodeAnswer(resp, route_epoch, address, "Step");
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE && attempt < o.step_retries &&
        channel->WaitForConnected(After(o.connect_timeout_s))) {
      ClientLog().debug("event=step_retry node={} step={} reason=\"{}\"", address, step_id,
                        s.error_message());
      continue;
    }
    ThrowForStatus(s, ctx, address, "Step");
  }
}

// A step waiting to go out in a StepMany call. Lives on its caller's stack;
// the leader fills it while its caller waits (all under group_mu but the
// fields the leader writes before setting `done`).
struct RemoteEndpoint::Impl::Waiter {
  explicit Waiter(Mutex* mu) : wake(mu) {}
  const pb::StepRequest* req = nullptr;
  bool done = false;
  bool alone = false;          // the group call was refused: send it on its own
  bool counted = false;        // the leader counted it in transit (Transit::Count)
  pb::StepOutcome outcome;     // the node's answer for this step
  std::optional<Error> error;  // the call failed as a whole
  CondVar wake;                // done, or this waiter is the queue's front
};

RemoteEndpoint::Impl::ManyCall RemoteEndpoint::Impl::CallMany(const pb::StepManyRequest& req,
                                                              pb::StepManyResponse* resp,
                                                              std::optional<Error>* failed) {
  const int n = req.steps_size();
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext ctx;
    Prepare(ctx, options.timeout_s, /*wait_for_ready=*/false);
    resp->Clear();
    const grpc::Status s = stub->StepMany(&ctx, req, resp);
    if (s.ok() && resp->outcomes_size() == n) return ManyCall::kAnswered;
    if (s.ok()) {
      failed->emplace(ErrorKind::kUnavailable, address +
                                                   ": StepMany: malformed answer from the node: " +
                                                   std::to_string(resp->outcomes_size()) +
                                                   " outcomes for " + std::to_string(n) + " steps");
      return ManyCall::kFailed;
    }
    const grpc::StatusCode code = s.error_code();
    if (code == grpc::StatusCode::UNAVAILABLE && attempt < options.step_retries &&
        channel->WaitForConnected(After(options.connect_timeout_s))) {
      continue;  // same step ids: the node answers repeats from its idempotency cache
    }
    if (code == grpc::StatusCode::UNIMPLEMENTED) node_groups.store(false);
    const bool transport =
        code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ||
        code == grpc::StatusCode::CANCELLED || code == grpc::StatusCode::UNAUTHENTICATED ||
        code == grpc::StatusCode::PERMISSION_DENIED;
    if (!transport) return ManyCall::kAlone;  // an older node, a message limit...
    try {
      ThrowForStatus(s, ctx, address, "StepMany");
    } catch (const Error& e) {
      *failed = e;
    }
    return failed->has_value() ? ManyCall::kFailed : ManyCall::kAlone;
  }
}

void RemoteEndpoint::Impl::SendMany(const std::vector<Waiter*>& batch) {
  pb::StepManyRequest req;
  for (const Waiter* w : batch) *req.add_steps() = *w->req;
  pb::StepManyResponse resp;
  std::optional<Error> failed;
  const ManyCall call = CallMany(req, &resp, &failed);
  for (size_t i = 0; i < batch.size(); ++i) {
    Waiter* w = batch[i];
    if (call == ManyCall::kAnswered) w->outcome.Swap(resp.mutable_outcomes(static_cast<int>(i)));
    w->alone = call == ManyCall::kAlone;  // each step on its own
    if (call == ManyCall::kFailed) w->error = failed;
  }
}

mesh::StepResult RemoteEndpoint::Impl::OutcomeResult(const pb::StepOutcome& o,
                                                     int64_t route_epoch) const {
  if (o.code() != 0) {
    std::optional<std::string_view> kind;
    if (!o.kind().empty()) kind = o.kind();
    ThrowForCode(static_cast<grpc::StatusCode>(o.code()), kind, o.message(), address, "Step");
  }
  return DecodeAnswer(o.response(), route_epoch, address, "Step");
}

namespace {

using util::Transit;

// A step of one row (a decode step) with no logits row asked for: small on
// the wire whatever the model (32 of them are smaller than one full-context
// step, the node's message limit), so it may go out in a group.
bool Groupable(const mesh::StepRequest& r, const ClientOptions& o) {
  if (!o.group_steps || o.want_logits || r.want_logits) return false;
  return r.bundle ? r.bundle->n_tokens == 1 : r.token_ids.size() == 1;
}

// On Step's return: answered, this session's next step follows soon (or its
// Release), so it is in transit; not when Step throws.
struct MarkOnReturn {
  const int unwinding = std::uncaught_exceptions();
  bool counted = false;  // by the leader of its group call
  ~MarkOnReturn() {
    const bool ok = std::uncaught_exceptions() == unwinding;
    if (counted) {
      ok ? Transit::Get().Adopt() : Transit::Get().Uncount();
    } else if (ok) {
      Transit::Get().Mark();
    }
  }
};

}  // namespace

mesh::StepResult RemoteEndpoint::Step(mesh::StepRequest request) {
  Impl& m = *impl_;
  const ClientOptions& o = m.options;
  pb::StepRequest req;
  const bool groupable = Groupable(request, o) && m.node_groups.load();
  EncodeStepRequest(request, o.wire_dtype, o.wire_dtype, o.want_logits || request.want_logits,
                    &req);
  MarkOnReturn mark;
  if (!groupable) {
    Transit::Get().Clear();
    return m.StepAlone(req, request.route_epoch, request.step_id);
  }
  Impl::Waiter self(&m.group_mu);
  self.req = &req;
  std::vector<Impl::Waiter*> batch;
  bool lead = false;
  {
    MutexLock lock(&m.group_mu);
    m.group_queue.push_back(&self);
    // Out of transit once queued, not before: a leader that saw nobody in
    // transit takes every step that will be in its call.
    Transit::Get().Clear();
    while (!self.done && (m.group_sending || m.group_queue.front() != &self)) self.wake.Wait();
    lead = !self.done;
    if (lead) m.group_sending = true;  // the others queue while the leader waits
  }
  // The leader's place among the client's calls in flight (pipeline_depth):
  // while it waits, more steps join its queue.
  std::optional<util::RankGate::Hold> place;
  if (lead) {
    place.emplace(m.gate.get(), request.bundle ? request.bundle->next_layer : 0);
    do {
      Transit::Get().Wait(o.transit_wait_s);
    } while (place->Yield());  // a cohort behind reached an earlier node: it goes first
    MutexLock lock(&m.group_mu);
    m.TakeBatchLocked(&batch);
  }
  if (!batch.empty()) {  // this thread leads: one call for the batch
    std::optional<mesh::StepResult> result;
    std::exception_ptr error;
    if (batch.size() > 1) {
      m.SendMany(batch);
    } else {
      try {
        result = m.StepAlone(req, request.route_epoch, request.step_id);
      } catch (...) {
        error = std::current_exception();
      }
    }
    place.reset();
    m.FinishBatch(batch);
    if (error) std::rethrow_exception(error);
    if (result) return std::move(*result);
  }
  mark.counted = self.counted;
  if (self.alone) return m.StepAlone(req, request.route_epoch, request.step_id);
  if (self.error) throw *self.error;
  return m.OutcomeResult(self.outcome, request.route_epoch);
}

void RemoteEndpoint::Impl::StepGroupCall(std::span<const mesh::StepRequest> requests,
                                         std::span<mesh::GroupAnswer> answers) {
  pb::StepManyRequest req;
  for (const mesh::StepRequest& r : requests) {
    EncodeStepRequest(r, options.wire_dtype, options.wire_dtype,
                      options.want_logits || r.want_logits, req.add_steps());
  }
  pb::StepManyResponse resp;
  std::optional<Error> failed;
  ManyCall call = ManyCall::kAlone;
  if (requests.size() > 1 && node_groups.load()) call = CallMany(req, &resp, &failed);
  for (size_t i = 0; i < requests.size(); ++i) {
    const int k = static_cast<int>(i);
    try {
      if (call == ManyCall::kFailed) throw *failed;
      answers[i].result =
          call == ManyCall::kAnswered
              ? OutcomeResult(resp.outcomes(k), requests[i].route_epoch)
              : StepAlone(req.steps(k), requests[i].route_epoch, requests[i].step_id);
    } catch (...) {
      answers[i].error = std::current_exception();
    }
  }
}

std::vector<mesh::GroupAnswer> RemoteEndpoint::StepGroup(
    std::span<const mesh::StepRequest> requests) {
  Impl& m = *impl_;
  std::vector<mesh::GroupAnswer> answers(requests.size());
  if (requests.empty()) return answers;
  const mesh::StepRequest& front = requests.front();
  util::RankGate::Hold place(m.gate.get(), front.bundle ? front.bundle->next_layer : 0);
  // Calls of at most kMaxGroupedSteps, one after another: each grouped step
  // takes one of the node's per-peer call slots (32 by default).
  for (size_t at = 0; at < requests.size(); at += Impl::kMaxGroupedSteps) {
    const size_t n = std::min(Impl::kMaxGroupedSteps, requests.size() - at);
    m.StepGroupCall(requests.subspan(at, n), std::span(answers).subspan(at, n));
  }
  return answers;
}

int64_t RemoteEndpoint::steps_waiting() const {
  MutexLock lock(&impl_->group_mu);
  return static_cast<int64_t>(impl_->group_queue.size());
}

void RemoteEndpoint::Impl::TakeBatchLocked(std::vector<Waiter*>* batch) {
  group_sending = true;
  while (!group_queue.empty() && batch->size() < kMaxGroupedSteps) {
    batch->push_back(group_queue.front());
    group_queue.pop_front();
  }
}

void RemoteEndpoint::Impl::FinishBatch(const std::vector<Waiter*>& batch) {
  if (batch.size() > 1) {  // its answered members go on together
    int64_t answered = 0;
    for (Waiter* w : batch) {
      w->counted = !w->alone && !w->error && w->outcome.code() == 0;
      answered += w->counted;
    }
    Transit::Get().Count(answered);
  }
  MutexLock lock(&group_mu);
  group_sending = false;
  for (Waiter* w : batch) {
    w->done = true;
    w->wake.Signal();
  }
  if (!group_queue.empty()) group_queue.front()->wake.Signal();  // it leads next
}

namespace {

class StreamClientImpl final : public StepStreamClient {
 public:
  StreamClientImpl(pb::MeshNode::Stub* stub, const ClientOptions& o, const std::string& bearer,
                   std::string address, int max_steps)
      : options_(o), address_(std::move(address)) {
    ctx_.set_deadline(After(o.timeout_s * std::max(1, max_steps)));
    if (!bearer.empty()) ctx_.AddMetadata("authorization", bearer);
    stream_ = stub->StepStream(&ctx_);
  }
  ~StreamClientImpl() override {
    if (!closed_) ctx_.TryCancel();
  }

  mesh::StepResult Step(const mesh::StepRequest& request) override {
    req_.Clear();
    EncodeStepRequest(request, options_.wire_dtype, options_.wire_dtype,
                      options_.want_logits || request.want_logits, &req_);
    if (closed_ || !stream_->Write(req_) || !stream_->Read(&resp_)) Finish("Step");
    return DecodeAnswer(resp_, request.route_epoch, address_, "StepStream");
  }

  void Close() override {
    if (closed_) return;
    stream_->WritesDone();
    closed_ = true;
    const grpc::Status s = stream_->Finish();
    if (!s.ok()) ThrowForStatus(s, ctx_, address_, "StepStream");
  }

 private:
  [[noreturn]] void Finish(const char* what) {
    closed_ = true;
    const grpc::Status s = stream_->Finish();
    if (s.ok()) throw Error(ErrorKind::kUnavailable, address_ + ": stream ended early");
    ThrowForStatus(s, ctx_, address_, what);
  }

  ClientOptions options_;
  std::string address_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::StepRequest, pb::StepResponse>> stream_;
  pb::StepRequest req_;
  pb::StepResponse resp_;
  bool closed_ = false;
};

}  // namespace

std::unique_ptr<StepStreamClient> RemoteEndpoint::OpenStepStream(int max_steps) {
  return std::make_unique<StreamClientImpl>(impl_->stub.get(), impl_->options, impl_->bearer,
                                            impl_->address, max_steps);
}

bool RemoteEndpoint::ReleaseOrThrow(const std::string& session_id,
                                    const std::string& session_secret, int64_t route_epoch,
                                    bool park) {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, impl_->options.info_timeout_s, /*wait_for_ready=*/false);
  pb::ReleaseRequest req;
  req.set_session_id(session_id);
  req.set_session_secret(session_secret);
  req.set_route_epoch(route_epoch);
  req.set_park(park);
  pb::ReleaseResponse resp;
  const grpc::Status s = impl_->stub->Release(&ctx, req, &resp);
  if (!s.ok()) ThrowForStatus(s, ctx, impl_->address, "Release");
  return resp.released();
}

// ---------------------------------------------------------------------------
// Chain forwarding

std::shared_ptr<ReturnListener> RemoteEndpoint::Impl::Returns() {
  std::shared_ptr<ReturnListener> ended;  // joined outside the lock
  MutexLock lock(&returns_mu);
  if (returns && !returns->ended()) return returns;
  const auto now = std::chrono::steady_clock::now();
  if (returns && now - returns_opened < std::chrono::duration<double>(kReopenS)) return nullptr;
  ended = std::move(returns);
  returns = std::make_shared<ReturnListener>(channel, bearer);
  returns_opened = now;
  return returns;
}

// One chain call: the head's reply and the tail's direct return race; the
// first wins. Shared by the waiting step and the call's callback (which may
// come after the step took the direct return).
struct RemoteEndpoint::Impl::ChainCall {
  grpc::ClientContext ctx;
  pb::StepRequest req;
  pb::StepResponse reply;
  Mutex mu;
  CondVar changed{&mu};
  bool replied GUARDED_BY(mu) = false;
  grpc::Status status GUARDED_BY(mu);
  std::optional<pb::StepResponse> returned GUARDED_BY(mu);
};

namespace {

// A chain answer from the route's reply `resp` (or a direct return).
mesh::ChainAnswer ChainResult(pb::StepResponse& resp, const std::vector<RemoteEndpoint*>& hops,
                              int64_t route_epoch) {
  mesh::ChainAnswer answer;
  answer.hop = static_cast<size_t>(std::max(0, resp.chain_hop()));
  answer.route_compute_micros = resp.route_compute_micros();
  const std::string peer =
      answer.hop < hops.size() ? hops[answer.hop]->name() : "hop " + std::to_string(answer.hop);
  try {
    if (resp.chain_code() != 0) {
      std::optional<std::string_view> kind;
      if (!resp.chain_kind().empty()) kind = resp.chain_kind();
      ThrowForCode(static_cast<grpc::StatusCode>(resp.chain_code()), kind, resp.chain_message(),
                   peer, "Step (forwarded)");
    }
    answer.result = DecodeAnswer(resp, route_epoch, peer, "Step");
  } catch (...) {
    answer.error = std::current_exception();
  }
  return answer;
}

}  // namespace

void RemoteEndpoint::Impl::StartChainCall(const std::shared_ptr<ChainCall>& call, double hops) {
  // The route's deadline: each hop gives the rest of the route a share of
  // what it has left (rpc/forward.h), so a stalled hop is named by the hop
  // before it, in time.
  Prepare(call->ctx, options.timeout_s * hops, /*wait_for_ready=*/false);
  {
    MutexLock lock(&chain_calls->mu);
    chain_calls->live.insert(&call->ctx);
  }
  stub->async()->Step(&call->ctx, &call->req, &call->reply,
                      [call, calls = chain_calls](grpc::Status s) {
                        {
                          MutexLock lock(&call->mu);
                          call->status = std::move(s);
                          call->replied = true;
                          call->changed.SignalAll();
                        }
                        MutexLock lock(&calls->mu);
                        calls->live.erase(&call->ctx);
                        calls->none.SignalAll();
                      });
}

mesh::ChainAnswer RemoteEndpoint::Impl::CallChain(const pb::StepRequest& req,
                                                  const std::vector<RemoteEndpoint*>& hops,
                                                  int64_t route_epoch) {
  for (int attempt = 0;; ++attempt) {
    auto call = std::make_shared<ChainCall>();
    call->req = req;
    std::shared_ptr<ReturnListener> listener = hops.back()->impl_->Returns();
    const bool direct = listener && listener->ready();
    if (direct) {
      call->req.set_return_id(listener->id());
      listener->Expect(req.session_id(), req.step_id(), [call](pb::StepResponse r) {
        MutexLock lock(&call->mu);
        call->returned = std::move(r);
        call->changed.SignalAll();
      });
    }
    StartChainCall(call, static_cast<double>(hops.size()));
    std::optional<pb::StepResponse> returned;
    grpc::Status status;
    {
      MutexLock lock(&call->mu);
      while (!call->replied && !call->returned) call->changed.Wait();
      if (call->returned) {
        returned = std::move(call->returned);
      } else {
        status = call->status;
      }
    }
    if (direct) listener->Forget(req.session_id(), req.step_id());
    if (returned) return ChainResult(*returned, hops, route_epoch);
    if (status.ok()) return ChainResult(call->reply, hops, route_epoch);
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE && attempt < options.step_retries &&
        channel->WaitForConnected(After(options.connect_timeout_s))) {
      continue;  // same step id: every hop answers a repeat from its idempotency cache
    }
    mesh::ChainAnswer failed;
    try {
      ThrowForStatus(status, call->ctx, address, "Step");
    } catch (...) {
      failed.error = std::current_exception();
    }
    return failed;
  }
}

std::optional<mesh::ChainAnswer> RemoteEndpoint::ChainStep(mesh::StepRequest request,
                                                           mesh::RouteHops route) {
  Impl& m = *impl_;
  const ClientOptions& o = m.options;
  if (!o.chain || route.size() < 2 || route.front().get() != this) return std::nullopt;
  std::vector<RemoteEndpoint*> hops;
  for (const auto& hop : route) {
    auto* remote = dynamic_cast<RemoteEndpoint*>(hop.get());
    if (remote == nullptr) return std::nullopt;
    hops.push_back(remote);
  }
  pb::StepRequest req;
  EncodeStepRequest(request, o.wire_dtype, o.wire_dtype, o.want_logits || request.want_logits,
                    &req);
  for (const RemoteEndpoint* hop : hops) req.add_chain_route(hop->name());
  req.set_chain_index(0);
  MarkOnReturn mark;
  Transit::Get().Clear();
  return m.CallChain(req, hops, request.route_epoch);
}

void RemoteEndpoint::Release(const std::string& session_id, const std::string& session_secret,
                             int64_t route_epoch) {
  Transit::Get().Clear();  // the session ends (or re-plans): no next step is coming here
  try {
    ReleaseOrThrow(session_id, session_secret, route_epoch);
  } catch (const Error& e) {
    ClientLog().debug("event=release_failed message=\"{}\"", e.what());  // best effort
  }
}

void RemoteEndpoint::Park(const std::string& session_id, const std::string& session_secret,
                          int64_t route_epoch) {
  try {
    ReleaseOrThrow(session_id, session_secret, route_epoch, /*park=*/true);
  } catch (const Error& e) {
    ClientLog().debug("event=park_failed message=\"{}\"", e.what());  // best effort
  }
}

int64_t RemoteEndpoint::Truncate(const std::string& session_id, const std::string& session_secret,
                                 int64_t route_epoch, int64_t length) {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, impl_->options.timeout_s, /*wait_for_ready=*/false);
  pb::TruncateRequest req;
  req.set_session_id(session_id);
  req.set_session_secret(session_secret);
  req.set_route_epoch(route_epoch);
  req.set_length(length);
  pb::TruncateResponse resp;
  const grpc::Status s = impl_->stub->Truncate(&ctx, req, &resp);
  if (!s.ok()) ThrowForStatus(s, ctx, impl_->address, "Truncate");
  if (resp.has_miss()) throw kv::CacheMissError(DecodeCacheMiss(resp.miss()));
  return resp.seq_len();
}

// ---------------------------------------------------------------------------
// RemoteRouteProvider

namespace {

// What one planning round learned from the nodes.
struct Survey {
  std::vector<std::optional<NodeInfo>> infos;  // parallel to the endpoints; empty: unreachable
  std::vector<std::string> notes;              // why nodes are left out
  bool denied = false;                         // some node refused our credentials

  bool complete() const {
    return std::all_of(infos.begin(), infos.end(), [](const auto& i) { return i.has_value(); });
  }

  std::string WithNotes(std::string msg) const {
    if (!notes.empty()) {
      msg += " (";
      for (size_t i = 0; i < notes.size(); ++i) msg += (i ? "; " : "") + notes[i];
      msg += ")";
    }
    return msg;
  }
};

// Asks every node for Info at once (no lock held across the calls).
Survey AskAll(const std::vector<std::shared_ptr<RemoteEndpoint>>& endpoints) {
  std::vector<std::future<NodeInfo>> futures;
  futures.reserve(endpoints.size());
  for (const auto& ep : endpoints) {
    futures.push_back(std::async(std::launch::async, [ep] { return ep->InfoFull(); }));
  }
  Survey s;
  s.infos.resize(endpoints.size());
  for (size_t i = 0; i < endpoints.size(); ++i) {
    try {
      s.infos[i] = futures[i].get();
    } catch (const Error& e) {
      s.denied = s.denied || e.kind() == ErrorKind::kPermissionDenied;
      s.notes.push_back(endpoints[i]->name() + " unreachable (" + e.what() + ")");
    } catch (const std::exception& e) {
      s.notes.push_back(endpoints[i]->name() + " unreachable (" + e.what() + ")");
    }
  }
  return s;
}

// One model across the mesh: kInvalidArgument naming two nodes that differ.
void CheckOneModel(const Survey& survey, const std::vector<size_t>& usable,
                   const std::vector<std::shared_ptr<RemoteEndpoint>>& endpoints) {
  const mesh::ShardInfo& ref = survey.infos[usable.front()]->shard;
  for (size_t i : usable) {
    const mesh::ShardInfo& s = survey.infos[i]->shard;
    if (s.model_id != ref.model_id || s.architecture != ref.architecture ||
        s.total_layers != ref.total_layers) {
      ThrowInvalidArgument("nodes serve different models: " + endpoints[usable.front()]->name() +
                           " serves " + ref.architecture + " model " + ref.model_id.substr(0, 16) +
                           " (" + std::to_string(ref.total_layers) + " layers) but " +
                           endpoints[i]->name() + " serves " + s.architecture + " model " +
                           s.model_id.substr(0, 16) + " (" + std::to_string(s.total_layers) +
                           " layers)");
    }
  }
}

}  // namespace

struct RemoteRouteProvider::Impl {
  ClientOptions options;
  std::vector<std::shared_ptr<RemoteEndpoint>> endpoints;
  std::unique_ptr<mesh::CohortCarrier> carrier;  // ClientOptions::carry_cohorts, or null

  struct NodeState {
    bool dead = false;
    std::chrono::steady_clock::time_point dead_since;
    std::string dead_instance;  // instance id when it was marked dead
    std::string last_instance;  // from the latest Info
  };
  Mutex mu;
  std::vector<NodeState> state GUARDED_BY(mu);  // parallel to endpoints

  // The latest complete survey, reusable until ClientOptions::survey_max_age_s
  // after it began, and the sessions planned through each node since.
  std::optional<Survey> survey GUARDED_BY(mu);
  std::chrono::steady_clock::time_point survey_began GUARDED_BY(mu);
  std::vector<int64_t> planned_since GUARDED_BY(mu);
  uint64_t survey_id GUARDED_BY(mu) = 0;  // counts the surveys kept
  bool surveying GUARDED_BY(mu) = false;  // one survey in flight at a time
  CondVar surveyed{&mu};

  // The survey a plan uses (reused, or asked now or by a concurrent plan);
  // *planned: the sessions planned through each node since it, *which: its
  // survey_id (0: not kept), for NotePlanned.
  Survey CurrentSurvey(std::vector<int64_t>* planned, uint64_t* which) EXCLUDES(mu);
  void NotePlanned(uint64_t which, std::span<const size_t> nodes) EXCLUDES(mu);

  // The surveyed nodes a plan may use (alive, or back; our protocol); notes
  // why the others are left out.
  std::vector<size_t> UsableLocked(Survey& survey) REQUIRES(mu);
};

Survey RemoteRouteProvider::Impl::CurrentSurvey(std::vector<int64_t>* planned, uint64_t* which) {
  planned->assign(endpoints.size(), 0);
  *which = 0;
  if (options.survey_max_age_s <= 0) return AskAll(endpoints);
  const auto max_age = std::chrono::duration<double>(options.survey_max_age_s);
  std::chrono::steady_clock::time_point began;
  {
    MutexLock lock(&mu);
    for (;;) {
      if (survey && std::chrono::steady_clock::now() - survey_began < max_age) {
        *planned = planned_since;
        *which = survey_id;
        return *survey;
      }
      if (!surveying) break;
      surveyed.Wait();  // a concurrent plan's survey: fresher than anything here
    }
    surveying = true;
    began = std::chrono::steady_clock::now();
  }
  Survey fresh;
  try {
    fresh = AskAll(endpoints);
  } catch (...) {  // no thread for a call: the next plan asks again
    MutexLock lock(&mu);
    surveying = false;
    surveyed.SignalAll();
    throw;
  }
  MutexLock lock(&mu);
  surveying = false;
  surveyed.SignalAll();
  if (fresh.complete()) {
    survey = fresh;
    survey_began = began;
    planned_since.assign(endpoints.size(), 0);
    *which = ++survey_id;
  } else {
    survey.reset();  // a node did not answer: the next plan asks again
  }
  return fresh;
}

void RemoteRouteProvider::Impl::NotePlanned(uint64_t which, std::span<const size_t> nodes) {
  MutexLock lock(&mu);
  if (which == 0 || which != survey_id) return;  // a newer survey counts afresh
  for (size_t i : nodes) ++planned_since[i];
}

RemoteRouteProvider::RemoteRouteProvider(std::vector<std::string> node_addresses,
                                         const ClientOptions& options)
    : impl_(std::make_unique<Impl>()) {
  if (node_addresses.empty()) ThrowInvalidArgument("no nodes given");
  std::set<std::string> seen;
  for (const auto& a : node_addresses) {
    if (!seen.insert(a).second) ThrowInvalidArgument("node " + a + " is listed twice");
  }
  impl_->options = options;
  impl_->carrier = MakeCohortCarrier(options);
  const std::shared_ptr<util::RankGate> gate = MakePipelineGate(options);
  for (auto& a : node_addresses) {
    impl_->endpoints.push_back(std::make_shared<RemoteEndpoint>(std::move(a), options, gate));
  }
  MutexLock lock(&impl_->mu);
  impl_->state.resize(impl_->endpoints.size());
}

RemoteRouteProvider::~RemoteRouteProvider() = default;

mesh::CohortCarrier* RemoteRouteProvider::carrier() { return impl_->carrier.get(); }

const std::vector<std::shared_ptr<RemoteEndpoint>>& RemoteRouteProvider::endpoints() const {
  return impl_->endpoints;
}

std::shared_ptr<mesh::ShardEndpoint> RemoteRouteProvider::EndpointFor(const std::string& address) {
  for (const auto& ep : impl_->endpoints) {
    if (ep->name() == address) return ep;
  }
  ClientLog().warn("event=move_ignored to={} reason=\"not one of --nodes\"", address);
  return nullptr;
}

void RemoteRouteProvider::MarkDead(const mesh::ShardEndpoint& endpoint) {
  MutexLock lock(&impl_->mu);
  for (size_t i = 0; i < impl_->endpoints.size(); ++i) {
    if (impl_->endpoints[i].get() != &endpoint) continue;
    auto& st = impl_->state[i];
    st.dead = true;
    st.dead_since = std::chrono::steady_clock::now();
    st.dead_instance = st.last_instance;
    ClientLog().info("event=node_dead node={}", endpoint.name());
    impl_->survey.reset();  // the next plan asks every node again
  }
}

std::vector<size_t> RemoteRouteProvider::Impl::UsableLocked(Survey& survey) {
  std::vector<size_t> usable;
  const auto now = std::chrono::steady_clock::now();
  for (size_t i = 0; i < endpoints.size(); ++i) {
    const std::optional<NodeInfo>& info = survey.infos[i];
    if (!info) continue;
    auto& st = state[i];
    st.last_instance = info->instance_id;
    if (st.dead) {
      const double dead_for = std::chrono::duration<double>(now - st.dead_since).count();
      if (info->instance_id != st.dead_instance || dead_for >= options.dead_cooldown_s) {
        st.dead = false;  // restarted, or cooled down
        ClientLog().info("event=node_back node={}", endpoints[i]->name());
      } else {
        survey.notes.push_back(endpoints[i]->name() + " marked dead");
        continue;
      }
    }
    if (info->protocol_version != kProtocolVersion) {
      survey.notes.push_back(endpoints[i]->name() + " speaks protocol v" +
                             std::to_string(info->protocol_version));
      continue;
    }
    usable.push_back(i);
  }
  return usable;
}

mesh::Route RemoteRouteProvider::Plan() {
  Impl& m = *impl_;
  std::vector<int64_t> planned;
  uint64_t which = 0;
  Survey survey = m.CurrentSurvey(&planned, &which);
  std::vector<size_t> usable;
  {
    MutexLock lock(&m.mu);
    usable = m.UsableLocked(survey);
  }
  if (usable.empty()) {
    // A wrong token or certificate is a configuration error, not a dead mesh.
    throw Error(survey.denied ? ErrorKind::kPermissionDenied : ErrorKind::kUnavailable,
                survey.WithNotes("no node is available"));
  }
  CheckOneModel(survey, usable, m.endpoints);

  // The client's tokenizer (its --model) must be the nodes' model: token ids
  // of another vocabulary would decode to garbage.
  if (!m.options.expected_model_id.empty() &&
      survey.infos[usable.front()]->shard.model_id != m.options.expected_model_id) {
    ThrowInvalidArgument(
        "the nodes serve model " + survey.infos[usable.front()]->shard.model_id.substr(0, 16) +
        " but this client's tokenizer comes from model " +
        m.options.expected_model_id.substr(0, 16) + ": give --model the GGUF the nodes serve");
  }

  std::vector<mesh::RouteCandidate> candidates;
  for (size_t i : usable) {
    const mesh::ShardInfo& s = survey.infos[i]->shard;
    candidates.push_back({m.endpoints[i]->name(), s.start_layer, s.end_layer,
                          s.live_sessions + planned[i], s.kv_bytes_free});
  }
  std::vector<size_t> picked;
  try {
    picked = mesh::PlanRoute(candidates, survey.infos[usable.front()]->shard.total_layers);
  } catch (const Error& e) {
    throw Error(e.kind(), survey.WithNotes(e.what()));
  }
  mesh::Route route;
  std::vector<size_t> nodes;
  for (size_t k : picked) {
    route.hops.push_back(m.endpoints[usable[k]]);
    nodes.push_back(usable[k]);
  }
  m.NotePlanned(which, nodes);
  return route;
}

std::unique_ptr<RemoteRouteProvider> MakeRemoteRouteProvider(
    const std::vector<std::string>& node_addresses, const ClientOptions& options) {
  return std::make_unique<RemoteRouteProvider>(node_addresses, options);
}

std::vector<std::string> ParseNodeList(const std::string& csv) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t comma = csv.find(',', pos);
    std::string item =
        csv.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const size_t b = item.find_first_not_of(" \t");
    const size_t e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    const size_t colon = item.rfind(':');
    int port = 0;
    bool ok = colon != std::string::npos && colon > 0 && colon + 1 < item.size();
    if (ok) {
      const char* p = item.data() + colon + 1;
      const char* end = item.data() + item.size();
      auto [q, ec] = std::from_chars(p, end, port);
      ok = ec == std::errc() && q == end && port >= 1 && port <= 65535;
    }
    if (!ok) {
      ThrowInvalidArgument("invalid node address '" + item + "' in --nodes '" + csv +
                           "': expected host:port with a port in 1..65535");
    }
    if (std::find(out.begin(), out.end(), item) != out.end()) {
      ThrowInvalidArgument("node " + item + " is listed twice in --nodes");
    }
    out.push_back(item);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace meshnet::rpc
