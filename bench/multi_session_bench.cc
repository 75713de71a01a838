// multi_session_bench: many users at once (issue 12), end to end through the
// client's mesh::MultiSessionDriver.
//
//  * Throughput/<type>/<route>/<n>: n concurrent greedy sessions (distinct
//    4-token prompts, --mb_tokens generated each) on a 768-dim, 12-layer random
//    model of weight type F32, Q8_0 or Q4_K (meshnet make-model, written to a
//    temporary directory and removed at exit). Routes: `inproc`, one in-process
//    node holding all layers (a 2-thread compute pool), and `3node`, three
//    `meshnet serve` processes on loopback (layers 0-3, 4-7, 8-11, --threads
//    --mb_node_threads each). Counters: aggregate tokens/s (every generated
//    token over the wall time), the same per CPU-second of every process of the
//    route (tok_per_cpu_s: steadier than wall time on a shared machine), the
//    CPUs those processes used on average (cpus), inter-token latency p50/p99
//    and TTFT p50/p99; in process also the node's
//    batches, sessions_per_batch, batch_ms (mean forward pass) and node_busy
//    (its share of the wall time).
//  * Ratios/<type>: from the Throughput runs of this process: 16 vs 1 session
//    (aggregate tokens/s; goal >= 6 once nodes batch), 3-node / in-process at 16
//    sessions (goal >= 0.8; <route>_vs_inproc_N against one node of every
//    layer, <route>_vs_inproc3_N against the same three layer ranges as
//    in-process shards when the run has inproc3), and inter-token p50/p99 at 16 sessions over 1
//    (goal <= 3); in process, <route>_16v1_batch (batch time 16 vs 1: step
//    cost) and <route>_16v1_itl50_sched (the ITL p50 ratio over it: batches a
//    token spans, queueing).
//  * Mixed/<type>/<route>: 8 sessions decode while one --mb_long_prompt-token
//    prompt is prefilled, then 8 sessions decode alone (the baseline) as many
//    tokens deep as the first 8 were when the prefill ended (decode_depth: a
//    deeper step attends over more positions, which is not the prefill's
//    doing); p99 of the inter-token gaps that overlap the prefill over the
//    baseline's p99 (goal <= 2: chunked prefill).
//  * Prefill/<type>/<route>: one --mb_long_prompt-token prompt alone, sent
//    whole and in --mb_prompt_chunk pieces (pipelined over the hops),
//    alternately: chunked_speedup is whole over chunked.
//  * KvPressure/<type>: more sessions than one in-process node's KV budget
//    holds at full length, with active sessions protected (what generate,
//    api and serve run) and under plain LRU: tokens/s, failed sessions and
//    ITL p99 of each, protect_vs_lru_tok (see BM_KvPressure).
//
// Flags (before Google Benchmark's own): --mb_types=f32,q8_0,q4_k
// --mb_sessions=1,4,16,64 --mb_routes=inproc,3node --mb_tokens=16 (routes
// inproc_nobatch and 3node_nobatch run with the nodes' batching off,
// inproc3 splits the in-process route into three shards on its one pool
// (layers 0-3, 4-7, 8-11, taking turns: InProcessMeshOptions::batch_turns;
// its batch counters are the head shard's), inproc3_free the same without turns,
// 3node_single without the client's step grouping, 3node_depthN with at most
// N of the client's calls out at once (--pipeline-depth N; 3node_depth1 carries
// the cohort, 3node_depth1_nocarry does not: ClientOptions::carry_cohorts),
// <route>_kvf32 with --kv-dtype float32, and
// <route>_chunkN with --prefill-chunk N, <route>_shareX with --prefill-share X; Ratios then adds
// <route>_16_batch_gain)
// --mb_long_prompt=2000 --mb_node_threads=1 --mb_mixed=inproc (the routes of
// Mixed, e.g. inproc,inproc_nobatch,inproc_chunk32; 0: none)
// --mb_prefill=3node_depth1 (routes of Prefill; default none) --mb_prompt_chunk=512
// (Prefill's pieces) --mb_pressure=q8_0 (types of KvPressure; default none)
// --mb_pressure_sessions=16 --mb_pressure_share=0.75 (its budget over the
// sessions' full-length KV) --mb_warm=1 (Throughput: one untimed run of the same
// sessions and tokens before the timed one, its tokens/s kept as
// cold_tok_per_s; 0 times the first run: one-time costs such as the KV
// arena's first-touch page faults then fall in it). Each benchmark
// runs one iteration (a run of many sessions is its own repetition).
#include <benchmark/benchmark.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "bench_util.h"
#include "gguf/gguf_reader.h"
#include "gguf/make_model.h"
#include "mesh/in_process.h"
#include "mesh/multi_session.h"
#include "node/batcher.h"
#include "node/layer_range.h"
#include "rpc/remote.h"
#include "rpc/test_util.h"
#include "tests/rpc/node_process.h"
#include "util/thread_pool.h"

