// q8_0 / q4_0 KV caches in the manager: the recipe and fingerprint carry the
// dtype, the byte accounting counts the quantized blocks (a budget holds
// 1.88x the f16 tokens at head_dim 64), rows are quantized on write and read
// back dequantized, and a recipe of another dtype is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kv/hot_kv_state.h"
#include "kv/kv_test_util.h"
#include "kv/recipe.h"
#include "ops/kv_quant.h"
#include "util/clock.h"

namespace meshnet::kv {
namespace {

using testing::Outcome;
using testing::SpecRows;

// The 768-dim model's KV geometry: 12 KV heads of 64, 12 layers.
KvCacheRecipe Recipe768(KvDtype dtype) {
  KvCacheRecipe r;
  r.architecture_adapter = "llama";
  r.kv_dtype = dtype;
  r.n_kv_heads = 12;
  r.head_dim = 64;
  r.total_layers = 12;
  r.start_layer = 0;
  r.end_layer = 11;
  return r;
}

TEST(QuantKvRecipe, DtypeIsInTheFingerprintAndTheByteCount) {
  const KvCacheRecipe f16 = Recipe768(KvDtype::kF16), q8 = Recipe768(KvDtype::kQ8_0),
                      q4 = Recipe768(KvDtype::kQ4_0);
  EXPECT_NO_THROW(q8.Validate());
  EXPECT_NO_THROW(q4.Validate());
  EXPECT_NE(q8.Fingerprint(), f16.Fingerprint());
  EXPECT_NE(q8.Fingerprint(), q4.Fingerprint());
  EXPECT_FALSE(q8.IsCompatible(f16));
  EXPECT_FALSE(q8.IsCompatible(q4));
  EXPECT_EQ(f16.BytesPerToken(), 2 * 12 * 12 * 64 * 2);
  EXPECT_EQ(q8.BytesPerToken(), 2 * 12 * 12 * (64 + 2 * 2));  // 34-byte blocks
  EXPECT_EQ(q4.BytesPerToken(), 2 * 12 * 12 * (32 + 2 * 2));  // 18-byte blocks
  // head_dim 8 (the shipped model): one short block of 8 codes and a scale.
  KvCacheRecipe small = q8;
  small.head_dim = 8;
  EXPECT_EQ(small.BytesPerToken(), 2 * 12 * 12 * 10);
}

// The most tokens one session holds and the manager's bytes then.
struct Fill {
  int64_t tokens = 0;
  int64_t total_bytes = 0;
};

// The budget holds 1.88x the f16 tokens in q8_0 (68 bytes a head against 128)
// and 3.56x in q4_0 (36), as the manager counts its reserved blocks.
TEST(QuantKvBudget, HoldsTheTokensItsBytesAllow) {
  const int64_t budget = int64_t{64} << 20;
  // One session grows by steps of 16 until BeginStep refuses one
  // (kBudgetExceeded); every step's rows are whole blocks.
  auto fill = [&](KvDtype dt) {
    FakeClock clock;
    HotKvStateConfig config;
    config.budget_bytes = budget;
    config.block_tokens = 16;
    HotKvStateManager m(Recipe768(dt), config, &clock);
    m.Open("s", 0);
    Fill f;
    for (int i = 0; i < 100000; ++i) {
      const std::string outcome = Outcome([&] {
        StepResult r = m.BeginStep("s", 0, 16, nullptr, f.tokens);
        ASSERT_TRUE(std::holds_alternative<KvStep>(r));
        ASSERT_FALSE(std::get<KvStep>(r).Commit().has_value());
      });
      if (outcome != "ok") {
        EXPECT_EQ(outcome, "budget-exceeded");
        break;
      }
      f.tokens += 16;
    }
    f.total_bytes = m.TotalBytes();
    EXPECT_LE(f.total_bytes, budget);
    EXPECT_GT(f.total_bytes + m.block_bytes(), budget);  // one block more would not fit
    EXPECT_EQ(f.total_bytes, f.tokens * Recipe768(dt).BytesPerToken());
    return f;
  };
  const Fill f16 = fill(KvDtype::kF16), q8 = fill(KvDtype::kQ8_0), q4 = fill(KvDtype::kQ4_0);
  ASSERT_GT(f16.tokens, 0);
  EXPECT_GE(static_cast<double>(q8.tokens) / static_cast<double>(f16.tokens), 1.85);
  EXPECT_GE(static_cast<double>(q4.tokens) / static_cast<double>(f16.tokens), 3.5);
  EXPECT_EQ(q8.tokens / 16, budget / (16 * Recipe768(KvDtype::kQ8_0).BytesPerToken()));
}

// Append quantizes each head as ops/kv_quant.h does; ReadKeys/ReadValues give
// the dequantized values, within a step of what was appended.
TEST(QuantKvRows, AppendQuantizesAndReadsBackDequantized) {
  for (KvDtype dt : {KvDtype::kQ8_0, KvDtype::kQ4_0}) {
    FakeClock clock;
    KvCacheRecipe r = testing::MiniRecipe(dt);
    r.n_kv_heads = 2;
    r.head_dim = 40;  // one full block and a short one per head
    HotKvStateConfig config;
    config.budget_bytes = 1 << 20;
    config.block_tokens = 3;
    HotKvStateManager m(r, config, &clock);
    m.Open("a", 0);
    const auto rows = SpecRows(r, "a", 0, 0, 5);
    EXPECT_EQ(m.Append("a", 0, rows.layers), 5);
    const SessionHandle h = m.Get("a", 0);
    for (int i = 0; i < r.num_owned_layers(); ++i) {
      const std::vector<float> k = h.ReadKeys(r.start_layer + i);
      ASSERT_EQ(k.size(), rows.k[i].size());
      std::vector<uint8_t> q(static_cast<size_t>(KvRowBytes(dt, 2, 40)));
      std::vector<float> want(80);
      for (int64_t p = 0; p < 5; ++p) {
        ops::QuantizeKvRow(dt, rows.k[i].data() + p * 80, 2, 40, q.data());
        ops::DequantizeKvRow(dt, q.data(), 2, 40, want.data());
        for (int j = 0; j < 80; ++j) ASSERT_EQ(k[p * 80 + j], want[j]);
        // The row as stored is those bytes.
        const ops::PagedKvLayer v = h.Layer(r.start_layer + i);
        ASSERT_EQ(std::memcmp(v.KRow(p), q.data(), q.size()), 0);
      }
    }
  }
}

// A q8_0 manager refuses an f16 (or q4_0) recipe on every path: open, append,
// step and lookup, and the session is left as it was.
TEST(QuantKvRows, ARecipeOfAnotherDtypeIsIncompatible) {
  FakeClock clock;
  HotKvStateConfig config;
  config.budget_bytes = 1 << 20;
  HotKvStateManager m(testing::MiniRecipe(KvDtype::kQ8_0), config, &clock);
  m.Open("a", 0);
  const auto rows = SpecRows(m.recipe(), "a", 0, 0, 2);
  m.Append("a", 0, rows.layers);
  for (KvDtype other : {KvDtype::kF16, KvDtype::kQ4_0, KvDtype::kF32}) {
    const KvCacheRecipe r = testing::MiniRecipe(other);
    EXPECT_EQ(Outcome([&] { m.Open("b", 0, &r); }), "incompatible-recipe");
    EXPECT_EQ(Outcome([&] { m.Append("a", 0, rows.layers, &r); }), "incompatible-recipe");
    EXPECT_EQ(Outcome([&] { (void)m.BeginStep("a", 0, 1, &r); }), "incompatible-recipe");
    EXPECT_EQ(Outcome([&] { (void)m.Get("a", 0, &r); }), "incompatible-recipe");
  }
  EXPECT_EQ(m.Get("a", 0).seq_len(), 2);
  EXPECT_EQ(m.SessionCount(), 1);
}

}  // namespace
}  // namespace meshnet::kv
