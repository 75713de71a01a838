#include "api/engine.h"

#include <algorithm>
#include <random>
#include <utility>

#include "api/api_error.h"
#include "api/text_stream.h"
#include "node/identity.h"
#include "util/error.h"

namespace meshnet::api {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

ApiError FromMeshError(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::kInvalidArgument:
      return ApiError(400, e.what(), "invalid_request_error");
    case ErrorKind::kBudgetExceeded:
      return ApiError(503, std::string("the mesh has no KV room for this request: ") + e.what(),
                      "server_error", "", "kv_budget_exceeded");
    default:
      return ApiError(503, std::string("no route could serve the request: ") + e.what(),
                      "server_error", "", "route_unavailable");
  }
}

// The most input bytes one token can consume. A token's text holds at least
// the bytes it stands for ("▁" is 3 bytes for a space, GPT-2's byte alphabet
// 1-2 per byte, a byte token <0xXX> 6 for 1); an unknown token stands for one
// character (at most 4 bytes). Neither tokenizer normalizes text shorter.
int64_t MaxTokenBytes(const model::Tokenizer& t) {
  int64_t longest = 4;
  for (model::TokenId id = 0; id < t.vocab_size(); ++id) {
    longest = std::max<int64_t>(longest, static_cast<int64_t>(t.TokenText(id).size()));
  }
  return longest;
}

}  // namespace

Engine::Engine(model::Tokenizer tokenizer, ChatFormatter formatter, ProviderFactory providers,
               EngineOptions options)
    : tokenizer_(std::move(tokenizer)),
      formatter_(std::move(formatter)),
      control_mask_(tokenizer_),
      providers_(std::move(providers)),
      options_(std::move(options)),
      max_token_bytes_(MaxTokenBytes(tokenizer_)),
      admission_(options_.max_concurrent, options_.max_queue),
      text_admission_(options_.max_concurrent, options_.max_queue),
      kept_(options_.prefix_cache_sessions > 0
                ? std::make_unique<KeptSessions>(options_.prefix_cache_sessions)
                : nullptr) {}

int64_t Engine::MinTokens(size_t bytes) const {
  return (static_cast<int64_t>(bytes) + max_token_bytes_ - 1) / max_token_bytes_;
}

void Engine::RefuseTextPastContext(size_t bytes, const char* param) const {
  const int64_t at_least = MinTokens(bytes);
  if (at_least < options_.ctx) return;
  ThrowBadRequest("the prompt is at least " + std::to_string(at_least) + " tokens (" +
                      std::to_string(bytes) + " bytes); the context holds " +
                      std::to_string(options_.ctx) + " (prompt + completion)",
                  param, "context_length_exceeded");
}

void Engine::CheckBeforeAdmission(const CompletionRequest& r) const {
  if (!r.model.empty() && r.model != options_.model_name) {
    throw ApiError(404,
                   "the model '" + r.model + "' does not exist; this server serves '" +
                       options_.model_name + "'",
                   "invalid_request_error", "model", "model_not_found");
  }
  // A chat prompt's length is known once rendered (a template may drop
  // messages): Prepare checks it then.
  if (r.prompt_text) RefuseTextPastContext(r.prompt_text->size(), "prompt");
}

std::vector<int32_t> Engine::Tokenize(const std::string& text, bool add_special,
                                      bool parse_special) const {
  // llama_tokenize's rules: BOS (and EOS) as the model asks when add_special;
  // control tokens such as <|im_start|> only when parse_special (rendered chat
  // prompts), never from a plain completion prompt or /tokenize text.
  return tokenizer_.Tokenize(text, add_special, parse_special);
}

ControlTextMask::Prompt Engine::RenderPrompt(const std::vector<ChatMessage>& messages,
                                             bool add_generation_prompt,
                                             const nlohmann::ordered_json& tools,
                                             const std::function<bool()>& gone) const {
  if (options_.allow_control_in_content) {
    return {formatter_.Render(messages, add_generation_prompt, tools, gone), {}};
  }
  const ControlTextMask::Masked masked = control_mask_.Mask(messages, tools);
  return control_mask_.Unmask(
      formatter_.Render(masked.messages, add_generation_prompt, masked.tools, gone), masked);
}

std::string Engine::RenderChat(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                               const nlohmann::ordered_json& tools,
                               const std::function<bool()>& gone) const {
  return RenderPrompt(messages, add_generation_prompt, tools, gone).text;
}

