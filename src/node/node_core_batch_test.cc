// NodeCore with batching on the shipped stories260K model: one session's
// miss, stale epoch, bad bundle or release in the middle of a batch leaves
// the other sessions of that batch exactly as they would be alone; 64
// sessions over a small KV budget never exceed it.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>
#include <thread>

#include "gguf/gguf_reader.h"
#include "node/identity.h"
#include "node/node.h"
#include "node/node_core.h"
#include "node/node_test_util.h"
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

StepRequest Request(const std::string& id, int64_t epoch, bool prefill) {
  StepRequest r;
  r.session_id = id;
  r.session_secret = "s";
  r.route_epoch = epoch;
  r.prefill = prefill;
  return r;
}

// The head (layers 0-1) as a plain node: the bundles the tail takes.
shard::BoundaryBundle HeadBundle(Node& head, const std::string& id, int64_t epoch,
                                 std::vector<int32_t> tokens, std::optional<int64_t> seq_len) {
  StepRequest r = Request(id, epoch, !seq_len);
  r.token_ids = std::move(tokens);
  r.expected_seq_len = seq_len;
  return std::get<shard::BoundaryBundle>(head.Step(r));
}

StepRequest TailStep(const std::string& id, int64_t epoch, shard::BoundaryBundle b,
                     std::optional<int64_t> seq_len, uint64_t step_id) {
  StepRequest r = Request(id, epoch, !seq_len);
  r.bundle = std::move(b);
  r.expected_seq_len = seq_len;
  r.step_id = step_id;
  return r;
}

NodeOptions Range(int a, int b, BatchOptions batch = {}) {
  NodeOptions o;
  o.layers = LayerRange{a, b};
  o.kv_config.max_sessions = 64;
  o.batch = batch;
  return o;
}

struct Outcome {
  std::optional<StepResult> result;
  std::optional<ErrorKind> error;
};

Outcome StepOn(NodeCore& core, StepRequest r) {
  Outcome o;
  try {
    o.result = core.Step(std::move(r)).result;
  } catch (const Error& e) {
    o.error = e.kind();
  }
  return o;
}

TEST(NodeCoreBatch, OneSessionsFailureLeavesTheOthersOfItsBatchUnchanged) {
  ThreadPool pool(2);
  Node head(File(), Range(0, 1), &pool);
  Node tail(File(), Range(2, 4), &pool);
  Node solo(File(), Range(2, 4, {.max_batch_sessions = 1}), &pool);
  NodeCore core(&tail);
  // good: a, b, c; g is released mid-batch; m misses; e is stale; f is malformed.
  enum { A, B, C, G, M, E, F, kN };
  std::vector<std::string> id;
  std::vector<int32_t> first(kN);
  for (int i = 0; i < kN; ++i) {
    id.push_back(RandomId128());
    const shard::BoundaryBundle b = HeadBundle(head, id[i], 0, PromptOf(i, 4 + i), std::nullopt);
    StepRequest alone = TailStep(id[i], 0, b, std::nullopt, 1);
    const StepReply r = core.Step(TailStep(id[i], 0, b, std::nullopt, 1));
    first[i] = std::get<shard::TailOutput>(r.result).token_id;
    if (i < G) solo.Step(alone);
  }
  const int64_t e_len = 4 + E;  // epoch 1 supersedes 0
  ASSERT_TRUE(std::holds_alternative<shard::TailOutput>(
      core.Step(TailStep(id[E], 1, HeadBundle(head, id[E], 1, PromptOf(E, e_len), std::nullopt),
                         std::nullopt, 1))
          .result));
  ASSERT_TRUE(tail.Release(id[M], 0));  // its state is gone: the next step misses

  std::vector<StepRequest> decode(kN);
  for (int i = 0; i < kN; ++i) {
    const int64_t len = 4 + i;
    decode[i] =
        TailStep(id[i], 0, HeadBundle(head, id[i], i == E ? 1 : 0, {first[i]}, len), len, 2);
  }
  decode[F].bundle->n_embd += 1;  // a bundle that does not fit this shard
  std::vector<StepResult> want;
  for (int i = A; i <= C; ++i) {
    StepRequest copy = decode[i];
    want.push_back(solo.Step(copy));
  }

  std::vector<BatchView> batches;
  tail.batcher().SetObserver([&](const BatchView& v) {
    batches.push_back(v);
    if (batches.size() == 1) {
      EXPECT_TRUE(core.Release(id[G], "s", 0));  // mid-batch
    }
  });
  std::vector<Outcome> out(kN);
  std::vector<std::thread> threads;
  tail.batcher().Hold();
  for (int i = A; i <= G; ++i) {
    threads.emplace_back([&, i] { out[i] = StepOn(core, decode[i]); });
    tail.batcher().WaitPending(i + 1);
  }
  // The failing steps end on their own while the batch is still held.
  for (int i = M; i <= F; ++i) out[i] = StepOn(core, decode[i]);
  tail.batcher().Resume();
  for (auto& t : threads) t.join();

  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].session_ids, (std::vector<std::string>{id[A], id[B], id[C], id[G]}));
  ASSERT_TRUE(out[G].result && std::holds_alternative<kv::CacheMiss>(*out[G].result));
  ASSERT_TRUE(out[M].result && std::holds_alternative<kv::CacheMiss>(*out[M].result));
  EXPECT_EQ(out[E].error, ErrorKind::kStaleEpoch);
  EXPECT_EQ(out[F].error, ErrorKind::kBoundaryContract);
  for (int i = A; i <= C; ++i) {
    ASSERT_TRUE(out[i].result && std::holds_alternative<shard::TailOutput>(*out[i].result)) << i;
    const auto& got = std::get<shard::TailOutput>(*out[i].result);
    const auto& w = std::get<shard::TailOutput>(want[i]);
    EXPECT_EQ(got.token_id, w.token_id) << i;
    ASSERT_EQ(got.logits.size(), w.logits.size());
    for (size_t k = 0; k < w.logits.size(); ++k) {
      ASSERT_NEAR(got.logits[k], w.logits[k], 1e-4f * std::max(1.0f, std::fabs(w.logits[k])))
          << "session " << i << " logit " << k;
    }
  }
}

