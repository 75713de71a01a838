// Batched steps on the shipped stories260K model (5 layers): steps of several
// sessions held back until all are queued (Batcher::Hold / WaitPending, no
// sleeps), then run as one batch the observer sees; their logits agree with
// the same steps run alone, a long prompt runs in chunks between other
// sessions' decode steps, the limits and the FIFO order hold, and a cancelled
// step leaves its batch without touching the others. Scheduling: decode steps
// go first, prompt rows are bounded while sessions decode, batching off runs
// sessions' steps at once, and the cost model fits what batches cost.
#include "node/batcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "gguf/gguf_reader.h"
#include "node/batch_test_util.h"
#include "node/identity.h"
#include "node/node.h"
#include "node/node_test_util.h"
#include "shard/step_cancel.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace meshnet::node {
namespace {

std::shared_ptr<const gguf::GgufFile> File() { return ShippedFile(); }

std::vector<int32_t> PromptOf(int i, int n) {
  std::vector<int32_t> p = {1};
  for (int t = 1; t < n; ++t) p.push_back(static_cast<int32_t>(260 + (i * 37 + t * 11) % 240));
  return p;
}

// Records every batch a node runs.
struct Recorder {
  explicit Recorder(Node& node) {
    node.batcher().SetObserver([this](const BatchView& v) {
      std::lock_guard<std::mutex> lock(mu);
      batches.push_back(v);
    });
  }
  std::vector<BatchView> Take() {
    std::lock_guard<std::mutex> lock(mu);
    return std::move(batches);
  }
  std::mutex mu;
  std::vector<BatchView> batches;
};

StepResult StepOf(Node& node, StepRequest r) { return node.Step(r); }

void ExpectLogitsNear(const StepResult& got, const StepResult& want, const std::string& what) {
  ASSERT_TRUE(std::holds_alternative<shard::TailOutput>(got)) << what;
  ASSERT_TRUE(std::holds_alternative<shard::TailOutput>(want)) << what;
  const auto& g = Tail(got).logits;
  const auto& w = Tail(want).logits;
  ASSERT_EQ(g.size(), w.size()) << what;
  float max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(w[i]));
    max_diff = std::max(max_diff, std::fabs(g[i] - w[i]));
  }
  EXPECT_LE(max_diff, 1e-4f * std::max(1.0f, max_abs)) << what;
  EXPECT_EQ(Tail(got).token_id, Tail(want).token_id) << what;
}

NodeOptions WholeModel(BatchOptions batch = {}) {
  NodeOptions o;
  o.kv_dtype = KvDtype::kF32;
  o.kv_config.max_sessions = 64;
  o.batch = batch;
  return o;
}

// Prefills and three greedy decode rounds of 6 sessions, each round one batch,
// against the same steps run one at a time on an unbatched node.
TEST(Batcher, BatchedLogitsMatchUnbatchedWithinTolerance) {
  ThreadPool pool(2);
  Node node(File(), WholeModel(), &pool);
  Node alone(File(), WholeModel({.max_batch_sessions = 1}), &pool);
  Recorder rec(node);
  constexpr int kSessions = 6;
  std::vector<std::string> ids;
  std::vector<StepRequest> reqs;
  for (int i = 0; i < kSessions; ++i) {
    ids.push_back(RandomId128());
    reqs.push_back(Prefill(ids[i], PromptOf(i, 3 + i)));
  }
  std::vector<int64_t> seq(kSessions);
  for (int round = 0; round < 4; ++round) {
    std::vector<StepResult> want;
    for (auto r : reqs) want.push_back(alone.Step(r));
    const std::vector<StepResult> got = RunHeld(node, reqs);
    const std::vector<BatchView> batches = rec.Take();
    ASSERT_EQ(batches.size(), 1u) << "round " << round;
    EXPECT_EQ(batches[0].session_ids, ids);
    for (int i = 0; i < kSessions; ++i) {
      ExpectLogitsNear(got[i], want[i],
                       "round " + std::to_string(round) + " session " + std::to_string(i));
      seq[i] += static_cast<int64_t>(reqs[i].token_ids.size());
      reqs[i] = Decode(ids[i], Tail(want[i]).token_id, seq[i]);
    }
  }
  EXPECT_EQ(node.batcher().stats().max_sessions.load(), kSessions);
}

