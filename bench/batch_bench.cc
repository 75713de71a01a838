// Node-level continuous batching (node/batcher.h) on a generated 768-dim
// Llama (12 layers, 12 heads, n_ff 2048, stories260K's 512-token vocab) in
// F32, Q8_0 and Q4_K, one node holding every layer:
//   * BM_Decode/<type>/<sessions>: aggregate decode tokens/s of 1, 4, 16 and
//     64 sessions stepping the node at once (each: a 16-token prompt, then
//     kDecode greedy tokens; only the decode phase is timed), with the ratio
//     to the 1-session run of the same type in this run (`x_vs_1`, goal >= 6
//     at 16) and the p50/p99 inter-token latency (ms) with its ratio to 1
//     session's (`p50_vs_1`, `p99_vs_1`, goal <= 3 at 16);
//   * BM_DecodeUnbatched/<type>/16: the same with --max-batch-sessions 1;
//   * BM_LoneSession/<type>: one session's decode through the scheduler
//     (Node::Step) vs the step path without it (KvBoundaryAdapter::Decode, what
//     a node ran before batching), alternated in rounds; `sched_vs_direct` is
//     the tokens/s ratio (goal >= 0.97), `sched_vs_off` the same against
//     --max-batch-sessions 1.
// Models are generated into $MESHNET_BENCH_DIR (default /tmp/meshnet-bench)
// on first use (as model_bench does); nothing is committed.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "gguf/gguf_reader.h"
#include "gguf/make_model.h"
#include "node/identity.h"
#include "node/node.h"
#include "util/thread_pool.h"

namespace meshnet {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kPrompt = 16;
constexpr int kDecode = 24;

ThreadPool* Pool() {
  static ThreadPool pool(0);
  return &pool;
}

std::string ModelPath(GgmlType type) {
  return bench::CachedLlama768(type, std::string(MESHNET_SOURCE_DIR) + "/models/stories260K.gguf");
}

std::shared_ptr<const gguf::GgufFile> File(GgmlType type) {
  static std::map<GgmlType, std::shared_ptr<const gguf::GgufFile>> files;
  auto& f = files[type];
  if (!f) f = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(ModelPath(type)));
  return f;
}

std::unique_ptr<node::Node> MakeNode(GgmlType type, int64_t max_batch_sessions) {
  node::NodeOptions o;
  o.kv_dtype = KvDtype::kF16;
  o.kv_config.max_sessions = 128;
  o.kv_config.budget_bytes = 512LL << 20;
  o.batch.max_batch_sessions = max_batch_sessions;
  return std::make_unique<node::Node>(File(type), o, Pool());
}

node::StepRequest Request(const std::string& id, std::vector<int32_t> tokens,
                          std::optional<int64_t> seq_len) {
  node::StepRequest r;
  r.session_id = id;
  r.session_secret = "s";
  r.prefill = !seq_len;
  r.expected_seq_len = seq_len;
  r.token_ids = std::move(tokens);
  return r;
}

int32_t TokenOf(const node::StepResult& r) { return std::get<shard::TailOutput>(r).token_id; }

std::vector<int32_t> PromptOf(int s) {
  std::vector<int32_t> p = {1};
  for (int t = 1; t < kPrompt; ++t) p.push_back(static_cast<int32_t>(260 + (s * 31 + t * 7) % 250));
  return p;
}

struct DecodeRun {
  double seconds = 0;        // the decode phase, wall
  std::vector<double> gaps;  // inter-token latencies, every session
};

