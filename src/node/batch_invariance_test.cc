// A session's output does not depend on who else is in its batch: on
// generated 768-dim models of F32, Q8_0, Q4_0, Q4_K and Q6_K, one session's
// prompt and decode steps run inside batches of 2, 5, 16 and 33 rows (other
// sessions' prompts and decode steps beside it) give logits bit-identical to
// the same steps run alone, on every SIMD target the CPU has (forced in
// turn), with one and with two threads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/make_model.h"
#include "node/batch_test_util.h"
#include "node/identity.h"
#include "node/node.h"
#include "ops/hwy_test_util.h"
#include "util/thread_pool.h"

namespace meshnet::node {
namespace {

std::shared_ptr<const gguf::GgufFile> Model(GgmlType type) {
  gguf::MakeModelOptions o;
  o.n_embd = 768;
  o.n_layers = 1;
  o.n_heads = 12;
  o.n_kv_heads = 4;
  o.n_ff = 2048;
  o.type = type;
  o.seed = 7;
  // One file per process and type (ctest runs this binary's tests at once).
  const std::string path = ::testing::TempDir() + "/meshnet_invariance_" +
                           std::to_string(getpid()) + "_" + std::string(GgmlTypeInfoOf(type).name) +
                           ".gguf";
  gguf::MakeModel(o, MESHNET_SHIPPED_MODEL, path);
  auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::Open(path));
  std::filesystem::remove(path);  // the mapping stays valid
  return file;
}

NodeOptions Options(int64_t max_batch_sessions) {
  NodeOptions o;
  o.kv_config.max_sessions = 64;
  o.batch.max_batch_sessions = max_batch_sessions;
  o.batch.short_prompt = 64;  // the other sessions' prompts run whole beside
  return o;
}

std::vector<int32_t> Prompt(int seed, int n) {
  std::vector<int32_t> p = {1};
  for (int t = 1; t < n; ++t) p.push_back(static_cast<int32_t>(260 + (seed * 37 + t * 11) % 240));
  return p;
}

void ExpectSameBits(const StepResult& got, const StepResult& want, const std::string& what) {
  ASSERT_TRUE(std::holds_alternative<shard::TailOutput>(got)) << what;
  ASSERT_TRUE(std::holds_alternative<shard::TailOutput>(want)) << what;
  const std::vector<float>& g = Tail(got).logits;
  const std::vector<float>& w = Tail(want).logits;
  ASSERT_EQ(g.size(), w.size()) << what;
  ASSERT_EQ(0, std::memcmp(g.data(), w.data(), g.size() * sizeof(float)))
      << what << ": logits differ from the session run alone";
}

// Session x's steps (a 4-row prompt, then decode steps), each in a batch of
// `rows` rows with fresh sessions' prompts filling the rest; x's logits are
// compared with the same steps on a node that runs one session at a time.
void CheckSessionAloneVsBatched(const std::shared_ptr<const gguf::GgufFile>& file,
                                ThreadPool* pool) {
  Node batched(file, Options(64), pool);
  Node alone(file, Options(1), pool);
  std::mutex mu;
  std::vector<BatchView> seen;
  batched.batcher().SetObserver([&](const BatchView& v) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(v);
  });
  const std::string x = RandomId128();
  StepRequest step = Prefill(x, Prompt(0, 4));
  int64_t seq = 0;
  int other = 1;
  for (int64_t rows : {5, 2, 16, 33, 5}) {
    const StepResult want = alone.Step(step);
    std::vector<StepRequest> reqs = {step};
    const int64_t own = static_cast<int64_t>(step.token_ids.size());
    for (int64_t left = rows - own; left > 0; left -= 8) {  // prompts of up to 8 rows
      reqs.push_back(
          Prefill(RandomId128(), Prompt(other++, static_cast<int>(std::min<int64_t>(8, left)))));
    }
    seen.clear();
    const std::vector<StepResult> got = RunHeld(batched, reqs);
    ASSERT_EQ(seen.size(), 1u) << "the steps formed one batch";
    int64_t total = 0;
    for (int64_t r : seen[0].rows) total += r;
    ASSERT_EQ(total, rows);
    ExpectSameBits(got[0], want, "x in a batch of " + std::to_string(rows) + " rows");
    seq += own;
    step = Decode(x, Tail(want).token_id, seq);
  }
}

TEST(BatchInvariance, ASessionAloneEqualsItInBatchesOfEverySize) {
  ThreadPool pool2(2);
  for (GgmlType type :
       {GgmlType::kF32, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    SCOPED_TRACE(GgmlTypeInfoOf(type).name);
    const auto file = Model(type);
    ops::ForEachSimdTarget([&] {
      CheckSessionAloneVsBatched(file, nullptr);
      CheckSessionAloneVsBatched(file, &pool2);
    });
    if (HasFatalFailure()) return;
  }
}

// Thread count stays out of results: the same steps on one and two threads.
TEST(BatchInvariance, OneAndTwoThreadsGiveTheSameBits) {
  ThreadPool pool2(2);
  for (GgmlType type : {GgmlType::kF32, GgmlType::kQ8_0, GgmlType::kQ4_K}) {
    SCOPED_TRACE(GgmlTypeInfoOf(type).name);
    const auto file = Model(type);
    Node one(file, Options(64), nullptr);
    Node two(file, Options(64), &pool2);
    const std::string x = RandomId128();
    StepRequest step = Prefill(x, Prompt(3, 40));
    int64_t seq = 0;
    for (int i = 0; i < 4; ++i) {
      const StepResult a = one.Step(step);
      const StepResult b = two.Step(step);
      ExpectSameBits(b, a, "step " + std::to_string(i));
      seq += static_cast<int64_t>(step.token_ids.size());
      step = Decode(x, Tail(a).token_id, seq);
    }
  }
}

// A position's row is the same computed in a prompt or as a decode step: the
// last logits of a 24-token prompt equal those of its first 12 tokens as a
// prompt and the other 12 fed one decode step at a time.
TEST(BatchInvariance, APromptEqualsItsTokensFedOneByOne) {
  ThreadPool pool2(2);
  for (GgmlType type : {GgmlType::kF32, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K}) {
    SCOPED_TRACE(GgmlTypeInfoOf(type).name);
    const auto file = Model(type);
    ops::ForEachSimdTarget([&] {
      Node node(file, Options(64), &pool2);
      const std::vector<int32_t> prompt = Prompt(5, 24);
      StepRequest whole = Prefill(RandomId128(), prompt);
      const StepResult want = node.Step(whole);
      const std::string y = RandomId128();
      StepRequest part = Prefill(y, {prompt.begin(), prompt.begin() + 12});
      StepResult got = node.Step(part);
      for (int64_t p = 12; p < 24; ++p) {
        StepRequest next = Decode(y, prompt[static_cast<size_t>(p)], p);
        got = node.Step(next);
      }
      ExpectSameBits(got, want, "the prompt's last position fed as a decode step");
    });
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace meshnet::node
