// Every chat template in tests/data/templates rendered with every case in cases.json must give
// the same bytes as Python jinja2 (render.py, run here) - or the same error the template raises.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "template/chat_template.h"
#include "template/template_test_util.h"

namespace meshnet::jinja {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using testutil::kDataDir;
using testutil::ReadFile;
using testutil::ReferenceAvailable;
using testutil::Run;

// name -> {"prompt": ...} or {"error": ...} from render.py.
std::map<std::string, ordered_json> Reference(const fs::path& tmpl) {
  auto [out, status] =
      Run(std::string(MESHNET_PYTHON) + " '" + (kDataDir / "render.py").string() + "' '" +
          tmpl.string() + "' '" + (kDataDir / "cases.json").string() + "'");
  EXPECT_EQ(status, 0) << "render.py failed for " << tmpl;
  std::map<std::string, ordered_json> by_name;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    ordered_json j = ordered_json::parse(line);
    by_name[j["name"].get<std::string>()] = j;
  }
  return by_name;
}

TEST(ChatTemplateGoldenTest, EveryTemplateAndCaseMatchesJinja2) {
  if (!ReferenceAvailable()) GTEST_SKIP() << "python3-jinja2 is not installed: no reference";
  ordered_json cases = ordered_json::parse(ReadFile(kDataDir / "cases.json"));
  int templates = 0, matched = 0, total = 0, errors_matched = 0;
  for (const auto& entry : fs::directory_iterator(kDataDir)) {
    if (entry.path().extension() != ".jinja") continue;
    ++templates;
    std::string source = ReadFile(entry.path());
    auto parsed = ChatTemplate::Parse(source);
    ASSERT_TRUE(parsed.ok()) << entry.path() << ": " << parsed.error().what();
    auto reference = Reference(entry.path());
    for (const auto& c : cases) {
      std::string name = c["name"];
      SCOPED_TRACE(entry.path().filename().string() + " / " + name);
      ++total;
      ChatTemplateOptions opts;
      opts.add_generation_prompt = c.value("add_generation_prompt", true);
      opts.bos_token = c.value("bos_token", "<s>");
      opts.eos_token = c.value("eos_token", "</s>");
      if (c.contains("tools")) opts.tools = c["tools"];
      auto got = parsed.value().Render(c["messages"], opts);
      ASSERT_TRUE(reference.count(name)) << "render.py gave no line for the case";
      const ordered_json& want = reference[name];
      if (want.contains("prompt")) {
        ASSERT_TRUE(got.ok()) << got.error().what();
        EXPECT_EQ(got.value(), want["prompt"].get<std::string>());
        matched += got.value() == want["prompt"].get<std::string>();
      } else {
        ASSERT_FALSE(got.ok()) << "jinja2 raised " << want["error"] << ", we rendered:\n"
                               << got.value();
        std::string ours = std::string("TemplateError: ") + got.error().what();
        EXPECT_EQ(ours, want["error"].get<std::string>());
        EXPECT_EQ(got.error().kind(), ErrorKind::kInvalidArgument);
        matched += ours == want["error"].get<std::string>();
        errors_matched += ours == want["error"].get<std::string>();
      }
    }
  }
  EXPECT_GE(templates, 7);
  EXPECT_EQ(matched, total);
  std::printf("templates=%d cases=%zu matched %d/%d (of which %d template-raised errors)\n",
              templates, cases.size(), matched, total, errors_matched);
}

TEST(ChatTemplateGoldenTest, ChatMlDefaultMatchesJinja2) {
  if (!ReferenceAvailable()) GTEST_SKIP() << "python3-jinja2 is not installed: no reference";
  fs::path tmp = fs::temp_directory_path() / ("chatml-" + std::to_string(::getpid()) + ".jinja");
  std::ofstream(tmp, std::ios::binary) << kChatMlTemplate;
  auto reference = Reference(tmp);
  fs::remove(tmp);
  ordered_json cases = ordered_json::parse(ReadFile(kDataDir / "cases.json"));
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    ChatTemplateOptions opts;
    opts.add_generation_prompt = c.value("add_generation_prompt", true);
    auto got = RenderChatTemplate(kChatMlTemplate, c["messages"], opts);
    ASSERT_TRUE(got.ok()) << got.error().what();
    EXPECT_EQ(got.value(), reference[c["name"].get<std::string>()]["prompt"].get<std::string>());
  }
}

}  // namespace
}  // namespace meshnet::jinja
