// KV migration (issue 13): how fast one session's KV moves node to node, and
// how long a drain of 16 sessions takes, on a generated real-shape model
// (768-dim, 12 layers, Q8_0; written to a temp dir, as api_bench does).
//
//   BM_LoopbackTcp        the baseline: raw TCP over 127.0.0.1 (one socket, 1 MiB
//                         writes, connection setup included) moving as many
//                         bytes as one session's f32 KV.
//   BM_MigrateSession/dtype:D/grpc:G  rpc::PushSession of a 1,000-token
//                         session of all 12 layers, KV dtype D (0 = f32:
//                         73.7 MB, 1 = f16), to a NodeServer on 127.0.0.1,
//                         which verifies every chunk and the digest: G = 0
//                         over its KV transfer port (OfferImport, then the rows
//                         sent from the paged blocks and received into the
//                         reserved ones; rpc/kv_transfer.h), G = 1 streamed
//                         over gRPC (ImportSession). Counter vs_tcp: this
//                         rate over that of a raw TCP transfer of the same
//                         bytes run just before each migration (goal >= 0.5).
//   BM_ExportOnly         reading + CRC32C of the same export, no network.
//   BM_Drain16/P          rpc::DrainSessions of 16 sessions of 256 tokens (a
//                         4-layer head shard, f32) to a replica NodeServer,
//                         P sessions at a time (DrainOptions::parallel; 4 is
//                         the default, 1 the one-by-one baseline).
//
// The source node is in this process (its NodeCore is driven directly; the
// bytes still cross loopback TCP to the target's gRPC server). The sessions'
// KV is written with HotKvStateManager::Append (random values, a 1-token
// prefill first for the binding): the transfer does not depend on the values,
// and a real 1,000-token prefill of this model takes seconds per iteration.
#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "bench_util.h"
#include "gguf/gguf_reader.h"
#include "gguf/make_model.h"
#include "node/identity.h"
#include "node/node.h"
#include "node/node_core.h"
#include "rpc/drain.h"
#include "rpc/migrate.h"
#include "rpc/remote.h"
#include "rpc/server.h"

namespace {

using namespace meshnet;  // NOLINT: a benchmark

std::shared_ptr<const gguf::GgufFile> Model() {
  static bench::TempDir dir("migration_bench");
  static auto file = [] {
    const std::string path = bench::MakeLlama768(dir.path, "llama768-q8_0", GgmlType::kQ8_0, 1024,
                                                 MESHNET_SHIPPED_MODEL);
    return std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(path));
  }();
  return file;
}

const std::string kSecret = "bench-secret";

// A source node and a target NodeServer of the same range.
struct Pair {
  Pair(int end_layer, KvDtype dtype, int64_t budget) {
    node::NodeOptions o;
    o.layers = node::LayerRange{0, end_layer};
    o.kv_dtype = dtype;
    o.kv_config.budget_bytes = budget;
    o.kv_config.max_sessions = 64;
    source = std::make_unique<node::Node>(Model(), o, nullptr);
    target = std::make_unique<node::Node>(Model(), o, nullptr);
    core = std::make_unique<node::NodeCore>(source.get());
    rpc::NodeServerOptions so;
    so.max_message_bytes = 64 << 20;
    server = std::make_unique<rpc::NodeServer>(target.get(), so);
    server->Start();
    client = std::make_unique<rpc::RemoteEndpoint>(server->bound_address(), rpc::ClientOptions{});
  }
  // A session of `tokens` positions on the source: a 1-token prefill, then
  // random K/V appended for every owned layer.
  std::string AddSession(int64_t tokens) {
    const std::string id = node::RandomId128();
    node::StepRequest r;
    r.session_id = id;
    r.session_secret = kSecret;
    r.prefill = true;
    r.token_ids = {1};
    core->Step(r);
    const kv::KvCacheRecipe& rc = source->adapter().recipe();
    const int64_t n = tokens - 1;
    std::vector<float> data(static_cast<size_t>(n * rc.n_kv_heads * rc.head_dim));
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1, 1);
    for (float& x : data) x = u(rng);
    std::vector<kv::LayerKv> kv;
    for (int l = rc.start_layer; l <= rc.end_layer; ++l) kv.push_back({l, n, data, data});
    source->manager().Append(id, 0, kv, nullptr, 1);
    return id;
  }
  std::unique_ptr<node::Node> source, target;
  std::unique_ptr<node::NodeCore> core;
  std::unique_ptr<rpc::NodeServer> server;
  std::unique_ptr<rpc::RemoteEndpoint> client;
};

// Raw TCP over loopback: `bytes` in 1 MiB writes, one connection. Timed from
// before the connect to the reader's last byte (the migration's time also
// includes its connection setup).
double LoopbackTcpSeconds(int64_t bytes) {
  const int ls = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a);
  listen(ls, 1);
  getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len);
  std::thread reader([ls, bytes] {
    const int fd = accept(ls, nullptr, nullptr);
    std::vector<char> buf(1 << 20);
    int64_t got = 0;
    while (got < bytes) {
      const ssize_t n = recv(fd, buf.data(), buf.size(), 0);
      if (n <= 0) break;
      got += n;
    }
    close(fd);
  });
  std::vector<char> buf(1 << 20, 'x');
  const auto t0 = std::chrono::steady_clock::now();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  for (int64_t sent = 0; sent < bytes;) {
    const ssize_t n = send(fd, buf.data(), std::min<int64_t>(bytes - sent, buf.size()), 0);
    if (n <= 0) break;
    sent += n;
  }
  reader.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close(fd);
  close(ls);
  return s;
}

