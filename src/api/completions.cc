// /v1/completions and /v1/chat/completions, plain JSON or Server-Sent Events.
#include <ctime>
#include <memory>
#include <string>

#include "api/api_error.h"
#include "api/handlers.h"
#include "http/hardened_server.h"
#include "mesh/generator.h"
#include "node/identity.h"

namespace meshnet::api {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// What every response and chunk of one request shares.
struct ResponseHead {
  bool chat = false;
  std::string id;
  int64_t created = 0;
  std::string model;
  bool include_usage = false;
  bool logprobs = false;  // choices carry logprobs (else null)
};

json Usage(const GenerationOutcome& o) {
  return {{"prompt_tokens", o.prompt_tokens},
          {"completion_tokens", o.completion_tokens},
          {"total_tokens", o.prompt_tokens + o.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", o.cached_tokens}}}};
}

json Envelope(const ResponseHead& h, bool chunk) {
  json j;
  j["id"] = h.id;
  j["object"] = h.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  j["created"] = h.created;
  j["model"] = h.model;
  return j;
}

json FullResponse(const ResponseHead& h, const GenerationOutcome& o) {
  json choice = {{"index", 0}, {"finish_reason", o.finish_reason}, {"logprobs", nullptr}};
  if (h.logprobs) choice["logprobs"] = LogprobsJson(o.logprobs, h.chat);
  if (h.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", o.text}};
  } else {
    choice["text"] = o.text;
  }
  json j = Envelope(h, false);
  j["choices"] = json::array({choice});
  j["usage"] = Usage(o);
  return j;
}

// One chunk with a single choice: a delta (chat) or text (completions).
json Chunk(const ResponseHead& h, const json& delta, const std::string& text,
           const json& finish_reason) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason}, {"logprobs", nullptr}};
  if (h.chat) {
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  json j = Envelope(h, true);
  j["choices"] = json::array({choice});
  if (h.include_usage) j["usage"] = nullptr;
  return j;
}

// Sends one SSE event. The blank line that ends it is a second write: a peer
// that has gone away answers the first write with a reset, so the second one
// fails and the generation stops before computing another token.
bool SendEvent(httplib::DataSink& sink, const std::string& data) {
  const std::string head = "data: " + data + "\n";
  return sink.write(head.data(), head.size()) && sink.write("\n", 1);
}

bool SendJsonEvent(httplib::DataSink& sink, const json& j) {
  return SendEvent(sink, j.dump(-1, ' ', false, json::error_handler_t::replace));
}

// The bytes of a content chunk around its text, serialized once per request:
// a token then costs one string escape instead of building a JSON tree. The
// split is taken from a real dump, so the bytes equal Chunk()'s.
struct ContentFrame {
  std::string prefix;
  std::string suffix;

  explicit ContentFrame(const ResponseHead& h) {
    const std::string marker = "\x01meshnet-text\x01";
    const std::string whole = Chunk(h, {{"content", marker}}, marker, nullptr).dump(-1, ' ', false);
    const std::string quoted = json(marker).dump();
    const size_t at = whole.find(quoted);
    prefix = "data: " + whole.substr(0, at);
    suffix = whole.substr(at + quoted.size()) + "\n";
  }
  std::string Event(const std::string& text) const {
    return prefix + json(text).dump(-1, ' ', false, json::error_handler_t::replace) + suffix;
  }
};

// A content chunk's event bytes: through the frame, or built whole when it
// carries logprobs.
std::string ContentEvent(const ResponseHead& h, const ContentFrame& frame, const std::string& text,
                         std::span<const TokenLogprob> entries) {
  if (!h.logprobs) return frame.Event(text);
  json chunk = Chunk(h, {{"content", text}}, text, nullptr);
  chunk["choices"][0]["logprobs"] = LogprobsJson(entries, h.chat);
  return "data: " + chunk.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

struct StreamState {
  Engine* engine;
  ResponseHead head;
  PreparedGeneration gen;
  Clock::time_point arrival;
  std::unique_ptr<AdmissionSlot> slot;
};

// Returns true when the stream ended normally (sink.done() called).
bool Stream(StreamState& st, httplib::DataSink& sink) {
  const ResponseHead& h = st.head;
  bool alive = true;
  if (h.chat) {
    alive = SendJsonEvent(sink, Chunk(h, {{"role", "assistant"}, {"content", ""}}, "", nullptr));
  }
  const ContentFrame frame(h);
  try {
    if (!alive) return false;
    GenerationOutcome o = st.engine->Run(
        st.gen, st.arrival, [&](const std::string& text, std::span<const TokenLogprob> entries) {
          const std::string head = ContentEvent(h, frame, text, entries);
          return sink.write(head.data(), head.size()) && sink.write("\n", 1);
        });
    if (o.client_gone) return false;
    if (!SendJsonEvent(sink, Chunk(h, json::object(), "", o.finish_reason))) return false;
    if (h.include_usage) {
      json u = Envelope(h, true);
      u["choices"] = json::array();
      u["usage"] = Usage(o);
      if (!SendJsonEvent(sink, u)) return false;
    }
  } catch (const ApiError& e) {
    // Headers are out: the error travels as an event, as OpenAI's API does.
    if (!SendJsonEvent(sink, e.ToJson())) return false;
  }
  if (!SendEvent(sink, "[DONE]")) return false;
  sink.done();
  return true;
}

// The request, with the body and its JSON freed before it waits for a slot.
CompletionRequest ParseBody(std::string body, bool chat) {
  const nlohmann::ordered_json j = ParseJsonBody(body);
  body = std::string();
  return ParseCompletionRequest(j, chat);
}

// Waits for a slot of `admission` (released by the returned guard).
std::unique_ptr<AdmissionSlot> Admit(Admission& admission, const char* what = "generation") {
  switch (admission.Acquire()) {
    case Admission::Outcome::kAdmitted:
      return std::make_unique<AdmissionSlot>(&admission);
    case Admission::Outcome::kQueueFull:
      throw ApiError(
          429, std::string("too many requests: every ") + what + " slot and queue place is taken",
          "rate_limit_error", "", "queue_full");
    case Admission::Outcome::kShuttingDown:
      throw ApiError(503, "the server is shutting down", "server_error", "", "shutting_down");
  }
  return nullptr;  // not reached
}

}  // namespace

void SetJson(httplib::Response& res, const json& j, int status) {
  res.status = status;
  res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n",
                  "application/json");
}

