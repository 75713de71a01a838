// The API server on 127.0.0.1:0 over the shipped model's in-process mesh:
// every bad request of issue 11 item 4 gets its status and an OpenAI-style
// error object, SSE framing, and a client disconnect releasing the KV.
#include "api/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "api/engine.h"
#include "api/server_test_util.h"
#include "gguf/gguf_reader.h"
#include "mesh/in_process.h"
#include "node/layer_range.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace meshnet::api {
namespace {

using nlohmann::json;
using testing::kKey;
using testing::SseEvents;
using testing::TestServer;
using Clock = std::chrono::steady_clock;

struct BadCase {
  std::string name;
  std::string path;
  std::string body;  // POST when non-empty, else GET
  int status;
  std::string param;  // expected error.param ("" = don't care)
  std::string code;   // expected error.code ("" = don't care)
  bool send_key = true;
};

const std::string kLongPrompt = [] {
  std::string s;
  for (int i = 0; i < 100; ++i) s += "Once upon a time ";
  return s;
}();

std::vector<BadCase> BadCases() {
  const std::string chat = "/v1/chat/completions";
  const std::string comp = "/v1/completions";
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  return {
      {"invalid json", chat, "{not json", 400, "", "invalid_json"},
      {"body not an object", chat, "[1,2]", 400},
      {"messages missing", chat, R"({"model":"stories260K"})", 400, "messages"},
      {"messages not an array", chat, R"({"messages":"hi"})", 400, "messages"},
      {"messages empty", chat, R"({"messages":[]})", 400, "messages"},
      {"message not an object", chat, R"({"messages":[3]})", 400, "messages[0]"},
      {"unknown role", chat, R"({"messages":[{"role":"bot","content":"x"}]})", 400,
       "messages[0].role"},
      {"content wrong type", chat, R"({"messages":[{"role":"user","content":5}]})", 400,
       "messages[0].content"},
      {"image content part", chat,
       R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})", 400,
       "messages[0].content"},
      {"negative temperature", chat, "{" + msgs + R"(,"temperature":-0.5})", 400, "temperature"},
      {"temperature as string", chat, "{" + msgs + R"(,"temperature":"hot"})", 400, "temperature"},
      {"max_tokens zero", chat, "{" + msgs + R"(,"max_tokens":0})", 400, "max_tokens"},
      {"max_tokens negative", comp, R"({"prompt":"a","max_tokens":-3})", 400, "max_tokens"},
      {"max_tokens fractional", comp, R"({"prompt":"a","max_tokens":1.5})", 400, "max_tokens"},
      {"max_completion_tokens zero", chat, "{" + msgs + R"(,"max_completion_tokens":0})", 400,
       "max_completion_tokens"},
      {"top_p zero", chat, "{" + msgs + R"(,"top_p":0})", 400, "top_p"},
      {"top_p above one", chat, "{" + msgs + R"(,"top_p":1.5})", 400, "top_p"},
      {"top_k negative", chat, "{" + msgs + R"(,"top_k":-1})", 400, "top_k"},
      {"n two", chat, "{" + msgs + R"(,"n":2})", 400, "n"},
      {"stop wrong type", chat, "{" + msgs + R"(,"stop":7})", 400, "stop"},
      {"stop empty string", chat, "{" + msgs + R"(,"stop":[""]})", 400, "stop"},
      {"stream not a bool", chat, "{" + msgs + R"(,"stream":"yes"})", 400, "stream"},
      {"stream_options without stream", chat,
       "{" + msgs + R"(,"stream_options":{"include_usage":true}})", 400, "stream_options"},
      {"prompt missing", comp, R"({"max_tokens":3})", 400, "prompt"},
      {"prompt wrong type", comp, R"({"prompt":{"a":1}})", 400, "prompt"},
      {"prompt token out of vocab", comp, R"({"prompt":[1,999999]})", 400, "prompt"},
      {"prompt past the context", comp, R"({"prompt":")" + kLongPrompt + R"("})", 400, "prompt",
       "context_length_exceeded"},
      {"chat past the context", chat,
       R"({"messages":[{"role":"user","content":")" + kLongPrompt + R"("}]})", 400, "messages",
       "context_length_exceeded"},
      {"unknown model", chat, R"({"model":"gpt-9",)" + msgs + "}", 404, "model", "model_not_found"},
      {"unknown model id", "/v1/models/gpt-9", "", 404, "model", "model_not_found"},
      {"unknown path", "/v1/nothing", "", 404, "", "not_found"},
      {"unknown post path", "/v1/embeddings", R"({"input":"x"})", 404, "", "not_found"},
      {"no api key", chat, "{" + msgs + "}", 401, "", "invalid_api_key", false},
      {"no api key on models", "/v1/models", "", 401, "", "invalid_api_key", false},
      {"body too large", chat, "{" + msgs + R"(,"user":")" + std::string(5000, 'x') + "\"}", 413,
       "", "request_too_large"},
      {"tokenize without content", "/tokenize", R"({"text":"x"})", 400, "content"},
      {"best_of two", comp, R"({"prompt":"a","best_of":2})", 400, "best_of"},
      {"echo", comp, R"({"prompt":"a","echo":true})", 400, "echo"},
      {"suffix", comp, R"({"prompt":"a","suffix":"b"})", 400, "suffix"},
      {"json mode", chat, "{" + msgs + R"(,"response_format":{"type":"json_object"}})", 400,
       "response_format"},
      {"logprobs above five", comp, R"({"prompt":"a","logprobs":6})", 400, "logprobs"},
      {"top_logprobs without logprobs", chat, "{" + msgs + R"(,"top_logprobs":2})", 400,
       "top_logprobs"},
      {"top_logprobs above twenty", chat, "{" + msgs + R"(,"logprobs":true,"top_logprobs":21})",
       400, "top_logprobs"},
      {"frequency_penalty above two", chat, "{" + msgs + R"(,"frequency_penalty":2.5})", 400,
       "frequency_penalty"},
      {"presence_penalty as string", chat, "{" + msgs + R"(,"presence_penalty":"x"})", 400,
       "presence_penalty"},
      {"logit_bias key not an id", comp, R"({"prompt":"a","logit_bias":{"x":1}})", 400,
       "logit_bias"},
      {"logit_bias outside the vocabulary", comp, R"({"prompt":"a","logit_bias":{"99999":1}})", 400,
       "logit_bias"},
      {"logit_bias above 100", comp, R"({"prompt":"a","logit_bias":{"5":101}})", 400, "logit_bias"},
      {"detokenize bad id", "/detokenize", R"({"tokens":[-1]})", 400, "tokens"},
      {"apply-template empty messages", "/apply-template", R"({"messages":[]})", 400, "messages"},
  };
}