namespace meshnet {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchFlags {
  std::vector<std::string> types = {"f32", "q8_0", "q4_k"};
  std::vector<int> sessions = {1, 4, 16, 64};
  std::vector<std::string> routes = {"inproc", "3node"};
  int tokens = 16;
  int long_prompt = 2000;
  int node_threads = 1;
  std::vector<std::string> mixed = {"inproc"};  // routes of the Mixed benchmark
  std::vector<std::string> prefill;             // routes of the Prefill benchmark
  int64_t prompt_chunk = 512;                   // Prefill's pieces
  bool warm = true;                   // Throughput: an untimed run of the same shape first
  std::vector<std::string> pressure;  // types of the KvPressure benchmark
  int pressure_sessions = 16;
  double pressure_share = 0.75;  // the budget over the sessions' full-length KV
};

BenchFlags& Flags() {
  static BenchFlags f;
  return f;
}

std::vector<std::string> SplitCsv(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Takes the --mb_* flags out of argv (Google Benchmark rejects unknown ones).
void ParseFlags(int* argc, char** argv) {
  BenchFlags& f = Flags();
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string("--") + name + "=";
      return a.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("mb_types")) {
      f.types = SplitCsv(v);
    } else if (const char* v = value("mb_sessions")) {
      f.sessions.clear();
      for (const auto& s : SplitCsv(v)) f.sessions.push_back(std::stoi(s));
    } else if (const char* v = value("mb_routes")) {
      f.routes = SplitCsv(v);
    } else if (const char* v = value("mb_tokens")) {
      f.tokens = std::stoi(v);
    } else if (const char* v = value("mb_long_prompt")) {
      f.long_prompt = std::stoi(v);
    } else if (const char* v = value("mb_node_threads")) {
      f.node_threads = std::stoi(v);
    } else if (const char* v = value("mb_mixed")) {
      f.mixed = std::string(v) == "0" ? std::vector<std::string>{} : SplitCsv(v);
    } else if (const char* v = value("mb_prefill")) {
      f.prefill = std::string(v) == "0" ? std::vector<std::string>{} : SplitCsv(v);
    } else if (const char* v = value("mb_prompt_chunk")) {
      f.prompt_chunk = std::stoll(v);
    } else if (const char* v = value("mb_warm")) {
      f.warm = std::stoi(v) != 0;
    } else if (const char* v = value("mb_pressure")) {
      f.pressure = std::string(v) == "0" ? std::vector<std::string>{} : SplitCsv(v);
    } else if (const char* v = value("mb_pressure_sessions")) {
      f.pressure_sessions = std::stoi(v);
    } else if (const char* v = value("mb_pressure_share")) {
      f.pressure_share = std::stod(v);
    } else {
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
}

bench::TempDir& Dir() {
  static bench::TempDir dir("multi_session_bench");
  return dir;
}

GgmlType TypeOf(const std::string& name) {
  if (name == "f32") return GgmlType::kF32;
  if (name == "q8_0") return GgmlType::kQ8_0;
  if (name == "q4_k") return GgmlType::kQ4_K;
  throw std::runtime_error("unknown --mb_types entry " + name);
}

// The same as `meshnet make-model --n-embd 768 --n-layers 12 --type TYPE
// --seed 7 --context 4096 --tokenizer-from models/stories260K.gguf`.
std::string ModelPath(const std::string& type) {
  static std::map<std::string, std::string> made;
  auto it = made.find(type);
  if (it != made.end()) return it->second;
  // context 4096: room for the mixed load's long prompt
  return made[type] = bench::MakeLlama768(Dir().path, "llama768-" + type, TypeOf(type), 4096,
                                          MESHNET_SHIPPED_MODEL);
}

using bench::ProcessCpuSeconds;
using bench::SelfCpuSeconds;

// A route for one model: the in-process node or three serve processes;
// "<route>_nobatch" turns the nodes' batching off (--max-batch-sessions 1),
// "<route>_kvf32" keeps their KV cache in float32 (default float16),
// "3node_single" has the client send every step in a call of its own (no
// StepMany grouping, ClientOptions::group_steps), "3node_depthN" limits the
// client to N calls in flight (ClientOptions::pipeline_depth),
// "<route>_nocarry" turns ClientOptions::carry_cohorts off,
// "<route>_chunkN" sets their --prefill-chunk to N, "<route>_shareX" their
// --prefill-share to X, "<route>_pchunkN" has the client send long prompts in
// pipelined pieces of N (GenerateOptions::prefill_chunk).
class Route {
 public:
  Route(const std::string& type, const std::string& route_name) {
    const std::string path = ModelPath(type);
    const bool nobatch = route_name.find("_nobatch") != std::string::npos;
    const bool kv_f32 = route_name.find("_kvf32") != std::string::npos;
    const size_t chunk_at = route_name.find("_chunk");
    const std::string chunk = chunk_at == std::string::npos ? "" : route_name.substr(chunk_at + 6);
    const size_t share_at = route_name.find("_share");
    const std::string share = share_at == std::string::npos ? "" : route_name.substr(share_at + 6);
    const std::string kind = route_name.substr(0, route_name.find('_'));
    const size_t pchunk_at = route_name.find("_pchunk");
    if (pchunk_at != std::string::npos)
      prefill_chunk_ = std::stoll(route_name.substr(pchunk_at + 7));
    if (kind == "inproc" || kind == "inproc3") {
      file_ = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(path));
      pool_ = std::make_unique<ThreadPool>(2);
      mesh::InProcessMeshOptions mo;  // one node, every layer (inproc3: three shards)
      if (kind == "inproc3") mo.split = node::EvenSplit(3, 12);
      mo.batch_turns = route_name.find("_free") == std::string::npos;
      mo.kv_config.max_sessions = 256;
      mo.kv_config.budget_bytes = 1LL << 30;
      if (nobatch) mo.batch.max_batch_sessions = 1;
      if (kv_f32) mo.kv_dtype = KvDtype::kF32;
      if (!chunk.empty()) mo.batch.prefill_chunk = std::stoi(chunk);
      if (!share.empty()) mo.batch.prefill_share = std::stod(share);
      mesh_ = std::make_unique<mesh::InProcessMesh>(file_, mo, pool_.get());
      provider_ = std::make_unique<mesh::FixedRouteProvider>(mesh_->route());
      return;
    }
    if (kind != "3node") throw std::runtime_error("unknown --mb_routes entry " + route_name);
    for (const char* layers : {"0-3", "4-7", "8-11"}) {
      std::vector<std::string> args = {"--model",
                                       path,
                                       "--layers",
                                       layers,
                                       "--listen",
                                       "127.0.0.1:0",
                                       "--threads",
                                       std::to_string(Flags().node_threads),
                                       "--max-sessions",
                                       "256",
                                       "--kv-budget",
                                       "512MiB",
                                       "--max-calls-per-peer",
                                       "512",
                                       "--rpc-threads",
                                       "256"};
      if (nobatch) args.insert(args.end(), {"--max-batch-sessions", "1"});
      if (kv_f32) args.insert(args.end(), {"--kv-dtype", "float32"});
      if (!chunk.empty()) args.insert(args.end(), {"--prefill-chunk", chunk});
      if (!share.empty()) args.insert(args.end(), {"--prefill-share", share});
      nodes_.push_back(std::make_unique<rpc::testing::NodeProcess>(
          MESHNET_BINARY, args, (Dir().path / (type + "-" + layers + ".log")).string()));
      addresses_.push_back(nodes_.back()->address());
    }
    rpc::ClientOptions co;
    co.timeout_s = 600;
    co.info_timeout_s = 30;
    co.group_steps = route_name.find("_single") == std::string::npos;
    co.carry_cohorts = route_name.find("_nocarry") == std::string::npos;
    const size_t depth_at = route_name.find("_depth");
    if (depth_at != std::string::npos)
      co.pipeline_depth = std::stoi(route_name.substr(depth_at + 6));
    provider_ = rpc::MakeRemoteRouteProvider(addresses_, co);
  }
  mesh::RouteProvider& provider() { return *provider_; }
  int64_t prefill_chunk() const { return prefill_chunk_; }
  // The in-process node's batch counters (null for the 3-node route).
  const node::BatchStats* stats() const {
    return mesh_ ? &mesh_->node(0).batcher().stats() : nullptr;
  }
  // CPU seconds used so far by this process and the route's node processes.
  double CpuSeconds() const {
    double s = SelfCpuSeconds();
    for (const auto& n : nodes_) s += ProcessCpuSeconds(n->pid());
    return s;
  }

 private:
  std::shared_ptr<const gguf::GgufFile> file_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<mesh::InProcessMesh> mesh_;
  std::vector<std::unique_ptr<rpc::testing::NodeProcess>> nodes_;
  std::vector<std::string> addresses_;
  std::unique_ptr<mesh::RouteProvider> provider_;
  int64_t prefill_chunk_ = 0;
};

// One route at a time stays up (three processes mapping a model each).
Route& RouteFor(const std::string& type, const std::string& kind) {
  static std::string key;
  static std::unique_ptr<Route> route;
  if (key != type + "/" + kind) {
    route.reset();
    route = std::make_unique<Route>(type, kind);
    key = type + "/" + kind;
    mesh::MultiSessionDriver warm(route->provider(), {});
    mesh::GenerateOptions o;
    o.max_tokens = 2;
    warm.Run(std::vector<std::vector<int32_t>>{{1, 2, 3}}, o);  // page the weights in
  }
  return *route;
}

std::vector<std::vector<int32_t>> Prompts(int n) {
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({1, 3 + (i * 37) % 500, 3 + (i * 101 + 7) % 500, 3 + (i * 13 + 200) % 500});
  }
  return out;
}

