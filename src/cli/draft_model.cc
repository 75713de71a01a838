#include "cli/draft_model.h"

#include "gguf/gguf_reader.h"
#include "util/error.h"

namespace meshnet::cli {

namespace {

// A draft model's KV: one short session per generation in flight.
constexpr int64_t kDraftKvBudget = int64_t{256} << 20;

}  // namespace

std::shared_ptr<mesh::DraftModel> OpenDraftModel(const std::string& path,
                                                 const model::Tokenizer& target) {
  if (path.empty()) return nullptr;
  auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(path));
  const model::Tokenizer draft = model::Tokenizer::FromGguf(*file);
  if (draft.vocab_size() != target.vocab_size()) {
    ThrowInvalidArgument("--draft-model " + path + ": its vocabulary has " +
                         std::to_string(draft.vocab_size()) + " tokens, the model's " +
                         std::to_string(target.vocab_size()) + ": it cannot draft for it");
  }
  for (int32_t id = 0; id < target.vocab_size(); ++id) {
    if (draft.TokenText(id) != target.TokenText(id)) {
      ThrowInvalidArgument("--draft-model " + path + ": its token " + std::to_string(id) +
                           " is not the model's: it cannot draft for it");
    }
  }
  return std::make_shared<mesh::DraftModel>(std::move(file), kDraftKvBudget);
}

}  // namespace meshnet::cli
