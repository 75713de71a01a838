#include "registry/planner.h"

#include <algorithm>
#include <functional>

namespace meshnet::registry {

double NodeCost(const NodeRecord& r, double rtt_ms, int64_t local_sessions, const CostWeights& w) {
  const double kv_full = r.kv_budget_bytes > 0 ? 1.0 - static_cast<double>(r.kv_bytes_free) /
                                                           static_cast<double>(r.kv_budget_bytes)
                                               : 0.0;
  const double load = static_cast<double>(r.in_flight_steps + r.live_sessions + local_sessions);
  return rtt_ms * w.per_rtt_ms + load * w.per_session +
         std::clamp(kv_full, 0.0, 1.0) * w.per_kv_full;
}

std::vector<mesh::RouteCandidate> ToCandidates(const std::vector<NodeRecord>& nodes,
                                               const std::vector<double>& costs) {
  std::vector<mesh::RouteCandidate> out;
  out.reserve(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const NodeRecord& r = nodes[i];
    mesh::RouteCandidate c{r.address, r.start_layer, r.end_layer, r.live_sessions, r.kv_bytes_free};
    c.cost = costs.empty() ? 0.0 : costs[i];
    if (r.draining) c.start_layer = -1;  // never a valid hop; keeps indices parallel
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<std::vector<size_t>> EnumerateRoutes(const std::vector<NodeRecord>& nodes,
                                                 int total_layers, size_t limit) {
  std::vector<std::vector<size_t>> out;
  std::vector<size_t> path;
  std::function<void(int)> walk = [&](int layer) {
    if (out.size() >= limit) return;
    if (layer == total_layers) {
      out.push_back(path);
      return;
    }
    for (size_t i = 0; i < nodes.size(); ++i) {
      const NodeRecord& r = nodes[i];
      if (r.draining || r.start_layer != layer || r.end_layer >= total_layers) continue;
      path.push_back(i);
      walk(r.end_layer + 1);
      path.pop_back();
    }
  };
  if (total_layers > 0) walk(0);
  return out;
}

}  // namespace meshnet::registry
