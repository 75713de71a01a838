// The multi-session driver on the in-process route (stories260K split into 3
// shards): many concurrent greedy sessions each produce exactly their solo
// output, the hops work at the same time (pipelining), a failing or cancelled
// session leaves nothing behind on any hop, and the report's statistics.
#include "mesh/multi_session.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>

#include "gguf/gguf_reader.h"
#include "mesh/in_process.h"
#include "mesh/test_util.h"
#include "node/batcher.h"
#include "util/thread_pool.h"

namespace meshnet::mesh {
namespace {

std::shared_ptr<const gguf::GgufFile> File() {
  static auto file = std::make_shared<const gguf::GgufFile>(
      gguf::GgufFile::Open(std::string(MESHNET_SOURCE_DIR) + "/models/stories260K.gguf"));
  return file;
}

// Distinct prompts (so every session has its own continuation).
std::vector<std::vector<int32_t>> Prompts(int n) {
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p = {1, 403, 407, 261, 378};
    p.push_back(10 + 7 * i);
    if (i % 3 == 0) p.push_back(429);  // not all the same length
    out.push_back(p);
  }
  return out;
}

GenerateOptions Greedy(int max_tokens) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.backoff_initial_s = 0;
  return o;
}

class MultiSessionTest : public ::testing::Test {
 protected:
  explicit MultiSessionTest(int max_sessions = 64) : pool_(2) {
    InProcessMeshOptions mo;
    mo.split = {{0, 1}, {2, 3}, {4, 4}};
    mo.kv_config.max_sessions = max_sessions;
    mesh_ = std::make_unique<InProcessMesh>(File(), mo, &pool_);
  }

  std::vector<std::vector<int32_t>> Solo(const std::vector<std::vector<int32_t>>& prompts,
                                         const GenerateOptions& o) {
    std::vector<std::vector<int32_t>> out;
    for (const auto& p : prompts) {
      FixedRouteProvider provider(mesh_->route());
      out.push_back(Generate(provider, p, o).generated_ids);
    }
    return out;
  }

  int64_t LiveSessions() {
    int64_t n = 0;
    for (int i = 0; i < mesh_->num_shards(); ++i) n += mesh_->manager(i).Stats().live_sessions;
    return n;
  }

  ThreadPool pool_;
  std::unique_ptr<InProcessMesh> mesh_;
};

TEST_F(MultiSessionTest, ThirtyTwoSessionsEachEqualTheirSoloRun) {
  const auto prompts = Prompts(32);
  const GenerateOptions o = Greedy(24);
  const auto solo = Solo(prompts, o);
  FixedRouteProvider provider(mesh_->route());
  MultiSessionDriver driver(provider, {});
  std::atomic<int> tokens{0};
  MultiSessionEvents ev;
  ev.on_token = [&](int, int32_t) { ++tokens; };
  const MultiSessionReport r = driver.Run(prompts, o, ev);
  ASSERT_EQ(r.sessions.size(), prompts.size());
  EXPECT_EQ(r.failed(), 0);
  int64_t total = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const SessionOutcome& s = r.sessions[i];
    ASSERT_TRUE(s.ok) << i << ": " << s.error;
    EXPECT_EQ(s.result.generated_ids, solo[i]) << "session " << i;
    EXPECT_EQ(s.token_times_s.size(), s.result.generated_ids.size());
    EXPECT_GE(s.TimeToFirstToken(), 0.0);
    EXPECT_LE(s.finished_s, r.wall_s);
    total += static_cast<int64_t>(solo[i].size());
  }
  EXPECT_EQ(r.TotalTokens(), total);
  EXPECT_EQ(tokens.load(), total);
  EXPECT_GT(r.TokensPerSecond(), 0.0);
  EXPECT_EQ(r.InterTokenGaps().size(), static_cast<size_t>(total) - prompts.size());
  EXPECT_EQ(LiveSessions(), 0) << "every session is released on every hop";
}