struct Figures {
  double tokens_per_s = 0;
  double itl_p50 = 0, itl_p99 = 0;
  double tokens_per_cpu_s = 0;  // all processes of the route
  double batch_s = 0;           // in process: a batch's mean forward pass time
};

// The in-process node's batches during a run: count, steps and busy time.
struct BatchDelta {
  explicit BatchDelta(const node::BatchStats* s) : stats(s) {
    if (s != nullptr) Read(&batches, &steps, &busy_ns);
  }
  void Read(int64_t* b, int64_t* st, int64_t* ns) const {
    *b = stats->batches.load();
    *st = stats->steps.load();
    *ns = stats->busy_ns.load();
  }
  // Adds batches, sessions_per_batch, batch_ms and node_busy (share of the
  // wall time the node computed); returns the mean batch seconds (0: none).
  double Count(benchmark::State& state, double wall_s) const {
    if (stats == nullptr) return 0;
    int64_t b = 0, st = 0, ns = 0;
    Read(&b, &st, &ns);
    b -= batches, st -= steps, ns -= busy_ns;
    if (b <= 0) return 0;
    state.counters["batches"] = static_cast<double>(b);
    state.counters["sessions_per_batch"] = static_cast<double>(st) / static_cast<double>(b);
    state.counters["batch_ms"] = static_cast<double>(ns) / 1e6 / static_cast<double>(b);
    state.counters["node_busy"] = wall_s > 0 ? static_cast<double>(ns) / 1e9 / wall_s : 0;
    return static_cast<double>(ns) / 1e9 / static_cast<double>(b);
  }
  const node::BatchStats* stats;
  int64_t batches = 0, steps = 0, busy_ns = 0;
};
std::map<std::string, Figures>& Measured() {  // "type/route/n" -> figures
  static std::map<std::string, Figures> m;
  return m;
}

