#include "model/hparams.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "arch/architecture.h"
#include "gguf/gguf_reader.h"
#include "model/synthetic_model.h"
#include "util/error.h"

namespace meshnet::model {
namespace {

const CertifiedArchitecture& Llama() { return CertifiedArchitectureFor("llama"); }

gguf::GgufFile Build(const SyntheticLlamaSpec& spec) {
  return gguf::GgufFile::FromBytes(SyntheticLlamaWriter(spec).WriteToBytes(), "synthetic.gguf");
}

// Expects FromGguf to throw `kind` with a message containing every `needle`.
void ExpectRefused(const SyntheticLlamaSpec& spec, ErrorKind kind,
                   std::initializer_list<std::string> needles) {
  const gguf::GgufFile file = Build(spec);
  try {
    const LlamaHParams hp = LlamaHParams::FromGguf(file);
    ADD_FAILURE() << "accepted: " << hp.ToString();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const std::string& needle : needles) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "'" << e.what() << "' does not mention '" << needle << "'";
    }
  }
}

TEST(HParams, ShippedModel) {
  const auto file = gguf::GgufFile::Open(MESHNET_SHIPPED_MODEL);
  const LlamaHParams hp = LlamaHParams::FromGguf(file);
  EXPECT_EQ(hp.arch, &Llama());
  EXPECT_EQ(hp.n_embd, 64);
  EXPECT_EQ(hp.n_layers, 5);
  EXPECT_EQ(hp.n_heads, 8);
  EXPECT_EQ(hp.n_kv_heads, 4);
  EXPECT_EQ(hp.n_ff, 172);
  EXPECT_EQ(hp.head_dim, 8);
  EXPECT_EQ(hp.n_rot, 8);
  EXPECT_EQ(hp.rope_freq_base, 10000.0f);  // no key in the file: the default
  EXPECT_FLOAT_EQ(hp.rms_eps, 1e-5f);
  EXPECT_EQ(hp.context_length, 512);
  EXPECT_EQ(hp.vocab_size, 512);  // from the tokens array (no vocab_size key)
  EXPECT_EQ(hp.kv_dim(), 32);
  EXPECT_EQ(hp.n_gqa(), 2);
}

TEST(HParams, DefaultsApplyWhenKeysAreAbsent) {
  SyntheticLlamaSpec spec;
  spec.n_embd = 96;
  spec.n_heads = 6;
  spec.n_kv_heads = 6;
  spec.omit_keys = {Llama().Key(ArchKey::kHeadCountKv), Llama().Key(ArchKey::kRmsEpsilon)};
  const LlamaHParams hp = LlamaHParams::FromGguf(Build(spec));
  EXPECT_EQ(hp.n_kv_heads, 6);  // = n_heads
  EXPECT_EQ(hp.head_dim, 16);
  EXPECT_EQ(hp.n_rot, 16);  // = head_dim
  EXPECT_EQ(hp.rope_freq_base, 10000.0f);
  EXPECT_EQ(hp.rms_eps, 1e-5f);
  EXPECT_EQ(hp.vocab_size, spec.vocab_size);
}

TEST(HParams, ExplicitValuesAreRead) {
  SyntheticLlamaSpec spec;
  spec.n_rot = 4;
  spec.rope_freq_base = 500000.0f;
  spec.rms_eps = 1e-6f;
  spec.context_length = 4096;
  const LlamaHParams hp = LlamaHParams::FromGguf(Build(spec));
  EXPECT_EQ(hp.n_rot, 4);
  EXPECT_EQ(hp.rope_freq_base, 500000.0f);
  EXPECT_EQ(hp.rms_eps, 1e-6f);
  EXPECT_EQ(hp.context_length, 4096);
}

TEST(HParams, VocabSizeKeyWithoutTokenizer) {
  SyntheticLlamaSpec spec;
  spec.with_tokenizer = false;
  ExpectRefused(spec, ErrorKind::kMalformedFile, {"vocab"});
  gguf::GgufWriter w = SyntheticLlamaWriter(spec);
  w.SetU32(Llama().Key(ArchKey::kVocabSize), 300);
  const auto file = gguf::GgufFile::FromBytes(w.WriteToBytes());
  EXPECT_EQ(LlamaHParams::FromGguf(file).vocab_size, 300);
}

TEST(HParams, VocabSizeKeyMustAgreeWithTokens) {
  gguf::GgufWriter w = SyntheticLlamaWriter(SyntheticLlamaSpec{});
  w.SetU32(Llama().Key(ArchKey::kVocabSize), 301);
  const auto file = gguf::GgufFile::FromBytes(w.WriteToBytes());
  EXPECT_THROW(LlamaHParams::FromGguf(file), Error);
}

TEST(HParams, UnknownArchitectureFailsClosed) {
  for (const char* arch : {"gpt2", "Llama", "falcon"}) {
    SyntheticLlamaSpec spec;
    spec.architecture = arch;
    ExpectRefused(spec, ErrorKind::kBoundaryContract,
                  {"synthetic.gguf", std::string("'") + arch + "'", "not certified"});
  }
  SyntheticLlamaSpec spec;
  spec.omit_keys = {gguf_keys::kArchitecture};
  ExpectRefused(spec, ErrorKind::kMalformedFile, {gguf_keys::kArchitecture});
}