// 64 sessions, 8 threads of 8 sessions each, greedy decoding over a KV budget
// of 12 blocks: sessions are evicted and re-prefilled, the budget holds
// (peak asserted, invariants checked after every mutation) and every session
// reaches its length.
TEST(NodeCoreBatch, SixtyFourSessionsNeverExceedASmallBudget) {
  ThreadPool pool(2);
  NodeOptions o = Range(0, 4);
  o.kv_config.check_invariants = true;
  o.kv_config.block_tokens = 16;
  Node probe(File(), o, nullptr);
  o.kv_config.budget_bytes = 12 * 16 * probe.adapter().recipe().BytesPerToken();
  Node node(File(), o, &pool);
  NodeCoreOptions co;
  co.admission.max_active = 64;
  NodeCore core(&node, co);
  constexpr int kThreads = 8, kPerThread = 8, kDecode = 6;
  std::atomic<int64_t> re_prefills{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::string> ids(kPerThread);
      std::vector<std::vector<int32_t>> seq(kPerThread);
      std::vector<bool> live(kPerThread, false);
      for (int s = 0; s < kPerThread; ++s) {
        ids[s] = RandomId128();
        seq[s] = PromptOf(t * kPerThread + s, 5);
      }
      uint64_t step = 1;
      for (bool more = true; more;) {
        more = false;
        for (int s = 0; s < kPerThread; ++s) {
          if (seq[s].size() >= 5 + kDecode) continue;
          more = true;
          StepRequest r = Request(ids[s], 0, !live[s]);
          r.step_id = step++;
          if (live[s]) {
            r.token_ids = {seq[s].back()};
            r.expected_seq_len = static_cast<int64_t>(seq[s].size()) - 1;
          } else {
            r.token_ids = seq[s];
          }
          const StepReply reply = core.Step(std::move(r));
          if (const auto* out = std::get_if<shard::TailOutput>(&reply.result)) {
            seq[s].push_back(out->token_id);
            live[s] = true;
          } else {
            live[s] = false;  // a miss: re-prefill the whole sequence next time
            ++re_prefills;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  const int64_t budget = o.kv_config.budget_bytes;
  EXPECT_LE(core.Info().kv_bytes_reserved_peak, budget);
  EXPECT_GT(core.Info().kv_bytes_reserved_peak, 0);
  EXPECT_GT(re_prefills.load(), 0);  // the budget was really too small for all
  EXPECT_EQ(node.manager().InvariantViolation(), "");
}

}  // namespace
}  // namespace meshnet::node
