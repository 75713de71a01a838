// llama.cpp's tokenizer test suites (tests/data/tokenizers, see its README):
// every case of each vocabulary must encode (no BOS, no special parsing) to
// exactly the ids llama.cpp produced. One test per vocabulary; a failure lists
// every failing case with its input, expected and actual ids.
//
// The differential cases (NAME.gguf.fuzz.inp/.out, scripts/gen-tokenizer-cases.py):
// random and adversarial texts tokenized by llama.cpp's llama-tokenize three
// ways - plain, parsing control tokens, and with the model's BOS/EOS too.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "model/tokenizer.h"

namespace meshnet::model {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Case {
  std::string text;
  std::vector<TokenId> ids;
};

std::vector<TokenId> ParseIds(const std::string& line) {
  std::vector<TokenId> ids;
  std::istringstream in(line);
  for (TokenId id; in >> id;) ids.push_back(id);
  return ids;
}

std::vector<std::string> SplitCases(const std::string& inp) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t end = inp.find(sep, pos);
    if (end == std::string::npos) break;
    texts.push_back(inp.substr(pos, end - pos));
    pos = end + sep.size();
  }
  return texts;
}

std::vector<Case> ReadCases(const std::string& base) {
  const std::string inp = ReadFile(base + ".inp");
  const std::string out = ReadFile(base + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<Case> cases;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t end = inp.find(sep, pos);
    if (end == std::string::npos) break;
    cases.push_back({inp.substr(pos, end - pos), {}});
    pos = end + sep.size();
  }
  std::istringstream lines(out);
  std::string line;
  for (Case& c : cases) {
    EXPECT_TRUE(std::getline(lines, line)) << "fewer .out lines than cases in " << base;
    std::istringstream ids(line);
    for (TokenId id; ids >> id;) c.ids.push_back(id);
  }
  return cases;
}

std::string Ids(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

class VocabSuite : public testing::TestWithParam<std::string> {};

TEST_P(VocabSuite, EveryCaseMatchesLlamaCpp) {
  const std::string base =
      std::string(MESHNET_TOKENIZER_DATA) + "/ggml-vocab-" + GetParam() + ".gguf";
  const auto file = gguf::GgufFile::Open(base);
  const Tokenizer tok = Tokenizer::FromGguf(file);
  const std::vector<Case> cases = ReadCases(base);
  ASSERT_EQ(cases.size(), 46u);
  std::string failures;
  int failed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<TokenId> got =
        tok.Tokenize(cases[i].text, /*add_special=*/false, /*parse_special=*/false);
    if (got != cases[i].ids) {
      ++failed;
      failures += "case " + std::to_string(i) + " '" + cases[i].text +
                  "'\n  want: " + Ids(cases[i].ids) + "\n  got:  " + Ids(got) + "\n";
    }
  }
  EXPECT_EQ(failed, 0) << failed << " of " << cases.size() << " cases differ:\n" << failures;
}

INSTANTIATE_TEST_SUITE_P(Llama, VocabSuite,
                         testing::Values("llama-spm", "phi-3", "gpt-2", "starcoder",
                                         "deepseek-llm"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

// A readable form of a text that may hold control characters or broken UTF-8.
std::string Printable(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

TEST_P(VocabSuite, DifferentialCasesMatchLlamaTokenize) {
  const std::string base =
      std::string(MESHNET_TOKENIZER_DATA) + "/ggml-vocab-" + GetParam() + ".gguf";
  const Tokenizer tok = Tokenizer::FromGguf(gguf::GgufFile::Open(base));
  const std::vector<std::string> texts = SplitCases(ReadFile(base + ".fuzz.inp"));
  std::istringstream out(ReadFile(base + ".fuzz.out"));
  ASSERT_GE(texts.size(), 100u);
  int failed = 0, compared = 0;
  std::string failures;
  for (size_t i = 0; i < texts.size(); ++i) {
    // llama-tokenize --no-bos --no-parse-special / --no-bos / its defaults.
    const bool add_special[] = {false, false, tok.add_bos()};
    const bool parse_special[] = {false, true, true};
    const char* const kWays[] = {"plain", "special", "with BOS"};
    for (int way = 0; way < 3; ++way) {
      std::string line;
      ASSERT_TRUE(std::getline(out, line)) << "fewer .fuzz.out lines than cases";
      const std::vector<TokenId> want = ParseIds(line);
      const std::vector<TokenId> got = tok.Tokenize(texts[i], add_special[way], parse_special[way]);
      ++compared;
      if (got == want) continue;
      if (++failed <= 10) {
        failures += "case " + std::to_string(i) + " (" + kWays[way] + ") '" + Printable(texts[i]) +
                    "'\n  want: " + Ids(want) + "\n  got:  " + Ids(got) + "\n";
      }
    }
  }
  EXPECT_EQ(failed, 0) << failed << " of " << compared << " tokenizations differ:\n" << failures;
}

}  // namespace
}  // namespace meshnet::model
