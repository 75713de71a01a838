// llama.cpp's tokenizer test suites (tests/data/tokenizers, see its README):
// every case of each vocabulary must encode (no BOS, no special parsing) to
// exactly the ids llama.cpp produced. One test per vocabulary; a failure lists
// every failing case with its input, expected and actual ids.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace meshnet::model
