#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gguf/gguf_reader.h"
#include "util/error.h"

namespace meshnet::model {
namespace {

constexpr const char* kSpace = "\xE2\x96\x81";  // "▁"

// An independent, quadratic SentencePiece BPE: rescan every adjacent pair each
// round, merge the best (highest score, first found wins ties). The oracle
// for the heap-based Encode.
std::vector<TokenId> NaiveEncode(const Tokenizer& tok, const std::string& text) {
  std::string s = kSpace;
  for (char c : text) s += c == ' ' ? std::string(kSpace) : std::string(1, c);
  std::vector<std::string> sym;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    sym.push_back(s.substr(i, len));
    i += len;
  }
  auto mergeable = [&](TokenId id) {
    return id != kNoToken &&
           (tok.Type(id) == TokenType::kNormal || tok.Type(id) == TokenType::kUserDefined);
  };
  for (;;) {
    int best = -1;
    float best_score = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      const TokenId id = tok.Find(sym[i] + sym[i + 1]);
      if (mergeable(id) && (best < 0 || tok.Score(id) > best_score)) {
        best = static_cast<int>(i);
        best_score = tok.Score(id);
      }
    }
    if (best < 0) break;
    sym[best] += sym[best + 1];
    sym.erase(sym.begin() + best + 1);
  }
  std::vector<TokenId> out;
  for (const std::string& x : sym) {
    const TokenId id = tok.Find(x);
    if (mergeable(id)) {
      out.push_back(id);
    } else {
      for (unsigned char c : x) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", c);
        out.push_back(tok.Find(name));
      }
    }
  }
  return out;
}

// A tiny vocabulary: <unk> <s> </s>, byte tokens (all 256, or only 'a' 'b'
// 'c'), then the pieces "▁" "a" "b" "ab" "ba" "<s".
Tokenizer TinyTokenizer(float ab_score, float ba_score, bool all_bytes = true) {
  Vocabulary v;
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl};
  for (int b = 0; b < 256; ++b) {
    if (!all_bytes && (b < 'a' || b > 'c')) continue;
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    v.tokens.push_back(name);
    v.types.push_back(TokenType::kByte);
  }
  v.scores.assign(v.tokens.size(), 0.0f);
  const std::pair<std::string, float> pieces[] = {{kSpace, -1},     {"a", -2},        {"b", -2},
                                                  {"ab", ab_score}, {"ba", ba_score}, {"<s", 10}};
  for (const auto& [text, score] : pieces) {
    v.tokens.push_back(text);
    v.types.push_back(TokenType::kNormal);
    v.scores.push_back(score);
  }
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  return Tokenizer(std::move(v));
}

TEST(TokenizerTiny, HighestScoreWinsAndTiesGoLeft) {
  // "▁aba": candidates "ab" (left) and "ba" (right).
  for (auto [ab, ba, left_wins] : {std::tuple{-5.0f, -5.0f, true}, std::tuple{-5.0f, -4.0f, false},
                                   std::tuple{-4.0f, -5.0f, true}}) {
    const Tokenizer tok = TinyTokenizer(ab, ba);
    const TokenId sp = tok.Find(kSpace), a = tok.Find("a"), ab_id = tok.Find("ab"),
                  ba_id = tok.Find("ba");
    EXPECT_EQ(tok.Encode("aba", false), left_wins ? (std::vector<TokenId>{sp, ab_id, a})
                                                  : (std::vector<TokenId>{sp, a, ba_id}))
        << ab << " " << ba;
  }
}

TEST(TokenizerTiny, ByteFallbackAndUnknown) {
  const Tokenizer tok = TinyTokenizer(-5, -5, /*all_bytes=*/false);
  const TokenId sp = tok.Find(kSpace), byte_c = tok.Find("<0x63>");
  ASSERT_NE(byte_c, kNoToken);
  // 'c' has only a byte token; 'd' has neither a piece nor a byte: <unk>.
  EXPECT_EQ(tok.Encode("c", true), (std::vector<TokenId>{1, sp, byte_c}));
  EXPECT_EQ(tok.Encode("d", false), (std::vector<TokenId>{sp, 0}));
  EXPECT_EQ(tok.Decode(std::vector<TokenId>{1, sp, byte_c}), "c");
}

TEST(TokenizerTiny, ControlAndBytePiecesNeverComeFromMerges) {
  // "<s" is a normal piece but "<s>" (control) and "<0x61>" (byte) are not
  // merge targets, so the text comes back unchanged.
  const Tokenizer tok = TinyTokenizer(-5, -5);
  const auto ids = tok.Encode("<s><0x61>", false);
  EXPECT_EQ(ids[1], tok.Find("<s"));
  for (TokenId id : ids) {
    EXPECT_NE(tok.Type(id), TokenType::kControl);
    EXPECT_NE(id, tok.Find("<0x61>")) << "the text '<0x61>' became the byte 'a'";
  }
  EXPECT_EQ(tok.Decode(ids), "<s><0x61>");
}

