// Parsing and validation of /v1/completions and /v1/chat/completions bodies
// into one CompletionRequest. Every problem throws ApiError (400, naming the
// parameter); nothing here touches the model, so tokenization and context
// checks happen later (engine.h).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "shard/logit_adjustments.h"

namespace meshnet::api {

// One chat message with its content flattened to text (a list of text parts
// is concatenated). `extra` keeps the other fields (tool_calls, name, ...) for
// chat templates.
struct ChatMessage {
  std::string role;  // system, developer, user, assistant or tool
  std::string content;
  bool null_content = false;  // content was null or absent (assistant tool calls)
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

struct CompletionRequest {
  bool chat = false;
  std::string model;  // empty: not given
  // completions: a prompt string or token ids (exactly one is set).
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;
  // chat:
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools;  // null when absent
  std::optional<int> max_tokens;
  float temperature = 1.0f;  // OpenAI's default
  float top_p = 1.0f;
  int top_k = 0;  // extension (llama-server): 0 = off
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  // -1: no logprobs; else how many of the most likely tokens each token's
  // entry lists (completions' integer logprobs 0..5; chat's logprobs: true
  // with top_logprobs 0..20).
  int logprobs = -1;
  // frequency_penalty, presence_penalty ([-2, 2]), logit_bias (token id ->
  // [-100, 100]; the ids are checked against the vocabulary later).
  shard::LogitAdjustments adjustments;
  // Requests share kept sessions (the prefix cache) only with requests of
  // the same salt (at most 256 bytes; "" when not given).
  std::string cache_salt;
};

// `body` is the parsed JSON body; `chat` selects the endpoint's schema.
// Parameters the API does not implement (best_of other than 1, echo,
// suffix, response_format other than text) are a 400 naming them.
CompletionRequest ParseCompletionRequest(const nlohmann::ordered_json& body, bool chat);

// The messages array of a chat request or of /apply-template.
std::vector<ChatMessage> ParseMessages(const nlohmann::ordered_json& messages);

// The deepest nesting of arrays and objects a request body may have.
inline constexpr int kMaxJsonDepth = 64;

// Parses a request body, keeping key order (chat templates print tools and
// messages as the client sent them); invalid JSON, a non-object or nesting
// deeper than kMaxJsonDepth (code json_too_deep, refused while parsing: no
// deeper value is ever built) is a 400.
nlohmann::ordered_json ParseJsonBody(const std::string& body);

}  // namespace meshnet::api