TEST_F(MultiSessionTest, HopsComputeAtTheSameTime) {
  testing::HopActivity activity(3);
  FixedRouteProvider provider(testing::Observed(mesh_->route(), &activity));
  MultiSessionDriver driver(provider, {});
  const MultiSessionReport r = driver.Run(Prompts(16), Greedy(32));
  EXPECT_EQ(r.failed(), 0);
  EXPECT_GE(activity.steps(), 3 * 16 * 32);
  // One session at a time would never have two hops busy at once.
  RecordProperty("max_busy_hops", activity.max_busy_hops());
  EXPECT_GE(activity.max_busy_hops(), 2);
  EXPECT_EQ(LiveSessions(), 0);
}

TEST_F(MultiSessionTest, MaxInFlightBoundsTheLiveSessions) {
  const auto prompts = Prompts(10);
  const GenerateOptions o = Greedy(12);
  const auto solo = Solo(prompts, o);
  FixedRouteProvider provider(mesh_->route());
  MultiSessionDriver driver(provider, {.max_in_flight = 3});
  std::atomic<int64_t> peak{0};
  MultiSessionEvents ev;
  ev.on_token = [&](int, int32_t) {
    const int64_t live = mesh_->manager(0).Stats().live_sessions;
    for (int64_t p = peak.load(); live > p && !peak.compare_exchange_weak(p, live);) {
    }
  };
  const MultiSessionReport r = driver.Run(prompts, o, ev);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(r.sessions[i].result.generated_ids, solo[i]) << i;
  }
  EXPECT_GE(peak.load(), 1);
  EXPECT_LE(peak.load(), 3);
  EXPECT_EQ(LiveSessions(), 0);
}

// More sessions than the KV budget holds at full length (16 contexts of 3
// blocks against 36 blocks a shard): with active sessions protected
// (HotKvStateConfig::active_seconds), room comes from the sessions that
// arrived last, a new context waits for room instead of evicting one that is
// generating, and every session still ends with its solo output. Under plain
// LRU eviction the sessions evicted each other's state round after round and
// some gave up ("giving up after 8 recoveries").
TEST(MultiSessionKvPressure, SessionsBeyondTheBudgetAllFinishWithTheirSoloOutput) {
  ThreadPool pool(2);
  InProcessMeshOptions mo;
  mo.split = {{0, 1}, {2, 3}, {4, 4}};
  mo.kv_config.max_sessions = 64;
  mo.kv_config.active_seconds = 30;
  const int64_t block_bytes = InProcessMesh(File(), mo, &pool).manager(0).block_bytes();
  mo.kv_config.budget_bytes = 36 * block_bytes;
  InProcessMesh mesh(File(), mo, &pool);
  const auto prompts = Prompts(16);  // 6-7 tokens each: + 40 generated = 3 blocks of 16
  const GenerateOptions o = Greedy(40);
  std::vector<std::vector<int32_t>> solo;
  for (const auto& p : prompts) {
    FixedRouteProvider provider(mesh.route());
    solo.push_back(Generate(provider, p, o).generated_ids);
  }
  FixedRouteProvider provider(mesh.route());
  MultiSessionDriver driver(provider, {});
  const MultiSessionReport r = driver.Run(prompts, o, {});
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(r.sessions[i].ok) << i << ": " << r.sessions[i].error;
    EXPECT_EQ(r.sessions[i].result.generated_ids, solo[i]) << i;
  }
  int64_t preempted = 0;
  for (int i = 0; i < mesh.num_shards(); ++i) {
    const kv::HotKvStats st = mesh.manager(i).Stats();
    preempted += st.evictions[static_cast<int>(kv::CacheMissReason::kPreempted)];
    EXPECT_EQ(st.live_sessions, 0) << "shard " << i;
  }
  EXPECT_GT(preempted + mesh.manager(0).Stats().room_waits, 0) << "the budget was never short";
}

TEST_F(MultiSessionTest, AFailingSessionDoesNotStopTheOthers) {
  auto prompts = Prompts(6);
  const GenerateOptions o = Greedy(16);
  const auto solo = Solo(prompts, o);
  prompts.insert(prompts.begin() + 2, std::vector<int32_t>{});            // empty prompt
  prompts.insert(prompts.begin() + 4, std::vector<int32_t>{1, 1 << 30});  // outside the vocab
  FixedRouteProvider provider(mesh_->route());
  MultiSessionDriver driver(provider, {});
  const MultiSessionReport r = driver.Run(prompts, o);
  EXPECT_EQ(r.failed(), 2);
  for (size_t i : {2u, 4u}) {
    EXPECT_FALSE(r.sessions[i].ok);
    EXPECT_FALSE(r.sessions[i].error.empty());
    ASSERT_TRUE(r.sessions[i].error_kind.has_value()) << r.sessions[i].error;
  }
  size_t k = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (i == 2 || i == 4) continue;
    EXPECT_TRUE(r.sessions[i].ok) << r.sessions[i].error;
    EXPECT_EQ(r.sessions[i].result.generated_ids, solo[k++]) << i;
  }
  EXPECT_EQ(LiveSessions(), 0);
}

