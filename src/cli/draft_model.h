// --draft-model FILE.gguf (mesh/draft.h) for the commands that speculate.
#pragma once

#include <memory>
#include <string>

#include "mesh/draft.h"
#include "model/tokenizer.h"

namespace meshnet::cli {

// Draft tokens per step with --draft-model and no --speculate.
inline constexpr int kDefaultDraftTokens = 4;

// The draft model at `path`, or null for an empty path. Throws
// kInvalidArgument when its vocabulary is not `target`'s (size or any
// token's text): its ids would mean other tokens.
std::shared_ptr<mesh::DraftModel> OpenDraftModel(const std::string& path,
                                                 const model::Tokenizer& target);

}  // namespace meshnet::cli