PreparedGeneration Engine::Prepare(const CompletionRequest& r,
                                   const std::function<bool()>& gone) const {
  CheckBeforeAdmission(r);
  PreparedGeneration g;
  if (r.chat) {
    ControlTextMask::Prompt prompt = RenderPrompt(r.messages, true, r.tools, gone);
    RefuseTextPastContext(prompt.text.size(), "messages");
    // A template that writes the BOS text itself gets the BOS token once (no
    // double BOS); without special-token parsing the text would not map to it.
    // (BOS text a client sent first stays text.)
    const std::string& bos = formatter_.bos_token();
    const bool client_first = !prompt.literal.empty() && prompt.literal[0].begin < bos.size();
    if (!bos.empty() && prompt.text.starts_with(bos) && !client_first) {
      prompt.text.erase(0, bos.size());
      for (model::TextRange& range : prompt.literal) {
        range.begin -= bos.size();
        range.end -= bos.size();
      }
    }
    g.prompt_ids = tokenizer_.Tokenize(prompt.text, true, /*parse_special=*/true, prompt.literal);
  } else if (r.prompt_text) {
    g.prompt_ids = Tokenize(*r.prompt_text, true, /*parse_special=*/false);
  } else {
    for (int32_t id : r.prompt_ids) {
      if (id >= tokenizer_.vocab_size()) {
        ThrowBadRequest("token id " + std::to_string(id) + " is outside the vocabulary (" +
                            std::to_string(tokenizer_.vocab_size()) + " tokens)",
                        "prompt");
      }
    }
    g.prompt_ids = r.prompt_ids;
  }
  if (g.prompt_ids.empty()) ThrowBadRequest("the prompt encodes to no tokens", "prompt");
  const int64_t n = static_cast<int64_t>(g.prompt_ids.size());
  if (n >= options_.ctx) {
    ThrowBadRequest("the prompt is " + std::to_string(n) + " tokens; the context holds " +
                        std::to_string(options_.ctx) + " (prompt + completion)",
                    r.chat ? "messages" : "prompt", "context_length_exceeded");
  }
  const int room = static_cast<int>(options_.ctx - n);
  // OpenAI's defaults: 16 tokens for completions, up to the context for chat.
  const int wanted = r.max_tokens.value_or(r.chat ? room : 16);
  g.max_tokens = std::min(wanted, room);
  g.sampling.temperature = r.temperature;
  g.sampling.top_p = r.top_p;
  g.sampling.top_k = r.top_k;
  g.sampling.seed = r.seed ? *r.seed : std::random_device{}();
  g.stop = r.stop;
  g.cache_salt = r.cache_salt;
  g.logprobs = r.logprobs;
  g.adjustments = r.adjustments;
  try {
    g.adjustments.Validate(tokenizer_.vocab_size());
  } catch (const Error& e) {
    ThrowBadRequest(e.what(), "logit_bias");
  }
  return g;
}

mesh::GenerateOptions Engine::GenerateOptionsFor(const PreparedGeneration& gen) const {
  mesh::GenerateOptions options;
  options.max_tokens = gen.max_tokens;
  options.sampling = gen.sampling;
  options.adjustments = gen.adjustments;
  options.want_logits = gen.logprobs >= 0;
  options.prefill_chunk = options_.prefill_chunk;
  options.speculate = options_.speculate;
  options.draft = options_.draft;
  if (tokenizer_.eos_id() != model::kNoToken) options.eos_id = tokenizer_.eos_id();
  options.stop_ids = tokenizer_.eog_ids();  // eos, eot, eom, <|im_end|>, ...
  return options;
}

