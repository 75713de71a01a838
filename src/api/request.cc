#include "api/request.h"

#include <cmath>
#include <limits>

#include "api/api_error.h"

namespace meshnet::api {
namespace {

using nlohmann::ordered_json;

constexpr size_t kMaxStops = 4;  // OpenAI's limit

const ordered_json* Field(const ordered_json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

float NumberIn(const ordered_json& body, const char* name, float fallback, double lo, double hi) {
  const ordered_json* v = Field(body, name);
  if (v == nullptr) return fallback;
  if (!v->is_number()) ThrowBadRequest(std::string("'") + name + "' must be a number", name);
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    ThrowBadRequest(std::string("'") + name + "' must be in [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "], got " + v->dump(),
                    name);
  }
  return static_cast<float>(d);
}

bool BoolField(const ordered_json& body, const char* name) {
  const ordered_json* v = Field(body, name);
  if (v == nullptr) return false;
  if (!v->is_boolean()) ThrowBadRequest(std::string("'") + name + "' must be a boolean", name);
  return v->get<bool>();
}

std::optional<int> MaxTokens(const ordered_json& body) {
  std::optional<int> out;
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    const ordered_json* v = Field(body, name);
    if (v == nullptr) continue;
    if (!v->is_number_integer()) {
      ThrowBadRequest(std::string("'") + name + "' must be an integer", name);
    }
    const int64_t n = v->get<int64_t>();
    if (n <= 0) {
      ThrowBadRequest(std::string("'") + name + "' must be at least 1, got " + v->dump(), name);
    }
    out = static_cast<int>(std::min<int64_t>(n, std::numeric_limits<int>::max()));
  }
  return out;
}

std::vector<std::string> Stops(const ordered_json& body) {
  const ordered_json* v = Field(body, "stop");
  if (v == nullptr) return {};
  std::vector<std::string> out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > kMaxStops) ThrowBadRequest("'stop' holds at most 4 sequences", "stop");
    for (const ordered_json& s : *v) {
      if (!s.is_string()) ThrowBadRequest("'stop' entries must be strings", "stop");
      out.push_back(s.get<std::string>());
    }
  } else {
    ThrowBadRequest("'stop' must be a string or an array of strings", "stop");
  }
  for (const auto& s : out) {
    if (s.empty()) ThrowBadRequest("'stop' sequences must not be empty", "stop");
  }
  return out;
}

std::string FlattenContent(const ordered_json& content, size_t index) {
  const std::string param = "messages[" + std::to_string(index) + "].content";
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) ThrowBadRequest("content must be a string or an array of parts", param);
  std::string out;
  for (const ordered_json& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      ThrowBadRequest("only text content parts ({\"type\":\"text\",\"text\":...}) are supported",
                      param);
    }
    out += part["text"].get<std::string>();
  }
  return out;
}

void ParsePrompt(const ordered_json& body, CompletionRequest& r) {
  const ordered_json* p = Field(body, "prompt");
  if (p == nullptr) ThrowBadRequest("'prompt' is required", "prompt");
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
    return;
  }
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
    r.prompt_text = (*p)[0].get<std::string>();
    return;
  }
  if (!p->is_array() || p->empty()) {
    ThrowBadRequest("'prompt' must be a string or a non-empty array of token ids", "prompt");
  }
  for (const ordered_json& id : *p) {
    if (!id.is_number_integer()) {
      ThrowBadRequest("'prompt' arrays must hold token ids (one prompt per request)", "prompt");
    }
    const int64_t v = id.get<int64_t>();
    if (v < 0 || v > std::numeric_limits<int32_t>::max()) {
      ThrowBadRequest("token id " + id.dump() + " is out of range", "prompt");
    }
    r.prompt_ids.push_back(static_cast<int32_t>(v));
  }
}

// logprobs / top_logprobs: completions take an integer (0..5), chat a
// boolean with top_logprobs (0..20).
int Logprobs(const ordered_json& body, bool chat) {
  const ordered_json* lp = Field(body, "logprobs");
  const ordered_json* top = Field(body, "top_logprobs");
  if (!chat) {
    if (top != nullptr) ThrowBadRequest("'top_logprobs' is a chat parameter", "top_logprobs");
    if (lp == nullptr) return -1;
    if (!lp->is_number_integer() || lp->get<int64_t>() < 0 || lp->get<int64_t>() > 5) {
      ThrowBadRequest("'logprobs' must be an integer in [0, 5]", "logprobs");
    }
    return lp->get<int>();
  }
  const bool on = BoolField(body, "logprobs");
  if (top == nullptr) return on ? 0 : -1;
  if (!on) ThrowBadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  if (!top->is_number_integer() || top->get<int64_t>() < 0 || top->get<int64_t>() > 20) {
    ThrowBadRequest("'top_logprobs' must be an integer in [0, 20]", "top_logprobs");
  }
  return top->get<int>();
}