TEST(ApiServer, EveryBadRequestGetsItsStatusAndAnErrorObject) {
  TestServer ts;
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(c.name);
    httplib::Client cli("127.0.0.1", ts.port);
    if (c.send_key) cli.set_bearer_token_auth(kKey);
    auto res = c.body.empty() ? cli.Get(c.path.c_str())
                              : cli.Post(c.path.c_str(), c.body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, c.status);
    const json j = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << res->body;
    ASSERT_TRUE(j.contains("error")) << res->body;
    const json& e = j["error"];
    EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty());
    EXPECT_TRUE(e["type"].is_string());
    EXPECT_TRUE(e.contains("param") && e.contains("code"));
    if (!c.param.empty()) EXPECT_EQ(e["param"], c.param) << res->body;
    if (!c.code.empty()) EXPECT_EQ(e["code"], c.code) << res->body;
  }
  // The server carries on.
  auto ok = ts.Client().Post("/v1/completions", R"({"prompt":"Once","max_tokens":2})",
                             "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST(ApiServer, FullQueueIs429WithRetryAfter) {
  TestServer ts(true, 64, /*max_concurrent=*/1, /*queue=*/0);
  ASSERT_EQ(ts.engine->admission().Acquire(), Admission::Outcome::kAdmitted);
  auto res = ts.Client().Post("/v1/completions", R"({"prompt":"a"})", "application/json");
  ts.engine->admission().Release();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429);
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "queue_full");
}

