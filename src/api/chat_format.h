// Renders chat messages into the prompt text the model continues. One entry
// point, so the Jinja interpreter (src/template/, issue 11) can replace the
// built-in ChatML without touching the handlers.
//
// ChatML (the format for a model without tokenizer.chat_template):
//   <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
//
// Thread-safety: ChatFormatter is immutable after construction.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/request.h"

namespace meshnet::api {

class ChatFormatter {
 public:
  // `template_source`: a Jinja chat template (from --chat-template or the
  // GGUF). Until the interpreter lands, a non-empty template is refused
  // (kInvalidArgument) rather than silently ignored; empty means ChatML.
  explicit ChatFormatter(std::string template_source = "", std::string bos_token = "",
                         std::string eos_token = "");

  std::string Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const nlohmann::json& tools) const;
  // "chatml" or "jinja".
  std::string Kind() const { return template_source_.empty() ? "chatml" : "jinja"; }

 private:
  std::string template_source_;
  std::string bos_token_;
  std::string eos_token_;
};

// The built-in ChatML rendering.
std::string RenderChatMl(const std::vector<ChatMessage>& messages, bool add_generation_prompt);

}  // namespace meshnet::api