void BM_Throughput(benchmark::State& state, std::string type, std::string kind, int n) {
  Route& route = RouteFor(type, kind);
  mesh::GenerateOptions o;
  o.max_tokens = Flags().tokens;
  mesh::MultiSessionReport r;
  double cpu_s = 0, batch_s = 0;
  if (Flags().warm) {  // the same run untimed: KV pages, channels and threads touched
    mesh::MultiSessionDriver driver(route.provider(), {});
    state.counters["cold_tok_per_s"] = driver.Run(Prompts(n), o).TokensPerSecond();
  }
  for (auto _ : state) {
    mesh::MultiSessionDriver driver(route.provider(), {});
    const double cpu0 = route.CpuSeconds();
    const BatchDelta batches(route.stats());
    r = driver.Run(Prompts(n), o);
    cpu_s = route.CpuSeconds() - cpu0;
    batch_s = batches.Count(state, r.wall_s);
    state.SetIterationTime(r.wall_s);
  }
  if (r.failed() > 0) {
    for (const auto& s : r.sessions) {
      if (!s.ok) state.SkipWithError(("a session failed: " + s.error).c_str());
      if (!s.ok) return;
    }
  }
  const std::vector<double> gaps = r.InterTokenGaps();
  const std::vector<double> ttft = r.TimesToFirstToken();
  Figures f{r.TokensPerSecond(), mesh::Percentile(gaps, 0.5), mesh::Percentile(gaps, 0.99),
            cpu_s > 0 ? static_cast<double>(r.TotalTokens()) / cpu_s : 0, batch_s};
  Measured()[type + "/" + kind + "/" + std::to_string(n)] = f;
  state.counters["tok_per_s"] = f.tokens_per_s;
  state.counters["itl_p50_ms"] = f.itl_p50 * 1e3;
  state.counters["itl_p99_ms"] = f.itl_p99 * 1e3;
  state.counters["ttft_p50_ms"] = mesh::Percentile(ttft, 0.5) * 1e3;
  state.counters["ttft_p99_ms"] = mesh::Percentile(ttft, 0.99) * 1e3;
  state.counters["tokens"] = static_cast<double>(r.TotalTokens());
  state.counters["tok_per_cpu_s"] = f.tokens_per_cpu_s;
  // Below ~1.9 in process (2 vCPUs), its 2 compute threads were often not
  // both running (see util/thread_pool.h, Placement).
  state.counters["cpus"] = r.wall_s > 0 ? cpu_s / r.wall_s : 0;
}

