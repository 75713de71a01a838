// Replay throughput: the decode trace of `scripts/gen_trace.py --decode 8 1024
// --no-resolve` (config, 8 opens, 8 sessions x 1024 one-token appends with
// expected_seq_len, stats; 4 owned layers x 8 KV heads x 64 dims float32, 128
// MiB of KV at the end) replayed by ReplayStream in-process, against the
// reference seed_replay.py run once on the same trace in the same run.
//
// Times are CPU seconds (user + system: this process for our replay, the
// child for the reference), so that other load on a shared machine does not
// skew the ratio; wall-clock ratios are reported too.
//
//   speedup_vs_python       reference CPU (minus its interpreter + numpy
//                           start-up, measured on the config line alone) over
//                           the best warm replay
//   speedup_vs_python_cold  the same over the first replay in this process,
//                           whose time is mostly first-touch page faults of
//                           the 128 MiB block pool
//   outputs_identical       the reference's output equals ours byte for byte
//
// "Warm" replays reuse memory the allocator kept from the previous replay (as
// a long-running node reuses its pool): main() raises glibc's mmap and trim
// thresholds so freed slabs stay in the heap. The reference: $MESHNET_SEED_REPLAY
// (default MESHNET_SEED_REPLAY_DEFAULT) run by $MESHNET_REFERENCE_PYTHON
// (default /usr/bin/python3); without it the benchmark says so in its label.
#include <benchmark/benchmark.h>
#include <malloc.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "kvtrace/trace_replay.h"

#ifndef MESHNET_SEED_REPLAY_DEFAULT
#define MESHNET_SEED_REPLAY_DEFAULT "../shared/seed/seed_replay.py"
#endif

namespace meshnet::kv {
namespace {

constexpr int kSessions = 8;
constexpr int kTokens = 1024;
constexpr int kLayers = 4, kHeads = 8, kDim = 64;

// Byte-identical to gen_trace.py's decode_trace(8, 1024, resolve=False).
std::string DecodeTrace() {
  const long bpt = 2L * kHeads * kDim * 4 * kLayers;
  std::ostringstream t;
  t << R"({"op":"config","budget_bytes":)" << bpt * kSessions * kTokens << R"(,"max_sessions":)"
    << kSessions << R"(,"ttl_seconds":0.0,"miss_history":256,"block_tokens":1,"recipe":{)"
    << R"("architecture_adapter":"llama","kv_dtype":"float32","n_kv_heads":)" << kHeads
    << R"(,"head_dim":)" << kDim << R"(,"total_layers":32,"start_layer":0,"end_layer":)"
    << kLayers - 1 << "}}\n";
  for (int s = 0; s < kSessions; ++s) {
    t << R"({"op":"open","t":0.0,"session":"decode-)" << s << R"(","epoch":0})"
      << "\n";
  }
  for (int pos = 0; pos < kTokens; ++pos) {
    for (int s = 0; s < kSessions; ++s) {
      t << R"({"op":"append","session":"decode-)" << s
        << R"(","epoch":0,"tokens":1,"expected_seq_len":)" << pos << "}\n";
    }
  }
  t << R"({"op":"stats"})"
    << "\n";
  return t.str();
}

double ProcessCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
double ChildrenCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_CHILDREN, &u);
  auto s = [](const timeval& v) { return static_cast<double>(v.tv_sec) + 1e-6 * v.tv_usec; };
  return s(u.ru_utime) + s(u.ru_stime);
}
double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string Env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

struct Run {
  double cpu = -1, wall = -1;
};

// `python reference < in > out`; CPU and wall seconds, cpu < 0 on failure.
Run RunReference(const std::string& python, const std::string& reference,
                 const std::filesystem::path& in, const std::filesystem::path& out) {
  const std::string cmd =
      "'" + python + "' '" + reference + "' < '" + in.string() + "' > '" + out.string() + "'";
  const double c0 = ChildrenCpuSeconds(), w0 = WallSeconds();
  const int rc = std::system(cmd.c_str());
  Run r;
  if (rc == 0) r = Run{ChildrenCpuSeconds() - c0, WallSeconds() - w0};
  return r;
}

