#include "api/chat_format.h"

#include <utility>

#include "util/error.h"

namespace meshnet::api {

ChatFormatter::ChatFormatter(std::string template_source, std::string bos_token,
                             std::string eos_token)
    : template_source_(std::move(template_source)),
      bos_token_(std::move(bos_token)),
      eos_token_(std::move(eos_token)) {
  if (!template_source_.empty()) {
    ThrowInvalidArgument(
        "Jinja chat templates need the template interpreter (src/template), which this build "
        "lacks; omit --chat-template to use ChatML");
  }
}

std::string ChatFormatter::Render(const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt, const nlohmann::json& tools) const {
  return RenderChatMl(messages, add_generation_prompt);
}

std::string RenderChatMl(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
  for (const auto& m : messages) {
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace meshnet::api