TEST_F(MultiSessionTest, CancellingReleasesEverySessionOnEveryHop) {
  std::atomic<int> tokens{0};
  GenerateOptions o = Greedy(64);
  o.cancelled = [&] { return tokens.load() >= 40; };
  FixedRouteProvider provider(mesh_->route());
  MultiSessionDriver driver(provider, {});
  MultiSessionEvents ev;
  ev.on_token = [&](int, int32_t) { ++tokens; };
  const MultiSessionReport r = driver.Run(Prompts(12), o, ev);
  int cancelled = 0;
  for (const auto& s : r.sessions) {
    if (s.ok) continue;
    EXPECT_EQ(s.error, "cancelled");
    EXPECT_EQ(s.error_kind, ErrorKind::kUnavailable);
    ++cancelled;
  }
  EXPECT_EQ(cancelled, 12) << "no session can finish 64 tokens within 40 in total";
  EXPECT_LT(r.TotalTokens(), 12 * 64);
  EXPECT_EQ(LiveSessions(), 0);
}

TEST_F(MultiSessionTest, StopRequestedEndsOneSessionOnly) {
  const auto prompts = Prompts(4);
  const GenerateOptions o = Greedy(20);
  const auto solo = Solo(prompts, o);
  FixedRouteProvider provider(mesh_->route());
  MultiSessionDriver driver(provider, {});
  std::vector<int> seen(prompts.size(), 0);
  MultiSessionEvents ev;
  ev.on_token = [&](int s, int32_t) { ++seen[static_cast<size_t>(s)]; };  // one worker per session
  ev.stop_requested = [&](int s) { return s == 1 && seen[1] >= 5; };
  const MultiSessionReport r = driver.Run(prompts, o, ev);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(r.sessions[i].ok) << r.sessions[i].error;
    if (i == 1) {
      EXPECT_EQ(r.sessions[i].result.stop_reason, "stopped");
      EXPECT_EQ(r.sessions[i].result.generated_ids,
                std::vector<int32_t>(solo[i].begin(), solo[i].begin() + 5));
    } else {
      EXPECT_EQ(r.sessions[i].result.generated_ids, solo[i]) << i;
    }
  }
  EXPECT_EQ(LiveSessions(), 0);
}

TEST_F(MultiSessionTest, RejectsBadOptions) {
  FixedRouteProvider provider(mesh_->route());
  EXPECT_THROW(MultiSessionDriver(provider, {.max_in_flight = -1}), Error);
  EXPECT_THROW(
      MultiSessionDriver(provider, {.max_in_flight = MultiSessionOptions::kMaxInFlight + 1}),
      Error);
  MultiSessionDriver driver(provider, {});
  GenerateOptions o = Greedy(4);
  o.session_id = "00112233445566778899aabbccddeeff";
  EXPECT_THROW(driver.Run(Prompts(2), o), Error);
  EXPECT_TRUE(driver.Run({}, Greedy(4)).sessions.empty());
}