constexpr int64_t kSessionTokens = 1000;

int64_t SessionBytes(KvDtype dtype) { return kSessionTokens * 12 * 2 * 768 * KvDtypeSize(dtype); }

void BM_LoopbackTcp(benchmark::State& state) {
  const int64_t bytes = SessionBytes(KvDtype::kF32);
  for (auto _ : state) state.SetIterationTime(LoopbackTcpSeconds(bytes));
  state.SetBytesProcessed(bytes * state.iterations());
}
BENCHMARK(BM_LoopbackTcp)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);

// Each iteration first moves the same number of bytes over raw loopback TCP
// (timing paused), so the baseline sees the same load as the migration right
// after it: vs_tcp = migration rate / that interleaved TCP rate. cpu_ms and
// tcp_cpu_ms: this process's CPU time (both nodes' threads, or both sockets'
// ends) per transfer; faults: minor page faults per migration (first touches
// of fresh memory).
void BM_MigrateSession(benchmark::State& state) {
  const KvDtype dtype = state.range(0) == 0 ? KvDtype::kF32 : KvDtype::kF16;
  Pair pair(11, dtype, 256 << 20);
  const std::string id = pair.AddSession(kSessionTokens);
  rpc::ClientOptions co;
  co.kv_transfer = state.range(1) == 0;
  int64_t bytes = 0;
  double tcp_s = 0, mig_s = 0, tcp_cpu = 0, mig_cpu = 0, faults = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const double c0 = bench::SelfCpuSeconds();
    tcp_s += LoopbackTcpSeconds(SessionBytes(dtype));
    const double c1 = bench::SelfCpuSeconds();
    tcp_cpu += c1 - c0;
    state.ResumeTiming();
    rusage ru0{};
    getrusage(RUSAGE_SELF, &ru0);
    const auto t0 = std::chrono::steady_clock::now();
    auto exp = pair.core->BeginExport(id, &kSecret);
    bytes =
        rpc::PushSession(*exp, {pair.server->bound_address(), ""}, pair.core->node().Info(), co);
    mig_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.PauseTiming();
    mig_cpu += bench::SelfCpuSeconds() - c1;
    rusage ru1{};
    getrusage(RUSAGE_SELF, &ru1);
    faults += static_cast<double>(ru1.ru_minflt - ru0.ru_minflt);
    exp.reset();
    pair.client->ReleaseOrThrow(id, kSecret, 0);
    state.ResumeTiming();
  }
  if (bytes != SessionBytes(dtype)) state.SkipWithError("moved a different byte count");
  const auto n = static_cast<double>(state.iterations());
  state.SetBytesProcessed(bytes * state.iterations());
  state.counters["session_MB"] = static_cast<double>(bytes) / 1e6;
  state.counters["tcp_MBps"] = static_cast<double>(bytes) * n / tcp_s / 1e6;
  state.counters["vs_tcp"] = tcp_s / mig_s;
  state.counters["cpu_ms"] = mig_cpu / n * 1e3;
  state.counters["faults"] = faults / n;
  state.counters["tcp_cpu_ms"] = tcp_cpu / n * 1e3;
}
BENCHMARK(BM_MigrateSession)
    ->ArgNames({"dtype", "grpc"})
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({0, 1})
    ->Args({1, 1})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0)
    ->UseRealTime();

// Where the time goes: reading + checksumming the export alone (no network).
void BM_ExportOnly(benchmark::State& state) {
  Pair pair(11, KvDtype::kF32, 256 << 20);
  const std::string id = pair.AddSession(kSessionTokens);
  int64_t bytes = 0;
  for (auto _ : state) {
    auto exp = pair.core->BeginExport(id, &kSecret);
    node::KvChunk c;
    while (exp->Next(&c)) benchmark::DoNotOptimize(c.data.data());
    bytes = exp->trailer().total_bytes;
  }
  state.SetBytesProcessed(bytes * state.iterations());
}
BENCHMARK(BM_ExportOnly)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();

void BM_Drain16(benchmark::State& state) {
  Pair pair(3, KvDtype::kF32, 256 << 20);
  int64_t bytes = 0;
  for (auto _ : state) {
    state.PauseTiming();
    pair.core = std::make_unique<node::NodeCore>(pair.source.get());  // not draining
    std::vector<std::string> ids;
    for (int i = 0; i < 16; ++i) ids.push_back(pair.AddSession(256));
    rpc::DrainOptions o;
    o.find_replicas = rpc::StaticReplicas({pair.server->bound_address()});
    o.parallel = static_cast<int>(state.range(0));
    state.ResumeTiming();
    const rpc::DrainReport r = rpc::DrainSessions(*pair.core, o);
    state.PauseTiming();
    if (r.moved != 16) state.SkipWithError("not every session moved");
    bytes = r.bytes_moved;
    for (const auto& id : ids) pair.client->ReleaseOrThrow(id, kSecret, 0);
    state.ResumeTiming();
  }
  state.counters["MB_moved"] = static_cast<double>(bytes) / 1e6;
}
BENCHMARK(BM_Drain16)->Arg(1)->Arg(4)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
