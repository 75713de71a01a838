// Byte-level BPE and special-token behaviour beyond llama.cpp's case files:
// merge order, special-token rules, EOG ids, invalid UTF-8, streaming decode,
// bounded memory on a 10 MB prompt, and validation of malformed GGUF fields.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <string>
#include <vector>

#include "arch/architecture.h"
#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "model/pretokenizer.h"
#include "model/tokenizer.h"
#include "util/error.h"

namespace meshnet::model {
namespace {

const std::string kGpt2 = std::string(MESHNET_TOKENIZER_DATA) + "/ggml-vocab-gpt-2.gguf";

const Tokenizer& Gpt2() {
  static const Tokenizer* tok = [] {
    const auto file = gguf::GgufFile::Open(kGpt2);
    return new Tokenizer(Tokenizer::FromGguf(file));
  }();
  return *tok;
}

// A tiny byte-level vocabulary ("Ġ" is GPT-2's space): merges h+e, l+l,
// he+ll, hell+o, plus a control and a user-defined token.
Tokenizer Tiny(bool with_o_merge = true) {
  Vocabulary v;
  v.kind = TokenizerKind::kBpe;
  v.pre = "gpt-2";
  v.tokens = {"h",      "e", "l", "o", "\xC4\xA0", "he", "ll", "hell", "hello", "<|im_start|>",
              "<tool>", "<", ">", "|"};
  v.types.assign(v.tokens.size(), TokenType::kNormal);
  v.types[9] = TokenType::kControl;
  v.types[10] = TokenType::kUserDefined;
  v.merges = {"h e", "l l", "he ll"};
  if (with_o_merge) v.merges.push_back("hell o");
  v.add_bos = false;
  return Tokenizer(std::move(v));
}

TEST(BpeTiny, MergesByRank) {
  EXPECT_EQ(Tiny().Tokenize("hello", false, false), (std::vector<TokenId>{8}));
  // Without "hell o" the word stops at hell + o.
  EXPECT_EQ(Tiny(false).Tokenize("hello", false, false), (std::vector<TokenId>{7, 3}));
  // " hello": the space is its own symbol "Ġ" (no merge with it).
  EXPECT_EQ(Tiny().Tokenize(" hello", false, false), (std::vector<TokenId>{4, 8}));
}

TEST(BpeTiny, UserDefinedAlwaysControlOnlyWithParseSpecial) {
  const Tokenizer tok = Tiny();
  EXPECT_EQ(tok.Tokenize("<tool>hello", false, false), (std::vector<TokenId>{10, 8}));
  const std::vector<TokenId> plain = tok.Tokenize("<|im_start|>hello", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 9), 0) << "control token from plain text";
  EXPECT_EQ(tok.Tokenize("<|im_start|>hello", false, true), (std::vector<TokenId>{9, 8}));
  // Decoding: control tokens are hidden unless rendered, user-defined shown.
  EXPECT_EQ(tok.Decode(std::vector<TokenId>{9, 10, 4, 8}), "<tool> hello");
  EXPECT_EQ(tok.Decode(std::vector<TokenId>{9, 8}, /*render_special=*/true), "<|im_start|>hello");
}

// Literal ranges: a control token overlapping one is text (as without
// parse_special), the others stay control; user-defined tokens match anyway.
TEST(BpeTiny, LiteralRangesKeepControlTextAsText) {
  const Tokenizer tok = Tiny();
  const std::string text = "<|im_start|>hello<|im_start|><tool>";
  //                        0           12   17          29
  const std::vector<TokenId> all = tok.Tokenize(text, false, true);
  EXPECT_EQ(all, (std::vector<TokenId>{9, 8, 9, 10}));
  const std::vector<TextRange> second = {{17, 35}};
  const std::vector<TokenId> guarded = tok.Tokenize(text, false, true, second);
  ASSERT_GE(guarded.size(), 3u);
  EXPECT_EQ(guarded[0], 9) << "the template's own control token";
  EXPECT_EQ(guarded[1], 8);
  EXPECT_EQ(std::count(guarded.begin(), guarded.end(), 9), 1);
  EXPECT_EQ(guarded.back(), 10) << "user-defined tokens match inside literal text";
  const std::vector<TokenId> tail = tok.Tokenize(text.substr(17), false, false);
  EXPECT_EQ(std::vector<TokenId>(guarded.begin() + 2, guarded.end()), tail);
  // A range covering only part of the token's text still keeps it text.
  const std::vector<TextRange> partial = {{20, 21}};
  const std::vector<TokenId> cut = tok.Tokenize(text, false, true, partial);
  EXPECT_EQ(std::count(cut.begin(), cut.end(), 9), 1);
  // Everything literal is parse_special = false.
  const std::vector<TextRange> everything = {{0, text.size()}};
  EXPECT_EQ(tok.Tokenize(text, false, true, everything), tok.Tokenize(text, false, false));
}

TEST(BpeTiny, UnsupportedPreNamesTheSupportedList) {
  Vocabulary v;
  v.kind = TokenizerKind::kBpe;
  v.pre = "klingon";
  v.tokens = {"a"};
  try {
    Tokenizer tok(std::move(v));
    FAIL() << "accepted pre 'klingon'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kMalformedFile);
    const std::string what = e.what();
    EXPECT_NE(what.find("'klingon'"), std::string::npos) << what;
    for (const char* name : {"llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "falcon",
                             "starcoder", "refact", "mpt", "gpt-neox", "smollm", "command-r",
                             "olmo", "dbrx", "stablelm2", "gpt-2", "default"}) {
      EXPECT_NE(what.find(name), std::string::npos) << name << " missing from: " << what;
    }
  }
}

TEST(BpeGpt2, AddSpecialHonoursAddBosAndEog) {
  const Tokenizer& tok = Gpt2();
  EXPECT_EQ(tok.kind(), TokenizerKind::kBpe);
  // GPT-2 has add_bos false unless the GGUF says otherwise.
  EXPECT_EQ(tok.Tokenize("Hello", true, false), tok.Tokenize("Hello", false, false));
  const TokenId eot = tok.Find("<|endoftext|>");
  ASSERT_NE(eot, kNoToken);
  EXPECT_TRUE(tok.IsEog(eot));
  EXPECT_FALSE(tok.IsEog(tok.Find("Hello")));
}

TEST(BpeGpt2, InvalidUtf8BecomesReplacementCharacters) {
  const Tokenizer& tok = Gpt2();
  // llama.cpp: one U+FFFD per byte that does not start a complete sequence.
  EXPECT_EQ(tok.Tokenize("a\xFF"
                         "b",
                         false, false),
            tok.Tokenize("a\xEF\xBF\xBD"
                         "b",
                         false, false));
  EXPECT_EQ(tok.Tokenize("x\xE2\x82", false, false),
            tok.Tokenize("x\xEF\xBF\xBD\xEF\xBF\xBD", false, false));
  EXPECT_EQ(tok.Decode(tok.Tokenize("\x80", false, false)), "\xEF\xBF\xBD");
  std::string storage;
  EXPECT_EQ(SanitizeUtf8("ok \xC3\xA9", storage), "ok \xC3\xA9");
  EXPECT_TRUE(storage.empty()) << "valid text is not copied";
}

TEST(BpeGpt2, RoundTripsAndStreamsSplitCharacters) {
  const Tokenizer& tok = Gpt2();
  const std::string text = "Grüße, 世界! 🦙 tabs\tand\nnewlines  ";
  const std::vector<TokenId> ids = tok.Tokenize(text, false, false);
  EXPECT_EQ(tok.Decode(ids), text);
  // Piece by piece through the assembler: whole characters only, same text.
  Utf8Assembler asm_;
  std::string streamed;
  TokenId prev = kNoToken;
  for (TokenId id : ids) {
    const std::string out = asm_.Push(tok.DecodePiece(prev, id));
    streamed += out;
    prev = id;
  }
  streamed += asm_.Flush();
  EXPECT_EQ(streamed, text);
}

long MaxRssKiB() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

TEST(BpeGpt2, TenMegabytePromptInBoundedMemory) {
  const Tokenizer& tok = Gpt2();
  const std::string unit =
      "The quick brown fox jumps over the lazy dog; numbers 12345 and symbols <|> too.\n"
      "Grüße aus Köln — 東京の夜 and 🦙 emoji. ";
  std::string text;
  while (text.size() < 10u << 20) text += unit;
  const long before = MaxRssKiB();
  const std::vector<TokenId> ids = tok.Tokenize(text, false, false);
  const long grown_mib = (MaxRssKiB() - before) / 1024;
  EXPECT_GT(ids.size(), text.size() / 8);
  // The ids themselves take ~4 bytes per token (~3-4 bytes of text each);
  // everything else is per-word scratch.
  EXPECT_LT(grown_mib, 64) << "tokenizing 10 MB grew the peak RSS by " << grown_mib << " MiB";
  EXPECT_EQ(tok.Decode(ids), text);
}

// A copy of the GPT-2 vocab GGUF with `key` replaced (or dropped when
// value is null), read back from memory.
gguf::GgufFile Patched(const std::string& key, const gguf::WriterValue* value) {
  static const gguf::GgufFile src = gguf::GgufFile::Open(kGpt2);
  gguf::GgufWriter w;
  for (const auto& e : src.metadata()) {
    if (e.key == key) continue;
    w.Set(e.key, gguf::WriterValue::From(e.value));
  }
  if (value != nullptr) w.Set(key, *value);
  static std::vector<std::vector<uint8_t>> keep;  // the file views these bytes
  keep.push_back(w.WriteToBytes());
  return gguf::GgufFile::FromBytes(keep.back(), "patched.gguf");
}

void ExpectRejected(const std::string& key, const gguf::WriterValue* value,
                    const std::string& mention) {
  try {
    Tokenizer::FromGguf(Patched(key, value));
    FAIL() << key << " accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kMalformedFile) << e.what();
    EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
  }
}

TEST(BpeGguf, MalformedFieldsAreRejectedAtLoad) {
  const std::vector<std::string> bad_merges = {"Ġ t", "nospace"};
  const auto merges = gguf::WriterValue::StringArray(bad_merges);
  ExpectRejected(gguf_keys::kMerges, &merges, "merge 1 'nospace'");
  ExpectRejected(gguf_keys::kMerges, nullptr, gguf_keys::kMerges);
  const auto pre = gguf::WriterValue::String("no-such-pre");
  ExpectRejected(gguf_keys::kPre, &pre, "'no-such-pre' is not supported");
  const auto bos = gguf::WriterValue::U32(1u << 20);
  ExpectRejected(gguf_keys::kBosId, &bos, "outside the vocabulary");
  const auto eot = gguf::WriterValue::U32(50257);
  ExpectRejected(gguf_keys::kEotId, &eot, "outside the vocabulary");
  std::vector<int32_t> types(50257, 1);
  types[7] = 42;
  const auto type_value = gguf::WriterValue::I32Array(types);
  ExpectRejected(gguf_keys::kTokenType, &type_value, "unknown type 42");
  types.pop_back();
  const auto short_types = gguf::WriterValue::I32Array(types);
  ExpectRejected(gguf_keys::kTokenType, &short_types, "token types");
  const auto model = gguf::WriterValue::String("bert");
  ExpectRejected(gguf_keys::kTokenizerModel, &model, "'bert' is not supported");
}

}  // namespace
}  // namespace meshnet::model
