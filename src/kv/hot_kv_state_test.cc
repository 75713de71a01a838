// HotKvStateManager: every behaviour of the reference, including the order of
// checks (spec/kv-trace.md) and the seed README's "traps", on a FakeClock with
// block_tokens = 1 (the reference's byte accounting).
#include "kv/hot_kv_state.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "kv/kv_test_util.h"
#include "util/error.h"

namespace meshnet::kv {
namespace {

using testing::AppendBuffers;
using testing::Checksum;
using testing::MiniRecipe;
using testing::SpecRows;
using Keys = std::vector<std::pair<std::string, int64_t>>;

constexpr int kTtl = static_cast<int>(CacheMissReason::kEvictedTtl);
constexpr int kLru = static_cast<int>(CacheMissReason::kEvictedLru);
constexpr int kReleased = static_cast<int>(CacheMissReason::kReleased);
constexpr int kSuperseded = static_cast<int>(CacheMissReason::kSupersededEpoch);
constexpr int kMismatch = static_cast<int>(CacheMissReason::kSeqLenMismatch);
constexpr int kUnknown = static_cast<int>(CacheMissReason::kUnknownSession);

using testing::Outcome;

class HotKvStateTest : public ::testing::Test {
 protected:
  // The mini trace's config: 256 bytes = 8 tokens of 32 bytes, 2 sessions, ttl 10.
  static HotKvStateConfig RefConfig() {
    HotKvStateConfig c;
    c.budget_bytes = 256;
    c.max_sessions = 2;
    c.ttl_seconds = 10.0;
    c.miss_history = 4;
    c.block_tokens = 1;
    return c;
  }
  void Make(HotKvStateConfig c = RefConfig()) {
    m_ = std::make_unique<HotKvStateManager>(recipe_, c, &clock_);
  }
  void Open(const std::string& id, int64_t epoch) { m_->Open(id, epoch); }
  // Appends n spec rows starting at position `start` (also passed as expected_seq_len).
  int64_t Add(const std::string& id, int64_t epoch, int64_t n, std::optional<int64_t> start = {}) {
    AppendBuffers b = SpecRows(recipe_, id, epoch, start.value_or(0), n);
    return m_->Append(id, epoch, b.layers, nullptr, start);
  }
  std::string AddOutcome(const std::string& id, int64_t epoch, int64_t n,
                         std::optional<int64_t> start = {}) {
    return Outcome([&] { Add(id, epoch, n, start); });
  }
  // "ok:<seq_len>", "miss:<reason>" or "<error kind>".
  std::string Res(const std::string& id, int64_t epoch, std::optional<int64_t> expected = {},
                  const KvCacheRecipe* recipe = nullptr) {
    std::string out;
    std::string err = Outcome([&] {
      ResolveResult r = m_->Resolve(id, epoch, recipe, expected);
      if (auto* h = std::get_if<SessionHandle>(&r)) {
        out = "ok:" + std::to_string(h->seq_len());
      } else {
        out = "miss:" + std::string(CacheMissReasonName(std::get<CacheMiss>(r).reason));
      }
    });
    return err == "ok" ? out : err;
  }

