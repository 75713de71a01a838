// KvCacheRecipe, CacheMiss and HotKvStateConfig value semantics.
#include "kv/recipe.h"

#include <gtest/gtest.h>

#include "kv/cache_miss.h"
#include "kv/hot_kv_state.h"
#include "kv/kv_test_util.h"
#include "util/error.h"
#include "util/hash.h"

namespace meshnet::kv {
namespace {

using testing::MiniRecipe;

ErrorKind KindOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no error thrown";
  return ErrorKind::kUnavailable;
}

TEST(RecipeTest, ValidRecipePasses) { EXPECT_NO_THROW(MiniRecipe().Validate()); }

TEST(RecipeTest, UncertifiedArchitectureIsInvalidArgument) {
  KvCacheRecipe r = MiniRecipe();
  r.architecture_adapter = "gpt2";
  EXPECT_EQ(KindOf([&] { r.Validate(); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(KindOf([&] { (void)r.Fingerprint(); }), ErrorKind::kInvalidArgument);
  r.architecture_adapter = "";
  EXPECT_EQ(KindOf([&] { r.Validate(); }), ErrorKind::kInvalidArgument);
}

TEST(RecipeTest, RejectsBadGeometryAndRange) {
  auto bad = [](auto mutate) {
    KvCacheRecipe r = MiniRecipe();
    mutate(r);
    return KindOf([&] { r.Validate(); });
  };
  EXPECT_EQ(bad([](KvCacheRecipe& r) { r.n_kv_heads = 0; }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(bad([](KvCacheRecipe& r) { r.head_dim = -1; }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(bad([](KvCacheRecipe& r) { r.start_layer = -1; }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(bad([](KvCacheRecipe& r) { r.start_layer = 3, r.end_layer = 2; }),
            ErrorKind::kInvalidArgument);
  EXPECT_EQ(bad([](KvCacheRecipe& r) { r.end_layer = 4; }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(bad([](KvCacheRecipe& r) { r.total_layers = 0, r.start_layer = 0, r.end_layer = 0; }),
            ErrorKind::kInvalidArgument);
  EXPECT_EQ(bad([](KvCacheRecipe& r) { r.boundary_schema_version = 0; }),
            ErrorKind::kInvalidArgument);
  // Edges that are valid: a single-layer shard at either end.
  KvCacheRecipe r = MiniRecipe();
  r.start_layer = r.end_layer = 0;
  EXPECT_NO_THROW(r.Validate());
  r.start_layer = r.end_layer = 3;
  EXPECT_NO_THROW(r.Validate());
}

TEST(RecipeTest, BytesPerToken) {
  // 2 * heads * dim * itemsize * owned layers.
  EXPECT_EQ(MiniRecipe(KvDtype::kF32).BytesPerToken(), 2 * 1 * 2 * 4 * 2);
  EXPECT_EQ(MiniRecipe(KvDtype::kF16).BytesPerToken(), 2 * 1 * 2 * 2 * 2);
  EXPECT_EQ(MiniRecipe(KvDtype::kBF16).BytesPerToken(), 2 * 1 * 2 * 2 * 2);
  KvCacheRecipe r = MiniRecipe();
  r.n_kv_heads = 8, r.head_dim = 64, r.total_layers = 32, r.start_layer = 8, r.end_layer = 15;
  EXPECT_EQ(r.BytesPerToken(), 2LL * 8 * 64 * 4 * 8);
}

TEST(RecipeTest, FingerprintMatchesReference) {
  // Value from seed/examples/mini.expected.jsonl (the reference replayer).
  EXPECT_EQ(MiniRecipe().Fingerprint(),
            "bdc1fda85dfd29db05f5c0288a8dab7ed8bb2b9ead8216dea70e131e652443a3");
  // And it is the sha256 of the canonical JSON, byte for byte.
  EXPECT_EQ(MiniRecipe().Fingerprint(),
            Sha256Hex("{\"architecture_adapter\":\"llama\",\"boundary_schema_version\":1,"
                      "\"end_layer\":3,\"head_dim\":2,\"kind\":\"hot-kv-recipe\","
                      "\"kv_dtype\":\"float32\",\"n_kv_heads\":1,\"start_layer\":2,"
                      "\"total_layers\":4}"));
  EXPECT_EQ(MiniRecipe(KvDtype::kF16).Fingerprint(),
            Sha256Hex("{\"architecture_adapter\":\"llama\",\"boundary_schema_version\":1,"
                      "\"end_layer\":3,\"head_dim\":2,\"kind\":\"hot-kv-recipe\","
                      "\"kv_dtype\":\"float16\",\"n_kv_heads\":1,\"start_layer\":2,"
                      "\"total_layers\":4}"));
}

TEST(RecipeTest, AliasSharesFingerprintAndEveryFieldMatters) {
  KvCacheRecipe alias = MiniRecipe();
  alias.architecture_adapter = "LlamaForCausalLM";
  EXPECT_EQ(alias.Fingerprint(), MiniRecipe().Fingerprint());
  EXPECT_TRUE(alias.IsCompatible(MiniRecipe()));
  const std::string base = MiniRecipe().Fingerprint();
  std::vector<KvCacheRecipe> variants(8, MiniRecipe());
  variants[0].kv_dtype = KvDtype::kF16;
  variants[1].n_kv_heads = 2;
  variants[2].head_dim = 4;
  variants[3].total_layers = 5;
  variants[4].start_layer = 1;
  variants[5].end_layer = 2;
  variants[6].boundary_schema_version = 2;
  variants[7].architecture_adapter = "mistral";
  for (const auto& v : variants) {
    EXPECT_NE(v.Fingerprint(), base);
    EXPECT_FALSE(v.IsCompatible(MiniRecipe()));
  }
}

TEST(RecipeTest, Qwen2AliasSharesFingerprintButNotLlamas) {
  KvCacheRecipe qwen = MiniRecipe(), alias = MiniRecipe();
  qwen.architecture_adapter = "qwen2";
  alias.architecture_adapter = "Qwen2ForCausalLM";
  EXPECT_EQ(alias.Fingerprint(), qwen.Fingerprint());
  EXPECT_TRUE(alias.IsCompatible(qwen));
  EXPECT_NE(qwen.Fingerprint(), MiniRecipe().Fingerprint());
  EXPECT_FALSE(qwen.IsCompatible(MiniRecipe()));
}

TEST(CacheMissTest, ReasonNames) {
  EXPECT_EQ(CacheMissReasonName(CacheMissReason::kUnknownSession), "unknown-session");
  EXPECT_EQ(CacheMissReasonName(CacheMissReason::kEvictedTtl), "evicted-ttl");
  EXPECT_EQ(CacheMissReasonName(CacheMissReason::kEvictedLru), "evicted-lru");
  EXPECT_EQ(CacheMissReasonName(CacheMissReason::kReleased), "released");
  EXPECT_EQ(CacheMissReasonName(CacheMissReason::kSupersededEpoch), "superseded-epoch");
  EXPECT_EQ(CacheMissReasonName(CacheMissReason::kSeqLenMismatch), "seq-len-mismatch");
}

TEST(CacheMissTest, ToStringTruncatesIdByCharacters) {
  CacheMiss m{"abcdefghijk", 3, CacheMissReason::kReleased, ""};
  EXPECT_EQ(m.ToString(), "cache miss for session abcdefgh epoch 3 (released)");
  m.detail = "why";
  EXPECT_EQ(m.ToString(), "cache miss for session abcdefgh epoch 3 (released): why");
  // Eight code points, not eight bytes.
  EXPECT_EQ(ShortSessionId("s\xc3\xa9"
                           "ance-\xc3\xbcxyz"),
            "s\xc3\xa9"
            "ance-\xc3\xbc");
  CacheMissError err(m);
  EXPECT_EQ(err.kind(), ErrorKind::kCacheMiss);
  EXPECT_EQ(err.miss().reason, CacheMissReason::kReleased);
}

TEST(ConfigTest, Validation) {
  EXPECT_NO_THROW(HotKvStateConfig{}.Validate());
  auto bad = [](auto mutate) {
    HotKvStateConfig c;
    mutate(c);
    return KindOf([&] { c.Validate(); });
  };
  EXPECT_EQ(bad([](auto& c) { c.budget_bytes = 0; }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(bad([](auto& c) { c.max_sessions = 0; }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(bad([](auto& c) { c.ttl_seconds = -0.5; }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(bad([](auto& c) { c.miss_history = -1; }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(bad([](auto& c) { c.block_tokens = 0; }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(bad([](auto& c) { c.epoch_history = -1; }), ErrorKind::kInvalidArgument);
  HotKvStateConfig ok;
  ok.ttl_seconds = 0, ok.miss_history = 0, ok.epoch_history = 0, ok.block_tokens = 1;
  EXPECT_NO_THROW(ok.Validate());
  // The manager validates both.
  FakeClock clock;
  HotKvStateConfig c;
  c.max_sessions = 0;
  EXPECT_EQ(KindOf([&] { HotKvStateManager m(MiniRecipe(), c, &clock); }),
            ErrorKind::kInvalidArgument);
  KvCacheRecipe r = MiniRecipe();
  r.architecture_adapter = "bert";
  EXPECT_EQ(KindOf([&] { HotKvStateManager m(r, HotKvStateConfig{}, &clock); }),
            ErrorKind::kInvalidArgument);
}

}  // namespace
}  // namespace meshnet::kv
