// Language features, one small template each (tests/data/templates/snippets.json), and the
// minimized divergences the differential fuzzer found (fuzz_cases.json), rendered by this
// interpreter and by Python jinja2 (render_snippets.py, HF's environment): same bytes, or both
// fail - with the same message when the template raised it.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "template/chat_template.h"
#include "template/template_test_util.h"

namespace meshnet::jinja {
namespace {

using nlohmann::ordered_json;
using testutil::kDataDir;

void ExpectSpecMatchesJinja2(const std::string& file) {
  const std::string spec_path = (kDataDir / file).string();
  auto [out, status] =
      testutil::Run(std::string(MESHNET_PYTHON) + " '" +
                    (kDataDir / "render_snippets.py").string() + "' '" + spec_path + "'");
  ASSERT_EQ(status, 0);
  std::map<std::string, ordered_json> reference;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    ordered_json j = ordered_json::parse(line);
    reference[j["name"].get<std::string>()] = j;
  }
  ordered_json spec = ordered_json::parse(testutil::ReadFile(spec_path));
  int total = 0, matched = 0;
  for (const auto& s : spec["snippets"]) {
    std::string name = s["name"];
    SCOPED_TRACE(name + ": " + s["template"].get<std::string>());
    ++total;
    ordered_json vars = spec["vars"];
    if (s.contains("vars")) vars.update(s["vars"]);
    ChatTemplateOptions opts;
    opts.extra_context = vars;  // messages etc. stay unset: the snippets use their own names
    auto got = RenderChatTemplate(s["template"].get<std::string>(), ordered_json::array(), opts);
    ASSERT_TRUE(reference.count(name));
    const ordered_json& want = reference[name];
    if (want.contains("prompt")) {
      if (!got.ok()) {
        ADD_FAILURE() << "we failed: " << got.error().what();
        continue;
      }
      EXPECT_EQ(got.value(), want["prompt"].get<std::string>());
      matched += got.value() == want["prompt"].get<std::string>();
      continue;
    }
    std::string error = want["error"];
    if (got.ok()) {
      ADD_FAILURE() << "jinja2 failed with " << error << ", we rendered: " << got.value();
      continue;
    }
    bool raised = error.rfind("TemplateError: ", 0) == 0;  // raise_exception: same message
    if (raised) {
      EXPECT_EQ("TemplateError: " + std::string(got.error().what()), error);
    }
    bool syntax = error.find("SyntaxError") != std::string::npos;
    EXPECT_EQ(got.error().kind(), syntax ? ErrorKind::kMalformedFile : ErrorKind::kInvalidArgument)
        << got.error().what() << " vs " << error;
    matched += !raised || "TemplateError: " + std::string(got.error().what()) == error;
  }
  EXPECT_EQ(matched, total);
  std::printf("%s: matched %d/%d\n", file.c_str(), matched, total);
}

TEST(ChatTemplateFeatureTest, SnippetsMatchJinja2) {
  if (!testutil::ReferenceAvailable()) GTEST_SKIP() << "python3-jinja2 is not installed";
  ExpectSpecMatchesJinja2("snippets.json");
}

TEST(ChatTemplateFeatureTest, FuzzerRegressionCasesMatchJinja2) {
  if (!testutil::ReferenceAvailable()) GTEST_SKIP() << "python3-jinja2 is not installed";
  ExpectSpecMatchesJinja2("fuzz_cases.json");
}

}  // namespace
}  // namespace meshnet::jinja