// Node::StepMany (Batcher::RunMany): the decode steps of several sessions
// from one thread form one batch, with Step's answers; a miss and a bad
// request among them are their own and leave the others unchanged.
TEST(Batcher, StepManyFromOneThreadIsOneBatch) {
  ThreadPool pool(2);
  Node node(File(), WholeModel(), &pool);
  Node alone(File(), WholeModel({.max_batch_sessions = 1}), &pool);
  constexpr int kSessions = 5;
  std::vector<std::string> ids;
  std::vector<StepRequest> reqs;
  for (int i = 0; i < kSessions; ++i) {
    ids.push_back(RandomId128());
    StepRequest p = Prefill(ids[i], PromptOf(i, 3 + i));
    StepOf(node, p);
    const StepResult first = StepOf(alone, p);
    reqs.push_back(Decode(ids[i], Tail(first).token_id, 3 + i));
  }
  std::vector<StepResult> want;
  for (auto r : reqs) want.push_back(alone.Step(r));
  reqs.push_back(Decode(RandomId128(), 300, 4));  // never opened: a miss
  const std::string extra = RandomId128();
  StepOf(node, Prefill(extra, PromptOf(9, 3)));
  reqs.push_back(Decode(extra, 1 << 30, 3));  // outside the vocabulary
  Recorder rec(node);
  std::vector<StepRequest*> ptrs;
  for (auto& r : reqs) ptrs.push_back(&r);
  std::vector<std::optional<StepResult>> got(reqs.size());
  std::vector<std::exception_ptr> errors(reqs.size());
  node.StepMany(ptrs, got, errors);
  const std::vector<BatchView> batches = rec.Take();
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].session_ids, ids);
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_FALSE(errors[i]) << i;
    ExpectLogitsNear(*got[i], want[i], "session " + std::to_string(i));
  }
  ASSERT_TRUE(got[kSessions]);
  EXPECT_TRUE(std::holds_alternative<kv::CacheMiss>(*got[kSessions]));
  EXPECT_TRUE(errors[kSessions + 1]);
  EXPECT_FALSE(got[kSessions + 1]);
}

// The steps of one grouped call share their call's cancel check (over gRPC,
// a poll of the server's completion queue, tens of microseconds): a batch
// forming asks it once, not once per step.
TEST(Batcher, StepsSharingACancelCheckAskItOncePerBatch) {
  Node node(File(), WholeModel(), nullptr);
  constexpr int kSessions = 6;
  std::vector<StepRequest> reqs;
  for (int i = 0; i < kSessions; ++i) {
    const std::string id = RandomId128();
    const StepResult first = StepOf(node, Prefill(id, PromptOf(i, 3)));
    reqs.push_back(Decode(id, Tail(first).token_id, 3));
  }
  Recorder rec(node);
  std::vector<StepRequest*> ptrs;
  for (auto& r : reqs) ptrs.push_back(&r);
  std::vector<std::optional<StepResult>> got(reqs.size());
  std::vector<std::exception_ptr> errors(reqs.size());
  int asked = 0;
  {
    shard::ScopedStepCancel scope([&] { return ++asked < 0; });
    node.StepMany(ptrs, got, errors);
  }
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_FALSE(errors[i]) << i;
    EXPECT_TRUE(got[i]) << i;
  }
  const std::vector<BatchView> batches = rec.Take();
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].session_ids.size(), static_cast<size_t>(kSessions));
  EXPECT_EQ(asked, 1);
}

