// HotKvStateManager beyond the reference: paged storage and byte accounting,
// reserve/write/commit steps, pinning and isolation, the bounded latest-epoch
// map, and stats. FakeClock throughout.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "kv/hot_kv_state.h"
#include "kv/kv_test_util.h"
#include "util/error.h"

namespace meshnet::kv {
namespace {

using testing::AppendBuffers;
using testing::MiniRecipe;
using testing::SpecRows;
using Keys = std::vector<std::pair<std::string, int64_t>>;

constexpr int kLru = static_cast<int>(CacheMissReason::kEvictedLru);

using testing::Outcome;

// Writes spec rows [start, start+n) of every owned layer through a step view.
void WriteSpecRows(const KvCacheRecipe& r, KvStep& step) {
  AppendBuffers b =
      SpecRows(r, step.session_id(), step.route_epoch(), step.start_pos(), step.n_new());
  const int64_t row = int64_t{r.n_kv_heads} * r.head_dim;
  for (int i = 0; i < r.num_owned_layers(); ++i) {
    ops::PagedKvLayer v = step.Layer(r.start_layer + i);
    EXPECT_EQ(v.n_positions, step.start_pos() + step.n_new());
    for (int64_t t = 0; t < step.n_new(); ++t) {
      for (int64_t j = 0; j < row; ++j) {
        StoreAs(v.dtype, v.KRow(step.start_pos() + t) + j * KvDtypeSize(v.dtype),
                b.k[i][t * row + j]);
        StoreAs(v.dtype, v.VRow(step.start_pos() + t) + j * KvDtypeSize(v.dtype),
                b.v[i][t * row + j]);
      }
    }
  }
}

class KvStepTest : public ::testing::Test {
 protected:
  // 32 bytes per token; 4-token blocks of 128 bytes; 8 blocks.
  static HotKvStateConfig Paged(int block_tokens = 4, int64_t budget = 1024) {
    HotKvStateConfig c;
    c.budget_bytes = budget;
    c.max_sessions = 8;
    c.ttl_seconds = 10;
    c.miss_history = 16;
    c.block_tokens = block_tokens;
    c.pinned_wait_seconds = 0;  // single-threaded tests: a pinned shortage fails at once
    return c;
  }
  void Make(HotKvStateConfig c = Paged()) {
    m_ = std::make_unique<HotKvStateManager>(recipe_, c, &clock_);
  }
  int64_t Add(const std::string& id, int64_t epoch, int64_t start, int64_t n) {
    AppendBuffers b = SpecRows(recipe_, id, epoch, start, n);
    return m_->Append(id, epoch, b.layers, nullptr, start);
  }
  KvStep Begin(const std::string& id, int64_t epoch, int64_t n) {
    StepResult r = m_->BeginStep(id, epoch, n);
    EXPECT_TRUE(std::holds_alternative<KvStep>(r));
    return std::move(std::get<KvStep>(r));
  }
  // Reads every owned layer back and compares with the spec rows [0, n).
  void ExpectContent(const std::string& id, int64_t epoch, int64_t n) {
    SessionHandle h = m_->Get(id, epoch);
    ASSERT_EQ(h.seq_len(), n);
    AppendBuffers want = SpecRows(recipe_, id, epoch, 0, n);
    for (int i = 0; i < recipe_.num_owned_layers(); ++i) {
      EXPECT_EQ(h.ReadKeys(recipe_.start_layer + i), want.k[i]);
      EXPECT_EQ(h.ReadValues(recipe_.start_layer + i), want.v[i]);
    }
  }

