// The chat-template API: options plumbing, error kinds and messages, key order, limits against
// hostile templates and inputs, concurrent rendering. (Output bytes are checked against jinja2
// in template_golden_test / template_feature_test.)
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "template/chat_template.h"

namespace meshnet::jinja {
namespace {

using nlohmann::ordered_json;

ordered_json Messages() {
  return ordered_json::parse(
      R"([{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}])");
}

std::string Repeat(std::string_view s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(ChatTemplateTest, OptionsReachTheTemplate) {
  ChatTemplateOptions opts;
  opts.bos_token = "<B>";
  opts.eos_token = "<E>";
  opts.add_generation_prompt = false;
  opts.extra_context = {{"enable_thinking", "yes"}, {"bos_token", "ignored"}};
  auto r = RenderChatTemplate(
      "{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}{{ enable_thinking }}"
      "{{ tools is defined }}{{ messages | length }}",
      Messages(), opts);
  ASSERT_TRUE(r.ok()) << r.error().what();
  EXPECT_EQ(r.value(), opts.bos_token + opts.eos_token + "False" + "yes" + "False" + "2");
  opts.tools = ordered_json::array({{{"type", "function"}}});
  r = RenderChatTemplate("{{ tools is defined }}{{ tools | length }}", Messages(), opts);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "True1");
}

TEST(ChatTemplateTest, TojsonKeepsInsertionOrderOfOrderedJson) {
  ordered_json msg = ordered_json::object();
  msg["zeta"] = 1;
  msg["alpha"] = 2;
  auto r = RenderChatTemplate("{{ messages[0] | tojson }}", ordered_json::array({msg}), {});
  ASSERT_TRUE(r.ok());
  EXPECT_LT(r.value().find("zeta"), r.value().find("alpha"));
  // A plain nlohmann::json converts implicitly (its keys are sorted).
  nlohmann::json plain = nlohmann::json::array({{{"zeta", 1}, {"alpha", 2}}});
  r = RenderChatTemplate("{{ messages[0] | tojson }}", plain, {});
  ASSERT_TRUE(r.ok());
  EXPECT_GT(r.value().find("zeta"), r.value().find("alpha"));
}

TEST(ChatTemplateTest, SyntaxErrorsAreMalformedWithALine) {
  for (const char* bad : {"{% if x %}", "line1\n{{ x ", "{% frobnicate %}", "{{ 'abc }}",
                          "{{ (1 }}", "{% for x in xs %}{% endif %}", "{# no end", "{% break %}",
                          "{{ }}", "{% set %}", "{% macro %}", "{{ x | }}", "{{ a is }}"}) {
    SCOPED_TRACE(bad);
    auto parsed = ChatTemplate::Parse(bad);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.error().kind(), ErrorKind::kMalformedFile);
    EXPECT_NE(std::string(parsed.error().what()).find("line "), std::string::npos);
  }
  auto parsed = ChatTemplate::Parse("ok\n\n{{ x ");
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(std::string(parsed.error().what()).find("line 3"), std::string::npos);
}

TEST(ChatTemplateTest, RaiseExceptionCarriesTheTemplatesMessage) {
  auto r = RenderChatTemplate(
      "{% if messages[0].role != 'system' %}{{ raise_exception('need a system message') }}"
      "{% endif %}",
      Messages(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind(), ErrorKind::kInvalidArgument);
  EXPECT_STREQ(r.error().what(), "need a system message");
}

TEST(ChatTemplateTest, RuntimeTypeErrorsAreInvalidArgument) {
  for (const char* bad : {"{{ messages[0].content + 1 }}", "{{ nope.x }}", "{{ 1 // 0 }}",
                          "{{ messages() }}", "{{ 'a' | nofilter }}", "{{ 1 is nosuchtest }}",
                          "{% set ns = namespace() %}{% set ns.me = ns %}"}) {
    SCOPED_TRACE(bad);
    auto r = RenderChatTemplate(bad, Messages(), {});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().kind(), ErrorKind::kInvalidArgument);
  }
}

TEST(ChatTemplateTest, ParsedTemplateRendersConcurrently) {
  auto parsed = ChatTemplate::Parse(kChatMlTemplate);
  ASSERT_TRUE(parsed.ok());
  const ChatTemplate& t = parsed.value();
  auto want = t.Render(Messages(), {});
  ASSERT_TRUE(want.ok());
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 200; ++k) {
        auto got = t.Render(Messages(), {});
        mismatches[i] += !got.ok() || got.value() != want.value();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

// Hostile templates get an error - never a crash, a hang or unbounded memory.
TEST(ChatTemplateTest, HostileTemplatesHitLimits) {
  struct Case {
    std::string name, tmpl;
    ErrorKind kind;
  };
  std::vector<Case> cases = {
      {"deep parentheses", "{{ " + Repeat("(", 5000) + "1" + Repeat(")", 5000) + " }}",
       ErrorKind::kMalformedFile},
      {"deep not", "{{ " + Repeat("not ", 5000) + "1 }}", ErrorKind::kMalformedFile},
      {"deep lists", "{{ " + Repeat("[", 5000) + Repeat("]", 5000) + " }}",
       ErrorKind::kMalformedFile},
      {"deep ifs", Repeat("{% if true %}", 5000) + Repeat("{% endif %}", 5000),
       ErrorKind::kMalformedFile},
      {"huge range", "{% for i in range(1000000000) %}{% endfor %}", ErrorKind::kInvalidArgument},
      {"nested loops",
       "{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}"
       "{% endfor %}{% endfor %}{% endfor %}",
       ErrorKind::kInvalidArgument},
      {"output bomb", "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
       ErrorKind::kInvalidArgument},
      {"string doubling",
       "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
       "{% endfor %}",
       ErrorKind::kInvalidArgument},
      {"list doubling",
       "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}"
       "{% endfor %}",
       ErrorKind::kInvalidArgument},
      {"deep value",
       "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
       "{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}",
       ErrorKind::kInvalidArgument},
      {"string repeat", "{{ 'x' * 10000000000 }}", ErrorKind::kInvalidArgument},
      {"infinite recursion", "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
       ErrorKind::kInvalidArgument},
      {"pow loop", "{{ 1 ** 100000000000 }}", ErrorKind::kInvalidArgument},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto start = std::chrono::steady_clock::now();
    auto r = RenderChatTemplate(c.tmpl, Messages(), {});
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - start)
                  .count();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().kind(), c.kind) << r.error().what();
    std::printf("%-20s %6lld ms  %s\n", c.name.c_str(), static_cast<long long>(ms),
                r.error().what());
  }
}

TEST(ChatTemplateTest, LimitsAreTheConfiguredOnes) {
  ChatTemplateOptions opts;
  opts.max_output_bytes = 10;
  EXPECT_TRUE(RenderChatTemplate("{{ 'x' * 10 }}", Messages(), opts).ok());
  EXPECT_FALSE(RenderChatTemplate("{{ 'x' * 11 }}", Messages(), opts).ok());
  opts = {};
  opts.max_steps = 1000;
  EXPECT_FALSE(RenderChatTemplate("{% for i in range(2000) %}{% endfor %}", Messages(), opts).ok());
  EXPECT_TRUE(RenderChatTemplate("{% for i in range(100) %}{% endfor %}", Messages(), opts).ok());
}

TEST(ChatTemplateTest, DeeplyNestedJsonInputIsAnError) {
  ordered_json deep = "leaf";
  for (int i = 0; i < 2000; ++i) deep = ordered_json::array({deep});
  auto r = RenderChatTemplate("{{ messages | length }}",
                              ordered_json::array({{{"role", "user"}, {"content", deep}}}), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind(), ErrorKind::kInvalidArgument);
}

}  // namespace
}  // namespace meshnet::jinja
