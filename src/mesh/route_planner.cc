#include "mesh/route_planner.h"

#include <algorithm>
#include <optional>
#include <tuple>

#include "util/error.h"

namespace meshnet::mesh {

namespace {

struct Path {
  int64_t hops = 0;
  double cost = 0;
  int64_t live = 0;
  int64_t free_bytes = 0;
  std::vector<size_t> idx;
};

// True if `a` is a better route prefix than `b` (both end at the same layer).
bool Better(const Path& a, const Path& b, std::span<const RouteCandidate> c) {
  if (a.hops != b.hops) return a.hops < b.hops;
  if (a.cost != b.cost) return a.cost < b.cost;
  if (a.live != b.live) return a.live < b.live;
  if (a.free_bytes != b.free_bytes) return a.free_bytes > b.free_bytes;
  return std::lexicographical_compare(
      a.idx.begin(), a.idx.end(), b.idx.begin(), b.idx.end(),
      [&](size_t x, size_t y) { return std::tie(c[x].name, x) < std::tie(c[y].name, y); });
}

}  // namespace

std::string DescribeLayers(const std::vector<int>& layers) {
  std::string out;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(layers[i]);
    if (j > i) out += "-" + std::to_string(layers[j]);
    i = j + 1;
  }
  return out;
}

std::vector<size_t> PlanRoute(std::span<const RouteCandidate> candidates, int total_layers) {
  if (total_layers <= 0) ThrowInvalidArgument("a route needs a model with at least one layer");
  // best[p]: the best route whose next hand-over layer is p (p == total_layers: complete).
  std::vector<std::optional<Path>> best(total_layers + 1);
  best[0] = Path{};
  std::vector<bool> served(total_layers, false);
  for (const RouteCandidate& c : candidates) {
    if (c.start_layer < 0 || c.start_layer > c.end_layer || c.end_layer >= total_layers) continue;
    for (int l = c.start_layer; l <= c.end_layer; ++l) served[l] = true;
  }
  for (int p = 0; p < total_layers; ++p) {
    if (!best[p]) continue;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const RouteCandidate& c = candidates[i];
      if (c.start_layer != p || c.end_layer < p || c.end_layer >= total_layers) continue;
      Path next = *best[p];
      next.hops += 1;
      next.cost += c.cost;
      next.live += c.live_sessions;
      next.free_bytes += c.kv_bytes_free;
      next.idx.push_back(i);
      auto& slot = best[c.end_layer + 1];
      if (!slot || Better(next, *slot, candidates)) slot = std::move(next);
    }
  }
  if (best[total_layers]) return best[total_layers]->idx;

  std::vector<int> unserved;
  for (int l = 0; l < total_layers; ++l) {
    if (!served[l]) unserved.push_back(l);
  }
  const std::string all = "0-" + std::to_string(total_layers - 1);
  if (!unserved.empty()) {
    throw Error(ErrorKind::kUnavailable, "no route covers layers " + all + ": layers " +
                                             DescribeLayers(unserved) +
                                             " are served by no live node");
  }
  int reach = 0;
  for (int p = 0; p <= total_layers; ++p) {
    if (best[p]) reach = p;
  }
  throw Error(ErrorKind::kUnavailable,
              "no route covers layers " + all + ": every layer is served but no live node's " +
                  "range starts at layer " + std::to_string(reach) +
                  " where the reachable chain ends (layers " + std::to_string(reach) + "-" +
                  std::to_string(total_layers - 1) + " cannot be reached)");
}

}  // namespace meshnet::mesh
