// Per-token stripping of special tokens (llama.cpp's LSTRIP / RSTRIP attributes): the
// whitespace next to a stripping token goes with it, for the tokens llama.cpp's rules name
// (Phi-3 vocabularies) or a vocabulary's explicit Vocabulary::strip.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "model/tokenizer.h"
#include "util/error.h"

namespace meshnet::model {
namespace {

// <unk> <s> </s> <|endoftext|> <|end|> (control) <|tool|> (user-defined), the 256 byte
// tokens, and pieces for "▁", a..z.
Vocabulary TinyVocabulary() {
  Vocabulary v;
  v.tokens = {"<unk>", "<s>", "</s>", "<|endoftext|>", "<|end|>", "<|tool|>"};
  v.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl,
             TokenType::kControl, TokenType::kControl, TokenType::kUserDefined};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    v.tokens.push_back(name);
    v.types.push_back(TokenType::kByte);
  }
  v.tokens.push_back("\xE2\x96\x81");
  v.types.push_back(TokenType::kNormal);
  for (char c = 'a'; c <= 'z'; ++c) {
    v.tokens.push_back(std::string(1, c));
    v.types.push_back(TokenType::kNormal);
  }
  v.scores.assign(v.tokens.size(), 0.0f);
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  return v;
}

std::vector<TokenId> Special(const Tokenizer& t, const std::string& text) {
  return t.Tokenize(text, /*add_special=*/false, /*parse_special=*/true);
}

TEST(TokenizerStrip, ExplicitAttributesTakeTheWhitespaceBesideTheToken) {
  Vocabulary v = TinyVocabulary();
  v.strip.assign(v.tokens.size(), 0);
  v.strip[4] = kStripLeft | kStripRight;  // <|end|>
  v.strip[5] = kStripRight;               // <|tool|>
  const Tokenizer t(std::move(v));
  Vocabulary unstripped = TinyVocabulary();
  unstripped.strip.assign(unstripped.tokens.size(), 0);
  const Tokenizer plain(std::move(unstripped));
  // ASCII whitespace on both sides of <|end|> goes: the text around is encoded as if it had
  // never been there (which, without the attribute, it is not).
  const std::string spaced = "a \n\t<|end|>\r\n  b";
  EXPECT_EQ(Special(t, spaced), Special(plain, "a<|end|>b"));
  EXPECT_NE(Special(plain, spaced), Special(plain, "a<|end|>b"));
  // <|tool|> strips only after itself; user-defined tokens match without parse_special too.
  EXPECT_EQ(t.Tokenize("a <|tool|>  b", false, false), plain.Tokenize("a <|tool|>b", false, false));
  EXPECT_NE(plain.Tokenize("a <|tool|>  b", false, false),
            plain.Tokenize("a <|tool|>b", false, false));
  // A token that strips everything after it leaves no empty text piece.
  EXPECT_EQ(Special(t, "<|end|>   "), (std::vector<TokenId>{4}));
  EXPECT_EQ(Special(t, "<|end|> <|end|>"), (std::vector<TokenId>{4, 4}));
  // Only ASCII whitespace: a no-break space stays text.
  EXPECT_EQ(Special(t, "a\xC2\xA0<|end|>"), Special(plain, "a\xC2\xA0<|end|>"));
  // Not parsed, a control token is plain text and strips nothing.
  EXPECT_EQ(t.Tokenize(spaced, false, false), plain.Tokenize(spaced, false, false));
}

TEST(TokenizerStrip, Phi3NamedVocabulariesStripAfterSpecialTokensAsLlamaCppDoes) {
  Vocabulary v = TinyVocabulary();
  v.model_name = "Phi3";  // llama.cpp lowercases general.name and looks for phi3 / phi-3
  const Tokenizer phi(std::move(v));
  Vocabulary unstripped = TinyVocabulary();
  unstripped.model_name = "llama-spm";
  const Tokenizer plain(std::move(unstripped));
  // Whitespace after these goes (it stays without the rule).
  for (const char* strips : {"<|end|>", "<|tool|>", "</s>"}) {
    const std::string tok = strips;
    EXPECT_EQ(Special(phi, tok + "\n  b"), Special(plain, tok + "b")) << strips;
    EXPECT_NE(Special(plain, tok + "\n  b"), Special(plain, tok + "b")) << strips;
  }
  // None before a token, and none after <s>, <unk> and <|endoftext|>.
  EXPECT_EQ(Special(phi, "a <|end|>"), Special(plain, "a <|end|>"));
  for (const char* keeps : {"<s>", "<unk>", "<|endoftext|>"}) {
    const std::string text = std::string(keeps) + " b";
    EXPECT_EQ(Special(phi, text), Special(plain, text)) << keeps;
  }
}

TEST(TokenizerStrip, ShippedPhi3VocabularyMatchesLlamaTokenize) {
  // llama.cpp c392e50: llama-tokenize -m ggml-vocab-phi-3.gguf --no-escape --ids -f <text>.
  const auto file =
      gguf::GgufFile::Open(std::string(MESHNET_TOKENIZER_DATA) + "/ggml-vocab-phi-3.gguf");
  const Tokenizer tok = Tokenizer::FromGguf(file);
  EXPECT_EQ(tok.Tokenize("Hello world <|user|>\n hi<|end|> \n x", true, true),
            (std::vector<TokenId>{1, 15043, 3186, 29871, 32010, 7251, 32007, 921}));
}

TEST(TokenizerStrip, RejectsAttributesForAnotherVocabularySize) {
  Vocabulary v = TinyVocabulary();
  v.strip = {kStripRight};
  try {
    Tokenizer t(std::move(v));
    ADD_FAILURE() << "accepted strip attributes for one token of " << 289;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kMalformedFile) << e.what();
  }
}

}  // namespace
}  // namespace meshnet::model