TEST(TokenizerTiny, EmptyTextAndMissingBos) {
  const Tokenizer tok = TinyTokenizer(-5, -5);
  EXPECT_EQ(tok.Encode("", true), (std::vector<TokenId>{1}));
  EXPECT_TRUE(tok.Encode("", false).empty());
  Vocabulary v;
  v.tokens = {"a"};
  v.scores = {0};
  const Tokenizer no_bos(std::move(v));
  EXPECT_THROW(no_bos.Encode("a", true), Error);
}

TEST(TokenizerTiny, RejectsMalformedVocabularies) {
  auto expect_malformed = [](Vocabulary v) {
    try {
      Tokenizer t(std::move(v));
      ADD_FAILURE() << "accepted a malformed vocabulary";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kMalformedFile) << e.what();
    }
  };
  expect_malformed(Vocabulary{});
  expect_malformed(Vocabulary{{"a", "b"}, {0}, {}, kNoToken, kNoToken, kNoToken});
  expect_malformed(Vocabulary{{"a"}, {0}, {TokenType::kNormal, TokenType::kNormal}});
  expect_malformed(Vocabulary{{"a"}, {0}, {static_cast<TokenType>(9)}});
  expect_malformed(Vocabulary{{"a"}, {0}, {TokenType::kByte}});  // not <0xXX>
  expect_malformed(Vocabulary{{"a"}, {0}, {}, 1});               // BOS out of range
}

TEST(TokenizerTiny, DecodeRejectsIdsOutOfRange) {
  const Tokenizer tok = TinyTokenizer(-5, -5);
  for (TokenId bad : {-1, tok.vocab_size(), 1 << 30}) {
    try {
      tok.Decode(std::vector<TokenId>{bad});
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    }
  }
}

TEST(Utf8Assembler, HoldsBackSplitCharacters) {
  const std::string text = "a\xC3\xA9\xE2\x96\x81\xF0\x9F\x99\x82z";  // a é ▁ 🙂 z
  for (size_t cut1 = 0; cut1 <= text.size(); ++cut1) {
    for (size_t cut2 = cut1; cut2 <= text.size(); ++cut2) {
      Utf8Assembler a;
      std::string out;
      for (auto part : {text.substr(0, cut1), text.substr(cut1, cut2 - cut1), text.substr(cut2)}) {
        const std::string got = a.Push(part);
        // Every emitted chunk ends on a character boundary.
        if (!got.empty()) {
          EXPECT_NE(static_cast<unsigned char>(got.back()) & 0xC0, 0xC0) << cut1 << " " << cut2;
        }
        out += got;
      }
      out += a.Flush();
      EXPECT_EQ(out, text);
    }
  }
  Utf8Assembler a;
  EXPECT_EQ(a.Push("\x80\x80\x80\x80"), "\x80\x80\x80\x80");  // stray bytes pass through
  EXPECT_EQ(a.Push("\xE2\x96"), "");
  EXPECT_EQ(a.Flush(), "\xE2\x96");
}

// ---- the shipped model ----

const Tokenizer& Shipped() {
  static const Tokenizer* tok = [] {
    const auto file = gguf::GgufFile::Open(MESHNET_SHIPPED_MODEL);
    return new Tokenizer(Tokenizer::FromGguf(file));
  }();
  return *tok;
}

TEST(TokenizerShipped, VocabularyAndSpecialIds) {
  const Tokenizer& tok = Shipped();
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.unk_id(), 0);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.Type(1), TokenType::kControl);
  EXPECT_EQ(tok.Type(3), TokenType::kByte);
  EXPECT_EQ(tok.TokenText(403), std::string(kSpace) + "Once");
}

TEST(TokenizerShipped, PromptMatchesReference) {
  EXPECT_EQ(Shipped().Encode("Once upon a time", true),
            (std::vector<TokenId>{1, 403, 407, 261, 378}));
  EXPECT_EQ(Shipped().Decode(std::vector<TokenId>{1, 403, 407, 261, 378}), "Once upon a time");
}

TEST(TokenizerShipped, KnownPieces) {
  const Tokenizer& tok = Shipped();
  EXPECT_EQ(tok.DecodePiece(378, 432), ",");
  EXPECT_EQ(tok.DecodePiece(432, 383), " there");
  EXPECT_EQ(tok.DecodePiece(1, 383), "there");  // the space prefix after BOS is dropped
  EXPECT_EQ(tok.DecodePiece(378, 1), "");       // control tokens render as nothing
  EXPECT_EQ(tok.DecodePiece(378, 2), "");
  EXPECT_EQ(tok.DecodePiece(378, 3 + 'A'), "A");  // <0x41>
}

