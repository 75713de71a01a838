// The client side of the mesh over gRPC: a ShardEndpoint per node and a
// RouteProvider that plans routes over a list of nodes. No gRPC types here;
// `meshnet generate --nodes` includes this.
//
//   rpc::ClientOptions opts;                       // token, TLS, timeouts
//   auto provider = rpc::MakeRemoteRouteProvider({"127.0.0.1:7001", ...}, opts);
//   mesh::Generate(*provider, prompt_ids, gen_options);
//
// Steps of many sessions (mesh::MultiSessionDriver, the gateway) are grouped:
// one call in flight per node, and the decode steps (one row, no logits row)
// that came while it was out go together as the next call (StepMany), so a
// node gets its batch in one message, not one call per session (the gRPC work
// and wake-ups of a call are paid once per batch). A lone step goes out at
// once as a unary Step; a node that does not know StepMany
// (UNIMPLEMENTED) or refuses the group gets each step on its own. Outcomes stay
// per step: one session's miss or error is its own. With
// ClientOptions::pipeline_depth, at most that many of these calls are out at
// once across the client's endpoints, the one to the earliest layers first.
//
// RemoteEndpoint::Step sends one unary call with a deadline. UNAVAILABLE is
// retried (same step id; the node answers a retry from its idempotency cache)
// after waiting up to connect_timeout for the connection; UNAVAILABLE,
// DEADLINE_EXCEEDED, CANCELLED or a corrupt answer then throw
// Error(kUnavailable), which the generator treats as a dead hop. Other
// statuses map back to their meshnet ErrorKind (table in proto/meshnet.proto).
//
// RemoteRouteProvider::Plan asks every node for Info (in parallel; a survey
// younger than ClientOptions::survey_max_age_s in which every node answered is
// reused, with the sessions planned since added to each node's load), checks that
// all answering nodes serve one model (same model id, architecture and layer
// count; otherwise Error(kInvalidArgument) naming them), and plans with
// mesh::PlanRoute (fewest hops, then least loaded). A node marked dead is left
// out for dead_cooldown_s, or until its Info shows a new instance id (a
// restart).
//
// Thread-safety: endpoints and the provider are safe to use from several
// threads (one channel per node, shared).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mesh/endpoint.h"
#include "mesh/generator.h"
#include "node/step.h"
#include "rpc/options.h"
#include "util/rank_gate.h"

namespace meshnet::rpc {

// A node's Info as a client receives it.
struct NodeInfo : node::NodeInfo {
  uint32_t protocol_version = 0;
};

// The steps of one session on one node over one bidirectional stream
// (StepStream): the measured alternative to unary Step (bench/rpc_bench.cc).
// The generator uses unary calls; this exists for the measurement and for
// clients that pin a session to a node. Not thread-safe: one caller.
class StepStreamClient {
 public:
  virtual ~StepStreamClient() = default;
  // One request, one answer, in order. Errors as RemoteEndpoint::Step; after
  // an error the stream is finished.
  virtual mesh::StepResult Step(const mesh::StepRequest& request) = 0;
  // Half-closes and waits for the node's status.
  virtual void Close() = 0;
};

class RemoteEndpoint final : public mesh::ShardEndpoint {
 public:
  // Validates options; reads TLS files (kInvalidArgument if unreadable). The
  // channel connects lazily. `gate`: shared by the endpoints of one client
  // to bound its grouped calls in flight (ClientOptions::pipeline_depth;
  // providers make it); null: no bound.
  RemoteEndpoint(std::string address, const ClientOptions& options,
                 std::shared_ptr<util::RankGate> gate = nullptr);
  ~RemoteEndpoint() override;

  std::string name() const override;  // the address
  mesh::ShardInfo Info() override;
  NodeInfo InfoFull();
  mesh::StepResult Step(mesh::StepRequest request) override;
  // One StepMany call (a lone step: a Step), in the pipeline gate's turn;
  // a node that refuses StepMany gets the steps one by one.
  std::vector<mesh::GroupAnswer> StepGroup(std::span<const mesh::StepRequest> requests) override;
  // With ClientOptions::chain and a route of RemoteEndpoints: one Step
  // call to this node naming the whole route (StepRequest.chain_route); the
  // tail's answer comes on its Returns stream (rpc/return_listener.h) or,
  // failing that, as this node's reply.
  std::optional<mesh::ChainAnswer> ChainStep(mesh::StepRequest request,
                                             mesh::RouteHops route) override;
  void Release(const std::string& session_id, const std::string& session_secret,
               int64_t route_epoch) override;
  // Keeps the first `length` positions. A miss throws kv::CacheMissError.
  int64_t Truncate(const std::string& session_id, const std::string& session_secret,
                   int64_t route_epoch, int64_t length) override;
  void Park(const std::string& session_id, const std::string& session_secret,
            int64_t route_epoch) override;
  // A stream for many steps; its deadline is `timeout_s` per step times
  // `max_steps`.
  std::unique_ptr<StepStreamClient> OpenStepStream(int max_steps);
  // Steps queued for this node's next group call (for tests).
  int64_t steps_waiting() const;
  // Release that reports failures (for tests and tools): true if state was
  // held. `park`: keep the state, parked (Park).
  bool ReleaseOrThrow(const std::string& session_id, const std::string& session_secret,
                      int64_t route_epoch, bool park = false);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class RemoteRouteProvider final : public mesh::RouteProvider {
 public:
  // Throws kInvalidArgument for an empty or duplicated address list.
  RemoteRouteProvider(std::vector<std::string> node_addresses, const ClientOptions& options);
  ~RemoteRouteProvider() override;

  mesh::Route Plan() override;
  void MarkDead(const mesh::ShardEndpoint& endpoint) override;
  // One of the listed nodes (a session moved there), else nullptr.
  std::shared_ptr<mesh::ShardEndpoint> EndpointFor(const std::string& address) override;
  mesh::CohortCarrier* carrier() override;
  const std::vector<std::shared_ptr<RemoteEndpoint>>& endpoints() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The gate of ClientOptions::pipeline_depth (null when it is 0).
std::shared_ptr<util::RankGate> MakePipelineGate(const ClientOptions& options);
// The carrier of ClientOptions::carry_cohorts (null when it does not apply).
std::unique_ptr<mesh::CohortCarrier> MakeCohortCarrier(const ClientOptions& options);

// What `meshnet generate --nodes` calls.
std::unique_ptr<RemoteRouteProvider> MakeRemoteRouteProvider(
    const std::vector<std::string>& node_addresses, const ClientOptions& options);

// "a:1,b:2" -> {"a:1", "b:2"}; each must be host:port with a port in 1..65535.
// Throws kInvalidArgument naming the bad entry.
std::vector<std::string> ParseNodeList(const std::string& csv);

}  // namespace meshnet::rpc
