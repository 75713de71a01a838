// Log-probabilities of generated tokens (OpenAI's logprobs / top_logprobs):
// the model's distribution, i.e. log softmax of the tail's raw logits row,
// before penalties, logit_bias, temperature, top-k and top-p. Entries are
// kept per token with where its text starts in the completion, so a stream
// can send each one with the chunk that carries its first byte, and a
// stop-sequence cut drops the tokens whose text was never sent.
//
// Thread-safety: a tracker belongs to one generation (one thread).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/tokenizer.h"

namespace meshnet::api {

struct TokenLogprob {
  int32_t id = 0;
  std::string token;  // its text (may be part of a UTF-8 character)
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;  // the most likely tokens there
  size_t text_offset = 0;                          // where its text starts in the completion
};

class LogprobTracker {
 public:
  // top_n < 0: off (Row and Token do nothing).
  LogprobTracker(const model::Tokenizer& tokenizer, int top_n);
  bool on() const { return top_n_ >= 0; }
  // The tail's row for the token that follows.
  void Row(std::span<const float> logits);
  // The token sampled from the last row, after `prev`, with its text.
  void Token(int32_t prev, int32_t id, const std::string& piece);
  // The entries not taken yet whose text starts before `released` bytes of
  // completion have been sent.
  std::span<const TokenLogprob> Take(size_t released);
  // Every entry whose text starts before `length` bytes.
  std::vector<TokenLogprob> Released(size_t length) const;

 private:
  const model::Tokenizer& tokenizer_;
  const int top_n_;
  std::vector<float> row_;
  std::vector<TokenLogprob> entries_;
  size_t taken_ = 0;
  size_t raw_ = 0;  // bytes of text the tokens so far decode to
};

// choices[].logprobs: chat {"content":[{token, logprob, bytes,
// top_logprobs:[{token, logprob, bytes}]}]}, completions {tokens,
// token_logprobs, top_logprobs:[{token: logprob}], text_offset}.
nlohmann::json LogprobsJson(std::span<const TokenLogprob> entries, bool chat);

}  // namespace meshnet::api