TEST(HParams, AliasAndOtherCertifiedArchitectures) {
  // A certified alias in general.architecture resolves to its registry entry,
  // whose key prefix ("llama.") the file uses.
  gguf::GgufWriter w = SyntheticLlamaWriter(SyntheticLlamaSpec{});
  w.SetString(gguf_keys::kArchitecture, "LlamaForCausalLM");
  EXPECT_EQ(LlamaHParams::FromGguf(gguf::GgufFile::FromBytes(w.WriteToBytes())).arch, &Llama());
  // Another certified architecture reads its own prefix.
  SyntheticLlamaSpec spec;
  spec.architecture = "mistral";
  EXPECT_EQ(LlamaHParams::FromGguf(Build(spec)).arch, &CertifiedArchitectureFor("mistral"));
}

TEST(HParams, MissingRequiredKeysAreNamed) {
  for (ArchKey key : {ArchKey::kEmbeddingLength, ArchKey::kBlockCount, ArchKey::kHeadCount,
                      ArchKey::kFeedForwardLength, ArchKey::kContextLength}) {
    SyntheticLlamaSpec spec;
    spec.omit_keys = {Llama().Key(key)};
    ExpectRefused(spec, ErrorKind::kMalformedFile, {Llama().Key(key)});
  }
}

TEST(HParams, InvalidValuesAreRefused) {
  struct Case {
    std::function<void(SyntheticLlamaSpec&)> mutate;
    std::string needle;
  };
  const Case cases[] = {
      {[](auto& s) { s.n_embd = 100; }, "not a multiple"},      // 100 % 8 heads
      {[](auto& s) { s.n_kv_heads = 3; }, "n_kv_heads = 3"},    // 8 % 3
      {[](auto& s) { s.n_kv_heads = 16; }, "n_kv_heads = 16"},  // more KV than Q heads
      {[](auto& s) { s.n_rot = 3; }, "n_rot = 3"},              // odd
      {[](auto& s) { s.n_rot = 10; }, "n_rot = 10"},            // > head_dim 8
      {[](auto& s) { s.rms_eps = -1.0f; }, Llama().Key(ArchKey::kRmsEpsilon)},
      {[](auto& s) { s.rope_freq_base = -5.0f; }, Llama().Key(ArchKey::kRopeFreqBase)},
      {[](auto& s) { s.n_layers = -1; }, Llama().Key(ArchKey::kBlockCount)},  // u32 4294967295
  };
  for (const Case& c : cases) {
    SyntheticLlamaSpec spec;
    c.mutate(spec);
    SCOPED_TRACE(c.needle);
    ExpectRefused(spec, ErrorKind::kMalformedFile, {"synthetic.gguf", c.needle});
  }
}

TEST(HParams, ZeroSizesAreRefused) {
  for (ArchKey key : {ArchKey::kEmbeddingLength, ArchKey::kBlockCount, ArchKey::kHeadCount,
                      ArchKey::kHeadCountKv, ArchKey::kFeedForwardLength, ArchKey::kContextLength,
                      ArchKey::kRopeDimensionCount, ArchKey::kVocabSize}) {
    gguf::GgufWriter w = SyntheticLlamaWriter(SyntheticLlamaSpec{});
    w.SetU32(Llama().Key(key), 0);
    const auto file = gguf::GgufFile::FromBytes(w.WriteToBytes(), "synthetic.gguf");
    try {
      LlamaHParams::FromGguf(file);
      ADD_FAILURE() << Llama().Key(key);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kMalformedFile);
      EXPECT_NE(std::string(e.what()).find(Llama().Key(key) + " = 0"), std::string::npos)
          << e.what();
    }
  }
}

TEST(HParams, WrongKeyTypeIsRefused) {
  gguf::GgufWriter w = SyntheticLlamaWriter(SyntheticLlamaSpec{});
  w.SetString(Llama().Key(ArchKey::kHeadCount), "eight");
  const auto file = gguf::GgufFile::FromBytes(w.WriteToBytes());
  try {
    LlamaHParams::FromGguf(file);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kMalformedFile);
    EXPECT_NE(std::string(e.what()).find(Llama().Key(ArchKey::kHeadCount)), std::string::npos)
        << e.what();
  }
}

TEST(HParams, ValidateAndLayerRangeUseInvalidArgument) {
  LlamaHParams hp = LlamaHParams::FromGguf(Build(SyntheticLlamaSpec{}));
  EXPECT_NO_THROW(hp.Validate());
  EXPECT_NO_THROW(hp.ValidateLayerRange(0, 3));
  EXPECT_NO_THROW(hp.ValidateLayerRange(2, 2));
  for (auto [s, e] : {std::pair{-1, 2}, std::pair{2, 1}, std::pair{0, 4}, std::pair{4, 4}}) {
    try {
      hp.ValidateLayerRange(s, e);
      ADD_FAILURE() << s << "-" << e;
    } catch (const Error& err) {
      EXPECT_EQ(err.kind(), ErrorKind::kInvalidArgument);
    }
  }
  hp.head_dim = 4;
  try {
    hp.Validate();
    ADD_FAILURE();
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(err.what()).find("head_dim"), std::string::npos);
  }
}

}  // namespace
}  // namespace meshnet::model
