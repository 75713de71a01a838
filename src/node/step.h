// The node's vocabulary: what a node says about itself and what one step asks
// and answers. Shared by the node (node/), every transport (rpc/) and the
// client (mesh/), which sees nodes only through these types.
//
// Thread-safety: value types.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kv/cache_miss.h"
#include "shard/boundary.h"

namespace meshnet::node {

// What a node says about its shard (rpc Info).
struct ShardInfo {
  std::string model_id;      // identity of the model file (node/identity.h)
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

// ShardInfo plus what a serving node (NodeCore) adds.
struct NodeInfo {
  ShardInfo shard;
  std::string instance_id;  // random per process: changes on restart
  int64_t kv_bytes_reserved = 0;
  int64_t kv_bytes_reserved_peak = 0;
  int64_t steps_served = 0;
  int n_embd = 0;
  int vocab_size = 0;
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
  // The client needs the tail's logits row (a transport that leaves it out
  // by default sends it for this step).
  bool want_logits = false;
  // Hops on the sender's route (0: not said): each node gives long prompts
  // its 1/route_hops part of the decoding sessions' share (node::PrefillBudget).
  int route_hops = 0;
  // Speculative decoding (shard::StepInput): a decode step that first drops
  // the positions past expected_seq_len (`rewind`: the draft tokens the
  // client rejected), and whose tail samples after every row (`verify`).
  bool rewind = false;
  bool verify = false;
};

// The most hops a step may say its route has.
inline constexpr int kMaxRouteHops = 1024;

using StepResult = std::variant<shard::BoundaryBundle, shard::TailOutput, kv::CacheMiss>;

}  // namespace meshnet::node