// A prompt is tokenized only once admitted: with every slot taken and no
// queue, a prompt too long for the context (in tokens, not in bytes) is a
// 429, not a 400 after tokenizing it (was: tokenized first, so 60 waiting
// 1 MB prompts held 1.5 GB). /tokenize has slots of its own.
TEST(ApiServer, PromptsAreTokenizedOnlyOnceAdmitted) {
  TestServer ts(true, 64, /*max_concurrent=*/1, /*queue=*/0);
  std::string words;
  for (int i = 0; i < 70; ++i) words += "a ";
  ASSERT_LT(ts.engine->MinTokens(words.size()), 64) << "must pass the byte bound";
  auto cli = ts.Client();
  const json body = {{"prompt", words}};
  auto free_slot = cli.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(free_slot);
  EXPECT_EQ(free_slot->status, 400);
  EXPECT_EQ(json::parse(free_slot->body)["error"]["code"], "context_length_exceeded");
  ASSERT_EQ(ts.engine->admission().Acquire(), Admission::Outcome::kAdmitted);
  auto taken = cli.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_EQ(ts.engine->text_admission().Acquire(), Admission::Outcome::kAdmitted);
  auto tokenize = cli.Post("/tokenize", R"({"content":"Once upon"})", "application/json");
  ts.engine->text_admission().Release();
  ts.engine->admission().Release();
  ASSERT_TRUE(taken && tokenize);
  EXPECT_EQ(taken->status, 429) << taken->body;
  EXPECT_EQ(tokenize->status, 429) << tokenize->body;
}

// MinTokens never overestimates: every text encodes to at least that many
// tokens (so refusing on it never refuses a prompt that fits).
TEST(ApiServer, MinTokensIsALowerBound) {
  TestServer ts;
  std::string mixed;
  for (int i = 0; i < 400; ++i) mixed += static_cast<char>(i % 2 ? ' ' : 'a' + i % 26);
  for (const std::string& text :
       {std::string(3000, ' '), std::string(3000, 'e'), mixed, kLongPrompt,
        std::string("h\xC3\xA9llo w\xC3\xB6rld \xE2\x96\x81\xE2\x96\x81 \xF0\x9F\x98\x80")}) {
    const auto ids = ts.engine->Tokenize(text, true, true);
    EXPECT_GE(static_cast<int64_t>(ids.size()), ts.engine->MinTokens(text.size())) << text;
  }
}

TEST(ApiServer, NoRouteIs503OnHealthAndCompletions) {
  TestServer ts(/*with_route=*/false);
  auto cli = ts.Client();
  auto health = cli.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  auto res = cli.Post("/v1/completions", R"({"prompt":"a"})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "route_unavailable");
}

TEST(ApiServer, StreamingChatFramingMatchesTheNonStreamedAnswer) {
  TestServer ts(true, 256);
  auto cli = ts.Client();
  const std::string req = R"({"messages":[{"role":"user","content":"Once upon a time"}],
      "temperature":0,"max_tokens":24)";
  auto plain = cli.Post("/v1/chat/completions", req + "}", "application/json");
  ASSERT_TRUE(plain);
  ASSERT_EQ(plain->status, 200) << plain->body;
  const json full = json::parse(plain->body);
  EXPECT_EQ(full["object"], "chat.completion");
  auto res = cli.Post("/v1/chat/completions",
                      req + R"(,"stream":true,"stream_options":{"include_usage":true}})",
                      "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  const std::vector<std::string> events = SseEvents(res->body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string content;
  for (size_t i = 1; i + 3 < events.size(); ++i) {  // role, content..., finish, usage, DONE
    const json c = json::parse(events[i]);
    EXPECT_EQ(c["id"], first["id"]);
    EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
    content += c["choices"][0]["delta"]["content"].get<std::string>();
  }
  const json finish = json::parse(events[events.size() - 3]);
  EXPECT_EQ(finish["choices"][0]["finish_reason"], full["choices"][0]["finish_reason"]);
  const json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"], full["usage"]);
  EXPECT_EQ(content, full["choices"][0]["message"]["content"]);
  EXPECT_EQ(ts.LiveSessions(), 0);
}

// Wraps a hop so the test decides how many steps may run: the server cannot
// run ahead of what the client has read, so "within one token" is exact.
class GatedHop final : public mesh::ShardEndpoint {
 public:
  explicit GatedHop(std::shared_ptr<mesh::ShardEndpoint> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  mesh::ShardInfo Info() override { return inner_->Info(); }
  mesh::StepResult Step(mesh::StepRequest request) override {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return permits_ > 0; });
      --permits_;
      ++steps_;
    }
    cv_.notify_all();  // AwaitSteps
    return inner_->Step(std::move(request));
  }
  void Release(const std::string& s, const std::string& secret, int64_t epoch) override {
    inner_->Release(s, secret, epoch);
  }
  void Allow(int n) {
    {
      std::lock_guard lock(mu_);
      permits_ += n;
    }
    cv_.notify_all();
  }
  int steps() {
    std::lock_guard lock(mu_);
    return steps_;
  }
  // Waits until `n` steps have passed the gate.
  void AwaitSteps(int n) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return steps_ >= n; });
  }

 private:
  std::shared_ptr<mesh::ShardEndpoint> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  int permits_ = 0;
  int steps_ = 0;
};

