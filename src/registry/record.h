// What a node announces to the registry: a NodeRecord per serving node, kept
// under a lease that the node renews by heartbeat. Shared by every registry
// backend (registry/registry.h), the route planner over the registry
// (registry/planner.h) and the status page.
//
// Thread-safety: value types.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace meshnet::registry {

struct NodeRecord {
  std::string address;   // host:port of the node's MeshNode service (the key)
  std::string model_id;  // node::ModelIdentity of the served model
  std::string architecture;
  int start_layer = 0;
  int end_layer = 0;  // inclusive
  int total_layers = 0;
  std::string recipe_fingerprint;  // kv::KvCacheRecipe::Fingerprint()
  int64_t kv_budget_bytes = 0;
  int64_t kv_bytes_free = 0;
  int64_t sessions_free = 0;  // max sessions - live sessions
  int64_t live_sessions = 0;
  int64_t in_flight_steps = 0;
  std::string version;      // meshnet version
  std::string instance_id;  // random per process start
  bool draining = false;    // takes no new sessions (a drain in progress)

  // The fields that name what the node serves; a renewal may not change them.
  bool SameIdentity(const NodeRecord& o) const;
  // Throws Error(kInvalidArgument) naming the bad field (empty address or
  // model id, a range outside 0..total_layers-1, negative counts).
  void Validate() const;
};

nlohmann::json ToJson(const NodeRecord& r);
// Throws Error(kInvalidArgument) for a malformed record.
NodeRecord RecordFromJson(const nlohmann::json& j);

// Every live record, with the backend's revision (it grows with every change).
struct Snapshot {
  int64_t revision = 0;
  std::vector<NodeRecord> nodes;  // sorted by (model_id, start_layer, address)
};

void SortRecords(std::vector<NodeRecord>& nodes);

}  // namespace meshnet::registry
