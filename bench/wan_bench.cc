// Over a WAN: three `meshnet serve` nodes of the shipped model (layers 0-1,
// 2-3, 4-4), each reached through a user-space delay proxy
// (tests/tools/delay_proxy.h) with the same one-way delay on every link:
// the client's and the nodes' own (each node advertises its proxy, so a node
// forwarding a chain step to the next one goes through that node's proxy
// too). Relaying every hop (star), a token costs 6 link crossings at least:
// the star's floor is 1 / (6 x delay); along the chain with the tail's
// direct return, 4. Delay 0: no proxies (plain loopback).
//   BM_Wan/<delay_ms>/<sessions>: `sessions` sessions at once, 256 greedy
//     tokens each (64 for 16 sessions) of a prompt that repeats itself, star
//     and chain, each plainly and with speculative decoding (prompt lookup,
//     --speculate 4), and along the chain with drafts from a draft model
//     (the shipped model's Q4_K_M quantization, tests/data/quant), alternated
//     in one run; reports each one's aggregate
//     tokens/s, over the star's floor, chain_over_star,
//     chain_spec_over_star, and chain_link_share (the share of a chain
//     pass's time not spent computing in the hops). The outputs are checked
//     identical.
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "mesh/draft.h"
#include "mesh/generator.h"
#include "mesh/multi_session.h"
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
  explicit Mesh(double delay_s) {
    for (const char* layers : {"0-1", "2-3", "4-4"}) {
      std::vector<std::string> args = {
          "--model", MESHNET_SHIPPED_MODEL, "--layers", layers, "--threads",
          "1",       "--max-sessions",      "32"};
      if (delay_s > 0) {
        proxies.push_back(std::make_unique<meshnet::testing::DelayProxy>("", delay_s));
        args.insert(args.end(), {"--advertise", proxies.back()->address()});
      }
      nodes.push_back(std::make_unique<rpc::testing::NodeProcess>(
          MESHNET_BINARY, args, dir.file(std::string("node-") + layers + ".log")));
      if (delay_s > 0) {
        proxies.back()->SetTarget(nodes.back()->address());
        addresses.push_back(proxies.back()->address());
      } else {
        addresses.push_back(nodes.back()->address());
      }
    }
  }
  rpc::testing::ScratchDir dir;
  std::vector<std::unique_ptr<meshnet::testing::DelayProxy>> proxies;
  std::vector<std::unique_ptr<rpc::testing::NodeProcess>> nodes;
  std::vector<std::string> addresses;  // the proxies' (the nodes' without delay)
};

void BM_Wan(benchmark::State& state) {
  const double delay_s = static_cast<double>(state.range(0)) / 1e3;
  const int sessions = static_cast<int>(state.range(1));
  Mesh mesh(delay_s);
  rpc::ClientOptions co;
  co.timeout_s = 60;
  auto star = rpc::MakeRemoteRouteProvider(mesh.addresses, co);
  co.chain = true;
  auto chain = rpc::MakeRemoteRouteProvider(mesh.addresses, co);
  mesh::GenerateOptions plain;
  plain.max_tokens = sessions == 1 ? 256 : 64;
  mesh::GenerateOptions spec = plain;
  spec.speculate = 4;
  // A draft model: the shipped model's Q4_K_M quantization (same vocabulary,
  // other weights), run in this process.
  mesh::GenerateOptions drafted = spec;
  std::string quant = MESHNET_SHIPPED_MODEL;
  quant.replace(quant.rfind("models/"), std::string::npos,
                "tests/data/quant/stories260K-Q4_K_M.gguf");
  drafted.draft = std::make_shared<mesh::DraftModel>(
      std::make_shared<const meshnet::gguf::GgufFile>(meshnet::gguf::GgufFile::Open(quant)),
      int64_t{64} << 20);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < sessions; ++i) {
    prompts.push_back(Prompt());
    prompts.back().push_back(300 + i);  // distinct per session
  }
  struct Side {
    double seconds = 0;
    int64_t tokens = 0;
    double measured_s = 0, compute_s = 0;  // chain passes: their time, the hops' compute
    double tps() const { return static_cast<double>(tokens) / seconds; }
  };
  Side sides[5];  // star, star + spec, chain, chain + spec, chain + draft model
  auto run = [&](mesh::RouteProvider& p, const mesh::GenerateOptions& o, Side* side) {
    mesh::MultiSessionDriver driver(p, {});
    const mesh::MultiSessionReport r = driver.Run(prompts, o);
    side->seconds += r.wall_s;
    side->tokens += r.TotalTokens();
    for (const auto& s : r.sessions) {
      side->measured_s += s.result.measured_seconds;
      side->compute_s += s.result.measured_compute_seconds;
    }
    std::vector<std::vector<int32_t>> out;
    for (const auto& s : r.sessions) {
      out.push_back(s.ok ? s.result.generated_ids : std::vector<int32_t>{});
    }
    return out;
  };
  Side warm;
  const auto want = run(*star, plain, &warm);  // warm-up, untimed
  (void)run(*chain, plain, &warm);             // opens the tail's Returns stream
  for (auto _ : state) {
    if (run(*star, plain, &sides[0]) != want || run(*star, spec, &sides[1]) != want ||
        run(*chain, plain, &sides[2]) != want || run(*chain, spec, &sides[3]) != want ||
        run(*chain, drafted, &sides[4]) != want) {
      state.SkipWithError("chain or speculation changed the output");
      return;
    }
  }
  const char* names[5] = {"star", "star_spec", "chain", "chain_spec", "chain_draft"};
  for (int i = 0; i < 5; ++i) {
    state.counters[std::string(names[i]) + "_tok_s"] = sides[i].tps();
    if (delay_s > 0) {
      state.counters[std::string(names[i]) + "_over_floor"] = sides[i].tps() * 6 * delay_s;
    }
  }
  state.counters["chain_over_star"] = sides[2].tps() / sides[0].tps();
  // The share of a chain pass's time on links (and queues), not in the hops.
  state.counters["chain_link_share"] = 1.0 - sides[2].compute_s / sides[2].measured_s;
  state.counters["chain_spec_over_star"] = sides[3].tps() / sides[0].tps();
  state.counters["chain_draft_over_star"] = sides[4].tps() / sides[0].tps();
  state.counters["spec_over_plain_star"] = sides[1].tps() / sides[0].tps();
}
BENCHMARK(BM_Wan)
    ->Args({10, 1})
    ->Args({10, 16})
    ->Args({0, 1})
    ->Args({0, 16})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(2);

}  // namespace

BENCHMARK_MAIN();