// A plain HTTP/1.1 client on a socket, so the test controls the hang-up.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{30, 0};  // bounds every read
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ok_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~RawClient() { Close(); }
  bool ok() const { return ok_; }
  int local_port() const {
    sockaddr_in addr{};
    socklen_t len = sizeof addr;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    return ntohs(addr.sin_port);
  }
  void Send(const std::string& s) { ASSERT_EQ(write(fd_, s.data(), s.size()), (ssize_t)s.size()); }
  // Reads until `n` SSE events (blank-line ends) have arrived in the body.
  int ReadEvents(int n) {
    std::string got;
    char buf[4096];
    for (;;) {
      const size_t body = got.find("\r\n\r\n");
      int events = 0;
      if (body != std::string::npos) {
        for (size_t p = got.find("data: ", body); p != std::string::npos;
             p = got.find("data: ", p + 1)) {
          if (got.find("\n\n", p) != std::string::npos) ++events;
        }
      }
      if (events >= n) return events;
      const ssize_t r = read(fd_, buf, sizeof buf);
      if (r <= 0) return events;
      got.append(buf, static_cast<size_t>(r));
    }
  }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
};

TEST(ApiServer, ClientDisconnectCancelsWithinATokenAndReleasesEveryHop) {
  TestServer ts(true, 512);
  // A second engine + server over a gated copy of the same route.
  mesh::Route route = ts.mesh->route();
  auto gate = std::make_shared<GatedHop>(route.hops[0]);
  route.hops[0] = gate;
  EngineOptions eo{"stories260K", 512, 2, 2};
  auto file = gguf::GgufFile::Open(std::string(MESHNET_SOURCE_DIR) + "/models/stories260K.gguf");
  Engine engine(
      model::Tokenizer::FromGguf(file), ChatFormatter(),
      [route] { return std::make_unique<mesh::FixedRouteProvider>(route); }, eo);
  ApiServer server(&engine, ServerOptions{});
  const int port = server.Bind("127.0.0.1", 0);
  std::thread serving([&] { server.Serve(); });

  const std::string body =
      R"({"prompt":"Once upon a time","temperature":0,"max_tokens":400,"stream":true})";
  RawClient client(port);
  ASSERT_TRUE(client.ok());
  client.Send(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body);
  gate->Allow(3);  // prefill + 2 decodes: 3 tokens
  EXPECT_EQ(client.ReadEvents(3), 3);
  client.Close();
  gate->Allow(1000);  // from now on the route would run to max_tokens
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(30);
  while (engine.admission().in_flight() > 0 && Clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_EQ(engine.admission().in_flight(), 0);
  EXPECT_LE(gate->steps(), 3 + 1) << "generation continued after the client left";
  EXPECT_EQ(ts.LiveSessions(), 0) << "KV released on every hop";
  engine.BeginShutdown(Clock::now());
  server.Stop();
  serving.join();
}

// Whether the client's hang-up has reached the server's end of the TCP
// connection server_port <-> client_port: that end is no longer ESTABLISHED
// (/proc/net/tcp state 01). It may be in CLOSE_WAIT, or already past it: the
// server's disconnect probe draws a reset from the closed client, which ends
// the socket (CLOSE, or gone from the table) within a round trip, so waiting
// for CLOSE_WAIT alone can miss it.
bool ServerSawHangUp(int server_port, int client_port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // the column names
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    auto port = [](const std::string& addr) {
      return std::stoi(addr.substr(addr.find(':') + 1), nullptr, 16);
    };
    if (port(local) == server_port && port(remote) == client_port) return state != "01";
  }
  return true;
}

