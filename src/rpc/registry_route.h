// RegistryRouteProvider: routes for one model planned from a registry instead
// of a node list (`meshnet generate --registry`, `meshnet api --registry`).
//
// Plan() lists the model's records (the registry's index by model identity:
// nodes of other models cost nothing), leaves out draining nodes and nodes
// marked dead (until dead_cooldown_s passes or the record shows a new
// instance), measures each remaining node's round-trip time with an Info call
// on a warm connection
// (at most every rtt_refresh_s; first the node proves it holds its record's
// key at its address, rpc/prove.h, and the call checks that it serves what its
// record says, which matters for etcd, where nobody verifies announcements),
// scores it (registry/planner.h: round trip beyond
// max(2x, +5 ms) of the range's fastest replica, in-flight steps and
// sessions, free KV, sessions this provider already sent it) and lets
// mesh::PlanRoute pick the fewest hops at the lowest cost. Each plan logs the
// costs (event=route_cost) and counts one session on the nodes it picked, so
// new sessions spread over replicas. A session keeps its route (the generator
// plans again only after a failure).
//
// A registry that cannot be reached does not stop the client: the last view
// is used (event=registry_cached) and refreshed at the next plan that reaches
// the registry again.
//
// Thread-safety: Plan and MarkDead may be called from several threads.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "mesh/generator.h"
#include "registry/planner.h"
#include "registry/registry.h"
#include "rpc/options.h"

namespace meshnet::rpc {

struct RegistryRouteOptions {
  double rtt_refresh_s = 5.0;  // re-measure a node's round trip at most this often
  registry::CostWeights weights;
};

class RegistryRouteProvider final : public mesh::RouteProvider {
 public:
  // `model_id`: node::ModelIdentity of the model to route (the client's own).
  RegistryRouteProvider(std::shared_ptr<registry::Registry> registry, std::string model_id,
                        const ClientOptions& client, RegistryRouteOptions options = {});
  ~RegistryRouteProvider() override;

  mesh::Route Plan() override;
  void MarkDead(const mesh::ShardEndpoint& endpoint) override;
  // A "moved to ADDR" answer is followed only to a node the registry lists
  // for this model (fresh, or the cached view); null for any other address.
  std::shared_ptr<mesh::ShardEndpoint> EndpointFor(const std::string& address) override;
  mesh::CohortCarrier* carrier() override;

  // Sessions planned per node address so far.
  std::map<std::string, int64_t> planned() const;
  // Each node's cost at the latest plan.
  std::map<std::string, double> last_costs() const;
  // Whether the latest plan used the cached view (registry unreachable).
  bool used_cache() const;
  // Prometheus text: meshnet_route_node_cost{node,layers} (latest plan) and
  // meshnet_route_sessions_planned_total{node}, for a client's /metrics.
  std::string MetricsText() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshnet::rpc