// `sessions` threads prefill, meet, then decode kDecode tokens each.
DecodeRun RunSessions(node::Node& node, int sessions) {
  std::barrier start(sessions + 1), done(sessions + 1);
  std::vector<std::vector<double>> gaps(sessions);
  std::vector<std::thread> threads;
  for (int s = 0; s < sessions; ++s) {
    threads.emplace_back([&, s] {
      const std::string id = node::RandomId128();
      node::StepRequest r = Request(id, PromptOf(s), std::nullopt);
      int32_t tok = TokenOf(node.Step(r));
      start.arrive_and_wait();
      auto t0 = Clock::now();
      for (int i = 0; i < kDecode; ++i) {
        node::StepRequest d = Request(id, {tok}, kPrompt + i);
        tok = TokenOf(node.Step(d));
        const auto t1 = Clock::now();
        gaps[s].push_back(std::chrono::duration<double>(t1 - t0).count());
        t0 = t1;
      }
      done.arrive_and_wait();
      node.Release(id, 0);
    });
  }
  start.arrive_and_wait();
  const auto t0 = Clock::now();
  done.arrive_and_wait();
  DecodeRun run;
  run.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (auto& t : threads) t.join();
  for (auto& g : gaps) run.gaps.insert(run.gaps.end(), g.begin(), g.end());
  return run;
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

struct Baseline {
  double tok_s = 0, p50 = 0, p99 = 0;
};
std::map<GgmlType, Baseline>& Baselines() {
  static std::map<GgmlType, Baseline> b;
  return b;
}

void Decode(benchmark::State& state, GgmlType type, int64_t max_batch_sessions) {
  const int sessions = static_cast<int>(state.range(0));
  auto node = MakeNode(type, max_batch_sessions);
  RunSessions(*node, std::min(sessions, 4));  // warm-up: workspaces, pages
  DecodeRun run;
  for (auto _ : state) {
    run = RunSessions(*node, sessions);
    state.SetIterationTime(run.seconds);
  }
  const double tok_s = sessions * kDecode / run.seconds;
  const double p50 = Percentile(run.gaps, 0.5) * 1e3, p99 = Percentile(run.gaps, 0.99) * 1e3;
  Baseline& base = Baselines()[type];
  if (sessions == 1 && max_batch_sessions > 1) base = {tok_s, p50, p99};
  state.counters["tok_s"] = tok_s;
  state.counters["itl_p50_ms"] = p50;
  state.counters["itl_p99_ms"] = p99;
  if (base.tok_s > 0) {
    state.counters["x_vs_1"] = tok_s / base.tok_s;
    state.counters["p50_vs_1"] = p50 / base.p50;
    state.counters["p99_vs_1"] = p99 / base.p99;
  }
  const node::BatchStats& st = node->batcher().stats();
  state.counters["sessions_per_batch"] =
      static_cast<double>(st.steps.load()) / static_cast<double>(std::max<int64_t>(1, st.batches));
}

// One session: kDecode tokens through `step`, after a fresh prefill.
template <class StepFn>
double LoneTokens(node::Node& node, StepFn&& step) {
  const std::string id = node::RandomId128();
  node::StepRequest r = Request(id, PromptOf(0), std::nullopt);
  int32_t tok = TokenOf(node.Step(r));
  const auto t0 = Clock::now();
  for (int i = 0; i < kDecode; ++i) tok = TokenOf(step(Request(id, {tok}, kPrompt + i)));
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  node.Release(id, 0);
  return s;
}

void LoneSession(benchmark::State& state, GgmlType type) {
  auto node = MakeNode(type, node::BatchOptions{}.max_batch_sessions);
  auto off = MakeNode(type, 1);
  auto sched = [&](node::StepRequest r) { return node->Step(r); };
  auto unbatched = [&](node::StepRequest r) { return off->Step(r); };
  auto direct = [&](node::StepRequest r) {
    shard::StepInput in;
    in.token_ids = std::span<const int32_t>(r.token_ids);
    return node->adapter().Decode(r.session_id, 0, in, r.expected_seq_len, r.sampling);
  };
  LoneTokens(*node, sched);  // warm-up
  LoneTokens(*off, unbatched);
  double t_sched = 0, t_direct = 0, t_off = 0;
  for (auto _ : state) {
    for (int round = 0; round < 3; ++round) {  // alternated: load drifts hit all three
      t_direct += LoneTokens(*node, direct);
      t_sched += LoneTokens(*node, sched);
      t_off += LoneTokens(*off, unbatched);
    }
    state.SetIterationTime(t_sched);
  }
  state.counters["tok_s_sched"] = 3 * kDecode * state.iterations() / t_sched;
  state.counters["tok_s_direct"] = 3 * kDecode * state.iterations() / t_direct;
  state.counters["sched_vs_direct"] = t_direct / t_sched;
  state.counters["sched_vs_off"] = t_off / t_sched;
}

void Register() {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kQ8_0, GgmlType::kQ4_K}) {
    const std::string name(GgmlTypeInfoOf(type).name);
    benchmark::RegisterBenchmark(("BM_LoneSession/" + name).c_str(),
                                 [type](benchmark::State& s) { LoneSession(s, type); })
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_Decode/" + name).c_str(),
                                 [type](benchmark::State& s) { Decode(s, type, 64); })
        ->Arg(1)
        ->Arg(4)
        ->Arg(16)
        ->Arg(64)
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_DecodeUnbatched/" + name).c_str(),
                                 [type](benchmark::State& s) { Decode(s, type, 1); })
        ->Arg(16)
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace
}  // namespace meshnet

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  meshnet::Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
