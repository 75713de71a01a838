#include "template/chat_template.h"

#include "template/ast.h"
#include "template/interpreter.h"

namespace meshnet::jinja {

Result<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  try {
    std::unique_ptr<Program> program = ParseTemplate(source);
    FoldConstants(*program);
    return ChatTemplate(std::shared_ptr<const Program>(std::move(program)));
  } catch (const meshnet::Error& e) {
    return meshnet::Error(e.kind(), e.what());
  } catch (const std::exception& e) {  // e.g. std::bad_alloc: still an error, never a crash
    return meshnet::Error(ErrorKind::kMalformedFile, std::string("template: ") + e.what());
  }
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                         const ChatTemplateOptions& opts) const {
  try {
    Dict context;
    context.emplace_back("messages", Value::FromJson(messages));
    context.emplace_back("add_generation_prompt", Value(opts.add_generation_prompt));
    context.emplace_back("bos_token", Value(opts.bos_token));
    context.emplace_back("eos_token", Value(opts.eos_token));
    if (!opts.tools.is_null()) context.emplace_back("tools", Value::FromJson(opts.tools));
    if (opts.extra_context.is_object()) {
      for (const auto& [k, v] : opts.extra_context.items()) {
        bool taken = false;
        for (const auto& kv : context) taken = taken || kv.first == k;
        if (!taken) context.emplace_back(k, Value::FromJson(v));
      }
    }
    Interpreter interpreter(opts);
    return interpreter.Render(*program_, std::move(context));
  } catch (const meshnet::Error& e) {
    return meshnet::Error(e.kind(), e.what());
  } catch (const std::exception& e) {
    return meshnet::Error(ErrorKind::kInvalidArgument, std::string("template: ") + e.what());
  }
}

Result<std::string> RenderChatTemplate(std::string_view tmpl,
                                       const nlohmann::ordered_json& messages,
                                       const ChatTemplateOptions& opts) {
  Result<ChatTemplate> parsed = ChatTemplate::Parse(tmpl);
  if (!parsed.ok()) return parsed.error();
  return parsed.value().Render(messages, opts);
}

}  // namespace meshnet::jinja