// KvPressure/<type>: --mb_pressure_sessions sessions of --mb_tokens tokens
// on one in-process node whose KV budget holds --mb_pressure_share of their
// full-length contexts, with active sessions protected (kv active_seconds
// 30, what generate/api/serve use) and with the reference's plain LRU
// (active_seconds 0), alternately, twice each. Counters per policy: tokens/s
// of the tokens generated (failed sessions' included) and ITL p99 of the
// faster run, failed sessions of both; protect_vs_lru_tok is the ratio.
struct PressureRun {
  double tok_per_s = 0;
  double failed = 0;
  double itl_p99 = 0;
};

// The node's options: one node of every layer, with a KV budget of
// --mb_pressure_share of the sessions' full-length contexts (at least one).
mesh::InProcessMeshOptions PressureOptions(const std::shared_ptr<const gguf::GgufFile>& file,
                                           ThreadPool* pool) {
  mesh::InProcessMeshOptions mo;
  mo.kv_config.max_sessions = 256;
  const BenchFlags& f = Flags();
  const int64_t block_bytes = mesh::InProcessMesh(file, mo, pool).manager(0).block_bytes();
  const int64_t per_session = (4 + f.tokens + mo.kv_config.block_tokens - 1) /
                              mo.kv_config.block_tokens;  // 4-token prompts
  const auto blocks = static_cast<int64_t>(f.pressure_share * f.pressure_sessions * per_session);
  mo.kv_config.budget_bytes = std::max(blocks, per_session) * block_bytes;
  return mo;
}

PressureRun RunUnderPressure(const std::shared_ptr<const gguf::GgufFile>& file,
                             mesh::InProcessMeshOptions mo, ThreadPool* pool,
                             double active_seconds) {
  const BenchFlags& f = Flags();
  mo.kv_config.active_seconds = active_seconds;
  mesh::InProcessMesh mesh(file, mo, pool);
  mesh::FixedRouteProvider provider(mesh.route());
  mesh::MultiSessionDriver driver(provider, {});
  mesh::GenerateOptions o;
  o.max_tokens = f.tokens;
  mesh::MultiSessionEvents ev;
  std::atomic<int64_t> generated{0};
  ev.on_token = [&](int, int32_t) { ++generated; };
  const mesh::MultiSessionReport r = driver.Run(Prompts(f.pressure_sessions), o, ev);
  const std::vector<double> gaps = r.InterTokenGaps();
  return {r.wall_s > 0 ? static_cast<double>(generated.load()) / r.wall_s : 0,
          static_cast<double>(r.failed()), mesh::Percentile(gaps, 0.99)};
}