// Node::StepMany when a step's KV room is held by the call's own earlier
// steps (pinned until they run): those run first, then it, in a second batch.
// Before, it waited for pins only its own caller could release, and failed
// once pinned_wait_seconds ran out.
TEST(Batcher, StepManyRunsWhatItHoldsWhenItsOwnPinsBlockAStep) {
  ThreadPool pool(2);
  Node alone(File(), WholeModel({.max_batch_sessions = 1}), &pool);
  NodeOptions tight = WholeModel();
  tight.kv_config.block_tokens = 4;
  tight.kv_config.budget_bytes = 3 * 4 * alone.adapter().recipe().BytesPerToken();  // 3 blocks
  tight.kv_config.pinned_wait_seconds = 1;
  Node node(File(), tight, &pool);
  const std::string a = RandomId128(), b = RandomId128();
  std::vector<StepRequest> reqs;
  std::vector<StepResult> want;
  for (const std::string& id : {a, b}) {  // one full block each
    const StepRequest p = Prefill(id, PromptOf(id == a ? 1 : 2, 4));
    StepOf(node, p);
    reqs.push_back(Decode(id, Tail(StepOf(alone, p)).token_id, 4));
    want.push_back(alone.Step(reqs.back()));
  }
  Recorder rec(node);
  std::vector<StepRequest*> ptrs = {&reqs[0], &reqs[1]};  // each needs a second block
  std::vector<std::optional<StepResult>> got(2);
  std::vector<std::exception_ptr> errors(2);
  node.StepMany(ptrs, got, errors);
  for (int i = 0; i < 2; ++i) {
    ASSERT_FALSE(errors[i]) << i;
    ExpectLogitsNear(*got[i], want[i], "session " + std::to_string(i));
  }
  const std::vector<BatchView> batches = rec.Take();
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].session_ids, std::vector<std::string>{a});
  EXPECT_EQ(batches[1].session_ids, std::vector<std::string>{b});
}

// A 18-token prompt with prefill_chunk 4 runs in 5 batches; another session's
// decode step queued behind it rides in the first one and is done then
// (prefill_share 0: only prefill_chunk bounds the chunks here; the time bound
// is PromptRowsBoundedWhileSessionsDecode's).
TEST(Batcher, LongPromptRunsInChunksBetweenDecodeSteps) {
  Node node(File(), WholeModel({.prefill_chunk = 4, .prefill_share = 0}), nullptr);
  Node alone(File(), WholeModel({.max_batch_sessions = 1, .prefill_chunk = 256}), nullptr);
  Recorder rec(node);
  const std::string p = RandomId128(), d = RandomId128();
  const std::vector<int32_t> dprompt = PromptOf(1, 3);
  ASSERT_TRUE(std::holds_alternative<shard::TailOutput>(StepOf(node, Prefill(d, dprompt))));
  rec.Take();
  const StepResult d0 = StepOf(alone, Prefill(d, dprompt));
  const std::vector<StepResult> got =
      RunHeld(node, {Prefill(p, PromptOf(2, 18)), Decode(d, Tail(d0).token_id, 3)});
  ExpectLogitsNear(got[0], StepOf(alone, Prefill(p, PromptOf(2, 18))), "chunked prompt");
  ExpectLogitsNear(got[1], StepOf(alone, Decode(d, Tail(d0).token_id, 3)), "decode beside it");
  const std::vector<BatchView> b = rec.Take();
  ASSERT_EQ(b.size(), 5u);
  EXPECT_EQ(b[0].session_ids, (std::vector<std::string>{p, d}));
  EXPECT_EQ(b[0].rows, (std::vector<int64_t>{4, 1}));
  for (size_t i = 1; i < b.size(); ++i) {
    EXPECT_EQ(b[i].session_ids, std::vector<std::string>{p});
    EXPECT_EQ(b[i].rows, std::vector<int64_t>{i < 4 ? 4 : 2});
  }
}

// max_batch_sessions 2 over 5 queued prefills: FIFO batches of 2, 2, 1; then
// max_batch_tokens 5 over three 3-token prompts splits the second one.
TEST(Batcher, LimitsAndArrivalOrder) {
  Node node(File(), WholeModel({.max_batch_sessions = 2}), nullptr);
  Recorder rec(node);
  std::vector<std::string> ids;
  std::vector<StepRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(RandomId128());
    reqs.push_back(Prefill(ids[i], PromptOf(i, 4)));
  }
  for (const StepResult& r : RunHeld(node, reqs)) {
    EXPECT_TRUE(std::holds_alternative<shard::TailOutput>(r));
  }
  std::vector<BatchView> b = rec.Take();
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].session_ids, (std::vector<std::string>{ids[0], ids[1]}));
  EXPECT_EQ(b[1].session_ids, (std::vector<std::string>{ids[2], ids[3]}));
  EXPECT_EQ(b[2].session_ids, (std::vector<std::string>{ids[4]}));

  Node tokens(File(), WholeModel({.max_batch_tokens = 5}), nullptr);
  Recorder trec(tokens);
  reqs.resize(3);
  for (int i = 0; i < 3; ++i) reqs[i] = Prefill(ids[i], PromptOf(i, 3));
  RunHeld(tokens, reqs);
  b = trec.Take();
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].session_ids, (std::vector<std::string>{ids[0], ids[1]}));
  EXPECT_EQ(b[0].rows, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(b[1].session_ids, (std::vector<std::string>{ids[2], ids[1]}));
  EXPECT_EQ(b[1].rows, (std::vector<int64_t>{3, 1}));
}

