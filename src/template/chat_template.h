// Chat templates: renders a model's `tokenizer.chat_template` (Jinja) the way Hugging Face
// transformers does (jinja2 ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks,
// loopcontrols, raise_exception, strftime_now and a tojson that keeps non-ASCII).
//
// No C++ Jinja library is packaged in Debian, so meshnet carries its own interpreter for the
// subset real chat templates use (src/template/{lexer,parser,interpreter,...}); it is verified
// byte for byte against Python jinja2 (tests/data/templates, render.py).
//
// Thread-safety: a parsed ChatTemplate is immutable; Render may be called concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "util/error.h"

namespace meshnet::jinja {

// A value or the error that prevented it. Errors are meshnet::Error:
//  - kMalformedFile: the template itself does not parse (syntax error).
//  - kInvalidArgument: rendering failed: the template called raise_exception (the message is
//    exactly the template's), a type error on the given messages, or a limit was hit.
template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}               // NOLINT: implicit by design
  Result(meshnet::Error error) : v_(std::move(error)) {}  // NOLINT
  bool ok() const { return v_.index() == 0; }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const meshnet::Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, meshnet::Error> v_;
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  std::string bos_token;
  std::string eos_token;
  // The OpenAI `tools` array; null leaves `tools` undefined in the template.
  nlohmann::ordered_json tools = nullptr;
  // More template variables (an object), e.g. {"enable_thinking": false}; they never override
  // messages/add_generation_prompt/bos_token/eos_token/tools.
  nlohmann::ordered_json extra_context = nlohmann::ordered_json::object();
  // Limits: a hostile template gets an error, never unbounded time or memory.
  std::size_t max_output_bytes = 8u << 20;  // the output and every string or JSON built
  std::uint64_t max_steps = 5'000'000;      // evaluated nodes (loop iterations, expressions, ...)
  int max_depth = 400;                      // nested calls / expressions / statements
  // Work: the bytes of the strings and the items of the lists an operation reads or builds,
  // the nodes a comparison may visit, n log n per sort. A render that spends more is stopped.
  std::uint64_t max_work = std::uint64_t{1} << 30;
  // Polled while rendering (every 1024 steps and every MiB of work); when it returns true the
  // render stops with kUnavailable, e.g. because the client that asked for it is gone.
  std::function<bool()> cancelled;
};

struct Program;  // the parsed template (AST), internal

// A parsed template. Parse once (e.g. at startup, so a broken --chat-template fails fast) and
// render per request.
class ChatTemplate {
 public:
  static Result<ChatTemplate> Parse(std::string_view source);

  // `messages` should be parsed as ordered_json: tojson prints keys in insertion order, as
  // Python does (a plain nlohmann::json converts implicitly, with its keys sorted).
  Result<std::string> Render(const nlohmann::ordered_json& messages,
                             const ChatTemplateOptions& opts) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;
};

// Parse + Render in one call.
Result<std::string> RenderChatTemplate(std::string_view tmpl,
                                       const nlohmann::ordered_json& messages,
                                       const ChatTemplateOptions& opts);

// The template for models without one: ChatML (as llama.cpp and transformers use by default).
inline constexpr std::string_view kChatMlTemplate =
    "{%- for message in messages -%}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}\n";

}  // namespace meshnet::jinja
