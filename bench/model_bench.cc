// End-to-end model benchmarks on a generated 768-dim Llama (n_embd 768, 12
// layers, 12 heads, 12 KV heads, n_ff 2048, stories260K's 512-token vocab),
// in F32 and Q8_0:
//   * decode tokens/s (128 tokens) and prefill tokens/s (128-token prompt),
//     1 shard vs 3 in-process shards;
//   * cached decode vs re-prefill-per-token at 512 context (the naive strategy);
//   * the roofline ratio: weight bytes read per decode token x tokens/s over
//     the read bandwidth measured in the same run (BM_ReadBandwidth);
//   * one forward pass of 16 token rows vs one decode row (BM_SixteenRows,
//     F32, Q8_0, Q4_K): what a 16-session batch could gain at most.
// Models are generated into $MESHNET_BENCH_DIR (default /tmp/meshnet-bench)
// with the make-model library on first use; nothing is committed.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <vector>

#include "bench_util.h"
#include "gguf/gguf_reader.h"
#include "gguf/make_model.h"
#include "mesh/generator.h"
#include "mesh/in_process.h"
#include "node/identity.h"
#include "node/layer_range.h"
#include "util/thread_pool.h"

namespace meshnet {
namespace {

ThreadPool* Pool() {
  static ThreadPool pool(0);
  return &pool;
}

std::string ModelPath(GgmlType type) {
  return bench::CachedLlama768(type, std::string(MESHNET_SOURCE_DIR) + "/models/stories260K.gguf");
}

std::shared_ptr<const gguf::GgufFile> Model(GgmlType type) {
  static std::map<GgmlType, std::shared_ptr<const gguf::GgufFile>> cache;
  auto& f = cache[type];
  if (!f) {
    f = std::make_shared<const gguf::GgufFile>(
        gguf::GgufFile::Open(ModelPath(type), gguf::GgufFile::Access::kSequential));
  }
  return f;
}

// Read bandwidth of this machine, measured once per run with every pool
// thread summing its share of a buffer far larger than the caches.
double g_read_bw = 0;  // bytes/s

double MeasureReadBandwidth() {
  static std::vector<uint64_t> buf(size_t{512} << 20 >> 3, 1);  // 512 MiB
  const int64_t n = static_cast<int64_t>(buf.size());
  std::vector<uint64_t> partial(64);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    Pool()->ParallelFor(64, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        const uint64_t* p = buf.data() + c * (n / 64);
        uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        for (int64_t i = 0; i < n / 64; i += 4) {
          a0 += p[i];
          a1 += p[i + 1];
          a2 += p[i + 2];
          a3 += p[i + 3];
        }
        partial[c] = a0 + a1 + a2 + a3;
      }
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(partial.data());
    best = std::max(best, static_cast<double>(n * 8) / s);
  }
  return best;
}

void BM_ReadBandwidth(benchmark::State& state) {
  for (auto _ : state) g_read_bw = MeasureReadBandwidth();
  state.counters["GB/s"] = g_read_bw / 1e9;
}
BENCHMARK(BM_ReadBandwidth)->Iterations(1)->Unit(benchmark::kMillisecond);

// Bytes of weights one decode token reads: every layer matrix + norms + the
// LM head (one embedding row is negligible).
double DecodeWeightBytes(const gguf::GgufFile& f) {
  double bytes = 0;
  for (const auto& t : f.tensors()) {
    if (t.name != "token_embd.weight") bytes += static_cast<double>(t.n_bytes);
  }
  return bytes;
}

mesh::GenerateResult Run(mesh::InProcessMesh& mesh, const std::vector<int32_t>& prompt, int n) {
  mesh::FixedRouteProvider p(mesh.route());
  mesh::GenerateOptions o;
  o.max_tokens = n;
  return mesh::Generate(p, prompt, o);
}

std::vector<int32_t> Prompt(int n) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = 1 + (i * 37) % 500;
  return p;
}

mesh::InProcessMeshOptions MeshOptions(int shards) {
  mesh::InProcessMeshOptions mo;
  mo.split = node::EvenSplit(shards, 12);
  mo.kv_config.budget_bytes = int64_t{1} << 30;
  return mo;
}

// args: type, shards
void BM_Decode(benchmark::State& state) {
  const auto type = static_cast<GgmlType>(state.range(0));
  const int shards = static_cast<int>(state.range(1));
  auto file = Model(type);
  mesh::InProcessMesh mesh(file, MeshOptions(shards), Pool());
  const auto prompt = Prompt(1);
  Run(mesh, prompt, 4);  // warm the pages
  constexpr int kTokens = 128;
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    Run(mesh, prompt, kTokens);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double tps = kTokens * static_cast<double>(state.iterations()) / seconds;
  state.counters["tok/s"] = tps;
  if (g_read_bw > 0) state.counters["roofline"] = DecodeWeightBytes(*file) * tps / g_read_bw;
}

