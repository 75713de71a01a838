// KV cache dtypes against f16 on a generated 768-dim Llama (12 layers, 12
// heads, 12 KV heads of 64, n_ff 2048, Q8_0 weights, context 4096,
// stories260K's 512-token vocab), one node holding every layer:
//   * BM_KvDtypeDecode/<ctx>/<sessions>: aggregate decode tokens/s of 1 or 16
//     sessions, each holding `ctx` positions, for f16, q8_0 and q4_0 KV,
//     alternated in 5 rounds (the order rotated: load drifts hit all three);
//     `q8_0_vs_f16` and `q4_0_vs_f16` are the medians of the rounds' tokens/s
//     ratios (goal for q8_0: >= 1.0 at ctx >= 1,000), `q8_0_vs_f16_min` the
//     worst round's. The contexts are filled by writing K/V rows straight into each
//     session's reserved KV (random rows, quantized as the node stores them),
//     not by a prefill: the attention's cost does not depend on the values,
//     and 16 prefills of 4,000 tokens would take minutes of this machine.
//   * BM_SessionsIn256MiB/<layers>: how many 2,000-token sessions a 256 MiB
//     budget holds, as the KV manager counts its blocks (block_tokens 16), per
//     dtype, for a node of all 12 layers and one of 4 (a third of a 3-node
//     route); `q8_0_vs_f16` (goal >= 1.85) and `q4_0_vs_f16`.
// The model is generated into $MESHNET_BENCH_DIR (default /tmp/meshnet-bench)
// on first use; nothing is committed.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "gguf/gguf_reader.h"
#include "kv/hot_kv_state.h"
#include "node/identity.h"
#include "node/node.h"
#include "ops/nn.h"
#include "util/thread_pool.h"

namespace meshnet {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kRounds = 5;
constexpr KvDtype kDtypes[] = {KvDtype::kF16, KvDtype::kQ8_0, KvDtype::kQ4_0};

ThreadPool* Pool() {
  static ThreadPool pool(0);
  return &pool;
}

std::shared_ptr<const gguf::GgufFile> File() {
  static std::shared_ptr<const gguf::GgufFile> f;
  if (!f) {
    const std::string path = bench::CachedLlama768(
        GgmlType::kQ8_0, std::string(MESHNET_SOURCE_DIR) + "/models/stories260K.gguf", 4096);
    f = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(path));
  }
  return f;
}

std::unique_ptr<node::Node> MakeNode(KvDtype dtype, int64_t budget) {
  node::NodeOptions o;
  o.kv_dtype = dtype;
  o.kv_config.max_sessions = 64;
  o.kv_config.budget_bytes = budget;
  return std::make_unique<node::Node>(File(), o, Pool());
}

// 64 random K and V rows in the node's dtype, as StoreKvRow writes them.
struct RowPool {
  std::vector<uint8_t> k, v;
  size_t row_bytes = 0;
};
RowPool MakeRows(const kv::KvCacheRecipe& r) {
  RowPool rows;
  rows.row_bytes = static_cast<size_t>(KvRowBytes(r.kv_dtype, r.n_kv_heads, r.head_dim));
  rows.k.resize(64 * rows.row_bytes);
  rows.v.resize(rows.k.size());
  uint8_t* table[1] = {rows.k.data()};
  uint8_t* vtable[1] = {rows.v.data()};
  ops::PagedKvLayer layer;
  layer.block_tokens = 64;
  layer.row_bytes = rows.row_bytes;
  layer.n_kv_heads = r.n_kv_heads;
  layer.head_dim = r.head_dim;
  layer.dtype = r.kv_dtype;
  layer.n_positions = 64;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(r.n_kv_heads) * r.head_dim);
  for (int p = 0; p < 64; ++p) {
    for (float& x : row) x = dist(rng);
    layer.blocks = table;
    ops::StoreKvRow(layer, true, p, row.data());
    for (float& x : row) x = dist(rng);
    layer.blocks = vtable;
    ops::StoreKvRow(layer, true, p, row.data());
  }
  return rows;
}

// Opens `id` on the node's manager and gives it `ctx` positions of rows.
void FillContext(node::Node& node, const RowPool& rows, const std::string& id, int64_t ctx) {
  kv::HotKvStateManager& m = node.manager();
  m.Open(id, 0);
  kv::StepResult r = m.BeginStep(id, 0, ctx, nullptr, 0, /*clear_rows=*/false);
  kv::KvStep& step = std::get<kv::KvStep>(r);
  const kv::KvCacheRecipe& recipe = m.recipe();
  for (int layer = recipe.start_layer; layer <= recipe.end_layer; ++layer) {
    const ops::PagedKvLayer v = step.Layer(layer);
    for (int64_t p = 0; p < ctx; ++p) {
      std::memcpy(v.KRow(p), rows.k.data() + (p % 64) * rows.row_bytes, rows.row_bytes);
      std::memcpy(v.VRow(p), rows.v.data() + (p % 64) * rows.row_bytes, rows.row_bytes);
    }
  }
  if (step.Commit()) throw std::runtime_error("context fill missed");
}

node::StepRequest Decode(const std::string& id, int32_t token, int64_t held) {
  node::StepRequest r;
  r.session_id = id;
  r.session_secret = "s";
  r.expected_seq_len = held;
  r.token_ids = {token};
  return r;
}

// Tokens each session decodes in a run.
int DecodeTokens(int sessions) { return sessions == 1 ? 32 : 16; }