// The shards of one process take turns on their pool (the earliest layers
// first), and each batch first waits for the sessions between two steps: the
// sessions go round as one cohort, one batch per shard per step, rather than
// in fragments that each pay a pass over the weights. The transit wait is
// long here, so a mark left behind (a session counted in transit that never
// queues again and is never cleared) would stall the run for a minute.
TEST(MultiSessionTurns, TheSessionsGoRoundAsOneCohort) {
  for (const bool turns : {true, false}) {
    ThreadPool pool(2);
    InProcessMeshOptions mo;
    mo.split = {{0, 1}, {2, 3}, {4, 4}};
    mo.batch_turns = turns;
    mo.transit_wait_s = 60;
    InProcessMesh mesh(File(), mo, &pool);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 8; ++i) prompts.push_back({1, 403, 407, 10 + 7 * i});  // one length
    FixedRouteProvider provider(mesh.route());
    MultiSessionDriver driver(provider, {});
    GenerateOptions o = Greedy(24);
    const MultiSessionReport r = driver.Run(prompts, o);
    ASSERT_EQ(r.failed(), 0);
    EXPECT_LT(r.wall_s, 30) << "a batch waited out the transit bound";
    for (int i = 0; i < mesh.num_shards(); ++i) {
      const node::BatchStats& st = mesh.node(i).batcher().stats();
      const int64_t steps_per_session = 24;  // the prompt's and 23 decode steps
      ASSERT_EQ(st.steps.load(), 8 * steps_per_session) << i;
      RecordProperty((turns ? "batches_turns_" : "batches_free_") + std::to_string(i),
                     static_cast<int>(st.batches.load()));
      if (turns) {
        // The prompts may come apart (they start as their workers do); from
        // then on one batch per shard per step.
        EXPECT_LE(st.batches.load(), steps_per_session + 8) << "shard " << i;
      }
    }
  }
}

// A long prompt arrives while sessions decode on three shards of one pool:
// its batches take turns with theirs (a prompt batch beside a decode batch
// would leave one of them on its caller's thread alone, the pool busy with
// the other), and everyone still gets exactly their solo output. Without
// turns the batches do overlap (recorded, not asserted: it is a race).
TEST(MultiSessionTurns, ALongPromptTakesTurnsWithTheDecodingSessions) {
  std::vector<int32_t> long_prompt = {1};
  for (int i = 1; i < 300; ++i) long_prompt.push_back(3 + (i * 31) % 500);
  const std::vector<std::vector<int32_t>> prompts = Prompts(4);
  std::vector<std::vector<int32_t>> solo;
  std::vector<int32_t> long_solo;
  for (const bool turns : {true, false}) {
    ThreadPool pool(2);
    InProcessMeshOptions mo;
    mo.split = {{0, 1}, {2, 3}, {4, 4}};
    mo.batch_turns = turns;
    mo.batch.prefill_chunk = 32;  // many prompt batches
    InProcessMesh mesh(File(), mo, &pool);
    std::atomic<int> running{0}, overlaps{0}, prompt_batches{0};
    for (int i = 0; i < mesh.num_shards(); ++i) {
      mesh.node(i).batcher().SetObserver(
          [&](const node::BatchView& v) {
            if (running.fetch_add(1) != 0) ++overlaps;
            if (std::any_of(v.rows.begin(), v.rows.end(), [](int64_t r) { return r > 1; })) {
              ++prompt_batches;
            }
          },
          [&](const node::BatchView&) { running.fetch_sub(1); });
    }
    FixedRouteProvider provider(mesh.route());
    if (solo.empty()) {
      for (const auto& p : prompts) solo.push_back(Generate(provider, p, Greedy(40)).generated_ids);
      long_solo = Generate(provider, long_prompt, Greedy(2)).generated_ids;
      overlaps = 0;
      prompt_batches = 0;
    }
    std::vector<int32_t> long_out;
    std::thread prompt(
        [&] { long_out = Generate(provider, long_prompt, Greedy(2)).generated_ids; });
    MultiSessionDriver driver(provider, {});
    const MultiSessionReport r = driver.Run(prompts, Greedy(40));
    prompt.join();
    ASSERT_EQ(r.failed(), 0);
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(r.sessions[i].result.generated_ids, solo[i]);
    EXPECT_EQ(long_out, long_solo);
    EXPECT_GE(prompt_batches.load(), 3 * 300 / 32);
    RecordProperty(turns ? "overlaps_turns" : "overlaps_free", overlaps.load());
    if (turns) EXPECT_EQ(overlaps.load(), 0);
  }
}

TEST(PercentileTest, NearestRank) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(Percentile(v, 0.5), 50);
  EXPECT_EQ(Percentile(v, 0.99), 99);
  EXPECT_EQ(Percentile(v, 1.0), 100);
  EXPECT_EQ(Percentile(v, 0.0), 1);
  EXPECT_EQ(Percentile({}, 0.5), 0);
  EXPECT_EQ(Percentile({7}, 0.99), 7);
}

}  // namespace
}  // namespace meshnet::mesh