void BM_KvPressure(benchmark::State& state, std::string type) {
  auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(ModelPath(type)));
  ThreadPool pool(2);
  const mesh::InProcessMeshOptions mo = PressureOptions(file, &pool);
  PressureRun protect, lru;
  double protect_failed = 0, lru_failed = 0;
  for (auto _ : state) {
    for (int round = 0; round < 2; ++round) {
      const PressureRun p = RunUnderPressure(file, mo, &pool, 30);
      const PressureRun l = RunUnderPressure(file, mo, &pool, 0);
      protect_failed += p.failed;
      lru_failed += l.failed;
      if (round == 0 || p.tok_per_s > protect.tok_per_s) protect = p;
      if (round == 0 || l.tok_per_s > lru.tok_per_s) lru = l;
    }
  }
  state.counters["protect_tok_per_s"] = protect.tok_per_s;
  state.counters["lru_tok_per_s"] = lru.tok_per_s;
  state.counters["protect_failed"] = protect_failed;
  state.counters["lru_failed"] = lru_failed;
  state.counters["protect_itl_p99_ms"] = protect.itl_p99 * 1e3;
  state.counters["lru_itl_p99_ms"] = lru.itl_p99 * 1e3;
  state.counters["protect_vs_lru_tok"] = lru.tok_per_s > 0 ? protect.tok_per_s / lru.tok_per_s : 0;
}

void BM_Ratios(benchmark::State& state, std::string type) {
  for (auto _ : state) {
  }
  const auto& m = Measured();
  auto get = [&](const std::string& route, int n) -> const Figures* {
    auto it = m.find(type + "/" + route + "/" + std::to_string(n));
    return it == m.end() ? nullptr : &it->second;
  };
  for (const std::string& route : Flags().routes) {
    const Figures* one = get(route, 1);
    const Figures* sixteen = get(route, 16);
    if (one == nullptr || sixteen == nullptr) continue;
    state.counters[route + "_16v1_tok"] = sixteen->tokens_per_s / one->tokens_per_s;
    state.counters[route + "_16v1_tok_cpu"] = sixteen->tokens_per_cpu_s / one->tokens_per_cpu_s;
    state.counters[route + "_16v1_itl50"] = sixteen->itl_p50 / one->itl_p50;
    state.counters[route + "_16v1_itl99"] = sixteen->itl_p99 / one->itl_p99;
    if (one->batch_s > 0 && sixteen->batch_s > 0) {
      // The ITL ratio is the batch time ratio (step cost) times the batches
      // a session's token spans at 16 over 1 (scheduling, queueing).
      const double step = sixteen->batch_s / one->batch_s;
      state.counters[route + "_16v1_batch"] = step;
      state.counters[route + "_16v1_itl50_sched"] = sixteen->itl_p50 / one->itl_p50 / step;
    }
  }
  for (const std::string& route : {"inproc", "3node"}) {
    const Figures* on = get(route, 16);
    const Figures* off = get(route + std::string("_nobatch"), 16);
    if (on == nullptr || off == nullptr) continue;
    state.counters[std::string(route) + "_16_batch_gain"] = on->tokens_per_s / off->tokens_per_s;
    state.counters[std::string(route) + "_16_batch_gain_cpu"] =
        on->tokens_per_cpu_s / off->tokens_per_cpu_s;
  }
  for (const std::string& route : Flags().routes) {  // 3node, 3node_depth1, ...
    if (route.rfind("3node", 0) != 0) continue;
    for (int n : Flags().sessions) {
      const Figures* three = get(route, n);
      // Against one in-process node of every layer, and against the same
      // three layer ranges as in-process shards (the CLI's default route).
      for (const std::string& base : {"inproc", "inproc3"}) {
        const Figures* in = get(base, n);
        if (in == nullptr || three == nullptr) continue;
        state.counters[route + "_vs_" + base + "_" + std::to_string(n)] =
            three->tokens_per_s / in->tokens_per_s;
        state.counters[route + "_vs_" + base + "_cpu_" + std::to_string(n)] =
            three->tokens_per_cpu_s / in->tokens_per_cpu_s;
      }
    }
  }
}