// `sessions` threads, each a session of `ctx` positions, decode
// DecodeTokens(sessions) tokens at once; returns the wall seconds of the
// decode phase.
double RunDecode(KvDtype dtype, int64_t ctx, int sessions) {
  const int decode = DecodeTokens(sessions);
  const int64_t per_session = (ctx + decode + 32) * 2 * 12 * 12 * 128;  // f16 bytes: room for all
  auto node = MakeNode(dtype, sessions * per_session);
  const RowPool rows = MakeRows(node->manager().recipe());
  std::vector<std::string> ids;
  for (int s = 0; s < sessions; ++s) {
    ids.push_back(node::RandomId128());
    FillContext(*node, rows, ids.back(), ctx);
  }
  {  // warm-up step per session (workspaces, first touch of the new block)
    for (int s = 0; s < sessions; ++s) {
      node::StepRequest r = Decode(ids[s], 300, ctx);
      node->Step(r);
    }
  }
  std::barrier start(sessions + 1), done(sessions + 1);
  std::vector<std::thread> threads;
  for (int s = 0; s < sessions; ++s) {
    threads.emplace_back([&, s] {
      int32_t tok = 301;
      start.arrive_and_wait();
      for (int i = 0; i < decode; ++i) {
        node::StepRequest r = Decode(ids[s], tok, ctx + 1 + i);
        tok = std::get<shard::TailOutput>(node->Step(r)).token_id;
      }
      done.arrive_and_wait();
    });
  }
  start.arrive_and_wait();
  const auto t0 = Clock::now();
  done.arrive_and_wait();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (auto& t : threads) t.join();
  for (const std::string& id : ids) node->Release(id, 0);
  return seconds;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// kRounds rounds of one run per dtype, the order rotated every round; the
// ratios are the medians of the rounds' ratios (one round's three runs see
// about the same load), the tokens/s the totals'.
void KvDtypeDecode(benchmark::State& state) {
  const int64_t ctx = state.range(0);
  const int sessions = static_cast<int>(state.range(1));
  std::map<KvDtype, double> seconds;
  std::vector<double> q8_ratio, q4_ratio;
  for (auto _ : state) {
    for (int round = 0; round < kRounds; ++round) {
      std::map<KvDtype, double> s;
      for (int i = 0; i < 3; ++i) {
        const KvDtype dt = kDtypes[(round + i) % 3];
        s[dt] = RunDecode(dt, ctx, sessions);
        seconds[dt] += s[dt];
      }
      q8_ratio.push_back(s[KvDtype::kF16] / s[KvDtype::kQ8_0]);
      q4_ratio.push_back(s[KvDtype::kF16] / s[KvDtype::kQ4_0]);
    }
    state.SetIterationTime(seconds[KvDtype::kQ8_0]);
  }
  const double tokens = static_cast<double>(kRounds) * sessions * DecodeTokens(sessions);
  for (KvDtype dt : kDtypes) {
    state.counters[std::string("tok_s_") + std::string(KvDtypeName(dt))] = tokens / seconds[dt];
  }
  state.counters["q8_0_vs_f16"] = Median(q8_ratio);
  state.counters["q4_0_vs_f16"] = Median(q4_ratio);
  state.counters["q8_0_vs_f16_min"] = *std::min_element(q8_ratio.begin(), q8_ratio.end());
}

// Sessions of 2,000 tokens opened one after another into a 256 MiB budget
// until the manager evicts the first: the count it holds at once.
int64_t SessionsThatFit(KvDtype dtype, int layers) {
  kv::KvCacheRecipe r;
  r.architecture_adapter = "llama";
  r.kv_dtype = dtype;
  r.n_kv_heads = 12;
  r.head_dim = 64;
  r.total_layers = 12;
  r.start_layer = 0;
  r.end_layer = layers - 1;
  kv::HotKvStateConfig config;
  config.budget_bytes = int64_t{256} << 20;
  config.block_tokens = 16;
  config.max_sessions = 4096;
  kv::HotKvStateManager m(r, config);
  for (int s = 0; s < 1000; ++s) {
    const std::string id = "s" + std::to_string(s);
    m.Open(id, 0);
    kv::StepResult step = m.BeginStep(id, 0, 2000, nullptr, 0, /*clear_rows=*/false);
    if (std::get<kv::KvStep>(step).Commit()) break;
    if (m.SessionCount() < s + 1) return m.SessionCount();  // one was evicted for this one
  }
  return m.SessionCount();
}

void SessionsIn256MiB(benchmark::State& state) {
  std::map<KvDtype, int64_t> fit;
  for (auto _ : state) {
    for (KvDtype dt : kDtypes) fit[dt] = SessionsThatFit(dt, static_cast<int>(state.range(0)));
  }
  for (KvDtype dt : kDtypes) {
    state.counters[std::string("sessions_") + std::string(KvDtypeName(dt))] =
        static_cast<double>(fit[dt]);
  }
  state.counters["q8_0_vs_f16"] =
      static_cast<double>(fit[KvDtype::kQ8_0]) / static_cast<double>(fit[KvDtype::kF16]);
  state.counters["q4_0_vs_f16"] =
      static_cast<double>(fit[KvDtype::kQ4_0]) / static_cast<double>(fit[KvDtype::kF16]);
}

BENCHMARK(SessionsIn256MiB)
    ->Name("BM_SessionsIn256MiB")
    ->ArgName("layers")
    ->Arg(12)
    ->Arg(4)
    ->Iterations(1);
BENCHMARK(KvDtypeDecode)
    ->Name("BM_KvDtypeDecode")
    ->ArgsProduct({{256, 1000, 4000}, {1, 16}})
    ->ArgNames({"ctx", "sessions"})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace meshnet

BENCHMARK_MAIN();