void BM_Prefill(benchmark::State& state) {
  const auto type = static_cast<GgmlType>(state.range(0));
  const int shards = static_cast<int>(state.range(1));
  mesh::InProcessMesh mesh(Model(type), MeshOptions(shards), Pool());
  const auto prompt = Prompt(128);
  Run(mesh, Prompt(4), 1);
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    Run(mesh, prompt, 1);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  state.counters["tok/s"] = 128.0 * static_cast<double>(state.iterations()) / seconds;
}

// Cached decode at 512 context vs re-prefilling the whole history per token.
void BM_CachedVsReprefill512(benchmark::State& state) {
  const auto type = static_cast<GgmlType>(state.range(0));
  mesh::InProcessMesh mesh(Model(type), MeshOptions(1), Pool());
  auto& adapter = mesh.adapter(0);
  const auto prompt = Prompt(512);
  constexpr int kSteps = 8;
  double cached_s = 0, naive_s = 0;
  for (auto _ : state) {
    // Cached: prefill once (untimed), then kSteps one-token decodes.
    const std::string sid = node::RandomId128();
    shard::StepInput in;
    in.token_ids = std::span<const int32_t>(prompt);
    adapter.Prefill(sid, 0, in, {});
    auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < kSteps; ++s) {
      const int32_t tok = 5 + s;
      shard::StepInput one;
      one.token_ids = std::span<const int32_t>(&tok, 1);
      adapter.Decode(sid, 0, one, 512 + s, {});
    }
    cached_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    adapter.manager().Release(sid, 0);
    // Naive: every token re-prefills the whole history.
    std::vector<int32_t> history = prompt;
    t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < kSteps; ++s) {
      history.push_back(5 + s);
      shard::StepInput all;
      all.token_ids = std::span<const int32_t>(history);
      adapter.Prefill(sid, 0, all, {});
    }
    naive_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    adapter.manager().Release(sid, 0);
  }
  const double it = static_cast<double>(state.iterations());
  state.counters["cached_tok/s"] = kSteps * it / cached_s;
  state.counters["reprefill_tok/s"] = kSteps * it / naive_s;
  state.counters["speedup"] = naive_s / cached_s;
}

constexpr int64_t kF32 = static_cast<int64_t>(GgmlType::kF32);
constexpr int64_t kQ8 = static_cast<int64_t>(GgmlType::kQ8_0);
constexpr int64_t kQ4K = static_cast<int64_t>(GgmlType::kQ4_K);

// One forward pass of 16 token rows (a 16-token prompt: the matmuls of a
// 16-session decode batch, without its attention over 16 contexts or the
// scheduler) vs one decode row, alternated 50 times on 1 shard: ms_16 and ms_1
// (best), their means, and bound_16v1 = 16 x ms_1 / ms_16, the most a batch of
// 16 sessions can gain over one session here.
void BM_SixteenRows(benchmark::State& state) {
  const auto type = static_cast<GgmlType>(state.range(0));
  mesh::InProcessMesh mesh(Model(type), MeshOptions(1), Pool());
  auto& adapter = mesh.adapter(0);
  const auto prompt = Prompt(16);
  const int32_t next = 5;
  auto seconds = [](auto&& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  constexpr int kRounds = 50;
  double best16 = 1e30, best1 = 1e30, sum16 = 0, sum1 = 0;
  for (auto _ : state) {
    for (int round = 0; round < kRounds; ++round) {
      const std::string sid = node::RandomId128();
      shard::StepInput rows, one;
      rows.token_ids = std::span<const int32_t>(prompt);
      one.token_ids = std::span<const int32_t>(&next, 1);
      const double s16 = seconds([&] { adapter.Prefill(sid, 0, rows, {}); });
      const double s1 = seconds([&] { adapter.Decode(sid, 0, one, 16, {}); });
      adapter.manager().Release(sid, 0);
      best16 = std::min(best16, s16);
      best1 = std::min(best1, s1);
      sum16 += s16;
      sum1 += s1;
    }
  }
  const double n = kRounds * static_cast<double>(state.iterations());
  state.counters["ms_16"] = best16 * 1e3;
  state.counters["ms_1"] = best1 * 1e3;
  state.counters["mean_ms_16"] = sum16 / n * 1e3;
  state.counters["mean_ms_1"] = sum1 / n * 1e3;
  state.counters["bound_16v1"] = 16 * best1 / best16;
}

// F32 and Q8_0, each on 1 and 3 shards, two iterations.
void TypesAndShards(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "shards"})
      ->Args({kF32, 1})
      ->Args({kF32, 3})
      ->Args({kQ8, 1})
      ->Args({kQ8, 3})
      ->Iterations(2)
      ->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_Decode)->Apply(TypesAndShards);
BENCHMARK(BM_Prefill)->Apply(TypesAndShards);
BENCHMARK(BM_SixteenRows)
    ->ArgNames({"type"})
    ->Arg(kF32)
    ->Arg(kQ8)
    ->Arg(kQ4K)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CachedVsReprefill512)
    ->ArgNames({"type"})
    ->Arg(kF32)
    ->Arg(kQ8)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace meshnet

BENCHMARK_MAIN();
