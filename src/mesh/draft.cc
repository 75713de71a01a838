#include "mesh/draft.h"

#include <algorithm>
#include <utility>
#include <variant>

#include "mesh/in_process.h"
#include "node/identity.h"
#include "util/error.h"

namespace meshnet::mesh {

namespace {

// Sessions the draft model holds at once (one per generation in flight).
constexpr int64_t kDraftSessions = 256;

class ModelDrafter final : public Drafter {
 public:
  explicit ModelDrafter(std::shared_ptr<ShardEndpoint> hop)
      : hop_(std::move(hop)), session_(node::RandomId128()), secret_(node::RandomId128()) {}
  ~ModelDrafter() override {
    if (!held_.empty()) hop_->Release(session_, secret_, 0);
  }

  void Propose(std::span<const int32_t> text, int k, std::vector<int32_t>* out) override {
    out->clear();
    if (k <= 0 || text.empty()) return;
    try {
      ProposeOrThrow(text, k, out);
    } catch (const std::exception&) {  // a guess that could not be made: no draft
      out->clear();
      Forget();
    }
  }

 private:
  void ProposeOrThrow(std::span<const int32_t> text, int k, std::vector<int32_t>* out) {
    // Keep the prefix the session shares with the text (at least the last
    // token is fed again: its next token is the first draft).
    size_t common = 0;
    while (common < held_.size() && common < text.size() && held_[common] == text[common]) {
      ++common;
    }
    common = std::min(common, text.size() - 1);
    if (common < held_.size()) {
      if (common == 0) {
        Forget();
      } else if (hop_->Truncate(session_, secret_, 0, static_cast<int64_t>(common)) !=
                 static_cast<int64_t>(common)) {
        Forget();
        common = 0;
      } else {
        held_.resize(common);
      }
    }
    out->push_back(Next(text.subspan(held_.size())));
    while (static_cast<int>(out->size()) < k) {
      const int32_t last = out->back();
      out->push_back(Next(std::span<const int32_t>(&last, 1)));
    }
  }

  // Feeds `tokens` after what the session holds; the greedy next token.
  int32_t Next(std::span<const int32_t> tokens) {
    StepRequest r;
    r.session_id = session_;
    r.session_secret = secret_;
    r.step_id = ++step_id_;
    r.prefill = held_.empty();
    if (!r.prefill) r.expected_seq_len = static_cast<int64_t>(held_.size());
    r.token_ids.assign(tokens.begin(), tokens.end());
    StepResult result = hop_->Step(std::move(r));
    const auto* tail = std::get_if<shard::TailOutput>(&result);
    if (tail == nullptr) throw Error(ErrorKind::kUnavailable, "the draft session is gone");
    held_.insert(held_.end(), tokens.begin(), tokens.end());
    return tail->token_id;
  }

  void Forget() {
    if (!held_.empty()) hop_->Release(session_, secret_, 0);
    held_.clear();
  }

  std::shared_ptr<ShardEndpoint> hop_;
  const std::string session_;
  const std::string secret_;
  uint64_t step_id_ = 0;
  std::vector<int32_t> held_;  // the tokens the draft session holds
};

}  // namespace

DraftModel::DraftModel(std::shared_ptr<const gguf::GgufFile> file, int64_t kv_budget_bytes) {
  InProcessMeshOptions o;
  o.kv_config.budget_bytes = kv_budget_bytes;
  o.kv_config.max_sessions = kDraftSessions;
  // A draft step is on the generation's critical path: it never waits to
  // be batched with other sessions' steps.
  o.batch.max_batch_sessions = 1;
  o.batch.group_wait_s = 0;
  o.batch_turns = false;
  mesh_ = std::make_unique<InProcessMesh>(std::move(file), o, nullptr);
  vocab_size_ = static_cast<int32_t>(mesh_->shard(0).hparams().vocab_size);
}

DraftModel::~DraftModel() = default;

std::unique_ptr<Drafter> DraftModel::NewDrafter() {
  return std::make_unique<ModelDrafter>(mesh_->endpoint(0));
}

}  // namespace meshnet::mesh