// Sends a non-streamed request for 400 tokens on a gated copy of `ts`'s
// route, hangs up after 3 steps, then opens the gate: returns the steps run.
int StepsAfterHangUp(TestServer& ts, const std::string& path, const std::string& body) {
  mesh::Route route = ts.mesh->route();
  auto gate = std::make_shared<GatedHop>(route.hops[0]);
  route.hops[0] = gate;
  EngineOptions eo{"stories260K", 512, 2, 2};
  auto file = gguf::GgufFile::Open(std::string(MESHNET_SOURCE_DIR) + "/models/stories260K.gguf");
  Engine engine(
      model::Tokenizer::FromGguf(file), ChatFormatter(),
      [route] { return std::make_unique<mesh::FixedRouteProvider>(route); }, eo);
  ApiServer server(&engine, ServerOptions{});
  const int port = server.Bind("127.0.0.1", 0);
  std::thread serving([&] { server.Serve(); });
  RawClient client(port);
  EXPECT_TRUE(client.ok());
  client.Send("POST " + path +
              " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
              std::to_string(body.size()) + "\r\n\r\n" + body);
  gate->Allow(3);  // prefill + 2 decodes
  gate->AwaitSteps(3);
  // The server's end of this connection, to see when the hang-up reaches it.
  const int client_port = client.local_port();
  client.Close();
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(30);
  while (!ServerSawHangUp(port, client_port) && Clock::now() < deadline) {
    std::this_thread::yield();  // the kernel delivers the FIN asynchronously
  }
  EXPECT_TRUE(ServerSawHangUp(port, client_port));
  gate->Allow(1000);  // from now on the route would run to max_tokens
  while (engine.admission().in_flight() > 0 && Clock::now() < deadline) {
    std::this_thread::yield();  // polling the engine's own count: the handler sends nothing
  }
  EXPECT_EQ(engine.admission().in_flight(), 0) << path;
  engine.BeginShutdown(Clock::now());
  server.Stop();
  serving.join();
  return gate->steps();
}

// A non-streamed completion whose client hangs up stops within a token and
// releases its KV on every hop (was: it ran to max_tokens, 400 steps).
TEST(ApiServer, ClientDisconnectCancelsANonStreamedCompletion) {
  TestServer ts(true, 512);
  EXPECT_LE(StepsAfterHangUp(ts, "/v1/completions",
                             R"({"prompt":"Once upon a time","temperature":0,"max_tokens":400})"),
            3 + 1);
  EXPECT_EQ(ts.LiveSessions(), 0) << "KV released on every hop";
  EXPECT_LE(StepsAfterHangUp(ts, "/v1/chat/completions",
                             R"({"messages":[{"role":"user","content":"Hi"}],"temperature":0,)"
                             R"("max_tokens":400})"),
            3 + 1);
  EXPECT_EQ(ts.LiveSessions(), 0) << "KV released on every hop";
}

TEST(ApiServer, StopSequenceIsNotEmittedAndFinishesWithStop) {
  TestServer ts(true, 256);
  auto cli = ts.Client();
  auto base = cli.Post("/v1/completions",
                       R"({"prompt":"Once upon a time","temperature":0,"max_tokens":32})",
                       "application/json");
  ASSERT_TRUE(base);
  const std::string text = json::parse(base->body)["choices"][0]["text"];
  ASSERT_GT(text.size(), 12u);
  const std::string stop = text.substr(8, 4);  // somewhere inside the greedy answer
  const json body = {
      {"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 32}, {"stop", {stop}}};
  auto res = cli.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  const json j = json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

}  // namespace
}  // namespace meshnet::api
