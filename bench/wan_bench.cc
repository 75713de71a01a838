// Over a WAN: three `meshnet serve` nodes of the shipped model (layers 0-1,
// 2-3, 4-4), each reached through a user-space delay proxy
// (tests/tools/delay_proxy.h) with the same one-way delay on every
// client-to-node link. The client relays every hop (the star path), so one
// token costs 6 link crossings at least: the floor is 1 / (6 x delay).
//   BM_WanStar/<delay_ms>: one session, 128 greedy tokens of a prompt that
//     repeats itself, once plainly and once with speculative decoding
//     (prompt lookup, --speculate 4), alternated in one run; reports each
//     side's tokens/s, both over the floor, and spec_over_plain. The outputs
//     are checked identical.
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mesh/generator.h"
#include "rpc/remote.h"
#include "rpc/test_util.h"
#include "tests/rpc/node_process.h"
#include "tests/tools/delay_proxy.h"

namespace {

namespace mesh = meshnet::mesh;
namespace rpc = meshnet::rpc;
using Clock = std::chrono::steady_clock;

// "Once upon a time, there was a little girl named Lily. She loved to play
// outside." in the shipped model's ids, twice: a prompt whose continuation
// prompt lookup can often guess.
std::vector<int32_t> Prompt() {
  const std::vector<int32_t> once = {1,   403, 407, 261, 378, 432, 383, 286, 261,
                                     376, 298, 315, 421, 395, 317, 426, 338, 401,
                                     396, 267, 337, 410, 408, 419, 292, 411, 426};
  std::vector<int32_t> p = once;
  p.insert(p.end(), once.begin() + 1, once.end());
  return p;
}

struct Mesh {
  Mesh() {
    for (const char* layers : {"0-1", "2-3", "4-4"}) {
      nodes.push_back(std::make_unique<rpc::testing::NodeProcess>(
          MESHNET_BINARY,
          std::vector<std::string>{"--model", MESHNET_SHIPPED_MODEL, "--layers", layers,
                                   "--threads", "1"},
          dir.file(std::string("node-") + layers + ".log")));
    }
  }
  rpc::testing::ScratchDir dir;
  std::vector<std::unique_ptr<rpc::testing::NodeProcess>> nodes;
};

Mesh& Nodes() {
  static Mesh m;
  return m;
}

void BM_WanStar(benchmark::State& state) {
  const double delay_s = static_cast<double>(state.range(0)) / 1e3;
  std::vector<std::unique_ptr<meshnet::testing::DelayProxy>> proxies;
  std::vector<std::string> addresses;
  for (const auto& n : Nodes().nodes) {
    proxies.push_back(std::make_unique<meshnet::testing::DelayProxy>(n->address(), delay_s));
    addresses.push_back(proxies.back()->address());
  }
  rpc::ClientOptions co;
  co.timeout_s = 60;
  auto provider = rpc::MakeRemoteRouteProvider(addresses, co);
  mesh::GenerateOptions plain;
  plain.max_tokens = 128;
  mesh::GenerateOptions spec = plain;
  spec.speculate = 4;
  double plain_s = 0, spec_s = 0;
  int64_t plain_tokens = 0, spec_tokens = 0, drafted = 0, accepted = 0;
  auto run = [&](const mesh::GenerateOptions& o, double* seconds, int64_t* tokens) {
    const Clock::time_point t0 = Clock::now();
    mesh::GenerateResult r = mesh::Generate(*provider, Prompt(), o);
    *seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    *tokens += static_cast<int64_t>(r.generated_ids.size());
    drafted += r.drafted;
    accepted += r.accepted;
    return r.generated_ids;
  };
  const std::vector<int32_t> want = run(plain, &plain_s, &plain_tokens);  // warm-up, untimed
  plain_s = 0;
  plain_tokens = 0;
  for (auto _ : state) {
    if (run(plain, &plain_s, &plain_tokens) != want || run(spec, &spec_s, &spec_tokens) != want) {
      state.SkipWithError("speculation changed the output");
      return;
    }
  }
  const double floor = 1.0 / (6 * delay_s);
  const double plain_tps = plain_tokens / plain_s, spec_tps = spec_tokens / spec_s;
  state.counters["floor_tok_s"] = floor;
  state.counters["plain_tok_s"] = plain_tps;
  state.counters["spec_tok_s"] = spec_tps;
  state.counters["plain_over_floor"] = plain_tps / floor;
  state.counters["spec_over_floor"] = spec_tps / floor;
  state.counters["spec_over_plain"] = spec_tps / plain_tps;
  state.counters["accepted_per_draft"] = drafted > 0 ? static_cast<double>(accepted) / drafted : 0;
}
BENCHMARK(BM_WanStar)->Arg(10)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
