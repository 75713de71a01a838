// meshnet api vs the generation loop it wraps, each on an in-process route
// of 3 shards, on two models:
//   tiny: the shipped stories260K (~0.35 ms of compute per token), which
//     shows the API's fixed per-token overhead;
//   real: a generated model of real shape (768-dim, 12 layers, Q8_0, the
//     shipped tokenizer; what `meshnet make-model` writes), written to a
//     temporary directory on first use and removed at exit.
//   BM_ApiVsGenerate/<model>: one client; each iteration runs the same greedy
//     generation once through mesh::Generate (what `meshnet generate` runs)
//     and once as a streamed /v1/completions request; reports both tokens/s
//     and api_over_generate (goal >= 0.95).
//   BM_ApiStreaming/<model>/N: N concurrent streaming clients; time to first
//     token and inter-token latency p50/p99 as the clients see them, beside
//     aggregate tokens/s.
//   BM_MultiTurn/N: N concurrent 10-turn conversations on the real model
//     (context 4096), each turn the whole conversation so far plus ~120 new
//     words, 32 tokens generated, streamed; once with --prefix-cache 16 and
//     once without, in the same run. Reports TTFT of turn 1 and turn 10 on
//     each side, turn10_over_turn1 (goal <= 1.2 with the cache) and
//     nocache_over_cache at turn 10.
#include <benchmark/benchmark.h>
#include <httplib.h>
#include <stdlib.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "api/engine.h"
#include "api/server.h"
#include "bench_util.h"
#include "gguf/gguf_reader.h"
#include "gguf/make_model.h"
#include "mesh/in_process.h"
#include "model/hparams.h"
#include "node/layer_range.h"
#include "util/thread_pool.h"