constexpr size_t kMaxLogitBias = 1024;

std::vector<std::pair<int32_t, float>> LogitBias(const ordered_json& body) {
  const ordered_json* b = Field(body, "logit_bias");
  if (b == nullptr) return {};
  if (!b->is_object()) ThrowBadRequest("'logit_bias' must be an object", "logit_bias");
  if (b->size() > kMaxLogitBias) {
    ThrowBadRequest("'logit_bias' holds at most 1024 tokens", "logit_bias");
  }
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, value] : b->items()) {
    const bool digits =
        !key.empty() && key.size() <= 9 && key.find_first_not_of("0123456789") == std::string::npos;
    if (!digits) ThrowBadRequest("'logit_bias' keys must be token ids", "logit_bias");
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < -100 ||
        value.get<double>() > 100) {
      ThrowBadRequest("'logit_bias' values must be numbers in [-100, 100]", "logit_bias");
    }
    out.emplace_back(std::stoi(key), value.get<float>());
  }
  return out;
}

// What the API accepts only in its default form.
void RefuseUnsupported(const ordered_json& body) {
  if (const ordered_json* b = Field(body, "best_of");
      b != nullptr && (!b->is_number_integer() || b->get<int64_t>() != 1)) {
    ThrowBadRequest("only best_of = 1 is supported, got " + b->dump(), "best_of");
  }
  if (BoolField(body, "echo")) ThrowBadRequest("'echo' is not supported", "echo");
  if (const ordered_json* s = Field(body, "suffix");
      s != nullptr && !(s->is_string() && s->get<std::string>().empty())) {
    ThrowBadRequest("'suffix' (insertion) is not supported", "suffix");
  }
  if (const ordered_json* f = Field(body, "response_format")) {
    const ordered_json* type = f->is_object() ? Field(*f, "type") : nullptr;
    if (type == nullptr || !type->is_string()) {
      ThrowBadRequest("'response_format' must be an object with a string 'type'",
                      "response_format");
    }
    if (type->get<std::string>() != "text") {
      ThrowBadRequest("'response_format' of type '" + type->get<std::string>() +
                          "' is not supported (only 'text')",
                      "response_format");
    }
  }
}

}  // namespace

ordered_json ParseJsonBody(const std::string& body) {
  // nlohmann's parser keeps its own stack, but copying, dumping and comparing
  // a value recurse once per level, so a body nested tens of thousands deep
  // would overflow the stack later (in a template, an error message, a
  // copy). The callback sees every container open with its depth; deeper
  // than the limit it is discarded (never built) and the body refused.
  bool too_deep = false;
  const ordered_json::parser_callback_t limit =
      [&too_deep](int depth, ordered_json::parse_event_t event, ordered_json&) {
        const bool opens = event == ordered_json::parse_event_t::object_start ||
                           event == ordered_json::parse_event_t::array_start;
        if (opens && depth >= kMaxJsonDepth) too_deep = true;
        return !too_deep;
      };
  ordered_json j = ordered_json::parse(body, limit, /*allow_exceptions=*/false);
  if (too_deep) {
    ThrowBadRequest(
        "the request body nests JSON deeper than " + std::to_string(kMaxJsonDepth) + " levels", "",
        "json_too_deep");
  }
  if (j.is_discarded()) ThrowBadRequest("the request body is not valid JSON", "", "invalid_json");
  if (!j.is_object()) ThrowBadRequest("the request body must be a JSON object");
  return j;
}

