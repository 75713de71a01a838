// Request-level changes to a tail's logits before sampling, and the
// log-probabilities reported back (OpenAI's frequency_penalty,
// presence_penalty, logit_bias, logprobs / top_logprobs).
//
// The tail samples from its logits row alone (shard::SamplingContract, a pure
// function of the row and the position); penalties depend on the tokens
// generated so far, which only the client has. So a generation with
// adjustments asks the tail for its logits row, applies them and samples
// with the same contract and position itself (mesh::Generate): the same
// seed gives the same tokens, and without adjustments nothing changes.
//
// Thread-safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace meshnet::shard {

struct LogitAdjustments {
  // logit[t] -= frequency_penalty * count[t] + presence_penalty * (count[t] > 0),
  // count over the tokens generated so far (OpenAI's definition); [-2, 2].
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  // logit[id] += bias, in [-100, 100] (-100 all but bans a token).
  std::vector<std::pair<int32_t, float>> bias;

  bool active() const { return frequency_penalty != 0 || presence_penalty != 0 || !bias.empty(); }
  // Throws Error(kInvalidArgument) for values out of range or ids outside
  // [0, vocab).
  void Validate(int32_t vocab) const;
  // Applies the adjustments to `logits` (one row of the vocabulary), given
  // the counts of generated tokens (`counts`, indexed by id) and the ids with
  // a count above zero (`seen`).
  void Apply(std::span<float> logits, std::span<const int32_t> counts,
             std::span<const int32_t> seen) const;
};

struct TopLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

// log softmax(logits)[id], and the `top_n` most likely ids with theirs
// (descending; ties: lower id first).
float Logprob(std::span<const float> logits, int32_t id, float log_sum_exp);
float LogSumExp(std::span<const float> logits);
std::vector<TopLogprob> TopLogprobs(std::span<const float> logits, int top_n, float log_sum_exp);

}  // namespace meshnet::shard
