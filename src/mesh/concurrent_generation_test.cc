// Budget and session-cap pressure across concurrent generations never
// corrupts output: 8 concurrent generations through one set of in-process
// shards whose managers cannot hold them all, each equal to its solo run.
#include <gtest/gtest.h>

#include <barrier>
#include <thread>

#include "gguf/gguf_reader.h"
#include "mesh/generator.h"
#include "mesh/in_process.h"
#include "model/tokenizer.h"
#include "node/layer_range.h"
#include "util/thread_pool.h"

namespace meshnet::mesh {
namespace {

TEST(ConcurrentGeneration, PressureNeverCorruptsOutput) {
  auto file = std::make_shared<const gguf::GgufFile>(
      gguf::GgufFile::Open(std::string(MESHNET_SOURCE_DIR) + "/models/stories260K.gguf"));
  const auto tok = model::Tokenizer::FromGguf(*file);
  ThreadPool pool(2);
  const std::vector<std::string> prompts = {
      "Once upon a time", "The cat",          "Lily and Tom", "One day, a bird",
      "The sun was",      "A little dog ran", "Mom said",     "There was a big tree"};
  constexpr int kTokens = 48;

  auto options_for = [&](size_t i) {
    GenerateOptions o;
    o.max_tokens = kTokens;
    o.sampling = {0.8f, 20, 0.9f, 1000 + i};
    o.max_recoveries = 10000;  // pressure makes misses frequent; each one re-prefills
    o.backoff_initial_s = 0;
    return o;
  };

  // Solo runs with room to spare.
  std::vector<std::vector<int32_t>> solo(prompts.size());
  {
    InProcessMeshOptions mo;
    mo.split = node::EvenSplit(3, 5);
    InProcessMesh mesh(file, mo, &pool);
    for (size_t i = 0; i < prompts.size(); ++i) {
      FixedRouteProvider p(mesh.route());
      solo[i] = Generate(p, tok.Encode(prompts[i], true), options_for(i)).generated_ids;
    }
  }

  // Concurrent runs: at most 5 sessions per shard, and a byte budget of 4
  // sessions of 64 positions on the two-layer shards (512 bytes per position).
  InProcessMeshOptions mo;
  mo.split = node::EvenSplit(3, 5);
  mo.kv_config.max_sessions = 5;
  mo.kv_config.block_tokens = 16;
  mo.kv_config.budget_bytes = 4 * 64 * 512;
  mo.kv_dtype = KvDtype::kF32;  // 512 bytes per position: 4-byte K/V values
  InProcessMesh mesh(file, mo, &pool);
  ASSERT_EQ(mesh.manager(0).recipe().BytesPerToken(), 512);
  std::vector<std::vector<int32_t>> got(prompts.size());
  std::vector<int> recoveries(prompts.size());
  // The generations advance in lockstep (a barrier after every token), so all
  // eight sessions are live at once on every shard, whatever the scheduler
  // does: the cap of 5 must evict on every round.
  std::barrier round(static_cast<std::ptrdiff_t>(prompts.size()));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      FixedRouteProvider p(mesh.route());
      GenerateEvents ev;
      ev.on_token = [&](int32_t) { round.arrive_and_wait(); };
      try {
        GenerateResult r = Generate(p, tok.Encode(prompts[i], true), options_for(i), ev);
        got[i] = r.generated_ids;
        recoveries[i] = r.re_prefills;
      } catch (const std::exception& e) {
        ADD_FAILURE() << prompts[i] << ": " << e.what();
        round.arrive_and_drop();
      }
    });
  }
  for (auto& t : threads) t.join();
  int total_recoveries = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i], solo[i]) << prompts[i];
    total_recoveries += recoveries[i];
  }
  int64_t evictions = 0;
  for (int s = 0; s < 3; ++s) {
    const kv::HotKvStats st = mesh.manager(s).Stats();
    EXPECT_LE(st.bytes_reserved, st.bytes_budget);
    evictions += st.evictions[static_cast<int>(kv::CacheMissReason::kEvictedLru)];
  }
  EXPECT_GT(evictions, 0) << "the test must actually create pressure";
  EXPECT_GT(total_recoveries, 0);
}

}  // namespace
}  // namespace meshnet::mesh