struct Reference {
  bool available = false;
  std::string why;
  Run whole, startup;  // the decode trace; the config line alone
  std::string output;
};

const Reference& TimedReference(const std::string& trace) {
  static const Reference ref = [&] {
    Reference r;
    const std::string python = Env("MESHNET_REFERENCE_PYTHON", "/usr/bin/python3");
    const std::string reference = Env("MESHNET_SEED_REPLAY", MESHNET_SEED_REPLAY_DEFAULT);
    namespace fs = std::filesystem;
    if (!fs::exists(python) || !fs::exists(reference)) {
      r.why = "reference unavailable (" + python + ", " + reference + ")";
      return r;
    }
    const fs::path dir =
        fs::temp_directory_path() / ("meshnet-replay-bench-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    std::ofstream(dir / "decode.trace.jsonl", std::ios::binary) << trace;
    std::ofstream(dir / "config.trace.jsonl", std::ios::binary)
        << trace.substr(0, trace.find('\n') + 1);
    std::fprintf(stderr, "replay_bench: running the reference once (%s)...\n", reference.c_str());
    r.startup = RunReference(python, reference, dir / "config.trace.jsonl", dir / "config.out");
    r.whole = RunReference(python, reference, dir / "decode.trace.jsonl", dir / "decode.out");
    if (r.startup.cpu < 0 || r.whole.cpu < 0) {
      r.why = "reference failed (numpy missing?)";
    } else {
      std::ifstream in(dir / "decode.out", std::ios::binary);
      r.output.assign(std::istreambuf_iterator<char>(in), {});
      r.available = true;
    }
    fs::remove_all(dir);
    return r;
  }();
  return ref;
}

Run g_cold;  // the first replay of this process

void BM_ReplayDecodeTrace(benchmark::State& state) {
  const std::string trace = DecodeTrace();
  const auto path = static_cast<ReplayAppendPath>(state.range(0));
  std::string output;
  Run best{1e30, 1e30};
  for (auto _ : state) {
    std::istringstream in(trace);
    std::ostringstream out;
    const double c0 = ProcessCpuSeconds(), w0 = WallSeconds();
    ReplayStream(in, out, path);
    const Run r{ProcessCpuSeconds() - c0, WallSeconds() - w0};
    if (g_cold.cpu < 0) g_cold = r;
    best.cpu = std::min(best.cpu, r.cpu);
    best.wall = std::min(best.wall, r.wall);
    output = out.str();
  }
  const int64_t ops = kSessions * (kTokens + 1) + 2;
  state.SetItemsProcessed(state.iterations() * ops);
  state.counters["replay_cpu_ms"] = best.cpu * 1e3;
  state.counters["cold_replay_cpu_ms"] = g_cold.cpu * 1e3;
  state.SetLabel(path == ReplayAppendPath::kAppend ? "append path" : "step path");
  const Reference& ref = TimedReference(trace);
  if (!ref.available) {
    state.SetLabel(ref.why);
    return;
  }
  const double python_cpu = ref.whole.cpu - ref.startup.cpu;
  state.counters["python_cpu_s"] = ref.whole.cpu;
  state.counters["python_startup_cpu_s"] = ref.startup.cpu;
  state.counters["speedup_vs_python"] = python_cpu / best.cpu;
  state.counters["speedup_vs_python_cold"] = python_cpu / g_cold.cpu;
  state.counters["speedup_vs_python_wall"] = (ref.whole.wall - ref.startup.wall) / best.wall;
  state.counters["outputs_identical"] = ref.output == output ? 1 : 0;
}
BENCHMARK(BM_ReplayDecodeTrace)
    ->Arg(static_cast<int>(ReplayAppendPath::kAppend))
    ->Arg(static_cast<int>(ReplayAppendPath::kStep))
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);

}  // namespace
}  // namespace meshnet::kv

int main(int argc, char** argv) {
  // Keep freed pool slabs in the heap for the warm replays (see the header).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