// A step whose caller cancelled leaves the queue with kUnavailable when the
// batch forms; its rows are rolled back; the others in the queue run.
TEST(Batcher, CancelledStepLeavesItsBatchAlone) {
  Node node(File(), WholeModel(), nullptr);
  Node alone(File(), WholeModel({.max_batch_sessions = 1}), nullptr);
  Recorder rec(node);
  const std::string a = RandomId128(), c = RandomId128();
  const StepResult a0 = StepOf(node, Prefill(a, PromptOf(0, 4)));
  const StepResult c0 = StepOf(node, Prefill(c, PromptOf(1, 4)));
  rec.Take();
  node.batcher().Hold();
  std::atomic<bool> cancel{false};
  ErrorKind kind = ErrorKind::kInvalidArgument;
  std::thread cancelled([&] {
    shard::ScopedStepCancel scope([&] { return cancel.load(); });
    try {
      StepOf(node, Decode(c, Tail(c0).token_id, 4));
    } catch (const Error& e) {
      kind = e.kind();
    }
  });
  node.batcher().WaitPending(1);
  StepResult got;
  std::thread other([&] { got = StepOf(node, Decode(a, Tail(a0).token_id, 4)); });
  node.batcher().WaitPending(2);
  cancel = true;
  node.batcher().Resume();
  cancelled.join();
  other.join();
  EXPECT_EQ(kind, ErrorKind::kUnavailable);
  const std::vector<BatchView> b = rec.Take();
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].session_ids, std::vector<std::string>{a});
  StepOf(alone, Prefill(a, PromptOf(0, 4)));
  ExpectLogitsNear(got, StepOf(alone, Decode(a, Tail(a0).token_id, 4)), "the other session");
  // The cancelled step was not committed: the session still holds 4 positions.
  EXPECT_TRUE(
      std::holds_alternative<shard::TailOutput>(StepOf(node, Decode(c, Tail(c0).token_id, 4))));
}

// max_batch_sessions 1 does not serialize the node: while one session's step
// is inside its (one-session) batch, another session's step runs too. The
// observer holds the first batch until it sees the second (bounded wait: with
// a node-wide queue the second could only start after the first, and the test
// fails after the bound instead of hanging).
TEST(Batcher, BatchingOffRunsSessionsAtOnce) {
  ThreadPool pool(2);
  Node node(File(), WholeModel({.max_batch_sessions = 1}), &pool);
  const std::string a = RandomId128(), b = RandomId128();
  std::mutex mu;
  std::condition_variable cv;
  int seen = 0;
  bool overlapped = false;
  node.batcher().SetObserver([&](const BatchView& v) {
    std::unique_lock<std::mutex> lock(mu);
    ++seen;
    cv.notify_all();
    if (v.session_ids == std::vector<std::string>{a}) {
      overlapped = cv.wait_for(lock, std::chrono::seconds(20), [&] { return seen >= 2; });
    }
  });
  StepResult ra, rb;
  std::thread ta([&] { ra = StepOf(node, Prefill(a, PromptOf(0, 4))); });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return seen >= 1; });  // a is in its batch
  }
  rb = StepOf(node, Prefill(b, PromptOf(1, 4)));
  ta.join();
  EXPECT_TRUE(overlapped) << "b's step waited for a's";
  Node alone(File(), WholeModel({.max_batch_sessions = 1}), nullptr);
  ExpectLogitsNear(ra, StepOf(alone, Prefill(a, PromptOf(0, 4))), "a");
  ExpectLogitsNear(rb, StepOf(alone, Prefill(b, PromptOf(1, 4))), "b");
  EXPECT_EQ(node.batcher().stats().max_sessions.load(), 1);
}

