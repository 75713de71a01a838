// Renders chat messages into the prompt text the model continues, with the
// Jinja chat-template interpreter (src/template): the --chat-template file,
// else the GGUF's tokenizer.chat_template, else ChatML:
//   <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
// One entry point, so handlers never see the template machinery.
//
// Thread-safety: ChatFormatter is immutable after construction; Render may
// run concurrently.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/request.h"

namespace meshnet::jinja {
class ChatTemplate;
}

namespace meshnet::api {

class ChatFormatter {
 public:
  // `template_source` empty: ChatML. Throws Error(kInvalidArgument) for a
  // template that does not parse.
  explicit ChatFormatter(std::string template_source = "", std::string bos_token = "",
                         std::string eos_token = "");
  ~ChatFormatter();
  ChatFormatter(ChatFormatter&&) noexcept;
  ChatFormatter& operator=(ChatFormatter&&) noexcept;

  // Throws ApiError(400) when the template refuses the messages (its
  // raise_exception, e.g. roles that do not alternate). `cancelled`, when
  // set, is polled while rendering: true stops the render (an error).
  std::string Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& tools,
                     const std::function<bool()>& cancelled = nullptr) const;
  // "chatml" or "jinja".
  const std::string& kind() const { return kind_; }
  const std::string& bos_token() const { return bos_token_; }

 private:
  std::string kind_;
  std::string bos_token_;
  std::string eos_token_;
  std::unique_ptr<jinja::ChatTemplate> template_;
};

}  // namespace meshnet::api