GenerationOutcome Engine::Run(const PreparedGeneration& gen, Clock::time_point arrival,
                              const EmitFn& emit, const std::function<bool()>& gone) {
  GenerationOutcome out;
  out.prompt_tokens = static_cast<int>(gen.prompt_ids.size());
  TextStream stream(gen.stop);
  LogprobTracker logprobs(tokenizer_, gen.logprobs);
  int32_t prev = gen.prompt_ids.back();
  Clock::time_point last = arrival;
  auto send = [&](const std::string& text) {
    if (text.empty() || out.client_gone) return;
    out.text += text;
    if (!emit(text, logprobs.Take(out.text.size()))) out.client_gone = true;
  };
  mesh::GenerateEvents events;
  if (gen.logprobs >= 0) {
    events.on_logits = [&](std::span<const float> row) { logprobs.Row(row); };
  }
  events.on_token = [&](int32_t id) {
    const Clock::time_point now = Clock::now();
    if (out.completion_tokens == 0) {
      metrics_.ObserveTimeToFirstToken(Seconds(now - arrival));
    } else {
      metrics_.ObserveInterTokenLatency(Seconds(now - last));
    }
    last = now;
    ++out.completion_tokens;
    const std::string piece = tokenizer_.DecodePiece(prev, id);
    logprobs.Token(prev, id, piece);
    send(stream.Push(piece));
    prev = id;
  };
  events.stop_requested = [&] {
    if (!out.client_gone && gone && gone()) out.client_gone = true;
    return out.client_gone || stream.stopped() || PastShutdownDeadline();
  };
  mesh::GenerateResult result;
  try {
    result = GenerateKept(gen, events);
  } catch (const Error& e) {
    throw FromMeshError(e);
  }
  out.cached_tokens = static_cast<int>(result.cached_tokens);
  metrics_.AddRouteUse({result.route_passes, result.route_seconds, result.measured_compute_seconds,
                        result.drafted, result.accepted});
  if (!stream.stopped()) send(stream.Finish());
  const bool hit_length = !result.stopped && out.completion_tokens >= gen.max_tokens;
  out.finish_reason = hit_length ? "length" : "stop";
  out.logprobs = logprobs.Released(out.text.size());
  metrics_.AddTokens(out.prompt_tokens, out.completion_tokens);
  return out;
}

mesh::GenerateResult Engine::GenerateKept(const PreparedGeneration& gen,
                                          const mesh::GenerateEvents& events) {
  std::unique_ptr<mesh::RouteProvider> provider = providers_();
  mesh::GenerateOptions options = GenerateOptionsFor(gen);
  if (!kept_) return mesh::Generate(*provider, gen.prompt_ids, options, events);
  int64_t shared = 0;
  std::optional<KeptSession> kept = kept_->Take(gen.cache_salt, gen.prompt_ids, &shared);
  if (kept) {
    options.session_id = kept->session_id;
    options.session_secret = kept->session_secret;
    options.initial_epoch = kept->epoch;
    // At least the prompt's last token is computed: its logits give the
    // first new token.
    options.resume_length =
        std::min<int64_t>(shared, static_cast<int64_t>(gen.prompt_ids.size()) - 1);
  } else {
    options.session_id = node::RandomId128();  // named here: it is kept by these
    options.session_secret = node::RandomId128();
  }
  options.release_at_end = false;
  // Hops of the kept session that the generation did not run on still hold
  // it (a re-planned route): released there.
  auto release_left_behind = [&](const std::vector<std::shared_ptr<mesh::ShardEndpoint>>& ran) {
    if (!kept) return;
    for (const auto& hop : kept->hops) {
      if (std::find(ran.begin(), ran.end(), hop) == ran.end()) {
        hop->Release(kept->session_id, kept->session_secret, kept->epoch);
      }
    }
  };
  mesh::GenerateResult result;
  try {
    result = mesh::Generate(*provider, gen.prompt_ids, options, events);
  } catch (...) {
    release_left_behind({});  // Generate released it on the hops it ran on
    throw;
  }
  release_left_behind(result.final_hops);
  metrics_.AddCachedTokens(result.cached_tokens);
  for (const auto& hop : result.final_hops) {
    hop->Park(options.session_id, options.session_secret, result.final_epoch);
  }
  kept_->Put({gen.cache_salt, std::move(result.kv_tokens), options.session_id,
              options.session_secret, result.final_epoch, result.final_hops});
  return result;
}

nlohmann::json Engine::Health() {
  nlohmann::json hops = nlohmann::json::array();
  try {
    mesh::Route route = providers_()->Plan();
    for (const auto& hop : route.hops) {
      const mesh::ShardInfo info = hop->Info();
      hops.push_back({{"name", hop->name()},
                      {"start_layer", info.start_layer},
                      {"end_layer", info.end_layer},
                      {"live_sessions", info.live_sessions},
                      {"kv_bytes_free", info.kv_bytes_free}});
    }
  } catch (const Error& e) {
    throw ApiError(503, std::string("no route is available: ") + e.what(), "server_error", "",
                   "route_unavailable");
  }
  return {{"status", "ok"}, {"hops", hops}};
}

void Engine::BeginShutdown(Clock::time_point deadline) {
  deadline_ns_ =
      std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count();
  shutting_down_ = true;
  admission_.Shutdown();
  text_admission_.Shutdown();
}

bool Engine::PastShutdownDeadline() const {
  if (!shutting_down_) return false;
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  return now >= deadline_ns_;
}

}  // namespace meshnet::api
