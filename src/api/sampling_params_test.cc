// Sampling parameters over HTTP (in process): logprobs, penalties and
// logit_bias on the shipped model.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "api/server_test_util.h"

namespace meshnet::api {
namespace {

using nlohmann::json;
using testing::SseEvents;
using testing::TestServer;

// logprobs are the model's distribution: each token's text, in order, is the
// completion's text; greedy picks the most likely token, which tops its
// list; a stream carries the same entries as the whole answer.
TEST(ApiServer, LogprobsDescribeEachToken) {
  TestServer ts(true, 256);
  auto cli = ts.Client();
  auto comp =
      cli.Post("/v1/completions",
               R"({"prompt":"Once upon a time","temperature":0,"max_tokens":12,"logprobs":3})",
               "application/json");
  ASSERT_TRUE(comp);
  ASSERT_EQ(comp->status, 200) << comp->body;
  const json c = json::parse(comp->body)["choices"][0];
  const json& lp = c["logprobs"];
  std::string text;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    EXPECT_EQ(lp["text_offset"][i], text.size());
    text += lp["tokens"][i].get<std::string>();
    const float chosen = lp["token_logprobs"][i];
    EXPECT_LE(chosen, 0.0f);
    ASSERT_LE(lp["top_logprobs"][i].size(), 3u);
    float best = -1e9f;
    for (const auto& [token, value] : lp["top_logprobs"][i].items()) {
      best = std::max(best, value.get<float>());
    }
    EXPECT_FLOAT_EQ(best, chosen) << "greedy took a token that is not the most likely";
  }
  EXPECT_EQ(text, c["text"]);
  const std::string chat_req =
      R"({"messages":[{"role":"user","content":"Once upon a time"}],"temperature":0,)"
      R"("max_tokens":12,"logprobs":true,"top_logprobs":2)";
  auto chat = cli.Post("/v1/chat/completions", chat_req + "}", "application/json");
  ASSERT_TRUE(chat);
  const json m = json::parse(chat->body)["choices"][0];
  std::string content;
  for (const json& e : m["logprobs"]["content"]) {
    content += e["token"].get<std::string>();
    EXPECT_EQ(e["bytes"].size(), e["token"].get<std::string>().size());
    ASSERT_EQ(e["top_logprobs"].size(), 2u);
    EXPECT_EQ(e["top_logprobs"][0]["logprob"], e["logprob"]);
    EXPECT_GE(e["top_logprobs"][0]["logprob"], e["top_logprobs"][1]["logprob"]);
  }
  EXPECT_EQ(content, m["message"]["content"]);
  auto stream =
      cli.Post("/v1/chat/completions", chat_req + R"(,"stream":true})", "application/json");
  ASSERT_TRUE(stream);
  json streamed = json::array();
  for (const std::string& event : SseEvents(stream->body)) {
    if (event == "[DONE]") continue;
    const json chunk = json::parse(event);
    const json& lpc = chunk["choices"][0]["logprobs"];
    if (lpc.is_object()) {
      for (const json& e : lpc["content"]) streamed.push_back(e);
    }
  }
  EXPECT_EQ(streamed, m["logprobs"]["content"]);
}

// logit_bias steers greedy decoding onto a token; penalties change the
// text (the story repeats "She", "play" ... within 64 tokens); without them
// the greedy text is the same as before.
TEST(ApiServer, LogitBiasAndPenaltiesSteerTheSample) {
  TestServer ts(true, 256);
  auto cli = ts.Client();
  auto text_of = [&](const std::string& extra) {
    auto r =
        cli.Post("/v1/completions",
                 R"({"prompt":"Once upon a time","temperature":0,"max_tokens":64)" + extra + "}",
                 "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "");
    return r ? json::parse(r->body)["choices"][0]["text"].get<std::string>() : "";
  };
  const std::string plain = text_of("");
  const int32_t id = ts.engine->tokenizer().Tokenize(" dog", false, false).back();
  const std::string biased = text_of(R"(,"logit_bias":{")" + std::to_string(id) + R"(":100})");
  const std::string repeated = ts.engine->tokenizer().Decode(std::vector<int32_t>(64, id));
  EXPECT_EQ(biased, repeated) << "every token is the biased one";
  EXPECT_NE(text_of(R"(,"frequency_penalty":2)"), plain);
  EXPECT_NE(text_of(R"(,"presence_penalty":2)"), plain);
  EXPECT_EQ(text_of(R"(,"frequency_penalty":0,"presence_penalty":0,"logit_bias":{})"), plain);
}

}  // namespace
}  // namespace meshnet::api