std::vector<ChatMessage> ParseMessages(const ordered_json& messages) {
  if (!messages.is_array()) ThrowBadRequest("'messages' must be an array", "messages");
  if (messages.empty()) ThrowBadRequest("'messages' must not be empty", "messages");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ordered_json& m = messages[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) ThrowBadRequest("each message must be an object", param);
    const ordered_json* role = Field(m, "role");
    if (role == nullptr || !role->is_string()) {
      ThrowBadRequest("each message needs a string 'role'", param + ".role");
    }
    ChatMessage msg;
    msg.role = role->get<std::string>();
    if (msg.role != "system" && msg.role != "developer" && msg.role != "user" &&
        msg.role != "assistant" && msg.role != "tool") {
      ThrowBadRequest("unknown role '" + msg.role + "'", param + ".role");
    }
    const ordered_json* content = Field(m, "content");
    if (content == nullptr && !(msg.role == "assistant" && m.contains("tool_calls"))) {
      ThrowBadRequest("each message needs 'content'", param + ".content");
    }
    if (content != nullptr) msg.content = FlattenContent(*content, i);
    msg.null_content = content == nullptr;
    for (const auto& [k, v] : m.items()) {
      if (k != "role" && k != "content") msg.extra[k] = v;
    }
    out.push_back(std::move(msg));
  }
  return out;
}

namespace {

// The request's cache_salt ("" when not given).
std::string CacheSalt(const ordered_json& body) {
  const ordered_json* salt = Field(body, "cache_salt");
  if (salt == nullptr) return "";
  if (!salt->is_string() || salt->get_ref<const std::string&>().size() > 256) {
    ThrowBadRequest("'cache_salt' must be a string of at most 256 bytes", "cache_salt");
  }
  return salt->get<std::string>();
}

}  // namespace

CompletionRequest ParseCompletionRequest(const ordered_json& body, bool chat) {
  CompletionRequest r;
  r.chat = chat;
  if (const ordered_json* m = Field(body, "model")) {
    if (!m->is_string()) ThrowBadRequest("'model' must be a string", "model");
    r.model = m->get<std::string>();
  }
  if (const ordered_json* n = Field(body, "n")) {
    if (!n->is_number_integer() || n->get<int64_t>() != 1) {
      ThrowBadRequest("only n = 1 is supported, got " + n->dump(), "n");
    }
  }
  if (chat) {
    const ordered_json* m = Field(body, "messages");
    if (m == nullptr) ThrowBadRequest("'messages' is required", "messages");
    r.messages = ParseMessages(*m);
    if (const ordered_json* t = Field(body, "tools")) {
      if (!t->is_array()) ThrowBadRequest("'tools' must be an array", "tools");
      r.tools = *t;
    }
  } else {
    ParsePrompt(body, r);
  }
  r.max_tokens = MaxTokens(body);
  r.temperature = NumberIn(body, "temperature", 1.0f, 0.0, 2.0);
  r.top_p = NumberIn(body, "top_p", 1.0f, 0.0, 1.0);
  if (r.top_p <= 0.0f) ThrowBadRequest("'top_p' must be greater than 0", "top_p");
  if (const ordered_json* k = Field(body, "top_k")) {
    if (!k->is_number_integer() || k->get<int64_t>() < 0 ||
        k->get<int64_t>() > std::numeric_limits<int>::max()) {
      ThrowBadRequest("'top_k' must be a non-negative integer", "top_k");
    }
    r.top_k = k->get<int>();
  }
  if (const ordered_json* s = Field(body, "seed")) {
    if (!s->is_number_integer()) ThrowBadRequest("'seed' must be an integer", "seed");
    r.seed =
        s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
  r.stop = Stops(body);
  r.stream = BoolField(body, "stream");
  if (const ordered_json* so = Field(body, "stream_options")) {
    if (!so->is_object()) ThrowBadRequest("'stream_options' must be an object", "stream_options");
    if (!r.stream) ThrowBadRequest("'stream_options' needs 'stream': true", "stream_options");
    r.include_usage = BoolField(*so, "include_usage");
  }
  if (const ordered_json* u = Field(body, "user"); u != nullptr && !u->is_string()) {
    ThrowBadRequest("'user' must be a string", "user");
  }
  r.cache_salt = CacheSalt(body);
  RefuseUnsupported(body);
  r.logprobs = Logprobs(body, chat);
  r.adjustments.frequency_penalty = NumberIn(body, "frequency_penalty", 0.0f, -2.0, 2.0);
  r.adjustments.presence_penalty = NumberIn(body, "presence_penalty", 0.0f, -2.0, 2.0);
  r.adjustments.bias = LogitBias(body);
  return r;
}

}  // namespace meshnet::api
