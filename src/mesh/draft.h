// Draft tokens for speculative decoding (GenerateOptions::draft) from a
// small model run in the client's process (`--draft-model FILE.gguf`): the
// tokens it would pick greedily after the text so far. They are only
// guesses: the route's tail verifies every one, so the output is the target
// model's whatever the draft model says; a better draft only means more
// tokens per route pass.
//
// A DraftModel loads the file once (one in-process node over all its
// layers, with its own KV budget). Each generation takes a Drafter of its
// own: a session on that node that follows the text (truncated to the
// prefix it shares with the text, then fed the rest), so a proposal costs
// the new tokens plus one draft step per draft token, not the whole text.
//
// Thread-safety: DraftModel::NewDrafter is safe from any thread (the node
// serves concurrent sessions); a Drafter is used by one generation at a
// time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/hot_kv_state.h"

namespace meshnet::gguf {
class GgufFile;
}

namespace meshnet::mesh {

class InProcessMesh;
class ShardEndpoint;

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to `k` tokens that may follow `text` (none when the draft model
  // cannot say: past its context, out of KV room).
  virtual void Propose(std::span<const int32_t> text, int k, std::vector<int32_t>* out) = 0;
};

// Where a generation's Drafter comes from (GenerateOptions::draft).
class DraftSource {
 public:
  virtual ~DraftSource() = default;
  virtual std::unique_ptr<Drafter> NewDrafter() = 0;
};

class DraftModel final : public DraftSource {
 public:
  // `kv_budget_bytes`: the draft model's KV (its sessions beyond it are
  // evicted: they then draft nothing until re-fed).
  DraftModel(std::shared_ptr<const gguf::GgufFile> file, int64_t kv_budget_bytes);
  ~DraftModel();
  DraftModel(const DraftModel&) = delete;
  DraftModel& operator=(const DraftModel&) = delete;

  std::unique_ptr<Drafter> NewDrafter() override;
  int32_t vocab_size() const { return vocab_size_; }

 private:
  std::unique_ptr<InProcessMesh> mesh_;
  int32_t vocab_size_ = 0;
};

}  // namespace meshnet::mesh