  KvCacheRecipe recipe_ = MiniRecipe();
  FakeClock clock_;
  std::unique_ptr<HotKvStateManager> m_;
};

// A step's recipe passes when it is the manager's, field by field or by
// fingerprint (an alias of the architecture's name); any other field refuses
// it before anything is reserved.
TEST_F(KvStepTest, StepRecipeIsCheckedFieldByFieldAndByFingerprint) {
  Make();
  m_->Open("a", 0);
  const std::vector<std::function<void(KvCacheRecipe&)>> changes = {
      [](KvCacheRecipe& r) { r.architecture_adapter = "qwen2"; },
      [](KvCacheRecipe& r) { r.kv_dtype = KvDtype::kF16; },
      [](KvCacheRecipe& r) { r.n_kv_heads += 1; },
      [](KvCacheRecipe& r) { r.head_dim += 1; },
      [](KvCacheRecipe& r) { r.total_layers += 1; },
      [](KvCacheRecipe& r) { r.start_layer -= 1; },
      [](KvCacheRecipe& r) { r.end_layer -= 1; },
      [](KvCacheRecipe& r) { r.boundary_schema_version += 1; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    KvCacheRecipe other = recipe_;
    changes[i](other);
    ASSERT_FALSE(other == recipe_) << i;
    EXPECT_EQ(Outcome([&] { (void)m_->BeginStep("a", 0, 1, &other); }), "incompatible-recipe")
        << "change " << i;
    EXPECT_EQ(m_->Stats().blocks_used, 0) << i;
  }
  KvCacheRecipe alias = recipe_;
  alias.architecture_adapter = "LlamaForCausalLM";
  ASSERT_FALSE(alias == recipe_);
  for (const KvCacheRecipe* r : {&recipe_, &alias}) {
    StepResult begun = m_->BeginStep("a", 0, 1, r);
    ASSERT_TRUE(std::holds_alternative<KvStep>(begun));
    EXPECT_EQ(std::get<KvStep>(begun).Commit(), std::nullopt);
  }
  EXPECT_EQ(m_->Get("a", 0).seq_len(), 2);
}

TEST_F(KvStepTest, BudgetCountsWholeReservedBlocks) {
  Make();
  EXPECT_EQ(m_->block_bytes(), 128);
  m_->Open("a", 0);
  EXPECT_EQ(m_->TotalBytes(), 0);
  Add("a", 0, 0, 1);
  EXPECT_EQ(m_->TotalBytes(), 128);
  Add("a", 0, 1, 3);
  EXPECT_EQ(m_->TotalBytes(), 128);
  Add("a", 0, 4, 1);
  EXPECT_EQ(m_->TotalBytes(), 256);
  HotKvStats s = m_->Stats();
  EXPECT_EQ(s.bytes_in_use, 5 * 32);
  EXPECT_EQ(s.bytes_reserved, 256);
  EXPECT_EQ(s.blocks_used, 2);
  EXPECT_EQ(s.blocks_capacity, 8);
  // 33 tokens need 9 blocks > 8: budget exceeded by the session alone.
  EXPECT_EQ(Outcome([&] { Add("a", 0, 5, 28); }), "budget-exceeded");
  EXPECT_EQ(Add("a", 0, 5, 27), 32);
  EXPECT_EQ(m_->TotalBytes(), 1024);
  ExpectContent("a", 0, 32);
}

TEST_F(KvStepTest, BlockPressureEvictsByReservedBlocks) {
  Make();
  for (const char* id : {"a", "b", "c", "d"}) {
    m_->Open(id, 0);
    Add(id, 0, 0, 5);  // 2 blocks each (8 of 8), only 20 of 32 token slots in use
  }
  m_->Open("e", 0);
  Add("e", 0, 0, 1);  // needs 1 block: evicts a (the LRU) and its 2 blocks
  EXPECT_EQ(m_->SessionKeys(), (Keys{{"b", 0}, {"c", 0}, {"d", 0}, {"e", 0}}));
  EXPECT_EQ(m_->Stats().blocks_used, 7);
  EXPECT_EQ(m_->Stats().blocks_free, 1);
  ExpectContent("b", 0, 5);
  ExpectContent("e", 0, 1);
}

TEST_F(KvStepTest, TruncateReturnsWholeBlocksAndBlocksAreReused) {
  Make();
  m_->Open("a", 0);
  Add("a", 0, 0, 9);  // 3 blocks
  EXPECT_EQ(m_->Stats().blocks_used, 3);
  const int64_t free_before = m_->Stats().blocks_free;  // includes untouched slab blocks
  EXPECT_EQ(m_->Truncate("a", 0, 5), 5);                // 2 blocks
  EXPECT_EQ(m_->Stats().blocks_used, 2);
  EXPECT_EQ(m_->Stats().blocks_free, free_before + 1);
  ExpectContent("a", 0, 5);
  EXPECT_EQ(m_->Truncate("a", 0, 4), 4);  // exactly one block
  EXPECT_EQ(m_->Stats().blocks_used, 1);
  EXPECT_EQ(m_->Truncate("a", 0, 0), 0);
  EXPECT_EQ(m_->Stats().blocks_used, 0);
  EXPECT_EQ(m_->TotalBytes(), 0);
  // Growing again reuses freed blocks (no new memory): allocated stays put.
  const HotKvStats before = m_->Stats();
  Add("a", 0, 0, 9);
  const HotKvStats after = m_->Stats();
  EXPECT_EQ(after.blocks_used + after.blocks_free, before.blocks_used + before.blocks_free);
  ExpectContent("a", 0, 9);
}

TEST_F(KvStepTest, PoolMemoryIsTakenLazily) {
  // 1 GiB budget of 128-byte blocks: 8M blocks of capacity, a handful allocated.
  Make(Paged(4, int64_t{1} << 30));
  m_->Open("a", 0);
  Add("a", 0, 0, 4);
  HotKvStats s = m_->Stats();
  EXPECT_EQ(s.blocks_capacity, (int64_t{1} << 30) / 128);
  EXPECT_EQ(s.blocks_used, 1);
  EXPECT_LE((s.blocks_used + s.blocks_free) * 128, 2 << 20);  // about one slab
}

TEST_F(KvStepTest, StepReservesWritesAndCommits) {
  Make();
  m_->Open("a", 0);
  Add("a", 0, 0, 3);
  clock_.Set(2);
  m_->Open("b", 0);
  clock_.Set(3);
  KvStep step = Begin("a", 0, 6);
  EXPECT_EQ(step.start_pos(), 3);
  EXPECT_EQ(step.n_new(), 6);
  EXPECT_EQ(m_->Stats().blocks_used, 3);  // ceil(9/4) reserved
  // Reserved rows start zeroed, whatever the block held before.
  ops::PagedKvLayer v = step.Layer(3);
  float f;
  std::memcpy(&f, v.KRow(8), 4);
  EXPECT_EQ(f, 0.0f);
  // The committed view is unchanged while the step is in flight.
  EXPECT_EQ(m_->Get("a", 0).seq_len(), 3);
  WriteSpecRows(recipe_, step);
  clock_.Set(4);
  EXPECT_EQ(step.Commit(), std::nullopt);
  EXPECT_FALSE(step.valid());
  EXPECT_EQ(m_->SessionKeys(), (Keys{{"b", 0}, {"a", 0}}));
  ExpectContent("a", 0, 9);
  // Commit refreshed the TTL at t=4.
  clock_.Set(13.5);
  EXPECT_EQ(m_->SessionKeys().size(), 2u);
  EXPECT_EQ(m_->SessionCount(), 1);
  EXPECT_EQ(m_->SessionKeys(), (Keys{{"a", 0}}));
}

TEST_F(KvStepTest, UncommittedStepRollsBack) {
  Make();
  m_->Open("a", 0);
  Add("a", 0, 0, 3);
  {
    KvStep step = Begin("a", 0, 6);
    WriteSpecRows(recipe_, step);
    EXPECT_EQ(m_->Stats().blocks_used, 3);
  }  // destructor rolls back
  EXPECT_EQ(m_->Stats().blocks_used, 1);
  ExpectContent("a", 0, 3);
  KvStep step = Begin("a", 0, 2);
  step.Rollback();
  EXPECT_FALSE(step.valid());
  step.Rollback();  // idempotent
  EXPECT_EQ(Outcome([&] { step.Commit(); }), "invalid-argument");
  ExpectContent("a", 0, 3);
  // A moved-from step does nothing; the moved-to one owns the reservation.
  KvStep s1 = Begin("a", 0, 2);
  KvStep s2 = std::move(s1);
  EXPECT_FALSE(s1.valid());
  WriteSpecRows(recipe_, s2);
  EXPECT_EQ(s2.Commit(), std::nullopt);
  ExpectContent("a", 0, 5);
}

TEST_F(KvStepTest, ConcurrentStepsAndTruncateDuringAStepAreRefused) {
  Make();
  m_->Open("a", 0);
  KvStep step = Begin("a", 0, 1);
  EXPECT_EQ(Outcome([&] { m_->BeginStep("a", 0, 1); }), "session-busy");
  EXPECT_EQ(Outcome([&] { Add("a", 0, 0, 1); }), "session-busy");
  EXPECT_EQ(Outcome([&] { m_->Truncate("a", 0, 0); }), "session-busy");
  try {
    m_->BeginStep("a", 0, 1);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step in flight"), std::string::npos);
  }
  // Reads are fine, and other sessions are unaffected.
  EXPECT_EQ(m_->Get("a", 0).seq_len(), 0);
  m_->Open("b", 0);
  EXPECT_EQ(Add("b", 0, 0, 1), 1);
  WriteSpecRows(recipe_, step);
  EXPECT_EQ(step.Commit(), std::nullopt);
  EXPECT_EQ(Add("a", 0, 1, 1), 2);  // free again
  ExpectContent("a", 0, 2);
}

TEST_F(KvStepTest, StepMissesAndBudgetLikeAppend) {
  Make();
  StepResult r = m_->BeginStep("nobody", 0, 1);
  ASSERT_TRUE(std::holds_alternative<CacheMiss>(r));
  EXPECT_EQ(std::get<CacheMiss>(r).reason, CacheMissReason::kUnknownSession);
  m_->Open("a", 0);
  r = m_->BeginStep("a", 0, 1, nullptr, 4);
  ASSERT_TRUE(std::holds_alternative<CacheMiss>(r));
  EXPECT_EQ(std::get<CacheMiss>(r).reason, CacheMissReason::kSeqLenMismatch);
  m_->Open("a", 1);
  EXPECT_EQ(Outcome([&] { m_->BeginStep("a", 0, 1); }), "stale-epoch");
  EXPECT_EQ(Outcome([&] { m_->BeginStep("a", 1, -1); }), "invalid-argument");
  EXPECT_EQ(Outcome([&] { m_->BeginStep("a", 1, 33); }), "budget-exceeded");
  KvCacheRecipe other = MiniRecipe(KvDtype::kBF16);
  EXPECT_EQ(Outcome([&] { m_->BeginStep("a", 1, 1, &other); }), "incompatible-recipe");
  EXPECT_EQ(Outcome([&] { Begin("a", 1, 1).Layer(1); }), "invalid-argument");  // not owned
}

TEST_F(KvStepTest, CommitReportsTheDeathReason) {
  struct Case {
    const char* name;
    std::function<void(HotKvStateManager&, FakeClock&)> kill;
    CacheMissReason reason;
  };
  const std::vector<Case> cases = {
      {"released", [](auto& m, auto&) { m.Release("a", 0); }, CacheMissReason::kReleased},
      {"superseded", [](auto& m, auto&) { m.Open("a", 1); }, CacheMissReason::kSupersededEpoch},
      {"replaced", [](auto& m, auto&) { m.Open("a", 0); }, CacheMissReason::kSupersededEpoch},
      {"ttl",
       [](auto& m, auto& c) {
         c.Set(100);
         m.SessionCount();
       },
       CacheMissReason::kEvictedTtl},
      {"mismatch", [](auto& m, auto&) { m.Resolve("a", 0, nullptr, 7); },
       CacheMissReason::kSeqLenMismatch},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    clock_.Set(0);
    Make();
    m_->Open("a", 0);
    Add("a", 0, 0, 2);
    KvStep step = Begin("a", 0, 4);
    EXPECT_EQ(m_->Stats().blocks_used, 2);
    c.kill(*m_, clock_);
    // The dead session's blocks stay while the step pins them.
    EXPECT_EQ(m_->Stats().blocks_used, 2);
    EXPECT_EQ(m_->Stats().pinned_sessions, 1);
    WriteSpecRows(recipe_, step);  // still safe to write
    std::optional<CacheMiss> miss = step.Commit();
    ASSERT_TRUE(miss.has_value());
    EXPECT_EQ(miss->reason, c.reason);
    EXPECT_EQ(miss->session_id, "a");
    EXPECT_EQ(m_->Stats().blocks_used, 0);
    EXPECT_EQ(m_->Stats().pinned_sessions, 0);
  }
}

TEST_F(KvStepTest, PinnedHandleKeepsContentReadableAfterDeath) {
  Make();
  m_->Open("a", 0);
  Add("a", 0, 0, 6);
  SessionHandle h = m_->Get("a", 0);
  EXPECT_TRUE(h.alive());
  EXPECT_TRUE(m_->Release("a", 0));
  EXPECT_FALSE(h.alive());
  EXPECT_EQ(m_->Stats().live_sessions, 0);
  EXPECT_EQ(m_->TotalBytes(), 0);         // no longer a live session's bytes
  EXPECT_EQ(m_->Stats().blocks_used, 2);  // but still held
  // Other sessions cannot take the pinned blocks: they are not in the pool.
  m_->Open("b", 0);
  Add("b", 0, 0, 24);  // 6 blocks: exactly what is left
  EXPECT_EQ(Outcome([&] { Add("b", 0, 24, 1); }), "budget-exceeded");
  AppendBuffers want = SpecRows(recipe_, "a", 0, 0, 6);
  EXPECT_EQ(h.ReadKeys(2), want.k[0]);
  EXPECT_EQ(h.ReadValues(3), want.v[1]);
  h = SessionHandle();  // last pin goes: blocks return
  EXPECT_EQ(m_->Stats().blocks_used, 6);
  EXPECT_EQ(Add("b", 0, 24, 1), 25);
}

TEST_F(KvStepTest, PressureEvictionSkipsPinnedSessions) {
  HotKvStateConfig c = Paged();
  c.max_sessions = 2;
  Make(c);
  SessionHandle a = m_->Open("a", 0);  // oldest, pinned
  m_->Open("b", 0);
  m_->Open("c", 0);  // cap: evicts b, not the pinned a
  EXPECT_EQ(m_->SessionKeys(), (Keys{{"a", 0}, {"c", 0}}));
  EXPECT_TRUE(a.alive());
  // With every other session pinned the cap is exceeded rather than evicting them.
  SessionHandle cc = m_->Get("c", 0);
  m_->Open("d", 0);
  EXPECT_EQ(m_->SessionCount(), 3);
  a = SessionHandle();
  m_->Open("e", 0);  // a (now unpinned, LRU) and d go... only as many as needed
  EXPECT_EQ(m_->SessionKeys(), (Keys{{"c", 0}, {"e", 0}}));
  // Budget pressure: if only pinned sessions hold the blocks, the step fails.
  Add("c", 0, 0, 28);  // 7 blocks, pinned by cc
  EXPECT_EQ(Outcome([&] { Add("e", 0, 0, 5); }), "budget-exceeded");
  EXPECT_EQ(m_->SessionKeys(), (Keys{{"e", 0}, {"c", 0}}));
  EXPECT_EQ(Add("e", 0, 0, 4), 4);
  EXPECT_EQ(m_->Stats().evictions[kLru], 3);
}

TEST_F(KvStepTest, EpochHistoryIsBoundedForIdsWithoutLiveState) {
  HotKvStateConfig c = Paged();
  c.epoch_history = 2;
  c.max_sessions = 100;
  Make(c);
  for (int i = 0; i < 5; ++i) m_->Open("id" + std::to_string(i), 3);
  EXPECT_EQ(m_->Stats().remembered_epochs, 5);  // live ids are always remembered
  for (int i = 0; i < 5; ++i) m_->Release("id" + std::to_string(i), 3);
  EXPECT_EQ(m_->Stats().remembered_epochs, 2);  // id3, id4: the most recently touched
  EXPECT_EQ(Outcome([&] { m_->Open("id4", 2); }), "stale-epoch");
  EXPECT_EQ(Outcome([&] { m_->Open("id3", 2); }), "stale-epoch");
  // id0 was forgotten: a lower epoch is accepted again.
  EXPECT_EQ(Outcome([&] { m_->Open("id0", 2); }), "ok");
  // A stale check touches the record: id3 (checked last) survives id4.
  m_->Release("id0", 2);
  EXPECT_EQ(m_->Stats().remembered_epochs, 2);
  EXPECT_EQ(Outcome([&] { m_->Open("id3", 2); }), "stale-epoch");
  EXPECT_EQ(Outcome([&] { m_->Open("id0", 1); }), "stale-epoch");
  EXPECT_EQ(m_->Stats().remembered_epochs, 2);
}

TEST_F(KvStepTest, EpochHistoryZeroStillGuardsLiveIds) {
  HotKvStateConfig c = Paged();
  c.epoch_history = 0;
  Make(c);
  m_->Open("a", 5);
  EXPECT_EQ(Outcome([&] { m_->Open("a", 4); }), "stale-epoch");
  EXPECT_EQ(m_->Stats().remembered_epochs, 1);
  m_->Release("a", 5);
  EXPECT_EQ(m_->Stats().remembered_epochs, 0);
}

TEST_F(KvStepTest, ManySessionsKeepMemoryBounded) {
  HotKvStateConfig c = Paged(1, 1 << 20);
  c.max_sessions = 4;
  c.miss_history = 8;
  c.epoch_history = 16;
  Make(c);
  for (int i = 0; i < 2000; ++i) {
    const std::string id = "s" + std::to_string(i);
    m_->Open(id, i % 3);
    Add(id, i % 3, 0, 1 + i % 5);
    if (i % 2 == 0) m_->Release(id, i % 3);
    clock_.Advance(0.25);
  }
  HotKvStats s = m_->Stats();
  EXPECT_LE(s.live_sessions, 4);
  EXPECT_LE(s.remembered_epochs, 4 + 16);
  EXPECT_LE(s.remembered_misses, 8);
  // Byte totals are exact against a recount through the handles.
  int64_t tokens = 0;
  for (const auto& [id, epoch] : m_->SessionKeys()) tokens += m_->Get(id, epoch).seq_len();
  EXPECT_EQ(m_->Stats().bytes_in_use, tokens * 32);
  EXPECT_EQ(m_->TotalBytes(), tokens * 32);  // block_tokens 1
}

TEST_F(KvStepTest, StatsTrackPinsBlocksAndHits) {
  Make();
  m_->Open("a", 0);
  Add("a", 0, 0, 5);  // hit 1
  {
    SessionHandle h = m_->Get("a", 0);  // hit 2
    KvStep st = Begin("a", 0, 3);       // hit 3
    HotKvStats s = m_->Stats();
    EXPECT_EQ(s.pinned_sessions, 1);
    EXPECT_EQ(s.live_sessions, 1);
    EXPECT_EQ(s.bytes_in_use, 5 * 32);
    EXPECT_EQ(s.bytes_reserved, 2 * 128);
    EXPECT_EQ(s.hits, 3);
  }
  HotKvStats s = m_->Stats();
  EXPECT_EQ(s.pinned_sessions, 0);
  EXPECT_EQ(s.bytes_reserved, 2 * 128);  // rollback kept the committed 5 rows
  EXPECT_EQ(s.bytes_budget, 1024);
  EXPECT_EQ(s.blocks_used, 2);
  m_->Resolve("a", 0, nullptr, 1);
  s = m_->Stats();
  EXPECT_EQ(s.misses[static_cast<int>(CacheMissReason::kSeqLenMismatch)], 1);
  EXPECT_EQ(s.blocks_used, 0);
  EXPECT_EQ(s.bytes_reserved, 0);
}

TEST_F(KvStepTest, DecreasingClockIsClamped) {
  Make();
  clock_.Set(50);
  m_->Open("a", 0);
  clock_.Set(10);  // a misbehaving clock: time is clamped to 50
  m_->Open("b", 0);
  m_->Get("a", 0);
  clock_.Set(30);  // still 50 for the manager: nothing expired
  EXPECT_EQ(m_->SessionCount(), 2);
  clock_.Set(60.25);  // a and b both count from t=50
  EXPECT_EQ(m_->SessionCount(), 0);
}

}  // namespace
}  // namespace meshnet::kv
