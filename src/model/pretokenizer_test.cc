// Pre-tokenizer splits (PCRE2) for the patterns whose behaviour differs
// between `pre` names, and the invalid-UTF-8 sanitizer.
#include "model/pretokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "util/error.h"

namespace meshnet::model {
namespace {

std::vector<std::string> Words(std::string_view pre, std::string_view text) {
  const PreTokenizer p(pre);
  std::vector<size_t> bounds;
  p.Split(text, bounds);
  std::vector<std::string> words;
  for (size_t i = 0; i + 1 < bounds.size(); i += 2) {
    words.emplace_back(text.substr(bounds[i], bounds[i + 1] - bounds[i]));
  }
  return words;
}

using W = std::vector<std::string>;

TEST(PreTokenizer, EverySupportedNameCompilesAndCoversTheText) {
  const std::string text = "Hello, World! It's 2024...\n\n  東京 \xF0\x9F\xA6\x99 x=1+2; ";
  for (const std::string& name : PreTokenizer::SupportedNames()) {
    const W words = Words(name, text);
    std::string joined;
    for (const std::string& w : words) {
      EXPECT_FALSE(w.empty()) << name;
      joined += w;
    }
    EXPECT_EQ(joined, text) << name << ": the words must tile the text";
  }
}

TEST(PreTokenizer, Gpt2) {
  EXPECT_EQ(Words("gpt-2", "Hello world's 12345!!  ok"),
            (W{"Hello", " world", "'s", " 12345", "!!", " ", " ok"}));
}

TEST(PreTokenizer, Llama3GroupsDigitsByThreeAndCaseInsensitiveContractions) {
  EXPECT_EQ(Words("llama-bpe", "I'M 12345 ok\n\n"),
            (W{"I", "'M", " ", "123", "45", " ok", "\n\n"}));
  EXPECT_TRUE(PreTokenizer("llama-bpe").ignore_merges());
  EXPECT_TRUE(PreTokenizer("llama-bpe").default_add_bos());
  EXPECT_FALSE(PreTokenizer("qwen2").ignore_merges());
}

TEST(PreTokenizer, Qwen2SplitsEveryDigit) {
  EXPECT_EQ(Words("qwen2", "x 123"), (W{"x", " ", "1", "2", "3"}));
}

TEST(PreTokenizer, StarcoderSplitsDigitsFirst) {
  EXPECT_EQ(Words("starcoder", "a 42b"), (W{"a", " ", "4", "2", "b"}));
}

TEST(PreTokenizer, DeepseekLlmSplitsNewlinesAndCjk) {
  EXPECT_EQ(Words("deepseek-llm", "ab\n東京"), (W{"ab", "\n", "東京"}));
}

TEST(PreTokenizer, UnknownNameIsMalformedFile) { EXPECT_THROW(PreTokenizer("gpt-5"), Error); }

TEST(SanitizeUtf8, ReplacesEachBadByteLikeLlamaCpp) {
  std::string storage;
  EXPECT_EQ(SanitizeUtf8("a\xFF"
                         "b",
                         storage),
            "a\xEF\xBF\xBD"
            "b");
  // A truncated 3-byte sequence: its lead and its continuation byte.
  EXPECT_EQ(SanitizeUtf8("\xE2\x82", storage), "\xEF\xBF\xBD\xEF\xBF\xBD");
  // Surrogates and overlong forms are not scalar values: one U+FFFD each.
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80", storage), "\xEF\xBF\xBD");
  EXPECT_EQ(SanitizeUtf8("\xC0\xAF", storage), "\xEF\xBF\xBD");
  const std::string_view valid = "\xF0\x9F\xA6\x99 ok";
  EXPECT_EQ(SanitizeUtf8(valid, storage).data(), valid.data()) << "valid text is not copied";
}

}  // namespace
}  // namespace meshnet::model
