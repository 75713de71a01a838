// Role isolation for chat prompts: text a client sends that spells a control
// token (<|im_start|>, <|eot_id|>, </s> ...) stays text, while the chat
// template's own control tokens still count. A rendered prompt is tokenized
// with special-token parsing, so without this a message could close its own
// turn and open a system one.
//
// How: before rendering, every control-token text in every string the
// client sent (message contents, their other fields, tools, keys included)
// becomes a marker "@@<nonce>#<index>@@" (a per-request random nonce; '@',
// '#' and digits survive escaping, case and JSON filters). After rendering
// the markers become their text again, and their byte ranges are handed to
// the tokenizer as literal (model::Tokenizer::Tokenize with literal ranges):
// no control token is matched there. A marker a template cut apart with its
// nonce whole is refused (400); one cut before the nonce ends stays in the
// prompt as plain text (never a control token). Limitation: template text
// placed right against a client's string could complete a control token the
// string began; no shipped template does that.
//
// Thread-safety: immutable after construction; Mask/Unmask may run
// concurrently.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/request.h"
#include "model/tokenizer.h"

namespace meshnet::api {

class ControlTextMask {
 public:
  // The texts of `tokenizer`'s control and unknown tokens (those llama.cpp
  // matches only with parse_special).
  explicit ControlTextMask(const model::Tokenizer& tokenizer);

  struct Masked {
    std::vector<ChatMessage> messages;
    nlohmann::ordered_json tools;
    std::string nonce;
    int markers = 0;  // how many control texts were replaced
  };
  struct Prompt {
    std::string text;
    std::vector<model::TextRange> literal;  // sorted, disjoint
  };

  Masked Mask(const std::vector<ChatMessage>& messages, const nlohmann::ordered_json& tools) const;
  // The rendered prompt with every marker of `masked` turned back into its
  // text. Throws ApiError(400, template_error) when a marker was cut.
  Prompt Unmask(const std::string& rendered, const Masked& masked) const;

 private:
  std::string MaskString(const std::string& s, const std::string& nonce, int* markers) const;
  void MaskJson(nlohmann::ordered_json& j, const std::string& nonce, int* markers) const;

  std::vector<std::string> texts_;
  // By first byte: the indexes of the texts starting with it, longest first.
  std::vector<int> by_first_[256];
};

}  // namespace meshnet::api
