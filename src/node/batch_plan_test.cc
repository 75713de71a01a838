// The batcher's admission policy on made-up queues and a cost model fed by
// hand (no model, no timing): short prompts run whole beside decode steps,
// long prompts get only the time budget, the oldest step always runs, the
// limits hold, and the budget's rows stay within the time share.
#include "node/batch_plan.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "util/error.h"

namespace meshnet::node {
namespace {

constexpr QueuedRows kDecode{1, 0};
QueuedRows Prompt(int64_t rows, int64_t done = 0) { return {rows, done}; }

std::vector<int64_t> Plan(const std::vector<QueuedRows>& q, const BatchOptions& o, int64_t budget) {
  std::vector<int64_t> take = {99};  // overwritten
  PlanBatch(q, o, budget, &take);
  return take;
}

// A node where a batch of decode steps costs 20 ms + 5 ms per step, and a
// prompt row adds 10 ms (attention over a long context).
BatchCosts FittedCosts() {
  BatchCosts m;
  for (int i = 0; i < 40; ++i) {
    const int64_t rows = 1 + (i % 5) * 4;
    m.Add(rows, 0, 0.020 + 0.005 * static_cast<double>(rows));
  }
  for (int i = 0; i < 40; ++i) m.Add(8, 3, 0.060 + 0.030);
  return m;
}

// 16 new sessions' 4-token prompts arrive while 8 sessions decode: all run
// whole in the next batch, though the long-prompt budget is 4 rows.
TEST(PlanBatch, BurstOfShortPromptsRunsWholeBesideDecodeSteps) {
  std::vector<QueuedRows> q;
  for (int i = 0; i < 8; ++i) q.push_back(kDecode);
  for (int i = 0; i < 16; ++i) q.push_back(Prompt(4));
  const std::vector<int64_t> take = Plan(q, BatchOptions{}, 4);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(take[i], 1) << i;
  for (int i = 8; i < 24; ++i) EXPECT_EQ(take[i], 4) << i;
}

// A long prompt (oldest) gets the budget's rows; the short prompts behind it
// run whole and do not eat into that budget; decode steps all run.
TEST(PlanBatch, LongPromptGetsOnlyTheBudget) {
  const std::vector<QueuedRows> q = {Prompt(2000), kDecode, Prompt(30), kDecode, Prompt(2000)};
  EXPECT_EQ(Plan(q, BatchOptions{}, 6), (std::vector<int64_t>{6, 1, 30, 1, 0}));
  // A budget of 1 still gives the oldest step a row; 0 (the batcher's probe
  // of the decode steps alone) leaves the long prompts out unless nothing
  // else runs; with more budget than one chunk the next long prompt gets the
  // rest.
  EXPECT_EQ(Plan(q, BatchOptions{}, 1), (std::vector<int64_t>{1, 1, 30, 1, 0}));
  EXPECT_EQ(Plan(q, BatchOptions{}, 0), (std::vector<int64_t>{0, 1, 30, 1, 0}));
  EXPECT_EQ(Plan({Prompt(2000), Prompt(2000)}, BatchOptions{}, 0), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(Plan(q, BatchOptions{.prefill_chunk = 100}, 150),
            (std::vector<int64_t>{100, 1, 30, 1, 50}));
}

// A prompt is short when it fits short_prompt and one chunk (a long prompt's
// last chunk stays bounded; what is left of a short one runs whole).
TEST(PlanBatch, WhatCountsAsShort) {
  const BatchOptions o{.prefill_chunk = 16, .short_prompt = 32};
  EXPECT_TRUE(IsShortPrompt(Prompt(16), o));
  EXPECT_FALSE(IsShortPrompt(Prompt(17), o));  // more than a chunk
  EXPECT_FALSE(IsShortPrompt(Prompt(20, 10), o));
  EXPECT_TRUE(IsShortPrompt(Prompt(10, 6), o));
  EXPECT_EQ(Plan({kDecode, Prompt(10, 6)}, o, 1), (std::vector<int64_t>{1, 4}));
  EXPECT_FALSE(IsShortPrompt(kDecode, o));
  EXPECT_FALSE(IsShortPrompt(Prompt(2), BatchOptions{.short_prompt = 0}));
  EXPECT_FALSE(IsShortPrompt(Prompt(8), BatchOptions{.max_batch_tokens = 7}));
  // A piece of a longer prompt that its client sends in parts (it does not
  // open the context) is not short, however few its rows: pieces of 16
  // would otherwise pass the whole prompt by the time bound.
  const QueuedRows piece{.total = 16, .done = 0, .opens = false};
  EXPECT_FALSE(IsShortPrompt(piece, o));
  EXPECT_EQ(Plan({kDecode, piece}, o, 3), (std::vector<int64_t>{1, 3}));
}

// Placement (ThreadPool::PinnedCaller) for every batch but a lone decode
// step: a lone prompt left to the scheduler often ran on one CPU.
TEST(PlaceBatch, EverythingButALoneDecodeStepIsPlaced) {
  EXPECT_FALSE(PlaceBatch(1, 1));  // a lone session's decode step stays where it is
  EXPECT_TRUE(PlaceBatch(1, 5));   // a lone prompt
  EXPECT_TRUE(PlaceBatch(2, 2));   // two sessions' decode steps
  EXPECT_TRUE(PlaceBatch(16, 80));
}

// The oldest step always runs, whatever the limits leave: with two sessions
// per batch and the oldest a long prompt, one decode step rides with it.
TEST(PlanBatch, OldestStepAlwaysRunsWithinLimits) {
  const std::vector<QueuedRows> q = {Prompt(500), kDecode, kDecode, Prompt(4)};
  EXPECT_EQ(Plan(q, BatchOptions{.max_batch_sessions = 2}, 8), (std::vector<int64_t>{8, 1, 0, 0}));
  EXPECT_EQ(Plan(q, BatchOptions{.max_batch_tokens = 3}, 8), (std::vector<int64_t>{1, 1, 1, 0}));
  // A short prompt that does not fit the rows left whole waits; a smaller
  // one behind it runs.
  const std::vector<QueuedRows> shorts = {kDecode, Prompt(6), Prompt(3), Prompt(2)};
  EXPECT_EQ(Plan(shorts, BatchOptions{.max_batch_tokens = 9}, 8),
            (std::vector<int64_t>{1, 6, 0, 2}));
  EXPECT_TRUE(Plan({}, BatchOptions{}, 8).empty());
}

// While sessions decode, the budget's rows add at most prefill_share of a
// decode batch's fitted time, at the measured cost of a prompt row (above
// the floor of one row); otherwise it is every row.
TEST(PrefillBudget, RowsStayWithinTheTimeShare) {
  const BatchCosts cost = FittedCosts();
  EXPECT_NEAR(cost.DecodeSeconds(8), 0.060, 1e-9);
  EXPECT_NEAR(cost.PromptRowSeconds(), 0.010, 1e-9);
  const BatchOptions o;
  const DecodeLoad eight{.pending = 8};
  // A batch of 8 decode steps: 60 ms; half of it is 30 ms = 3 prompt rows
  // (6 if prompt rows cost what decode rows do).
  EXPECT_EQ(PrefillBudget(o, cost, eight), 3);
  EXPECT_LE(cost.PromptRowSeconds() * 3, o.prefill_share * cost.DecodeSeconds(8) + 1e-12);
  EXPECT_EQ(PrefillBudget(BatchOptions{.prefill_share = 2}, cost, eight), 12);
  // Decode steps seen recently but none pending: the recent count is used.
  EXPECT_EQ(PrefillBudget(o, cost, {.pending = 0, .recent = 8, .since_last_s = 0.1}), 3);
  // Nobody decoding (for longer than 4 decode batches), share 0, or no
  // batch measured yet: the whole batch.
  EXPECT_EQ(PrefillBudget(o, cost, {.pending = 0, .recent = 8, .since_last_s = 1}), 512);
  EXPECT_EQ(PrefillBudget(BatchOptions{.prefill_share = 0}, cost, eight), 512);
  EXPECT_EQ(PrefillBudget(o, BatchCosts(), eight), 512);
  // One decode step (25 ms: 1.25 rows) leaves one row; a tiny share the
  // floor of one row.
  EXPECT_EQ(PrefillBudget(o, cost, {.pending = 1}), 1);
  EXPECT_EQ(PrefillBudget(BatchOptions{.prefill_share = 1e-9}, cost, eight), 1);
}

// On a route of several shards or nodes, the sessions' round is several of
// this node's decode batches: they still count as decoding after 4 of them
// (for four rounds), and the prompt's rows beside their steps take
// prefill_share of the round, not of this node's batch (it rides in one batch
// of the round). Bounded: the quiet time by 4..32 decode batches, the round
// by 1..16.
TEST(PrefillBudget, FollowsTheSessionsRoundAcrossARoute) {
  const BatchCosts cost = FittedCosts();  // 8 decode steps: 60 ms; a prompt row 10 ms
  const BatchOptions o;
  // A round of 180 ms (three shards' batches); the last decode batch ended
  // 300 ms ago: 5 batches, but within four rounds.
  DecodeLoad load{.pending = 0, .recent = 8, .since_last_s = 0.3, .round_s = 0.18};
  EXPECT_NEAR(DecodeQuietAfter(o, cost, load), 0.72, 1e-9);
  EXPECT_EQ(PrefillBudget(o, cost, load), 9);  // half of 180 ms at 10 ms a row
  load.pending = 8;
  EXPECT_EQ(PrefillBudget(o, cost, load), 9);
  // Past four rounds: nobody decodes.
  load = {.pending = 0, .recent = 8, .since_last_s = 0.73, .round_s = 0.18};
  EXPECT_EQ(PrefillBudget(o, cost, load), 512);
  // A round of 10 s (a stalled client) counts as 16 batches at most, its
  // quiet time 32.
  load = {.pending = 8, .recent = 8, .since_last_s = 0, .round_s = 10};
  EXPECT_NEAR(DecodeQuietAfter(o, cost, load), 1.92, 1e-9);
  EXPECT_EQ(PrefillBudget(o, cost, load), 48);
  // A round shorter than a batch (none measured yet): one batch; the quiet
  // time never under kMinQuietS (0.25 s, above 4 batches of 60 ms here).
  load.round_s = 0.001;
  EXPECT_NEAR(DecodeQuietAfter(o, cost, load), 0.25, 1e-9);
  EXPECT_EQ(PrefillBudget(o, cost, load), 3);
  // Share 0 or nothing measured: never decoding.
  EXPECT_EQ(DecodeQuietAfter(BatchOptions{.prefill_share = 0}, cost, load), 0);
  EXPECT_EQ(DecodeQuietAfter(o, BatchCosts(), load), 0);
}

// On a route of h hops each node gives prompts its part of the share, so
// that with a prompt's pieces on every hop at once (pipelined) the parts add
// up to the share of the round without prompts. Were each hop to take the
// whole share of a round that the others' prompt rows lengthen, the round
// would grow without bound.
TEST(PrefillBudget, EachHopTakesItsPartOfTheShare) {
  const BatchCosts cost = FittedCosts();  // 8 decode steps: 60 ms; a prompt row 10 ms
  BatchOptions o{.prefill_share = 1};
  DecodeLoad load{.pending = 8, .recent = 8, .since_last_s = 0, .round_s = 0.18};
  EXPECT_EQ(PrefillBudget(o, cost, load), 18);  // hops not said: the whole share
  load.hops = 1;
  EXPECT_EQ(PrefillBudget(o, cost, load), 18);
  // 3 hops, every one holding prompt rows: without prompts the round is
  // R0; each hop adds p and sees R0 + 2p; p = share * (R0 + 2p) / (3 + 2 *
  // share) gives p = R0 / 3: the round doubles (share 1), no more. Here the
  // round seen is 180 ms: R0 = 108 ms, p = 36 ms, 3 rows of 10 ms.
  load.hops = 3;
  EXPECT_EQ(PrefillBudget(o, cost, load), 3);
  load.hops = 60;
  EXPECT_EQ(PrefillBudget(o, cost, load), 1);  // the floor of one row
  // Nobody decoding: every row, whatever the route.
  load = {.pending = 0, .recent = 8, .since_last_s = 1, .round_s = 0.18, .hops = 3};
  EXPECT_EQ(PrefillBudget(o, cost, load), 512);
}

// The round follows the intervals between decode batches, but a pause (the
// sessions stopped for seconds, then others began) is not a round: counted,
// it would let whole chunks of a prompt beside the new sessions' steps.
TEST(NextRound, FollowsRoundsAndSkipsPauses) {
  EXPECT_NEAR(NextRound(0, 0.030, 0.010), 0.030, 1e-12);      // the first
  EXPECT_NEAR(NextRound(0.030, 0.070, 0.010), 0.040, 1e-12);  // a moving average
  EXPECT_NEAR(NextRound(0.040, 10.0, 0.010), 0.040, 1e-12);   // a 10 s pause
  EXPECT_NEAR(NextRound(0, 10.0, 0.010), 0, 1e-12);
  EXPECT_NEAR(NextRound(0.040, 0.320, 0.010), 0.110, 1e-12);  // 32 batches: still a round
}

// While prompt rows ride beside the decode steps, the few batches of decode
// steps alone set the decode fit's level: a fit still weighted by slow first
// batches follows them at once.
TEST(BatchCosts, RecentDecodeBatchesSetTheLevel) {
  BatchCosts cost;
  for (int i = 0; i < 40; ++i) cost.Add(8, 0, 0.120);  // slow first batches
  EXPECT_NEAR(cost.DecodeSeconds(8), 0.120, 1e-9);
  for (int i = 0; i < 6; ++i) cost.Add(8, 0, 0.060);  // the probes: half that
  EXPECT_NEAR(cost.DecodeSeconds(8), 0.060, 0.004);
}

// The prompt row's cost follows the recent batches: prompt rows getting
// dearer (a prompt deeper into its context) shrink the budget.
TEST(BatchCosts, PromptRowCostFollowsRecentBatches) {
  BatchCosts cost = FittedCosts();
  for (int i = 0; i < 40; ++i) cost.Add(8, 3, 0.060 + 0.060);
  EXPECT_NEAR(cost.PromptRowSeconds(), 0.020, 1e-6);
  EXPECT_EQ(PrefillBudget(BatchOptions{}, cost, {.pending = 8}), 1);
  // A batch of prompt rows alone: all of its time is theirs.
  BatchCosts alone;
  alone.Add(0, 10, 0.5);
  EXPECT_TRUE(alone.ready());
  EXPECT_NEAR(alone.PromptRowSeconds(), 0.05, 1e-12);
}

// The next leader waits for the last batch's sessions only while it is cheap.
TEST(RegroupWait, WaitsBrieflyForSessionsThatComeStraightBack) {
  const BatchOptions o{.max_batch_sessions = 16};
  // 8 of 16 sessions are queued, the other 8 just finished a 4 ms batch and
  // usually come back within 50 us: wait up to 120 us.
  RegroupState s{.expected = 8, .back = 0, .pending = 8, .lag_s = 50e-6, .last_batch_s = 0.004};
  EXPECT_NEAR(RegroupWait(s, o), 120e-6, 1e-12);
  // Never more than a quarter of a batch.
  s.lag_s = 0.0009;
  EXPECT_NEAR(RegroupWait(s, o), 0.001, 1e-12);
  // No lag seen yet: the quarter batch.
  s.lag_s = -1;
  EXPECT_NEAR(RegroupWait(s, o), 0.001, 1e-12);
  // They come back slower than that (a pipelined route: the other nodes'
  // steps are in between): start now.
  s.lag_s = 0.0011;
  EXPECT_EQ(RegroupWait(s, o), 0);
  s.lag_s = 50e-6;
  // All back, or the batch already full: start now.
  s.back = 8;
  EXPECT_EQ(RegroupWait(s, o), 0);
  s.back = 3;
  s.pending = 16;
  EXPECT_EQ(RegroupWait(s, o), 0);
  // A lone session: its own step is the one queued.
  EXPECT_EQ(RegroupWait(
                {.expected = 1, .back = 1, .pending = 1, .lag_s = 1e-6, .last_batch_s = 0.002}, o),
            0);
  // Nothing measured yet.
  EXPECT_EQ(RegroupWait({.expected = 4, .pending = 4}, o), 0);
}

// The rest of a pending step's cohort: bounded by a quarter batch or a
// one-step batch, and waited for even when stragglers are usually slower.
TEST(CohortWait, WaitsUpToTheCostOfAPassForStragglers) {
  const BatchOptions o{.max_batch_sessions = 16};
  RegroupState s{.expected = 5, .back = 2, .pending = 2, .lag_s = 50e-6, .last_batch_s = 0.004};
  EXPECT_NEAR(CohortWait(s, o), 120e-6, 1e-12);
  s.lag_s = 0.003;  // stragglers 3 ms behind the first (shared cores)
  EXPECT_NEAR(CohortWait(s, o), 0.001, 1e-12);
  s.pass_s = 0.0025;  // a one-step batch costs more than the quarter batch
  EXPECT_NEAR(CohortWait(s, o), 0.0025, 1e-12);
  s.lag_s = -1;
  EXPECT_NEAR(CohortWait(s, o), 0.0025, 1e-12);
  s.back = 5;  // all back
  EXPECT_EQ(CohortWait(s, o), 0);
  s.back = 2;
  s.pending = 16;  // full
  EXPECT_EQ(CohortWait(s, o), 0);
  EXPECT_EQ(CohortWait({.expected = 4, .pending = 1}, o), 0);  // nothing measured yet
}

// Cohorts on a pipelined route: the sessions of two batches come back a round
// later, interleaved; each step counts in its own cohort, once.
TEST(CohortTracker, CountsEachSessionBackInItsOwnCohort) {
  CohortTracker t;
  const uint64_t a = 10, b = 11, c = 12, d = 13, e = 14;
  const uint64_t first[] = {a, b, c}, second[] = {d, e};
  t.Add(first, 4.990);   // cohort 0
  t.Add(second, 4.995);  // cohort 1
  EXPECT_EQ(t.newest(), 1);
  EXPECT_EQ(t.NoteReturn(a, 5.000), 0);
  EXPECT_LT(t.return_lag_s(), 0);  // a is not from the newest cohort
  EXPECT_EQ(t.NoteReturn(d, 5.001), 1);
  EXPECT_NEAR(t.return_lag_s(), 0.006, 1e-12);  // d: 6 ms after its batch ended
  EXPECT_EQ(t.NoteReturn(b, 5.004), 0);
  std::optional<CohortTracker::Status> s = t.Get(0);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->expected, 3);
  EXPECT_EQ(s->back, 2);
  EXPECT_DOUBLE_EQ(s->first_back_s, 5.000);
  EXPECT_DOUBLE_EQ(s->formed_s, 4.990);
  EXPECT_NEAR(t.spread_s(), 0.004, 1e-12);  // b came 4 ms after a
  EXPECT_EQ(t.Get(1)->back, 1);
  // Counted once; a stranger is in no cohort.
  EXPECT_EQ(t.NoteReturn(b, 5.005), -1);
  EXPECT_EQ(t.NoteReturn(99, 5.005), -1);
  EXPECT_EQ(t.Get(0)->back, 2);
  EXPECT_EQ(t.NoteReturn(c, 5.006), 0);
  EXPECT_EQ(t.Get(0)->back, 3);
  EXPECT_NEAR(t.spread_s(), 0.8 * 0.004 + 0.2 * 0.006, 1e-12);
}

TEST(CohortTracker, NewestCohortFirstAndOldOnesForgotten) {
  CohortTracker t;
  const uint64_t a = 0;  // any hash, 0 included
  const uint64_t one[] = {a};
  EXPECT_EQ(t.newest(), -1);
  EXPECT_FALSE(t.Get(t.newest()));
  t.Add(one, 0.0);
  t.Add(one, 0.5);
  EXPECT_EQ(t.NoteReturn(a, 1.0), 1);  // the newer cohort holding it
  EXPECT_EQ(t.Get(1)->back, 1);
  EXPECT_EQ(t.Get(0)->back, 0);
  for (int i = 0; i < CohortTracker::kCohorts; ++i) t.Add({}, 1.0);
  EXPECT_FALSE(t.Get(1));
  EXPECT_FALSE(t.Get(-1));
  EXPECT_FALSE(t.Get(CohortTracker::kCohorts + 2));  // not yet formed
  EXPECT_EQ(t.NoteReturn(a, 2.0), -1);               // its cohorts are forgotten
  EXPECT_TRUE(t.Get(CohortTracker::kCohorts + 1));
}

TEST(BatchOptions, ShortPromptRange) {
  EXPECT_NO_THROW(BatchOptions{.short_prompt = 0}.Validate());
  EXPECT_THROW(BatchOptions{.short_prompt = -1}.Validate(), Error);
  EXPECT_THROW(BatchOptions{.short_prompt = (1 << 16) + 1}.Validate(), Error);
}

}  // namespace
}  // namespace meshnet::node
