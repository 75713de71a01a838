// The shard boundary contract (reference: meshnet_node/boundary_adapter.py).
//
// A route of shards runs the whole model. The head (start_layer == 0) owns
// the token embedding and receives token ids; a middle or tail shard receives
// the BoundaryBundle: the architecture-defined, UNNORMALIZED residual stream
// plus positions and the next layer index. The tail (end_layer == L-1) applies
// the final norm and the LM head to the last row only and samples a token.
//
// Thread-safety: value types.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "arch/architecture.h"

namespace meshnet::shard {

struct ShardRole {
  int start_layer = 0;
  int end_layer = 0;
  int total_layers = 0;
  bool owns_embedding = false;   // head
  bool owns_final_head = false;  // tail
  bool is_head() const { return owns_embedding; }
  bool is_tail() const { return owns_final_head; }
};

// Validates 0 <= start <= end <= total - 1 (kInvalidArgument otherwise).
ShardRole RoleForRange(int start_layer, int end_layer, int total_layers);

struct BoundaryBundle {
  std::string architecture_adapter;
  int schema_version = kBoundarySchemaVersion;
  std::string tensor_name;
  int64_t n_tokens = 0;
  int64_t n_embd = 0;
  std::vector<float> residual;     // (n_tokens, n_embd), unnormalized
  std::vector<int64_t> positions;  // (n_tokens)
  int next_layer = 0;
  bool normalized = false;
};

// Checks a bundle against the shard it is handed to, in the reference's order:
// architecture, schema version, tensor name, normalized, next layer; plus the
// shape (residual size == n_tokens * n_embd, positions size == n_tokens,
// n_embd == expected_n_embd, contiguous positions starting at
// expected_start_pos). Throws Error(kBoundaryContract) naming the mismatch.
void CheckBoundary(const BoundaryBundle& b, const CertifiedArchitecture& arch, int start_layer,
                   int64_t expected_n_embd, int64_t expected_start_pos);

// How the tail picks the next token. Sampling is a pure function of
// (contract, position of the sampled token, logits): the random draw comes
// from a counter-based generator keyed by (seed, position), so the same seed
// gives the same tokens across re-prefills, failover and different tail nodes.
struct SamplingContract {
  float temperature = 0.0f;  // 0 = greedy (argmax; lowest id wins ties)
  int top_k = 0;             // 0 = no top-k filter
  float top_p = 1.0f;        // 1 = no nucleus filter
  uint64_t seed = 0;

  static SamplingContract Greedy() { return {}; }
  bool greedy() const { return temperature <= 0.0f; }
  // Throws kInvalidArgument for temperature < 0, top_k < 0, top_p not in (0, 1].
  void Validate() const;
  // `scratch` must hold logits.size() floats + logits.size() ints worth of
  // room; see SampleScratch. No allocation. A non-finite logit (NaN, Inf:
  // broken weights or activations) throws Error(kBoundaryContract) naming
  // the position, rather than yielding an arbitrary token.
  int Sample(std::span<const float> logits, int64_t position, std::span<float> scratch_probs,
             std::span<int> scratch_ids) const;
  // Allocating convenience wrapper.
  int Sample(std::span<const float> logits, int64_t position) const;
};

struct TailOutput {
  int token_id = 0;
  std::vector<float> logits;  // (vocab) of the last position
  // A verify step (StepInput::verify): the token sampled after each of its
  // rows, in order (the last is token_id). Empty otherwise.
  std::vector<int32_t> row_tokens;
};

}  // namespace meshnet::shard