  KvCacheRecipe recipe_ = MiniRecipe();
  FakeClock clock_;
  std::unique_ptr<HotKvStateManager> m_;
};

TEST_F(HotKvStateTest, MiniTraceMatchesReference) {
  // seed/examples/mini.trace.jsonl and the reference's expected output.
  Make();
  EXPECT_EQ(m_->recipe().Fingerprint(),
            "bdc1fda85dfd29db05f5c0288a8dab7ed8bb2b9ead8216dea70e131e652443a3");
  EXPECT_EQ(m_->recipe().BytesPerToken(), 32);
  EXPECT_EQ(m_->Open("a", 0).seq_len(), 0);
  EXPECT_EQ(Add("a", 0, 2, 0), 2);
  clock_.Set(10.0);
  {
    SessionHandle h = m_->Get("a", 0, nullptr, 2);
    EXPECT_EQ(h.seq_len(), 2);
    EXPECT_EQ(Checksum(h, recipe_), "952489212c43b149");
    // spec: fnv1a32("a") gives K rows [[0.482,0.483],[0.499,0.5]] on layer 2.
    EXPECT_EQ(h.ReadKeys(2), (std::vector<float>{0.482f, 0.483f, 0.499f, 0.5f}));
    EXPECT_EQ(h.ReadValues(2), (std::vector<float>{-0.482f, -0.483f, -0.499f, -0.5f}));
  }
  Open("b", 0);
  Open("c", 0);
  EXPECT_EQ(Res("a", 0), "miss:evicted-lru");
  EXPECT_EQ(AddOutcome("b", 0, 9), "budget-exceeded");
  clock_.Set(20.5);
  EXPECT_EQ(m_->SessionCount(), 0);
  EXPECT_EQ(m_->TotalBytes(), 0);
  EXPECT_EQ(m_->SessionKeys(), Keys{});
  EXPECT_EQ(Outcome([&] { m_->Get("b", 0); }), "cache-miss:evicted-ttl");
  Open("c", 1);
  EXPECT_EQ(Outcome([&] { m_->Open("c", 0); }), "stale-epoch");
  EXPECT_TRUE(m_->Release("c", 1));
  EXPECT_EQ(Res("c", 1), "miss:released");
}

TEST_F(HotKvStateTest, OpenRejectsBlankIdsAndNegativeEpochsFirst) {
  Make();
  for (const char* id : {"", "   ", "\t\n", "\xe3\x80\x80" /* U+3000 */, "\xc2\xa0" /* NBSP */}) {
    EXPECT_EQ(Outcome([&] { m_->Open(id, 0); }), "invalid-argument") << id;
  }
  EXPECT_EQ(Outcome([&] { m_->Open("a", -1); }), "invalid-argument");
  // Blank id wins over a bad recipe; the epoch check too.
  KvCacheRecipe other = MiniRecipe(KvDtype::kF16);
  EXPECT_EQ(Outcome([&] { m_->Open(" ", 0, &other); }), "invalid-argument");
  EXPECT_EQ(Outcome([&] { m_->Open("a", -1, &other); }), "invalid-argument");
  // Non-ASCII, non-blank ids are fine.
  EXPECT_EQ(Outcome([&] {
              m_->Open(
                  "s\xc3\xa9"
                  "ance-\xc3\xbc",
                  0);
            }),
            "ok");
  EXPECT_EQ(m_->SessionCount(), 1);
}

TEST_F(HotKvStateTest, OnlyOpenRejectsBlankIds) {
  Make();
  EXPECT_EQ(AddOutcome("", 0, 1), "cache-miss:unknown-session");
  EXPECT_EQ(Res("   ", 0), "miss:unknown-session");
  EXPECT_EQ(Outcome([&] { m_->Truncate("", 0, 0); }), "cache-miss:unknown-session");
  EXPECT_FALSE(m_->Release("", 0));
  EXPECT_EQ(Res("", 0), "miss:released");
}

TEST_F(HotKvStateTest, RecipeCheckedAfterEpochAndBeforeStale) {
  Make();
  KvCacheRecipe other = MiniRecipe(KvDtype::kF16);
  KvCacheRecipe alias = MiniRecipe();
  alias.architecture_adapter = "LlamaForCausalLM";
  Open("s", 1);
  EXPECT_EQ(Outcome([&] { m_->Open("s", 0, &other); }), "incompatible-recipe");
  EXPECT_EQ(Outcome([&] { m_->Open("s", 0, &alias); }), "stale-epoch");
  EXPECT_EQ(Res("s", 0, {}, &other), "incompatible-recipe");
  EXPECT_EQ(Res("s", -1, {}, &other), "invalid-argument");
  EXPECT_EQ(Outcome([&] { m_->Get("s", 1, &other); }), "incompatible-recipe");
  EXPECT_EQ(Outcome([&] { m_->Get("s", 1, &alias); }), "ok");
  AppendBuffers b = SpecRows(recipe_, "s", 1, 0, 1);
  EXPECT_EQ(Outcome([&] { m_->Append("s", 0, b.layers, &other); }), "incompatible-recipe");
  EXPECT_EQ(Outcome([&] { m_->Append("s", -1, b.layers, &other); }), "invalid-argument");
  EXPECT_EQ(Outcome([&] { m_->Append("s", 1, b.layers, &alias); }), "ok");
  // An incompatible request leaves no trace: the session still has its row.
  EXPECT_EQ(Res("s", 1), "ok:1");
}

TEST_F(HotKvStateTest, RefusedOpsLeaveSessionUntouched) {
  Make();
  Open("s", 0);
  Add("s", 0, 1, 0);
  Open("s", 1);  // supersedes epoch 0
  clock_.Set(5);
  Open("t", 0);
  // Stale ops at t=9 do not refresh s@1 (last_tick 0): it expires at t > 10.
  clock_.Set(9);
  EXPECT_EQ(AddOutcome("s", 0, 1), "stale-epoch");
  EXPECT_EQ(Outcome([&] { m_->Truncate("s", 0, -5); }), "stale-epoch");
  EXPECT_EQ(Res("s", 0), "stale-epoch");
  EXPECT_EQ(Outcome([&] { m_->Get("s", 0); }), "stale-epoch");
  KvCacheRecipe other = MiniRecipe(KvDtype::kF16);
  EXPECT_EQ(Res("s", 1, {}, &other), "incompatible-recipe");
  EXPECT_EQ(AddOutcome("s", 1, 9), "budget-exceeded");
  EXPECT_EQ(m_->SessionKeys(), (Keys{{"s", 1}, {"t", 0}}));
  clock_.Set(10.25);
  EXPECT_EQ(Res("s", 1), "miss:evicted-ttl");
  EXPECT_EQ(Res("t", 0), "ok:0");
}

TEST_F(HotKvStateTest, SupersededEpochIsRecordedButNeverObservable) {
  Make();
  Open("s", 0);
  Add("s", 0, 2, 0);
  SessionHandle old = m_->Get("s", 0);
  Open("s", 3);
  EXPECT_FALSE(old.alive());
  EXPECT_EQ(Res("s", 0), "stale-epoch");
  EXPECT_EQ(Res("s", 3), "ok:0");
  HotKvStats st = m_->Stats();
  EXPECT_EQ(st.evictions[kSuperseded], 1);
  EXPECT_EQ(st.live_sessions, 1);
  EXPECT_EQ(st.remembered_misses, 1);  // the superseded-epoch record
  // Epochs in between are stale too; a higher one supersedes again.
  EXPECT_EQ(Outcome([&] { m_->Open("s", 2); }), "stale-epoch");
  Open("s", 4);
  EXPECT_EQ(m_->SessionKeys(), (Keys{{"s", 4}}));
}

TEST_F(HotKvStateTest, ReopenSameKeyReplacesWithoutRecordingAMiss) {
  Make();
  Open("s", 0);
  Add("s", 0, 3, 0);
  SessionHandle old = m_->Get("s", 0);
  clock_.Set(1);
  Open("t", 0);
  clock_.Set(2);
  EXPECT_EQ(m_->Open("s", 0).seq_len(), 0);
  EXPECT_FALSE(old.alive());
  EXPECT_EQ(old.seq_len(), 3);  // the pinned old context is still readable
  EXPECT_EQ(m_->SessionKeys(), (Keys{{"t", 0}, {"s", 0}}));  // re-inserted as MRU
  HotKvStats st = m_->Stats();
  EXPECT_EQ(st.replaced, 1);
  EXPECT_EQ(st.remembered_misses, 0);
  for (int i = 0; i < kNumCacheMissReasons; ++i) EXPECT_EQ(st.evictions[i], 0);
}

TEST_F(HotKvStateTest, OpenForgetsTheKeysMissRecord) {
  HotKvStateConfig c = RefConfig();
  c.miss_history = 2;
  Make(c);
  m_->Release("a", 0);
  m_->Release("s", 0);
  EXPECT_EQ(m_->Stats().remembered_misses, 2);
  Open("s", 0);  // forgets s@0's record, which frees a slot...
  EXPECT_EQ(m_->Stats().remembered_misses, 1);
  m_->Release("b", 0);  // ...so this record does not push a's out.
  EXPECT_EQ(Res("a", 0), "miss:released");
  EXPECT_EQ(Res("s", 0), "ok:0");
}

TEST_F(HotKvStateTest, EveryMissReasonThroughEveryLookup) {
  HotKvStateConfig c = RefConfig();
  c.miss_history = 16;
  Make(c);
  // unknown-session
  EXPECT_EQ(Res("u", 0), "miss:unknown-session");
  EXPECT_EQ(AddOutcome("u", 0, 1), "cache-miss:unknown-session");
  EXPECT_EQ(Outcome([&] { m_->Truncate("u", 0, 0); }), "cache-miss:unknown-session");
  // released
  Open("r", 0);
  EXPECT_TRUE(m_->Release("r", 0));
  EXPECT_EQ(Res("r", 0), "miss:released");
  EXPECT_EQ(AddOutcome("r", 0, 1), "cache-miss:released");
  // evicted-lru (cap 2)
  Open("l", 0);
  Open("x", 0);
  Open("y", 0);
  EXPECT_EQ(Outcome([&] { m_->Get("l", 0); }), "cache-miss:evicted-lru");
  EXPECT_EQ(Outcome([&] { m_->Truncate("l", 0, 0); }), "cache-miss:evicted-lru");
  // evicted-ttl
  clock_.Set(10.5);
  EXPECT_EQ(AddOutcome("x", 0, 1), "cache-miss:evicted-ttl");
  EXPECT_EQ(Res("y", 0), "miss:evicted-ttl");
  // seq-len-mismatch, via resolve and via append; both drop the key.
  Open("m", 0);
  Add("m", 0, 2, 0);
  EXPECT_EQ(Res("m", 0, 1), "miss:seq-len-mismatch");
  EXPECT_EQ(Res("m", 0), "miss:seq-len-mismatch");
  Open("n", 0);
  EXPECT_EQ(AddOutcome("n", 0, 1, 5), "cache-miss:seq-len-mismatch");
  EXPECT_EQ(Res("n", 0), "miss:seq-len-mismatch");
  // The strict accessor carries the detail.
  try {
    m_->Get("n", 0);
    FAIL();
  } catch (const CacheMissError& e) {
    EXPECT_EQ(e.miss().detail, "cache holds 0, caller expected 5");
    EXPECT_EQ(e.kind(), ErrorKind::kCacheMiss);
  }
}

TEST_F(HotKvStateTest, ExpectedSeqLenMatchingIsAHit) {
  Make();
  Open("s", 0);
  EXPECT_EQ(Add("s", 0, 2, 0), 2);
  EXPECT_EQ(Add("s", 0, 1, 2), 3);
  EXPECT_EQ(Res("s", 0, 3), "ok:3");
  EXPECT_EQ(Add("s", 0, 0, 3), 3);  // zero tokens is allowed
}

TEST_F(HotKvStateTest, BudgetExceededLeavesSessionAndOthersUntouched) {
  Make();
  Open("a", 0);
  Add("a", 0, 2, 0);
  clock_.Set(4);
  Open("b", 0);
  Add("b", 0, 3, 0);
  clock_.Set(6);
  // a@0 is the LRU; b needs 3 + 6 = 9 tokens > 8: refused before evicting a.
  EXPECT_EQ(AddOutcome("b", 0, 6, 3), "budget-exceeded");
  EXPECT_EQ(m_->SessionKeys(), (Keys{{"a", 0}, {"b", 0}}));
  EXPECT_EQ(m_->TotalBytes(), 5 * 32);
  // b was not refreshed: it still expires 10s after t=4.
  clock_.Set(14.25);
  EXPECT_EQ(Res("b", 0), "miss:evicted-ttl");
  EXPECT_EQ(m_->Stats().evictions[kLru], 0);
}

TEST_F(HotKvStateTest, BudgetEvictsOtherSessionsOldestFirst) {
  HotKvStateConfig c = RefConfig();
  c.max_sessions = 8;
  Make(c);
  Open("a", 0);
  Add("a", 0, 2, 0);
  Open("b", 0);
  Add("b", 0, 2, 0);
  Open("c", 0);
  Add("c", 0, 2, 0);
  m_->Get("a", 0);  // a becomes MRU: order b, c, a
  // c grows by 4: 6 + 4 = 10 > 8; evict b (LRU, 2 tokens) -> 8 fits.
  EXPECT_EQ(Add("c", 0, 4, 2), 6);
  EXPECT_EQ(m_->SessionKeys(), (Keys{{"a", 0}, {"c", 0}}));
  EXPECT_EQ(Res("b", 0), "miss:evicted-lru");
  EXPECT_EQ(m_->TotalBytes(), 8 * 32);
  // The protected session is never its own victim: c grows to 8 by evicting a.
  EXPECT_EQ(Add("c", 0, 2, 6), 8);
  EXPECT_EQ(m_->SessionKeys(), (Keys{{"c", 0}}));
  // Content survived eviction pressure.
  SessionHandle h = m_->Get("c", 0);
  AppendBuffers want = SpecRows(recipe_, "c", 0, 0, 8);
  EXPECT_EQ(h.ReadKeys(3), want.k[1]);
  EXPECT_EQ(h.ReadValues(2), want.v[0]);
}

TEST_F(HotKvStateTest, SessionCapEvictsLruOtherThanTheNewOne) {
  HotKvStateConfig c = RefConfig();
  c.max_sessions = 1;
  Make(c);
  Open("a", 0);
  Open("b", 0);
  EXPECT_EQ(m_->SessionKeys(), (Keys{{"b", 0}}));
  EXPECT_EQ(Res("a", 0), "miss:evicted-lru");
  EXPECT_EQ(m_->Stats().evictions[kLru], 1);
}

TEST_F(HotKvStateTest, TtlIsStrictlyGreaterAndDropsOldestFirst) {
  HotKvStateConfig c = RefConfig();
  c.max_sessions = 8;
  c.miss_history = 2;
  Make(c);
  Open("a", 0);
  clock_.Set(1);
  Open("b", 0);
  clock_.Set(2);
  Open("c", 0);
  clock_.Set(10);  // a: exactly ttl -> not expired
  EXPECT_EQ(m_->SessionCount(), 3);
  clock_.Set(11.5);  // a, b expired (in that order), c not
  EXPECT_EQ(m_->SessionCount(), 1);
  // History of 2 keeps both; a was recorded first, so one more record drops it.
  m_->Release("z", 0);
  EXPECT_EQ(Res("a", 0), "miss:unknown-session");
  EXPECT_EQ(Res("b", 0), "miss:evicted-ttl");
  EXPECT_EQ(m_->Stats().evictions[kTtl], 2);
}

TEST_F(HotKvStateTest, TtlZeroDisablesExpiry) {
  HotKvStateConfig c = RefConfig();
  c.ttl_seconds = 0;
  Make(c);
  Open("a", 0);
  clock_.Set(1e9);
  EXPECT_EQ(Res("a", 0), "ok:0");
}

TEST_F(HotKvStateTest, EveryRefreshingOpResetsTheTtl) {
  Make();
  Open("a", 0);
  clock_.Set(8);
  Add("a", 0, 1, 0);  // refresh at 8
  clock_.Set(16);
  EXPECT_EQ(m_->Truncate("a", 0, 5), 1);  // refresh at 16
  clock_.Set(24);
  EXPECT_EQ(Res("a", 0), "ok:1");  // refresh at 24
  clock_.Set(34);
  EXPECT_EQ(m_->SessionCount(), 1);
  clock_.Set(34.25);
  EXPECT_EQ(m_->SessionCount(), 0);
}

TEST_F(HotKvStateTest, ReleaseHasNoStaleCheckNoTtlAndAlwaysRecords) {
  Make();
  Open("a", 0);
  clock_.Set(50);  // a expired but not yet evicted
  EXPECT_TRUE(m_->Release("a", 0));
  EXPECT_EQ(Res("a", 0), "miss:released");
  EXPECT_EQ(m_->Stats().evictions[kTtl], 0);
  // No stale check: releasing an older epoch just records it.
  Open("s", 2);
  EXPECT_FALSE(m_->Release("s", 1));
  EXPECT_EQ(Outcome([&] { m_->Release("s", -1); }), "invalid-argument");
  // Release overwrites an earlier reason.
  HotKvStateConfig c = RefConfig();
  c.max_sessions = 1;
  Make(c);
  Open("x", 0);
  Open("y", 0);
  EXPECT_EQ(Res("x", 0), "miss:evicted-lru");
  EXPECT_FALSE(m_->Release("x", 0));
  EXPECT_EQ(Res("x", 0), "miss:released");
}

TEST_F(HotKvStateTest, TruncateChecksLengthOnlyAfterEpochAndLookup) {
  Make();
  EXPECT_EQ(Outcome([&] { m_->Truncate("a", -1, -1); }), "invalid-argument");
  EXPECT_EQ(Outcome([&] { m_->Truncate("a", 0, -1); }), "cache-miss:unknown-session");
  Open("a", 1);
  EXPECT_EQ(Outcome([&] { m_->Truncate("a", 0, -1); }), "stale-epoch");
  EXPECT_EQ(Outcome([&] { m_->Truncate("a", 1, -1); }), "invalid-argument");
  Add("a", 1, 4, 0);
  EXPECT_EQ(m_->Truncate("a", 1, 9), 4);
  EXPECT_EQ(m_->Truncate("a", 1, 1), 1);
  EXPECT_EQ(m_->TotalBytes(), 32);
  // Truncated rows are gone; appending again writes fresh ones.
  EXPECT_EQ(Add("a", 1, 2, 1), 3);
  SessionHandle h = m_->Get("a", 1);
  AppendBuffers want = SpecRows(recipe_, "a", 1, 0, 3);
  EXPECT_EQ(h.ReadKeys(2), want.k[0]);
}

TEST_F(HotKvStateTest, MissHistoryIsABoundedLruThatLookupsDoNotConsume) {
  HotKvStateConfig c = RefConfig();
  c.miss_history = 2;
  Make(c);
  m_->Release("a", 0);
  m_->Release("b", 0);
  EXPECT_EQ(Res("a", 0), "miss:released");
  EXPECT_EQ(Res("a", 0), "miss:released");  // not consumed
  m_->Release("a", 0);                      // re-recording moves a to newest
  m_->Release("c", 0);                      // drops b, the oldest
  EXPECT_EQ(Res("b", 0), "miss:unknown-session");
  EXPECT_EQ(Res("a", 0), "miss:released");
  EXPECT_EQ(Res("c", 0), "miss:released");
  EXPECT_EQ(m_->Stats().remembered_misses, 2);
  // open forgets its key's record.
  Open("a", 0);
  EXPECT_EQ(m_->Stats().remembered_misses, 1);
  // Keys are (id, epoch): a@1 has no record.
  EXPECT_EQ(Res("c", 1), "miss:unknown-session");
}

TEST_F(HotKvStateTest, MissHistoryZeroRemembersNothing) {
  HotKvStateConfig c = RefConfig();
  c.miss_history = 0;
  Make(c);
  Open("a", 0);
  m_->Release("a", 0);
  EXPECT_EQ(Res("a", 0), "miss:unknown-session");
  Open("b", 0);
  Add("b", 0, 1, 0);
  EXPECT_EQ(Res("b", 0, 7), "miss:seq-len-mismatch");  // answered once...
  EXPECT_EQ(Res("b", 0), "miss:unknown-session");      // ...never remembered
  EXPECT_EQ(m_->Stats().remembered_misses, 0);
}

TEST_F(HotKvStateTest, MalformedAppendIsRefusedBeforeEvictingOrWriting) {
  HotKvStateConfig c = RefConfig();
  c.max_sessions = 8;
  Make(c);
  Open("a", 0);
  Add("a", 0, 6, 0);
  Open("b", 0);
  Add("b", 0, 1, 0);
  // A valid 2-token append to b would evict a; malformed ones must not.
  auto expect_refused = [&](std::vector<LayerKv> layers) {
    EXPECT_EQ(Outcome([&] { m_->Append("b", 0, layers, nullptr, 1); }), "invalid-argument");
    EXPECT_EQ(m_->SessionKeys(), (Keys{{"a", 0}, {"b", 0}}));
    EXPECT_EQ(m_->TotalBytes(), 7 * 32);
  };
  AppendBuffers ok = SpecRows(recipe_, "b", 0, 1, 2);
  AppendBuffers one = SpecRows(recipe_, "b", 0, 1, 1);
  std::vector<float> short_k(ok.k[1].begin(), ok.k[1].end() - 1);
  expect_refused({ok.layers[0]});                              // missing layer 3
  expect_refused({ok.layers[0], ok.layers[1], ok.layers[1]});  // duplicate layer
  expect_refused({ok.layers[0], {1, 2, ok.k[0], ok.v[0]}});    // unowned layer
  expect_refused({ok.layers[0], one.layers[1]});               // token counts disagree
  expect_refused({ok.layers[0], {3, 2, short_k, ok.v[1]}});    // keys too short
  expect_refused({ok.layers[0], {3, 2, ok.k[1], one.v[1]}});   // values too short
  expect_refused({{2, -1, {}, {}}, {3, -1, {}, {}}});          // negative count
  expect_refused({});
  EXPECT_EQ(Res("b", 0), "ok:1");
  // Layers may come in any order.
  EXPECT_EQ(m_->Append("b", 0, std::vector<LayerKv>{ok.layers[1], ok.layers[0]}, nullptr, 1), 3);
  EXPECT_EQ(Res("a", 0), "miss:evicted-lru");
}

TEST_F(HotKvStateTest, MalformedAppendStillObeysTheCheckOrder) {
  Make();
  Open("a", 1);
  std::vector<LayerKv> none;
  EXPECT_EQ(Outcome([&] { m_->Append("a", 0, none); }), "stale-epoch");
  EXPECT_EQ(Outcome([&] { m_->Append("zz", 0, none); }), "cache-miss:unknown-session");
  EXPECT_EQ(Outcome([&] { m_->Append("a", 1, none, nullptr, 4); }), "cache-miss:seq-len-mismatch");
}

TEST_F(HotKvStateTest, HalfAndBfloatRowsAreRounded) {
  for (KvDtype dt : {KvDtype::kF16, KvDtype::kBF16}) {
    recipe_ = MiniRecipe(dt);
    Make();
    Open("s", 0);
    Add("s", 0, 3, 0);
    SessionHandle h = m_->Get("s", 0);
    AppendBuffers b = SpecRows(recipe_, "s", 0, 0, 3);
    std::vector<float> want;
    for (float f : b.k[1]) {
      want.push_back(dt == KvDtype::kF16 ? HalfToFloat(FloatToHalf(f))
                                         : Bf16ToFloat(FloatToBf16(f)));
    }
    EXPECT_EQ(h.ReadKeys(3), want);
    EXPECT_NE(h.ReadKeys(3), b.k[1]);  // really stored narrower
    EXPECT_EQ(m_->TotalBytes(), 3 * recipe_.BytesPerToken());
  }
}

TEST_F(HotKvStateTest, StatsCountHitsMissesAndEvictions) {
  Make();
  Open("a", 0);
  Add("a", 0, 2, 0);  // hit
  Res("a", 0);        // hit
  Res("a", 0, 9);     // mismatch
  Res("a", 0);        // miss (mismatch again)
  Res("q", 0);        // unknown
  Open("b", 0);
  m_->Release("b", 0);
  HotKvStats s = m_->Stats();
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.misses[kMismatch], 2);
  EXPECT_EQ(s.misses[kUnknown], 1);
  EXPECT_EQ(s.evictions[kMismatch], 1);
  EXPECT_EQ(s.evictions[kReleased], 1);
  EXPECT_EQ(s.live_sessions, 0);
  EXPECT_EQ(s.bytes_in_use, 0);
  EXPECT_EQ(s.bytes_budget, 256);
  EXPECT_EQ(s.blocks_capacity, 8);
  EXPECT_EQ(s.blocks_used, 0);
  EXPECT_EQ(s.remembered_epochs, 2);
  EXPECT_EQ(s.pinned_sessions, 0);
}

}  // namespace
}  // namespace meshnet::kv
