// KvBoundaryAdapter: cached prefill/decode of one shard's owned layers
// through the HotKvStateManager, honouring the boundary contract
// (reference: KvBoundaryAdapter in hot_kv_state.py).
//
//   head:   token ids -> embed -> owned layers (KV) -> BoundaryBundle
//   middle: bundle    -> owned layers (KV)          -> BoundaryBundle
//   tail:   bundle    -> owned layers (KV) -> last row -> final norm -> LM head -> sample
//
// A step reserves rows in the manager (KvStep), the computation writes the new
// K/V in place while it attends, and the manager commits them. Decode returns a
// CacheMiss whenever the state is gone, at resolve or at commit.
//
// Thread-safety: Prefill/Decode may be called concurrently for different
// sessions; the manager refuses two concurrent steps on one session
// (kSessionBusy). No lock is held while the layers compute.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <variant>
#include <vector>

#include "kv/cache_miss.h"
#include "kv/hot_kv_state.h"
#include "shard/boundary.h"
#include "shard/llama_shard.h"

namespace meshnet::shard {

// What one step feeds the shard: token ids (head) or a boundary bundle (middle,
// tail). Exactly one must be set, as the role demands. The adapter takes the
// bundle's residual buffer over (it computes in place and hands the same
// buffer on), so the bundle is left empty after a step that ran.
struct StepInput {
  std::optional<std::span<const int32_t>> token_ids;
  BoundaryBundle* bundle = nullptr;
  // Speculative decoding. `rewind`: a decode step whose context holds more
  // than its expected_seq_len positions (a draft the client rejected) first
  // drops the extra ones. `verify`: the tail samples after every row of the
  // step, not only the last (TailOutput::row_tokens).
  bool rewind = false;
  bool verify = false;
};

using StepOutput = std::variant<BoundaryBundle, TailOutput, kv::CacheMiss>;

// A step whose KV rows are reserved and whose input residual is ready: what a
// (batched) forward pass computes between Begin* and Finish. Move-only (it
// holds the KvStep; dropping it unfinished rolls the rows back).
struct PendingStep {
  kv::KvStep step;
  std::vector<float> hidden;  // (n_new, n_embd): input residual, computed in place
  int64_t n_new = 0;
  SamplingContract sampling;
  // Tail: the logits of the last row, when the computation produced them
  // (a batch runs the LM head over every finished session at once).
  std::vector<float> logits;
  bool logits_ready = false;
  bool verify = false;  // StepInput::verify
  // Hops on the client's route (node::StepRequest::route_hops; 0: not said):
  // a scheduling hint for the node's batcher (node::DecodeLoad::hops).
  int route_hops = 0;
};
using BeginResult = std::variant<PendingStep, kv::CacheMiss>;

class KvBoundaryAdapter {
 public:
  // `shard` and `manager` must outlive the adapter. Throws
  // kIncompatibleRecipe if the manager's recipe differs from the shard's.
  KvBoundaryAdapter(const LlamaShard* shard, kv::HotKvStateManager* manager);

  const ShardRole& role() const { return role_; }
  const kv::KvCacheRecipe& recipe() const { return recipe_; }
  const LlamaShard& shard() const { return *shard_; }
  kv::HotKvStateManager& manager() const { return *manager_; }

  // Opens a fresh context (replacing any at this key) and runs the prompt.
  StepOutput Prefill(std::string_view session_id, int64_t route_epoch, const StepInput& input,
                     const SamplingContract& sampling);
  // Appends positions to an existing context; a CacheMiss if it is gone.
  StepOutput Decode(std::string_view session_id, int64_t route_epoch, const StepInput& input,
                    std::optional<int64_t> expected_seq_len, const SamplingContract& sampling);

  // The same steps in three parts, for a caller that runs the forward pass
  // itself (node::Batcher): Begin* checks the input, reserves the rows and
  // prepares the residual (a CacheMiss when the state is gone); the caller
  // runs the owned layers over pending.hidden (LlamaShard::Forward or
  // ForwardBatch) and, at the tail, may fill pending.logits; Finish commits
  // and builds the output (a CacheMiss if the state died meanwhile).
  BeginResult BeginPrefill(std::string_view session_id, int64_t route_epoch, const StepInput& input,
                           const SamplingContract& sampling);
  BeginResult BeginDecode(std::string_view session_id, int64_t route_epoch, const StepInput& input,
                          std::optional<int64_t> expected_seq_len,
                          const SamplingContract& sampling);
  StepOutput Finish(PendingStep& pending) const;

  // The boundary contract, checked before any state is touched: the input the
  // role takes (kBoundaryContract), token ids inside the vocabulary
  // (kInvalidArgument), the bundle against this shard (positions from
  // `expected_seq_len` when given), the sampling contract at the tail. Returns
  // the number of new positions. The one place these checks are written.
  int64_t Validate(std::optional<std::span<const int32_t>> token_ids, const BoundaryBundle* bundle,
                   std::optional<int64_t> expected_seq_len, const SamplingContract& sampling) const;

 private:
  // kInvalidArgument when positions start..start+n_new-1 pass the model's
  // context_length.
  void CheckContext(int64_t start, int64_t n_new) const;
  BeginResult Begin(std::string_view session_id, int64_t route_epoch, const StepInput& input,
                    std::optional<int64_t> expected_seq_len, const SamplingContract& sampling);
  StepOutput Run(BeginResult begun);
  // The tail's answer to a verify step: a token after every row.
  TailOutput VerifyRows(PendingStep& p) const;
  const CertifiedArchitecture& arch() const { return shard_->arch(); }
  const LlamaShard* shard_;
  kv::HotKvStateManager* manager_;
  ShardRole role_;
  kv::KvCacheRecipe recipe_;
};

}  // namespace meshnet::shard
