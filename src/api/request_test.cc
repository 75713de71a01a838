#include "api/request.h"

#include <gtest/gtest.h>

#include "api/api_error.h"
#include "api/chat_format.h"
#include "util/error.h"

namespace meshnet::api {
namespace {

using nlohmann::json;

TEST(Request, ChatDefaultsAndFields) {
  const CompletionRequest r = ParseCompletionRequest(
      json::parse(R"({"model":"m","messages":[{"role":"system","content":"s"},
        {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
        "max_completion_tokens":5,"temperature":0,"top_k":3,"seed":7,"stop":"x",
        "stream":true,"stream_options":{"include_usage":true},"user":"u","n":1})"),
      true);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(*r.max_tokens, 5);
  EXPECT_EQ(r.temperature, 0.0f);
  EXPECT_EQ(r.top_k, 3);
  EXPECT_EQ(*r.seed, 7u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(Request, CompletionPromptAsTokenIds) {
  const CompletionRequest r = ParseCompletionRequest(json::parse(R"({"prompt":[1,2,3]})"), false);
  EXPECT_FALSE(r.prompt_text);
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.temperature, 1.0f);
}

// cache_salt: a string of at most 256 bytes, else a 400 naming it.
TEST(Request, CacheSaltIsAShortString) {
  EXPECT_EQ(
      ParseCompletionRequest(json::parse(R"({"prompt":"a","cache_salt":"t1"})"), false).cache_salt,
      "t1");
  EXPECT_EQ(ParseCompletionRequest(json::parse(R"({"prompt":"a"})"), false).cache_salt, "");
  for (const json& bad : {json(7), json(std::string(257, 'x')), json::array()}) {
    try {
      ParseCompletionRequest(json{{"prompt", "a"}, {"cache_salt", bad}}, false);
      ADD_FAILURE() << "accepted " << bad.dump().substr(0, 40);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.param(), "cache_salt");
    }
  }
}

TEST(Request, ToolMessagesKeepTheirExtraFields) {
  const auto m = ParseMessages(json::parse(
      R"([{"role":"assistant","content":null,"tool_calls":[{"id":"c1"}]},
          {"role":"tool","content":"42","tool_call_id":"c1"}])"));
  EXPECT_EQ(m[0].extra["tool_calls"][0]["id"], "c1");
  EXPECT_EQ(m[1].extra["tool_call_id"], "c1");
}

// The error code of ParseJsonBody(body), "" when it parses.
std::string ParseError(const std::string& body) {
  try {
    ParseJsonBody(body);
    return "";
  } catch (const ApiError& e) {
    return e.ToJson()["error"]["code"].is_string() ? e.ToJson()["error"]["code"].get<std::string>()
                                                   : "?";
  }
}

std::string Nested(int depth, char open = '[', char close = ']') {
  return std::string(static_cast<size_t>(depth), open) +
         std::string(static_cast<size_t>(depth), close);
}

// kMaxJsonDepth levels parse; one more is json_too_deep, also when the deep
// value sits in a field no handler reads or is a mix of arrays and objects;
// 200,000 levels are refused without building them (nlohmann's dump and copy
// recursed once per level: SIGSEGV).
TEST(Request, BodiesNestedBeyondTheLimitAreRefusedWhileParsing) {
  EXPECT_EQ(ParseError("{\"x\":" + Nested(kMaxJsonDepth - 1) + "}"), "");
  EXPECT_EQ(ParseError("{\"x\":" + Nested(kMaxJsonDepth) + "}"), "json_too_deep");
  std::string mixed = "{";
  for (int i = 0; i < kMaxJsonDepth; ++i) mixed += i % 2 ? "\"a\":{" : "\"b\":[{";
  EXPECT_EQ(ParseError(mixed), "json_too_deep");  // refused before the body even ends
  EXPECT_EQ(ParseError("{\"x\":" + Nested(200000) + "}"), "json_too_deep");
  EXPECT_EQ(ParseError("{\"x\":[1,2"), "invalid_json");
}

TEST(ChatFormatter, WithoutATemplateRendersChatMl) {
  const ChatFormatter f;
  EXPECT_EQ(f.kind(), "chatml");
  std::vector<ChatMessage> m = {{"system", "be brief"}, {"user", "hi"}};
  EXPECT_EQ(f.Render(m, true, nullptr),
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(f.Render(m, false, nullptr).find("assistant"), std::string::npos);
}

TEST(ChatFormatter, JinjaTemplateGetsMessagesBosAndTools) {
  const ChatFormatter f(
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
      "{% if tools %}{{ tools | length }} tools{% endif %}"
      "{% if add_generation_prompt %}>{% endif %}",
      "<s>", "</s>");
  EXPECT_EQ(f.kind(), "jinja");
  std::vector<ChatMessage> m = {{"user", "hi"}, {"assistant", "yo"}};
  EXPECT_EQ(f.Render(m, true, nlohmann::ordered_json::array({{{"type", "function"}}})),
            "<s>[user:hi][assistant:yo]1 tools>");
}

TEST(ChatFormatter, RaiseExceptionInTheTemplateIsA400) {
  const ChatFormatter f("{{ raise_exception('roles must alternate') }}");
  try {
    f.Render({{"user", "a"}}, true, nullptr);
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("roles must alternate"), std::string::npos);
  }
}

TEST(ChatFormatter, ATemplateThatDoesNotParseIsRefusedAtStartup) {
  EXPECT_THROW(ChatFormatter("{% for %}"), Error);
}

}  // namespace
}  // namespace meshnet::api