// The reference continuation from models/README.md.
constexpr const char* kReferenceText =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.\n"
    "Lily's mom said";

TEST(TokenizerShipped, ReferenceContinuationRoundTrips) {
  const Tokenizer& tok = Shipped();
  const auto ids = tok.Encode(kReferenceText, true);
  // The prompt's tokens are a prefix: BPE on "Once upon a time, ..." starts
  // exactly as on the prompt alone, and the reference's first new token is ",".
  ASSERT_GE(ids.size(), 6u);
  EXPECT_EQ(std::vector<TokenId>(ids.begin(), ids.begin() + 6),
            (std::vector<TokenId>{1, 403, 407, 261, 378, 432}));
  EXPECT_EQ(std::vector<TokenId>(ids.begin() + 1, ids.end()), NaiveEncode(tok, kReferenceText));
  EXPECT_EQ(tok.Decode(ids), kReferenceText);
  std::string streamed;
  TokenId prev = kNoToken;
  for (TokenId id : ids) {
    streamed += tok.DecodePiece(prev, id);
    prev = id;
  }
  EXPECT_EQ(streamed, kReferenceText);
}

TEST(TokenizerShipped, RoundTripsAsciiAndUtf8WithByteFallback) {
  const Tokenizer& tok = Shipped();
  const std::vector<std::string> texts = {
      "a",
      "Hello, world!",
      "  two leading spaces and trailing  ",
      "tabs\tand\nnewlines\r\n",
      "caf\xC3\xA9 na\xC3\xAFve \xE2\x82\xAC 5",     // café naïve € 5
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",        // 日本語
      "emoji \xF0\x9F\x99\x82\xF0\x9F\x8E\x88 end",  // 🙂🎈
      "<s> and </s> and <0x41> are text here",
      std::string("nul\0byte", 8),
      "broken at the end \xE2\x82",
  };
  for (const std::string& text : texts) {
    for (bool bos : {false, true}) {
      const auto ids = tok.Encode(text, bos);
      EXPECT_EQ(tok.Decode(ids), text) << text;
      if (bos) {
        EXPECT_EQ(ids.front(), 1);
      }
    }
  }
  // Broken UTF-8 inside the text: llama.cpp sizes a symbol by its lead byte alone, so "\xFF"
  // takes the next three bytes (here most of the "▁" of the following space) and all of them
  // fall back to byte tokens - the decoded text then has "▁" where the space was, as
  // llama.cpp's own decode does. The ids are llama-tokenize's (c392e50, --no-bos).
  EXPECT_EQ(tok.Encode("\xFF\xFE broken \xC3 utf8 \xE2\x82", false),
            (std::vector<TokenId>{410, 258, 257, 229, 153, 132, 430, 420, 414, 433, 302,
                                  410, 198, 229, 153, 132, 323, 431, 487, 410, 229, 133}));
  // Characters outside the 512-token vocab fall back to their bytes.
  const auto ids = tok.Encode("\xE6\x97\xA5", false);  // 日
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(ids[1], 3 + 0xE6);
  EXPECT_EQ(ids[2], 3 + 0x97);
  EXPECT_EQ(ids[3], 3 + 0xA5);
  for (TokenId id : ids) EXPECT_NE(id, tok.unk_id());
}

TEST(TokenizerShipped, MatchesQuadraticOracleOnRandomText) {
  const Tokenizer& tok = Shipped();
  const std::string alphabet = "abcdefghijklmnopqrstuvwxyz      ,.!'TLOSe\xC3\xA9";
  std::mt19937 rng(42);
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    const int len = 1 + static_cast<int>(rng() % 120);
    for (int i = 0; i < len; ++i) {
      const char c = alphabet[rng() % alphabet.size()];
      if (static_cast<unsigned char>(c) >= 0x80) {
        text += "\xC3\xA9";  // keep UTF-8 well-formed
      } else {
        text += c;
      }
    }
    EXPECT_EQ(tok.Encode(text, false), NaiveEncode(tok, text)) << text;
    EXPECT_EQ(tok.Decode(tok.Encode(text, true)), text);
  }
}

TEST(TokenizerShipped, LongPromptRoundTrips) {
  const Tokenizer& tok = Shipped();
  std::string text;
  while (text.size() < 200000) text += kReferenceText;
  const auto ids = tok.Encode(text, true);
  EXPECT_LT(ids.size(), text.size() / 2);  // merges happened
  EXPECT_EQ(tok.Decode(ids), text);
}

}  // namespace
}  // namespace meshnet::model
