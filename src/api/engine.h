// The engine behind the HTTP handlers: turns a parsed request into prompt
// tokens (chat rendering, the one tokenizer call site, context checks) and
// runs it as one session on a route (mesh::Generate), streaming the visible
// text through a callback. Admission control and metrics live here so every
// endpoint shares them.
//
// Cancellation: the callback returns false when the client is gone; the
// generation then stops before its next step (within one token) and the
// session is released on every hop. Shutdown cancels whatever is still
// running once its grace deadline passes.
//
// Thread-safety: Prepare/Run/Health may run concurrently from many threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "api/admission.h"
#include "api/chat_format.h"
#include "api/control_text.h"
#include "api/kept_sessions.h"
#include "api/logprobs.h"
#include "api/metrics.h"
#include "api/request.h"
#include "mesh/generator.h"
#include "model/tokenizer.h"
#include "shard/boundary.h"

namespace meshnet::api {

struct EngineOptions {
  std::string model_name;  // the id /v1/models lists and requests may name
  int64_t ctx = 0;         // positions per session (prompt + completion)
  int max_concurrent = 4;
  int max_queue = 64;
  int64_t prefill_chunk = 0;  // mesh::GenerateOptions::prefill_chunk
  // Control-token text in what a chat client sends becomes control tokens
  // (llama-server's behaviour); by default it stays text (api/control_text.h).
  bool allow_control_in_content = false;
  // Sessions kept after their generation for later prompts that start with
  // their text (api/kept_sessions.h); 0: every session is released at its
  // end.
  int prefix_cache_sessions = 0;
  int speculate = 0;  // mesh::GenerateOptions::speculate (draft tokens per step)
  std::shared_ptr<mesh::DraftSource> draft;  // mesh::GenerateOptions::draft (null: prompt lookup)
};

// A generation ready to run.
struct PreparedGeneration {
  std::vector<int32_t> prompt_ids;
  int max_tokens = 0;
  shard::SamplingContract sampling;
  shard::LogitAdjustments adjustments;  // penalties, logit_bias (sampled by the client)
  int logprobs = -1;                    // CompletionRequest::logprobs
  std::vector<std::string> stop;
  std::string cache_salt;  // CompletionRequest::cache_salt
};

struct GenerationOutcome {
  std::string text;  // everything emitted
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;      // prompt tokens whose KV was reused (the prefix cache)
  std::string finish_reason;  // "stop" or "length"
  bool client_gone = false;
  std::vector<TokenLogprob> logprobs;  // with PreparedGeneration::logprobs >= 0
};

// A text delta of a running generation and the logprob entries of the
// tokens whose text starts in it; returns false when the client is gone.
using EmitFn = std::function<bool(const std::string& text, std::span<const TokenLogprob> entries)>;

// A fresh provider per generation: a FixedRouteProvider over the in-process
// mesh, or a view of the shared remote provider.
using ProviderFactory = std::function<std::unique_ptr<mesh::RouteProvider>()>;

class Engine {
 public:
  Engine(model::Tokenizer tokenizer, ChatFormatter formatter, ProviderFactory providers,
         EngineOptions options);

  const EngineOptions& options() const { return options_; }
  const model::Tokenizer& tokenizer() const { return tokenizer_; }
  Admission& admission() { return admission_; }
  // /tokenize and /apply-template: as many at once as generations, so their
  // tokenizing and rendering is bounded too (not counted as generations).
  Admission& text_admission() { return text_admission_; }
  ApiMetrics& metrics() { return metrics_; }

  // Throws ApiError (400 or 404) for a request that cannot run. Renders and
  // tokenizes: run it holding an admission slot, so that at most
  // max_concurrent prompts are tokenized at once. `gone`, if set, is polled
  // while the chat template renders (the render then stops).
  PreparedGeneration Prepare(const CompletionRequest& request,
                             const std::function<bool()>& gone = {}) const;
  // The checks Prepare makes that cost nothing (the model name, a
  // completion prompt too long for the context whatever its tokens), to run
  // before admission.
  void CheckBeforeAdmission(const CompletionRequest& request) const;
  // Fewest tokens `bytes` of text can encode to: no token consumes more
  // input bytes than its text holds (max_token_bytes), so a text longer
  // than ctx * max_token_bytes is refused without tokenizing it.
  int64_t MinTokens(size_t bytes) const;
  // Runs a prepared generation. `emit` gets each visible text delta (never
  // empty, whole UTF-8 characters) with its logprob entries and returns
  // false when the client is gone; `gone`, if set, is asked before every
  // step too (a client that is sent nothing until the end). Throws ApiError
  // (503 when the route fails).
  GenerationOutcome Run(const PreparedGeneration& gen,
                        std::chrono::steady_clock::time_point arrival, const EmitFn& emit,
                        const std::function<bool()>& gone = {});

  // The one place prompts are tokenized (special-token parsing goes here).
  std::vector<int32_t> Tokenize(const std::string& text, bool add_special,
                                bool parse_special) const;
  // The rendered chat prompt (what /apply-template returns).
  std::string RenderChat(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                         const nlohmann::ordered_json& tools,
                         const std::function<bool()>& gone = {}) const;
  // {"status":"ok","hops":[{name, start_layer, end_layer, live_sessions,
  // kv_bytes_free}...]}; throws ApiError(503) when no route is available.
  nlohmann::json Health();

  // Refuses new generations, wakes queued ones, and lets running ones finish
  // until `deadline`, after which they stop before their next token.
  void BeginShutdown(std::chrono::steady_clock::time_point deadline);

 private:
  bool PastShutdownDeadline() const;
  mesh::GenerateOptions GenerateOptionsFor(const PreparedGeneration& gen) const;
  // Generate, resuming a kept session when one shares the prompt's start,
  // and keeping this one afterwards (with the prefix cache on).
  mesh::GenerateResult GenerateKept(const PreparedGeneration& gen,
                                    const mesh::GenerateEvents& events);
  // The rendered prompt and the byte ranges of control-token text the client
  // sent (to be tokenized as text; none with allow_control_in_content).
  ControlTextMask::Prompt RenderPrompt(const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt,
                                       const nlohmann::ordered_json& tools,
                                       const std::function<bool()>& gone) const;
  // context_length_exceeded when `bytes` of text cannot fit the context.
  void RefuseTextPastContext(size_t bytes, const char* param) const;

  model::Tokenizer tokenizer_;
  ChatFormatter formatter_;
  ControlTextMask control_mask_;
  ProviderFactory providers_;
  EngineOptions options_;
  int64_t max_token_bytes_;  // the longest token text, at least 4 (one UTF-8 character)
  Admission admission_;
  Admission text_admission_;
  ApiMetrics metrics_;
  std::unique_ptr<KeptSessions> kept_;  // null: no prefix cache
  std::atomic<bool> shutting_down_{false};
  std::atomic<int64_t> deadline_ns_{0};
};

}  // namespace meshnet::api
