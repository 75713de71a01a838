// meshnet api vs the generation loop it wraps, on the shipped model's
// in-process route (3 shards):
//   BM_ApiVsGenerate: one client; each iteration runs the same greedy
//     generation once through mesh::Generate (what `meshnet generate` runs)
//     and once as a streamed /v1/completions request; reports both tokens/s
//     and api_over_generate (goal >= 0.95).
//   BM_ApiStreaming/N: N concurrent streaming clients; time to first token and
//     inter-token latency p50/p99 as the clients see them, beside aggregate
//     tokens/s.
#include <benchmark/benchmark.h>
#include <httplib.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "api/engine.h"
#include "api/server.h"
#include "gguf/gguf_reader.h"
#include "mesh/in_process.h"
#include "node/layer_range.h"
#include "util/thread_pool.h"

namespace {

using Clock = std::chrono::steady_clock;
using meshnet::api::ApiServer;
using meshnet::api::Engine;
namespace mesh = meshnet::mesh;
namespace node = meshnet::node;

constexpr int kTokens = 128;
const char* kPrompt = "Once upon a time";

double Secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// CPU seconds of the whole process (server, client and compute threads).
double ProcessCpu() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// One server for the whole binary.
struct Fixture {
  Fixture() {
    file = std::make_shared<const meshnet::gguf::GgufFile>(
        meshnet::gguf::GgufFile::Open(MESHNET_SHIPPED_MODEL));
    mesh::InProcessMeshOptions mo;
    mo.split = node::EvenSplit(3, 5);
    mo.kv_config.max_sessions = 32;  // as `meshnet api --max-concurrent 32`
    mesh = std::make_unique<mesh::InProcessMesh>(file, mo, &pool);
    meshnet::api::EngineOptions eo{"stories260K", 512, 32, 64};
    engine = std::make_unique<Engine>(
        meshnet::model::Tokenizer::FromGguf(*file), meshnet::api::ChatFormatter(),
        [m = mesh.get()] { return std::make_unique<mesh::FixedRouteProvider>(m->route()); }, eo);
    meshnet::api::ServerOptions so;
    so.worker_threads = 48;
    server = std::make_unique<ApiServer>(engine.get(), so);
    port = server->Bind("127.0.0.1", 0);
    thread = std::thread([this] { server->Serve(); });
  }
  ~Fixture() {
    engine->BeginShutdown(Clock::now());
    server->Stop();
    thread.join();
  }
  std::shared_ptr<const meshnet::gguf::GgufFile> file;
  meshnet::ThreadPool pool{1};
  std::unique_ptr<mesh::InProcessMesh> mesh;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<ApiServer> server;
  std::thread thread;
  int port = 0;
};

Fixture& F() {
  static Fixture f;
  return f;
}

struct StreamTimes {
  double ttft = 0;
  std::vector<double> gaps;
  int tokens = 0;
};

// One streamed completion; times are taken as the content events arrive.
StreamTimes StreamOnce(int port, const std::string& prompt) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(300, 0);
  cli.set_tcp_nodelay(true);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = nlohmann::json{{"prompt", prompt},
                            {"temperature", 0},
                            {"max_tokens", kTokens},
                            {"stream", true},
                            {"stream_options", {{"include_usage", true}}}}
                 .dump();
  StreamTimes t;
  std::string buf;
  const Clock::time_point start = Clock::now();
  Clock::time_point last = start;
  bool first = true;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buf.append(data, len);
    size_t cut;
    while ((cut = buf.find("\n\n")) != std::string::npos) {
      if (buf.compare(0, 6, "data: ") != 0) throw std::runtime_error("not SSE: " + buf);
      const std::string ev = buf.substr(6, cut - 6);
      buf.erase(0, cut + 2);
      if (ev == "[DONE]") continue;
      // Only the usage chunk is parsed: the client stays light.
      if (ev.rfind("{\"choices\":[],", 0) == 0) {
        t.tokens = nlohmann::json::parse(ev)["usage"]["completion_tokens"];
        continue;
      }
      if (ev.find("\"error\":") != std::string::npos) throw std::runtime_error("error: " + ev);
      if (ev.find("\"finish_reason\":null") == std::string::npos) continue;
      const Clock::time_point now = Clock::now();
      if (first) {
        t.ttft = Secs(now - start);
        first = false;
      } else {
        t.gaps.push_back(Secs(now - last));
      }
      last = now;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err;
  if (!cli.send(req, res, err)) throw std::runtime_error("request failed");
  if (res.status != 200) throw std::runtime_error("HTTP " + std::to_string(res.status));
  return t;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

void BM_ApiVsGenerate(benchmark::State& state) {
  Fixture& f = F();
  const auto prompt_ids = f.engine->Tokenize(kPrompt, true, false);
  mesh::GenerateOptions options;
  options.max_tokens = kTokens;
  options.eos_id = f.engine->tokenizer().eos_id();
  double gen_s = 0, api_s = 0, gen_cpu = 0, api_cpu = 0;
  int64_t gen_tokens = 0, api_tokens = 0;
  for (auto _ : state) {
    const double c0 = ProcessCpu();
    Clock::time_point t0 = Clock::now();
    mesh::FixedRouteProvider p(f.mesh->route());
    gen_tokens += mesh::Generate(p, prompt_ids, options).generated_ids.size();
    Clock::time_point t1 = Clock::now();
    const double c1 = ProcessCpu();
    api_tokens += StreamOnce(f.port, kPrompt).tokens;
    Clock::time_point t2 = Clock::now();
    const double c2 = ProcessCpu();
    gen_s += Secs(t1 - t0);
    api_s += Secs(t2 - t1);
    gen_cpu += c1 - c0;
    api_cpu += c2 - c1;
  }
  const double gen_tps = gen_tokens / gen_s, api_tps = api_tokens / api_s;
  state.counters["generate_tok_s"] = gen_tps;
  state.counters["api_tok_s"] = api_tps;
  state.counters["api_over_generate"] = api_tps / gen_tps;
  // Tokens per CPU-second, API (server + client) over generate: insensitive
  // to how busy the machine is.
  state.counters["cpu_ratio"] = (api_tokens / api_cpu) / (gen_tokens / gen_cpu);
}
BENCHMARK(BM_ApiVsGenerate)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);

void BM_ApiStreaming(benchmark::State& state) {
  Fixture& f = F();
  const int clients = static_cast<int>(state.range(0));
  std::vector<double> ttft, gaps;
  int64_t tokens = 0;
  double wall = 0;
  for (auto _ : state) {
    std::vector<StreamTimes> got(clients);
    std::vector<std::thread> threads;
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < clients; ++i) {
      threads.emplace_back(
          [&, i] { got[i] = StreamOnce(f.port, std::string(kPrompt) + " " + std::to_string(i)); });
    }
    for (auto& t : threads) t.join();
    wall += Secs(Clock::now() - t0);
    for (const auto& g : got) {
      ttft.push_back(g.ttft);
      gaps.insert(gaps.end(), g.gaps.begin(), g.gaps.end());
      tokens += g.tokens;
    }
  }
  state.counters["ttft_p50_ms"] = 1e3 * Percentile(ttft, 0.5);
  state.counters["ttft_p99_ms"] = 1e3 * Percentile(ttft, 0.99);
  state.counters["itl_p50_ms"] = 1e3 * Percentile(gaps, 0.5);
  state.counters["itl_p99_ms"] = 1e3 * Percentile(gaps, 0.99);
  state.counters["aggregate_tok_s"] = tokens / wall;
}
BENCHMARK(BM_ApiStreaming)
    ->Arg(1)
    ->Arg(8)
    ->Arg(32)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);

}  // namespace

BENCHMARK_MAIN();
