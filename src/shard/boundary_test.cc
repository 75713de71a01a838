#include "shard/boundary.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <tuple>

#include "util/error.h"

namespace meshnet::shard {
namespace {

ErrorKind KindOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no error thrown";
  return ErrorKind::kUnavailable;
}

TEST(Role, FromRange) {
  ShardRole head = RoleForRange(0, 1, 5);
  EXPECT_TRUE(head.is_head());
  EXPECT_FALSE(head.is_tail());
  ShardRole mid = RoleForRange(2, 3, 5);
  EXPECT_FALSE(mid.is_head() || mid.is_tail());
  ShardRole both = RoleForRange(0, 4, 5);
  EXPECT_TRUE(both.is_head() && both.is_tail());
  for (const auto& range : {std::tuple{-1, 1, 5}, {2, 1, 5}, {0, 5, 5}, {0, 0, 0}}) {
    EXPECT_EQ(KindOf([&] { std::apply(RoleForRange, range); }), ErrorKind::kInvalidArgument);
  }
}

BoundaryBundle GoodBundle() {
  BoundaryBundle b;
  b.architecture_adapter = "LlamaForCausalLM";
  b.tensor_name = "residual";
  b.n_tokens = 2;
  b.n_embd = 3;
  b.residual = {1, 2, 3, 4, 5, 6};
  b.positions = {7, 8};
  b.next_layer = 2;
  return b;
}

TEST(Boundary, AcceptsAliasAndChecksEachField) {
  const auto& llama = CertifiedArchitectureFor("llama");
  EXPECT_NO_THROW(CheckBoundary(GoodBundle(), llama, 2, 3, 7));
  std::map<std::string, std::function<void(BoundaryBundle&)>> breakers = {
      {"arch", [](BoundaryBundle& b) { b.architecture_adapter = "mistral"; }},
      {"unknown arch", [](BoundaryBundle& b) { b.architecture_adapter = "gpt2"; }},
      {"schema", [](BoundaryBundle& b) { b.schema_version = 2; }},
      {"tensor", [](BoundaryBundle& b) { b.tensor_name = "hidden"; }},
      {"normalized", [](BoundaryBundle& b) { b.normalized = true; }},
      {"next layer", [](BoundaryBundle& b) { b.next_layer = 3; }},
      {"width", [](BoundaryBundle& b) { b.n_embd = 4; }},
      {"residual size", [](BoundaryBundle& b) { b.residual.pop_back(); }},
      {"positions size", [](BoundaryBundle& b) { b.positions.pop_back(); }},
      {"positions start",
       [](BoundaryBundle& b) {
         b.positions = {8, 9};
       }},
      {"positions gap",
       [](BoundaryBundle& b) {
         b.positions = {7, 9};
       }},
      {"nan", [](BoundaryBundle& b) { b.residual[1] = std::nanf(""); }},
      {"empty",
       [](BoundaryBundle& b) {
         b.n_tokens = 0;
         b.residual.clear();
         b.positions.clear();
       }},
  };
  for (auto& [what, breaker] : breakers) {
    BoundaryBundle b = GoodBundle();
    breaker(b);
    EXPECT_EQ(KindOf([&] { CheckBoundary(b, llama, 2, 3, 7); }), ErrorKind::kBoundaryContract)
        << what;
  }
}

TEST(Sampling, GreedyIsArgmaxLowestIdOnTies) {
  std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(SamplingContract::Greedy().Sample(logits, 0), 1);
}

// Inf or NaN logits are an error naming the position, greedy or not (they
// used to give token 0 silently).
TEST(Sampling, NonFiniteLogitsAreAnError) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const std::vector<float>& logits : std::vector<std::vector<float>>{
           {nan, nan, nan}, {-inf, -inf, -inf}, {0.5f, inf, 1.0f}, {1.0f, 2.0f, nan}}) {
    for (const SamplingContract& s :
         {SamplingContract::Greedy(), SamplingContract{1.0f, 0, 1.0f, 3}}) {
      try {
        const int token = s.Sample(logits, 17);
        ADD_FAILURE() << "sampled token " << token;
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kBoundaryContract);
        EXPECT_NE(std::string(e.what()).find("non-finite logit"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("position 17"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(Sampling, SameSeedSameTokensDifferentSeedDiffers) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = 0.05f * static_cast<float>(i % 7);
  SamplingContract s{1.0f, 0, 1.0f, 42};
  SamplingContract t = s;
  t.seed = 43;
  int same = 0;
  for (int pos = 0; pos < 64; ++pos) {
    EXPECT_EQ(s.Sample(logits, pos), s.Sample(logits, pos));
    same += s.Sample(logits, pos) == t.Sample(logits, pos);
  }
  EXPECT_LT(same, 32);  // 50 near-uniform choices: two seeds rarely agree
}

TEST(Sampling, TopKAndTopPRestrictTheSupport) {
  std::vector<float> logits = {5.0f, 4.0f, 3.0f, 0.0f, -1.0f};
  SamplingContract k2{1.0f, 2, 1.0f, 7};
  SamplingContract p{1.0f, 0, 0.5f, 7};  // token 0 alone holds > 0.5 of the mass
  for (int pos = 0; pos < 200; ++pos) {
    EXPECT_LT(k2.Sample(logits, pos), 2);
    EXPECT_EQ(p.Sample(logits, pos), 0);
  }
}

TEST(Sampling, FrequenciesFollowTheDistribution) {
  std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = 1/4, 3/4
  SamplingContract s{1.0f, 0, 1.0f, 1};
  int ones = 0;
  const int n = 4000;
  for (int pos = 0; pos < n; ++pos) ones += s.Sample(logits, pos);
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.03);
}

TEST(Sampling, ValidateRejectsBadValues) {
  EXPECT_EQ(KindOf([] {
              SamplingContract{-1.0f, 0, 1.0f, 0}.Validate();
            }),
            ErrorKind::kInvalidArgument);
  EXPECT_EQ(KindOf([] {
              SamplingContract{1.0f, -2, 1.0f, 0}.Validate();
            }),
            ErrorKind::kInvalidArgument);
  EXPECT_EQ(KindOf([] {
              SamplingContract{1.0f, 0, 0.0f, 0}.Validate();
            }),
            ErrorKind::kInvalidArgument);
  EXPECT_EQ(KindOf([] {
              SamplingContract{1.0f, 0, 1.5f, 0}.Validate();
            }),
            ErrorKind::kInvalidArgument);
}

}  // namespace
}  // namespace meshnet::shard