// Runs `n` decode sessions; each ends when `stop(tokens so far)` says so (or
// at 1024 tokens). `all_decoding` runs once every session has two tokens.
// Returns each session's token times.
std::vector<std::vector<Clock::time_point>> RunDecoders(mesh::RouteProvider& provider, int n,
                                                        const std::function<bool(int)>& stop,
                                                        const std::function<void()>& all_decoding) {
  std::vector<std::vector<Clock::time_point>> times(static_cast<size_t>(n));
  std::atomic<int> decoding{0};
  mesh::MultiSessionEvents ev;  // session s's callbacks all run on its worker
  ev.on_token = [&](int s, int32_t) {
    auto& t = times[static_cast<size_t>(s)];
    t.push_back(Clock::now());
    if (t.size() == 2 && ++decoding == n && all_decoding) all_decoding();
  };
  ev.stop_requested = [&](int s) {
    return stop(static_cast<int>(times[static_cast<size_t>(s)].size()));
  };
  mesh::GenerateOptions o;
  o.max_tokens = 1024;
  mesh::MultiSessionDriver driver(provider, {});
  const mesh::MultiSessionReport r = driver.Run(Prompts(n), o, ev);
  for (const auto& s : r.sessions) {
    if (!s.ok) throw std::runtime_error("a decode session failed: " + s.error);
  }
  return times;
}

// Gaps between consecutive tokens of each session that overlap [a, b]
// (everything when a == b == {}), in seconds.
std::vector<double> Gaps(const std::vector<std::vector<Clock::time_point>>& times,
                         Clock::time_point a = {}, Clock::time_point b = Clock::time_point::max()) {
  std::vector<double> out;
  for (const auto& t : times) {
    for (size_t k = 1; k < t.size(); ++k) {
      if (t[k] > a && t[k - 1] < b) {
        out.push_back(std::chrono::duration<double>(t[k] - t[k - 1]).count());
      }
    }
  }
  return out;
}

// One prefill of `tokens` tokens (and one generated token), started when
// Go() is called; its interval is [start, end].
class LongPrompt {
 public:
  LongPrompt(mesh::RouteProvider& provider, int tokens, int64_t chunk) {
    std::vector<int32_t> ids = {1};
    for (int i = 1; i < tokens; ++i) ids.push_back(3 + (i * 31) % 500);
    thread_ = std::thread([this, &provider, ids, chunk] {
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return go_; });
      }
      start_ = Clock::now();
      mesh::GenerateOptions o;
      o.max_tokens = 1;
      o.prefill_chunk = chunk;
      try {
        mesh::Generate(provider, ids, o);
      } catch (const std::exception& e) {
        error_ = e.what();
      }
      end_ = Clock::now();
      done_ = true;
    });
  }
  ~LongPrompt() { Join(); }
  void Go() {
    std::lock_guard lock(mu_);
    go_ = true;
    cv_.notify_all();
  }
  void Join() {
    Go();  // never leaves the thread waiting
    if (thread_.joinable()) thread_.join();
  }
  bool done() const { return done_; }
  Clock::time_point start() const { return start_; }
  Clock::time_point end() const { return end_; }
  const std::string& error() const { return error_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool go_ = false;
  std::atomic<bool> done_{false};
  Clock::time_point start_, end_;
  std::string error_;
  std::thread thread_;
};

