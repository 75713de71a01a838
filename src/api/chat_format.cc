#include "api/chat_format.h"

#include <utility>

#include "api/api_error.h"
#include "template/chat_template.h"
#include "util/error.h"

namespace meshnet::api {

ChatFormatter::ChatFormatter(std::string template_source, std::string bos_token,
                             std::string eos_token)
    : kind_(template_source.empty() ? "chatml" : "jinja"),
      bos_token_(std::move(bos_token)),
      eos_token_(std::move(eos_token)) {
  auto parsed = jinja::ChatTemplate::Parse(
      template_source.empty() ? jinja::kChatMlTemplate : std::string_view(template_source));
  if (!parsed.ok()) {
    ThrowInvalidArgument(std::string("the chat template does not parse: ") + parsed.error().what());
  }
  template_ = std::make_unique<jinja::ChatTemplate>(std::move(parsed).value());
}

ChatFormatter::~ChatFormatter() = default;
ChatFormatter::ChatFormatter(ChatFormatter&&) noexcept = default;
ChatFormatter& ChatFormatter::operator=(ChatFormatter&&) noexcept = default;

std::string ChatFormatter::Render(const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt, const nlohmann::ordered_json& tools,
                                  const std::function<bool()>& cancelled) const {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& m : messages) {
    nlohmann::ordered_json o;
    o["role"] = m.role;
    o["content"] =
        m.null_content ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(m.content);
    for (const auto& [k, v] : m.extra.items()) o[k] = v;
    list.push_back(std::move(o));
  }
  jinja::ChatTemplateOptions opts;
  opts.add_generation_prompt = add_generation_prompt;
  opts.bos_token = bos_token_;
  opts.eos_token = eos_token_;
  if (!tools.is_null()) opts.tools = tools;
  opts.cancelled = cancelled;
  auto out = template_->Render(list, opts);
  if (!out.ok()) {
    throw ApiError(400,
                   std::string("the chat template refused the messages: ") + out.error().what(),
                   "invalid_request_error", "messages", "template_error");
  }
  return std::move(out).value();
}

}  // namespace meshnet::api
