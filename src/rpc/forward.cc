#include "rpc/forward.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "rpc/auth.h"
#include "rpc/channel.h"
#include "rpc/prove.h"
#include "rpc/status.h"
#include "util/error.h"
#include "util/host_port.h"

namespace meshnet::rpc {

namespace {

using SteadyClock = std::chrono::steady_clock;

// The answer of a hop that could not be reached, refused the step or failed.
void SetFailure(int hop, grpc::StatusCode code, std::string_view kind, const std::string& message,
                pb::StepResponse* out) {
  out->Clear();
  out->set_chain_hop(hop);
  out->set_chain_code(code == grpc::StatusCode::OK ? grpc::StatusCode::UNKNOWN : code);
  out->set_chain_kind(std::string(kind));
  out->set_chain_message(message);
}

}  // namespace

struct Forwarder::Peer {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::MeshNode::Stub> stub;
  SteadyClock::time_point proven_until{};  // guarded by Forwarder::mu_
  // A failed proof, answered again without a new Prove until then.
  SteadyClock::time_point refused_until{};  // guarded by Forwarder::mu_
  std::optional<Error> refusal;             // guarded by Forwarder::mu_
};

Forwarder::Forwarder(ClientOptions peers, Self self)
    : options_(std::move(peers)),
      self_(std::move(self)),
      bearer_(options_.auth_token.empty() ? "" : BearerValue(options_.auth_token)) {}

void Forwarder::CheckChain(const pb::StepRequest& req, const std::string& own_address) {
  const int n = req.chain_route_size();
  if (n == 0) return;
  if (n < 2 || n > kMaxRouteHops) {
    ThrowInvalidArgument("a chain route has 2.." + std::to_string(kMaxRouteHops) + " hops, got " +
                         std::to_string(n));
  }
  const int i = req.chain_index();
  if (i < 0 || i >= n) {
    ThrowInvalidArgument("chain_index " + std::to_string(i) + " is not a hop of the route");
  }
  if (!req.return_id().empty() && (req.return_id().size() < 16 || req.return_id().size() > 64)) {
    ThrowInvalidArgument("a return id holds 16..64 bytes");
  }
  if (own_address.empty()) {
    throw Error(ErrorKind::kPermissionDenied,
                "this node listens on an address that names no host: it cannot check its place "
                "on a chain route (use --forwarding star)");
  }
  std::string named;
  try {
    named = CanonicalHostPort(req.chain_route(i));
  } catch (const Error&) {
    ThrowInvalidArgument("chain route hop " + std::to_string(i) + " is not host:port");
  }
  if (named != own_address) {
    throw Error(ErrorKind::kPermissionDenied, "the step's route names " + named + " as hop " +
                                                  std::to_string(i) + ", not this node (" +
                                                  own_address + "): refused");
  }
  if (i + 1 < n) {
    try {
      (void)CanonicalHostPort(req.chain_route(i + 1));
    } catch (const Error&) {
      ThrowInvalidArgument("chain route hop " + std::to_string(i + 1) + " is not host:port");
    }
  }
}

std::shared_ptr<Forwarder::Peer> Forwarder::ProvenPeer(const std::string& address) {
  std::shared_ptr<Peer> peer;
  {
    MutexLock lock(&mu_);
    auto it = peers_.find(address);
    if (it != peers_.end()) {
      peer = it->second;
      if (SteadyClock::now() < peer->proven_until) return peer;
      if (SteadyClock::now() < peer->refused_until && peer->refusal) throw *peer->refusal;
    } else {
      if (peers_.size() >= kMaxPeers) {
        // Forget a peer no step is using (the map holds the only reference).
        for (auto j = peers_.begin(); j != peers_.end(); ++j) {
          if (j->second.use_count() == 1) {
            peers_.erase(j);
            break;
          }
        }
      }
      if (peers_.size() >= kMaxPeers) {
        throw Error(
            ErrorKind::kResourceExhausted,
            "this node forwards to at most " + std::to_string(kMaxPeers) + " peers at once");
      }
      peer = std::make_shared<Peer>();
      peer->channel = MakeClientChannel(address, options_);
      peer->stub = pb::MeshNode::NewStub(peer->channel);
      peers_.emplace(address, peer);
    }
  }
  // Proven outside the lock (steps racing to a new peer may each prove it).
  try {
    CheckPeer(ProveOn(*peer->stub, address, options_), address);
  } catch (const Error& e) {
    MutexLock lock(&mu_);
    peer->refusal = e;
    peer->refused_until = SteadyClock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(kRefusedSeconds * 1000));
    throw;
  }
  MutexLock lock(&mu_);
  peer->proven_until =
      SteadyClock::now() + std::chrono::milliseconds(static_cast<int64_t>(kProvenSeconds * 1000));
  return peer;
}

void Forwarder::CheckPeer(const ProvenNode& proven, const std::string& address) const {
  if (proven.info.shard.model_id != self_.model_id) {
    throw Error(ErrorKind::kPermissionDenied,
                "will not forward to " + address + ": it serves another model");
  }
  if (proven.info.shard.start_layer != self_.end_layer + 1) {
    throw Error(ErrorKind::kPermissionDenied,
                "will not forward to " + address + ": it serves layers from " +
                    std::to_string(proven.info.shard.start_layer) +
                    ", the next hop must start at " + std::to_string(self_.end_layer + 1));
  }
}

void Forwarder::Forward(std::chrono::system_clock::time_point deadline, pb::StepRequest* next,
                        pb::StepResponse* out) {
  const int hop = next->chain_index() + 1;
  const std::string address = CanonicalHostPort(next->chain_route(hop));
  next->set_chain_index(hop);
  std::shared_ptr<Peer> peer;
  try {
    peer = ProvenPeer(address);
  } catch (const Error& e) {
    SetFailure(hop, StatusCodeFor(e.kind()), ErrorKindName(e.kind()), e.what(), out);
    return;
  }
  // The hops from the next on get their share of what this call has left,
  // this node keeping one share to name a stalled next hop in time.
  const int after = next->chain_route_size() - hop;  // the next hop and those after it
  const auto now = std::chrono::system_clock::now();
  const auto left = std::max(deadline - now, std::chrono::system_clock::duration::zero());
  grpc::ClientContext ctx;
  ctx.set_deadline(now + left * after / (after + 1));
  if (!bearer_.empty()) ctx.AddMetadata("authorization", bearer_);
  forwarded_.fetch_add(1, std::memory_order_relaxed);
  out->Clear();
  const grpc::Status s = peer->stub->Step(&ctx, *next, out);
  if (s.ok()) return;
  std::string kind;
  const auto& trailers = ctx.GetServerTrailingMetadata();
  if (auto it = trailers.find(kErrorKindKey); it != trailers.end()) {
    kind.assign(it->second.data(), it->second.size());
  }
  SetFailure(hop, s.error_code(), kind, address + ": " + s.error_message(), out);
}

}  // namespace meshnet::rpc