void BM_Mixed(benchmark::State& state, std::string type, std::string route_name) {
  Route& route = RouteFor(type, route_name);
  constexpr int kSessions = 8;
  const int min_tokens = std::max(8, Flags().tokens);
  std::vector<double> base, during;
  double prefill_s = 0;
  int depth = 0;
  for (auto _ : state) {
    LongPrompt prompt(route.provider(), Flags().long_prompt, route.prefill_chunk());
    const auto times = RunDecoders(
        route.provider(), kSessions, [&](int n) { return prompt.done() && n >= min_tokens; },
        [&] { prompt.Go(); });
    prompt.Join();
    if (!prompt.error().empty()) return state.SkipWithError(prompt.error().c_str());
    during = Gaps(times, prompt.start(), prompt.end());
    prefill_s = std::chrono::duration<double>(prompt.end() - prompt.start()).count();
    // The baseline decodes as deep as the sessions were when the prefill
    // ended: a decode step's attention grows with its depth, so a shallower
    // baseline would charge that growth to the prefill.
    std::vector<double> at_end;
    for (const auto& t : times) {
      at_end.push_back(static_cast<double>(std::count_if(
          t.begin(), t.end(), [&](Clock::time_point x) { return x <= prompt.end(); })));
    }
    depth = std::max(2 * min_tokens, static_cast<int>(mesh::Percentile(at_end, 0.5)));
    base = Gaps(RunDecoders(route.provider(), kSessions, [&](int n) { return n >= depth; }, {}));
  }
  const double p99_base = mesh::Percentile(base, 0.99);
  const double p99_during = mesh::Percentile(during, 0.99);
  state.counters["itl_p99_base_ms"] = p99_base * 1e3;
  state.counters["itl_p99_prefill_ms"] = p99_during * 1e3;
  state.counters["p99_ratio"] = p99_base > 0 ? p99_during / p99_base : 0;
  state.counters["gaps_in_prefill"] = static_cast<double>(during.size());
  state.counters["decode_depth"] = depth;
  state.counters["prefill_s"] = prefill_s;
  state.counters["prefill_tok_per_s"] = prefill_s > 0 ? Flags().long_prompt / prefill_s : 0;
}

// One --mb_long_prompt-token prompt alone (one generated token), sent whole
// and in --mb_prompt_chunk pieces alternately, three times each: the median
// times and chunked_speedup (whole over chunked; > 1: the pieces' pipelining
// across the hops wins over their per-piece costs).
void BM_Prefill(benchmark::State& state, std::string type, std::string route_name) {
  Route& route = RouteFor(type, route_name);
  std::vector<double> whole, chunked;
  auto run = [&](int64_t chunk) {
    LongPrompt prompt(route.provider(), Flags().long_prompt, chunk);
    prompt.Join();
    if (!prompt.error().empty()) throw std::runtime_error(prompt.error());
    return std::chrono::duration<double>(prompt.end() - prompt.start()).count();
  };
  for (auto _ : state) {
    try {
      for (int r = 0; r < 3; ++r) {
        whole.push_back(run(0));
        chunked.push_back(run(Flags().prompt_chunk));
      }
    } catch (const std::exception& e) {
      return state.SkipWithError(e.what());
    }
  }
  const double w = mesh::Percentile(whole, 0.5), c = mesh::Percentile(chunked, 0.5);
  state.counters["whole_s"] = w;
  state.counters["chunked_s"] = c;
  state.counters["whole_tok_per_s"] = w > 0 ? Flags().long_prompt / w : 0;
  state.counters["chunked_tok_per_s"] = c > 0 ? Flags().long_prompt / c : 0;
  state.counters["chunked_speedup"] = c > 0 ? w / c : 0;
}

void Register() {
  const BenchFlags& f = Flags();
  for (const std::string& type : f.types) {
    for (const std::string& route : f.routes) {
      for (int n : f.sessions) {
        const std::string name = "Throughput/" + type + "/" + route + "/" + std::to_string(n);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [=](benchmark::State& s) { BM_Throughput(s, type, route, n); })
            ->Iterations(1)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
    benchmark::RegisterBenchmark(("Ratios/" + type).c_str(), [=](benchmark::State& s) {
      BM_Ratios(s, type);
    })->Iterations(1);
    for (const std::string& route : f.prefill) {
      benchmark::RegisterBenchmark(("Prefill/" + type + "/" + route).c_str(),
                                   [=](benchmark::State& s) { BM_Prefill(s, type, route); })
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
    }
    for (const std::string& route : f.mixed) {
      benchmark::RegisterBenchmark(("Mixed/" + type + "/" + route).c_str(),
                                   [=](benchmark::State& s) { BM_Mixed(s, type, route); })
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (const std::string& type : f.pressure) {
    benchmark::RegisterBenchmark(("KvPressure/" + type).c_str(),
                                 [=](benchmark::State& s) { BM_KvPressure(s, type); })
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace
}  // namespace meshnet

int main(int argc, char** argv) {
  meshnet::ParseFlags(&argc, argv);
  meshnet::Register();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
