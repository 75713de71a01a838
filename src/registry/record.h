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

#include "util/signing_key.h"

namespace meshnet::registry {

// A record is the node's own signed word: `signature` is public_key's
// Ed25519 signature of RecordSignedText (address, identity, version,
// instance, draining). The load fields are not signed: a registry that
// verifies a node may replace them with what the node's own answer says.
struct NodeRecord {
  std::string address;   // canonical host:port (util/host_port.h) of the MeshNode service
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
  std::string version;       // meshnet version
  std::string instance_id;   // random per process start
  bool draining = false;     // takes no new sessions (a drain in progress)
  std::string public_key;    // the node key, 32 raw bytes (hex in JSON)
  int64_t signed_at_ms = 0;  // when the node signed it (Unix ms; grows with every signing)
  std::string signature;     // 64 raw bytes (hex in JSON)

  // The fields that name what the node serves (its key included); a renewal
  // may not change them.
  bool SameIdentity(const NodeRecord& o) const;
  // Throws Error(kInvalidArgument) naming the bad field (an address that is
  // not canonical host:port, an empty model id, a range outside
  // 0..total_layers-1, negative counts).
  void Validate() const;
};

// What a record's signature covers (domain-separated, one field per line).
std::string RecordSignedText(const NodeRecord& r);
// Sets r->public_key, r->signed_at_ms (now, and above every earlier signing
// of this process) and r->signature.
void SignRecord(const SigningKey& key, NodeRecord* r);
// The newest and oldest a freshly announced record's signed_at_ms may be
// against the registry's clock.
inline constexpr int64_t kMaxRecordAgeMs = 120000;
// Whether the record carries a valid signature of its own public key.
bool RecordSignatureValid(const NodeRecord& r);
// Error(kPermissionDenied) naming the record unless RecordSignatureValid.
void RequireSignedRecord(const NodeRecord& r);

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
