// Fuzz-ish robustness: mutated real templates and random token soup, rendered with the real
// cases under tight limits, must return a value or an error - never crash or hang. (Run under
// ASan/UBSan in CI like every unit test.)
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "template/chat_template.h"
#include "template/template_test_util.h"

namespace meshnet::jinja {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

const std::vector<std::string> kPieces = {"{%",
                                          "%}",
                                          "{{",
                                          "}}",
                                          "{#",
                                          "#}",
                                          "-",
                                          "+",
                                          "(",
                                          ")",
                                          "[",
                                          "]",
                                          "{",
                                          "}",
                                          "'",
                                          "\"",
                                          "\\",
                                          "|",
                                          ".",
                                          ",",
                                          ":",
                                          "=",
                                          "==",
                                          "**",
                                          "//",
                                          "~",
                                          " if ",
                                          " else ",
                                          " for ",
                                          " in ",
                                          " not ",
                                          " is ",
                                          "endif",
                                          "endfor",
                                          "set ",
                                          "macro ",
                                          "endmacro",
                                          "loop",
                                          "ns",
                                          "messages",
                                          "tojson",
                                          "namespace(",
                                          "raise_exception(",
                                          "range(",
                                          "[::-1]",
                                          "[1:]",
                                          "\n",
                                          " ",
                                          "0",
                                          "-1",
                                          "1e400",
                                          "9999999999999999999999",
                                          "\xc3",
                                          "\xf0\x9f",
                                          "é",
                                          "caller()",
                                          "call ",
                                          "endcall",
                                          "break",
                                          "continue",
                                          "raw",
                                          "endraw",
                                          "selectattr(",
                                          "map(",
                                          "| length",
                                          "is defined",
                                          "none"};

std::string Mutate(std::string s, std::mt19937& rng) {
  int edits = 1 + rng() % 4;
  for (int e = 0; e < edits; ++e) {
    size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 4) {
      case 0:  // delete a range
        if (!s.empty() && pos < s.size()) s.erase(pos, 1 + rng() % 16);
        break;
      case 1:  // insert a token
        s.insert(pos, kPieces[rng() % kPieces.size()]);
        break;
      case 2: {  // duplicate a slice
        if (s.empty()) break;
        size_t from = rng() % s.size();
        s.insert(pos, s.substr(from, 1 + rng() % 64));
        break;
      }
      default:  // random byte
        s.insert(pos, 1, static_cast<char>(rng() % 256));
    }
  }
  return s;
}

void RenderAll(const std::string& tmpl, const ordered_json& cases, int* ok, int* failed) {
  ChatTemplateOptions opts;
  opts.max_steps = 200'000;
  opts.max_output_bytes = 1 << 16;
  opts.bos_token = "<s>";
  opts.tools = cases[8]["tools"];
  auto parsed = ChatTemplate::Parse(tmpl);
  if (!parsed.ok()) {
    ASSERT_EQ(parsed.error().kind(), ErrorKind::kMalformedFile);
    ASSERT_GT(std::string(parsed.error().what()).size(), 0u);
    ++*failed;
    return;
  }
  for (size_t i = 0; i < cases.size(); i += 4) {
    auto r = parsed.value().Render(cases[i]["messages"], opts);
    if (r.ok()) {
      ASSERT_LE(r.value().size(), opts.max_output_bytes);
      ++*ok;
    } else {
      ASSERT_EQ(r.error().kind(), ErrorKind::kInvalidArgument) << r.error().what();
      ++*failed;
    }
  }
}

TEST(ChatTemplateFuzzTest, MutatedRealTemplatesNeverCrash) {
  ordered_json cases = ordered_json::parse(testutil::ReadFile(testutil::kDataDir / "cases.json"));
  std::vector<std::string> templates;
  for (const auto& entry : fs::directory_iterator(testutil::kDataDir)) {
    if (entry.path().extension() == ".jinja") templates.push_back(testutil::ReadFile(entry.path()));
  }
  ASSERT_FALSE(templates.empty());
  std::mt19937 rng(20261130);
  int ok = 0, failed = 0;
  for (int i = 0; i < 1500; ++i) {
    std::string t = Mutate(templates[i % templates.size()], rng);
    SCOPED_TRACE(t);
    RenderAll(t, cases, &ok, &failed);
    if (HasFatalFailure()) return;
  }
  std::printf("mutated templates: %d renders ok, %d errors\n", ok, failed);
  EXPECT_GT(ok, 0);
  EXPECT_GT(failed, 0);
}

TEST(ChatTemplateFuzzTest, TokenSoupNeverCrashes) {
  ordered_json cases = ordered_json::parse(testutil::ReadFile(testutil::kDataDir / "cases.json"));
  std::mt19937 rng(7);
  int ok = 0, failed = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string t;
    int n = 1 + rng() % 40;
    for (int k = 0; k < n; ++k) t += kPieces[rng() % kPieces.size()];
    SCOPED_TRACE(t);
    RenderAll(t, cases, &ok, &failed);
    if (HasFatalFailure()) return;
  }
  std::printf("token soup: %d renders ok, %d errors\n", ok, failed);
}

}  // namespace
}  // namespace meshnet::jinja
