// One hop of a route: a shard that can run steps for sessions. Implemented
// in-process (mesh/in_process.h, wrapping a KvBoundaryAdapter) and over gRPC
// (rpc/, a remote node). The generation loop (mesh/generator.h) only sees this
// interface, so failover and miss recovery are the same code for both.
//
// Thread-safety: implementations are safe to call from several threads for
// different sessions.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kv/cache_miss.h"
#include "shard/boundary.h"

namespace meshnet::mesh {

// What a node says about itself (rpc Info).
struct ShardInfo {
  std::string model_id;      // identity of the model file (sha256 of its header + tensor table)
  std::string architecture;  // canonical adapter, e.g. "llama"
  int start_layer = 0;
  int end_layer = 0;
  int total_layers = 0;
  std::string recipe_fingerprint;  // kv::KvCacheRecipe::Fingerprint()
  int64_t kv_budget_bytes = 0;
  int64_t kv_bytes_free = 0;
  int64_t kv_tokens_free = 0;
  int64_t live_sessions = 0;
  std::string version;
};

struct StepRequest {
  std::string session_id;      // 128-bit random, hex
  std::string session_secret;  // binds the session to its opener (checked by nodes)
  int64_t route_epoch = 0;
  uint64_t step_id = 0;  // idempotency key: a retry with the same id is not applied twice
  bool prefill = false;  // open a fresh context first (prompt or re-prefill)
  std::optional<int64_t> expected_seq_len;      // decode: positions the node must hold
  std::vector<int32_t> token_ids;               // head
  std::optional<shard::BoundaryBundle> bundle;  // middle / tail
  shard::SamplingContract sampling;             // used by the tail
};

using StepResult = std::variant<shard::BoundaryBundle, shard::TailOutput, kv::CacheMiss>;

class ShardEndpoint {
 public:
  virtual ~ShardEndpoint() = default;
  // For logs and errors: "in-process[0-1]" or "127.0.0.1:7001".
  virtual std::string name() const = 0;
  // Throws Error(kUnavailable) if the node cannot be reached.
  virtual ShardInfo Info() = 0;
  // Runs one step. A CacheMiss is a value. Throws Error(kUnavailable) for a dead
  // or timed-out node, and other typed Errors for protocol violations.
  virtual StepResult Step(StepRequest request) = 0;
  // Frees the session's state on this hop; best effort (never throws).
  virtual void Release(const std::string& session_id, const std::string& session_secret,
                       int64_t route_epoch) = 0;
};

}  // namespace meshnet::mesh