namespace {

using Clock = std::chrono::steady_clock;
using meshnet::api::ApiServer;
using meshnet::api::Engine;
namespace mesh = meshnet::mesh;
namespace node = meshnet::node;

const char* kPrompt = "Once upon a time";

double Secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// CPU seconds of the whole process (server, client and compute threads).
double ProcessCpu() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

struct ModelSpec {
  std::string path;
  std::string name;
  int sessions = 0;  // KV sessions and API concurrency (`--max-concurrent`)
  int64_t ctx = 512;
  int kept = 0;  // --prefix-cache
};

// One server per model for the whole binary.
struct Fixture {
  explicit Fixture(const ModelSpec& spec) {
    file =
        std::make_shared<const meshnet::gguf::GgufFile>(meshnet::gguf::GgufFile::Open(spec.path));
    const int n_layers = meshnet::model::LlamaHParams::FromGguf(*file).n_layers;
    mesh::InProcessMeshOptions mo;
    mo.split = meshnet::node::EvenSplit(3, n_layers);
    mo.kv_config.max_sessions = spec.sessions;
    if (spec.ctx > 512) mo.kv_config.budget_bytes = int64_t{1} << 30;  // 8 long conversations
    mesh = std::make_unique<mesh::InProcessMesh>(file, mo, &pool);
    meshnet::api::EngineOptions eo{spec.name, spec.ctx, spec.sessions, 64};
    eo.prefix_cache_sessions = spec.kept;
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

Fixture& Tiny() {
  static Fixture f({MESHNET_SHIPPED_MODEL, "stories260K", 32});  // as --max-concurrent 32
  return f;
}

// 768-dim, 12 layers, Q8_0 with the shipped tokenizer.
Fixture& Real() {
  static meshnet::bench::TempDir dir("api_bench");  // constructed before `f`, so destroyed after it
  static Fixture f(
      {meshnet::bench::MakeLlama768(dir.path, "llama768-q8_0", meshnet::GgmlType::kQ8_0, 1024,
                                    MESHNET_SHIPPED_MODEL),
       "llama768-q8_0", 8});
  return f;
}

// 768-dim, 12 layers, Q8_0, context 4096: multi-turn conversations, with
// and without the prefix cache (one file for both).
const std::string& Llama768Long() {
  static meshnet::bench::TempDir dir("api_bench_long");
  static const std::string path = meshnet::bench::MakeLlama768(
      dir.path, "llama768-long", meshnet::GgmlType::kQ8_0, 4096, MESHNET_SHIPPED_MODEL);
  return path;
}
Fixture& LongCached() {
  static Fixture f({Llama768Long(), "llama768-long", 8, 4096, 16});
  return f;
}
Fixture& LongPlain() {
  static Fixture f({Llama768Long(), "llama768-long", 8, 4096, 0});
  return f;
}

struct StreamTimes {
  double ttft = 0;
  std::vector<double> gaps;
  int tokens = 0;
};

// One streamed completion; times are taken as the content events arrive.
// `text`, if set, gets the completion's text.
StreamTimes StreamOnce(int port, const std::string& prompt, int max_tokens,
                       std::string* text = nullptr) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(300, 0);
  cli.set_tcp_nodelay(true);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = nlohmann::json{{"prompt", prompt},
                            {"temperature", 0},
                            {"max_tokens", max_tokens},
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
      if (text != nullptr)
        *text += nlohmann::json::parse(ev)["choices"][0]["text"].get<std::string>();
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

// `state.range(0)`: tokens per generation.
void BM_ApiVsGenerate(benchmark::State& state, Fixture& (*model)()) {
  Fixture& f = model();
  const int tokens = static_cast<int>(state.range(0));
  const auto prompt_ids = f.engine->Tokenize(kPrompt, true, /*parse_special=*/false);
  mesh::GenerateOptions options;
  options.max_tokens = tokens;
  options.eos_id = f.engine->tokenizer().eos_id();
  // Each side's wall and CPU seconds and tokens, accumulated.
  struct Side {
    double wall = 0, cpu = 0;
    int64_t tokens = 0;
  } gen, api;
  auto timed = [](Side& side, const auto& run) {
    const double c0 = ProcessCpu();
    const Clock::time_point t0 = Clock::now();
    side.tokens += run();
    side.wall += Secs(Clock::now() - t0);
    side.cpu += ProcessCpu() - c0;
  };
  auto run_gen = [&] {
    mesh::FixedRouteProvider p(f.mesh->route());
    return static_cast<int64_t>(mesh::Generate(p, prompt_ids, options).generated_ids.size());
  };
  auto run_api = [&] { return static_cast<int64_t>(StreamOnce(f.port, kPrompt, tokens).tokens); };
  // Untimed warm-up of both paths: the first pass pages the model in.
  run_gen();
  run_api();
  bool gen_first = true;  // alternated, so drift in machine load hits both sides alike
  for (auto _ : state) {
    if (gen_first) timed(gen, run_gen);
    timed(api, run_api);
    if (!gen_first) timed(gen, run_gen);
    gen_first = !gen_first;
  }
  const double gen_tps = gen.tokens / gen.wall, api_tps = api.tokens / api.wall;
  state.counters["generate_tok_s"] = gen_tps;
  state.counters["api_tok_s"] = api_tps;
  state.counters["api_over_generate"] = api_tps / gen_tps;
  // Tokens per CPU-second, API (server + client) over generate: insensitive
  // to how busy the machine is.
  state.counters["cpu_ratio"] = (api.tokens / api.cpu) / (gen.tokens / gen.cpu);
}
BENCHMARK_CAPTURE(BM_ApiVsGenerate, tiny, &Tiny)
    ->Arg(128)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(3.0);
// ~1 s per generation at 60 tok/s: a fixed count keeps the run short.
BENCHMARK_CAPTURE(BM_ApiVsGenerate, real, &Real)
    ->Arg(64)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(6);

// `state.range(0)`: concurrent clients, `state.range(1)`: tokens per request.
void BM_ApiStreaming(benchmark::State& state, Fixture& (*model)()) {
  Fixture& f = model();
  const int clients = static_cast<int>(state.range(0));
  const int max_tokens = static_cast<int>(state.range(1));
  std::vector<double> ttft, gaps;
  int64_t tokens = 0;
  double wall = 0;
  for (auto _ : state) {
    std::vector<StreamTimes> got(clients);
    std::vector<std::thread> threads;
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < clients; ++i) {
      threads.emplace_back([&, i] {
        got[i] = StreamOnce(f.port, std::string(kPrompt) + " " + std::to_string(i), max_tokens);
      });
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
BENCHMARK_CAPTURE(BM_ApiStreaming, tiny, &Tiny)
    ->Args({1, 128})
    ->Args({8, 128})
    ->Args({32, 128})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_ApiStreaming, real, &Real)
    ->Args({1, 64})
    ->Args({8, 32})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(2);

// ~120 words of turn `turn` of conversation `c`.
std::string NewWords(int c, int turn) {
  static const char* kWords[] = {"the",  "little", "girl", "found",  "a",   "red",
                                 "ball", "in",     "her",  "garden", "and", "she",
                                 "ran",  "to",     "show", "mom",    "it",  "was"};
  std::string out = "\nTurn " + std::to_string(turn) + " of " + std::to_string(c) + ":";
  for (int i = 0; i < 120; ++i) out += std::string(" ") + kWords[(i * 7 + turn * 5 + c) % 18];
  return out;
}

// The TTFT of each of 10 turns (averaged over the conversations).
std::vector<double> TenTurns(Fixture& f, int conversations) {
  std::vector<std::vector<double>> ttft(conversations, std::vector<double>(10));
  std::vector<std::thread> threads;
  for (int c = 0; c < conversations; ++c) {
    threads.emplace_back([&, c] {
      std::string chat;
      for (int turn = 0; turn < 10; ++turn) {
        chat += NewWords(c, turn) + "\nAnswer:";
        std::string answer;
        ttft[c][turn] = StreamOnce(f.port, chat, 32, &answer).ttft;
        chat += answer;
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<double> mean(10, 0);
  for (const auto& conv : ttft) {
    for (int t = 0; t < 10; ++t) mean[t] += conv[t] / conversations;
  }
  return mean;
}

// `state.range(0)`: concurrent conversations.
void BM_MultiTurn(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  std::vector<double> cached(10, 0), plain(10, 0);
  int rounds = 0;
  for (auto _ : state) {
    const std::vector<double> a = TenTurns(LongPlain(), n);
    const std::vector<double> b = TenTurns(LongCached(), n);
    for (int t = 0; t < 10; ++t) {
      plain[t] += a[t];
      cached[t] += b[t];
    }
    ++rounds;
  }
  state.counters["cache_turn1_ms"] = 1e3 * cached[0] / rounds;
  state.counters["cache_turn10_ms"] = 1e3 * cached[9] / rounds;
  state.counters["nocache_turn1_ms"] = 1e3 * plain[0] / rounds;
  state.counters["nocache_turn10_ms"] = 1e3 * plain[9] / rounds;
  state.counters["cache_turn10_over_turn1"] = cached[9] / cached[0];
  state.counters["nocache_turn10_over_turn1"] = plain[9] / plain[0];
  state.counters["nocache_over_cache_turn10"] = plain[9] / cached[9];
}
BENCHMARK(BM_MultiTurn)
    ->Arg(1)
    ->Arg(4)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
