// Route planning: pick a chain of shard nodes that covers layers 0..L-1.
//
// Each candidate serves a contiguous range [start_layer, end_layer]; a route
// is a sequence whose first hop starts at layer 0, each next hop starts right
// after the previous one ends (a bundle hands over at `next_layer`), and the
// last ends at L-1. Among all such routes the planner picks, in order:
//   1. fewest hops;
//   2. lowest `cost` summed over the hops (0 unless the caller measures one,
//      e.g. the registry client: round-trip time, load and free KV);
//   3. fewest live sessions summed over the hops (spread the load);
//   4. most free KV bytes summed over the hops;
//   5. the lexicographically smallest sequence of candidate names
//      (deterministic whatever order the candidates come in).
// A dynamic program over hand-over layers (each criterion is a sum, so the
// best route to a layer extends to the best route through it).
//
// Thread-safety: pure function.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace meshnet::mesh {

struct RouteCandidate {
  std::string name;  // unique, e.g. "127.0.0.1:7001"
  int start_layer = 0;
  int end_layer = 0;  // inclusive
  int64_t live_sessions = 0;
  int64_t kv_bytes_free = 0;
  double cost = 0;  // lower is better; compared (summed) right after the hop count
};

// Indices into `candidates`, head first. Candidates whose range is invalid
// for total_layers are ignored. Throws Error(kUnavailable) when no route
// exists, naming the layers no candidate serves ("layers 4-7 are served by no
// live node") or, if every layer is served but the ranges do not chain, the
// first hand-over layer that cannot be reached.
std::vector<size_t> PlanRoute(std::span<const RouteCandidate> candidates, int total_layers);

// "4-7, 9" style rendering of sorted layer indices.
std::string DescribeLayers(const std::vector<int>& layers);

}  // namespace meshnet::mesh
