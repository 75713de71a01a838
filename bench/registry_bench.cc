// Route planning from the registry with many registered nodes: the client
// lists one model's records (the registry's index by model identity), scores
// them and plans. The time must be flat in the number of nodes that serve
// OTHER models. Baseline in the same run: 0 other nodes; contrast: listing
// every record and filtering (what a registry without the index would cost).
//
//   build/bench/registry_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <string>

#include "mesh/route_planner.h"
#include "registry/memory_registry.h"
#include "registry/planner.h"

namespace {

using meshnet::SigningKey;
using meshnet::registry::MemoryRegistry;
using meshnet::registry::NodeRecord;
using meshnet::registry::SignRecord;

NodeRecord Rec(const std::string& address, const std::string& model, int a, int b) {
  NodeRecord r;
  r.address = address;
  r.model_id = model;
  r.start_layer = a;
  r.end_layer = b;
  r.total_layers = 5;
  r.kv_budget_bytes = 1 << 20;
  r.kv_bytes_free = 1 << 19;
  r.sessions_free = 8;
  SignRecord(SigningKey::Generate(), &r);  // the registry takes signed records only
  return r;
}

// 5 nodes of "ours" (two replicas of 2-3) and `others` nodes of 100 other models.
void Fill(MemoryRegistry& reg, int64_t others) {
  const int ranges[][2] = {{0, 0}, {1, 1}, {2, 3}, {2, 3}, {4, 4}};
  for (int i = 0; i < 5; ++i) {
    reg.Announce(Rec("10.0.0." + std::to_string(i) + ":1", "ours", ranges[i][0], ranges[i][1]),
                 3600);
  }
  for (int64_t i = 0; i < others; ++i) {
    reg.Announce(
        Rec("10.1." + std::to_string(i / 250) + "." + std::to_string(i % 250) + ":1",
            "other" + std::to_string(i % 100), static_cast<int>(i % 5), static_cast<int>(i % 5)),
        3600);
  }
}

std::vector<size_t> Plan(const std::vector<NodeRecord>& nodes) {
  std::vector<double> costs;
  for (const auto& r : nodes) costs.push_back(meshnet::registry::NodeCost(r, 0.3, 0));
  return meshnet::mesh::PlanRoute(meshnet::registry::ToCandidates(nodes, costs), 5);
}

void BM_PlanIndexed(benchmark::State& state) {
  MemoryRegistry reg;
  Fill(reg, state.range(0));
  for (auto _ : state) {
    auto route = Plan(reg.List("ours").nodes);
    benchmark::DoNotOptimize(route);
  }
  state.counters["other_nodes"] = static_cast<double>(state.range(0));
}
BENCHMARK(BM_PlanIndexed)->Arg(0)->Arg(1000)->Arg(10000);

void BM_PlanUnindexed(benchmark::State& state) {
  MemoryRegistry reg;
  Fill(reg, state.range(0));
  for (auto _ : state) {
    std::vector<NodeRecord> ours;
    for (auto& r : reg.List().nodes) {
      if (r.model_id == "ours") ours.push_back(std::move(r));
    }
    auto route = Plan(ours);
    benchmark::DoNotOptimize(route);
  }
  state.counters["other_nodes"] = static_cast<double>(state.range(0));
}
BENCHMARK(BM_PlanUnindexed)->Arg(0)->Arg(1000)->Arg(10000);

}  // namespace

BENCHMARK_MAIN();
