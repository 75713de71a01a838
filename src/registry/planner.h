// Route choice over registry records (pure functions; the gRPC client's
// RegistryRouteProvider in rpc/registry_route.h measures round-trip times
// and calls these).
//
// A node's cost (lower is better), in sessions-equivalents:
//   rtt_ms * per_rtt_ms                (10 ms of round trip weigh one session;
//                                       the client passes the excess over the
//                                       fastest replica of the range beyond a
//                                       tolerance, so jitter does not decide)
//   + (in_flight_steps + live_sessions + sessions this client sent it) * per_session
//   + (1 - kv_bytes_free / kv_budget_bytes) * per_kv_full
// so among replicas of a range a far, busy or full node loses, and new
// sessions of one client alternate over equal replicas (each plan adds one to
// the nodes it picked). mesh::PlanRoute then picks the fewest hops, then the
// lowest summed cost.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mesh/route_planner.h"
#include "registry/record.h"

namespace meshnet::registry {

struct CostWeights {
  double per_rtt_ms = 0.1;
  double per_session = 1.0;
  double per_kv_full = 2.0;
};

double NodeCost(const NodeRecord& r, double rtt_ms, int64_t local_sessions,
                const CostWeights& w = {});

// Records of one model as route candidates (draining ones left out); `costs`
// parallel to `nodes` (empty: all 0).
std::vector<mesh::RouteCandidate> ToCandidates(const std::vector<NodeRecord>& nodes,
                                               const std::vector<double>& costs);

// Up to `limit` complete routes over `nodes` (indices, head first), for
// status: every chain of ranges from layer 0 to total_layers - 1. Draining
// nodes are left out.
std::vector<std::vector<size_t>> EnumerateRoutes(const std::vector<NodeRecord>& nodes,
                                                 int total_layers, size_t limit);

}  // namespace meshnet::registry
