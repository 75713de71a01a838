// rpc_bench: what the network costs.
//
//  * BM_Mesh768: a 768-dim, 12-layer random model (meshnet make-model, written
//    to a temp dir) split 0-3 / 4-7 / 8-11. Each iteration generates the same
//    tokens through three in-process shards and through three `meshnet serve`
//    nodes on loopback; counters: tokens/s of each, ratio = remote / in-process
//    (target >= 0.8), and the per-hop overhead in microseconds
//    ((remote - in-process) time per token / 3 hops).
//  * BM_Transport: decode steps on one whole-model node of the tiny shipped
//    model (compute ~ tens of us, so transport dominates), unary Step calls vs
//    one bidirectional stream per session, alternated in the same iterations,
//    against the same steps in-process. Justifies unary (see proto).
//
// Nodes run with --threads 1 and the in-process baseline with a 1-thread pool.
#include <benchmark/benchmark.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

#include "bench_util.h"
#include "gguf/gguf_reader.h"
#include "mesh/generator.h"
#include "mesh/in_process.h"
#include "node/identity.h"
#include "rpc/remote.h"
#include "rpc/test_util.h"
#include "tests/rpc/node_process.h"
#include "util/thread_pool.h"

namespace meshnet {
namespace {

using Clock = std::chrono::steady_clock;
using rpc::testing::NodeProcess;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

using bench::ProcessCpuSeconds;
using bench::SelfCpuSeconds;

struct Mesh768 {
  rpc::testing::ScratchDir dir;
  std::string model;
  std::vector<std::unique_ptr<NodeProcess>> nodes;
  ThreadPool pool{1};
  std::unique_ptr<mesh::InProcessMesh> local;
  std::unique_ptr<rpc::RemoteRouteProvider> remote;

  Mesh768() {
    model = dir.file("m768.gguf");
    const std::string cmd = std::string(MESHNET_BINARY) + " make-model --out " + model +
                            " --n-embd 768 --n-layers 12 --n-heads 12 --n-kv-heads 12"
                            " --n-ff 2048 --tokenizer-from " MESHNET_SHIPPED_MODEL " >/dev/null";
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("make-model failed: " + cmd);
    std::vector<std::string> addrs;
    for (const char* layers : {"0-3", "4-7", "8-11"}) {
      nodes.push_back(std::make_unique<NodeProcess>(
          MESHNET_BINARY,
          std::vector<std::string>{"--model", model, "--layers", layers, "--listen", "127.0.0.1:0",
                                   "--threads", "1", "--kv-budget", "256MiB", "--log-level", "warn",
                                   "--metrics-listen", "127.0.0.1:0"},
          dir.file(std::string("node-") + layers + ".log"), /*expect_metrics=*/true));
      addrs.push_back(nodes.back()->address());
    }
    auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(model));
    mesh::InProcessMeshOptions mo;
    mo.split = {{0, 3}, {4, 7}, {8, 11}};
    mo.kv_config.budget_bytes = 256 << 20;
    local = std::make_unique<mesh::InProcessMesh>(file, mo, &pool);
    remote = rpc::MakeRemoteRouteProvider(addrs, rpc::ClientOptions{});
  }
};

double NodesCpuSeconds(const struct Mesh768& f);

// Seconds the nodes spent inside Step handlers (the step latency histogram's
// sum, scraped from /metrics), summed over the nodes.
double NodeStepSeconds(const Mesh768& f) {
  double sum = 0;
  for (const auto& n : f.nodes) {
    sum += rpc::testing::MetricValue(rpc::testing::HttpGet(n->metrics_address(), "/metrics"),
                                     "meshnet_step_latency_seconds_sum");
  }
  return sum;
}

double NodesCpuSeconds(const Mesh768& f) {
  double sum = 0;
  for (const auto& n : f.nodes) sum += ProcessCpuSeconds(n->pid());
  return sum;
}

void BM_Mesh768(benchmark::State& state) {
  static Mesh768 f;
  const int n = static_cast<int>(state.range(0));
  const std::vector<int32_t> prompt = {1, 403, 407, 261};
  mesh::GenerateOptions o;
  o.max_tokens = n;
  mesh::FixedRouteProvider local(f.local->route());
  double t_local = 0, t_remote = 0;
  int64_t tokens = 0;
  bool same = true;
  double t_nodes = 0, cpu_local = 0, cpu_remote = 0;
  for (auto _ : state) {
    const double cpu_a = SelfCpuSeconds();
    const auto a = Clock::now();
    const auto want = mesh::Generate(local, prompt, o).generated_ids;
    const auto b = Clock::now();
    cpu_local += SelfCpuSeconds() - cpu_a;
    state.PauseTiming();
    const double before = NodeStepSeconds(f);
    const double nodes_cpu_before = NodesCpuSeconds(f);
    const double cpu_b = SelfCpuSeconds();
    state.ResumeTiming();
    const auto b2 = Clock::now();
    const auto got = mesh::Generate(*f.remote, prompt, o).generated_ids;
    const auto c = Clock::now();
    state.PauseTiming();
    cpu_remote += SelfCpuSeconds() - cpu_b + NodesCpuSeconds(f) - nodes_cpu_before;
    t_nodes += NodeStepSeconds(f) - before;
    state.ResumeTiming();
    same = same && want == got;
    t_local += Seconds(a, b);
    t_remote += Seconds(b2, c);
    tokens += n;
  }
  if (!same) state.SkipWithError("remote tokens differ from in-process tokens");
  state.counters["inproc_tok_s"] = static_cast<double>(tokens) / t_local;
  state.counters["remote_tok_s"] = static_cast<double>(tokens) / t_remote;
  state.counters["ratio"] = t_local / t_remote;
  state.counters["per_hop_overhead_us"] =
      (t_remote - t_local) / static_cast<double>(tokens) / 3 * 1e6;
  // Split of the remote time: inside the nodes' Step handlers vs the rest
  // (network, client encode/decode, planning, scheduling).
  state.counters["node_step_us_per_hop"] = t_nodes / static_cast<double>(tokens) / 3 * 1e6;
  state.counters["outside_nodes_us_per_hop"] =
      (t_remote - t_nodes) / static_cast<double>(tokens) / 3 * 1e6;
  // The same comparison in CPU time (client + nodes vs the in-process run):
  // insensitive to how a busy machine schedules sleeping vs busy processes.
  state.counters["cpu_ratio"] = cpu_local / cpu_remote;
  state.counters["cpu_overhead_us_per_hop"] =
      (cpu_remote - cpu_local) / static_cast<double>(tokens) / 3 * 1e6;
}
BENCHMARK(BM_Mesh768)->Arg(128)->Iterations(4)->Unit(benchmark::kMillisecond)->UseRealTime();

struct TinyNode {
  rpc::testing::ScratchDir dir;
  std::unique_ptr<NodeProcess> node;
  std::unique_ptr<rpc::RemoteEndpoint> endpoint;
  std::unique_ptr<mesh::InProcessMesh> local;