// Batching off keeps the test hooks: held steps queue (WaitPending sees them)
// and run after Resume.
TEST(Batcher, BatchingOffHonoursHold) {
  Node node(File(), WholeModel({.max_batch_sessions = 1}), nullptr);
  Recorder rec(node);
  const std::vector<StepResult> got = RunHeld(
      node, {Prefill(RandomId128(), PromptOf(0, 3)), Prefill(RandomId128(), PromptOf(1, 5))});
  for (const StepResult& r : got) EXPECT_TRUE(std::holds_alternative<shard::TailOutput>(r));
  EXPECT_EQ(rec.Take().size(), 2u);
}

// With the session limit reached, decode steps go before younger prompts (the
// oldest step goes first whatever it is), and a batch keeps arrival order.
TEST(Batcher, DecodeStepsGoFirst) {
  Node node(File(), WholeModel({.max_batch_sessions = 2}), nullptr);
  Recorder rec(node);
  const std::string p1 = RandomId128(), p2 = RandomId128(), d = RandomId128();
  const StepResult d0 = StepOf(node, Prefill(d, PromptOf(0, 3)));
  rec.Take();
  RunHeld(node, {Prefill(p1, PromptOf(1, 4)), Prefill(p2, PromptOf(2, 4)),
                 Decode(d, Tail(d0).token_id, 3)});
  const std::vector<BatchView> b = rec.Take();
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].session_ids, (std::vector<std::string>{p1, d}));
  EXPECT_EQ(b[1].session_ids, std::vector<std::string>{p2});
}

// While a session decodes, a long prompt's rows per batch are bounded by the
// decode batch's time (prefill_share; a tiny share leaves the floor of 4
// rows) instead of prefill_chunk; with nobody decoding, it runs whole.
// (short_prompt 0: the 18-token prompt counts as long here.)
TEST(Batcher, PromptRowsBoundedWhileSessionsDecode) {
  Node node(File(), WholeModel({.prefill_share = 1e-9, .short_prompt = 0}), nullptr);
  Node alone(File(), WholeModel({.max_batch_sessions = 1}), nullptr);
  Recorder rec(node);
  const std::string p = RandomId128(), q = RandomId128(), d = RandomId128();
  const StepResult whole = StepOf(node, Prefill(q, PromptOf(3, 18)));
  const std::vector<BatchView> first = rec.Take();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].rows, std::vector<int64_t>{18});
  const StepResult d0 = StepOf(node, Prefill(d, PromptOf(1, 3)));
  rec.Take();
  StepOf(alone, Prefill(d, PromptOf(1, 3)));
  const std::vector<StepResult> got =
      RunHeld(node, {Prefill(p, PromptOf(2, 18)), Decode(d, Tail(d0).token_id, 3)});
  ExpectLogitsNear(got[0], StepOf(alone, Prefill(p, PromptOf(2, 18))), "bounded prompt");
  ExpectLogitsNear(got[1], StepOf(alone, Decode(d, Tail(d0).token_id, 3)), "decode beside it");
  const std::vector<BatchView> b = rec.Take();
  ASSERT_GE(b.size(), 2u);
  EXPECT_EQ(b[0].session_ids, (std::vector<std::string>{p, d}));
  EXPECT_EQ(b[0].rows, (std::vector<int64_t>{BatchOptions::kMinPrefillRows, 1}));
  int64_t rows = 0;
  for (const BatchView& v : b) {
    for (int64_t r : v.rows) rows += r;
  }
  EXPECT_EQ(rows, 18 + 1);
}

