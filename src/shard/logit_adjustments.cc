#include "shard/logit_adjustments.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "util/error.h"

namespace meshnet::shard {

void LogitAdjustments::Validate(int32_t vocab) const {
  for (float p : {frequency_penalty, presence_penalty}) {
    if (!std::isfinite(p) || p < -2.0f || p > 2.0f) {
      ThrowInvalidArgument("penalties must be in [-2, 2]");
    }
  }
  for (const auto& [id, b] : bias) {
    if (id < 0 || id >= vocab) {
      ThrowInvalidArgument("logit_bias names token " + std::to_string(id) +
                           ", outside the vocabulary of " + std::to_string(vocab));
    }
    if (!std::isfinite(b) || b < -100.0f || b > 100.0f) {
      ThrowInvalidArgument("logit_bias values must be in [-100, 100]");
    }
  }
}

void LogitAdjustments::Apply(std::span<float> logits, std::span<const int32_t> counts,
                             std::span<const int32_t> seen) const {
  for (int32_t t : seen) {
    logits[t] -= frequency_penalty * static_cast<float>(counts[t]) +
                 (counts[t] > 0 ? presence_penalty : 0.0f);
  }
  for (const auto& [id, b] : bias) logits[id] += b;
}

float LogSumExp(std::span<const float> logits) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - max));
  return max + static_cast<float>(std::log(sum));
}

float Logprob(std::span<const float> logits, int32_t id, float log_sum_exp) {
  return logits[id] - log_sum_exp;
}

std::vector<TopLogprob> TopLogprobs(std::span<const float> logits, int top_n, float log_sum_exp) {
  const int n = static_cast<int>(logits.size());
  const int k = std::clamp(top_n, 0, n);
  std::vector<TopLogprob> best;
  best.reserve(static_cast<size_t>(k) + 1);
  auto better = [](const TopLogprob& a, const TopLogprob& b) {
    return a.logprob > b.logprob || (a.logprob == b.logprob && a.id < b.id);
  };
  // One pass keeping the k best in order (k <= 20 in the API).
  for (int i = 0; i < n && k > 0; ++i) {
    const TopLogprob c{i, logits[i] - log_sum_exp};
    if (static_cast<int>(best.size()) == k && !better(c, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), c, better), c);
    if (static_cast<int>(best.size()) > k) best.pop_back();
  }
  return best;
}

}  // namespace meshnet::shard