void HandleCompletion(Engine& engine, const httplib::Request&, std::string body,
                      httplib::Response& res, bool chat) {
  const Clock::time_point arrival = Clock::now();
  const CompletionRequest r = ParseBody(std::move(body), chat);
  engine.CheckBeforeAdmission(r);
  // Admitted first, then rendered and tokenized: at most --max-concurrent
  // prompts are tokenized at once, and a queued request holds only its
  // parsed fields.
  auto slot = Admit(engine.admission());
  http::Connection* client = http::CurrentConnection();
  // A hang-up stops the template render and the generation.
  const auto gone = [client] { return client != nullptr && client->ClientGone(); };
  PreparedGeneration gen = engine.Prepare(r, gone);
  ResponseHead head;
  head.chat = chat;
  head.id = (chat ? "chatcmpl-" : "cmpl-") + node::RandomId128().substr(0, 24);
  head.created = static_cast<int64_t>(std::time(nullptr));
  head.model = engine.options().model_name;
  head.include_usage = r.include_usage;
  head.logprobs = r.logprobs >= 0;
  if (!r.stream) {
    // Nothing is written until the end: the hang-up is seen on the socket.
    const GenerationOutcome o = engine.Run(
        gen, arrival, [](const std::string&, std::span<const TokenLogprob>) { return true; }, gone);
    SetJson(res, FullResponse(head, o));
    return;
  }
  auto st = std::make_shared<StreamState>(
      StreamState{&engine, std::move(head), std::move(gen), arrival, std::move(slot)});
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider("text/event-stream", [st](size_t, httplib::DataSink& sink) {
    const bool ok = Stream(*st, sink);  // one call does the whole stream
    st->slot.reset();
    return ok;
  });
}

void HandleTokenize(Engine& engine, const httplib::Request&, std::string text,
                    httplib::Response& res) {
  const nlohmann::ordered_json body = ParseJsonBody(text);
  auto it = body.find("content");
  if (it == body.end() || !it->is_string())
    ThrowBadRequest("'content' must be a string", "content");
  bool add_special = false;
  if (auto s = body.find("add_special"); s != body.end() && !s->is_null()) {
    if (!s->is_boolean()) ThrowBadRequest("'add_special' must be a boolean", "add_special");
    add_special = s->get<bool>();
  }
  // llama-server's /tokenize: control tokens are parsed unless parse_special is false.
  bool parse_special = true;
  if (auto s = body.find("parse_special"); s != body.end() && !s->is_null()) {
    if (!s->is_boolean()) ThrowBadRequest("'parse_special' must be a boolean", "parse_special");
    parse_special = s->get<bool>();
  }
  const auto slot = Admit(engine.text_admission(), "tokenize/apply-template");
  const std::vector<int32_t> ids =
      engine.Tokenize(it->get<std::string>(), add_special, parse_special);
  SetJson(res, {{"tokens", ids}});
}

void HandleDetokenize(Engine& engine, const httplib::Request&, std::string text,
                      httplib::Response& res) {
  const nlohmann::ordered_json body = ParseJsonBody(text);
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) ThrowBadRequest("'tokens' must be an array", "tokens");
  std::vector<int32_t> ids;
  for (const nlohmann::ordered_json& t : *it) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() >= engine.tokenizer().vocab_size()) {
      ThrowBadRequest("'tokens' must hold ids in [0, " +
                          std::to_string(engine.tokenizer().vocab_size()) + "), got " + t.dump(),
                      "tokens");
    }
    ids.push_back(t.get<int32_t>());
  }
  SetJson(res, {{"content", engine.tokenizer().Decode(ids)}});
}

void HandleApplyTemplate(Engine& engine, const httplib::Request&, std::string text,
                         httplib::Response& res) {
  const nlohmann::ordered_json body = ParseJsonBody(text);
  auto it = body.find("messages");
  if (it == body.end()) ThrowBadRequest("'messages' is required", "messages");
  nlohmann::ordered_json tools = body.value("tools", nlohmann::ordered_json());
  if (!tools.is_null() && !tools.is_array()) ThrowBadRequest("'tools' must be an array", "tools");
  bool add_generation_prompt = true;
  if (auto g = body.find("add_generation_prompt"); g != body.end() && !g->is_null()) {
    if (!g->is_boolean()) {
      ThrowBadRequest("'add_generation_prompt' must be a boolean", "add_generation_prompt");
    }
    add_generation_prompt = g->get<bool>();
  }
  const std::vector<ChatMessage> messages = ParseMessages(*it);
  const auto slot = Admit(engine.text_admission(), "tokenize/apply-template");
  http::Connection* client = http::CurrentConnection();
  SetJson(res, {{"prompt", engine.RenderChat(messages, add_generation_prompt, tools, [client] {
                   return client != nullptr && client->ClientGone();
                 })}});
}

}  // namespace meshnet::api