// Short prompts (new sessions) arriving while a session decodes run whole in
// one batch beside its decode step, though the time bound leaves a long
// prompt only the floor of 4 rows (before, they shared those 4 rows: one
// prompt chunk per batch, and a burst of new sessions waited batch after
// batch for its first tokens).
TEST(Batcher, ShortPromptsRunWholeBesideDecodeSteps) {
  Node node(File(), WholeModel({.prefill_share = 1e-9, .short_prompt = 8}), nullptr);
  Node alone(File(), WholeModel({.max_batch_sessions = 1}), nullptr);
  Recorder rec(node);
  const std::string d = RandomId128(), p1 = RandomId128(), p2 = RandomId128(), p3 = RandomId128();
  const StepResult d0 = StepOf(node, Prefill(d, PromptOf(1, 3)));
  StepOf(alone, Prefill(d, PromptOf(1, 3)));
  rec.Take();
  const std::vector<StepResult> got =
      RunHeld(node, {Decode(d, Tail(d0).token_id, 3), Prefill(p1, PromptOf(2, 6)),
                     Prefill(p2, PromptOf(3, 8)), Prefill(p3, PromptOf(4, 7))});
  const std::vector<BatchView> b = rec.Take();
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].session_ids, (std::vector<std::string>{d, p1, p2, p3}));
  EXPECT_EQ(b[0].rows, (std::vector<int64_t>{1, 6, 8, 7}));
  ExpectLogitsNear(got[0], StepOf(alone, Decode(d, Tail(d0).token_id, 3)), "decode step");
  ExpectLogitsNear(got[2], StepOf(alone, Prefill(p2, PromptOf(3, 8))), "short prompt");
  // A prompt one row over short_prompt is long again: the floor of 4 rows.
  const StepResult e0 = StepOf(node, Decode(d, Tail(got[0]).token_id, 4));
  rec.Take();
  RunHeld(node, {Decode(d, Tail(e0).token_id, 5), Prefill(RandomId128(), PromptOf(5, 9))});
  const std::vector<BatchView> c = rec.Take();
  ASSERT_GE(c.size(), 2u);
  EXPECT_EQ(c[0].rows, (std::vector<int64_t>{1, BatchOptions::kMinPrefillRows}));
}

// Right after sessions stopped decoding (within the quiet time, at least
// 0.25 s), a long prompt's rows wait for their next steps, but a short prompt
// (a new session's) runs at once: it runs whole beside decode steps anyway,
// and waiting would only add the quiet time to its first token.
TEST(Batcher, AShortPromptDoesNotWaitForDecodersThatStopped) {
  Node node(File(), WholeModel({.short_prompt = 8}), nullptr);
  const std::string d = RandomId128();
  const StepResult d0 = StepOf(node, Prefill(d, PromptOf(1, 3)));
  StepResult last = StepOf(node, Decode(d, Tail(d0).token_id, 3));
  const auto waits = [&] { return node.batcher().stats().decoder_waits.load(); };
  ASSERT_EQ(waits(), 0);
  StepOf(node, Prefill(RandomId128(), PromptOf(2, 8)));  // short
  EXPECT_EQ(waits(), 0);
  last = StepOf(node, Decode(d, Tail(last).token_id, 4));
  StepOf(node, Prefill(RandomId128(), PromptOf(3, 9)));  // long: waits, then runs
  EXPECT_EQ(waits(), 1);
}

TEST(BatchCostModel, FitsFixedAndPerRowCost) {
  BatchCostModel m;
  EXPECT_FALSE(m.ready());
  for (int i = 0; i < 20; ++i) m.Add(1 + (i % 4) * 5, 0.010 + 0.001 * (1 + (i % 4) * 5));
  ASSERT_TRUE(m.ready());
  EXPECT_NEAR(m.PerRow(), 0.001, 1e-9);
  EXPECT_NEAR(m.Seconds(8), 0.018, 1e-9);
  EXPECT_EQ(m.RowsWithin(0.0105), 10);
  EXPECT_EQ(m.RowsWithin(0), 0);
}

// Batches of one size cannot separate fixed from per-row cost: it is all
// counted per row (smaller chunks, never larger), and the fit follows drift.
TEST(BatchCostModel, SameRowsCountAsPerRowAndDriftIsFollowed) {
  BatchCostModel m;
  for (int i = 0; i < 5; ++i) m.Add(8, 0.016);
  EXPECT_NEAR(m.PerRow(), 0.002, 1e-12);
  EXPECT_NEAR(m.Seconds(8), 0.016, 1e-12);
  for (int i = 0; i < 60; ++i) m.Add(8, 0.032);
  EXPECT_NEAR(m.PerRow(), 0.004, 1e-4);
}

TEST(BatchOptions, RejectsOutOfRangeValues) {
  EXPECT_NO_THROW(BatchOptions{}.Validate());
  for (const BatchOptions& bad :
       {BatchOptions{.max_batch_tokens = 0}, BatchOptions{.max_batch_sessions = 0},
        BatchOptions{.prefill_chunk = 0}, BatchOptions{.max_batch_tokens = (1 << 16) + 1},
        BatchOptions{.max_batch_sessions = 5000}, BatchOptions{.prefill_share = -0.1},
        BatchOptions{.prefill_share = 17}}) {
    EXPECT_THROW(bad.Validate(), Error);
  }
}

}  // namespace
}  // namespace meshnet::node
