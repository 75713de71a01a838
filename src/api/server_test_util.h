// Test helper (tests only): the API server on 127.0.0.1:0 over the shipped
// model's in-process mesh, with an API key and small limits, and an SSE
// body splitter.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "api/engine.h"
#include "api/server.h"
#include "gguf/gguf_reader.h"
#include "mesh/in_process.h"
#include "node/layer_range.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace meshnet::api::testing {

using Clock = std::chrono::steady_clock;

inline constexpr char kKey[] = "test-key";

// A provider with no route at all.
class NoRoute final : public mesh::RouteProvider {
 public:
  mesh::Route Plan() override { throw Error(ErrorKind::kUnavailable, "no nodes answer"); }
  void MarkDead(const mesh::ShardEndpoint&) override {}
};

struct TestServer {
  explicit TestServer(bool with_route = true, int64_t ctx = 64, int max_concurrent = 4,
                      int queue = 4) {
    auto file = std::make_shared<const gguf::GgufFile>(
        gguf::GgufFile::Open(std::string(MESHNET_SOURCE_DIR) + "/models/stories260K.gguf"));
    mesh::InProcessMeshOptions mo;
    mo.split = node::EvenSplit(3, 5);
    mesh = std::make_unique<mesh::InProcessMesh>(file, mo, &pool);
    ProviderFactory factory;
    if (with_route) {
      factory = [m = mesh.get()] { return std::make_unique<mesh::FixedRouteProvider>(m->route()); };
    } else {
      factory = [] { return std::make_unique<NoRoute>(); };
    }
    EngineOptions eo{"stories260K", ctx, max_concurrent, queue};
    engine =
        std::make_unique<Engine>(model::Tokenizer::FromGguf(*file), ChatFormatter(), factory, eo);
    ServerOptions so;
    so.api_key = kKey;
    so.max_body_bytes = 4096;
    so.worker_threads = max_concurrent + queue + 4;
    server = std::make_unique<ApiServer>(engine.get(), so);
    port = server->Bind("127.0.0.1", 0);
    thread = std::thread([this] { server->Serve(); });
  }
  ~TestServer() {
    engine->BeginShutdown(Clock::now());
    server->Stop();
    thread.join();
  }
  httplib::Client Client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_bearer_token_auth(kKey);
    c.set_read_timeout(60, 0);
    return c;
  }
  int64_t LiveSessions() {
    int64_t n = 0;
    for (int i = 0; i < mesh->num_shards(); ++i) n += mesh->manager(i).Stats().live_sessions;
    return n;
  }

  ThreadPool pool{1};
  std::unique_ptr<mesh::InProcessMesh> mesh;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<ApiServer> server;
  std::thread thread;
  int port = 0;
};

// Splits an SSE body into the data payloads of its events, checking framing.
inline std::vector<std::string> SseEvents(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event at " << pos;
    if (end == std::string::npos) break;
    const std::string event = body.substr(pos, end - pos);
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    EXPECT_EQ(event.find('\n'), std::string::npos) << "one data line per event";
    out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

}  // namespace meshnet::api::testing
