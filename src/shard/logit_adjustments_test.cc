#include "shard/logit_adjustments.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "util/error.h"

namespace meshnet::shard {
namespace {

TEST(LogitAdjustments, PenaltiesFollowOpenAIsDefinitionAndBiasAdds) {
  std::vector<float> logits = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<int32_t> counts = {0, 3, 1, 0};
  const std::vector<int32_t> seen = {1, 2};
  LogitAdjustments a;
  a.frequency_penalty = 0.5f;
  a.presence_penalty = 0.25f;
  a.bias = {{0, 10.0f}, {3, -100.0f}};
  EXPECT_TRUE(a.active());
  a.Apply(logits, counts, seen);
  EXPECT_FLOAT_EQ(logits[0], 11.0f);
  EXPECT_FLOAT_EQ(logits[1], 2.0f - 1.5f - 0.25f);
  EXPECT_FLOAT_EQ(logits[2], 3.0f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(logits[3], -96.0f);
  EXPECT_FALSE(LogitAdjustments{}.active());
}

TEST(LogitAdjustments, ValidateRefusesOutOfRange) {
  auto refused = [](const LogitAdjustments& a) {
    try {
      a.Validate(10);
      return false;
    } catch (const Error& e) {
      return e.kind() == ErrorKind::kInvalidArgument;
    }
  };
  EXPECT_TRUE(refused({2.5f, 0, {}}));
  EXPECT_TRUE(refused({0, -2.01f, {}}));
  EXPECT_TRUE(refused({0, 0, {{10, 1.0f}}}));
  EXPECT_TRUE(refused({0, 0, {{-1, 1.0f}}}));
  EXPECT_TRUE(refused({0, 0, {{3, 101.0f}}}));
  EXPECT_FALSE(refused({2.0f, -2.0f, {{9, -100.0f}}}));
}

TEST(Logprobs, AreALogSoftmaxAndTopIsSorted) {
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f, -3.0f};
  const float lse = LogSumExp(logits);
  double mass = 0;
  for (int i = 0; i < 5; ++i) mass += std::exp(Logprob(logits, i, lse));
  EXPECT_NEAR(mass, 1.0, 1e-6);
  EXPECT_NEAR(Logprob(logits, 1, lse) - Logprob(logits, 0, lse), 2.0, 1e-6);
  const std::vector<TopLogprob> top = TopLogprobs(logits, 3, lse);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].id, 1);  // a tie with 3: the lower id first
  EXPECT_EQ(top[1].id, 3);
  EXPECT_EQ(top[2].id, 2);
  EXPECT_FLOAT_EQ(top[0].logprob, Logprob(logits, 1, lse));
  EXPECT_TRUE(TopLogprobs(logits, 0, lse).empty());
  EXPECT_EQ(TopLogprobs(logits, 99, lse).size(), 5u);
}

}  // namespace
}  // namespace meshnet::shard