  TinyNode() {
    node = std::make_unique<NodeProcess>(
        MESHNET_BINARY,
        std::vector<std::string>{"--model", MESHNET_SHIPPED_MODEL, "--layers", "0-4", "--listen",
                                 "127.0.0.1:0", "--threads", "1", "--log-level", "warn"},
        dir.file("tiny.log"));
    endpoint = std::make_unique<rpc::RemoteEndpoint>(node->address(), rpc::ClientOptions{});
    auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(MESHNET_SHIPPED_MODEL));
    local = std::make_unique<mesh::InProcessMesh>(file, mesh::InProcessMeshOptions{}, nullptr);
  }
};

constexpr char kSecret[] = "bench";

// Prefill + `n` greedy decode steps of session `id` on one endpoint; returns
// the decode time.
template <typename StepFn>
double DecodeSession(StepFn&& step, const std::string& id, int n) {
  mesh::StepRequest r;
  r.session_id = id;
  r.session_secret = kSecret;
  r.step_id = 1;
  r.prefill = true;
  r.token_ids = {1, 403, 407, 261};
  int64_t len = 4;
  int32_t tok = std::get<shard::TailOutput>(step(r)).token_id;
  const auto a = Clock::now();
  for (int i = 0; i < n; ++i) {
    r.prefill = false;
    r.step_id += 1;
    r.expected_seq_len = len;
    r.token_ids = {tok};
    tok = std::get<shard::TailOutput>(step(r)).token_id;
    ++len;
  }
  return Seconds(a, Clock::now());
}

// Prefill + `n` decode steps of a new session on `endpoint`, then its
// Release (a node holds --max-sessions live sessions; new ones wait for a slot).
double DecodeAndRelease(mesh::ShardEndpoint& endpoint, int n) {
  const std::string id = node::RandomId128();
  const double t =
      DecodeSession([&](const mesh::StepRequest& r) { return endpoint.Step(r); }, id, n);
  endpoint.Release(id, kSecret, 0);
  return t;
}

void BM_Transport(benchmark::State& state) {
  static TinyNode f;
  const int n = static_cast<int>(state.range(0));
  double t_unary = 0, t_stream = 0, t_local = 0;
  int64_t steps = 0;
  for (auto _ : state) {
    auto& local_ep = *f.local->endpoint(0);
    t_local += DecodeAndRelease(local_ep, n);
    t_unary += DecodeAndRelease(*f.endpoint, n);
    const std::string id = node::RandomId128();
    auto stream = f.endpoint->OpenStepStream(n + 1);
    t_stream += DecodeSession([&](const mesh::StepRequest& r) { return stream->Step(r); }, id, n);
    stream->Close();
    f.endpoint->Release(id, kSecret, 0);
    steps += n;
  }
  const double s = static_cast<double>(steps);
  state.counters["inproc_us_per_step"] = t_local / s * 1e6;
  state.counters["unary_us_per_step"] = t_unary / s * 1e6;
  state.counters["stream_us_per_step"] = t_stream / s * 1e6;
  state.counters["unary_overhead_us"] = (t_unary - t_local) / s * 1e6;
  state.counters["stream_overhead_us"] = (t_stream - t_local) / s * 1e6;
  state.counters["stream_over_unary"] = t_stream / t_unary;
}
BENCHMARK(BM_Transport)->Arg(200)->Iterations(5)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace meshnet

BENCHMARK_MAIN();
